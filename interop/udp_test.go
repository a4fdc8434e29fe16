package interop_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

func freeUDPPort(t *testing.T) string { return strconv.Itoa(testutil.FreeUDPPort(t)) }

// startRecv runs `ibvbridge recv` with JSON logs; wait returns its final counters (the last stdout line).
func startRecv(t *testing.T, args ...string) (wait func() map[string]any) {
	t.Helper()
	cmd := exec.Command(goTool, append([]string{"recv", "--log-format", "json"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return func() map[string]any {
		t.Helper()
		timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("recv: %v\n%s", err, errb.String())
		}
		var m map[string]any
		if err := json.Unmarshal(bench.LastLine(out.Bytes()), &m); err != nil {
			t.Fatalf("recv output %q: %v", out.String(), err)
		}
		return m
	}
}

func uniqueRing(t *testing.T, tag string) string { return testutil.UniqueRing(t, "interop-"+tag) }

func waitRing(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := ring.Inspect(name, ""); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ring %s never appeared", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUDPEndToEnd: `ibvbridge send` → loopback UDP → `ibvbridge recv` → a Go, C or Python consumer
// process that checks every byte of every heap.
func TestUDPEndToEnd(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			name, port := uniqueRing(t, "udp-"+kind), freeUDPPort(t)
			const heaps = 500
			recv := startRecv(t, "--ring", name, "--slots", "1024", "--slot-size", "64K", "127.0.0.1:"+port)
			waitRing(t, name)
			wait := startConsumer(t, kind, filepath.Join(ring.DefaultDir(), ring.SocketName(name)))
			for i := 0; ; i++ { // the stream starts once the consumer is attached
				if info, err := ring.Inspect(name, ""); err == nil && info.Attached() > 0 {
					break
				}
				if i > 2000 {
					t.Fatal("consumer did not attach")
				}
				time.Sleep(5 * time.Millisecond)
			}
			send := exec.Command(goTool, "send", "127.0.0.1:"+port, "--heaps", strconv.Itoa(heaps), "--heap-size", "40000",
				"--items", "3", "--packet-size", "8972", "--pattern", "--rate", "0.5")
			if out, err := send.CombinedOutput(); err != nil {
				t.Fatalf("send: %v\n%s", err, out)
			}
			m := recv()
			r := wait()
			if m["result"] != "stream_stop" || m["heaps"].(float64) != heaps || m["incomplete_heaps"].(float64) != 0 {
				t.Fatalf("recv counters %v", m)
			}
			if r.Result != "eos" || r.Heaps != heaps || r.VerifyErrors != 0 || r.OutOfOrder != 0 || r.Bytes != heaps*40000 {
				t.Fatalf("%s consumer %+v", kind, r)
			}
		})
	}
}

// TestPcapLossCountedExactly replays a spead2 capture with packets removed through `ibvbridge recv
// --pcap --incomplete`: every damaged heap arrives flagged incomplete, every other heap intact, and the
// counters say exactly how many.
func TestPcapLossCountedExactly(t *testing.T) {
	frames := frametest.ReadFrames(t, filepath.Join(frametest.Dir(t), "large_1MiB_p8972.pcap"))
	// Drop a packet of heap 3 and two of heap 9 (118 packets a heap): exactly 2 damaged heaps.
	drop := map[int]bool{2*118 + 5: true, 8*118 + 40: true, 8*118 + 41: true}
	path := filepath.Join(t.TempDir(), "lossy.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for i, fr := range frames {
		if drop[i] {
			continue
		}
		if err := w.WritePacket(gopacketCI(len(fr)), fr); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	// What the consumer must receive: the payload of every kept data packet (the stop packet's null byte
	// is not a heap's).
	var want uint64
	for i, fr := range frames {
		u, err := frame.Parse(fr)
		var pkt spead.Packet
		if err != nil || spead.Decode(u.Payload, &pkt) != nil {
			t.Fatalf("frame %d does not decode", i)
		}
		if !drop[i] && !pkt.IsStreamStop() {
			want += uint64(pkt.PayloadLength())
		}
	}
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			name := uniqueRing(t, "loss-"+kind)
			recv := startRecv(t, "--ring", name, "--pcap", path, "--incomplete", "--slots", "32", "--slot-size", "2M",
				"--wait-consumer", "20s")
			waitRing(t, name)
			// spead2's payloads are not the test pattern: no --verify; the byte count and flags are the check.
			r := startConsumerVerify(t, kind, filepath.Join(ring.DefaultDir(), ring.SocketName(name)), false)()
			m := recv()
			if m["heaps"].(float64) != 16 || m["incomplete_heaps"].(float64) != 2 || m["packets"].(float64) != float64(len(frames)-3) {
				t.Fatalf("recv counters %v", m)
			}
			if r.Heaps != 16 || r.Incomplete != 2 || r.Bytes != want {
				t.Fatalf("%s consumer %+v", kind, r)
			}
		})
	}
}

func gopacketCI(n int) gopacket.CaptureInfo {
	return gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: n, Length: n}
}
