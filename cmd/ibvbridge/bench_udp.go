package main

// bench udp, bench xdp and bench udp --peer spead2: receive benchmarks over loopback, a veth pair and
// against spead2.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/ibvbridge/ibvbridge/bench"
)

// udpFlags are the flags bench udp and bench xdp share; their defaults differ.
func udpFlags(fs *flag.FlagSet, o *bench.UDPOptions, packet, bytesPerRun, runs int) (sizes *string, asJSON *bool) {
	sizes = fs.String("heap-sizes", "8K,1M", "comma-separated heap sizes")
	o.PacketSize, o.BytesPerRun = packet, bytesPerRun // before Var: the flags' defaults are these values
	fs.Var((*byteSize)(&o.PacketSize), "packet-size", "UDP payload per packet (8972: jumbo frames, 1472: standard MTU)")
	fs.Var((*byteSize)(&o.BytesPerRun), "bytes", "payload bytes per run (bounds each run)")
	fs.IntVar(&o.Runs, "runs", runs, "runs per heap size: one unpaced, then a search on the rate")
	fs.StringVar(&o.Consumer, "consumer", "c", "consumer process: go, c or python")
	fs.DurationVar(&o.ConsumerMaxLatency, "consumer-max-latency", 0, "the consumer's latency bound (its --max-latency-us: coalesced wakes, e.g. 1ms; 0: a wake per heap)")
	fs.Func("consumer-args", "more flags for the consumer, space-separated (e.g. --no-touch: take and release heaps or chunks without reading their bytes)", func(v string) error {
		o.ConsumerArgs = strings.Fields(v)
		return nil
	})
	asJSON = fs.Bool("json", false, "print one JSON object")
	return sizes, asJSON
}

func runBenchUDP(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench udp", stderr)
	var o bench.UDPOptions
	sizes, asJSON := udpFlags(fs, &o, 8972, 512<<20, 7)
	fs.Float64Var(&o.Rate, "rate", 0, "offer this load (Gb/s) in every run instead of searching, and report CPU costs (medians of --runs)")
	baseline := fs.String("baseline", "", "with --rate: also receive the same traffic with this ibvbridge binary (e.g. main built from git), alternating runs, and print the ratios")
	fs.IntVar(&o.ChunkHeaps, "chunk-heaps", 0, "receive in chunk mode, N heaps per chunk (send stamps heaps with a timestamp); with --rate: also without, alternating runs, and print the ratios")
	fs.IntVar(&o.ChunkAxis, "chunk-axis", 0, "with --chunk-heaps: a second chunk axis of N values (send's --axis, recv's --chunk-axis on item 0x4101): chunks of N × --chunk-heaps heaps, e.g. 64 timestamps × 64 antennas")
	peer := fs.String("peer", "", "spead2: receive spead2_send's traffic with recv (its consumer: ibvb-consume --no-touch), spead2_recv and the floor receiver, alternating, and print CPU and ratios (default shapes: 1M at 6 Gb/s, 8K at 2.5 Gb/s; --heap-sizes and --rate override; --runs defaults to 5)")
	var peerBins peerBinaries
	fs.Var(&peerBins, "peer-bin", "with --peer: a spead2_recv to compare, PATH or LABEL=PATH; repeatable (default: spead2_recv on PATH)")
	peerArgs := fs.String("peer-args", strings.Join(bench.DefaultSpead2RecvArgs, " "), "with --peer: spead2_recv's flags")
	recvArgs := fs.String("recv-args", "", "with --peer: more flags for recv, space-separated, after --policy block (spead2_recv's ring blocks when full, so recv's does too; e.g. --hugepages off, --coalesce 0)")
	peerSlots := fs.String("slots", "64", "with --peer: recv's ring sizes, comma-separated (slots of twice the heap size)")
	peerSeconds := fs.Float64("seconds", 2, "with --peer and --heap-sizes/--rate: seconds of stream per run")
	peerBuffer := byteSize(32 << 20)
	fs.Var(&peerBuffer, "buffer", "with --peer: every receiver's socket buffer")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	var err error
	if o.HeapSizes, err = parseSizeList(*sizes); err != nil {
		return err
	}
	if *peer != "" {
		return runBenchPeer(ctx, env, fs, o, peerOptions{peer: *peer, bins: peerBins, peerArgs: *peerArgs, recvArgs: *recvArgs,
			slots: *peerSlots, seconds: *peerSeconds, buffer: int(peerBuffer), asJSON: *asJSON}, stdout)
	}
	if err := validateBenchUDP(o, *baseline); err != nil {
		return err
	}
	if o.ChunkHeaps > 0 && o.Rate > 0 || *baseline != "" {
		var cmp []bench.Comparison
		if *baseline != "" {
			cmp, err = bench.Compare(ctx, env, bench.Loopback, o, *baseline)
		} else {
			cmp, err = bench.CompareChunks(ctx, env, bench.Loopback, o)
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "rate_gbps": o.Rate, "comparisons": cmp})
		}
		bench.PrintFixedRate(stdout, nil, cmp)
		return nil
	}
	results, err := bench.UDP(ctx, env, bench.Loopback, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "sizes": results})
	}
	if o.Rate > 0 {
		bench.PrintFixedRate(stdout, results, nil)
		return nil
	}
	bench.PrintUDP(stdout, results)
	return nil
}

// validateBenchUDP checks bench udp's chunk flags (without --peer) against each other and --baseline.
func validateBenchUDP(o bench.UDPOptions, baseline string) error {
	if o.ChunkHeaps < 0 || o.ChunkHeaps > 0 && baseline != "" {
		return usageError("--chunk-heaps %d: want a positive count, and not with --baseline", o.ChunkHeaps)
	}
	if o.ChunkAxis < 0 || o.ChunkAxis > 0 && o.ChunkHeaps == 0 {
		return usageError("--chunk-axis %d: want a positive count, with --chunk-heaps", o.ChunkAxis)
	}
	return nil
}

// peerBinaries collects --peer-bin: PATH or LABEL=PATH.
type peerBinaries []bench.PeerBinary

func (p *peerBinaries) String() string { return fmt.Sprint(*p) }
func (p *peerBinaries) Set(v string) error {
	label, path, ok := strings.Cut(v, "=")
	if !ok {
		label, path = v, v
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("spead2_recv %q: %w", path, err)
	}
	*p = append(*p, bench.PeerBinary{Label: label, Path: path})
	return nil
}

// runBenchXDP compares `recv --transport xdp` with `--transport udp` over a veth pair between two network
// namespaces the benchmark creates and removes.
func runBenchXDP(ctx context.Context, env bench.Env, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench xdp", stderr)
	var o bench.XDPOptions
	sizes, asJSON := udpFlags(fs, &o.UDPOptions, 1472, 256<<20, 6)
	fs.StringVar(&o.Mode, "xdp-mode", "auto", "XDP attach mode: auto, native or generic")
	fs.Float64Var(&o.Rate, "rate", 0, "offer this load (Gb/s) in every run, alternating udp and xdp runs, instead of searching, and report the medians' CPU costs")
	fs.StringVar(&o.SendTransport, "send-transport", "udp", "how both streams are sent: udp (sockets) or xdp (send --transport xdp)")
	recvArgs := fs.String("xdp-recv-args", "", "extra flags for the AF_XDP recv, space-separated (e.g. --xdp-prefer-busy-poll)")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	o.RecvArgs = strings.Fields(*recvArgs)
	var err error
	if o.HeapSizes, err = parseSizeList(*sizes); err != nil {
		return err
	}
	results, err := bench.XDP(ctx, env, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": o.Consumer, "packet_size": o.PacketSize, "sizes": results})
	}
	bench.PrintXDP(stdout, results)
	return nil
}

// peerOptions are bench udp's --peer flags.
type peerOptions struct {
	peer                      string
	bins                      peerBinaries
	peerArgs, recvArgs, slots string
	seconds                   float64
	buffer                    int
	asJSON                    bool
}

// runBenchPeer is bench udp --peer spead2: recv, each spead2_recv and the floor receiver on spead2_send's
// traffic, alternating. fs is bench udp's parsed flag set (which flags were given).
func runBenchPeer(ctx context.Context, env bench.Env, fs *flag.FlagSet, o bench.UDPOptions, pf peerOptions, stdout io.Writer) error {
	if pf.peer != "spead2" {
		return usageError("--peer %q: the only peer is spead2", pf.peer)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["runs"] {
		o.Runs = 5
	}
	po := bench.PeerOptions{Runs: o.Runs, Spead2: pf.bins, Spead2RecvArgs: strings.Fields(pf.peerArgs),
		Buffer: pf.buffer, Floor: true, RecvArgs: strings.Fields(pf.recvArgs)}
	var err error
	if po.Slots, err = parseSizeList(pf.slots); err != nil {
		return err
	}
	po.Shapes = bench.DefaultPeerShapes
	if set["heap-sizes"] || set["rate"] {
		if o.Rate <= 0 {
			return usageError("--peer with --heap-sizes needs --rate")
		}
		po.Shapes = nil
		for _, hs := range o.HeapSizes {
			po.Shapes = append(po.Shapes, bench.PeerShape{HeapSize: hs, PacketSize: o.PacketSize, RateGbps: o.Rate,
				Heaps: uint64(max(1, o.Rate*1e9/8*pf.seconds/float64(hs)))})
		}
	}
	if len(po.Spead2) == 0 {
		if p, err := exec.LookPath("spead2_recv"); err == nil {
			po.Spead2 = []bench.PeerBinary{{Label: "spead2_recv", Path: p}}
		}
	}
	if p, err := exec.LookPath("spead2_send"); err == nil {
		po.Spead2Send = p
	}
	if len(po.Spead2) == 0 || po.Spead2Send == "" {
		fmt.Fprintln(stdout, "spead2_recv or spead2_send not on PATH (see the README's performance section): no spead2 rows, and ibvbridge send sends")
		po.Spead2 = nil
		po.Spead2Send = ""
	}
	res, err := bench.Peer(ctx, env, po)
	if err != nil {
		return err
	}
	if pf.asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"peer": po, "results": res})
	}
	bench.PrintPeer(stdout, res, po.Runs)
	return nil
}
