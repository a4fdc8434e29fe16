package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/proccpu"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// GroupOptions describe the consumer-group benchmark (spec §13, §14): a Go producer in this process
// publishes Chunks complete chunks of ChunkHeaps heaps of HeapSize bytes into a block-policy chunk ring,
// read by one consumer process, then shared by a group of Members, alternating, Rounds times each. Each
// consumer does the same CPU-bound work per chunk: the Python tool's --work Work (power per channel in
// numpy, Work passes), the Go tool's --work-passes Work (checksums).
type GroupOptions struct {
	Consumer   string // python or go
	Members    int    // the group's size (the other run has one consumer)
	Chunks     uint64 // chunks per run
	ChunkHeaps int    // heap positions per chunk (time axis; no second axis)
	HeapSize   int    // bytes per heap position
	Work       int    // work per chunk, in passes (0: none, the tools' checksum alone; `bench group` defaults to 1)
	Slots      int    // ring slots
	Rounds     int    // runs of each; the figures are medians
}

func (o *GroupOptions) setDefaults() error {
	if o.Consumer == "" {
		o.Consumer = "python"
	}
	if o.Consumer != "python" && o.Consumer != "go" {
		return fmt.Errorf("%w: consumer %q: want python or go", ErrBadOption, o.Consumer)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Members, 4)
	def(&o.ChunkHeaps, 64)
	def(&o.HeapSize, 8192)
	def(&o.Slots, 32)
	def(&o.Rounds, 3)
	if o.Chunks == 0 {
		o.Chunks = 2000
	}
	switch {
	case o.Members < 2 || o.Members > 64:
		return fmt.Errorf("%w: members %d: want 2 to 64", ErrBadOption, o.Members)
	case o.ChunkHeaps < 1 || o.HeapSize < 8 || o.HeapSize%8 != 0:
		// Whole words per heap: the consumers' checksum (words per heap) is then the template's (words per chunk).
		return fmt.Errorf("%w: chunks of %d heaps of %d bytes: want at least one heap of a multiple of 8 bytes", ErrBadOption, o.ChunkHeaps, o.HeapSize)
	case o.Work < 0 || o.Slots < 2 || o.Rounds < 1:
		return fmt.Errorf("%w: work %d, slots %d, rounds %d: want work ≥ 0, slots ≥ 2, rounds ≥ 1", ErrBadOption, o.Work, o.Slots, o.Rounds)
	}
	return nil
}

// GroupRun is one run (or the medians of several): Members consumers reading the stream.
type GroupRun struct {
	Members    int     `json:"members"`
	Seconds    float64 `json:"seconds"` // from the first chunk published to the last released
	ChunksPerS float64 `json:"chunks_per_s"`
	// ProducerCPU and ConsumerCPU: CPU seconds (user + system) of the producer (this process) over the
	// run and of the consumers together, each from its attach to its end of stream.
	ProducerCPU float64 `json:"producer_cpu_s"`
	ConsumerCPU float64 `json:"consumer_cpu_s"`
	// ConsumerCPUPerChunk is ConsumerCPU over the chunks: what a chunk's work costs (1 vs Members shows
	// what sharing adds: wakes, passes over other members' positions, caches).
	ConsumerCPUPerChunk float64 `json:"consumer_cpu_per_chunk_s"`
	// IdleCPU is the CPU time the benchmark did not use: cores × Seconds − producer − consumers. Of it,
	// OthersCPU went to other processes (and the kernel's interrupts) and StealCPU to other VMs (both from
	// /proc/stat); the rest the machine left idle: our waits and imbalance.
	IdleCPU   float64 `json:"idle_cpu_s"`
	OthersCPU float64 `json:"others_cpu_s"`
	StealCPU  float64 `json:"steal_cpu_s"`
	// EndSpread is how long the last consumer went on after the first left (±1 ms): the imbalance at the
	// end of the stream, when fewer consumers than cores are left with work.
	EndSpread float64 `json:"end_spread_s"`
	// Shares: chunks each consumer read (the members' shares; every chunk exactly once is checked).
	Shares []uint64 `json:"shares"`
}

// GroupResult is what `bench group` reports: the medians of each side, their ratio, and the ceiling the
// machine allows: min(Members, cores) minus the cores the producer used in the group's runs.
type GroupResult struct {
	Options GroupOptions `json:"options"`
	Cores   int          `json:"cores"`
	One     GroupRun     `json:"one"`
	Group   GroupRun     `json:"group"`
	Ratio   float64      `json:"ratio"`   // Group.ChunksPerS / One.ChunksPerS
	Ceiling float64      `json:"ceiling"` // min(Members, Cores) − Group.ProducerCPU / Group.Seconds
	Ratios  []float64    `json:"round_ratios"`
	// QuietRatio is the median ratio of the rounds in which other processes took under 5 % of the
	// machine's CPU in both runs (QuietRounds of them; 0 when none): other load hits the group, which
	// needs every core, harder than the one consumer, which leaves a core spare.
	QuietRatio  float64 `json:"quiet_ratio"`
	QuietRounds int     `json:"quiet_rounds"`
}

// quiet reports a run in which other processes took under 5 % of the machine's CPU.
func (r GroupRun) quiet(cores int) bool {
	return r.OthersCPU+r.StealCPU < 0.05*float64(cores)*r.Seconds
}

// Group runs the group benchmark: rounds of one consumer then Members, each run checked (every chunk
// read exactly once, checksums adding up to the producer's), calling each (if set) after every run.
func Group(ctx context.Context, env Env, o GroupOptions, each func(round int, r GroupRun)) (GroupResult, error) {
	if err := o.setDefaults(); err != nil {
		return GroupResult{}, err
	}
	res := GroupResult{Options: o, Cores: runtime.NumCPU()}
	tmpl := groupTemplate(o)
	var ones, groups []GroupRun
	for round := 1; round <= o.Rounds; round++ {
		for _, n := range []int{1, o.Members} {
			r, err := groupOnce(ctx, env, o, n, tmpl)
			if err != nil {
				return res, err
			}
			if each != nil {
				each(round, r)
			}
			if n == 1 {
				ones = append(ones, r)
			} else {
				groups = append(groups, r)
			}
		}
		res.Ratios = append(res.Ratios, groups[round-1].ChunksPerS/ones[round-1].ChunksPerS)
	}
	var quiet []float64
	for i, x := range res.Ratios {
		if ones[i].quiet(res.Cores) && groups[i].quiet(res.Cores) {
			quiet = append(quiet, x)
		}
	}
	res.QuietRounds, res.QuietRatio = len(quiet), median(quiet)
	res.One, res.Group = medianGroup(ones), medianGroup(groups)
	res.Ratio = res.Group.ChunksPerS / res.One.ChunksPerS
	res.Ceiling = float64(min(o.Members, res.Cores)) - res.Group.ProducerCPU/res.Group.Seconds
	return res, nil
}

// groupTemplate is the bytes the producer copies into every chunk (as recv places received heaps):
// random int8 (re, im) samples, so the consumers' arithmetic has no shortcut.
func groupTemplate(o GroupOptions) []byte {
	b := make([]byte, o.ChunkHeaps*o.HeapSize)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// groupOnce is one run with n consumers (n > 1: a group "bench"): they attach before the clock starts
// (their start-up is not timed); the run ends when every chunk and the end-of-stream marker is released.
func groupOnce(ctx context.Context, env Env, o GroupOptions, n int, tmpl []byte) (GroupRun, error) {
	run := GroupRun{Members: n}
	name := fmt.Sprintf("bench-group-%d", os.Getpid())
	defer ring.Remove("", name) // after p.Close (defers run last-in first-out)
	p, err := ring.Create(name, ring.Config{SlotCount: o.Slots, Policy: ring.PolicyBlock, MaxConsumers: max(n, ring.DefaultMaxConsumer),
		Chunks: ring.ChunkGeometry{Heaps: uint32(o.ChunkHeaps), HeapSize: uint64(o.HeapSize), Step: 1, TimeItem: 0x1600}})
	if err != nil {
		return run, err
	}
	defer p.Close()
	extra := []string{"--work", strconv.Itoa(o.Work)}
	if o.Consumer == "go" {
		extra[0] = "--work-passes"
	}
	if n > 1 {
		extra = append(extra, "--group-name", "bench")
	}
	kinds := make([]string, n)
	for i := range kinds {
		kinds[i] = o.Consumer
	}
	procs := &consumerProcs{}
	defer procs.kill() // before the ring is closed
	if err := procs.start(env, kinds, name, 0, extra...); err != nil {
		return run, err
	}
	cmds, outs := procs.cmds, procs.outs
	if err := waitFor(30*time.Second, func() bool { return p.Consumers() == n }); err != nil {
		return run, fmt.Errorf("%d %s consumers attaching: %w", n, o.Consumer, err)
	}
	debug.FreeOSMemory() // no GC or scavenger inside the run
	g := p.Chunks()
	base := pattern.Checksum(tmpl) - binary.LittleEndian.Uint64(tmpl) // the consumers' checksum, id word aside
	var sum uint64
	sys0 := readSystemCPU()
	cpu0, start := proccpu.Used(), time.Now()
	for id := uint64(0); id < o.Chunks; id++ {
		if ctx.Err() != nil {
			return run, fmt.Errorf("bench group: %w", ctx.Err())
		}
		s, err := p.Acquire()
		if err != nil {
			return run, fmt.Errorf("acquire a slot for chunk %d: %w", id, err)
		}
		copy(s.Payload, tmpl)
		binary.LittleEndian.PutUint64(s.Payload, id) // each chunk's bytes differ: the checksums prove which were read
		for i := range g.Presence(s.Payload) {
			g.Presence(s.Payload)[i] = 1
		}
		sum += base + id
		if err := p.PublishChunk(s, ring.ChunkInfo{ID: id, Received: g.Bytes(), Packets: uint32(o.ChunkHeaps)}); err != nil {
			return run, fmt.Errorf("publish chunk %d: %w", id, err)
		}
	}
	if err := p.PublishEndOfStream(0, time.Minute); err != nil {
		return run, err
	}
	stop, firstDone := make(chan struct{}), make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				p.Interrupt()
				return
			case <-stop:
				return
			case now := <-tick.C:
				if len(firstDone) == 0 && p.Consumers() < n {
					firstDone <- now // the first consumer read the end of the stream and left
				}
			}
		}
	}()
	err = p.WaitDrained(nil)
	end := time.Now()
	close(stop)
	if len(firstDone) != 0 {
		run.EndSpread = end.Sub(<-firstDone).Seconds()
	}
	if err != nil && !errors.Is(err, ring.ErrNoConsumer) { // none left: each tool's count says whether it read all
		return run, fmt.Errorf("bench group: waiting for the consumers: %w", err)
	}
	run.Seconds = end.Sub(start).Seconds()
	run.ProducerCPU = (proccpu.Used() - cpu0).Seconds()
	sys1 := readSystemCPU()
	procs.reaped = true
	var read, ids, sums uint64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return run, fmt.Errorf("%s consumer: %w (output %s)", o.Consumer, err, outs[i].String())
		}
		var cr ConsumeResult
		if err := json.Unmarshal(LastLine(outs[i].Bytes()), &cr); err != nil {
			return run, fmt.Errorf("%s consumer output %q: %w", o.Consumer, outs[i].String(), err)
		}
		read, ids, sums = read+cr.Heaps, ids+cr.HeapCntSum, sums+cr.Checksum
		run.ConsumerCPU += cr.CPUSeconds
		run.Shares = append(run.Shares, cr.Heaps)
	}
	// Chunk ids 0 … Chunks−1, each exactly once: the count, the ids' sum and the bytes' checksums add up.
	if want := o.Chunks * (o.Chunks - 1) / 2; read != o.Chunks || ids != want || sums != sum {
		return run, fmt.Errorf("%d consumers read %d chunks (id sum %d, checksum %#x); want each of %d once (id sum %d, checksum %#x)",
			n, read, ids, sums, o.Chunks, want, sum)
	}
	run.ChunksPerS = float64(o.Chunks) / run.Seconds
	run.ConsumerCPUPerChunk = run.ConsumerCPU / float64(o.Chunks)
	run.IdleCPU = float64(runtime.NumCPU())*run.Seconds - run.ProducerCPU - run.ConsumerCPU
	run.StealCPU = sys1.steal - sys0.steal
	run.OthersCPU = max(0, (sys1.busy-sys0.busy)-run.ProducerCPU-run.ConsumerCPU)
	return run, nil
}

// medianGroup takes each figure's median over the runs (shares: the first run's).
func medianGroup(runs []GroupRun) GroupRun {
	m := runs[0]
	med := func(f func(r GroupRun) float64) float64 { return medianOf(runs, f) }
	m.Seconds = med(func(r GroupRun) float64 { return r.Seconds })
	m.ChunksPerS = med(func(r GroupRun) float64 { return r.ChunksPerS })
	m.ProducerCPU = med(func(r GroupRun) float64 { return r.ProducerCPU })
	m.ConsumerCPU = med(func(r GroupRun) float64 { return r.ConsumerCPU })
	m.ConsumerCPUPerChunk = med(func(r GroupRun) float64 { return r.ConsumerCPUPerChunk })
	m.IdleCPU = med(func(r GroupRun) float64 { return r.IdleCPU })
	m.OthersCPU = med(func(r GroupRun) float64 { return r.OthersCPU })
	m.StealCPU = med(func(r GroupRun) float64 { return r.StealCPU })
	m.EndSpread = med(func(r GroupRun) float64 { return r.EndSpread })
	return m
}

// PrintGroupRun writes one run as a line of `bench group`'s output.
func PrintGroupRun(w io.Writer, label string, r GroupRun) {
	fmt.Fprintf(w, "%-9s %2d consumer(s): %7.1f chunks/s  %5.2f s  producer CPU %4.2f s  consumers' %5.2f s (%.2f ms/chunk)  unused %4.2f s (others %4.2f, steal %4.2f)  end spread %3.0f ms  shares %v\n",
		label, r.Members, r.ChunksPerS, r.Seconds, r.ProducerCPU, r.ConsumerCPU, 1e3*r.ConsumerCPUPerChunk, r.IdleCPU, r.OthersCPU, r.StealCPU, 1e3*r.EndSpread, r.Shares)
}

// PrintGroup writes the medians, the ratio and the ceiling.
func PrintGroup(w io.Writer, r GroupResult) {
	PrintGroupRun(w, "median", r.One)
	PrintGroupRun(w, "median", r.Group)
	fmt.Fprintf(w, "group of %d / one: %.2f× (rounds %s); ceiling on %d cores: %.2f× (min(members, cores) − the producer's %.2f cores)\n",
		r.Options.Members, r.Ratio, fmtRatios(r.Ratios), r.Cores, r.Ceiling, r.Group.ProducerCPU/r.Group.Seconds)
	fmt.Fprintf(w, "rounds with the machine quiet (other processes under 5 %% of its CPU in both runs): %d of %d, median ratio %.2f×\n",
		r.QuietRounds, len(r.Ratios), r.QuietRatio)
}

func fmtRatios(v []float64) string {
	var b bytes.Buffer
	for i, x := range v {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%.2f", x)
	}
	return b.String()
}

// systemCPU is the machine's CPU time from /proc/stat's first line, in seconds: busy (user, nice, system,
// irq, softirq) and steal (taken by other VMs).
type systemCPU struct{ busy, steal float64 }

// readSystemCPU reads it; zero when /proc/stat is unreadable (the others and steal figures are then 0).
func readSystemCPU() systemCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return systemCPU{}
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return systemCPU{}
	}
	v := func(i int) float64 {
		n, _ := strconv.ParseUint(string(f[i]), 10, 64)
		return float64(n) / clkTck
	}
	return systemCPU{busy: v(1) + v(2) + v(3) + v(6) + v(7), steal: v(8)}
}
