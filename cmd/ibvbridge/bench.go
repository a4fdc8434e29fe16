package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/pattern"
)

func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError("usage: ibvbridge bench ring|udp|xdp [flags]")
	}
	switch args[0] {
	case "ring":
		return runBenchRing(args[1:], stdout, stderr)
	case "udp":
		return runBenchUDP(args[1:], stdout, stderr)
	case "xdp":
		return runBenchXDP(args[1:], stdout, stderr)
	}
	return usageError("unknown benchmark %q (want ring, udp or xdp)", args[0])
}

// ringBenchResult is what `bench ring --json` prints.
type ringBenchResult struct {
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
}

func runBenchRing(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench ring", stderr)
	o := ringBenchOptions{}
	fs.StringVar(&o.consumer, "consumer", "c", "consumer process: go, c or python")
	fs.IntVar(&o.heapSize, "heap-size", 64, "payload bytes per heap")
	fs.Uint64Var(&o.heaps, "heaps", 0, "heaps per run (default: about 4 GiB or 20 M heaps, whichever is fewer)")
	fs.IntVar(&o.slots, "slots", 0, "ring slots (default: 4096 for small heaps, 256 for large)")
	fs.IntVar(&o.batch, "batch", 0, "python consumer: heaps per next_batch call (0: per-heap iteration)")
	fs.DurationVar(&o.idle, "idle", time.Second, "measure the waiting consumer's CPU use for this long first (0: skip)")
	repeat := fs.Int("repeat", 3, "runs; the figures are the medians (timings on shared machines are noisy)")
	asJSON := fs.Bool("json", false, "print one JSON object (the medians)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.heapSize < 1 {
		return usageError("--heap-size must be positive")
	}
	if *repeat < 1 {
		return usageError("--repeat must be at least 1")
	}
	if o.heaps == 0 {
		o.heaps = min(20_000_000, uint64(4<<30)/uint64(o.heapSize))
	}
	if o.slots == 0 {
		o.slots = 4096
		if o.heapSize >= 64<<10 {
			o.slots = 256
		}
	}
	var runs []ringBenchResult
	for i := 0; i < *repeat; i++ {
		r, err := benchRingOnce(o, i == 0)
		if err != nil {
			return err
		}
		runs = append(runs, r)
		if !*asJSON {
			printRingBench(stdout, fmt.Sprintf("run %d", i+1), r)
		}
	}
	med := medianRingBench(runs)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(med)
	}
	printRingBench(stdout, "median", med)
	return nil
}

type ringBenchOptions struct {
	consumer string
	heapSize int
	heaps    uint64
	slots    int
	batch    int
	idle     time.Duration
}

func printRingBench(w io.Writer, label string, r ringBenchResult) {
	fmt.Fprintf(w, "%-7s consumer %-6s heap %8d B  %10.0f heaps/s  %6.2f GB/s  memcpy %6.2f GB/s  ratio %4.2f  lost %d  checksum %s  idle CPU %.1f%%  hugepages %v\n",
		label, r.Consumer, r.HeapSize, r.HeapsPerS, r.BytesPerS/1e9, r.MemcpyBytesPerS/1e9,
		r.MemcpyRatio, r.HeapsLost, okWord(r.ChecksumOK), r.IdleCPUPercent, r.HugePages)
}

// medianRingBench takes each figure's median over the runs.
func medianRingBench(runs []ringBenchResult) ringBenchResult {
	m := runs[0]
	med := func(f func(r ringBenchResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	m.Runs = len(runs)
	m.HeapsPerS = med(func(r ringBenchResult) float64 { return r.HeapsPerS })
	m.BytesPerS = med(func(r ringBenchResult) float64 { return r.BytesPerS })
	m.MemcpyBytesPerS = med(func(r ringBenchResult) float64 { return r.MemcpyBytesPerS })
	m.MemcpyRatio = med(func(r ringBenchResult) float64 { return r.MemcpyRatio })
	m.Seconds = med(func(r ringBenchResult) float64 { return r.Seconds })
	for _, r := range runs {
		m.HeapsLost = max(m.HeapsLost, r.HeapsLost)
		m.ChecksumOK = m.ChecksumOK && r.ChecksumOK
	}
	return m
}

// benchRingOnce runs one producer → consumer-process stream. The memcpy reference is measured right
// before and right after the stream and averaged, so a change in the machine's load hits both figures.
func benchRingOnce(o ringBenchOptions, measureIdle bool) (ringBenchResult, error) {
	res := ringBenchResult{Consumer: o.consumer, HeapSize: o.heapSize, Heaps: o.heaps, Slots: o.slots, Batch: o.batch}
	name := fmt.Sprintf("bench-%d", os.Getpid())
	defer ring.Remove("", "", name) // after p.Close (defers run last-in first-out)
	p, err := ring.Create(name, ring.Config{SlotCount: o.slots, SlotSize: o.heapSize, MaxItems: 4, Policy: ring.PolicyBlock})
	if err != nil {
		return res, err
	}
	defer p.Close()
	res.HugePages = p.Huge()
	cmd, err := consumerCommand(o.consumer, name, o.batch)
	if err != nil {
		return res, err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start %s consumer: %w", o.consumer, err)
	}
	defer cmd.Process.Kill()
	insp := func() ring.Info { i, _ := ring.Inspect(p.CtlPath(), ""); return i }
	deadline := time.Now().Add(20 * time.Second)
	for insp().ConsumerPID == 0 {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%s consumer did not attach within 20 s", o.consumer)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if measureIdle && o.idle > 0 {
		time.Sleep(50 * time.Millisecond) // past the consumer's spin
		t0, err := cpuTime(cmd.Process.Pid)
		if err != nil {
			return res, err
		}
		time.Sleep(o.idle)
		t1, _ := cpuTime(cmd.Process.Pid)
		res.IdleCPUPercent = 100 * (t1 - t0).Seconds() / o.idle.Seconds()
	}
	workingSet := o.slots * o.heapSize
	before := memcpyRate(workingSet)
	// Collect the reference buffers now: a GC or scavenger running during the stream would take a
	// core from the producer or the consumer (there may be only two).
	debug.FreeOSMemory()

	pb := pattern.Publisher{P: p, Size: o.heapSize}
	var sum uint64
	start := time.Now()
	for cnt := uint64(1); cnt <= o.heaps; cnt++ {
		s, err := pb.Publish(cnt, 0)
		if err != nil {
			return res, fmt.Errorf("publish heap %d: %w", cnt, err)
		}
		sum += s
	}
	if err := p.PublishEndOfStream(time.Minute); err != nil {
		return res, err
	}
	// The run ends when the consumer has released everything (block policy: nothing is dropped).
	for i := insp(); i.Tail != i.Head && cmdRunning(cmd); i = insp() {
		time.Sleep(20 * time.Microsecond)
	}
	res.Seconds = time.Since(start).Seconds()
	if err := cmd.Wait(); err != nil {
		return res, fmt.Errorf("%s consumer: %w (output %s)", o.consumer, err, out.String())
	}
	res.MemcpyBytesPerS = (before + memcpyRate(workingSet)) / 2
	var cr consumeResult
	if err := json.Unmarshal(lastLine(out.Bytes()), &cr); err != nil {
		return res, fmt.Errorf("%s consumer output %q: %w", o.consumer, out.String(), err)
	}
	res.HeapsPerS = float64(cr.Heaps) / res.Seconds
	res.BytesPerS = float64(cr.Bytes) / res.Seconds
	res.MemcpyRatio = res.BytesPerS / res.MemcpyBytesPerS
	res.HeapsLost = o.heaps - cr.Heaps
	res.ChecksumOK = cr.Checksum == sum && cr.Heaps == o.heaps
	if !res.ChecksumOK {
		return res, fmt.Errorf("consumer checksum %#x over %d heaps, producer %#x over %d", cr.Checksum, cr.Heaps, sum, o.heaps)
	}
	return res, nil
}

func okWord(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISMATCH"
}

func cmdRunning(cmd *exec.Cmd) bool {
	return cmd.ProcessState == nil && cmd.Process.Signal(syscallZero) == nil
}

func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

// memcpyRate measures single-core copy throughput over a working set as large as the ring's payload, so
// the comparison is against memory, not cache.
func memcpyRate(workingSet int) float64 {
	n := max(workingSet, 64<<20)
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	var copied int
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		copy(dst, src)
		copied += n
	}
	return float64(copied) / time.Since(start).Seconds()
}

// cpuTime reads a process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are fields 14 and 15.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	const clkTck = 100
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// consumerCommand builds the consumer process of a benchmark or test: the Go consumer is this binary's
// `consume`; the C and Python tools are found next to the source tree (or via IBVBRIDGE_C_CONSUME /
// IBVBRIDGE_PYTHON_CLIENT).
func consumerCommand(kind, ringName string, batch int) (*exec.Cmd, error) {
	args := []string{"--ring", ringName, "--timeout-ms", "60000"}
	switch kind {
	case "go":
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		return exec.Command(self, append([]string{"consume"}, args...)...), nil
	case "c":
		tool, err := findTool("IBVBRIDGE_C_CONSUME", "clients/c/build/ibvb-consume")
		if err != nil {
			return nil, err
		}
		return exec.Command(tool, args...), nil
	case "python":
		pkg, err := findTool("IBVBRIDGE_PYTHON_CLIENT", "clients/python")
		if err != nil {
			return nil, err
		}
		if batch > 0 {
			args = append(args, "--batch", strconv.Itoa(batch))
		}
		cmd := exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.consume"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg, "PYENV_VERSION=system")
		return cmd, nil
	}
	return nil, usageError("--consumer %q: want go, c or python", kind)
}

// findTool locates a path of the source tree: from an environment variable, the working directory, or
// upwards from the executable (bin/ibvbridge in the tree).
func findTool(env, rel string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, wd)
	}
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, filepath.Dir(exe))
	}
	for _, r := range roots {
		for d := r; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, rel)); err == nil {
				return filepath.Join(d, rel), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", fmt.Errorf("%s not found (build it with make, or set %s)", rel, env)
}
