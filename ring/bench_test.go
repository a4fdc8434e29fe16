package ring_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// BenchmarkHandoff64B measures one 64-byte heap through the ring between goroutines (producer and Go
// consumers on different cores): ns/op is the per-heap cost of the slower side. "independent" is one
// consumer; "group2" two members of one group sharing the stream (spec §14: the producer reads the
// cursors, assigns and stores head under its lock at each commit). batch is heaps per commit: 1 is a
// commit per heap, 32 a receive batch (recv commits once per recvmmsg or completion-queue poll).
func BenchmarkHandoff64B(b *testing.B) {
	for _, members := range []int{0, 2} {
		for _, batch := range []int{1, 32} {
			name := "independent"
			if members > 0 {
				name = fmt.Sprintf("group%d", members)
			}
			b.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(b *testing.B) { handoff(b, members, batch) })
		}
	}
}

func handoff(b *testing.B, members, batch int) {
	cfg := ring.Config{Dir: b.TempDir(), HugePages: ring.HugePagesOff, SlotCount: 4096, SlotSize: 64, MaxItems: 4, Policy: ring.PolicyBlock}
	p, err := ring.Create("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	opts := []ring.AttachOptions{{Dir: cfg.Dir}}
	if members > 0 {
		opts = nil
		for range members {
			opts = append(opts, ring.AttachOptions{Dir: cfg.Dir, Group: "bench"})
		}
	}
	done := make(chan error, len(opts))
	for _, o := range opts {
		c, err := ring.Attach("bench", o)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		go func() {
			for {
				h, err := c.Next(5 * time.Second)
				if err != nil {
					if errors.Is(err, ring.ErrEndOfStream) {
						err = nil
					}
					done <- err
					return
				}
				c.Release(h)
			}
		}()
	}
	pb := pattern.Publisher{P: p, Size: 64}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if batch > 1 && i%batch == 0 {
			p.BeginBatch()
		}
		if _, err := pb.Publish(uint64(i), 0); err != nil {
			b.Fatal(err)
		}
		if batch > 1 && (i%batch == batch-1 || i == b.N-1) {
			p.EndBatch()
		}
	}
	if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	for range opts {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mheaps/s")
}
