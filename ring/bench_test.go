package ring_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// BenchmarkHandoff64B measures one 64-byte heap through the ring between two goroutines (producer and Go
// consumer on different cores): ns/op is the per-heap cost of the slower side.
func BenchmarkHandoff64B(b *testing.B) {
	cfg := ring.Config{Dir: b.TempDir(), HugePages: ring.HugePagesOff, SlotCount: 4096, SlotSize: 64, MaxItems: 4, Policy: ring.PolicyBlock}
	p, err := ring.Create("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	c, err := ring.Attach("bench", ring.AttachOptions{Dir: cfg.Dir})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
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
	pb := pattern.Publisher{P: p, Size: 64}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := pb.Publish(uint64(i), 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mheaps/s")
}
