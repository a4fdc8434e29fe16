package interop_test

import (
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// A chunk-mode ring is read safely by consumers that know nothing of chunks (spec §13): the C, Python and
// Go consumer tools read every chunk as a heap — its received bytes, no items — and the chunk counters
// travel with the others.
func TestChunkRingReadAsHeapsByEveryConsumer(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "chunks-"+kind, ring.Config{Policy: ring.PolicyBlock, // 8192-byte slots: room for 8016

				Chunks: ring.ChunkGeometry{Heaps: 8, Axis: 2, HeapSize: 500, Step: 1, TimeItem: 0x1600}})
			wait := startConsumerVerify(t, kind, p.SocketPath(), false)
			waitAttached(t, p)
			g := p.Chunks()
			const n = 40
			var sum, bytes uint64
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
			}
			if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			r := wait()
			if r.Result != "eos" || r.exitCode != 0 || r.Heaps != n || r.Bytes != bytes || r.Checksum != sum {
				t.Fatalf("%s consumer: %+v (want %d chunks as heaps, %d bytes, checksum %#x)", kind, r, n, bytes, sum)
			}
			checkCounters(t, kind, r.Counters, p.Stats())
			if st := p.Stats(); st.Get(ring.CounterChunks) != n || st.Get(ring.CounterIncompleteChunks) == 0 {
				t.Fatalf("producer counters %v", st.Map())
			}
		})
	}
}
