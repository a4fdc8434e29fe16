package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/internal/chunkplace"
	"github.com/ibvbridge/ibvbridge/internal/proccpu"
	"github.com/ibvbridge/ibvbridge/internal/sdnotify"
	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/metrics"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/pcap"
	"github.com/ibvbridge/ibvbridge/transport/udp"
	"github.com/ibvbridge/ibvbridge/transport/xdp"
)

// Defaults of recv. The slot holds one heap: 2 MiB takes spead2's common 1 MiB heaps (send's default) with
// their first heap's descriptors; 128 of them (256 MiB) take a quarter of the 512 × 2 MiB hugepages
// scripts/setup.sh reserves, so a second default ring and the demo's still fit on hugepages.
const (
	defaultSlots    = 128
	defaultSlotSize = 2 << 20
	minSlotSize     = 1 << 10
)

func runRecv(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("recv", stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ibvbridge recv --ring NAME [flags] ENDPOINT... (host:port or port)\n       ibvbridge recv --ring NAME --pcap FILE [flags] [ENDPOINT...]")
		fs.PrintDefaults()
	}
	name := fs.String("ring", "", "ring name (required)")
	slots := fs.Int("slots", defaultSlots, "ring slots, a power of two")
	slotSize := sizeFlag(fs, "slot-size", defaultSlotSize, "payload bytes per slot (the largest heap kept whole; suffixes K, M, G)")
	maxItems := fs.Int("max-items", 64, "item-table entries per slot")
	maxHeaps := fs.Int("max-heaps", 4, "heaps under assembly at once (spead2's max_heaps)")
	incomplete := fs.Bool("incomplete", false, "publish incomplete heaps (flagged) instead of discarding them")
	policy := fs.String("policy", "", "full ring: drop (default) or block (default with --pcap)")
	pcapFile := fs.String("pcap", "", "replay this pcap/pcapng file instead of receiving from sockets")
	paced := fs.Bool("pcap-paced", false, "replay at the capture's own rate")
	iface := fs.String("interface", "", "local IPv4 address of the interface that joins multicast groups (xdp: its name or address)")
	buffer := sizeFlag(fs, "buffer", udp.DefaultBufferSize, "socket receive buffer bytes")
	maxPacket := sizeFlag(fs, "max-packet", udp.DefaultMaxPacketSize, "largest datagram; bigger ones are counted as truncated")
	threads := fs.Int("threads", 1, "udp: receive threads (spead2_recv's flag); each owns a share of the endpoints, all feed one ring")
	cpus := fs.String("cpus", "", "udp: pin receive thread k to the k-th CPU of this comma-separated list")
	coalesce := udp.DefaultCoalescing
	fs.Var(&coalesce, "coalesce", "udp: after a read that empties the socket, sleep so the next read finds many bursts (interrupt moderation in software). heap (default): each sleep ends before the heap in assembly is expected to be complete and none is taken between heaps, so no heap completes later for it (up to 1ms). A duration (at most 1ms): sleep up to that long, fewer wakes for up to that much latency per heap. 0: read each burst as it comes. Each sleep is shortened to what the socket buffer and the ring's free slots hold")
	gro := fs.Bool("gro", true, "udp: let the kernel hand over runs of datagrams as one message (UDP GRO); --gro=false: one datagram per message")
	hugepages := fs.String("hugepages", "auto", "ring data on hugepages: auto, require or off")
	ringDir := fs.String("dir", "", "ring directory for the socket and lock (default: $IBVBRIDGE_RING_DIR, else /run/ibvbridge for root, else /dev/shm/ibvbridge-UID)")
	group := fs.String("group", "", "let members of this group attach as consumers (default: only this user and root)")
	grants := map[string]ring.GroupGrant{}
	fs.Func("consumer-group", "NAME=UID|@GID[,...]: only these consumer groups may be joined, each by these users and groups (and root); repeatable (default: every group open)", func(v string) error {
		name, g, err := ring.ParseGroupGrant(v)
		if err != nil {
			return err
		}
		if _, dup := grants[name]; dup {
			return fmt.Errorf("consumer group %s given twice", name)
		}
		grants[name] = g
		return nil
	})
	maxConsumers := fs.Int("max-consumers", ring.DefaultMaxConsumer, "consumers that may attach at once")
	maxObservers := fs.Int("max-observers", ring.DefaultMaxObservers, "observers (stat, ls) that may be connected at once")
	transportName := fs.String("transport", "", "udp, pcap, xdp or ibv (default udp, or pcap with --pcap)")
	xdpOpt := addXDPFlags(fs)
	ibvOpt := addIBVFlags(fs, false) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	logFormat := fs.String("log-format", "console", "console or json (json: final counters as one JSON object on stdout)")
	statsEvery := fs.Duration("stats-interval", 0, "log the counters this often (0: off)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	waitConsumer := fs.Duration("wait-consumer", 0, "wait up to this long for a consumer to attach before receiving (file replay into a reader)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics, and the probes /healthz and /readyz (e.g. :9100 or 127.0.0.1:9100)")
	chunkHeaps := fs.Uint("chunk-heaps", 0, "chunk mode: heaps per chunk along the time axis (0: off; docs/ring-layout.md §13)")
	chunkBy := fs.String("chunk-by", "", "chunk mode: ITEM[:STEP], the immediate item whose value / STEP is a heap's time index (e.g. 0x1600:4096)")
	chunkAxis := fs.String("chunk-axis", "", "chunk mode: ITEM:COUNT, an immediate item giving a second index below COUNT (e.g. 0x4101:64)")
	chunkWindow := fs.Int("chunk-window", 2, "chunk mode: chunks open at once; a heap for a later chunk publishes the oldest")
	chunkHeapSize := sizeFlag(fs, "chunk-heap-size", 0, "chunk mode: bytes per heap position (larger heaps are rejected); the slot size follows")
	chunkPlace := fs.String("chunk-place", "", "chunk mode: LIB.so:FUNCTION, a C function that places each heap instead of --chunk-by (clients/c/ibvbridge_chunk_place.h); trusted code, loaded into recv")
	chunkPlaceItems := fs.String("chunk-place-items", "", "with --chunk-place: ID,ID,... the immediate items whose values the function gets, in order")
	keepGoing := fs.Bool("keep-going", false, "a stream stop ends that stream, not recv: consumers see a STREAM_END marker and read on; the ring's END_OF_STREAM comes when recv stops (the systemd unit's default; spead2's stop_on_stop_item=False)")
	lossSummary := fs.Duration("loss-summary", bridge.DefaultLossSummary, "least time between two summary lines of losses that go on (the first loss of each kind is logged within 200ms)")
	chunkPlaceArg := fs.String("chunk-place-arg", "", "with --chunk-place: a string the function gets (its user_data)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	log, err := newLogger(*logFormat, stderr)
	if err != nil {
		return err
	}

	// Validate everything before touching sockets or the ring, so a typo never leaves anything behind.
	if *name == "" {
		return usageError("--ring is required")
	}
	if err := ring.ValidateName(*name); err != nil {
		return usageError("--ring %q: %v", *name, err)
	}
	if *slots < 1 || *slots > ring.MaxSlotCount || *slots&(*slots-1) != 0 {
		return usageError("--slots %d: want a power of two in 1..%d", *slots, ring.MaxSlotCount)
	}
	if *slotSize < minSlotSize {
		return usageError("--slot-size %d: want at least %d bytes (a slot holds a whole heap)", *slotSize, minSlotSize)
	}
	if *maxItems < 1 || *maxItems > ring.MaxItems {
		return usageError("--max-items %d: want 1..%d", *maxItems, ring.MaxItems)
	}
	if *maxObservers < 1 {
		return usageError("--max-observers %d: want at least 1", *maxObservers)
	}
	if *maxConsumers < 1 || *maxConsumers > ring.MaxConsumersLimit {
		return usageError("--max-consumers %d: want 1..%d", *maxConsumers, ring.MaxConsumersLimit)
	}
	if *maxHeaps < 1 || *maxHeaps > *slots && *chunkHeaps == 0 || *maxHeaps > 4096 {
		return usageError("--max-heaps %d: want 1..%d (every heap under assembly holds a slot; with --chunk-heaps up to 4096)", *maxHeaps, min(*slots, 4096))
	}
	if *maxPacket < 64 || *maxPacket > 65535 {
		return usageError("--max-packet %d: want 64..65535", *maxPacket)
	}
	if *buffer < 0 {
		return usageError("--buffer %d: want a size in bytes", *buffer)
	}
	placeItems, err := parseChunkPlaceItems(*chunkPlace, *chunkPlaceItems, fs)
	if err != nil {
		return err
	}
	chunks, err := chunkGeometry(fs, *chunkHeaps, *chunkBy, *chunkAxis, *chunkHeapSize, *chunkWindow, *slots, placeItems)
	if err != nil {
		return err
	}
	ringSlotSize := *slotSize
	if chunks.Enabled() {
		ringSlotSize = 0 // derived from the chunk (--slot-size does not go with --chunk-heaps)
	}
	tr, err := ibvOpt.transport(*transportName) // ibv: --ibv (spead2_recv's flag) means --transport ibv
	if err != nil {
		return err
	}
	switch {
	case tr == "" && *pcapFile != "":
		tr = "pcap"
	case tr == "":
		tr = "udp"
	}
	hp, err := parseHugePages(*hugepages)
	if err != nil {
		return err
	}
	pol := ring.PolicyDrop
	if tr == "pcap" {
		pol = ring.PolicyBlock // replay: nothing need be lost, the file waits for the consumer
	}
	if *policy != "" {
		if pol, err = ring.ParsePolicy(*policy); err != nil {
			return usageError("--policy %q: want drop or block", *policy)
		}
	}
	var eps []transport.Endpoint
	for _, a := range pos {
		ep, err := transport.ParseEndpoint(a)
		if err != nil {
			return usageError("%v", err)
		}
		eps = append(eps, ep)
	}
	asmCfg := spead.AssemblerConfig{MaxHeaps: *maxHeaps, Incomplete: *incomplete, ChunkWindow: *chunkWindow, KeepGoing: *keepGoing}
	if *chunkPlace != "" { // loaded before anything is opened: a bad library leaves nothing behind
		plug, err := loadChunkPlace(*chunkPlace, *chunkPlaceArg, fs, placeItems, chunks)
		if err != nil {
			return err
		}
		defer plug.Close()
		asmCfg.ChunkPlace, asmCfg.ChunkPlaceItems = plug.Place, placeItems
	}
	var ifAddr netip.Addr
	if *iface != "" && tr != "xdp" { // AF_XDP also takes an interface name
		if ifAddr, err = netip.ParseAddr(*iface); err != nil || !ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", *iface)
		}
	}

	if *cpuProfile != "" { // before anything is opened: a bad path fails without leaving anything behind
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}

	// Signals are ours from before the ring exists: a SIGINT that arrives while it is being created must
	// still end in a clean stop, not the default exit that would leave the ring behind.
	notify, err := sdnotify.FromEnv() // $NOTIFY_SOCKET: under systemd (Type=notify) or a supervisor like it
	if err != nil {
		return err
	}
	defer notify.Close()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	// A log pipe whose reader went away (`recv ... 2>&1 | head`) must not kill the receiver and leave its
	// ring behind: writes to it fail with EPIPE instead, and the stream goes on until it is stopped.
	signal.Ignore(syscall.SIGPIPE)

	cfg := bridge.Config{Ring: *name,
		RingCfg: ring.Config{SlotCount: *slots, SlotSize: ringSlotSize, MaxItems: *maxItems, Policy: pol, HugePages: hp,
			Dir: *ringDir, Group: *group, MaxConsumers: *maxConsumers, MaxObservers: *maxObservers, ReplayTimestamps: tr == "pcap",
			Chunks: chunks, Groups: grants, Version: version.Producer("ibvbridge recv")},
		Assembler:    asmCfg,
		WaitConsumer: *waitConsumer, StatsInterval: *statsEvery, LossSummary: *lossSummary, Log: &log,
		Ready: func() {
			if err := notify.Send("READY=1\nSTATUS=receiving into ring " + *name); err != nil {
				log.Warn().Err(err).Msg("sd_notify READY")
			}
		},
		Tick: func(now time.Time) {
			if err := notify.Ping(now); err != nil {
				log.Warn().Err(err).Msg("sd_notify WATCHDOG")
			}
		}}
	switch tr {
	case "udp":
		if *pcapFile != "" {
			return usageError("--pcap replays a file: it does not go with --transport udp")
		}
		if len(eps) == 0 {
			return usageError("no endpoints: give host:port or port (or --pcap FILE)")
		}
		var cpuList []int
		if cpuList, err = parseCPUs(*cpus); err != nil {
			return err
		}
		if *threads < 1 || *threads > len(eps) {
			return usageError("--threads %d: want 1..%d (a thread owns whole endpoints; give more endpoints for more threads)", *threads, len(eps))
		}
		cfg.Source, err = udp.Open(udp.Config{Endpoints: eps, Interface: ifAddr, BufferSize: *buffer,
			MaxPacketSize: *maxPacket, GRO: *gro, Threads: *threads, CPUs: cpuList, Coalesce: coalesce.Max, CoalesceHeaps: coalesce.Heaps, Log: &log})
	case "pcap":
		if *pcapFile == "" {
			return usageError("--transport pcap needs --pcap FILE")
		}
		cfg.Source, err = pcap.Open(pcap.Config{Path: *pcapFile, Endpoints: eps, Paced: *paced, Log: &log})
	// Kernel-bypass transports receive into the ring's packet area: the pipeline opens them once the
	// ring exists.
	case "xdp":
		var xc xdp.Config
		if xc, err = xdpOpt.config(*iface, eps, &log); err == nil {
			cfg.AreaSource = xdp.AreaSource{Config: xc}
		}
	case "ibv": // transport_ibv.go: configuration and device checked here, before the ring exists
		cfg.AreaSource, err = newIBVSource(ibvOpt, pos, eps, *iface, *pcapFile)
	default:
		return usageError("--transport %q: want udp, pcap, xdp or ibv", tr)
	}
	if err != nil {
		return err
	}
	var collector *metrics.Collector
	if *metricsAddr != "" { // bound before the ring exists: a busy port leaves nothing behind
		collector = metrics.NewCollector(*name, tr)
		srv, err := metrics.Listen(*metricsAddr, collector, &log)
		if err != nil {
			closeSource(cfg.Source)
			return err
		}
		defer srv.Close()
	}
	rcv, err := bridge.Open(cfg)
	if err != nil {
		return err
	}
	defer rcv.Close()
	if collector != nil {
		collector.Attach(rcv)
	}
	p := rcv.Producer()
	ev := log.Info().Str("ring", *name).Str("transport", tr)
	if len(pos) > 0 {
		ev = ev.Strs("endpoints", pos)
	}
	if *pcapFile != "" { // only a replay has a file
		ev = ev.Str("file", *pcapFile)
	}
	if *chunkHeaps > 0 {
		ev = ev.Uint("chunk_heaps", *chunkHeaps)
	}
	if *keepGoing {
		ev = ev.Bool("keep_going", true)
	}
	ev.Str("version", version.Version).Int("slots", *slots).Int("slot_size", p.SlotSize()).Bool("hugepages", p.Huge()).
		Str("policy", pol.String()).Msg("receiving")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go stopOnSignals(sigs, cancel, rcv, &log)
	res, err := rcv.Run(ctx)
	_ = notify.Send("STOPPING=1")
	if err != nil {
		return err
	}
	// The stream's CPU ends here: closing a large ring frees its pages, seconds of it for gigabytes.
	cpu := proccpu.Used()
	res.Transport = tr
	if err := rcv.Close(); err != nil {
		log.Warn().Err(err).Msg("closing the ring")
	}
	if *logFormat == "json" {
		// cpu_seconds beside the result's fields: user + system, from the start to the stream's end.
		var out map[string]json.RawMessage
		b, err := json.Marshal(res)
		if err == nil {
			err = json.Unmarshal(b, &out)
		}
		if err != nil {
			return err
		}
		out["cpu_seconds"] = json.RawMessage(strconv.FormatFloat(cpu.Seconds(), 'f', 6, 64))
		if err := json.NewEncoder(stdout).Encode(out); err != nil {
			return err
		}
	} else {
		ev := log.Info().Str("result", string(res.Outcome)).Float64("seconds", res.Seconds)
		for _, c := range ring.Counters() {
			ev = ev.Uint64(c.String(), res.RingCounters[c.String()])
		}
		if chunks.Enabled() {
			ev = ev.Uint64("chunk_rebases", res.ChunkRebases)
		}
		ev.Interface("transport", res.TransportCounters).Msg("stopped")
	}
	if res.Outcome == bridge.OutcomeError {
		return &exitError{code: 1}
	}
	return nil
}

// chunkGeometry checks recv's chunk flags and returns the ring's chunk geometry (the zero value: chunk
// mode off, and then no other chunk flag may be given). With --chunk-place (placeItems: its items) the
// function places the heaps: --chunk-by is optional and, like --chunk-axis's item, only labels the header's
// time item (default: the first --chunk-place-items item, else the heap cnt 0x1).
func chunkGeometry(fs *flag.FlagSet, heaps uint, by, axis string, heapSize, window, slots int, placeItems []uint64) (ring.ChunkGeometry, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	place := set["chunk-place"]
	if heaps == 0 {
		for _, n := range []string{"chunk-by", "chunk-axis", "chunk-window", "chunk-heap-size", "chunk-place"} {
			if set[n] {
				return ring.ChunkGeometry{}, usageError("--%s goes with --chunk-heaps N", n)
			}
		}
		return ring.ChunkGeometry{}, nil
	}
	if set["slot-size"] {
		return ring.ChunkGeometry{}, usageError("--slot-size does not go with --chunk-heaps: a slot holds one chunk, its size follows from the chunk")
	}
	if heaps > math.MaxUint32 {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps %d: want 1..%d", heaps, uint32(math.MaxUint32))
	}
	if by == "" && !place {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps needs --chunk-by ITEM[:STEP] (the item that gives a heap's time) or --chunk-place LIB.so:FUNCTION")
	}
	if heapSize < 1 {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps needs --chunk-heap-size SIZE (the bytes of one heap position)")
	}
	if window < 1 || window > slots/2 {
		return ring.ChunkGeometry{}, usageError("--chunk-window %d: want 1..%d (half the --slots %d: each open chunk holds a slot, consumers hold the rest)", window, max(slots/2, 1), slots)
	}
	g := ring.ChunkGeometry{Heaps: uint32(heaps), Axis: 1, HeapSize: uint64(heapSize)}
	var err error
	switch {
	case by != "":
		if g.TimeItem, g.Step, err = parseItemValue("chunk-by", by, 1); err != nil {
			return g, err
		}
	case len(placeItems) > 0:
		g.TimeItem, g.Step = placeItems[0], 1
	default:
		g.TimeItem, g.Step = spead.HeapCntID, 1
	}
	if axis != "" {
		var count uint64
		if g.AxisItem, count, err = parseItemValue("chunk-axis", axis, 0); err != nil {
			return g, err
		}
		if count > math.MaxUint32 || g.AxisItem == g.TimeItem {
			return g, usageError("--chunk-axis %q: want another item than --chunk-by's, and COUNT at most %d", axis, uint32(math.MaxUint32))
		}
		g.Axis = uint32(count)
	}
	if _, ok := g.SlotBytes(); !ok {
		return g, usageError("a chunk of %d × %d heaps of %d bytes is too large", g.Heaps, g.Axis, g.HeapSize)
	}
	return g, nil
}

// parseChunkPlaceItems checks that --chunk-place-items and --chunk-place-arg come with --chunk-place and
// returns the items: ID,ID,... (at most spead.MaxChunkPlaceItems).
func parseChunkPlaceItems(place, items string, fs *flag.FlagSet) ([]uint64, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if place == "" {
		for _, n := range []string{"chunk-place-items", "chunk-place-arg"} {
			if set[n] {
				return nil, usageError("--%s goes with --chunk-place LIB.so:FUNCTION", n)
			}
		}
		if set["chunk-place"] {
			return nil, usageError("--chunk-place \"\": want LIB.so:FUNCTION")
		}
		return nil, nil
	}
	if items == "" {
		return nil, nil
	}
	var ids []uint64
	for _, f := range strings.Split(items, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 0, 64)
		if err != nil || id == 0 {
			return nil, usageError("--chunk-place-items %q: want item ids such as 0x1600,0x4101", items)
		}
		ids = append(ids, id)
	}
	if len(ids) > spead.MaxChunkPlaceItems {
		return nil, usageError("--chunk-place-items: %d items, at most %d", len(ids), spead.MaxChunkPlaceItems)
	}
	return ids, nil
}

// loadChunkPlace loads --chunk-place's function; a spec, library or function that is wrong is a usage error.
func loadChunkPlace(spec, arg string, fs *flag.FlagSet, items []uint64, g ring.ChunkGeometry) (*chunkplace.Plugin, error) {
	path, sym, err := chunkplace.ParseSpec(spec)
	if err != nil {
		return nil, usageError("--chunk-place %v", err)
	}
	hasArg := false
	fs.Visit(func(f *flag.Flag) { hasArg = hasArg || f.Name == "chunk-place-arg" })
	plug, err := chunkplace.Open(chunkplace.Spec{Path: path, Symbol: sym, Arg: arg, HasArg: hasArg, Items: items, Geometry: g})
	if err != nil {
		return nil, usageError("--chunk-place %s: %v", spec, err)
	}
	return plug, nil
}

// stopOnSignals turns the first SIGINT/SIGTERM into a clean stop (cancel), and a second into an exit at
// once, after closing the ring so that nothing is left behind.
func stopOnSignals(sigs <-chan os.Signal, cancel context.CancelFunc, rcv *bridge.Receiver, log *zerolog.Logger) {
	s, ok := <-sigs
	if !ok {
		return
	}
	log.Info().Str("signal", s.String()).Msg("stopping")
	cancel()
	if s, ok = <-sigs; !ok {
		return
	}
	log.Warn().Str("signal", s.String()).Msg("second signal: exiting at once")
	rcv.Close()
	os.Exit(1)
}

// closeSource closes a source that was opened but never handed to the pipeline (nil for kernel-bypass
// sources, which open later).
func closeSource(s transport.Source) {
	if s != nil {
		s.Close()
	}
}

// startCPUProfile writes a CPU profile to path until the returned function is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func parseHugePages(s string) (ring.HugePages, error) {
	switch s {
	case "auto":
		return ring.HugePagesAuto, nil
	case "require":
		return ring.HugePagesRequire, nil
	case "off":
		return ring.HugePagesOff, nil
	}
	return 0, usageError("--hugepages %q: want auto, require or off", s)
}
