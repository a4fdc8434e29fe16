package ring

// Fuzz targets for both sides of the trust boundary (layout 2.1 and later): what the producer reads from
// clients (hello records, consumer regions) and what a client reads from a producer (the header and its
// geometry, descriptors, item tables, metadata). Hostile bytes must give an error, never a panic or an
// access outside the memory. `make fuzz` runs each; their seeds run in `go test`.

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// FuzzDecodeHello: the producer's parsing of a client's first record.
func FuzzDecodeHello(f *testing.F) {
	f.Add(hello{Major: MajorVersion, Minor: MinorVersion, Role: RoleConsumer}.encode())
	f.Add(hello{Major: 3, Role: 7, Start: 9}.encode())
	f.Add([]byte("IBVBRING"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			return
		}
		if len(b) != HelloSize || binary.LittleEndian.Uint64(b) != Magic {
			t.Fatalf("accepted a %d-byte record without the magic", len(b))
		}
		if got := h.encode(); string(got) != string(b) {
			t.Fatalf("decode/encode changed the record: %x -> %x", b, got)
		}
	})
}

// FuzzProducerReadsRegion: a consumer writes anything into its region (cursor, waiting flag, wake
// position, spin budget) while the producer publishes and reads it. The producer must not fail, and a
// cursor outside [released, head] detaches exactly that consumer as a bad cursor.
func FuzzProducerReadsRegion(f *testing.F) {
	seed := func(tailDelta int64, rest ...byte) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, uint64(tailDelta)), rest...)
	}
	f.Add(seed(0))
	f.Add(seed(1, 1, 0, 0, 0))
	f.Add(seed(3, 1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	f.Add(seed(4))
	f.Add(seed(-1))
	f.Add(seed(1 << 62))
	dir := f.TempDir()
	p, err := Create("fuzzregion", Config{Dir: dir, HugePages: HugePagesOff, SlotCount: 8, SlotSize: 4096, MaxItems: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { p.Close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 8 {
			return
		}
		c, err := Attach("fuzzregion", AttachOptions{Dir: dir, Timeout: 5 * time.Second, FromHead: true})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			c.Close()
			for deadline := time.Now().Add(10 * time.Second); p.Consumers() != 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}()
		for range 3 { // heaps the consumer could hold
			if s, err := p.Acquire(); err == nil {
				p.Publish(s, HeapInfo{Received: 64, Flags: FlagComplete})
			}
		}
		head := p.head.Load()
		start := c.released
		tail := start + binary.LittleEndian.Uint64(b)
		binary.LittleEndian.PutUint64(c.region[regTail:], tail)
		copy(c.region[regConsWaiting:RegionSize], b[8:])
		p.mu.Lock()
		p.readCursorsLocked(true) // what the hot path does before it reclaims, at this head
		p.mu.Unlock()
		for range 12 { // the hot path reads the region: wakes, reclaims, perhaps detaches
			if s, err := p.Acquire(); err == nil {
				p.Publish(s, HeapInfo{Received: 64, Flags: FlagComplete})
			}
		}
		_ = p.Unread()
		bad := tail-start > head-start
		err = c.detached()
		if bad && (err == nil || errors.Is(err, ErrOverrun)) {
			t.Fatalf("cursor %d outside [%d, %d]: consumer not detached as a bad cursor (%v)", tail, start, head, err)
		}
		if !bad && err != nil && !errors.Is(err, ErrOverrun) {
			t.Fatalf("valid cursor %d in [%d, %d]: detached: %v", tail, start, head, err)
		}
	})
}

// fuzzCtl is a control memory of one consumer row whose header is b (the rest zero).
func fuzzCtl(b []byte) []byte {
	ctl := make([]byte, CtlSizeFor(1))
	copy(ctl, b)
	return ctl
}

// FuzzParseHeader: the client's parsing of the header and geometry in producer memory. An accepted header
// places every region inside data_size, so nothing derived from it reads outside the data memory.
func FuzzParseHeader(f *testing.F) {
	g := layoutGeometry(8, 4096, 4, 4096, 0, 4096)
	good := fuzzCtl(nil)
	le := binary.LittleEndian
	le.PutUint64(good[offMagic:], Magic)
	le.PutUint16(good[offMajor:], MajorVersion)
	le.PutUint16(good[offMinor:], MinorVersion)
	le.PutUint32(good[offCtlSize:], uint32(CtlSizeFor(1)))
	le.PutUint32(good[offState:], uint32(StateReady))
	le.PutUint64(good[offSlotCount:], g.SlotCount)
	le.PutUint64(good[offSlotSize:], g.SlotSize)
	le.PutUint32(good[offMaxItems:], g.MaxItems)
	le.PutUint32(good[offDescSize:], DescSize)
	le.PutUint32(good[offItemSize:], ItemSize)
	le.PutUint32(good[offPageSize:], g.PageSize)
	le.PutUint64(good[offDataSize:], g.DataSize)
	le.PutUint64(good[offDescOffset:], g.DescOffset)
	le.PutUint64(good[offItemsOffset:], g.ItemsOffset)
	le.PutUint64(good[offMetaOffset:], g.MetaOffset)
	le.PutUint64(good[offMetaSize:], g.MetaSize)
	le.PutUint64(good[offPayloadOffset:], g.PayloadOffset)
	le.PutUint64(good[offPacketOffset:], g.PacketOffset)
	le.PutUint32(good[offMaxConsumers:], 1)
	f.Add(good[:offHead])
	f.Add(good[:offSlotCount])
	bad := append([]byte(nil), good[:offHead]...)
	le.PutUint64(bad[offSlotCount:], 1<<24)
	le.PutUint64(bad[offSlotSize:], 1<<40)
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(fuzzCtl(b))
		if err != nil {
			return
		}
		g := h.Geometry
		for _, r := range [][2]uint64{{g.DescOffset, g.SlotCount * DescSize}, {g.ItemsOffset, g.SlotCount * uint64(g.MaxItems) * ItemSize},
			{g.MetaOffset, g.MetaSize}, {g.PayloadOffset, g.SlotCount * g.SlotSize}, {g.PacketOffset, g.PacketSize}} {
			if r[0]+r[1] < r[0] || r[0]+r[1] > g.DataSize {
				t.Fatalf("accepted geometry %+v puts [%d,+%d) outside data_size", g, r[0], r[1])
			}
		}
	})
}

// FuzzValidateHeap: the client's reading of a descriptor and its item table (spec §7.3 step 2), then of
// the payload and item bytes they name, from data memory a hostile producer wrote.
func FuzzValidateHeap(f *testing.F) {
	g := layoutGeometry(8, 4096, 4, 4096, 0, 4096)
	desc := func(seq uint64, slot, items uint32, received uint64) []byte {
		d := make([]byte, DescSize)
		binary.LittleEndian.PutUint64(d[descSeq:], seq)
		binary.LittleEndian.PutUint64(d[descReceived:], received)
		binary.LittleEndian.PutUint32(d[descSlot:], slot)
		binary.LittleEndian.PutUint32(d[descItemCount:], items)
		return d
	}
	item := func(value, length uint64, flags uint32) []byte {
		it := make([]byte, ItemSize)
		binary.LittleEndian.PutUint64(it[itemValue:], value)
		binary.LittleEndian.PutUint64(it[itemLength:], length)
		binary.LittleEndian.PutUint32(it[itemFlags:], flags)
		return it
	}
	f.Add(uint64(5), append(desc(6, 3, 1, 100), item(0, 100, 0)...))
	f.Add(uint64(5), append(desc(6, 3, 2, 4096), append(item(4000, 96, 0), item(1<<63, 1<<63, 0)...)...))
	f.Add(uint64(5), append(desc(6, 9, 1, 100), item(0, 100, 0)...))
	f.Add(uint64(5), desc(6, 3, 5, 100))
	f.Add(uint64(5), desc(6, 3, 0, 4097))
	f.Fuzz(func(t *testing.T, pos uint64, b []byte) {
		data := make([]byte, g.DataSize)
		var d descriptor
		raw := make([]byte, DescSize)
		copy(raw, b)
		d.Seq, d.Received = binary.LittleEndian.Uint64(raw[descSeq:]), binary.LittleEndian.Uint64(raw[descReceived:])
		d.Slot, d.ItemCount = binary.LittleEndian.Uint32(raw[descSlot:]), binary.LittleEndian.Uint32(raw[descItemCount:])
		shared := make([]Item, g.SlotCount*uint64(g.MaxItems))
		rest := b[min(len(b), DescSize):]
		for i := range shared {
			if len(rest) < ItemSize {
				break
			}
			shared[int(uint64(i)+uint64(d.Slot%uint32(g.SlotCount))*uint64(g.MaxItems))%len(shared)] = Item{
				ID: binary.LittleEndian.Uint64(rest), Value: binary.LittleEndian.Uint64(rest[8:]),
				Length: binary.LittleEndian.Uint64(rest[16:]), Flags: binary.LittleEndian.Uint32(rest[24:])}
			rest = rest[ItemSize:]
		}
		private := make([]Item, len(shared))
		items, err := validateHeap(&g, pos, &d, shared, private)
		if err != nil {
			return
		}
		off := g.PayloadOffset + uint64(d.Slot)*g.SlotSize
		h := Heap{Payload: data[off : off+d.Received : off+g.SlotSize], Items: items}
		for _, it := range h.Items {
			_ = h.ItemBytes(it) // in bounds, or the validation let a bad item through
		}
	})
}

// FuzzDecodeMeta: the client's parsing of the stream-metadata records (spec §6).
func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta([]ItemDescriptor{{ID: 0x1600, Name: "timestamp", Description: "t", Format: []byte{'u', 0, 0, 48},
		DType: "", Shape: []int64{4, -1}, ShapeKnown: true}}))
	f.Add(encodeMeta([]ItemDescriptor{{ID: 1, Name: "x"}, {ID: 2, Name: "y", DType: "{'descr': '<f4'}"}}))
	f.Add([]byte{0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		ds, err := decodeMeta(b)
		if err != nil {
			return
		}
		if len(ds) > len(b)/metaRecordFixed {
			t.Fatalf("%d records from %d bytes", len(ds), len(b))
		}
	})
}
