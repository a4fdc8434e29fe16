package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// udpRun is one loopback run of `bench udp`: send at a rate, receive, consume.
type udpRun struct {
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
	// RecvCPUNsPerPacket is recv's own CPU time (user + system) per packet: what the receive path costs,
	// even when the sender limits the rate. Kernel work done in softirq context on the sender's CPU is not
	// in it.
	RecvCPUNsPerPacket float64 `json:"recv_cpu_ns_per_packet"`
}

// udpBenchSize is the result for one heap size: the highest lossless rate found and every run made.
type udpBenchSize struct {
	HeapSize     int      `json:"heap_size"`
	PacketSize   int      `json:"packet_size"`
	MaxGbps      float64  `json:"max_lossless_gbps"`
	HeapsPerS    float64  `json:"heaps_per_s"`
	PacketsPerS  float64  `json:"packets_per_s"`
	UnpacedGbps  float64  `json:"unpaced_sent_gbps"`
	UnpacedLoss  float64  `json:"unpaced_loss_fraction"`
	RecvCPUNs    float64  `json:"recv_cpu_ns_per_packet"` // of the fastest lossless run
	Runs         []udpRun `json:"runs"`
	LosslessSeen bool     `json:"lossless_seen"`
}

func runBenchUDP(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench udp", stderr)
	sizes := fs.String("heap-sizes", "8K,1M", "comma-separated heap sizes")
	packet := sizeFlag(fs, "packet-size", 8972, "UDP payload per packet (8972: jumbo frames, 1472: standard MTU)")
	bytesPerRun := sizeFlag(fs, "bytes", 512<<20, "payload bytes per run (bounds each run)")
	runs := fs.Int("runs", 7, "runs per heap size: one unpaced, then a search on the rate")
	consumer := fs.String("consumer", "c", "consumer process: go, c or python")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	heapSizes, err := parseSizeList(*sizes)
	if err != nil {
		return err
	}
	if *runs < 1 {
		return usageError("--runs must be positive")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var results []udpBenchSize
	for _, hs := range heapSizes {
		res, err := searchLossless(loopbackPath, self, *consumer, hs, *packet, *bytesPerRun, *runs, "bench udp", stderr)
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": *consumer, "sizes": results})
	}
	fmt.Fprintf(stdout, "%10s %8s %12s %12s %14s %13s %12s %5s\n", "heap", "packet", "max Gb/s", "heaps/s", "packets/s",
		"unpaced Gb/s", "unpaced loss", "runs")
	for _, r := range results {
		maxs := fmt.Sprintf("%.2f", r.MaxGbps)
		if !r.LosslessSeen {
			maxs = "none"
		}
		fmt.Fprintf(stdout, "%10d %8d %12s %12.0f %14.0f %13.2f %11.2f%% %5d\n", r.HeapSize, r.PacketSize, maxs,
			r.HeapsPerS, r.PacketsPerS, r.UnpacedGbps, 100*r.UnpacedLoss, len(r.Runs))
	}
	return nil
}

// benchPath says where a benchmark's stream flows: loopback by default; `bench xdp` runs recv and send in
// two network namespaces joined by a veth pair.
type benchPath struct {
	recvWrap, sendWrap []string // command prefixes, e.g. ip netns exec NS
	recvArgs           []string // transport flags for recv
	dest               string   // the address recv listens on and send sends to
	port               int      // 0: a free loopback port
}

var loopbackPath = benchPath{dest: "127.0.0.1"}

func wrapped(ctx context.Context, wrap []string, self string, args ...string) *exec.Cmd {
	all := append(append(append([]string{}, wrap...), self), args...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// searchLossless finds the highest send rate over path that loses nothing: one unpaced run, then steps
// down by 0.6 until a run is lossless, then bisects, within runs runs.
func searchLossless(path benchPath, self, consumer string, hs, packet, bytesPerRun, runs int, label string, stderr io.Writer) (udpBenchSize, error) {
	res := udpBenchSize{HeapSize: hs, PacketSize: packet}
	heaps := uint64(max(64, min(200_000, bytesPerRun/hs)))
	try := func(rate float64) (udpRun, error) {
		r, err := udpBenchRun(path, self, consumer, hs, packet, heaps, rate, stderr)
		if err == nil {
			res.Runs = append(res.Runs, r)
			fmt.Fprintf(stderr, "%s: heap %d B rate %.3g Gb/s: sent %.3f Gb/s, %d/%d heaps consumed, lossless %v\n",
				label, hs, rate, r.SentGbps, r.HeapsCons, r.HeapsSent, r.Lossless)
		}
		return r, err
	}
	accept := func(r udpRun) {
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

// udpBenchRun runs recv, a consumer and send once over path. Every wait is bounded.
func udpBenchRun(path benchPath, self, consumer string, heapSize, packetSize int, heaps uint64, rate float64, stderr io.Writer) (udpRun, error) {
	run := udpRun{RateGbps: rate, HeapsSent: heaps}
	port := path.port
	if port == 0 {
		var err error
		if port, err = freeUDPPort(); err != nil {
			return run, err
		}
	}
	name := fmt.Sprintf("benchudp-%d-%d", os.Getpid(), port)
	slots, slotSize := 4096, 1<<16
	if heapSize > 32<<10 {
		slots, slotSize = 128, heapSize+64<<10
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	defer ring.Remove("", "", name) // each run's name is new: leave nothing behind in /dev/shm
	var recvOut, consOut, sendOut bytes.Buffer
	var recvErr lockedBuffer
	endpoint := path.dest + ":" + strconv.Itoa(port)
	recv := wrapped(ctx, path.recvWrap, self, append(append([]string{"recv", "--ring", name, "--slots", strconv.Itoa(slots),
		"--slot-size", strconv.Itoa(slotSize), "--max-heaps", "8", "--log-format", "json"}, path.recvArgs...), endpoint)...)
	recv.Stdout, recv.Stderr = &recvOut, &recvErr
	if err := recv.Start(); err != nil {
		return run, fmt.Errorf("start recv: %w", err)
	}
	defer recv.Process.Kill()
	recvDone := make(chan error, 1)
	go func() { recvDone <- recv.Wait() }()
	ctl := ring.CtlPath(ring.DefaultDir, name)
	// "receiving" is logged once the transport is open (a kernel-bypass one opens after the ring exists).
	if err := waitFor(10*time.Second, func() bool { return strings.Contains(recvErr.String(), `"message":"receiving"`) }); err != nil {
		return run, fmt.Errorf("recv did not start receiving on ring %s: %s", name, recvErr.String())
	}
	cons, err := consumerCommand(consumer, name, 4096)
	if err != nil {
		return run, err
	}
	cons.Stdout, cons.Stderr = &consOut, stderr
	if err := cons.Start(); err != nil {
		return run, fmt.Errorf("start consumer: %w", err)
	}
	defer cons.Process.Kill()
	if err := waitFor(20*time.Second, func() bool { i, _ := ring.Inspect(ctl, ""); return i.ConsumerPID != 0 }); err != nil {
		return run, fmt.Errorf("%s consumer did not attach", consumer)
	}
	send := wrapped(ctx, path.sendWrap, self, "send", endpoint, "--heaps", strconv.FormatUint(heaps, 10),
		"--heap-size", strconv.Itoa(heapSize), "--packet-size", strconv.Itoa(packetSize),
		"--rate", strconv.FormatFloat(rate, 'f', -1, 64), "--json")
	send.Stdout, send.Stderr = &sendOut, stderr
	if err := send.Run(); err != nil {
		return run, fmt.Errorf("send: %w", err)
	}
	var sr sendResult
	if err := json.Unmarshal(lastLine(sendOut.Bytes()), &sr); err != nil {
		return run, fmt.Errorf("send output %q: %w", sendOut.String(), err)
	}
	run.SentGbps, run.Seconds = sr.Gbps, sr.Seconds
	// A lossy run may have lost the stop heap itself: give recv a moment, then stop it.
	var recvErrV error
	select {
	case recvErrV = <-recvDone:
	case <-time.After(3 * time.Second):
		_ = recv.Process.Signal(syscall.SIGINT)
		recvErrV = <-recvDone // bounded by ctx: CommandContext kills it
	}
	if recvErrV != nil {
		return run, fmt.Errorf("recv: %w: %s", recvErrV, recvErr.String())
	}
	recvCPU := recv.ProcessState.UserTime() + recv.ProcessState.SystemTime()
	_ = cons.Wait() // it ends at the end of stream; its exit status says how, its JSON what it read
	var rc map[string]any
	if err := json.Unmarshal(lastLine(recvOut.Bytes()), &rc); err != nil {
		return run, fmt.Errorf("recv output %q: %w", recvOut.String(), err)
	}
	num := func(m map[string]any, k string) uint64 { f, _ := m[k].(float64); return uint64(f) }
	run.HeapsRecv, run.Dropped, run.Incomplete = num(rc, "heaps"), num(rc, "dropped_heaps"), num(rc, "incomplete_heaps")
	if tc, ok := rc["transport_counters"].(map[string]any); ok {
		run.Packets, run.KernelDrop = num(tc, "packets"), num(tc, "kernel_drops")
	}
	var cr consumeResult
	if err := json.Unmarshal(lastLine(consOut.Bytes()), &cr); err == nil {
		run.HeapsCons = cr.Heaps
	}
	if run.Packets > 0 {
		run.RecvCPUNsPerPacket = float64(recvCPU.Nanoseconds()) / float64(run.Packets)
	}
	run.Lossless = run.HeapsCons == heaps && run.HeapsRecv == heaps && run.Dropped == 0 && run.Incomplete == 0
	return run, nil
}

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// freeUDPPort asks the kernel for a free port on 127.0.0.1 (free when asked; tests and benchmarks accept
// the small window before recv binds it).
func freeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}
