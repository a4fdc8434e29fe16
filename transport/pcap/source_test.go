package pcap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/transport"
)

func replay(t *testing.T, cfg Config) (*testutil.RecordingSink, Stats) {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sink := testutil.NewRecordingSink(false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Run(ctx, sink); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return sink, s.Stats()
}

func TestCaptures(t *testing.T) {
	dir := frametest.Dir(t)
	for _, c := range frametest.Captures {
		t.Run(c.Name, func(t *testing.T) {
			sink, st := replay(t, Config{Path: filepath.Join(dir, c.Name)})
			if sink.Count() != c.Frames || st.Packets != uint64(c.Frames) || st.Frames != uint64(c.Frames) {
				t.Errorf("delivered %d packets, stats %+v; want %d", sink.Count(), st, c.Frames)
			}
			if sink.LastNanos() < time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano() {
				t.Errorf("timestamp %d is not the capture's", sink.LastNanos())
			}
		})
	}
}

func TestEndpointFilter(t *testing.T) {
	c := frametest.Captures[0]
	path := filepath.Join(frametest.Dir(t), c.Name)
	frames := frametest.ReadFrames(t, path)
	port := uint16(frames[0][36])<<8 | uint16(frames[0][37]) // UDP destination port
	ep, _ := transport.ParseEndpoint("127.0.0.1:" + itoa(int(port)))
	if sink, _ := replay(t, Config{Path: path, Endpoints: []transport.Endpoint{ep}}); sink.Count() != c.Frames {
		t.Errorf("matching endpoint: %d packets, want %d", sink.Count(), c.Frames)
	}
	other, _ := transport.ParseEndpoint(itoa(int(port) + 1))
	wrongHost, _ := transport.ParseEndpoint("10.1.2.3:" + itoa(int(port)))
	sink, st := replay(t, Config{Path: path, Endpoints: []transport.Endpoint{other, wrongHost}})
	if sink.Count() != 0 || st.Filtered != uint64(c.Frames) {
		t.Errorf("other endpoints: %d packets, %d filtered; want 0, %d", sink.Count(), st.Filtered, c.Frames)
	}
}

func itoa(i int) string {
	return string(appendInt(nil, i))
}

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// writeCapture writes frames to a new file in the given format and link type, converting the Ethernet
// frames for SLL and raw IP, with timestamps gap apart; non-UDP junk is added to check skipping.
func writeCapture(t *testing.T, frames [][]byte, ng bool, lt layers.LinkType, gap time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var write func(ci gopacket.CaptureInfo, data []byte) error
	if ng {
		w, err := pcapgo.NewNgWriter(f, lt)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Flush()
		write = w.WritePacket
	} else {
		w := pcapgo.NewWriter(f)
		if err := w.WriteFileHeader(65535, lt); err != nil {
			t.Fatal(err)
		}
		write = w.WritePacket
	}
	t0 := time.Unix(1700000000, 0)
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	all := append([][]byte{arp}, frames...)
	for i, fr := range all {
		var data []byte
		switch lt {
		case layers.LinkTypeEthernet:
			data = fr
		case layers.LinkTypeLinuxSLL:
			data = append(make([]byte, 14), fr[12:]...) // 14 bytes of SLL header, then protocol + IP
		case layers.LinkTypeRaw:
			if i == 0 {
				data = []byte{0x60, 0, 0, 0} // an IPv6 stub: skipped as not IPv4
			} else {
				data = fr[14:]
			}
		}
		ci := gopacket.CaptureInfo{Timestamp: t0.Add(time.Duration(i) * gap), CaptureLength: len(data), Length: len(data)}
		if err := write(ci, data); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func TestFormatsAndLinkTypes(t *testing.T) {
	c := frametest.Captures[3]
	frames := frametest.ReadFrames(t, filepath.Join(frametest.Dir(t), c.Name))
	frames = frames[:500]
	for _, tc := range []struct {
		name string
		ng   bool
		lt   layers.LinkType
	}{
		{"pcap-ethernet", false, layers.LinkTypeEthernet},
		{"pcapng-ethernet", true, layers.LinkTypeEthernet},
		{"pcap-sll", false, layers.LinkTypeLinuxSLL},
		{"pcapng-raw", true, layers.LinkTypeRaw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeCapture(t, frames, tc.ng, tc.lt, time.Microsecond)
			sink, st := replay(t, Config{Path: path})
			if sink.Count() != len(frames) || st.Frames != uint64(len(frames)+1) {
				t.Errorf("%d packets of %d frames, want %d of %d", sink.Count(), st.Frames, len(frames), len(frames)+1)
			}
			if st.Skipped[2] != 1 { // frame.ReasonNotIPv4
				t.Errorf("skipped %v, want one 'not ipv4'", st.Map())
			}
		})
	}
}

func TestPaced(t *testing.T) {
	c := frametest.Captures[0]
	frames := frametest.ReadFrames(t, filepath.Join(frametest.Dir(t), c.Name))[:5]
	path := writeCapture(t, frames, false, layers.LinkTypeEthernet, 40*time.Millisecond)
	start := time.Now()
	sink, _ := replay(t, Config{Path: path, Paced: true})
	if el := time.Since(start); el < 190*time.Millisecond || el > 2*time.Second {
		t.Errorf("paced replay of 200 ms of capture took %v", el)
	}
	if sink.Count() != 5 {
		t.Errorf("%d packets", sink.Count())
	}
}

func TestCancel(t *testing.T) {
	c := frametest.Captures[0]
	frames := frametest.ReadFrames(t, filepath.Join(frametest.Dir(t), c.Name))[:3]
	s, err := Open(Config{Path: writeCapture(t, frames, false, layers.LinkTypeEthernet, time.Second), Paced: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.Run(ctx, testutil.NewRecordingSink(false)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run: %v", err)
	}
	if time.Since(start) > time.Second {
		t.Error("slow to stop")
	}
}

func TestNotACapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x")
	os.WriteFile(path, []byte("hello, this is not a capture file"), 0o644)
	if _, err := Open(Config{Path: path}); err == nil {
		t.Error("opened a text file")
	}
	if _, err := Open(Config{Path: path + "missing"}); err == nil {
		t.Error("opened a missing file")
	}
}
