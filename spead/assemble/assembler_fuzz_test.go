package assemble_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

// Fuzz input framing: one configuration byte, then packets, each a 2-byte big-endian length and that many
// bytes (the last one clipped to what is left).
//
// Configuration byte: bits 0–1 MaxHeaps-1, bit 2 Incomplete, bits 3–4 slot size 256<<n, bit 5 the packets
// arrive as a placing source hands them over (Place / Fits / Placed, reads of 4) instead of by Packet.
func fuzzConfig(b byte) (maxHeaps int, incomplete bool, slotSize int, placing bool) {
	return int(b&3) + 1, b&4 != 0, 256 << ((b >> 3) & 3), b&0x20 != 0
}

func splitFuzzPackets(data []byte) [][]byte {
	var out [][]byte
	for len(data) >= 2 {
		n := min(int(binary.BigEndian.Uint16(data)), len(data)-2)
		out = append(out, data[2:2+n])
		data = data[2+n:]
	}
	return out
}

func joinFuzzPackets(config byte, packets ...[]byte) []byte {
	out := []byte{config}
	for _, p := range packets {
		out = binary.BigEndian.AppendUint16(out, uint16(len(p)))
		out = append(out, p...)
	}
	return out
}

func addAssemblerSeeds(f *testing.F) {
	perHeap := encodeHeaps(f, spead.Flavour64_40, 128, patternHeap(1, 700), patternHeap(2, 300), spead.StreamStopHeap(3))
	all := func(hs ...[][]byte) [][]byte {
		var out [][]byte
		for _, h := range hs {
			out = append(out, h...)
		}
		return out
	}
	stream := all(perHeap...)
	f.Add(joinFuzzPackets(0, stream...))
	f.Add(joinFuzzPackets(0x04|0x01, stream[1:]...))                                                 // heap 1 loses a packet
	f.Add(joinFuzzPackets(0x07, append([][]byte{stream[3]}, stream...)...))                          // a duplicate first
	f.Add(joinFuzzPackets(0x18, all(perHeap[1], perHeap[0])...))                                     // big slots, no stop
	f.Add(joinFuzzPackets(0x04, noLengthPacket(7, 0, make([]byte, 40), speadtest.Addr40(0x1000, 0)), // no heap length
		noLengthPacket(7, 60, make([]byte, 20)), noLengthPacket(8, 0, []byte{1})))
	d, err := spead.DescriptorHeap(1, spead.Flavour64_48, spead.Descriptor{ID: 0x1000, Name: "x", Shape: []int64{2}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(joinFuzzPackets(0x08, speadtest.EncodeAll(f, spead.Flavour64_48, 1024, &d)...))
	f.Add(joinFuzzPackets(0x02, speadtest.ValidPacket(), speadtest.ValidPacket()))
	f.Add(joinFuzzPackets(0x20, stream...))      // placed
	f.Add(joinFuzzPackets(0x38|0x03, stream...)) // placed, big slots
	var ones [][]byte                            // one-packet heaps, in order: slots taken ahead
	for _, hp := range encodeHeaps(f, spead.Flavour64_40, 1472, patternHeap(1, 200), patternHeap(2, 200),
		patternHeap(3, 200), patternHeap(4, 200), patternHeap(5, 200), patternHeap(6, 200), patternHeap(7, 200)) {
		ones = append(ones, hp...)
	}
	f.Add(joinFuzzPackets(0x20, ones...))
	f.Add(joinFuzzPackets(0x20, append(append(ones[:4:4], ones[5], ones[4], ones[5]), ones[6])...)) // late heap, late copy
}

// FuzzAssembler feeds arbitrary packet sequences to an assembler on a small drop-policy ring drained now
// and then: it must never panic, every heap a consumer reads must be valid, and the counters must agree
// with what was read.
//
// The rings (one per slot size the configuration byte can ask for) are made once per fuzzing process and
// shared by every execution: creating a ring costs far more than assembling a few packets, and a fuzzer
// that spends its time there finds nothing. Each execution starts from an empty ring (the previous one
// drained it) and compares counter deltas. An input that stopped the stream ends its ring for good (the
// end-of-stream marker is final, spec §4.1): that ring is made afresh for the next input.
// fuzzRing is one of the fuzz target's rings, reused across inputs until a stream ends on it.
type fuzzRing struct {
	p    *ring.Producer
	c    *ring.Consumer
	name string
	cfg  ring.Config
}

// open makes the ring and attaches its consumer.
func (r *fuzzRing) open(tb testing.TB) {
	tb.Helper()
	p, err := ring.Create(r.name, r.cfg)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := ring.Attach(r.name, ring.AttachOptions{Dir: r.cfg.Dir, Timeout: time.Second})
	if err != nil {
		p.Close()
		tb.Fatal(err)
	}
	r.p, r.c = p, c
}

func (r *fuzzRing) close() {
	r.c.Close()
	r.p.Close()
}

// fuzzRings makes one ring per slot size fuzzConfig can choose.
func fuzzRings(f *testing.F) map[int]*fuzzRing {
	rings := map[int]*fuzzRing{}
	dir := shmDir(f)
	for n := range 4 {
		slotSize := 256 << n
		// 32 slots: enough free ones for the assembler to take some ahead when placing.
		r := &fuzzRing{name: fmt.Sprintf("fuzz%d", n), cfg: ring.Config{Dir: dir, SlotCount: 32, SlotSize: slotSize,
			MaxItems: 4, MetaSize: 4096, Policy: ring.PolicyDrop, HugePages: ring.HugePagesOff}}
		r.open(f)
		f.Cleanup(r.close)
		rings[slotSize] = r
	}
	return rings
}

func FuzzAssembler(f *testing.F) {
	addAssemblerSeeds(f)
	rings := fuzzRings(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		maxHeaps, incomplete, slotSize, placing := fuzzConfig(data[0])
		packets := splitFuzzPackets(data[1:])
		p, c := rings[slotSize].p, rings[slotSize].c
		p.Set(ring.CounterEndOfStream, 0)
		before := c.Stats()
		a, err := assemble.NewAssembler(p, assemble.AssemblerConfig{MaxHeaps: maxHeaps, Incomplete: incomplete, EOSTimeout: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var read fuzzTally
		eos := fuzzFeed(t, a, c, &read, packets, placing, uint64(slotSize))
		a.Flush()
		fuzzEndStream(t, a, p, c, &read, eos, uint64(slotSize))
		s := c.Stats()
		for i := range s {
			if ring.Counter(i) != ring.CounterEndOfStream {
				s[i] -= before[i]
			}
		}
		checkFuzzCounters(t, a, s, &read, incomplete, len(packets))
		if s.Get(ring.CounterEndOfStream) == 1 { // the stream ended: nothing may follow on this ring
			rings[slotSize].close()
			rings[slotSize].open(t)
		}
	})
}

// fuzzFeed hands the packets to a (as a placing source does, or one at a time) and reads what is
// published as it goes; it reports whether the end of stream was read.
func fuzzFeed(t *testing.T, a *assemble.Assembler, c *ring.Consumer, read *fuzzTally, packets [][]byte, placing bool,
	slotSize uint64) (eos bool) {
	if placing {
		feeder := newPlacingFeeder(t, a, 4)
		for i := 0; i < len(packets); i += 4 {
			feeder.feed(packets[i:min(i+4, len(packets))])
			if !eos {
				eos = read.drain(t, c, slotSize)
			}
		}
		return eos
	}
	for i, b := range packets {
		a.Packet(b, int64(i))
		if i%3 == 2 && !eos {
			eos = read.drain(t, c, slotSize)
		}
	}
	return eos
}

// fuzzEndStream reads the rest, so the ring is empty for the next input.
func fuzzEndStream(t *testing.T, a *assemble.Assembler, p *ring.Producer, c *ring.Consumer, read *fuzzTally, eos bool,
	slotSize uint64) {
	if !eos {
		eos = read.drain(t, c, slotSize)
	}
	if eos {
		return
	}
	stopped := false
	select {
	case <-a.Done():
		stopped = true
	default:
	}
	if stopped && c.Stats().Get(ring.CounterEndOfStream) == 1 {
		t.Fatal("end of stream counted but never read")
	}
	// Not stopped (or its marker found no slot): the drain above read everything Flush published, so the
	// ring is empty for the next input.
}

// checkFuzzCounters checks the ring's counters (this input's share, s) against what the consumer read
// and what was sent.
func checkFuzzCounters(t *testing.T, a *assemble.Assembler, s ring.Stats, read *fuzzTally, incomplete bool, sent int) {
	if s.Get(ring.CounterHeaps) != read.heaps {
		t.Errorf("heaps counter %d, consumer read %d", s.Get(ring.CounterHeaps), read.heaps)
	}
	if s.Get(ring.CounterIncompleteHeaps) != read.incomplete+s.Get(ring.CounterDiscardedIncompleteHeaps) {
		t.Errorf("incomplete %d != read incomplete %d + discarded %d", s.Get(ring.CounterIncompleteHeaps), read.incomplete,
			s.Get(ring.CounterDiscardedIncompleteHeaps))
	}
	if incomplete && s.Get(ring.CounterDiscardedIncompleteHeaps) != 0 || !incomplete && read.incomplete != 0 {
		t.Errorf("incomplete=%v: %d read incomplete, %d discarded", incomplete, read.incomplete, s.Get(ring.CounterDiscardedIncompleteHeaps))
	}
	if s.Get(ring.CounterTruncatedHeaps) != read.truncated {
		t.Errorf("truncated counter %d, read %d", s.Get(ring.CounterTruncatedHeaps), read.truncated)
	}
	if read.packets > s.Get(ring.CounterPackets) || s.Get(ring.CounterPackets) > uint64(sent) {
		t.Errorf("packets counter %d: heaps hold %d, %d were sent", s.Get(ring.CounterPackets), read.packets, sent)
	}
	var packetReasons uint64
	for _, n := range a.MalformedByReason() {
		packetReasons += n
	}
	if packetReasons != s.Get(ring.CounterMalformedPackets) {
		t.Errorf("malformed counter %d, by reason %d", s.Get(ring.CounterMalformedPackets), packetReasons)
	}
	accounted := s.Get(ring.CounterPackets) + s.Get(ring.CounterMalformedPackets) + s.Get(ring.CounterDuplicatePackets) + a.PacketsAfterStop()
	if accounted > uint64(sent) {
		t.Errorf("%d packets accounted for, %d sent", accounted, sent)
	}
}

// fuzzTally is what the fuzz consumer read.
type fuzzTally struct {
	heaps, incomplete, truncated, packets uint64
}

// drain reads and validates every published heap; it reports whether it read the end of stream.
func (ft *fuzzTally) drain(t *testing.T, c *ring.Consumer, slotSize uint64) bool {
	t.Helper()
	for {
		h, ok, err := c.TryNext()
		if errors.Is(err, ring.ErrEndOfStream) {
			return true
		}
		if err != nil {
			t.Fatal(err) // the consumer's own validation (spec §7.3) failed
		}
		if !ok {
			return false
		}
		if err := validateFuzzHeap(h, slotSize); err != nil {
			t.Fatalf("heap %d: %v (%+v)", h.HeapCnt, err, h)
		}
		ft.heaps++
		ft.packets += uint64(h.Packets)
		if h.Flags&ring.FlagIncomplete != 0 {
			ft.incomplete++
		}
		if h.Flags&ring.FlagTruncated != 0 {
			ft.truncated++
		}
		c.Release(h)
	}
}

func validateFuzzHeap(h ring.Heap, slotSize uint64) error {
	complete, incomplete := h.Flags&ring.FlagComplete != 0, h.Flags&ring.FlagIncomplete != 0
	truncated := h.Flags&ring.FlagTruncated != 0
	switch {
	case complete && (incomplete || truncated):
		return fmt.Errorf("flags %#x: COMPLETE with INCOMPLETE or TRUNCATED (spec §4.1)", h.Flags)
	case !complete && !incomplete && !truncated:
		return fmt.Errorf("flags %#x: none of COMPLETE, INCOMPLETE, TRUNCATED", h.Flags)
	case h.Flags&ring.FlagEndOfStream != 0:
		return fmt.Errorf("flags %#x on a data heap", h.Flags)
	case h.Packets == 0:
		return errors.New("no packets")
	case h.Received > h.HeapSize:
		return fmt.Errorf("received %d of %d", h.Received, h.HeapSize)
	case complete && h.Received != h.HeapSize:
		return fmt.Errorf("complete with %d of %d bytes", h.Received, h.HeapSize)
	case !truncated && h.HeapSize > slotSize:
		return fmt.Errorf("heap size %d in a %d-byte slot without TRUNCATED", h.HeapSize, slotSize)
	}
	for _, it := range h.Items {
		switch {
		case it.ID <= spead.PayloadLengthID:
			return fmt.Errorf("item %+v: ids 0x0–0x4 stay out of the table", it)
		case it.Immediate() && it.Length != 5 && it.Length != 6:
			return fmt.Errorf("immediate item %+v", it)
		case !it.Immediate() && it.Length == 0:
			return fmt.Errorf("empty address item %+v", it)
		}
	}
	return nil
}
