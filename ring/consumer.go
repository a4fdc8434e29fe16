package ring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AttachOptions tune Attach.
type AttachOptions struct {
	// Timeout bounds the wait for the ring to appear and become READY (default 10 s; <0: do not wait).
	Timeout time.Duration
	// Dir is where rings are looked up by name (default /dev/shm).
	Dir string
	// MaxLatency, if positive, lets Next nap up to this long while the stream is moving instead of
	// spinning and asking the producer for a wake per heap: less CPU per heap, up to MaxLatency more
	// latency. An idle stream still sleeps on the futex. 0 (the default): spin, then futex.
	MaxLatency time.Duration
}

// Consumer reads heaps from a ring. It is not safe for concurrent use.
type Consumer struct {
	name    string
	hdr     header
	ctlFile *os.File
	consF   *os.File
	ctl     []byte
	data    []byte

	head      *uint64
	tail      *uint64
	consWait  *uint32
	consFutex *uint32
	prodWait  *uint32
	prodFutex *uint32
	state     *uint32
	stats     *[StatsSlots]uint64

	descs      []descriptor
	items      []Item
	mask       uint64
	read       uint64 // next position to read
	cachedHead uint64
	released   uint64 // released position, published to tail in batches

	maxLatency    time.Duration // AttachOptions.MaxLatency
	futexAtAttach uint32        // consumer_futex when attached: Wakes counts from here
	activeHead    uint64        // head when napWhileActive last saw it move, and when
	activeAt      time.Time
	stored        uint64 // last value stored to tail
	batch         uint64 // releases per tail store
	eosPending    bool   // an end-of-stream marker was read but not yet released
	eosPos        uint64
	gone          bool
}

// Heap is a heap read from the ring. Its Payload and Items view ring memory (read-only) and are valid
// until the heap is released.
type Heap struct {
	Position    uint64
	HeapCnt     uint64
	HeapSize    uint64
	Received    uint64
	TimestampNs uint64
	Flags       uint32
	Packets     uint32
	Slot        uint32
	Payload     []byte // the slot's payload, Received bytes (slot_size bytes at most)
	Items       []Item
}

// Item returns the first item with id.
func (h *Heap) Item(id uint64) (Item, bool) {
	for _, it := range h.Items {
		if it.ID == id {
			return it, true
		}
	}
	return Item{}, false
}

// ItemBytes returns an address item's bytes within the payload, or nil for an immediate item. The
// consumer validated offset and length against the slot when it read the heap.
func (h *Heap) ItemBytes(it Item) []byte {
	if it.Immediate() {
		return nil
	}
	full := h.Payload[:cap(h.Payload)]
	return full[it.Value : it.Value+it.Length : it.Value+it.Length]
}

// Attach opens ring nameOrPath (a name, or a control file path containing '/') as its one consumer
// (spec §7.2).
func Attach(nameOrPath string, opt AttachOptions) (c *Consumer, err error) {
	if opt.Timeout == 0 {
		opt.Timeout = 10 * time.Second
	}
	if opt.Dir == "" {
		opt.Dir = DefaultDir
	}
	path, name := nameOrPath, nameOrPath
	if !strings.Contains(nameOrPath, "/") {
		if err := ValidateName(nameOrPath); err != nil {
			return nil, err
		}
		path = CtlPath(opt.Dir, nameOrPath)
	}
	consPath, err := consPathFor(path)
	if err != nil {
		return nil, err
	}
	c = &Consumer{name: name, maxLatency: opt.MaxLatency}
	defer func() {
		if err != nil {
			c.unmap()
			c = nil
		}
	}()
	deadline := time.Now().Add(opt.Timeout)
	for {
		err = c.openCtl(path)
		if err == nil || !(errors.Is(err, ErrNotFound) || errors.Is(err, errNotReady)) || time.Now().After(deadline) {
			break
		}
		c.unmap()
		time.Sleep(10 * time.Millisecond)
	}
	if errors.Is(err, errNotReady) {
		err = fmt.Errorf("%w: still initialising after %v", ErrNotFound, opt.Timeout)
	}
	if err != nil {
		return c, fmt.Errorf("attach %s: %w", name, err)
	}
	if c.consF, err = os.OpenFile(consPath, os.O_RDWR|os.O_CREATE, 0o666); err != nil {
		return c, fmt.Errorf("attach %s: consumer lock: %w", name, err)
	}
	held, err := lockExclusive(c.consF)
	if err != nil {
		return c, fmt.Errorf("attach %s: %w", name, err)
	}
	if held {
		return c, fmt.Errorf("attach %s: %w (consumer pid %d)", name, ErrBusy, atomic.LoadUint64(u64at(c.ctl, offConsumerPID)))
	}
	if err = c.mapData(); err != nil {
		return c, fmt.Errorf("attach %s: %w", name, err)
	}
	atomic.StoreUint64(u64at(c.ctl, offConsumerPID), uint64(os.Getpid()))
	atomic.StoreUint64(u64at(c.ctl, offConsumerAttach), realtimeNanos())
	c.released = atomic.LoadUint64(c.tail)
	c.read, c.cachedHead, c.stored = c.released, c.released, c.released
	// Storing tail once per batch rather than per heap keeps the producer from taking a cache miss on it
	// per heap; an eighth of the ring keeps the producer supplied with free slots.
	c.batch = min(max(c.hdr.SlotCount/8, 1), 64)
	return c, nil
}

func (c *Consumer) openCtl(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s (is the producer running?)", ErrNotFound, path)
	}
	if err != nil {
		return err
	}
	c.ctlFile = f
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < CtlSize { // mapping past the end would SIGBUS on access
		return fmt.Errorf("%w: control file %s is %d bytes, want %d", ErrCorrupt, path, st.Size(), CtlSize)
	}
	if c.ctl, err = mmapFile(f, CtlSize, unix.PROT_READ|unix.PROT_WRITE, 0); err != nil {
		return err
	}
	c.hdr, err = parseHeader(c.ctl)
	return err
}

func (c *Consumer) mapData() error {
	f, err := os.Open(c.hdr.DataPath)
	if err != nil {
		return fmt.Errorf("open data file: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if uint64(st.Size()) != c.hdr.DataFileSize {
		return fmt.Errorf("%w: data file %s is %d bytes, header says %d", ErrCorrupt, c.hdr.DataPath, st.Size(), c.hdr.DataFileSize)
	}
	if c.data, err = mmapFile(f, int(c.hdr.DataFileSize), unix.PROT_READ, 0); err != nil {
		return err
	}
	g, ct := c.hdr.Geometry, c.ctl
	c.head, c.tail, c.state = u64at(ct, offHead), u64at(ct, offTail), u32at(ct, offState)
	c.consWait, c.consFutex = u32at(ct, offConsWaiting), u32at(ct, offConsFutex)
	c.futexAtAttach = atomic.LoadUint32(c.consFutex)
	c.prodWait, c.prodFutex = u32at(ct, offProdWaiting), u32at(ct, offProdFutex)
	c.stats = (*[StatsSlots]uint64)(unsafe.Pointer(&ct[offStats]))
	c.descs = unsafe.Slice((*descriptor)(unsafe.Pointer(&c.data[g.DescOffset])), g.SlotCount)
	c.items = unsafe.Slice((*Item)(unsafe.Pointer(&c.data[g.ItemsOffset])), g.SlotCount*uint64(g.MaxItems))
	c.mask = g.SlotCount - 1
	return nil
}

// SessionID identifies the producer run (the ring's epoch); ProducerPID is for messages.
func (c *Consumer) SessionID() uint64   { return c.hdr.SessionID }
func (c *Consumer) ProducerPID() uint64 { return c.hdr.ProducerPID }
func (c *Consumer) Geometry() Geometry  { return c.hdr.Geometry }
func (c *Consumer) Policy() Policy      { return c.hdr.Policy }

// Stats reads the producer's counters.
func (c *Consumer) Stats() Stats { return readStats(c.stats, c.hdr.StatsCount) }

// TryNext returns the next heap without waiting; ok is false when none is published yet.
func (c *Consumer) TryNext() (Heap, bool, error) {
	if c.read == c.cachedHead {
		c.cachedHead = atomic.LoadUint64(c.head)
		if c.read == c.cachedHead {
			c.flushRelease() // caught up: hand the released slots back now
			return Heap{}, false, nil
		}
		if c.cachedHead-c.released > c.hdr.SlotCount {
			return Heap{}, false, fmt.Errorf("%w: head %d is %d positions past tail %d", ErrCorrupt, c.cachedHead, c.cachedHead-c.released, c.released)
		}
	}
	h, err := c.heapAt(c.read)
	if err != nil {
		return Heap{}, false, err
	}
	c.read++
	if h.Flags&FlagEndOfStream != 0 {
		// The marker goes back with the heaps before it: releasing it now would also release heaps the
		// consumer still holds.
		c.eosPending, c.eosPos = true, h.Position
		if c.released == h.Position {
			c.Release(h)
		}
		return Heap{}, false, ErrEndOfStream
	}
	return h, true, nil
}

// heapAt validates position pos's descriptor and item table against the geometry (spec §7.3 step 2).
func (c *Consumer) heapAt(pos uint64) (Heap, error) {
	g := &c.hdr.Geometry
	d := &c.descs[pos&c.mask]
	h := Heap{Position: pos, HeapCnt: d.HeapCnt, HeapSize: d.HeapSize, Received: d.Received,
		TimestampNs: d.TimestampNs, Flags: d.Flags, Packets: d.Packets, Slot: d.Slot}
	seq, nItems := d.Seq, d.ItemCount
	if seq != pos+1 {
		return h, fmt.Errorf("%w: descriptor of position %d has seq %d", ErrCorrupt, pos, seq)
	}
	if uint64(h.Slot) >= g.SlotCount || nItems > g.MaxItems || h.Received > g.SlotSize {
		return h, fmt.Errorf("%w: position %d: slot %d, items %d, received %d out of range", ErrCorrupt, pos, h.Slot, nItems, h.Received)
	}
	base := uint64(h.Slot) * uint64(g.MaxItems)
	h.Items = c.items[base : base+uint64(nItems) : base+uint64(nItems)]
	for _, it := range h.Items {
		if !it.Immediate() && (it.Value > g.SlotSize || it.Length > g.SlotSize-it.Value) {
			return h, fmt.Errorf("%w: position %d: item %#x [%d,+%d) outside slot", ErrCorrupt, pos, it.ID, it.Value, it.Length)
		}
	}
	off := g.PayloadOffset + uint64(h.Slot)*g.SlotSize
	h.Payload = c.data[off : off+h.Received : off+g.SlotSize]
	return h, nil
}

// Next waits up to timeout (<0: forever) for the next heap. It returns ErrEndOfStream after the last heap
// of a stream that ended, ErrProducerGone when the producer died and everything it published has been
// read, and ErrTimeout when the time runs out.
func (c *Consumer) Next(timeout time.Duration) (Heap, error) {
	if h, ok, err := c.TryNext(); ok || err != nil {
		return h, err
	}
	c.flushRelease() // about to wait: the producer may be waiting for these slots
	start := time.Now()
	for {
		if c.napWhileActive(start, timeout) {
			if h, ok, err := c.TryNext(); ok || err != nil {
				return h, err
			}
			continue
		}
		for spins := 0; ; spins++ {
			if h, ok, err := c.TryNext(); ok || err != nil {
				return h, err
			}
			if spins%64 == 63 && time.Since(start) >= spinFor {
				break
			}
		}
		f := atomic.LoadUint32(c.consFutex)
		atomic.StoreUint32(c.consWait, 1) // sequentially consistent: the fence before re-reading head
		if h, ok, err := c.TryNext(); ok || err != nil {
			atomic.StoreUint32(c.consWait, 0)
			return h, err
		}
		if State(atomic.LoadUint32(c.state)) == StateClosed {
			// Everything was published before CLOSED was stored: one more look drains it.
			atomic.StoreUint32(c.consWait, 0)
			if h, ok, err := c.TryNext(); ok || err != nil {
				return h, err
			}
			return Heap{}, ErrEndOfStream
		}
		slice := maxWaitSlice
		if timeout >= 0 {
			left := timeout - time.Since(start)
			if left <= 0 {
				atomic.StoreUint32(c.consWait, 0)
				return Heap{}, ErrTimeout
			}
			slice = min(slice, left)
		}
		sliceStart := time.Now()
		futexWaitOn(c.consFutex, f, slice)
		if time.Since(sliceStart) >= slice {
			if err := c.checkProducer(); err != nil {
				return Heap{}, err
			}
		}
	}
}

// Wakes is how many times the producer has woken this consumer since it attached (the movement of the
// consumer futex word, spec §7.4): what a sleeping consumer costs the producer in syscalls.
func (c *Consumer) Wakes() uint32 { return atomic.LoadUint32(c.consFutex) - c.futexAtAttach }

// activeNaps is how many naps without head moving make a stream idle again (back to the futex).
const activeNaps = 8

// napWhileActive naps MaxLatency when the stream moved recently (AttachOptions.MaxLatency), instead of
// spinning and asking the producer for a wake per heap; it reports whether it napped.
func (c *Consumer) napWhileActive(start time.Time, timeout time.Duration) bool {
	if c.maxLatency <= 0 {
		return false
	}
	now := time.Now()
	if head := atomic.LoadUint64(c.head); head != c.activeHead {
		c.activeHead, c.activeAt = head, now
	}
	if now.Sub(c.activeAt) >= activeNaps*c.maxLatency {
		return false
	}
	nap := c.maxLatency
	if timeout >= 0 {
		left := timeout - now.Sub(start)
		if left <= 0 {
			return false
		}
		nap = min(nap, left)
	}
	time.Sleep(nap)
	return true
}

// checkProducer reports ErrProducerGone once the producer's lock on the control file's inode is gone and
// everything it published has been read (spec §7.6).
func (c *Consumer) checkProducer() error {
	held, err := lockHeld(c.ctlFile)
	if err != nil {
		return err
	}
	if held {
		return nil
	}
	if State(atomic.LoadUint32(c.state)) == StateClosed {
		return nil // a clean close: the wait loop reports end of stream after draining
	}
	if atomic.LoadUint64(c.head) != c.read {
		return nil // published heaps are still to be read
	}
	c.gone = true
	return fmt.Errorf("ring %s: %w (pid %d)", c.name, ErrProducerGone, c.hdr.ProducerPID)
}

// ProducerAlive reports whether the producer of the attached ring still runs.
func (c *Consumer) ProducerAlive() bool {
	held, err := lockHeld(c.ctlFile)
	return err == nil && held
}

// Release gives back h and every heap read before it, in position order (spec §7.3 step 5). The shared
// cursor is stored once per batch of releases, and always before the consumer waits or detaches.
func (c *Consumer) Release(h Heap) {
	next := h.Position + 1
	if next-c.released > c.read-c.released { // not read yet, or released already
		return
	}
	c.released = next
	if c.eosPending && next == c.eosPos {
		c.released, c.eosPending = next+1, false
	}
	if c.released-c.stored >= c.batch {
		c.flushRelease()
	}
}

// flushRelease publishes the released position to the producer (spec §7.3 step 5).
func (c *Consumer) flushRelease() {
	if c.stored == c.released {
		return
	}
	c.stored = c.released
	atomic.StoreUint64(c.tail, c.released)
	wakeIfWaiting(c.prodWait, c.prodFutex)
}

// Close detaches: the consumer lock is dropped so another consumer may attach and continue at the
// released position.
func (c *Consumer) Close() error {
	if c.ctl != nil {
		c.flushRelease()
		atomic.StoreUint64(u64at(c.ctl, offConsumerPID), 0)
	}
	return c.unmap()
}

func (c *Consumer) unmap() error {
	return unmapAndClose([]*[]byte{&c.data, &c.ctl}, []**os.File{&c.ctlFile, &c.consF})
}
