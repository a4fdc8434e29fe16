package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
)

// consumeOptions are consume's flags.
type consumeOptions struct {
	name, dir, start, groupName                        string
	verify, wait, stopFirst, streams                   bool
	maxHeaps                                           uint64
	timeoutMs, hold, sleepUs, workPasses, maxLatencyUs int
}

func consumeFlags(fs *flag.FlagSet) *consumeOptions {
	o := &consumeOptions{}
	fs.StringVar(&o.name, "ring", "", "ring name or socket path (required)")
	fs.StringVar(&o.dir, "dir", "", "ring directory to look the name up in (default: the spec's: $IBVBRIDGE_RING_DIR, own, /run/ibvbridge)")
	fs.StringVar(&o.start, "start", "oldest", "oldest: the oldest heap the ring holds; head: only heaps published from now on")
	fs.BoolVar(&o.verify, "verify", false, "check every byte of complete heaps against the test pattern (send --pattern)")
	fs.Uint64Var(&o.maxHeaps, "max-heaps", 0, "stop after this many heaps (0: until end of stream)")
	fs.IntVar(&o.timeoutMs, "timeout-ms", 10000, "attach timeout and per-heap wait timeout")
	fs.IntVar(&o.hold, "hold", 0, "keep up to N heaps unreleased (a consumer that reads ahead)")
	fs.IntVar(&o.sleepUs, "sleep-us", 0, "sleep this long per heap (a slow consumer, for tests)")
	fs.BoolVar(&o.wait, "wait", false, "wait up to --timeout-ms for a ring that does not exist yet (default: fail at once)")
	fs.BoolVar(&o.stopFirst, "stop-first", false, "after taking the first heap, stop this process (SIGSTOP) before reading it, until SIGCONT (a consumer stalled mid-read, for tests)")
	fs.IntVar(&o.workPasses, "work-passes", 0, "checksum each heap this many more times: CPU-bound work per heap (benchmarks)")
	fs.StringVar(&o.groupName, "group-name", "", "attach as a member of this consumer group: the group's members share the stream, each heap read by one of them (starts at head)")
	fs.IntVar(&o.maxLatencyUs, "max-latency-us", 0, "let heaps of a moving stream wait up to this long for coalesced wakes (0: a wake per heap)")
	fs.BoolVar(&o.streams, "streams", false, "read on across stream ends (STREAM_END markers of recv --keep-going) until the ring ends, tallying each stream in \"streams\" (default: the first stream end ends the read)")
	return o
}

func (o *consumeOptions) validate() error {
	switch {
	case o.name == "":
		return usageError("--ring is required")
	case o.timeoutMs < 0:
		return usageError("--timeout-ms %d: want milliseconds >= 0", o.timeoutMs)
	case o.hold < 0:
		return usageError("--hold %d: want a number of heaps >= 0", o.hold)
	case o.sleepUs < 0:
		return usageError("--sleep-us %d: want microseconds >= 0", o.sleepUs)
	case o.workPasses < 0:
		return usageError("--work-passes %d: want a count >= 0", o.workPasses)
	case o.maxLatencyUs < 0:
		return usageError("--max-latency-us %d: want microseconds >= 0", o.maxLatencyUs)
	case o.start != "oldest" && o.start != "head":
		return usageError("--start %q: want oldest or head", o.start)
	}
	return nil
}

// parseConsume parses consume's command line (flags only) into validated options.
func parseConsume(fs *flag.FlagSet, o *consumeOptions, args []string) error {
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	return o.validate()
}

func runConsume(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr)
	o := consumeFlags(fs)
	if err := parseConsume(fs, o, args); err != nil {
		return err
	}
	res := bench.Consume(o.name, bench.ConsumeOptions{Verify: o.verify, MaxHeaps: o.maxHeaps,
		Timeout: time.Duration(o.timeoutMs) * time.Millisecond, Hold: o.hold, Sleep: time.Duration(o.sleepUs) * time.Microsecond,
		MaxLatency: time.Duration(o.maxLatencyUs) * time.Microsecond, Dir: o.dir, FromHead: o.start == "head",
		StopFirst: o.stopFirst, Wait: o.wait, Group: o.groupName, WorkPasses: o.workPasses, Streams: o.streams})
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return err
	}
	if code := res.ExitCode(); code != 0 {
		return &exitError{code: code, err: errors.New(res.Error)}
	}
	return nil
}
