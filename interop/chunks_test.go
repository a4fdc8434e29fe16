package interop_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// chunkTraffic is send's --pattern --timestamp-step traffic for recv's chunk mode: heaps of chunkHeapSize
// bytes, heap k (from 1) at time index (k-1)/chunkAxis and axis (k-1) mod chunkAxis, so chunk c's
// position p holds heap c × chunkHeaps × chunkAxis + p + 1.
const chunkHeaps, chunkAxis, chunkHeapSize, chunkSent = 8, 4, 8192, 300

// startChunkRecv starts recv in chunk mode on a new ring; it returns the ring's socket path, the port and
// recv's wait.
func startChunkRecv(t *testing.T, tag string) (sock, port string, wait func() map[string]any) {
	t.Helper()
	name, port := uniqueRing(t, tag), freeUDPPort(t)
	wait = startRecv(t, "--ring", name, "--slots", "16", "--hugepages", "off",
		"--chunk-heaps", strconv.Itoa(chunkHeaps), "--chunk-by", "0x1600:4096",
		"--chunk-axis", "0x4101:"+strconv.Itoa(chunkAxis), "--chunk-heap-size", strconv.Itoa(chunkHeapSize),
		"127.0.0.1:"+port)
	waitRing(t, name)
	return filepath.Join(ring.DefaultDir(), ring.SocketName(name)), port, wait
}

// sendChunkTraffic waits for n consumers on the ring, then sends chunkSent heaps of chunk traffic.
func sendChunkTraffic(t *testing.T, sock, port string, n int) {
	t.Helper()
	name := filepath.Base(sock)
	name = name[:len(name)-len(ring.SocketName(""))]
	waitConsumers(t, name, n)
	send := exec.Command(goTool, "send", "127.0.0.1:"+port, "--heaps", strconv.Itoa(chunkSent),
		"--heap-size", strconv.Itoa(chunkHeapSize), "--packet-size", "8972", "--pattern", "--rate", "0.5",
		"--timestamp-step", "4096", "--axis", "0x4101:"+strconv.Itoa(chunkAxis))
	if out, err := send.CombinedOutput(); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
}

func waitConsumers(t *testing.T, name string, n int) {
	t.Helper()
	for i := 0; ; i++ {
		if info, err := ring.Inspect(name, ""); err == nil && info.Attached() >= n {
			return
		}
		if i > 2000 {
			t.Fatalf("%d consumers did not attach to %s", n, name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A chunk-mode ring is read safely by a consumer that knows nothing of chunks (spec §13): the Go consumer
// tool reads every chunk as a heap — its received bytes, no items. The C and Python tools know chunks
// (their clients' chunk APIs): they read the same chunks chunk by chunk, their checksum covering exactly
// the heap positions the presence maps mark present. The chunk counters travel with the others.
func TestChunkRingReadAsHeapsByEveryConsumer(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "chunks-"+kind, ring.Config{Policy: ring.PolicyBlock, // 8192-byte slots: room for 8016

				Chunks: ring.ChunkGeometry{Heaps: 8, Axis: 2, HeapSize: 500, Step: 1, TimeItem: 0x1600}})
			wait := startConsumerVerify(t, kind, p.SocketPath(), false)
			waitAttached(t, p)
			g := p.Chunks()
			const n = 40
			var sum, sumPresent, bytes, present uint64
			for id := uint64(0); id < n; id++ {
				s, err := p.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				pattern.FillPattern(s.Payload[:g.Bytes()], id)
				pres := g.Presence(s.Payload)
				for i := range pres {
					pres[i] = byte(1 - (id+uint64(i))%5/4) // some positions absent
				}
				received := g.Bytes() - id*7 // what "arrived"
				p.PublishChunk(s, ring.ChunkInfo{ID: id, Received: received, Packets: 16})
				sum += pattern.Checksum(s.Payload[:received])
				bytes += received
				for k, b := range pres {
					if b == 1 {
						off := uint64(k) * g.HeapSize
						sumPresent += pattern.Checksum(s.Payload[off : off+g.HeapSize])
						present++
					}
				}
			}
			if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			r := wait()
			wantSum, wantChunks, wantPresent := sum, uint64(0), uint64(0)
			if kind != "go" {
				wantSum, wantChunks, wantPresent = sumPresent, n, present
			}
			if r.Result != "eos" || r.exitCode != 0 || r.Heaps != n || r.Bytes != bytes || r.Checksum != wantSum ||
				r.Chunks != wantChunks || r.HeapsPresent != wantPresent {
				t.Fatalf("%s consumer: %+v (want %d chunks, %d bytes, checksum %#x, %d chunks and %d heaps present from a chunk-aware tool)",
					kind, r, n, bytes, wantSum, wantChunks, wantPresent)
			}
			checkCounters(t, kind, r.Counters, p.Stats())
			if st := p.Stats(); st.Get(ring.CounterChunks) != n || st.Get(ring.CounterIncompleteChunks) == 0 {
				t.Fatalf("producer counters %v", st.Map())
			}
		})
	}
}

// TestChunkRingReadByCAndPythonTools: recv in chunk mode fed by send; the C (ibvb-consume) and Python
// (ibvbridge.consume) tools read it chunk by chunk through their clients' chunk APIs and verify every
// present heap position against its heap's pattern: 10 chunks in id order, the last one partly filled,
// 300 heaps present, and the checksum of exactly the 300 heaps' bytes.
func TestChunkRingReadByCAndPythonTools(t *testing.T) {
	kinds := slices.DeleteFunc(consumers(t), func(k string) bool { return k == "go" }) // Go: cmd/ibvbridge chunks_test
	if len(kinds) == 0 {
		t.Skip("no C or Python consumer built")
	}
	sock, port, recv := startChunkRecv(t, "chunks-tools")
	waits := map[string]func() result{}
	for _, kind := range kinds {
		waits[kind] = startConsumer(t, kind, sock)
	}
	sendChunkTraffic(t, sock, port, len(kinds))
	m := recv()
	var sum uint64
	buf := make([]byte, chunkHeapSize)
	for k := uint64(1); k <= chunkSent; k++ {
		pattern.FillPattern(buf, k)
		sum += pattern.Checksum(buf)
	}
	const per = chunkHeaps * chunkAxis
	for _, kind := range kinds {
		r := waits[kind]()
		if r.Result != "eos" || r.Heaps != 10 || r.Chunks != 10 || r.HeapsPresent != chunkSent || r.VerifyErrors != 0 ||
			r.FirstHeapCnt != 0 || r.LastHeapCnt != 9 || r.OutOfOrder != 0 || r.Incomplete != 1 ||
			r.Checksum != sum || r.Bytes != chunkSent*chunkHeapSize || r.OverrunHeaps != 0 {
			t.Errorf("%s consumer %+v; want 10 chunks, %d heaps present (the last chunk %d of %d), checksum %d; recv %v",
				kind, r.ConsumeResult, chunkSent, chunkSent%per, per, sum, m)
		}
	}
}

// wantPowerLines is what examples/chunks/power.py prints for the chunk traffic, computed here from the
// pattern bytes directly: per chunk, the present heaps (every heap sent: the last chunk partly filled),
// the sum of re² + im² over their int8 (re, im) pairs, the channel of largest summed power (the first of
// equals) and its mean over the present heaps; then the summary.
func wantPowerLines() []string {
	const per, channels = chunkHeaps * chunkAxis, chunkHeapSize / 2
	var lines []string
	buf := make([]byte, chunkHeapSize)
	for c := uint64(0); c*per < chunkSent; c++ {
		sums := make([]int64, channels)
		n := 0
		for p := uint64(0); p < per && c*per+p < chunkSent; p++ {
			pattern.FillPattern(buf, c*per+p+1)
			for ch := range channels {
				re, im := int64(int8(buf[2*ch])), int64(int8(buf[2*ch+1]))
				sums[ch] += re*re + im*im
			}
			n++
		}
		var total int64
		peak := 0
		for ch, s := range sums {
			total += s
			if s > sums[peak] {
				peak = ch
			}
		}
		lines = append(lines, fmt.Sprintf(`{"chunk": %d, "present": %d, "total_power": %d, "peak_channel": %d, "peak_mean_power": "%.3f"}`,
			c, n, total, peak, float64(sums[peak])/float64(n)))
	}
	return append(lines, fmt.Sprintf(`{"chunks": %d, "heaps": %d, "overrun_chunks": 0}`, len(lines), chunkSent))
}

// TestChunksPowerExample: examples/chunks/power.py reads recv's chunk ring fed by send and prints, per
// chunk, exactly the power figures computed here from the pattern bytes: with a wake per chunk, and with
// wakes coalesced by --max-latency (several chunks read per wake, none lost or reordered).
func TestChunksPowerExample(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 for the Python example")
	}
	for _, tc := range []struct{ name, maxLatency string }{{"WakePerChunk", "0"}, {"CoalescedWakes", "0.05"}} {
		t.Run(tc.name, func(t *testing.T) { testChunksPowerExample(t, tc.maxLatency) })
	}
}

func testChunksPowerExample(t *testing.T, maxLatency string) {
	sock, port, recv := startChunkRecv(t, "chunks-power")
	cmd := exec.Command("/usr/bin/python3", filepath.Join(repoRoot, "examples/chunks/power.py"), "--ring", sock,
		"--max-latency", maxLatency)
	cmd.Env = append(os.Environ(), "PYENV_VERSION=system")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sendChunkTraffic(t, sock, port, 1)
	recv()
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	timer.Stop()
	if err != nil {
		t.Fatalf("power.py: %v\n%s", err, errb.String())
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := wantPowerLines()
	if !slices.Equal(got, want) {
		t.Fatalf("power.py printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
