package ring_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// BenchmarkGroupCPUBound (spec §14): heaps whose per-heap work is CPU-bound (~20 µs of arithmetic over
// the payload), read by one consumer or shared by a group of 4; compare heaps/s between the two
// (`go test -run X -bench GroupCPUBound ./ring/`). Not a timed test: it reports, it does not judge.
func BenchmarkGroupCPUBound(b *testing.B) {
	work := func(h ring.Heap) uint64 {
		var s uint64
		for r := 0; r < 40; r++ {
			for _, v := range h.Payload {
				s = s*31 + uint64(v)
			}
		}
		return s
	}
	for _, members := range []int{1, 4} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			cfg := ring.Config{Dir: b.TempDir(), HugePages: ring.HugePagesOff, SlotCount: 256, SlotSize: 4096, Policy: ring.PolicyBlock}
			p := ringtest.New(b, "bench", cfg)
			var wg sync.WaitGroup
			for range members {
				c, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "g"})
				if err != nil {
					b.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					for {
						h, err := c.Next(10 * time.Second)
						if err != nil {
							return
						}
						_ = work(h)
						c.Release(h)
					}
				}()
			}
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				publish(b, p, uint64(i+1), 512)
			}
			if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "heaps/s")
		})
	}
}
