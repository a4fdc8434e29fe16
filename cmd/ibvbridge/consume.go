package main

import (
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
)

func runConsume(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr)
	name := fs.String("ring", "", "ring name or socket path (required)")
	dir := fs.String("dir", "", "ring directory to look the name up in (default: the spec's: $IBVBRIDGE_RING_DIR, own, /run/ibvbridge)")
	start := fs.String("start", "oldest", "oldest: the oldest heap the ring holds; head: only heaps published from now on")
	verify := fs.Bool("verify", false, "check every byte of complete heaps against the test pattern (send --pattern)")
	maxHeaps := fs.Uint64("max-heaps", 0, "stop after this many heaps (0: until end of stream)")
	timeoutMs := fs.Int("timeout-ms", 10000, "attach timeout and per-heap wait timeout")
	hold := fs.Int("hold", 0, "keep up to N heaps unreleased (a consumer that reads ahead)")
	sleepUs := fs.Int("sleep-us", 0, "sleep this long per heap (a slow consumer, for tests)")
	wait := fs.Bool("wait", false, "wait up to --timeout-ms for a ring that does not exist yet (default: fail at once)")
	stopFirst := fs.Bool("stop-first", false, "after taking the first heap, stop this process (SIGSTOP) before reading it, until SIGCONT (a consumer stalled mid-read, for tests)")
	workPasses := fs.Int("work-passes", 0, "checksum each heap this many more times: CPU-bound work per heap (benchmarks)")
	groupName := fs.String("group-name", "", "attach as a member of this consumer group: the group's members share the stream, each heap read by one of them (starts at head)")
	maxLatencyUs := fs.Int("max-latency-us", 0, "let heaps of a moving stream wait up to this long for coalesced wakes (0: a wake per heap)")
	streams := fs.Bool("streams", false, "read on across stream ends (STREAM_END markers of recv --keep-going) until the ring ends, tallying each stream in \"streams\" (default: the first stream end ends the read)")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	switch {
	case *name == "":
		return usageError("--ring is required")
	case *timeoutMs < 0:
		return usageError("--timeout-ms %d: want milliseconds >= 0", *timeoutMs)
	case *hold < 0:
		return usageError("--hold %d: want a number of heaps >= 0", *hold)
	case *sleepUs < 0:
		return usageError("--sleep-us %d: want microseconds >= 0", *sleepUs)
	case *workPasses < 0:
		return usageError("--work-passes %d: want a count >= 0", *workPasses)
	case *maxLatencyUs < 0:
		return usageError("--max-latency-us %d: want microseconds >= 0", *maxLatencyUs)
	case *start != "oldest" && *start != "head":
		return usageError("--start %q: want oldest or head", *start)
	}
	res := bench.Consume(*name, bench.ConsumeOptions{Verify: *verify, MaxHeaps: *maxHeaps,
		Timeout: time.Duration(*timeoutMs) * time.Millisecond, Hold: *hold, Sleep: time.Duration(*sleepUs) * time.Microsecond,
		MaxLatency: time.Duration(*maxLatencyUs) * time.Microsecond, Dir: *dir, FromHead: *start == "head",
		StopFirst: *stopFirst, Wait: *wait, Group: *groupName, WorkPasses: *workPasses, Streams: *streams})
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return err
	}
	if code := res.ExitCode(); code != 0 {
		return &exitError{code: code, err: errors.New(res.Error)}
	}
	return nil
}
