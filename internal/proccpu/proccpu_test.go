package proccpu

import (
	"testing"
	"time"
)

func TestUsedGrowsWithWork(t *testing.T) {
	before := Used()
	x := 0
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
		x++
	}
	if after := Used(); after <= before {
		t.Fatalf("CPU used went from %v to %v over 50 ms of spinning (%d loops)", before, after, x)
	}
}
