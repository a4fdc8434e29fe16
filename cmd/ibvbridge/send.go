package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/relay"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
	"github.com/ibvbridge/ibvbridge/verbs"
)

// Defaults of send that fit recv's (recv.go): 1 MiB heaps fit a default 2 MiB slot, and 1 Gb/s is a pace
// a default recv (8 MiB socket buffer) takes on loopback without loss, where an unpaced send of 1000 heaps
// lost 41 % of them (measured on a loaded 2-core machine; 2 Gb/s still lost none there).
const defaultSendRate = 1.0

func runSend(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("send", stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ibvbridge send HOST:PORT [HOST:PORT...] [flags]   (heap k to destination (k-1) mod N, as spead2_send)\n       ibvbridge send --ring NAME HOST:PORT [flags]   (transmit a ring's heaps)")
		fs.PrintDefaults()
	}
	heapSize := sizeFlag(fs, "heap-size", 1<<20, "payload bytes per heap (suffixes K, M, G); the default fits recv's default --slot-size (2M)")
	heaps := fs.Uint64("heaps", 1000, "data heaps to send, heap cnts 1..N, then a stream-stop heap")
	rate := fs.Float64("rate", defaultSendRate, "send rate in Gb/s of UDP payload (0: as fast as possible); the default is a pace recv's default socket buffer takes on loopback; with --ring the default is 0 (the ring's own pace)")
	flavourName := fs.String("flavour", "64-40", "SPEAD flavour: 64-40 or 64-48")
	packetSize := sizeFlag(fs, "packet-size", 1472, "largest UDP payload (spead2_send's --packet)")
	items := fs.Int("items", 1, "split each heap's payload into N items, ids 0x1000+i")
	descriptors := fs.Bool("descriptors", false, "put item descriptors in the first heap, as spead2_send does")
	ttl := fs.Int("ttl", 0, "IP TTL (multicast TTL for a group; 0: kernel default)")
	iface := fs.String("interface", "", "local IPv4 address of the interface multicast leaves by (xdp: the interface's name or address)")
	withPattern := fs.Bool("pattern", false, "payload = the ring test pattern, plus immediate item 0x1001 \"heap_cnt\" = heap cnt (for consume --verify)")
	timestamp := fs.Bool("timestamp", false, "add immediate item 0x1600 \"timestamp\" = (heap cnt - 1) x heap size, a sample counter (docs/how-to/migrate-from-spead2.md)")
	batch := fs.Int("batch", 64, "packets per sendmmsg call (xdp: per TX-ring publish and kick)")
	gso := fs.Bool("gso", true, "udp: send runs of full-size packets as one message the kernel segments (UDP GSO); --gso=false: a syscall slot per packet")
	noStop := fs.Bool("no-stop", false, "leave the stream open: no stream-stop heap at the end (tests)")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object")
	transportName := fs.String("transport", "", "udp (sockets, the default), xdp (raw frames through AF_XDP: --interface NAME|ADDR) or ibv (raw frames through an RDMA NIC)")
	ibvOpt := addIBVFlags(fs, true) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	ringName := fs.String("ring", "", "transmit the heaps of this ring, as its consumer, instead of a generated stream; the stream stops when the ring ends")
	incomplete := fs.Bool("incomplete", false, "with --ring: also send heaps the ring holds incomplete or truncated (default: skip and count them)")
	threads := fs.Int("threads", 1, "udp: sending threads, each with its own sockets and a share of the destinations (at most one per destination; name a destination twice to give it two)")
	tsStep := fs.Uint64("timestamp-step", 0, "give heap k (from 1) the immediate --timestamp-item = (k-1)/COUNT × STEP (COUNT of --axis, else 1): traffic for recv --chunk-by (0: none)")
	tsItem := fs.String("timestamp-item", "0x1600", "the timestamp item's id, with --timestamp-step")
	axis := fs.String("axis", "", "ITEM:COUNT: with --timestamp-step, give heap k the immediate ITEM = (k-1) mod COUNT (recv --chunk-axis)")
	waitRing := fs.String("wait-ring", "", "before sending, wait until this ring is served and has --wait-consumers consumers attached (a receiver and its consumers started just before)")
	waitConsumers := fs.Int("wait-consumers", 1, "with --wait-ring: consumers that must be attached")
	waitTimeout := fs.Duration("wait-timeout", time.Minute, "with --wait-ring: how long to wait")
	waitDir := fs.String("wait-dir", "", "with --wait-ring: the ring directory to look the name up in (default: the usual lookup)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	var chunkItems *pattern.ChunkItems
	if *tsStep > 0 {
		ci := pattern.ChunkItems{Step: *tsStep}
		if ci.TimeItem, _, err = parseItemValue("timestamp-item", *tsItem, 1); err != nil {
			return err
		}
		if *axis != "" {
			if ci.AxisItem, ci.AxisCount, err = parseItemValue("axis", *axis, 0); err != nil {
				return err
			}
		}
		chunkItems = &ci
	} else if *axis != "" {
		return usageError("--axis goes with --timestamp-step")
	}
	if *ringName != "" { // the generator's flags describe a stream --ring does not generate
		rateSet := false
		fs.Visit(func(f *flag.Flag) { rateSet = rateSet || f.Name == "rate" })
		if !rateSet {
			*rate = 0 // a relay sends at the pace its ring fills
		}
		var conflict string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "heap-size", "heaps", "items", "descriptors", "pattern", "timestamp", "timestamp-step", "axis":
				conflict = f.Name
			}
		})
		if conflict != "" {
			return usageError("--%s describes a generated stream: it does not go with --ring", conflict)
		}
	} else if *incomplete {
		return usageError("--incomplete goes with --ring")
	}
	if *waitRing == "" && (*waitDir != "" || *waitConsumers != 1) {
		return usageError("--wait-dir and --wait-consumers go with --wait-ring")
	}
	if *waitConsumers < 0 || *waitTimeout <= 0 {
		return usageError("--wait-consumers must be ≥ 0 and --wait-timeout positive")
	}
	if len(pos) == 0 || (*ringName != "" && len(pos) != 1) {
		return usageError("want exactly one destination HOST:PORT with --ring, one or more without, got %d (see -h)", len(pos))
	}
	eps := make([]transport.Endpoint, len(pos))
	for i, a := range pos {
		if eps[i], err = transport.ParseEndpoint(a); err != nil {
			return usageError("%v", err)
		}
		if !eps[i].Addr.IsValid() {
			eps[i].Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	ep := eps[0]
	if *threads < 1 || *threads > len(eps) {
		return usageError("--threads %d: want 1..%d, at most one per destination (name a destination twice to give it two)", *threads, len(eps))
	}
	var flavour spead.Flavour
	switch strings.TrimPrefix(strings.ToUpper(*flavourName), "SPEAD-") {
	case "64-40":
		flavour = spead.Flavour64_40
	case "64-48":
		flavour = spead.Flavour64_48
	default:
		return usageError("--flavour %q: want 64-40 or 64-48", *flavourName)
	}
	switch {
	case *heapSize < 1:
		return usageError("--heap-size must be positive")
	case *heaps < 1:
		return usageError("--heaps must be positive")
	case !(*rate >= 0) || math.IsInf(*rate, 0): // NaN fails the first test
		return usageError("--rate %g: want Gb/s >= 0", *rate)
	case *items < 1 || *items > *heapSize:
		return usageError("--items %d: want 1..heap size", *items)
	case *packetSize > 65507:
		return usageError("--packet-size %d: a UDP payload is at most 65507 bytes", *packetSize)
	case *batch < 1 || *batch > 1024:
		return usageError("--batch %d: want 1..1024", *batch)
	case *ttl < 0 || *ttl > 255:
		return usageError("--ttl %d: want 0..255", *ttl)
	}
	var ifAddr netip.Addr
	if *iface != "" && *transportName != "xdp" { // AF_XDP also takes an interface name
		if ifAddr, err = netip.ParseAddr(*iface); err != nil || !ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", *iface)
		}
	}
	enc, err := spead.NewEncoder(flavour, *packetSize)
	if err != nil {
		return usageError("--packet-size %d: %v", *packetSize, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tr, err := ibvOpt.transport(*transportName) // ibv: --ibv (spead2_send's flag) means --transport ibv
	if err != nil {
		return err
	}
	// One sender per destination, each paced at its share of the rate (it carries 1/N of the heaps).
	senders := make([]transport.HeapSender, 0, len(eps))
	defer func() {
		for _, hs := range senders {
			hs.Close()
		}
	}()
	for i, e := range eps {
		if i > 0 { // an encoder is one sender's: it keeps the heap it is packetizing
			enc, _ = spead.NewEncoder(flavour, *packetSize)
		}
		var hs transport.HeapSender
		switch tr {
		case "", "udp":
			hs, err = udp.OpenHeapSender(udp.HeapSenderConfig{Encoder: enc, Batch: *batch, Rate: *rate * 1e9 / float64(len(eps)), GSO: *gso,
				SenderConfig: udp.SenderConfig{Dest: netip.AddrPortFrom(e.Addr, e.Port), Interface: ifAddr, TTL: *ttl}})
		case "xdp": // transport_xdp.go: frames built straight into AF_XDP UMEM frames
			if len(eps) > 1 {
				return usageError("--transport xdp sends to one destination (one AF_XDP socket per TX queue)")
			}
			hs, err = openXDPHeapSender(*iface, e, *ttl, *rate, *batch, enc)
		case "ibv": // transport_ibv.go: frames built straight into the NIC's registered buffers
			if len(eps) > 1 {
				return usageError("--transport ibv sends to one destination")
			}
			var cfg verbs.SendConfig
			if cfg, err = ibvOpt.sendConfig(pos[0], ep, *iface, *ttl, *packetSize, *rate); err == nil {
				hs, err = newIBVHeapSender(cfg, enc)
			}
		default:
			return usageError("--transport %q: want udp, xdp or ibv", tr)
		}
		if err != nil {
			return err
		}
		senders = append(senders, hs)
	}
	if *waitRing != "" {
		if err := waitForRing(ctx, *waitRing, *waitDir, *waitConsumers, *waitTimeout); err != nil {
			return fmt.Errorf("--wait-ring: %w", err)
		}
	}
	res := bench.SendResult{}
	if *ringName != "" {
		if res.Heaps, res.SkippedIncomplete, err = sendRing(ctx, *ringName, senders[0], relay.Config{Incomplete: *incomplete, NoStop: *noStop, Flavour: flavour}); err != nil {
			return err
		}
	} else {
		lanes := make([]transport.Lane, *threads)
		for d, hs := range senders { // destination d is lane d mod threads's
			l := &lanes[d%*threads]
			l.Dests, l.Senders = append(l.Dests, d), append(l.Senders, hs)
		}
		for i := range lanes {
			g, err := pattern.NewHeapGenOptions(flavour, *heapSize, *items,
				pattern.Options{Pattern: *withPattern, Descriptors: *descriptors, Timestamp: *timestamp})
			if err != nil {
				return err
			}
			if chunkItems != nil {
				if err := g.SetChunkItems(*chunkItems); err != nil {
					return usageError("--timestamp-step/--axis: %v", err)
				}
			}
			lanes[i].Heap = g.Heap
		}
		if res.Heaps, err = transport.SendSpread(ctx, lanes, len(senders), *heaps, !*noStop); err != nil {
			return err
		}
	}
	tot := sumTotals(senders)
	res.Packets, res.Bytes = tot.Packets, tot.Bytes
	res.Seconds = time.Since(tot.Start).Seconds()
	res.Gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
	res.HeapsPS = float64(res.Heaps) / res.Seconds
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "sent %d heaps, %d packets, %d bytes in %.3f s: %.3f Gb/s, %.0f heaps/s\n",
		res.Heaps, res.Packets, res.Bytes, res.Seconds, res.Gbps, res.HeapsPS)
	if res.SkippedIncomplete > 0 {
		fmt.Fprintf(stdout, "skipped %d incomplete or truncated heaps of the ring (--incomplete sends them)\n", res.SkippedIncomplete)
	}
	return nil
}

// sumTotals adds up what several senders sent, from the first one's start.
func sumTotals(senders []transport.HeapSender) transport.SendTotals {
	var t transport.SendTotals
	for _, hs := range senders {
		st := hs.Totals()
		t.Packets += st.Packets
		t.Bytes += st.Bytes
		if t.Start.IsZero() || st.Start.Before(t.Start) {
			t.Start = st.Start
		}
	}
	return t
}

// sendRing transmits ring name through hs (relay.Run) until the ring ends or ctx is cancelled.
func sendRing(ctx context.Context, name string, hs transport.HeapSender, cfg relay.Config) (heaps, skipped uint64, err error) {
	c, err := ring.Attach(name, ring.AttachOptions{Timeout: 10 * time.Second})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if _, chunks := c.Chunks(); chunks {
		return 0, 0, usageError("ring %s is in chunk mode: send --ring relays rings of heaps (a chunk's heaps lost their items)", name)
	}
	res, err := relay.Run(ctx, c, hs, cfg)
	return res.Heaps, res.SkippedIncomplete, err
}
