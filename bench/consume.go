package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/proccpu"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// recvReport is recv's final JSON line: its counters, and its transport's under transport_counters.
type recvReport map[string]any

// parseRecvReport reads the last line recv printed.
func parseRecvReport(out []byte) (recvReport, error) {
	var r recvReport
	if err := json.Unmarshal(LastLine(out), &r); err != nil {
		return nil, fmt.Errorf("recv output %q: %w", out, err)
	}
	return r, nil
}

// count is one of recv's counters (0 when absent).
func (r recvReport) count(k string) uint64 { f, _ := r[k].(float64); return uint64(f) }

// transport is one of the transport's counters (0 when absent).
func (r recvReport) transport(k string) uint64 {
	tc, _ := r["transport_counters"].(map[string]any)
	f, _ := tc[k].(float64)
	return uint64(f)
}

// cpuSince is recv's CPU time since it had used cpu0: its own account, which ends at the stream's end
// (its exit frees the ring's pages: seconds for GiBs), else atExit - cpu0 (a build that reports none).
func (r recvReport) cpuSince(cpu0, atExit time.Duration) time.Duration {
	if s, ok := r["cpu_seconds"].(float64); ok {
		return time.Duration(s*1e9) - cpu0
	}
	return atExit - cpu0
}

// ConsumeResult is the one JSON object every consumer tool (`ibvbridge consume`, clients/c's
// ibvb-consume and Python's ibvbridge.consume) prints when it stops: the cross-language tests and the
// benchmarks compare them.
type ConsumeResult struct {
	Heaps        uint64 `json:"heaps"`
	Bytes        uint64 `json:"bytes"`
	Checksum     uint64 `json:"checksum"`
	VerifyErrors uint64 `json:"verify_errors"`
	// OverrunHeaps counts heaps found invalid after they were read (layout 2.1 §A: the producer overran the
	// consumer and reused their slots meanwhile): their bytes are not judged, so they are not verify errors.
	OverrunHeaps uint64 `json:"overrun_heaps"`
	Incomplete   uint64 `json:"incomplete"`
	FirstHeapCnt uint64 `json:"first_heap_cnt"`
	LastHeapCnt  uint64 `json:"last_heap_cnt"`
	OutOfOrder   uint64 `json:"heap_cnt_out_of_order"`
	// HeapCntSum is the sum of the heap counters read: a group's members' sums (with their heap counts)
	// add up to the stream's when each heap went to exactly one of them.
	HeapCntSum uint64  `json:"heap_cnt_sum"`
	Seconds    float64 `json:"seconds"`
	// CPUSeconds is the consumer's CPU time (user + system) from its attach to the end of its stream: the
	// stream's cost without the process's start-up and exit.
	CPUSeconds float64           `json:"cpu_seconds"`
	Result     string            `json:"result"`
	Error      string            `json:"error"`
	Counters   map[string]uint64 `json:"counters"`
	SessionID  uint64            `json:"session_id"`
	// Chunks and HeapsPresent: the C and Python tools on a chunk-mode ring (spec §13), where Heaps counts
	// the positions read (chunks) and HeapsPresent the heap positions their presence maps mark present.
	Chunks       uint64 `json:"chunks,omitempty"`
	HeapsPresent uint64 `json:"heaps_present,omitempty"`
	// Streams, with ConsumeOptions.Streams (reading on across STREAM_END markers, recv --keep-going): one
	// entry per stream, in order, each closed by its marker (Ended) or by the end of the ring.
	Streams  []StreamTally `json:"streams,omitempty"`
	exitCode int
}

// StreamTally is one stream as a consumer tool read it: its heaps, the sum of their cnts, and, when a
// STREAM_END marker closed it, the stop heap's cnt.
type StreamTally struct {
	Heaps       uint64 `json:"heaps"`
	HeapCntSum  uint64 `json:"heap_cnt_sum"`
	Ended       bool   `json:"ended"`
	StopHeapCnt uint64 `json:"stop_heap_cnt"`
}

// ExitCode is the consumer tools' exit status for this result: 0 end of stream (or --max-heaps reached),
// 1 error, 2 producer gone, 3 timeout, 4 detached as overrun, 5 detached for another reason.
func (r *ConsumeResult) ExitCode() int { return r.exitCode }

// ConsumeOptions tune Consume.
type ConsumeOptions struct {
	Verify   bool          // check every byte of complete heaps against the test pattern
	MaxHeaps uint64        // stop after this many heaps (0: until end of stream)
	Timeout  time.Duration // attach timeout and per-heap wait timeout
	Hold     int           // keep up to Hold heaps unreleased (a consumer that reads ahead)
	Sleep    time.Duration // per heap (a slow consumer, for tests)
	Dir      string        // ring directory ("" for the default)
	FromHead bool          // start at the newest heap, not the oldest the ring holds
	// MaxLatency: let heaps of a moving stream wait up to this long for coalesced wakes (0: a wake per heap).
	MaxLatency time.Duration
	// StopFirst stops the process (SIGSTOP to itself) after taking the first heap and before reading its
	// bytes, until a SIGCONT: a consumer stalled mid-read, for tests (the producer may overrun it meanwhile).
	StopFirst bool
	// Wait retries a ring name that no directory serves yet until Timeout (else it fails at once).
	Wait bool
	// Group attaches as a member of this consumer group (spec §14): only the heaps assigned to it.
	Group string
	// WorkPasses checksums each heap's payload this many more times: CPU-bound work per heap (benchmarks).
	WorkPasses int
	// Streams reads on across STREAM_END markers (recv --keep-going), tallying each stream (Result.Streams);
	// without it the first marker ends the read ("eos").
	Streams bool
}

// stopSelf stops the process (SIGSTOP) before it returns. The signal goes to this thread: one sent to
// the process may be taken by another, sleeping thread, and this one would read on until that thread ran.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}

// workSink receives ConsumeOptions.WorkPasses' results.
var workSink uint64

// Consume reads ring name as its consumer until the end of stream (or o.MaxHeaps), checksumming every
// heap and, with o.Verify, checking the pattern; `ibvbridge consume` prints the result.
func Consume(name string, o ConsumeOptions) *ConsumeResult {
	verify, maxHeaps, timeout, hold, sleep := o.Verify, o.MaxHeaps, o.Timeout, max(o.Hold, 0), o.Sleep
	res := &ConsumeResult{Result: "error"}
	c, err := ring.Attach(name, ring.AttachOptions{Timeout: timeout, Wait: o.Wait, Dir: o.Dir, MaxLatency: o.MaxLatency, FromHead: o.FromHead, Group: o.Group})
	if err != nil {
		res.Error, res.exitCode = err.Error(), 1
		return res
	}
	defer c.Close()
	res.SessionID = c.SessionID()
	if _, chunks := c.Chunks(); chunks && verify {
		res.Error, res.exitCode = fmt.Sprintf("ring %s is in chunk mode: --verify checks heaps of the test pattern, not chunks", name), 1
		return res
	}
	cpu0 := proccpu.Used()
	var start time.Time
	held := make([]ring.Heap, hold+1) // a circular queue of the heaps held: nothing allocated per heap
	first, nHeld := 0, 0
	stopFirst := o.StopFirst
	var cur StreamTally
	defer func() {
		if o.Streams && (cur.Heaps > 0 || len(res.Streams) == 0) {
			res.Streams = append(res.Streams, cur) // the last stream, ended by the ring's end
		}
	}()
	for maxHeaps == 0 || res.Heaps < maxHeaps {
		h, err := c.Next(timeout)
		if o.Streams && errors.Is(err, ring.ErrStreamEnd) {
			cur.Ended, cur.StopHeapCnt = true, h.HeapCnt
			res.Streams = append(res.Streams, cur)
			cur = StreamTally{}
			continue
		}
		if err != nil {
			switch {
			case errors.Is(err, ring.ErrEndOfStream):
				res.Result = "eos"
			case errors.Is(err, ring.ErrProducerGone):
				res.Result, res.exitCode = "producer_gone", 2
			case errors.Is(err, ring.ErrTimeout):
				res.Result, res.exitCode = "timeout", 3
			case errors.Is(err, ring.ErrOverrun):
				res.Result, res.exitCode = "overrun", 4
			case errors.Is(err, ring.ErrDetached):
				res.Result, res.exitCode = "detached", 5
			default:
				res.exitCode = 1
			}
			res.Error = err.Error()
			break
		}
		if res.Heaps == 0 {
			start = time.Now()
			res.FirstHeapCnt = h.HeapCnt
		} else if h.HeapCnt <= res.LastHeapCnt && cur.Heaps > 0 { // a new stream may count from 1 again
			res.OutOfOrder++
		}
		if stopFirst {
			stopFirst = false
			stopSelf()
		}
		sum := pattern.Checksum(h.Payload)
		for range o.WorkPasses {
			workSink += pattern.Checksum(h.Payload) // a sink, so the work is not optimised away
		}
		bad := verify && h.Flags&ring.FlagIncomplete == 0 && !pattern.Verify(&h) // holes hold unspecified bytes
		if !c.Valid(h) {
			// Read, then checked: the slot was reused while the bytes were read, so they prove nothing.
			// The next call reports the overrun.
			res.OverrunHeaps++
			continue
		}
		res.Heaps++
		res.LastHeapCnt = h.HeapCnt
		res.HeapCntSum += h.HeapCnt
		cur.Heaps++
		cur.HeapCntSum += h.HeapCnt
		res.Bytes += h.Received
		res.Checksum += sum
		if h.Flags&ring.FlagIncomplete != 0 {
			res.Incomplete++
		}
		if bad {
			res.VerifyErrors++
		}
		if sleep > 0 {
			time.Sleep(sleep)
		}
		held[(first+nHeld)%len(held)] = h
		if nHeld++; nHeld > hold {
			c.Release(held[first])
			first, nHeld = (first+1)%len(held), nHeld-1
		}
	}
	res.CPUSeconds = (proccpu.Used() - cpu0).Seconds()
	if res.Result == "error" && res.exitCode == 0 {
		res.Result = "max"
	}
	if res.Heaps > 0 {
		res.Seconds = time.Since(start).Seconds()
	}
	res.Counters = c.Stats().Map()
	return res
}
