package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// RingResult is one ring benchmark run, or the medians of several (what `bench ring --json` prints).
type RingResult struct {
	Consumer        string  `json:"consumer"`
	HeapSize        int     `json:"heap_size"`
	Heaps           uint64  `json:"heaps"`
	Slots           int     `json:"slots"`
	HugePages       bool    `json:"hugepages"`
	Seconds         float64 `json:"seconds"`
	HeapsPerS       float64 `json:"heaps_per_s"`
	BytesPerS       float64 `json:"bytes_per_s"`
	MemcpyBytesPerS float64 `json:"memcpy_bytes_per_s"`
	MemcpyRatio     float64 `json:"memcpy_ratio"`
	HeapsLost       uint64  `json:"heaps_lost"`
	ChecksumOK      bool    `json:"checksum_ok"`
	IdleCPUPercent  float64 `json:"idle_cpu_percent"`
	Batch           int     `json:"batch,omitempty"`
	Runs            int     `json:"runs"`
	// PerConsumer: each consumer's own rate and CPU per heap (the table above is the ring's).
	PerConsumer []ConsumerRate `json:"per_consumer,omitempty"`
}

// ConsumerRate is one consumer's rate when several read one ring.
type ConsumerRate struct {
	Consumer  string  `json:"consumer"`
	HeapsPerS float64 `json:"heaps_per_s"`
	// CPUNsPerHeap is the consumer process's CPU time (user + system) over the stream, per heap: what
	// reading one heap costs it, whatever share of a core it got.
	CPUNsPerHeap float64 `json:"cpu_ns_per_heap"`
}

// RingOptions describe a ring benchmark: a Go producer publishing Heaps pattern heaps of HeapSize bytes
// into a block-policy ring that a consumer process reads.
type RingOptions struct {
	Consumer string        // go, c or python; several, comma-separated, read one ring at once
	HeapSize int           // payload bytes per heap
	Heaps    uint64        // per run; 0: about 4 GiB or 20 M heaps, whichever is fewer
	Slots    int           // 0: 4096 for small heaps, 256 for 64 KiB and more
	Batch    int           // python consumer: heaps per next_batch call (0: per-heap iteration)
	Idle     time.Duration // measure the waiting consumer's CPU for this long before the first run (0: skip)
	Repeat   int           // runs; the result is their medians (default 3)
}

func (o *RingOptions) setDefaults() error {
	if o.HeapSize < 1 {
		return fmt.Errorf("%w: heap size must be positive", ErrBadOption)
	}
	if o.Repeat == 0 {
		o.Repeat = 3
	}
	if o.Repeat < 1 {
		return fmt.Errorf("%w: repeat must be at least 1", ErrBadOption)
	}
	if o.Heaps == 0 {
		o.Heaps = min(20_000_000, uint64(4<<30)/uint64(o.HeapSize))
	}
	if o.Slots == 0 {
		o.Slots = 4096
		if o.HeapSize >= 64<<10 {
			o.Slots = 256
		}
	}
	return nil
}

// Ring runs the ring benchmark o.Repeat times, calling each (if set) after every run, and returns the
// medians. A cancelled ctx stops the run in progress; its ring is removed either way.
func Ring(ctx context.Context, env Env, o RingOptions, each func(run int, r RingResult)) (RingResult, error) {
	if err := o.setDefaults(); err != nil {
		return RingResult{}, err
	}
	var runs []RingResult
	for i := range o.Repeat {
		r, err := ringOnce(ctx, env, o, i == 0)
		if err != nil {
			return RingResult{}, err
		}
		runs = append(runs, r)
		if each != nil {
			each(i+1, r)
		}
	}
	return MedianRing(runs), nil
}

// PrintRing writes one result as a line of `bench ring`'s table.
func PrintRing(w io.Writer, label string, r RingResult) {
	fmt.Fprintf(w, "%-7s consumer %-6s heap %8d B  %10.0f heaps/s  %6.2f GB/s  memcpy %6.2f GB/s  ratio %4.2f  lost %d  checksum %s  idle CPU %.1f%%  hugepages %v\n",
		label, r.Consumer, r.HeapSize, r.HeapsPerS, r.BytesPerS/1e9, r.MemcpyBytesPerS/1e9,
		r.MemcpyRatio, r.HeapsLost, okWord(r.ChecksumOK), r.IdleCPUPercent, r.HugePages)
	for _, c := range r.PerConsumer {
		fmt.Fprintf(w, "          %-6s %10.0f heaps/s on its own clock, %6.1f ns of CPU per heap\n", c.Consumer, c.HeapsPerS, c.CPUNsPerHeap)
	}
}

// MedianRing takes each figure's median over the runs; losses and checksum failures of any run count.
func MedianRing(runs []RingResult) RingResult {
	m := runs[0]
	med := func(f func(r RingResult) float64) float64 { return medianOf(runs, f) }
	m.Runs = len(runs)
	m.HeapsPerS = med(func(r RingResult) float64 { return r.HeapsPerS })
	m.BytesPerS = med(func(r RingResult) float64 { return r.BytesPerS })
	m.MemcpyBytesPerS = med(func(r RingResult) float64 { return r.MemcpyBytesPerS })
	m.MemcpyRatio = med(func(r RingResult) float64 { return r.MemcpyRatio })
	m.Seconds = med(func(r RingResult) float64 { return r.Seconds })
	for i := range m.PerConsumer {
		m.PerConsumer[i].HeapsPerS = med(func(r RingResult) float64 { return r.PerConsumer[i].HeapsPerS })
		m.PerConsumer[i].CPUNsPerHeap = med(func(r RingResult) float64 { return r.PerConsumer[i].CPUNsPerHeap })
	}
	for _, r := range runs {
		m.HeapsLost = max(m.HeapsLost, r.HeapsLost)
		m.ChecksumOK = m.ChecksumOK && r.ChecksumOK
	}
	return m
}

// ringOnce runs one producer → consumer-process stream (several consumers with Consumer "c,go,python").
// The memcpy reference is measured right before and right after the stream and averaged, so a change in
// the machine's load hits both figures.
// producerBatch is how many heaps the benchmark's producer publishes with one head store, as recv does
// per receive batch (Producer.BeginBatch).
const producerBatch = 32

func ringOnce(ctx context.Context, env Env, o RingOptions, measureIdle bool) (RingResult, error) {
	res := RingResult{Consumer: o.Consumer, HeapSize: o.HeapSize, Heaps: o.Heaps, Slots: o.Slots, Batch: o.Batch}
	kinds := strings.Split(o.Consumer, ",")
	name := fmt.Sprintf("bench-%d", os.Getpid())
	defer ring.Remove("", name) // after p.Close (defers run last-in first-out)
	p, err := ring.Create(name, ring.Config{SlotCount: o.Slots, SlotSize: o.HeapSize, MaxItems: 4, Policy: ring.PolicyBlock,
		MaxConsumers: max(len(kinds), ring.DefaultMaxConsumer)})
	if err != nil {
		return res, err
	}
	defer p.Close()
	res.HugePages = p.Huge()
	procs := &consumerProcs{}
	defer procs.kill() // before the ring is closed
	if err := procs.start(env, kinds, name, o.Batch); err != nil {
		return res, err
	}
	cmds, outs := procs.cmds, procs.outs
	deadline := time.Now().Add(20 * time.Second)
	for p.Consumers() < len(kinds) {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%s consumers did not attach within 20 s", o.Consumer)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if measureIdle && o.Idle > 0 {
		time.Sleep(50 * time.Millisecond) // past the consumer's spin
		t0, err := cpuTime(cmds[0].Process.Pid)
		if err != nil {
			return res, err
		}
		time.Sleep(o.Idle)
		t1, _ := cpuTime(cmds[0].Process.Pid)
		res.IdleCPUPercent = 100 * (t1 - t0).Seconds() / o.Idle.Seconds()
	}
	workingSet := o.Slots * o.HeapSize
	before := memcpyRate(workingSet)
	// Collect the reference buffers now: a GC or scavenger running during the stream would take a
	// core from the producer or the consumer (there may be only two).
	debug.FreeOSMemory()

	pb := pattern.Publisher{P: p, Size: o.HeapSize}
	var sum uint64
	cpu0 := make([]time.Duration, len(cmds))
	for i, cmd := range cmds {
		cpu0[i], _ = cpuTime(cmd.Process.Pid)
	}
	start := time.Now()
	for cnt := uint64(1); cnt <= o.Heaps; cnt++ {
		if cnt%4096 == 0 && ctx.Err() != nil {
			return res, fmt.Errorf("bench ring: %w", ctx.Err())
		}
		if cnt%producerBatch == 1 {
			p.BeginBatch()
		}
		s, err := pb.Publish(cnt, 0)
		if err != nil {
			return res, fmt.Errorf("publish heap %d: %w", cnt, err)
		}
		sum += s
		if cnt%producerBatch == 0 {
			p.EndBatch()
		}
	}
	p.EndBatch()
	if err := p.PublishEndOfStream(0, time.Minute); err != nil {
		return res, err
	}
	// The run ends when every consumer has released everything (block policy: nothing is dropped).
	for p.Unread() != 0 && p.Consumers() > 0 {
		time.Sleep(20 * time.Microsecond)
	}
	res.Seconds = time.Since(start).Seconds()
	procs.reaped = true
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return res, fmt.Errorf("%s consumer: %w (output %s)", kinds[i], err, outs[i].String())
		}
	}
	res.MemcpyBytesPerS = (before + memcpyRate(workingSet)) / 2
	res.HeapsPerS = float64(o.Heaps) / res.Seconds
	res.BytesPerS = float64(o.Heaps) * float64(o.HeapSize) / res.Seconds
	res.MemcpyRatio = res.BytesPerS / res.MemcpyBytesPerS
	res.ChecksumOK = true
	for i, kind := range kinds {
		var cr ConsumeResult
		if err := json.Unmarshal(LastLine(outs[i].Bytes()), &cr); err != nil {
			return res, fmt.Errorf("%s consumer output %q: %w", kind, outs[i].String(), err)
		}
		res.HeapsLost = max(res.HeapsLost, o.Heaps-cr.Heaps)
		if cr.Checksum != sum || cr.Heaps != o.Heaps {
			res.ChecksumOK = false
			return res, fmt.Errorf("%s consumer checksum %#x over %d heaps, producer %#x over %d", kind, cr.Checksum, cr.Heaps, sum, o.Heaps)
		}
		// Each consumer's own rate: its heaps over its own time from first heap to end of stream.
		cpu := cmds[i].ProcessState.UserTime() + cmds[i].ProcessState.SystemTime() - cpu0[i]
		if cr.CPUSeconds > 0 {
			cpu = time.Duration(cr.CPUSeconds * 1e9) // its own account, without its exit
		}
		res.PerConsumer = append(res.PerConsumer, ConsumerRate{Consumer: kind, HeapsPerS: float64(cr.Heaps) / cr.Seconds,
			CPUNsPerHeap: float64(cpu.Nanoseconds()) / float64(cr.Heaps)})
	}
	return res, nil
}

func okWord(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISMATCH"
}

// medianOf is the median of f over the runs.
func medianOf[R any](runs []R, f func(R) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return median(v)
}

// consumerProcs are a benchmark's consumer processes and their output.
type consumerProcs struct {
	cmds   []*exec.Cmd
	outs   []bytes.Buffer
	reaped bool // set by the caller once it waits for them itself
}

// start starts one consumer process per kind on ring name (ConsumerCommand), stdout captured, stderr
// passed through. The caller defers kill first, so a failed start leaves nothing running.
func (c *consumerProcs) start(env Env, kinds []string, name string, batch int, extra ...string) error {
	c.cmds, c.outs = make([]*exec.Cmd, len(kinds)), make([]bytes.Buffer, len(kinds))
	for i, kind := range kinds {
		cmd, err := ConsumerCommand(env, kind, name, batch, extra...)
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = &c.outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s consumer: %w", kind, err)
		}
		c.cmds[i] = cmd
	}
	return nil
}

// kill ends and reaps the processes started, unless the caller has taken over (reaped).
func (c *consumerProcs) kill() {
	if c.reaped {
		return
	}
	for _, cmd := range c.cmds {
		if cmd != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
}

// median is the middle value (the upper one of an even count); it sorts v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
