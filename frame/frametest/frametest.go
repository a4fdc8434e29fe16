// Package frametest owns test access to the spead2 interop captures (docs in
// shared/testdata/spead2/README.md): finding them from any test directory and reading their frames.
package frametest

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"
)

// EnvDir overrides where the captures are looked for.
const EnvDir = "SPEAD2_TESTDATA"

// relDir is where the captures live relative to some ancestor of the test directory: /work/shared/... next
// to the /work/main checkout.
const relDir = "shared/testdata/spead2"

// Capture describes one capture file and what spead2_recv counted for it.
type Capture struct {
	Name          string
	Frames        int
	DataHeaps     int
	PacketsMin    int // packets per data heap
	PacketsMax    int
	DataAddrBits  int // flavour of the data packets
	StopAddrBits  int // flavour of the stream-stop packet
	PacketSize    int // spead2_send --packet
	HeapSize      int // --heap-size
	ItemsPerHeap  int // --items
	VerifyPayload bool
}

// Captures lists the four captures of the README.
var Captures = []Capture{
	{Name: "small_4KiB_1pkt.pcap", Frames: 1991, DataHeaps: 1990, PacketsMin: 1, PacketsMax: 1,
		DataAddrBits: 40, StopAddrBits: 40, PacketSize: 8972, HeapSize: 4096, ItemsPerHeap: 1},
	{Name: "large_1MiB_p8972.pcap", Frames: 1889, DataHeaps: 16, PacketsMin: 118, PacketsMax: 118,
		DataAddrBits: 40, StopAddrBits: 40, PacketSize: 8972, HeapSize: 1 << 20, ItemsPerHeap: 1},
	{Name: "large_1MiB_p1472.pcap", Frames: 1467, DataHeaps: 2, PacketsMin: 733, PacketsMax: 733,
		DataAddrBits: 40, StopAddrBits: 40, PacketSize: 1472, HeapSize: 1 << 20, ItemsPerHeap: 1},
	{Name: "multi_items_verify_p1472.pcap", Frames: 9202, DataHeaps: 200, PacketsMin: 46, PacketsMax: 47,
		DataAddrBits: 40, StopAddrBits: 48, PacketSize: 1472, HeapSize: 65536, ItemsPerHeap: 4, VerifyPayload: true},
}

// Dir finds the capture directory: $SPEAD2_TESTDATA, else shared/testdata/spead2 under the nearest ancestor
// of the working directory that has it. It skips the test only if no such directory exists.
func Dir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatalf("frametest: working directory: %v", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		candidate := filepath.Join(dir, relDir)
		if fi, err := os.Stat(candidate); err == nil && fi.IsDir() {
			return candidate
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	tb.Skipf("frametest: spead2 captures not found: no %s above %s and $%s unset", relDir, wd, EnvDir)
	return ""
}

// ReadFrames returns every frame of a pcap file (Ethernet link type).
func ReadFrames(tb testing.TB, path string) [][]byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatalf("frametest: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		tb.Fatalf("frametest: %s: %v", path, err)
	}
	var frames [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return frames
		}
		if err != nil {
			tb.Fatalf("frametest: %s frame %d: %v", path, len(frames), err)
		}
		frames = append(frames, data)
	}
}
