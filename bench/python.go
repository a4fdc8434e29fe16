package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// pyLoop is the receiving loop both Python receivers run (bench/pyloop.py).
//
//go:embed pyloop.py
var pyLoop string

// spead2Place is spead2's chunk_place for chunk mode (bench/cplace/spead2_place.c), built with cc at run time.
//
//go:embed cplace/spead2_place.c
var spead2Place string

// PyShape is one stream of `bench python`: heaps of one size at a fixed rate, in packets of PacketSize.
// With ChunkHeaps, chunk mode: recv places the heaps by heap cnt into chunks of ChunkHeaps heaps (--chunk-heaps
// --chunk-by 0x1) read by the Python client's ring.chunks(), against spead2.recv.ChunkRingStream placing
// them alike with a compiled chunk_place.
type PyShape struct {
	HeapSize   int     `json:"heap_size"`
	PacketSize int     `json:"packet_size"`
	RateGbps   float64 `json:"rate_gbps"`
	Seconds    float64 `json:"seconds"`
	ChunkHeaps int     `json:"chunk_heaps,omitempty"` // heaps per chunk; 0: heap mode
	// Bursts: once the sender is late at all, heaps leave in batches of up to 64 packets, as a NIC's
	// interrupt moderation hands them over. The highest-rate search sends so: at hundreds of thousands
	// of heaps a second a send per heap on loopback costs the sender the receiving stack's work too, on
	// the receivers' cores. Without it each heap leaves alone until the sender is stampedBatch heaps late.
	Bursts bool `json:"bursts,omitempty"`
}

// DefaultPyShapes are the streams the comparison with spead2's Python receiver is made on: 1 MiB heaps
// at 6 Gb/s, 8 KiB heaps at 1 Gb/s (15 k heaps/s) and 1 KiB heaps at 0.2 Gb/s (24 k heaps/s), two
// seconds each, in jumbo packets (a heap of 8 KiB or less is one packet).
var DefaultPyShapes = []PyShape{
	{HeapSize: 1 << 20, PacketSize: 8972, RateGbps: 6, Seconds: 2},
	{HeapSize: 8 << 10, PacketSize: 8972, RateGbps: 1, Seconds: 2},
	{HeapSize: 1 << 10, PacketSize: 8972, RateGbps: 0.2, Seconds: 2},
}

// PyOptions describe `bench python`.
type PyOptions struct {
	Shapes   []PyShape
	Runs     int      // alternating runs per receiver and shape; figures are medians
	Peer     string   // "spead2": also spead2's Python receiver; "": recv and the Python client alone
	Spead2   string   // PYTHONPATH of spead2's Python package ("": the system's, else its usual build dir)
	Python   string   // the interpreter (default /usr/bin/python3)
	RecvArgs []string // more flags for recv (e.g. --coalesce 0), after the defaults
	Buffer   int      // every receiver's socket buffer (default 32 MiB)
	// Floor: also the floor receiver (Floor, `bench floor`) on the same traffic: what the kernel alone
	// costs a receiver that reads each datagram as it comes, with no consumer and no Python. No receiver
	// that hands each heap on as it arrives costs less; one that reads many heaps a wake (recv in chunk
	// mode) can.
	Floor bool
	// Variants are more ibvbridge rows, run alternating with the others on the same traffic: other recv
	// flags, another build (a baseline), or another Python client.
	Variants []PyVariant
}

// PyVariant is one more ibvbridge row of `bench python`.
type PyVariant struct {
	Label    string   `json:"label"`
	Binary   string   `json:"binary,omitempty"`    // "": env's
	RecvArgs []string `json:"recv_args,omitempty"` // instead of PyOptions.RecvArgs
	Client   string   `json:"client,omitempty"`    // the Python client's directory; "": this tree's
}

// PyRun is one run of one receiver on one shape.
type PyRun struct {
	Heaps      uint64  `json:"heaps"`             // stamped heaps the loop saw (chunk mode: heaps present in its chunks)
	Chunks     uint64  `json:"chunks,omitempty"`  // chunk mode: chunks the loop saw
	Sent       uint64  `json:"sent"`              // stamped heaps sent
	CPUSeconds float64 `json:"cpu_seconds"`       // every receiving process
	LoopCPU    float64 `json:"loop_cpu_seconds"`  // of which the Python process
	MedianUs   float64 `json:"latency_median_us"` // chunk mode: of each chunk, from its last heap's send time
	P99Us      float64 `json:"latency_p99_us"`
	SentGbps   float64 `json:"sent_gbps"`
	Lossless   bool    `json:"lossless"`
	Detail     string  `json:"detail,omitempty"`
}

// PyRow is one receiver on one shape: its runs and their medians, with the spread (min–max) of each.
type PyRow struct {
	Receiver    string     `json:"receiver"` // "ibvbridge", a variant's label, "floor" or "spead2"
	Runs        []PyRun    `json:"runs"`
	Sent        uint64     `json:"sent"`             // heaps sent, every run
	Heaps       uint64     `json:"heaps"`            // heaps the loop saw, every run
	Chunks      uint64     `json:"chunks,omitempty"` // chunk mode: chunks the loop saw, every run
	CPUPerHeap  float64    `json:"cpu_us_per_heap"`
	LoopPerHeap float64    `json:"loop_cpu_us_per_heap"`
	MedianUs    float64    `json:"latency_median_us"`
	P99Us       float64    `json:"latency_p99_us"`
	CPUSpread   [2]float64 `json:"cpu_us_per_heap_spread"`
	P99Spread   [2]float64 `json:"latency_p99_us_spread"`
	Lossless    bool       `json:"lossless"`
	Ratios      *PyRatios  `json:"ratios_to_spead2,omitempty"`
}

// PyRatios are a row's medians over spead2's.
type PyRatios struct {
	CPU    float64 `json:"cpu"`
	Median float64 `json:"latency_median"`
	P99    float64 `json:"latency_p99"`
}

// PyResult is one shape: each receiver's row and, with a peer, ibvbridge's ratios to it.
type PyResult struct {
	Shape       PyShape `json:"shape"`
	Rows        []PyRow `json:"rows"`
	CPURatio    float64 `json:"cpu_ratio,omitempty"`    // ibvbridge / spead2, CPU per heap of all receiving processes
	MedianRatio float64 `json:"median_ratio,omitempty"` // latency medians, ibvbridge / spead2
	P99Ratio    float64 `json:"p99_ratio,omitempty"`
}

// Spead2PythonPath finds spead2's Python package: dir if set, else the system's, else the directory a
// local build installs into ($HOME/.cache/spead2-*-py/site). "" with an error saying why when none works.
func Spead2PythonPath(python, dir string) (string, error) {
	try := func(path string) bool {
		cmd := exec.Command(python, "-c", "import spead2.recv")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+path)
		return cmd.Run() == nil
	}
	if dir != "" {
		if try(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("spead2's Python package does not import from %s", dir)
	}
	if try("") {
		return "", nil
	}
	home, _ := os.UserHomeDir()
	cands, _ := filepath.Glob(filepath.Join(home, ".cache", "spead2-*-py", "site"))
	slices.Sort(cands)
	for i := len(cands) - 1; i >= 0; i-- {
		if try(cands[i]) {
			return cands[i], nil
		}
	}
	return "", fmt.Errorf("spead2's Python package is not installed (%s cannot import spead2.recv; give --spead2-path DIR)", python)
}

// Python runs every shape through recv and the Python client's ItemGroup loop and, with Peer "spead2",
// through spead2's Python receiver with the same loop, alternating run by run on the same sender.
// progress, if set, gets each run.
func Python(ctx context.Context, env Env, o PyOptions, progress func(shape PyShape, receiver string, run int, r PyRun)) ([]PyResult, error) {
	if len(o.Shapes) == 0 {
		o.Shapes = DefaultPyShapes
	}
	b, err := newPyBench(env, o)
	if err != nil {
		return nil, err
	}
	defer b.close()
	var out []PyResult
	for _, sh := range b.o.Shapes {
		if sh.PacketSize <= 0 {
			sh.PacketSize = 8972
		}
		res := PyResult{Shape: sh}
		rows := make([]PyRow, len(b.receivers))
		for i, r := range b.receivers {
			rows[i].Receiver = r
		}
		for run := range b.o.Runs {
			for i := range b.receivers {
				// Alternate which receiver goes first, so neither always follows the other's exit.
				k := (i + run) % len(b.receivers)
				r, err := b.run(ctx, b.receivers[k], sh)
				if err != nil {
					return nil, err
				}
				if progress != nil {
					progress(sh, b.receivers[k], run+1, r)
				}
				rows[k].Runs = append(rows[k].Runs, r)
			}
		}
		for i := range rows {
			rows[i].summarise()
		}
		res.Rows = rows
		if last := rows[len(rows)-1]; last.Receiver == "spead2" && last.CPUPerHeap > 0 && last.MedianUs > 0 && last.P99Us > 0 {
			res.CPURatio = rows[0].CPUPerHeap / last.CPUPerHeap
			res.MedianRatio = rows[0].MedianUs / last.MedianUs
			res.P99Ratio = rows[0].P99Us / last.P99Us
			for i := range rows[:len(rows)-1] {
				rows[i].Ratios = &PyRatios{CPU: rows[i].CPUPerHeap / last.CPUPerHeap, Median: rows[i].MedianUs / last.MedianUs,
					P99: rows[i].P99Us / last.P99Us}
			}
		}
		out = append(out, res)
	}
	return out, nil
}

// pyBench is what every run of `bench python` shares: its options with their defaults, the receivers in
// the order they alternate (ibvbridge, the variants, the floor, spead2 last), the loop script and, once a chunk-mode
// shape needs it, spead2's compiled chunk_place.
type pyBench struct {
	env        Env
	o          PyOptions
	receivers  []string
	variants   map[string]PyVariant
	spead2Path string
	dir        string // the script's (and chunk_place's) temporary directory
	script     string
	place      string // spead2's chunk_place, built once the first chunk-mode shape needs it
}

func newPyBench(env Env, o PyOptions) (*pyBench, error) {
	if o.Python == "" {
		o.Python = "/usr/bin/python3"
	}
	if o.Runs < 1 {
		o.Runs = 5
	}
	if o.Buffer <= 0 {
		o.Buffer = 32 << 20
	}
	b := &pyBench{env: env, o: o, receivers: []string{"ibvbridge"},
		variants: map[string]PyVariant{"ibvbridge": {Label: "ibvbridge", RecvArgs: o.RecvArgs}}}
	for _, v := range o.Variants {
		if _, dup := b.variants[v.Label]; dup || v.Label == "spead2" || v.Label == "floor" || v.Label == "" {
			return nil, fmt.Errorf("%w: variant label %q: want a new name", ErrBadOption, v.Label)
		}
		b.variants[v.Label] = v
		b.receivers = append(b.receivers, v.Label)
	}
	if o.Floor {
		b.receivers = append(b.receivers, "floor")
	}
	if o.Peer != "" {
		if o.Peer != "spead2" {
			return nil, fmt.Errorf("%w: --peer %q: want spead2", ErrBadOption, o.Peer)
		}
		p, err := Spead2PythonPath(o.Python, o.Spead2)
		if err != nil {
			return nil, err
		}
		b.spead2Path = p
		b.receivers = append(b.receivers, "spead2")
	}
	dir, err := os.MkdirTemp("", "ibvbridge-pyloop-")
	if err != nil {
		return nil, err
	}
	b.dir, b.script = dir, filepath.Join(dir, "pyloop.py")
	if err := os.WriteFile(b.script, []byte(pyLoop), 0o600); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *pyBench) close() { os.RemoveAll(b.dir) }

// run is one run of receiver (ibvbridge, a variant or spead2) on sh.
func (b *pyBench) run(ctx context.Context, receiver string, sh PyShape) (PyRun, error) {
	if sh.ChunkHeaps > 0 && sh.HeapSize < 8 {
		return PyRun{}, fmt.Errorf("%w: chunk mode: heaps of %d bytes: want at least 8 (a heap carries its send time)", ErrBadOption, sh.HeapSize)
	}
	var r PyRun
	var err error
	switch receiver {
	case "floor":
		r, err = pyFloorRun(ctx, b.env, b.o, sh)
	case "spead2":
		if sh.ChunkHeaps > 0 && b.place == "" {
			if b.place, err = buildSpead2Place(b.dir); err != nil {
				return r, err
			}
		}
		r, err = pySpead2Run(ctx, b.env, b.o, sh, b.script, b.spead2Path, b.place)
	default:
		r, err = pyIbvbridgeRun(ctx, b.env, b.o, b.variants[receiver], sh, b.script)
	}
	if err != nil {
		return r, fmt.Errorf("%s, %s heaps: %w", receiver, sizeName(sh.HeapSize), err)
	}
	return r, nil
}

func (r *PyRow) summarise() {
	var cpu, loop, med, p99 []float64
	r.Lossless = len(r.Runs) > 0
	for _, x := range r.Runs {
		r.Sent, r.Heaps, r.Chunks = r.Sent+x.Sent, r.Heaps+x.Heaps, r.Chunks+x.Chunks
		n := float64(max(x.Heaps, 1))
		cpu, loop = append(cpu, x.CPUSeconds/n*1e6), append(loop, x.LoopCPU/n*1e6)
		med, p99 = append(med, x.MedianUs), append(p99, x.P99Us)
		r.Lossless = r.Lossless && x.Lossless
	}
	r.CPUPerHeap, r.LoopPerHeap, r.MedianUs, r.P99Us = median(cpu), median(loop), median(med), median(p99)
	r.CPUSpread = [2]float64{slices.Min(cpu), slices.Max(cpu)}
	r.P99Spread = [2]float64{slices.Min(p99), slices.Max(p99)}
}

// pyLoopResult is the JSON line pyloop.py prints.
type pyLoopResult struct {
	Heaps      uint64  `json:"heaps"`
	Stamped    uint64  `json:"stamped"`
	Chunks     uint64  `json:"chunks"`
	CPUSeconds float64 `json:"cpu_seconds"`
	MedianUs   float64 `json:"latency_median_us"`
	P99Us      float64 `json:"latency_p99_us"`
	Incomplete uint64  `json:"incomplete"`
	TooOld     uint64  `json:"too_old_heaps"`  // spead2's chunk stream
	Rejected   uint64  `json:"rejected_heaps"` // spead2's chunk stream: the stream-stop heap, which its place rejects
	// Interrupted: the loop's stream never ended (its stream stop was lost with other heaps), so the harness
	// stopped it.
	Interrupted bool `json:"interrupted"`
}

// pyMode is pyloop.py's mode for a shape.
func pyMode(sh PyShape) string {
	if sh.ChunkHeaps > 0 {
		return "chunks"
	}
	return "heaps"
}

// pyChunks is the chunks a chunk-mode shape's sender fills: every one whole (0 in heap mode).
func pyChunks(sh PyShape, sent uint64) uint64 {
	if sh.ChunkHeaps <= 0 {
		return 0
	}
	return sent / uint64(sh.ChunkHeaps)
}

// Spead2PlaceCompiler is the C compiler that builds spead2's chunk_place for chunk mode, or an error saying
// there is none.
func Spead2PlaceCompiler() (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("spead2's chunk stream needs a compiled chunk_place and there is no C compiler (apt-get install gcc): %w", err)
	}
	return cc, nil
}

// buildSpead2Place builds spead2's chunk_place (bench/cplace/spead2_place.c) with cc into dir and returns its path.
func buildSpead2Place(dir string) (string, error) {
	cc, err := Spead2PlaceCompiler()
	if err != nil {
		return "", err
	}
	src, so := filepath.Join(dir, "spead2_place.c"), filepath.Join(dir, "spead2_place.so")
	if err := os.WriteFile(src, []byte(spead2Place), 0o600); err != nil {
		return "", err
	}
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building spead2's chunk_place: %w: %s", err, b)
	}
	return so, nil
}

// pyIbvbridgeRun is one run of recv (its defaults but a ring whose slots hold the heap, the block policy
// as spead2's ring has, o.RecvArgs) and the Python client's ItemGroup loop; in chunk mode a ring of chunks
// placed by heap cnt, read with ring.chunks().
func pyIbvbridgeRun(ctx context.Context, env Env, o PyOptions, v PyVariant, sh PyShape, script string) (PyRun, error) {
	var run PyRun
	self, err := env.binary()
	if err != nil {
		return run, err
	}
	if v.Binary != "" {
		self = v.Binary
	}
	port, endpoint, err := loopbackEndpoint()
	if err != nil {
		return run, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("benchpy-%d-%d", os.Getpid(), port)
	defer ring.Remove("", name)
	args := []string{"recv", "--ring", name, "--slot-size", strconv.Itoa(max(64<<10, sh.HeapSize+4096))}
	if sh.ChunkHeaps > 0 {
		args = []string{"recv", "--ring", name, "--chunk-heaps", strconv.Itoa(sh.ChunkHeaps), "--chunk-by", "0x1",
			"--chunk-heap-size", strconv.Itoa(sh.HeapSize)}
	}
	args = append(append(args, "--buffer", strconv.Itoa(o.Buffer), "--log-format", "json"), DefaultPeerRecvArgs...)
	recv := exec.CommandContext(ctx, self, append(append(args, v.RecvArgs...), endpoint)...)
	var recvOut bytes.Buffer
	var recvErr LockedBuffer
	rp, err := startReady(recv, &recvOut, &recvErr, 10*time.Second, recvReceiving(&recvErr))
	if err != nil {
		return run, fmt.Errorf("ring %s: %w", name, err)
	}
	defer rp.kill()
	pkg := v.Client
	if pkg == "" {
		if pkg, err = FindTool("IBVBRIDGE_PYTHON_CLIENT", "clients/python"); err != nil {
			return run, err
		}
	}
	loop, err := startPyLoop(ctx, o, pkg, func() bool { return consumerAttached(name) }, script, "ibvbridge", pyMode(sh), name)
	if err != nil {
		return run, err
	}
	defer loop.r.kill()
	waitSettled(10*time.Second, recv.Process.Pid, loop.cmd.Process.Pid)
	recv0, _ := cpuTime(recv.Process.Pid)
	loop0, _ := cpuTime(loop.cmd.Process.Pid)
	st, err := sendStamped(ctx, endpoint, sh)
	if err != nil {
		return run, err
	}
	sent := st.Heaps
	run.Sent, run.SentGbps = sent, st.Gbps
	if err := rp.finish(5 * time.Second); err != nil {
		return run, fmt.Errorf("recv: %w: %s", err, recvErr.String())
	}
	lr, loopCPU, err := loop.result(loop0)
	if err != nil {
		return run, err
	}
	rc, _ := parseRecvReport(recvOut.Bytes()) // without one, every counter reads 0 and the CPU is to its exit
	recvCPU := rc.cpuSince(recv0, recv.ProcessState.UserTime()+recv.ProcessState.SystemTime())
	num := rc.count
	run.Heaps, run.MedianUs, run.P99Us = lr.Stamped, lr.MedianUs, lr.P99Us
	run.LoopCPU = loopCPU.Seconds()
	run.CPUSeconds = (recvCPU + loopCPU).Seconds()
	kernelDrops := rc.transport("kernel_drops") // datagrams the socket dropped before recv read them
	run.Lossless = lr.Stamped == sent && num("dropped_heaps") == 0 && num("incomplete_heaps") == 0 && kernelDrops == 0
	run.Detail = fmt.Sprintf("stamped heaps %d of %d, recv dropped %d, incomplete %d, kernel dropped %d datagrams",
		lr.Stamped, sent, num("dropped_heaps"), num("incomplete_heaps"), kernelDrops)
	if sh.ChunkHeaps > 0 {
		run.Heaps, run.Chunks = lr.Heaps, lr.Chunks
		lost := num("dropped_heaps") + num("incomplete_heaps") + num("incomplete_chunks") + num("too_old_heaps") + num("rejected_heaps") + kernelDrops
		run.Lossless = lr.Heaps == sent && lr.Chunks == pyChunks(sh, sent) && lost == 0
		run.Detail = fmt.Sprintf("heaps %d of %d in %d chunks of %d, recv dropped %d, incomplete %d, incomplete chunks %d, "+
			"too old %d, rejected %d, kernel dropped %d datagrams", lr.Heaps, sent, lr.Chunks, pyChunks(sh, sent), num("dropped_heaps"),
			num("incomplete_heaps"), num("incomplete_chunks"), num("too_old_heaps"), num("rejected_heaps"), kernelDrops)
	}
	run.noteInterrupted(lr)
	return run, nil
}

// pySpead2Run is one run of spead2's Python receiver (spead2.recv.Stream with a memory pool and a ring
// of RingHeaps heaps, its other settings default) with the same loop; in chunk mode
// spead2.recv.ChunkRingStream with place, the compiled chunk_place, and a ring of RingHeaps chunks.
func pySpead2Run(ctx context.Context, env Env, o PyOptions, sh PyShape, script, path, place string) (PyRun, error) {
	var run PyRun
	port, endpoint, err := loopbackEndpoint()
	if err != nil {
		return run, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var loop *pyLoopProc
	args := []string{"spead2", "heaps", strconv.Itoa(port), strconv.Itoa(o.Buffer), strconv.Itoa(pySpead2RingHeaps),
		strconv.Itoa(sh.HeapSize + 4096)}
	if sh.ChunkHeaps > 0 {
		args = []string{"spead2", "chunks", strconv.Itoa(port), strconv.Itoa(o.Buffer), strconv.Itoa(pySpead2RingHeaps),
			strconv.Itoa(sh.ChunkHeaps), strconv.Itoa(sh.HeapSize), place}
	}
	loop, err = startPyLoop(ctx, o, path, nil, script, args...)
	if err != nil {
		return run, err
	}
	defer loop.r.kill()
	waitSettled(10*time.Second, loop.cmd.Process.Pid)
	cpu0, _ := cpuTime(loop.cmd.Process.Pid)
	st, err := sendStamped(ctx, endpoint, sh)
	if err != nil {
		return run, err
	}
	sent := st.Heaps
	run.Sent, run.SentGbps = sent, st.Gbps
	lr, cpu, err := loop.result(cpu0)
	if err != nil {
		return run, err
	}
	run.Heaps, run.MedianUs, run.P99Us = lr.Stamped, lr.MedianUs, lr.P99Us
	run.CPUSeconds, run.LoopCPU = cpu.Seconds(), cpu.Seconds()
	run.Lossless = lr.Stamped == sent && lr.Incomplete == 0
	run.Detail = fmt.Sprintf("stamped heaps %d of %d, incomplete %d", lr.Stamped, sent, lr.Incomplete)
	if sh.ChunkHeaps > 0 {
		run.Heaps, run.Chunks = lr.Heaps, lr.Chunks
		run.Lossless = lr.Heaps == sent && lr.Chunks == pyChunks(sh, sent) && lr.Incomplete == 0 && lr.TooOld == 0
		run.Detail = fmt.Sprintf("heaps %d of %d in %d chunks of %d, incomplete %d, too old %d, rejected %d (the stream stop)",
			lr.Heaps, sent, lr.Chunks, pyChunks(sh, sent), lr.Incomplete, lr.TooOld, lr.Rejected)
	}
	run.noteInterrupted(lr)
	return run, nil
}

// pyFloorRun is one run of the floor receiver (`bench floor`) on sh's traffic: its CPU per stamped heap,
// lossless when it counted every byte sent. It decodes nothing, so it has no latency.
func pyFloorRun(ctx context.Context, env Env, o PyOptions, sh PyShape) (PyRun, error) {
	var run PyRun
	self, err := env.binary()
	if err != nil {
		return run, err
	}
	port, endpoint, err := loopbackEndpoint()
	if err != nil {
		return run, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "bench", "floor", "--buffer", strconv.Itoa(o.Buffer), endpoint)
	var out bytes.Buffer
	var errOut LockedBuffer
	rp, err := startReady(cmd, &out, &errOut, 10*time.Second, func() bool { return udpPortBound(port) })
	if err != nil {
		return run, fmt.Errorf("binding %s: %w", endpoint, err)
	}
	defer rp.kill()
	waitSettled(10*time.Second, cmd.Process.Pid)
	cpu0, _ := cpuTime(cmd.Process.Pid)
	st, err := sendStamped(ctx, endpoint, sh)
	if err != nil {
		return run, err
	}
	if err := rp.finish(5 * time.Second); err != nil {
		return run, fmt.Errorf("the floor: %w: %s", err, errOut.String())
	}
	if run.Lossless, run.Detail, err = floorCounted(out.Bytes(), st.Bytes); err != nil {
		return run, err
	}
	ps := cmd.ProcessState
	run.Sent, run.SentGbps, run.Heaps = st.Heaps, st.Gbps, st.Heaps
	run.CPUSeconds = (ps.UserTime() + ps.SystemTime() - cpu0).Seconds()
	return run, nil
}

// noteInterrupted makes a run whose loop never saw its stream end lossy, and says why.
func (r *PyRun) noteInterrupted(lr pyLoopResult) {
	if lr.Interrupted {
		r.Lossless = false
		r.Detail += "; the stream stop never reached the loop, which was stopped"
	}
}

// loopbackEndpoint is a free UDP port on 127.0.0.1 and its HOST:PORT.
func loopbackEndpoint() (int, string, error) {
	port, err := testnet.FreeUDPPort()
	if err != nil {
		return 0, "", err
	}
	return port, "127.0.0.1:" + strconv.Itoa(port), nil
}

// pyLoopProc is a running pyloop.py.
type pyLoopProc struct {
	cmd *exec.Cmd
	r   *receiver
	out bytes.Buffer
	err LockedBuffer
}

// startPyLoop starts pyloop.py with args, the Python package at path on PYTHONPATH, and waits until it
// is ready: attached (ready, for a ring) or, when ready is nil, until it says so (spead2's stream bound).
func startPyLoop(ctx context.Context, o PyOptions, path string, ready func() bool, script string, args ...string) (*pyLoopProc, error) {
	p := &pyLoopProc{cmd: exec.CommandContext(ctx, o.Python, append([]string{script}, args...)...)}
	p.cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "PYENV_VERSION=system")
	if ready == nil {
		ready = func() bool { return strings.Contains(p.err.String(), "ready") }
	}
	r, err := startReady(p.cmd, &p.out, &p.err, 20*time.Second, ready)
	if err != nil {
		return nil, fmt.Errorf("the Python loop (%s): %w", args[0], err)
	}
	p.r = r
	return p, nil
}

// result waits for the loop's end (its stream's; a loop whose stream stop was lost is stopped after 5 s,
// and says so) and reads its JSON line; cpu is its CPU since cpu0, to the end of its loop (not the
// interpreter's exit).
func (p *pyLoopProc) result(cpu0 time.Duration) (lr pyLoopResult, cpu time.Duration, err error) {
	if err := p.r.finish(5 * time.Second); err != nil {
		return lr, 0, fmt.Errorf("the Python loop: %w: %s", err, p.err.String())
	}
	if err := json.Unmarshal(LastLine(p.out.Bytes()), &lr); err != nil {
		return lr, 0, fmt.Errorf("the Python loop's output %q: %w: %s", p.out.String(), err, p.err.String())
	}
	st := p.cmd.ProcessState
	cpu = min(st.UserTime()+st.SystemTime()-cpu0, time.Duration(lr.CPUSeconds*1e9)+10*time.Millisecond)
	return lr, cpu, nil
}

// pySpead2RingHeaps is the ring of spead2's receiver: room for as many heaps as keep its reader from
// waiting on a briefly descheduled Python loop, as recv's ring of 128 slots does.
const pySpead2RingHeaps = 128

// Items of the stamped stream: the send time, and the data.
const (
	pyStampID = 0x1800
	pyDataID  = 0x1801
)

// stampedBatch is how many heaps' time sendStamped may fall behind and still send each heap alone: a
// batch's worth (the heap sender's 64 packets, 64 one-packet heaps).
const stampedBatch = 64

// leavesAlone tells sendStamped whether a heap it queued late by late (negative: early) leaves at once,
// alone, or waits in the batch. Late by less than stampedBatch heaps' time (a sleep that ended late, a
// short preemption) it leaves alone: the sender catches up one heap at a time. Later than that it cannot
// catch up so. In bursts, any lateness batches.
func leavesAlone(late, period time.Duration, bursts bool) bool {
	if bursts {
		return late <= 0
	}
	return late < stampedBatch*period
}

// stampedSend is what sendStamped sent: the stamped heaps, their rate in Gb/s and every UDP payload byte
// (the descriptor heap and the stream stop too).
type stampedSend struct {
	Heaps uint64
	Gbps  float64
	Bytes uint64
}

// sendStamped sends sh's heaps to endpoint: a descriptor heap, then heaps each carrying its send time
// (CLOCK_REALTIME ns modulo 2^48, an immediate taken just before its packets leave, and again in the
// data's first 8 bytes, little-endian) and sh.HeapSize bytes of data, paced to sh.RateGbps heap by heap,
// then the stream stop. While the sender keeps its schedule, or is late by less than stampedBatch heaps'
// time (sh.Bursts: not late at all), each heap leaves alone; once it falls further behind heaps leave in
// batches of 64 packets, one sendmmsg each, stamped as they are queued, until it is back within that: as
// a NIC's interrupt moderation hands them over. It returns the stamped heaps sent, the rate achieved and
// every UDP payload byte sent.
// In chunk mode there is no descriptor heap (chunks hold payloads only), heap cnts start at 0 (the first
// chunk's first position) and the heaps fill whole chunks.
func sendStamped(ctx context.Context, endpoint string, sh PyShape) (stampedSend, error) {
	var none stampedSend
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dest, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return none, err
	}
	f := spead.Flavour64_48
	enc, err := spead.NewEncoder(f, sh.PacketSize)
	if err != nil {
		return none, err
	}
	hs, err := udp.OpenHeapSender(udp.HeapSenderConfig{SenderConfig: udp.SenderConfig{Dest: dest, BufferSize: 32 << 20},
		Encoder: enc, GSO: true})
	if err != nil {
		return none, err
	}
	defer hs.Close()
	desc, err := spead.DescriptorHeap(1, f,
		spead.Descriptor{ID: pyStampID, Name: "send_ns", Description: "send time, ns mod 2^48",
			Format: []spead.FormatField{{Code: 'u', Bits: 48}}, Flavour: f},
		spead.Descriptor{ID: pyDataID, Name: "data", Description: "payload", Flavour: f,
			DType: fmt.Sprintf("{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }", sh.HeapSize)})
	if err != nil {
		return none, err
	}
	send := func(h *spead.Heap) error {
		if err := hs.SendHeap(ctx, h); err != nil {
			return err
		}
		return hs.Flush(ctx)
	}
	heaps := uint64(sh.RateGbps * 1e9 / 8 * sh.Seconds / float64(sh.HeapSize))
	first := uint64(2) // cnt 1 is the descriptors'
	if sh.ChunkHeaps > 0 {
		first, heaps = 0, heaps/uint64(sh.ChunkHeaps)*uint64(sh.ChunkHeaps)
		if heaps == 0 {
			return none, fmt.Errorf("%w: %g s at %g Gb/s is not one chunk of %d heaps", ErrBadOption, sh.Seconds, sh.RateGbps, sh.ChunkHeaps)
		}
	} else {
		if err := send(&desc); err != nil {
			return none, err
		}
		time.Sleep(20 * time.Millisecond) // the descriptors reach both receivers before the first data heap
	}
	period := time.Duration(float64(sh.HeapSize) * 8 / (sh.RateGbps * 1e9) * float64(time.Second))
	data := make([]byte, sh.HeapSize)
	h := spead.Heap{Items: []spead.Item{{ID: pyStampID, Immediate: true}, {ID: pyDataID, Data: data}}}
	// The sleeps keep the schedule only if they end when asked: Linux adds a thread's timer slack (50 µs
	// by default) to each, a heap's time at tens of thousands of heaps a second.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0)
	start := time.Now()
	for k := range heaps {
		late := -time.Until(start.Add(time.Duration(k) * period))
		if late < 0 {
			if err := hs.Flush(ctx); err != nil { // what a batch left queued goes before the sleep
				return none, err
			}
			ts := unix.NsecToTimespec(-late.Nanoseconds())
			_ = unix.Nanosleep(&ts, nil)
		}
		h.Cnt = k + first
		h.Items[0].Value = uint64(time.Now().UnixNano()) & (1<<48 - 1)
		if len(data) >= 8 {
			binary.LittleEndian.PutUint64(data, h.Items[0].Value)
		}
		if err := hs.SendHeap(ctx, &h); err != nil { // a full batch leaves here
			return none, err
		}
		if leavesAlone(late, period, sh.Bursts) {
			if err := hs.Flush(ctx); err != nil {
				return none, err
			}
		}
	}
	if err := hs.Flush(ctx); err != nil {
		return none, err
	}
	secs := time.Since(start).Seconds()
	time.Sleep(20 * time.Millisecond)
	stop := spead.StreamStopHeap(heaps + first)
	if err := send(&stop); err != nil {
		return none, err
	}
	return stampedSend{Heaps: heaps, Gbps: float64(heaps) * float64(sh.HeapSize) * 8 / secs / 1e9, Bytes: hs.Totals().Bytes}, nil
}

// PrintPython writes `bench python`'s table: per shape and receiver the medians of CPU per heap (every
// receiving process, and the Python loop's share), latency median and p99, with their spreads, whether
// every run was lossless (in chunk mode with the heaps and chunks received), and ibvbridge's ratios to spead2.
func PrintPython(w io.Writer, results []PyResult, runs int) {
	for _, res := range results {
		sh := res.Shape
		chunks := ""
		if sh.ChunkHeaps > 0 {
			chunks = fmt.Sprintf(" in chunks of %d", sh.ChunkHeaps)
		}
		fmt.Fprintf(w, "%s heaps at %g Gb/s%s, %d runs each, medians:\n", sizeName(sh.HeapSize), sh.RateGbps, chunks, runs)
		for _, r := range res.Rows {
			if r.Receiver == "floor" {
				fmt.Fprintf(w, "  %-9s CPU %7.2f µs/heap (%.2f–%.2f; the kernel's share alone, no decoding)  %s\n",
					r.Receiver, r.CPUPerHeap, r.CPUSpread[0], r.CPUSpread[1], losslessWord(r.Lossless))
				continue
			}
			fmt.Fprintf(w, "  %-9s CPU %7.2f µs/heap (%.2f–%.2f; Python loop %.2f)  latency median %7.0f µs  p99 %7.0f µs (%.0f–%.0f)  %s",
				r.Receiver, r.CPUPerHeap, r.CPUSpread[0], r.CPUSpread[1], r.LoopPerHeap, r.MedianUs, r.P99Us,
				r.P99Spread[0], r.P99Spread[1], losslessWord(r.Lossless))
			if sh.ChunkHeaps > 0 {
				fmt.Fprintf(w, " (heaps %d of %d in %d chunks)", r.Heaps, r.Sent, r.Chunks)
			}
			fmt.Fprintln(w)
		}
		for _, r := range res.Rows {
			switch {
			case r.Ratios != nil && r.Receiver == "floor":
				fmt.Fprintf(w, "  %s/spead2: CPU %.2f×\n", r.Receiver, r.Ratios.CPU)
			case r.Ratios != nil:
				fmt.Fprintf(w, "  %s/spead2: CPU %.2f×, latency median %.2f×, p99 %.2f×\n", r.Receiver, r.Ratios.CPU, r.Ratios.Median, r.Ratios.P99)
			}
		}
	}
}

func losslessWord(ok bool) string {
	if ok {
		return "lossless"
	}
	return "LOSSY"
}

// String names a shape as --shapes takes it.
func (s PyShape) String() string {
	return sizeName(s.HeapSize) + "@" + strconv.FormatFloat(s.RateGbps, 'g', -1, 64)
}
