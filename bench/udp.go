package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/ring"
)

// UDPRun is one run of `bench udp` or `bench xdp`: send at a rate, receive, consume.
type UDPRun struct {
	RateGbps   float64 `json:"rate_gbps"` // requested; 0: unpaced
	SentGbps   float64 `json:"sent_gbps"`
	HeapsSent  uint64  `json:"heaps_sent"`
	HeapsRecv  uint64  `json:"heaps_received"`
	HeapsCons  uint64  `json:"heaps_consumed"`
	Packets    uint64  `json:"packets"`
	Dropped    uint64  `json:"dropped_heaps"`
	Incomplete uint64  `json:"incomplete_heaps"`
	KernelDrop uint64  `json:"kernel_drops"`
	Seconds    float64 `json:"seconds"`
	Lossless   bool    `json:"lossless"`
	// RecvCPUNsPerPacket is recv's own CPU time (user + system) per packet while the stream runs (from
	// the sender's start to recv's exit; start-up excluded): what the receive path costs, even when the
	// sender limits the rate. Kernel work done in softirq context on the sender's CPU is not in it. The
	// clock tick (10 ms) bounds its resolution: make runs long enough (--bytes).
	RecvCPUNsPerPacket float64 `json:"recv_cpu_ns_per_packet"`
	RecvCPUSecPerGB    float64 `json:"recv_cpu_s_per_gb"`        // recv's CPU per GB of payload received
	ConsCPUNsPerHeap   float64 `json:"consumer_cpu_ns_per_heap"` // the consumer process's CPU per heap read
	RecvCPUSeconds     float64 `json:"recv_cpu_s"`               // recv's CPU over the stream
	ConsCPUSeconds     float64 `json:"consumer_cpu_s"`           // the consumer's CPU over the stream
}

// UDPSize is the result for one heap size: the highest lossless rate found and every run made.
type UDPSize struct {
	HeapSize    int     `json:"heap_size"`
	PacketSize  int     `json:"packet_size"`
	MaxGbps     float64 `json:"max_lossless_gbps"`
	HeapsPerS   float64 `json:"heaps_per_s"`
	PacketsPerS float64 `json:"packets_per_s"`
	UnpacedGbps float64 `json:"unpaced_sent_gbps"`
	UnpacedLoss float64 `json:"unpaced_loss_fraction"`
	RecvCPUNs   float64 `json:"recv_cpu_ns_per_packet"` // of the fastest lossless run (fixed rate: median)
	// Fixed rate only: medians over the runs.
	RecvCPUSecPerGB  float64  `json:"recv_cpu_s_per_gb,omitempty"`
	ConsCPUNsPerHeap float64  `json:"consumer_cpu_ns_per_heap,omitempty"`
	Runs             []UDPRun `json:"runs"`
	LosslessSeen     bool     `json:"lossless_seen"`
}

// Path says where a benchmark's stream flows: loopback by default; `bench xdp` runs recv and send in
// two network namespaces joined by a veth pair.
type Path struct {
	RecvWrap, SendWrap []string // command prefixes, e.g. ip netns exec NS
	RecvArgs           []string // transport flags for recv
	SendArgs           []string // transport flags for send (bench xdp --send-transport xdp)
	Dest               string   // the address recv listens on and send sends to
	Port               int      // 0: a free loopback port
	// RecvBinary, if set, is the ibvbridge whose recv receives (a baseline build); send and the consumer
	// stay Env's, so both receivers get the same traffic.
	RecvBinary string
}

// Loopback is the path of `bench udp`.
var Loopback = Path{Dest: "127.0.0.1"}

// UDPOptions describe a lossless-rate search per heap size.
type UDPOptions struct {
	HeapSizes   []int
	PacketSize  int    // UDP payload per packet
	BytesPerRun int    // payload bytes per run (bounds each run)
	Runs        int    // runs per heap size: one unpaced, then a search on the rate
	Consumer    string // go, c or python
	Label       string // progress prefix (default "bench udp")
	// Rate, if positive, replaces the search: every run offers this load (Gb/s), and the result is the
	// runs' median CPU costs — a fixed offered load is how two receivers are compared.
	Rate float64
	// ConsumerMaxLatency, if positive, is the consumer's latency bound (--max-latency-us: coalesced
	// wakes); not passed to a --baseline build's consumer.
	ConsumerMaxLatency time.Duration
	// ChunkHeaps, if positive, receives in chunk mode (docs/ring-layout.md §13): send gives heap k the
	// timestamp item 0x1600 = (k-1) × heap size, recv places heaps by it into chunks of ChunkHeaps heaps.
	ChunkHeaps int
	// ChunkAxis, with ChunkHeaps, adds the chunks' second axis of ChunkAxis values (the 64 timestamps
	// × 64 antennas): send gives heap k the item 0x4101 = (k-1) mod ChunkAxis and the timestamp
	// (k-1)/ChunkAxis × heap size, and a chunk holds ChunkHeaps × ChunkAxis heaps.
	ChunkAxis    int
	ConsumerArgs []string // more flags for the consumer (e.g. the C consumer's --no-touch)
	// Slots and SlotSize size recv's ring (0: 4096 slots of 64 KiB, or 128 slots of heap + 64 KiB for
	// heaps over 32 KiB).
	Slots, SlotSize int
	// Sender sends the stream (nil: this ibvbridge's send).
	Sender Sender
}

// Sender is the program that sends a benchmark's stream: the command for one run and how to read what it
// reports having sent.
type Sender interface {
	Command(ctx context.Context, wrap []string, endpoint string, heaps uint64, heapSize, packetSize int, rate float64) (*exec.Cmd, error)
	Parse(stdout []byte) (SendResult, error)
}

// ibvbridgeSender is `ibvbridge send --json` of env's binary, with extra flags (chunk items, a transport).
type ibvbridgeSender struct {
	env   Env
	extra []string
}

func (s ibvbridgeSender) Command(ctx context.Context, wrap []string, endpoint string, heaps uint64, heapSize, packetSize int, rate float64) (*exec.Cmd, error) {
	self, err := s.env.binary()
	if err != nil {
		return nil, err
	}
	return wrapped(ctx, wrap, self, append([]string{"send", endpoint, "--heaps", strconv.FormatUint(heaps, 10),
		"--heap-size", strconv.Itoa(heapSize), "--packet-size", strconv.Itoa(packetSize),
		"--rate", strconv.FormatFloat(rate, 'f', -1, 64), "--json"}, s.extra...)...), nil
}

func (ibvbridgeSender) Parse(stdout []byte) (SendResult, error) {
	var sr SendResult
	if err := json.Unmarshal(LastLine(stdout), &sr); err != nil {
		return sr, fmt.Errorf("send output %q: %w", stdout, err)
	}
	return sr, nil
}

func (o *UDPOptions) check() error {
	switch {
	case len(o.HeapSizes) == 0:
		return fmt.Errorf("%w: no heap sizes", ErrBadOption)
	case o.Runs < 1:
		return fmt.Errorf("%w: runs must be positive", ErrBadOption)
	case o.PacketSize < 64 || o.PacketSize > 65507:
		return fmt.Errorf("%w: packet size %d: want 64..65507 bytes of UDP payload", ErrBadOption, o.PacketSize)
	case o.BytesPerRun < 1:
		return fmt.Errorf("%w: bytes per run must be positive", ErrBadOption)
	}
	for _, hs := range o.HeapSizes {
		if hs < 1 {
			return fmt.Errorf("%w: heap size %d", ErrBadOption, hs)
		}
	}
	if o.Rate < 0 {
		return fmt.Errorf("%w: rate %g Gb/s", ErrBadOption, o.Rate)
	}
	if o.ChunkAxis < 0 || o.ChunkAxis > 0 && o.ChunkHeaps <= 0 {
		return fmt.Errorf("%w: chunk axis %d: want a positive count, with chunk heaps", ErrBadOption, o.ChunkAxis)
	}
	if o.Label == "" {
		o.Label = "bench udp"
	}
	return nil
}

// FixedRate runs heap size hs o.Runs times at o.Rate over path and summarises the median CPU costs.
func FixedRate(ctx context.Context, env Env, path Path, o UDPOptions, hs int) (UDPSize, error) {
	res := UDPSize{HeapSize: hs, PacketSize: o.PacketSize}
	heaps := uint64(max(64, min(200_000, o.BytesPerRun/hs)))
	for range o.Runs {
		r, err := udpRun(ctx, env, path, o, hs, heaps, o.Rate)
		if err != nil {
			return res, err
		}
		env.logf("%s: heap %d B at %.3g Gb/s: sent %.3f Gb/s, %d/%d heaps consumed, recv %.0f ns/packet %.3f s/GB, consumer %.0f ns/heap\n",
			o.Label, hs, o.Rate, r.SentGbps, r.HeapsCons, r.HeapsSent, r.RecvCPUNsPerPacket, r.RecvCPUSecPerGB, r.ConsCPUNsPerHeap)
		res.Runs = append(res.Runs, r)
	}
	res.summarise()
	return res, nil
}

// summarise sets the fixed-rate figures: medians over the runs, lossless only if every run was.
func (s *UDPSize) summarise() {
	med := func(f func(UDPRun) float64) float64 {
		v := make([]float64, 0, len(s.Runs))
		for _, r := range s.Runs {
			v = append(v, f(r))
		}
		return median(v)
	}
	s.MaxGbps = med(func(r UDPRun) float64 { return r.SentGbps })
	s.RecvCPUNs = med(func(r UDPRun) float64 { return r.RecvCPUNsPerPacket })
	s.RecvCPUSecPerGB = med(func(r UDPRun) float64 { return r.RecvCPUSecPerGB })
	s.ConsCPUNsPerHeap = med(func(r UDPRun) float64 { return r.ConsCPUNsPerHeap })
	s.HeapsPerS = med(func(r UDPRun) float64 { return float64(r.HeapsSent) / r.Seconds })
	s.PacketsPerS = med(func(r UDPRun) float64 { return float64(r.Packets) / r.Seconds })
	s.LosslessSeen = len(s.Runs) > 0
	for _, r := range s.Runs {
		s.LosslessSeen = s.LosslessSeen && r.Lossless
	}
}

// Comparison is one heap size received by this ibvbridge and by a baseline build on the same traffic.
type Comparison struct {
	HeapSize int     `json:"heap_size"`
	Ours     UDPSize `json:"ours"`
	Baseline UDPSize `json:"baseline"`
	// Ratios, ours over baseline (below 1: ours costs less).
	RecvCPUPerByte   float64 `json:"recv_cpu_per_byte_ratio"`
	RecvCPUPerPacket float64 `json:"recv_cpu_per_packet_ratio"`
	ConsCPUPerHeap   float64 `json:"consumer_cpu_per_heap_ratio"`
	// What the two sides are ("ours" and "baseline", or "chunks" and "heaps").
	OursLabel     string `json:"ours_label"`
	BaselineLabel string `json:"baseline_label"`
}

// Compare runs every heap size at o.Rate with this ibvbridge's recv and with baseline's, alternating run
// by run so both see the same machine state, with the same sender and consumer.
func Compare(ctx context.Context, env Env, path Path, o UDPOptions, baseline string) ([]Comparison, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Rate <= 0 {
		return nil, fmt.Errorf("%w: a comparison needs a fixed rate (--rate)", ErrBadOption)
	}
	if _, err := os.Stat(baseline); err != nil {
		return nil, fmt.Errorf("%w: baseline: %v", ErrBadOption, err)
	}
	base := path
	base.RecvBinary = baseline
	return compareSides(ctx, env, o, [2]compareSide{{path, o, "ours"}, {base, o, "baseline"}})
}

// CompareChunks receives the same traffic in chunk mode (o.ChunkHeaps) and without, alternating run by
// run: Ours is chunk mode, Baseline heap mode.
func CompareChunks(ctx context.Context, env Env, path Path, o UDPOptions) ([]Comparison, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Rate <= 0 || o.ChunkHeaps <= 0 {
		return nil, fmt.Errorf("%w: a chunk comparison needs a fixed rate (--rate) and --chunk-heaps", ErrBadOption)
	}
	heaps := o
	heaps.ChunkHeaps, heaps.ChunkAxis = 0, 0
	return compareSides(ctx, env, o, [2]compareSide{{path, o, "chunks"}, {path, heaps, "heaps"}})
}

// compareSide is one receiver of a comparison: its path, options and label.
type compareSide struct {
	path  Path
	o     UDPOptions
	label string
}

// compareSides runs every heap size at o.Rate on both sides, alternating run by run so both see the same
// machine state, and computes the ratios of side 0 over side 1.
func compareSides(ctx context.Context, env Env, o UDPOptions, sides [2]compareSide) ([]Comparison, error) {
	var out []Comparison
	for _, hs := range o.HeapSizes {
		c := Comparison{HeapSize: hs, Ours: UDPSize{HeapSize: hs, PacketSize: o.PacketSize},
			Baseline: UDPSize{HeapSize: hs, PacketSize: o.PacketSize}, OursLabel: sides[0].label, BaselineLabel: sides[1].label}
		into := [2]*UDPSize{&c.Ours, &c.Baseline}
		for range o.Runs {
			for i, side := range sides {
				one := side.o
				one.Runs = 1
				one.Label = o.Label + " (" + side.label + ")"
				r, err := FixedRate(ctx, env, side.path, one, hs)
				if err != nil {
					return nil, err
				}
				into[i].Runs = append(into[i].Runs, r.Runs...)
			}
		}
		c.Ours.summarise()
		c.Baseline.summarise()
		ratio := func(a, b float64) float64 {
			if b == 0 {
				return 0
			}
			return a / b
		}
		c.RecvCPUPerByte = ratio(c.Ours.RecvCPUSecPerGB, c.Baseline.RecvCPUSecPerGB)
		c.RecvCPUPerPacket = ratio(c.Ours.RecvCPUNs, c.Baseline.RecvCPUNs)
		c.ConsCPUPerHeap = ratio(c.Ours.ConsCPUNsPerHeap, c.Baseline.ConsCPUNsPerHeap)
		out = append(out, c)
	}
	return out, nil
}

// PrintFixedRate writes the table of fixed-rate results (and, given comparisons, both sides and ratios).
func PrintFixedRate(w io.Writer, results []UDPSize, cmp []Comparison) {
	fmt.Fprintf(w, "%10s %8s %10s %9s %14s %12s %16s %8s\n", "heap", "packet", "receiver", "sent Gb/s",
		"recv ns/packet", "recv s/GB", "consumer ns/heap", "lossless")
	row := func(label string, r UDPSize) {
		fmt.Fprintf(w, "%10d %8d %10s %9.2f %14.0f %12.3f %16.0f %8v\n", r.HeapSize, r.PacketSize, label, r.MaxGbps,
			r.RecvCPUNs, r.RecvCPUSecPerGB, r.ConsCPUNsPerHeap, r.LosslessSeen)
	}
	for _, r := range results {
		row("ours", r)
	}
	for _, c := range cmp {
		row(c.OursLabel, c.Ours)
		row(c.BaselineLabel, c.Baseline)
		fmt.Fprintf(w, "%10s %8s %10s recv CPU per byte %.2f×, per packet %.2f×, consumer CPU per heap %.2f× the %s'\n",
			"", "", "", c.RecvCPUPerByte, c.RecvCPUPerPacket, c.ConsCPUPerHeap, c.BaselineLabel)
	}
}

// UDP searches each heap size's highest lossless rate over path.
func UDP(ctx context.Context, env Env, path Path, o UDPOptions) ([]UDPSize, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if _, err := ConsumerCommand(env, o.Consumer, "x", 0); err != nil {
		return nil, err
	}
	var out []UDPSize
	for _, hs := range o.HeapSizes {
		search := SearchLossless
		if o.Rate > 0 {
			search = FixedRate
		}
		r, err := search(ctx, env, path, o, hs)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// PrintUDP writes `bench udp`'s table.
func PrintUDP(w io.Writer, results []UDPSize) {
	fmt.Fprintf(w, "%10s %8s %12s %12s %14s %13s %12s %5s\n", "heap", "packet", "max Gb/s", "heaps/s", "packets/s",
		"unpaced Gb/s", "unpaced loss", "runs")
	for _, r := range results {
		maxs := fmt.Sprintf("%.2f", r.MaxGbps)
		if !r.LosslessSeen {
			maxs = "none"
		}
		fmt.Fprintf(w, "%10d %8d %12s %12.0f %14.0f %13.2f %11.2f%% %5d\n", r.HeapSize, r.PacketSize, maxs,
			r.HeapsPerS, r.PacketsPerS, r.UnpacedGbps, 100*r.UnpacedLoss, len(r.Runs))
	}
}

func wrapped(ctx context.Context, wrap []string, self string, args ...string) *exec.Cmd {
	all := append(append(append([]string{}, wrap...), self), args...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// SearchLossless finds the highest send rate over path that loses nothing for heap size hs: one unpaced
// run, then steps down by 0.6 until a run is lossless, then bisects, within o.Runs runs.
func SearchLossless(ctx context.Context, env Env, path Path, o UDPOptions, hs int) (UDPSize, error) {
	return searchLossless(o, hs, func(heaps uint64, rate float64) (UDPRun, error) {
		return udpRun(ctx, env, path, o, hs, heaps, rate)
	}, env)
}

// searchLossless is the search itself, over any run function (tests give it a model of a receiver).
func searchLossless(o UDPOptions, hs int, run func(heaps uint64, rate float64) (UDPRun, error), env Env) (UDPSize, error) {
	res := UDPSize{HeapSize: hs, PacketSize: o.PacketSize}
	heaps := uint64(max(64, min(200_000, o.BytesPerRun/hs)))
	runs := o.Runs
	try := func(rate float64) (UDPRun, error) {
		r, err := run(heaps, rate)
		if err == nil {
			res.Runs = append(res.Runs, r)
			env.logf("%s: heap %d B rate %.3g Gb/s: sent %.3f Gb/s, %d/%d heaps consumed, lossless %v\n",
				o.Label, hs, rate, r.SentGbps, r.HeapsCons, r.HeapsSent, r.Lossless)
		}
		return r, err
	}
	accept := func(r UDPRun) {
		if r.Lossless && r.SentGbps > res.MaxGbps {
			res.MaxGbps, res.LosslessSeen = r.SentGbps, true
			res.HeapsPerS = float64(r.HeapsSent) / r.Seconds
			res.PacketsPerS = float64(r.Packets) / r.Seconds
			res.RecvCPUNs = r.RecvCPUNsPerPacket
		}
	}
	first, err := try(0)
	if err != nil {
		return res, err
	}
	res.UnpacedGbps = first.SentGbps
	res.UnpacedLoss = 1 - float64(first.HeapsCons)/float64(first.HeapsSent)
	accept(first)
	lo, hi := 0.0, first.SentGbps
	for i := 1; i < runs && !first.Lossless; i++ {
		rate := hi * 0.6
		if lo > 0 {
			rate = (lo + hi) / 2
		}
		r, err := try(rate)
		if err != nil {
			return res, err
		}
		if r.Lossless {
			lo = rate
			accept(r)
		} else {
			hi = rate
		}
		if lo > 0 && hi-lo < 0.05*hi {
			break
		}
	}
	return res, nil
}

// chunkAxisItem is the item bench udp's chunk axis is read from (send --axis, recv --chunk-axis).
const chunkAxisItem = "0x4101"

// chunkPositions is how many heaps a chunk holds (0: not in chunk mode).
func (o UDPOptions) chunkPositions() int {
	if o.ChunkHeaps <= 0 {
		return 0
	}
	return o.ChunkHeaps * max(1, o.ChunkAxis)
}

// udpRun runs recv, a consumer and send once over path. Every wait is bounded, and every process is
// gone and its ring removed when it returns, whatever happened.
func udpRun(ctx context.Context, env Env, path Path, o UDPOptions, heapSize int, heaps uint64, rate float64) (UDPRun, error) {
	consumer, packetSize := o.Consumer, o.PacketSize
	run := UDPRun{RateGbps: rate, HeapsSent: heaps}
	self, err := env.binary()
	if err != nil {
		return run, err
	}
	port := path.Port
	if port == 0 {
		if port, err = testnet.FreeUDPPort(); err != nil {
			return run, err
		}
	}
	name := fmt.Sprintf("benchudp-%d-%d", os.Getpid(), port)
	slots, slotSize := 4096, 1<<16
	if heapSize > 32<<10 {
		slots, slotSize = 128, heapSize+64<<10
	}
	if o.Slots > 0 {
		slots = o.Slots
	}
	if o.SlotSize > 0 {
		slotSize = o.SlotSize
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	defer ring.Remove("", name) // each run's name is new: leave nothing behind (runs after the kills below)
	var recvOut, consOut, sendOut bytes.Buffer
	var recvErr LockedBuffer
	endpoint := path.Dest + ":" + strconv.Itoa(port)
	recvBin := self
	if path.RecvBinary != "" {
		recvBin = path.RecvBinary
	}
	ringArgs := []string{"--slots", strconv.Itoa(slots), "--slot-size", strconv.Itoa(slotSize)}
	var sendArgs []string
	positions := o.chunkPositions()
	if positions > 0 {
		// A slot holds a chunk: as many slots as keep about the same bytes of ring as heap mode has.
		chunkSlots := max(16, min(4096, slots*slotSize/(positions*heapSize)))
		chunkSlots = 1 << (bits.Len(uint(chunkSlots)) - 1)
		ringArgs = []string{"--slots", strconv.Itoa(chunkSlots), "--chunk-heaps", strconv.Itoa(o.ChunkHeaps),
			"--chunk-by", "0x1600:" + strconv.Itoa(heapSize), "--chunk-heap-size", strconv.Itoa(heapSize)}
		sendArgs = []string{"--timestamp-step", strconv.Itoa(heapSize)}
		if o.ChunkAxis > 0 {
			axis := chunkAxisItem + ":" + strconv.Itoa(o.ChunkAxis)
			ringArgs = append(ringArgs, "--chunk-axis", axis)
			sendArgs = append(sendArgs, "--axis", axis)
		}
	}
	recv := wrapped(ctx, path.RecvWrap, recvBin, append(append(append([]string{"recv", "--ring", name}, ringArgs...),
		append([]string{"--max-heaps", "8", "--log-format", "json"}, path.RecvArgs...)...), endpoint)...)
	rp, err := startReady(recv, &recvOut, &recvErr, 10*time.Second, recvReceiving(&recvErr))
	if err != nil {
		return run, fmt.Errorf("ring %s: %w", name, err)
	}
	// On every return: recv killed and reaped before its ring is removed (a live recv holds the ring's lock).
	defer rp.kill()
	consEnv := env
	if path.RecvBinary != "" {
		// A baseline build may speak another ring layout: its own Go consumer reads its rings.
		if consumer != "go" {
			return run, fmt.Errorf("%w: a --baseline comparison reads with the baseline's own Go consumer (--consumer go)", ErrBadOption)
		}
		consEnv.Binary = path.RecvBinary
	}
	var extra []string
	if o.ConsumerMaxLatency > 0 && path.RecvBinary == "" {
		extra = []string{"--max-latency-us", strconv.FormatInt(o.ConsumerMaxLatency.Microseconds(), 10)}
	}
	// Heaps are read in batches (the Python consumer's --batch); chunks as a user reads them, one by one
	// through the ring's iterator, which is also the path a wake costs least on.
	batch := 4096
	if positions > 0 {
		batch = 0
	}
	cons, err := ConsumerCommand(consEnv, consumer, name, batch, append(extra, o.ConsumerArgs...)...)
	if err != nil {
		return run, err
	}
	cons.Stdout, cons.Stderr = &consOut, env.Log
	if err := cons.Start(); err != nil {
		return run, fmt.Errorf("start consumer: %w", err)
	}
	defer func() {
		if cons.ProcessState == nil {
			_ = cons.Process.Kill()
			_ = cons.Wait()
		}
	}()
	if err := waitFor(20*time.Second, func() bool { return consumerAttached(name) }); err != nil {
		return run, fmt.Errorf("%s consumer did not attach", consumer)
	}
	// A consumer maps the ring after it has attached (and a large ring's pages are still being zeroed):
	// with 4096 slots of 2 MiB that overlapped the stream's first second and cost recv 1.2× its CPU.
	waitSettled(10*time.Second, recv.Process.Pid, cons.Process.Pid)
	sendExtra := append(sendArgs, path.SendArgs...)
	sender := o.Sender
	if sender == nil {
		sender = ibvbridgeSender{env, sendExtra}
	} else if len(sendExtra) > 0 {
		return run, fmt.Errorf("%w: send flags %q need ibvbridge's own sender", ErrBadOption, sendExtra)
	}
	var send *exec.Cmd
	send, err = sender.Command(ctx, path.SendWrap, endpoint, heaps, heapSize, packetSize, rate)
	if err != nil {
		return run, err
	}
	send.Stdout, send.Stderr = &sendOut, env.Log
	// CPU from here on is the stream's: recv's start-up (the ring's memory populated and zeroed) and the
	// consumer's (a Python import) would otherwise dominate a short run's figures per packet.
	recvCPU0, _ := cpuTime(recv.Process.Pid)
	consCPU0, _ := cpuTime(cons.Process.Pid)
	if err := send.Run(); err != nil {
		return run, fmt.Errorf("send: %w", err)
	}
	sr, err := sender.Parse(sendOut.Bytes())
	if err != nil {
		return run, err
	}
	run.SentGbps, run.Seconds = sr.Gbps, sr.Seconds
	if recvErrV := rp.finish(3 * time.Second); recvErrV != nil {
		return run, fmt.Errorf("recv: %w: %s", recvErrV, recvErr.String())
	}
	_ = cons.Wait() // it ends at the end of stream; its exit status says how, its JSON what it read
	consCPU := cons.ProcessState.UserTime() + cons.ProcessState.SystemTime() - consCPU0
	rc, err := parseRecvReport(recvOut.Bytes())
	if err != nil {
		return run, err
	}
	// A baseline build's CPU counts to its exit; this build's recv reports its own at the stream's end.
	recvCPU := rc.cpuSince(recvCPU0, recv.ProcessState.UserTime()+recv.ProcessState.SystemTime())
	run.HeapsRecv, run.Dropped, run.Incomplete = rc.count("heaps"), rc.count("dropped_heaps"), rc.count("incomplete_heaps")
	run.Packets, run.KernelDrop = rc.transport("packets"), rc.transport("kernel_drops")
	var cr ConsumeResult
	if err := json.Unmarshal(LastLine(consOut.Bytes()), &cr); err == nil {
		run.HeapsCons = cr.Heaps
		if positions > 0 {
			// The consumer read chunks: count the heaps they hold (the last chunk may be partly filled),
			// so CPU per heap compares with heap mode's.
			run.HeapsCons = min(cr.Heaps*uint64(positions), heaps)
			run.Incomplete += rc.count("too_old_heaps") + rc.count("rejected_heaps")
		}
		if cr.CPUSeconds > 0 {
			// The consumer's own account, from its attach to the end of its stream, leaves out its exit
			// (an interpreter's shutdown costs a Python consumer tens of ms).
			consCPU = time.Duration(cr.CPUSeconds * 1e9)
		}
	}
	run.RecvCPUSeconds, run.ConsCPUSeconds = recvCPU.Seconds(), consCPU.Seconds()
	if run.Packets > 0 {
		run.RecvCPUNsPerPacket = float64(recvCPU.Nanoseconds()) / float64(run.Packets)
	}
	if b := rc.count("bytes"); b > 0 {
		run.RecvCPUSecPerGB = recvCPU.Seconds() / (float64(b) / 1e9)
	}
	if run.HeapsCons > 0 {
		run.ConsCPUNsPerHeap = float64(consCPU.Nanoseconds()) / float64(run.HeapsCons)
	}
	run.Lossless = run.HeapsCons == heaps && run.HeapsRecv == heaps && run.Dropped == 0 && run.Incomplete == 0
	return run, nil
}

// SendResult is the summary `ibvbridge send --json` prints.
type SendResult struct {
	Heaps   uint64  `json:"heaps"`
	Packets uint64  `json:"packets"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Gbps    float64 `json:"gbps"`
	HeapsPS float64 `json:"heaps_per_s"`
	// SkippedIncomplete (send --ring): heaps the ring held incomplete or truncated, not sent.
	SkippedIncomplete uint64 `json:"skipped_incomplete,omitempty"`
}

// consumerAttached reports whether ring name has a consumer: through the ring's consumer table, or, for a
// baseline build of layout 1.0, the consumer pid of its control file (0x400 of /dev/shm/ibvbridge.NAME.v1.ctl).
func consumerAttached(name string) bool {
	if i, err := ring.Inspect(name, ""); err == nil {
		return slices.ContainsFunc(i.Consumers, ring.ConsumerInfo.Attached)
	}
	f, err := os.Open("/dev/shm/ibvbridge." + name + ".v1.ctl")
	if err != nil {
		return false
	}
	defer f.Close()
	var pid [8]byte
	_, err = f.ReadAt(pid[:], 0x400)
	return err == nil && binary.LittleEndian.Uint64(pid[:]) != 0
}
