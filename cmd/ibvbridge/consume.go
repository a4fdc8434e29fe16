package main

import (
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/pattern"
)

// consumeResult is the one JSON object every consumer tool (this one, clients/c's ibvb-consume and
// Python's ibvbridge.consume) prints when it stops: the cross-language tests and the benchmark compare them.
type consumeResult struct {
	Heaps        uint64            `json:"heaps"`
	Bytes        uint64            `json:"bytes"`
	Checksum     uint64            `json:"checksum"`
	VerifyErrors uint64            `json:"verify_errors"`
	Incomplete   uint64            `json:"incomplete"`
	FirstHeapCnt uint64            `json:"first_heap_cnt"`
	LastHeapCnt  uint64            `json:"last_heap_cnt"`
	OutOfOrder   uint64            `json:"heap_cnt_out_of_order"`
	Seconds      float64           `json:"seconds"`
	Result       string            `json:"result"`
	Error        string            `json:"error"`
	Counters     map[string]uint64 `json:"counters"`
	SessionID    uint64            `json:"session_id"`
	exitCode     int
}

func runConsume(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr)
	name := fs.String("ring", "", "ring name or control-file path (required)")
	verify := fs.Bool("verify", false, "check every byte of complete heaps against the test pattern (send --pattern)")
	maxHeaps := fs.Uint64("max-heaps", 0, "stop after this many heaps (0: until end of stream)")
	timeoutMs := fs.Int("timeout-ms", 10000, "attach timeout and per-heap wait timeout")
	hold := fs.Int("hold", 0, "keep up to N heaps unreleased (a consumer that reads ahead)")
	sleepUs := fs.Int("sleep-us", 0, "sleep this long per heap (a slow consumer, for tests)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *name == "" {
		return usageError("--ring is required")
	}
	timeout := time.Duration(*timeoutMs) * time.Millisecond
	res := consumeRing(*name, *verify, *maxHeaps, timeout, *hold, time.Duration(*sleepUs)*time.Microsecond)
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(res); err != nil {
		return err
	}
	if res.exitCode != 0 {
		return &exitError{code: res.exitCode, err: errors.New(res.Error)}
	}
	return nil
}

func consumeRing(name string, verify bool, maxHeaps uint64, timeout time.Duration, hold int, sleep time.Duration) *consumeResult {
	res := &consumeResult{Result: "error"}
	c, err := ring.Attach(name, ring.AttachOptions{Timeout: timeout})
	if err != nil {
		res.Error, res.exitCode = err.Error(), 1
		return res
	}
	defer c.Close()
	res.SessionID = c.SessionID()
	var start time.Time
	held := make([]ring.Heap, 0, hold+1)
	for maxHeaps == 0 || res.Heaps < maxHeaps {
		h, err := c.Next(timeout)
		if err != nil {
			switch {
			case errors.Is(err, ring.ErrEndOfStream):
				res.Result = "eos"
			case errors.Is(err, ring.ErrProducerGone):
				res.Result, res.exitCode = "producer_gone", 2
			case errors.Is(err, ring.ErrTimeout):
				res.Result, res.exitCode = "timeout", 3
			default:
				res.exitCode = 1
			}
			res.Error = err.Error()
			break
		}
		if res.Heaps == 0 {
			start = time.Now()
			res.FirstHeapCnt = h.HeapCnt
		} else if h.HeapCnt <= res.LastHeapCnt {
			res.OutOfOrder++
		}
		res.Heaps++
		res.LastHeapCnt = h.HeapCnt
		res.Bytes += h.Received
		res.Checksum += pattern.Checksum(h.Payload)
		if h.Flags&ring.FlagIncomplete != 0 {
			res.Incomplete++
		}
		if verify && h.Flags&ring.FlagIncomplete == 0 && !pattern.Verify(&h) { // holes hold unspecified bytes
			res.VerifyErrors++
		}
		if sleep > 0 {
			time.Sleep(sleep)
		}
		held = append(held, h)
		if len(held) > hold {
			c.Release(held[0])
			held = held[1:]
		}
	}
	if res.Result == "error" && res.exitCode == 0 {
		res.Result = "max"
	}
	if len(held) > 0 && hold == 0 {
		c.Release(held[len(held)-1])
	}
	if res.Heaps > 0 {
		res.Seconds = time.Since(start).Seconds()
	}
	res.Counters = c.Stats().Map()
	return res
}
