package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/pcap"
	"github.com/ibvbridge/ibvbridge/transport/udp"
	"github.com/ibvbridge/ibvbridge/transport/xdp"
)

// Defaults of recv. The slot holds one heap: 2 MiB takes spead2's common 1 MiB heaps with their first
// heap's descriptors, and 256 of them (512 MiB) fit the 512 hugepages scripts/setup.sh reserves.
const (
	defaultSlots    = 256
	defaultSlotSize = 2 << 20
	minSlotSize     = 1 << 10
)

// recvSource is what recv needs of a transport besides transport.Source: its counters.
type recvSource interface {
	transport.Source
	counters() map[string]uint64
}

type udpSource struct{ *udp.Source }

func (s udpSource) counters() map[string]uint64 { return s.Stats().Map() }

type pcapSource struct{ *pcap.Source }

func (s pcapSource) counters() map[string]uint64 { return s.Stats().Map() }

// recvResult is the final counters object `recv --log-format json` prints on stdout as its last line:
// the ring's counters at the top level (the spec's names), the transport's under "transport_counters".
type recvResult struct {
	Ring              string            `json:"ring"`
	Transport         string            `json:"transport"`
	Result            string            `json:"result"` // stream_stop, end_of_input, interrupted, error
	Seconds           float64           `json:"seconds"`
	TransportCounters map[string]uint64 `json:"transport_counters"`
	MalformedBy       map[string]uint64 `json:"malformed_by_reason,omitempty"`
	PacketsAfterStop  uint64            `json:"packets_after_stop"`
	ring              map[string]uint64
}

func (r recvResult) MarshalJSON() ([]byte, error) {
	type plain recvResult
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range r.ring {
		m[k] = v
	}
	return json.Marshal(m)
}

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
	hugepages := fs.String("hugepages", "auto", "ring data on hugepages: auto, require or off")
	transportName := fs.String("transport", "", "udp, pcap, xdp or ibv (default udp, or pcap with --pcap)")
	xdpOpt := addXDPFlags(fs)
	ibvOpt := addIBVFlags(fs, false) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	logFormat := fs.String("log-format", "console", "console or json (json: final counters as one JSON object on stdout)")
	statsEvery := fs.Duration("stats-interval", 0, "log the counters this often (0: off)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	waitConsumer := fs.Duration("wait-consumer", 0, "wait up to this long for a consumer to attach before receiving (file replay into a reader)")
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
	if *maxHeaps < 1 || *maxHeaps > *slots {
		return usageError("--max-heaps %d: want 1..%d (every heap under assembly holds a slot)", *maxHeaps, *slots)
	}
	if *maxPacket < 64 || *maxPacket > 65535 {
		return usageError("--max-packet %d: want 64..65535", *maxPacket)
	}
	if *buffer < 0 {
		return usageError("--buffer %d: want a size in bytes", *buffer)
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
	switch *policy {
	case "":
		if tr == "pcap" {
			pol = ring.PolicyBlock // replay: nothing need be lost, the file waits for the consumer
		}
	case "drop":
	case "block":
		pol = ring.PolicyBlock
	default:
		return usageError("--policy %q: want drop or block", *policy)
	}
	var eps []transport.Endpoint
	for _, a := range pos {
		ep, err := transport.ParseEndpoint(a)
		if err != nil {
			return usageError("%v", err)
		}
		eps = append(eps, ep)
	}
	var ifAddr netip.Addr
	if *iface != "" && tr != "xdp" { // AF_XDP also takes an interface name
		if ifAddr, err = netip.ParseAddr(*iface); err != nil || !ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", *iface)
		}
	}

	// Signals are ours from before the ring exists: a SIGINT that arrives while it is being created must
	// still end in a clean stop, not the default exit that would leave the ring behind.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var src recvSource
	var packetArea int                                 // bytes of the ring's data file a transport writes frames into
	var openAfterRing func([]byte) (recvSource, error) // a transport that needs that area
	switch tr {
	case "udp":
		if *pcapFile != "" {
			return usageError("--pcap replays a file: it does not go with --transport udp")
		}
		if len(eps) == 0 {
			return usageError("no endpoints: give host:port or port (or --pcap FILE)")
		}
		s, err := udp.Open(udp.Config{Endpoints: eps, Interface: ifAddr, BufferSize: *buffer,
			MaxPacketSize: *maxPacket, Log: &log})
		if err != nil {
			return err
		}
		src = udpSource{s}
	case "pcap":
		if *pcapFile == "" {
			return usageError("--transport pcap needs --pcap FILE")
		}
		s, err := pcap.Open(pcap.Config{Path: *pcapFile, Endpoints: eps, Paced: *paced})
		if err != nil {
			return err
		}
		src = pcapSource{s}
	// Kernel-bypass transports: each is a transport.Source over frames it parses with frame, written by
	// the NIC or kernel into the ring's packet area, so they open once the ring exists (openAfterRing).
	case "xdp":
		cfg, err := xdpOpt.config(*iface, eps, &log)
		if err != nil {
			return err
		}
		packetArea = xdp.RequiredUMEM(cfg)
		openAfterRing = func(area []byte) (recvSource, error) {
			s, err := xdp.Open(cfg, area)
			if err != nil {
				return nil, err
			}
			return xdpSource{s}, nil
		}
	case "ibv": // transport_ibv.go: config and device checked here, the receiver opened on the packet area
		s, err := newIBVSource(ibvOpt, pos, eps, *iface, *pcapFile)
		if err != nil {
			return err
		}
		packetArea, openAfterRing = s.AreaSize(), func(area []byte) (recvSource, error) {
			src, err := s.Open(area)
			if err != nil {
				return nil, err
			}
			return ibvRecvSource{src}, nil
		}
	default:
		return usageError("--transport %q: want udp, pcap, xdp or ibv", tr)
	}
	if src != nil {
		defer src.Close()
	}

	p, err := ring.Create(*name, ring.Config{SlotCount: *slots, SlotSize: *slotSize, MaxItems: *maxItems,
		Policy: pol, HugePages: hp, PacketArea: packetArea, Log: &log})
	if err != nil {
		if errors.Is(err, ring.ErrInUse) {
			return fmt.Errorf("%w: another recv owns ring %q; pick another --ring name", err, *name)
		}
		return err
	}
	defer p.Close()
	if openAfterRing != nil {
		if src, err = openAfterRing(p.PacketArea()); err != nil {
			return err
		}
		defer src.Close()
	}
	asm, err := spead.NewAssembler(p, spead.AssemblerConfig{MaxHeaps: *maxHeaps, Incomplete: *incomplete, Log: &log})
	if err != nil {
		return err
	}
	log.Info().Str("ring", *name).Str("transport", tr).Strs("endpoints", pos).Str("file", *pcapFile).
		Int("slots", *slots).Int("slot_size", p.SlotSize()).Bool("hugepages", p.Huge()).
		Str("policy", policyName(pol)).Msg("receiving")

	if *waitConsumer > 0 {
		deadline := time.Now().Add(*waitConsumer)
		for !p.ConsumerAttached() {
			if time.Now().After(deadline) {
				return fmt.Errorf("no consumer attached to ring %q within %v (--wait-consumer)", *name, *waitConsumer)
			}
			time.Sleep(10 * time.Millisecond)
		}
		log.Info().Msg("consumer attached")
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res := receive(p, asm, src, pol, sigs, *statsEvery, &log)
	res.Ring, res.Transport = *name, tr
	for r, n := range asm.MalformedByReason() {
		if n > 0 {
			if res.MalformedBy == nil {
				res.MalformedBy = map[string]uint64{}
			}
			res.MalformedBy[spead.Reason(r).String()] = n
		}
	}
	if pol == ring.PolicyBlock && res.Result != "interrupted" && res.Result != "error" {
		waitForConsumer(p, sigs, &log) // block policy: closing now would take unread heaps with it
	}
	res.PacketsAfterStop = asm.PacketsAfterStop()
	res.ring = p.Stats().Map()
	res.TransportCounters = src.counters()
	if err := p.Close(); err != nil {
		log.Warn().Err(err).Msg("closing the ring")
	}
	if *logFormat == "json" {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return err
		}
	} else {
		ev := log.Info().Str("result", res.Result).Float64("seconds", res.Seconds)
		for _, c := range ring.Counters() {
			ev = ev.Uint64(c.String(), res.ring[c.String()])
		}
		ev.Interface("transport", res.TransportCounters).Msg("stopped")
	}
	if res.Result == "error" {
		return &exitError{code: 1}
	}
	return nil
}

// receive runs the source into the assembler until the stream stops, the input ends, a signal arrives or
// the source fails; then it finishes the stream in the ring. Only the source goroutine touches the
// assembler while the source runs; the rest happens after it has returned.
func receive(p *ring.Producer, asm *spead.Assembler, src recvSource, pol ring.Policy, sigs <-chan os.Signal,
	statsEvery time.Duration, log *zerolog.Logger) recvResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srcDone := make(chan error, 1)
	start := time.Now()
	go func() { srcDone <- src.Run(ctx, asm) }()
	var tick <-chan time.Time
	if statsEvery > 0 {
		t := time.NewTicker(statsEvery)
		defer t.Stop()
		tick = t.C
	}
	var res recvResult
	var runErr error
	signalled := false
wait:
	for {
		select {
		case <-asm.Done():
			res.Result = "stream_stop"
			cancel()
			runErr = <-srcDone
			break wait
		case runErr = <-srcDone:
			res.Result = "end_of_input"
			break wait
		case s := <-sigs:
			if signalled {
				log.Warn().Str("signal", s.String()).Msg("second signal: exiting at once")
				p.Close()
				os.Exit(1)
			}
			signalled = true
			log.Info().Str("signal", s.String()).Msg("stopping")
			res.Result = "interrupted"
			cancel()
			if pol == ring.PolicyBlock {
				p.Interrupt() // a heap waiting for a slot gives up, so the source returns
			}
			select {
			case runErr = <-srcDone:
			case <-time.After(5 * time.Second):
				// The source still owns the assembler: leave the stream as it is; Close ends it.
				log.Error().Msg("the source did not stop within 5 s")
				res.Result, res.Seconds = "error", time.Since(start).Seconds()
				return res
			}
			break wait
		case <-tick:
			logStats(log, p, src)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		log.Error().Err(runErr).Msg("receive failed")
		res.Result = "error"
	}
	select {
	case <-asm.Done():
		if res.Result != "error" {
			res.Result = "stream_stop" // the stop packet raced a signal or the end of the file
		}
	default:
		// The input ended without a stream stop: publish what is live and tell consumers the stream is over.
		asm.Flush()
		timeout := time.Second
		if pol == ring.PolicyBlock && res.Result == "end_of_input" {
			timeout = time.Minute // a replay waits for its consumer to make room, as it did all along
		}
		if err := p.PublishEndOfStream(timeout); err != nil {
			log.Warn().Err(err).Msg("no slot for the end-of-stream marker; closing the ring ends the stream")
		}
	}
	return res
}

// waitForConsumer keeps the ring open until the attached consumer has released every heap (block policy:
// closing would take unread heaps with it), until it detaches, or until a signal says stop. With no
// consumer attached there is nobody to wait for: the unread heaps are reported and recv exits.
func waitForConsumer(p *ring.Producer, sigs <-chan os.Signal, log *zerolog.Logger) {
	if p.Unread() == 0 {
		return
	}
	if p.ConsumerAttached() {
		log.Info().Uint64("unread_heaps", p.Unread()).Msg("input done; waiting for the consumer to read the ring (Ctrl-C to stop)")
	}
	stop, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sigs:
			close(stop)
		case <-done:
		}
	}()
	if err := p.WaitDrained(stop); err != nil {
		log.Warn().Uint64("unread_heaps", p.Unread()).Str("reason", err.Error()).Msg("closing the ring with heaps no consumer read")
	}
}

func logStats(log *zerolog.Logger, p *ring.Producer, src recvSource) {
	st := p.Stats()
	ev := log.Info()
	for _, c := range ring.Counters() {
		if c != ring.CounterEndOfStream {
			ev = ev.Uint64(c.String(), st.Get(c))
		}
	}
	ev.Interface("transport", src.counters()).Msg("stats")
}

func policyName(p ring.Policy) string {
	if p == ring.PolicyBlock {
		return "block"
	}
	return "drop"
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

// parseInterspersed parses flags that may come before, between or after positional arguments
// (`send HOST:PORT --heaps 10`), returning the positionals in order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at "--" (consumed, everything after is positional) or at the first non-flag.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// byteSize is a flag holding a byte count written as 4096, 64K, 4M, 1G (binary multiples) or 4MiB.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseByteSize(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "IB"), "B")
	mult := 1
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/int64(mult) {
		return 0, fmt.Errorf("%q is not a byte count (e.g. 4096, 64K, 4M)", s)
	}
	return int(n) * mult, nil
}

func sizeFlag(fs *flag.FlagSet, name string, def int, usage string) *int {
	b := byteSize(def)
	fs.Var(&b, name, usage)
	return (*int)(&b)
}
