package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// sendResult is the summary `send --json` prints.
type sendResult struct {
	Heaps   uint64  `json:"heaps"`
	Packets uint64  `json:"packets"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Gbps    float64 `json:"gbps"`
	HeapsPS float64 `json:"heaps_per_s"`
}

func runSend(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("send", stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ibvbridge send HOST:PORT [flags]")
		fs.PrintDefaults()
	}
	heapSize := sizeFlag(fs, "heap-size", 4<<20, "payload bytes per heap (suffixes K, M, G)")
	heaps := fs.Uint64("heaps", 1000, "data heaps to send, heap cnts 1..N, then a stream-stop heap")
	rate := fs.Float64("rate", 0, "send rate in Gb/s of UDP payload (0: as fast as possible)")
	flavourName := fs.String("flavour", "64-40", "SPEAD flavour: 64-40 or 64-48")
	packetSize := sizeFlag(fs, "packet-size", 1472, "largest UDP payload (spead2_send's --packet)")
	items := fs.Int("items", 1, "split each heap's payload into N items, ids 0x1000+i")
	descriptors := fs.Bool("descriptors", false, "put item descriptors in the first heap, as spead2_send does")
	ttl := fs.Int("ttl", 0, "IP TTL (multicast TTL for a group; 0: kernel default)")
	iface := fs.String("interface", "", "local IPv4 address of the interface multicast leaves by")
	pattern := fs.Bool("pattern", false, "payload = the ring test pattern, plus immediate item 0x1001 = heap cnt (for consume --verify)")
	batch := fs.Int("batch", 64, "packets per sendmmsg call")
	noStop := fs.Bool("no-stop", false, "leave the stream open: no stream-stop heap at the end (tests)")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object")
	transportName := fs.String("transport", "", "udp (sockets, the default) or ibv (raw frames through an RDMA NIC)")
	ibvOpt := addIBVFlags(fs, true) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("want exactly one destination HOST:PORT, got %d (see -h)", len(pos))
	}
	ep, err := transport.ParseEndpoint(pos[0])
	if err != nil {
		return usageError("%v", err)
	}
	if !ep.Addr.IsValid() {
		ep.Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
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
	case *rate < 0:
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
	if *iface != "" {
		if ifAddr, err = netip.ParseAddr(*iface); err != nil || !ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", *iface)
		}
	}
	enc, err := spead.NewEncoder(flavour, *packetSize)
	if err != nil {
		return usageError("--packet-size %d: %v", *packetSize, err)
	}
	g, err := newHeapGen(flavour, *heapSize, *items, *pattern, *descriptors)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tr, err := ibvOpt.transport(*transportName) // ibv: --ibv (spead2_send's flag) means --transport ibv
	if err != nil {
		return err
	}
	var ps heapSender
	switch tr {
	case "", "udp":
		s, err := udp.NewSender(udp.SenderConfig{Dest: netip.AddrPortFrom(ep.Addr, ep.Port), Interface: ifAddr, TTL: *ttl})
		if err != nil {
			return err
		}
		defer s.Close()
		ps = newPacketSender(s, enc, *batch, *rate)
	case "ibv": // transport_ibv.go: frames built straight into the NIC's registered buffers
		cfg, err := ibvOpt.sendConfig(pos[0], ep, *iface, *ttl, *packetSize, *rate)
		if err != nil {
			return err
		}
		hs, err := newIBVHeapSender(cfg, enc)
		if err != nil {
			return err
		}
		defer hs.Close()
		ps = transportHeapSender{ctx, hs}
	default:
		return usageError("--transport %q: want udp or ibv", tr)
	}
	res := sendResult{}
	for cnt := uint64(1); cnt <= *heaps && ctx.Err() == nil; cnt++ {
		if err := ps.heap(g.heap(cnt)); err != nil {
			return err
		}
		res.Heaps++
	}
	if !*noStop {
		stopHeap := spead.StreamStopHeap(*heaps + 1)
		if err := ps.heap(&stopHeap); err != nil {
			return err
		}
	}
	if err := ps.flush(); err != nil {
		return err
	}
	var start time.Time
	res.Packets, res.Bytes, start = ps.totals()
	res.Seconds = time.Since(start).Seconds()
	res.Gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
	res.HeapsPS = float64(res.Heaps) / res.Seconds
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "sent %d heaps, %d packets, %d bytes in %.3f s: %.3f Gb/s, %.0f heaps/s\n",
		res.Heaps, res.Packets, res.Bytes, res.Seconds, res.Gbps, res.HeapsPS)
	return nil
}

// heapGen builds the heaps of a generated stream, reusing one Heap and one payload buffer.
type heapGen struct {
	payload []byte
	h       spead.Heap
	first   spead.Heap // heap 1 when it also carries descriptors
	pattern bool
}

func newHeapGen(f spead.Flavour, heapSize, nItems int, pattern, descriptors bool) (*heapGen, error) {
	g := &heapGen{payload: make([]byte, heapSize), pattern: pattern}
	if pattern {
		g.h.Items = append(g.h.Items, spead.Item{ID: ringtest.CntItemID, Immediate: true})
	} else {
		ringtest.FillPattern(g.payload, 0) // fixed, recognisable bytes
	}
	var descs []spead.Descriptor
	if pattern {
		descs = append(descs, spead.Descriptor{ID: ringtest.CntItemID, Name: "heap_cnt",
			Description: "the heap's cnt (test pattern)", Format: []spead.FormatField{{Code: 'u', Bits: uint64(f)}}, Flavour: f})
	}
	off := 0
	for i := range nItems {
		size := heapSize / nItems
		if i == nItems-1 {
			size = heapSize - off
		}
		id := uint64(ringtest.PayloadItemID + i)
		if pattern && i > 0 {
			id++ // 0x1001 is the heap cnt
		}
		g.h.Items = append(g.h.Items, spead.Item{ID: id, Data: g.payload[off : off+size]})
		descs = append(descs, spead.Descriptor{ID: id, Name: fmt.Sprintf("Test item %d", i),
			Description: fmt.Sprintf("%d bytes of generated payload", size),
			DType:       fmt.Sprintf("{'descr': '|u1', 'fortran_order': False, 'shape': (%d,)}", size), Flavour: f})
		off += size
	}
	if descriptors {
		dh, err := spead.DescriptorHeap(1, f, descs...)
		if err != nil {
			return nil, fmt.Errorf("descriptor heap: %w", err)
		}
		// The descriptors follow the data items, so the payload still starts with the data.
		g.first.Items = append(append([]spead.Item{}, g.h.Items...), dh.Items...)
	}
	return g, nil
}

// heap returns heap cnt, ready to encode; valid until the next call.
func (g *heapGen) heap(cnt uint64) *spead.Heap {
	h := &g.h
	if cnt == 1 && g.first.Items != nil {
		h = &g.first
	}
	h.Cnt = cnt
	if g.pattern {
		ringtest.FillPattern(g.payload, cnt)
		h.Items[0].Value = cnt
	}
	return h
}

// heapSender is a transport's way of sending the generated heaps: udp's packetSender, ibv's HeapSender.
type heapSender interface {
	heap(h *spead.Heap) error
	flush() error
	totals() (packets, bytes uint64, start time.Time)
}

// transportHeapSender is a transport.HeapSender as a heapSender, sending under ctx.
type transportHeapSender struct {
	ctx context.Context
	transport.HeapSender
}

func (t transportHeapSender) heap(h *spead.Heap) error { return t.SendHeap(t.ctx, h) }
func (t transportHeapSender) flush() error             { return t.Flush(t.ctx) }
func (t transportHeapSender) totals() (uint64, uint64, time.Time) {
	tot := t.Totals()
	return tot.Packets, tot.Bytes, tot.Start
}

func (ps *packetSender) totals() (uint64, uint64, time.Time) { return ps.packets, ps.bytes, ps.start }

// packetSender packetizes heaps into a batch of preallocated buffers and sends full batches, paced by a
// byte budget when a rate is set.
type packetSender struct {
	s       *udp.Sender
	enc     *spead.Encoder
	bufs    [][]byte
	pkts    [][]byte
	bps     float64 // bits per second; 0: unpaced
	start   time.Time
	packets uint64
	bytes   uint64
}

func newPacketSender(s *udp.Sender, enc *spead.Encoder, batch int, gbps float64) *packetSender {
	ps := &packetSender{s: s, enc: enc, bps: gbps * 1e9, start: time.Now(), pkts: make([][]byte, 0, batch)}
	mem := make([]byte, batch*enc.MaxPacketSize())
	for i := range batch {
		ps.bufs = append(ps.bufs, mem[i*enc.MaxPacketSize():(i+1)*enc.MaxPacketSize()])
	}
	return ps
}

func (ps *packetSender) heap(h *spead.Heap) error {
	if err := ps.enc.Reset(h); err != nil {
		return err
	}
	for {
		buf := ps.bufs[len(ps.pkts)]
		n, err := ps.enc.Next(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ps.pkts = append(ps.pkts, buf[:n])
		if len(ps.pkts) == cap(ps.pkts) {
			if err := ps.flush(); err != nil {
				return err
			}
		}
	}
}

// maxLag is how far behind its budget a paced sender may be before it gives the time up.
const maxLag = 2 * time.Millisecond

func (ps *packetSender) flush() error {
	if len(ps.pkts) == 0 {
		return nil
	}
	var n uint64
	for _, p := range ps.pkts {
		n += uint64(len(p))
	}
	if ps.bps > 0 {
		// Token bucket on bytes: this batch may leave once the bytes before it have had their time.
		due := ps.start.Add(time.Duration(float64(ps.bytes) * 8 / ps.bps * 1e9))
		// Sleep rather than spin: on a small host the receiver and its consumer need the cores, and the
		// budget makes up for a sleep's overshoot with a burst that is at most one batch.
		// A sender that fell behind (descheduled) does not catch up at full speed: that burst would
		// overflow the receiver's socket buffer. Past maxLag the budget restarts from now.
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else if -d > maxLag {
			ps.start = ps.start.Add(-d - maxLag)
		}
	}
	if err := ps.s.Send(ps.pkts); err != nil {
		return err
	}
	ps.packets += uint64(len(ps.pkts))
	ps.bytes += n
	ps.pkts = ps.pkts[:0]
	return nil
}
