package pcap

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// A capture that ends inside a record — cut off mid-write, or a pcapng block whose length runs past the
// end — replays its whole records, then warns and counts instead of ending quietly.
func TestTruncatedCaptureWarnsAndCounts(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(frametest.Dir(t), frametest.Captures[0].Name))
	if err != nil {
		t.Fatal(err)
	}
	whole := readFrames(t, src, 3)
	var ng bytes.Buffer
	w, err := pcapgo.NewNgWriter(&ng, layers.LinkTypeEthernet)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range whole {
		if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: len(f), Length: len(f)}, f); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	cases := map[string][]byte{
		"pcap cut mid-record":      src[:len(src)-7],
		"pcapng cut mid-block":     ng.Bytes()[:ng.Len()-7],
		"pcapng corrupt block len": corruptSecondPacketBlock(t, bytes.Clone(ng.Bytes())),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cut.pcap")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			var logBuf bytes.Buffer
			log := zerolog.New(&logBuf)
			s, err := Open(Config{Path: path, Log: &log})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Run(context.Background(), testutil.NewRecordingSink(false)); err != nil {
				t.Fatalf("Run: %v, want the end of the input", err)
			}
			st := s.Stats()
			if st.Truncated != 1 || st.Map()["truncated_records"] != 1 || st.Frames == 0 {
				t.Errorf("stats %+v: want truncated_records 1 after the whole frames", st)
			}
			if !strings.Contains(logBuf.String(), "ends inside a record") {
				t.Errorf("no warning logged: %q", logBuf.String())
			}
		})
	}
	// The whole file is not truncated.
	s, err := Open(Config{Path: filepath.Join(frametest.Dir(t), frametest.Captures[0].Name)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Run(context.Background(), testutil.NewRecordingSink(false)); err != nil || s.Stats().Truncated != 0 {
		t.Errorf("whole capture: err %v, truncated %d", err, s.Stats().Truncated)
	}
}

func readFrames(t *testing.T, pcapFile []byte, n int) [][]byte {
	t.Helper()
	r, err := pcapgo.NewReader(bytes.NewReader(pcapFile))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for range n {
		d, _, err := r.ReadPacketData()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// corruptSecondPacketBlock sets the length of the second enhanced packet block (type 6) past the file's end.
func corruptSecondPacketBlock(t *testing.T, b []byte) []byte {
	t.Helper()
	seen := 0
	for off := 0; off+8 <= len(b); {
		typ, l := binary.LittleEndian.Uint32(b[off:]), int(binary.LittleEndian.Uint32(b[off+4:]))
		if typ == 6 {
			if seen++; seen == 2 {
				binary.LittleEndian.PutUint32(b[off+4:], 0x0FFFFFF0)
				return b
			}
		}
		if l < 12 {
			break
		}
		off += l
	}
	t.Fatal("no second packet block")
	return nil
}
