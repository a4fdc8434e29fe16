package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// waitForRing waits until ring name is served and has at least n consumers attached, polling it as an
// observer (spec §1.2) every 20 ms, for at most timeout: a sender started beside its receiver and
// consumers then loses nothing to the order the three start in. A ring that is there but ends (CLOSED)
// is an error at once.
func waitForRing(ctx context.Context, name, dir string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		info, err := ring.Inspect(name, dir)
		switch {
		case err == nil && info.State == "closed":
			return fmt.Errorf("ring %s ended before the stream began", name)
		case err == nil:
			attached := 0
			for _, c := range info.Consumers {
				if c.Attached() {
					attached++
				}
			}
			if attached >= n {
				return nil
			}
			last = fmt.Errorf("ring %s has %d of %d consumers attached", name, attached, n)
		case errors.Is(err, ring.ErrNotFound):
			last = fmt.Errorf("ring %s not found", name)
		default:
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %v: %w", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
