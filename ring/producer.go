package ring

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// HugePages says where the data file may live.
type HugePages int

const (
	// HugePagesAuto uses hugetlbfs when it is mounted and has the pages, else /dev/shm with a warning.
	HugePagesAuto HugePages = iota
	// HugePagesRequire fails when hugepages cannot back the data file.
	HugePagesRequire
	// HugePagesOff puts the data file in the control directory (4 KiB pages).
	HugePagesOff
)

// Config sets a ring's geometry and behaviour at creation.
type Config struct {
	SlotCount  int    // payload slots, a power of two (default 256)
	SlotSize   int    // payload bytes per slot, rounded up to 64 (default 1 MiB)
	MaxItems   int    // item-table entries per slot (default 64)
	MetaSize   int    // stream-metadata area (default 64 KiB)
	PacketArea int    // bytes for a frame-level transport's packet buffers (default 0)
	Policy     Policy // full-ring policy (default drop)
	HugePages  HugePages
	Dir        string // control and lock files (default /dev/shm)
	HugeDir    string // hugetlbfs mount (default /dev/hugepages)
	// InitialPosition starts the cursors somewhere other than 0: tests use values near 2^64 to prove
	// that every client handles wrap-around.
	InitialPosition uint64
	Log             *zerolog.Logger // warnings (hugepage fallback, stale ring replaced); nil: silent
}

func (c *Config) setDefaults() error {
	if c.SlotCount == 0 {
		c.SlotCount = 256
	}
	if c.SlotSize == 0 {
		c.SlotSize = 1 << 20
	}
	if c.MaxItems == 0 {
		c.MaxItems = 64
	}
	if c.MetaSize == 0 {
		c.MetaSize = 64 << 10
	}
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.HugeDir == "" {
		c.HugeDir = DefaultHugeDir
	}
	switch {
	case c.SlotCount < 1 || c.SlotCount > MaxSlotCount || c.SlotCount&(c.SlotCount-1) != 0:
		return fmt.Errorf("%w: slot count %d must be a power of two in 1..%d", ErrBadConfig, c.SlotCount, MaxSlotCount)
	case c.SlotSize < 1:
		return fmt.Errorf("%w: slot size %d must be positive", ErrBadConfig, c.SlotSize)
	case c.MaxItems < 1 || c.MaxItems > MaxItems:
		return fmt.Errorf("%w: max items %d must be in 1..%d", ErrBadConfig, c.MaxItems, MaxItems)
	case c.MetaSize < metaHeaderSize:
		return fmt.Errorf("%w: metadata area %d bytes is too small", ErrBadConfig, c.MetaSize)
	case c.PacketArea < 0:
		return fmt.Errorf("%w: packet area %d bytes", ErrBadConfig, c.PacketArea)
	case c.Policy != PolicyDrop && c.Policy != PolicyBlock:
		return fmt.Errorf("%w: policy %d", ErrBadConfig, c.Policy)
	}
	c.SlotSize = int(alignUp(uint64(c.SlotSize), 64))
	return nil
}

// HeapInfo is what the producer knows about a heap when it publishes it.
type HeapInfo struct {
	HeapCnt     uint64
	HeapSize    uint64
	Received    uint64
	TimestampNs uint64
	Flags       uint32
	Packets     uint32
}

// Slot is a payload slot the producer is filling. Payload and the item table are the ring's own memory:
// the assembler writes packets straight into them.
type Slot struct {
	Index   uint32
	Payload []byte // slot_size bytes
	items   []Item // max_items entries
	nItems  uint32
	overflw bool
}

// AddItem appends an item pointer to the slot's item table; false (and the ITEMS_OVERFLOW flag on
// publish) when the table is full.
func (s *Slot) AddItem(it Item) bool {
	if int(s.nItems) >= len(s.items) {
		s.overflw = true
		return false
	}
	s.items[s.nItems] = it
	s.nItems++
	return true
}

// Items returns the entries added so far (the assembler patches address-item lengths at the end).
func (s *Slot) Items() []Item { return s.items[:s.nItems] }

// ResetItems empties the item table.
func (s *Slot) ResetItems() { s.nItems, s.overflw = 0, false }

const noSlot = ^uint32(0)

// Producer creates a ring and publishes heaps into it. Its methods other than Close and Interrupt must be
// called from one goroutine.
type Producer struct {
	name     string
	cfg      Config
	geo      Geometry
	ctlPath  string
	dataPath string

	lockFile, ctlFile, dataFile *os.File
	ctl, data                   []byte

	head      *uint64
	tail      *uint64
	consWait  *uint32
	consFutex *uint32
	prodWait  *uint32
	prodFutex *uint32
	stats     *[StatsSlots]uint64

	descs   []descriptor
	slots   []Slot
	mask    uint64
	pos     uint64   // next position to publish (private copy of head)
	reclaim uint64   // positions below this have had their slots returned to the pool
	posSlot []uint32 // slot named by each unreleased position
	free    []uint32 // FIFO of free slots
	freeR   uint64
	freeW   uint64

	interrupted atomic.Bool
	stopBeat    chan struct{}
	beatDone    sync.WaitGroup
	closeOnce   sync.Once
	closeErr    error
	badTail     bool
}

// Create makes ring name and marks it READY (spec §7.1). A stale ring left by a dead producer is replaced;
// a live producer's ring is refused with ErrInUse.
func Create(name string, cfg Config) (p *Producer, err error) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, fmt.Errorf("create ring %s: the layout is little-endian and this host is not", name)
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("create ring %s: %w", name, err)
	}
	p = &Producer{name: name, cfg: cfg, ctlPath: CtlPath(cfg.Dir, name)}
	defer func() {
		if err != nil {
			p.release()
			p = nil
		}
	}()
	lp := lockPath(cfg.Dir, name)
	if p.lockFile, err = os.OpenFile(lp, os.O_RDWR|os.O_CREATE, 0o666); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	held, err := lockExclusive(p.lockFile)
	if err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if held {
		return p, fmt.Errorf("create ring %s: %w (pid %d)", name, ErrInUse, stalePID(p.ctlPath))
	}
	p.removeStale()
	if err = p.createData(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if err = p.createCtl(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	p.stopBeat = make(chan struct{})
	p.beatDone.Add(1)
	go p.heartbeat()
	return p, nil
}

// stalePID reads the producer pid from a control file, for messages; 0 if unreadable.
func stalePID(ctlPath string) uint64 {
	b := make([]byte, offProducerPID+8)
	f, err := os.Open(ctlPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 0); err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b[offProducerPID:])
}

// removeStale deletes the files of a producer that died without cleaning up. Holding the .lock makes us
// the only process that may do this.
func (p *Producer) removeStale() {
	if _, err := os.Stat(p.ctlPath); err == nil {
		if p.cfg.Log != nil {
			p.cfg.Log.Warn().Str("ring", p.name).Uint64("old_pid", stalePID(p.ctlPath)).
				Msg("replacing stale ring left by a producer that died")
		}
		_ = os.Remove(p.ctlPath)
	}
	base := baseName(p.name)
	for _, dir := range []string{p.cfg.Dir, p.cfg.HugeDir} {
		_ = os.Remove(filepath.Join(dir, base+".dat"))
	}
	tmps, _ := filepath.Glob(filepath.Join(p.cfg.Dir, base+".ctl.*.tmp"))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
}

func (p *Producer) createData() error {
	c := &p.cfg
	try := func(dir string, pageSize int) error {
		p.geo = layoutGeometry(uint64(c.SlotCount), uint64(c.SlotSize), uint32(c.MaxItems),
			uint64(c.MetaSize), uint64(c.PacketArea), uint32(pageSize))
		path := filepath.Join(dir, baseName(p.name)+".dat")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if err := f.Truncate(int64(p.geo.DataFileSize)); err != nil {
			f.Close()
			os.Remove(path)
			return fmt.Errorf("size data file %s to %d: %w", path, p.geo.DataFileSize, err)
		}
		// Reserve every block now: on tmpfs, MAP_POPULATE stops quietly when the filesystem fills and a
		// later touch is SIGBUS; fallocate fails here instead, with a size to report. (hugetlbfs reserves
		// its pages at mmap, which fails with ENOMEM just as clearly.)
		if pageSize == os.Getpagesize() {
			if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(p.geo.DataFileSize)); err != nil {
				f.Close()
				os.Remove(path)
				if errors.Is(err, unix.ENOSPC) {
					return fmt.Errorf("%w: the ring needs %d MiB in %s and only %d MiB are free: use fewer or smaller slots",
						ErrNoSpace, p.geo.DataFileSize>>20, dir, freeBytes(dir)>>20)
				}
				return fmt.Errorf("reserve %d bytes for %s: %w", p.geo.DataFileSize, path, os.NewSyscallError("fallocate", err))
			}
		}
		// MAP_POPULATE: a hugepage shortage fails here rather than as SIGBUS on first touch.
		b, err := mmapFile(f, int(p.geo.DataFileSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_POPULATE)
		if err != nil {
			f.Close()
			os.Remove(path)
			return err
		}
		_ = f.Chmod(0o644)
		p.dataFile, p.data, p.dataPath = f, b, path
		return nil
	}
	if c.HugePages != HugePagesOff {
		huge, pageSize := isHugetlbfs(c.HugeDir)
		var err error
		if huge {
			if err = try(c.HugeDir, pageSize); err == nil {
				return nil
			}
		} else {
			err = fmt.Errorf("%s is not a hugetlbfs mount", c.HugeDir)
		}
		if c.HugePages == HugePagesRequire {
			return fmt.Errorf("%w: %v (see README: echo N > /proc/sys/vm/nr_hugepages)", ErrNoHugePages, err)
		}
		if c.Log != nil {
			c.Log.Warn().Err(err).Str("ring", p.name).Str("fallback", c.Dir).
				Msg("no hugepages for the ring data; using 4 KiB pages in the fallback directory")
		}
	}
	return try(c.Dir, os.Getpagesize())
}

func (p *Producer) createCtl() error {
	tmp := fmt.Sprintf("%s.%d.tmp", p.ctlPath, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return err
	}
	p.ctlFile = f
	_ = f.Chmod(0o666) // consumers write their cursor; the umask must not make that impossible
	if err := f.Truncate(CtlSize); err != nil {
		return fmt.Errorf("size %s: %w", tmp, err)
	}
	if held, err := lockExclusive(f); err != nil || held {
		return fmt.Errorf("lock %s: held=%v: %w", tmp, held, err)
	}
	if p.ctl, err = mmapFile(f, CtlSize, unix.PROT_READ|unix.PROT_WRITE, 0); err != nil {
		return err
	}
	if len(p.dataPath) >= DataPathMax {
		return fmt.Errorf("data path %s longer than %d bytes", p.dataPath, DataPathMax-1)
	}
	var sid [8]byte
	for binary.LittleEndian.Uint64(sid[:]) == 0 {
		if _, err := rand.Read(sid[:]); err != nil {
			return fmt.Errorf("session id: %w", err)
		}
	}
	le, c, g := binary.LittleEndian, p.ctl, p.geo
	le.PutUint16(c[offMajor:], MajorVersion)
	le.PutUint16(c[offMinor:], MinorVersion)
	le.PutUint32(c[offCtlSize:], CtlSize)
	le.PutUint32(c[offPolicy:], uint32(p.cfg.Policy))
	copy(c[offSessionID:], sid[:])
	le.PutUint64(c[offProducerPID:], uint64(os.Getpid()))
	le.PutUint64(c[offProducerStart:], realtimeNanos())
	le.PutUint64(c[offSlotCount:], g.SlotCount)
	le.PutUint64(c[offSlotSize:], g.SlotSize)
	le.PutUint32(c[offMaxItems:], g.MaxItems)
	le.PutUint32(c[offDescSize:], DescSize)
	le.PutUint32(c[offItemSize:], ItemSize)
	le.PutUint32(c[offPageSize:], g.PageSize)
	le.PutUint64(c[offDataFileSize:], g.DataFileSize)
	le.PutUint64(c[offDescOffset:], g.DescOffset)
	le.PutUint64(c[offItemsOffset:], g.ItemsOffset)
	le.PutUint64(c[offMetaOffset:], g.MetaOffset)
	le.PutUint64(c[offMetaSize:], g.MetaSize)
	le.PutUint64(c[offPayloadOffset:], g.PayloadOffset)
	le.PutUint64(c[offPacketOffset:], g.PacketOffset)
	le.PutUint64(c[offPacketSize:], g.PacketSize)
	le.PutUint32(c[offStatsCount:], uint32(numCounters))
	copy(c[offDataPath:offDataPath+DataPathMax-1], p.dataPath)
	le.PutUint64(c[offHeartbeat:], realtimeNanos())
	p.bindShared()
	atomic.StoreUint64(p.head, p.cfg.InitialPosition)
	atomic.StoreUint64(p.tail, p.cfg.InitialPosition)
	// magic before state, state READY last: a reader that sees READY sees the whole header.
	atomic.StoreUint64(u64at(c, offMagic), Magic)
	atomic.StoreUint32(u32at(c, offState), uint32(StateReady))
	if err := os.Rename(tmp, p.ctlPath); err != nil {
		return fmt.Errorf("publish %s: %w", p.ctlPath, err)
	}
	return nil
}

// bindShared points the producer's fields at the shared words and sets up its private slot pool.
func (p *Producer) bindShared() {
	c, g := p.ctl, p.geo
	p.head, p.tail = u64at(c, offHead), u64at(c, offTail)
	p.consWait, p.consFutex = u32at(c, offConsWaiting), u32at(c, offConsFutex)
	p.prodWait, p.prodFutex = u32at(c, offProdWaiting), u32at(c, offProdFutex)
	p.stats = (*[StatsSlots]uint64)(unsafe.Pointer(&c[offStats]))
	n := int(g.SlotCount)
	p.mask = g.SlotCount - 1
	p.descs = unsafe.Slice((*descriptor)(unsafe.Pointer(&p.data[g.DescOffset])), n)
	items := unsafe.Slice((*Item)(unsafe.Pointer(&p.data[g.ItemsOffset])), n*int(g.MaxItems))
	p.slots = make([]Slot, n)
	p.free = make([]uint32, n)
	p.posSlot = make([]uint32, n)
	for i := range p.slots {
		off := g.PayloadOffset + uint64(i)*g.SlotSize
		p.slots[i] = Slot{Index: uint32(i), Payload: p.data[off : off+g.SlotSize : off+g.SlotSize],
			items: items[i*int(g.MaxItems) : (i+1)*int(g.MaxItems)]}
		p.free[i] = uint32(i)
	}
	p.freeW = uint64(n)
	p.pos, p.reclaim = p.cfg.InitialPosition, p.cfg.InitialPosition
}

// Name is the ring's name; Geometry where its regions lie; SlotSize the payload bytes per slot.
func (p *Producer) Name() string       { return p.name }
func (p *Producer) Geometry() Geometry { return p.geo }
func (p *Producer) SlotSize() int      { return int(p.geo.SlotSize) }

// DataPath is the data file (on hugetlbfs when available); CtlPath the control file.
func (p *Producer) DataPath() string { return p.dataPath }
func (p *Producer) CtlPath() string  { return p.ctlPath }

// Huge reports whether the data file is backed by hugepages.
func (p *Producer) Huge() bool { return p.geo.PageSize > 4096 }

// Policy is what the producer does when the ring is full.
func (p *Producer) Policy() Policy { return p.cfg.Policy }

// PacketArea is the region of the data file reserved for a frame-level transport's receive buffers; it is
// inside the one mapping a NIC registers.
func (p *Producer) PacketArea() []byte {
	g := p.geo
	return p.data[g.PacketOffset : g.PacketOffset+g.PacketSize : g.PacketOffset+g.PacketSize]
}

// reclaimReleased returns to the pool the slots of positions the consumer has released.
func (p *Producer) reclaimReleased() {
	t := atomic.LoadUint64(p.tail)
	// A consumer can write anything into its cursor; never trust one outside [reclaim, pos].
	if t-p.reclaim > p.pos-p.reclaim {
		if !p.badTail && p.cfg.Log != nil {
			p.cfg.Log.Error().Uint64("tail", t).Uint64("head", p.pos).Msg("consumer cursor out of range; ignoring it")
		}
		p.badTail = true
		return
	}
	for ; p.reclaim != t; p.reclaim++ {
		s := p.posSlot[p.reclaim&p.mask]
		if s != noSlot {
			p.free[p.freeW%uint64(len(p.free))] = s
			p.freeW++
		}
	}
}

// Acquire takes a free slot for a new heap. With the drop policy it returns ErrFull when none is free
// (the caller counts the dropped heap); with the block policy it waits for the consumer, and returns
// ErrClosed if Interrupt is called meanwhile.
func (p *Producer) Acquire() (*Slot, error) {
	if p.freeR == p.freeW {
		p.reclaimReleased()
		if p.freeR == p.freeW {
			if p.cfg.Policy == PolicyDrop {
				return nil, ErrFull
			}
			if err := p.waitForRelease(0); err != nil {
				return nil, err
			}
		}
	}
	s := &p.slots[p.free[p.freeR%uint64(len(p.free))]]
	p.freeR++
	s.ResetItems()
	return s, nil
}

// waitForRelease sleeps until the consumer frees a slot (the mirror of the consumer's wait, spec §7.5).
// A zero timeout waits until Interrupt.
func (p *Producer) waitForRelease(timeout time.Duration) error {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	spinUntil := time.Now().Add(spinFor)
	for {
		if p.interrupted.Load() {
			return ErrClosed
		}
		p.reclaimReleased()
		if p.freeR != p.freeW {
			return nil
		}
		now := time.Now()
		if !deadline.IsZero() && now.After(deadline) {
			return ErrFull
		}
		if now.Before(spinUntil) {
			continue
		}
		f := atomic.LoadUint32(p.prodFutex)
		atomic.StoreUint32(p.prodWait, 1)
		p.reclaimReleased()
		if p.freeR != p.freeW {
			atomic.StoreUint32(p.prodWait, 0)
			return nil
		}
		futexWaitOn(p.prodFutex, f, maxWaitSlice)
	}
}

// Unread is the number of published positions the consumer has not released yet. For the producer's
// goroutine (it reads the producer's private position); other goroutines use Backlog.
func (p *Producer) Unread() uint64 { return p.pos - atomic.LoadUint64(p.tail) }

// Backlog is Unread from the shared cursors, safe from any goroutine (a metrics scrape): it may lag the
// producer by the heaps it is publishing at that moment.
func (p *Producer) Backlog() uint64 { return atomic.LoadUint64(p.head) - atomic.LoadUint64(p.tail) }

// WaitDrained waits until the consumer has released everything published, so closing the ring loses
// nothing. It returns ErrNoConsumer as soon as no consumer is attached (nobody would ever drain it), and
// ErrClosed when stop is closed or Interrupt is called. It sleeps on the producer futex, which a consumer
// that releases wakes.
func (p *Producer) WaitDrained(stop <-chan struct{}) error {
	for {
		if p.Unread() == 0 {
			return nil
		}
		if !p.ConsumerAttached() {
			return ErrNoConsumer
		}
		select {
		case <-stop:
			return ErrClosed
		default:
		}
		if p.interrupted.Load() {
			return ErrClosed
		}
		f := atomic.LoadUint32(p.prodFutex)
		atomic.StoreUint32(p.prodWait, 1)
		if p.Unread() == 0 {
			atomic.StoreUint32(p.prodWait, 0)
			return nil
		}
		futexWaitOn(p.prodFutex, f, 50*time.Millisecond) // short: stop is a channel, not a futex
	}
}

// ConsumerAttached reports whether a consumer holds the ring's consumer lock (a dead one does not: the
// kernel dropped its lock).
func (p *Producer) ConsumerAttached() bool {
	cons, err := consPathFor(p.ctlPath)
	if err != nil {
		return false
	}
	f, err := os.Open(cons)
	if err != nil {
		return false
	}
	defer f.Close()
	held, err := lockHeld(f)
	return err == nil && held
}

// Discard returns any acquired slot to the pool unpublished (a heap dropped after its slot was taken).
func (p *Producer) Discard(s *Slot) {
	p.free[p.freeW%uint64(len(p.free))] = s.Index
	p.freeW++
}

// Publish makes the heap in s visible to the consumer: item table, descriptor, then the head cursor with
// a release store, then a wake if the consumer sleeps (spec §7.5).
func (p *Producer) Publish(s *Slot, h HeapInfo) {
	p.writeDesc(s.Index, s.nItems, s.overflw, h)
	p.commit()
}

func (p *Producer) writeDesc(slot, nItems uint32, overflow bool, h HeapInfo) {
	d := &p.descs[p.pos&p.mask]
	d.HeapCnt, d.HeapSize, d.Received, d.TimestampNs = h.HeapCnt, h.HeapSize, h.Received, h.TimestampNs
	d.Slot, d.ItemCount, d.Packets = slot, nItems, h.Packets
	d.Flags = h.Flags
	if overflow {
		d.Flags |= FlagItemsOverflow
	}
	if slot == noSlot {
		d.Slot = 0
	}
	d.Seq = p.pos + 1
	p.posSlot[p.pos&p.mask] = slot
	p.pos++
}

func (p *Producer) commit() {
	atomic.StoreUint64(p.head, p.pos) // sequentially consistent: the release plus the fence of §7.4
	wakeIfWaiting(p.consWait, p.consFutex)
}

// PublishEndOfStream publishes the end-of-stream marker (spec §4). It needs a free slot; with none free it
// waits up to timeout (≤ 0: not at all) for the consumer and otherwise returns ErrFull (Close still marks the ring CLOSED,
// which a consumer also reads as the end).
func (p *Producer) PublishEndOfStream(timeout time.Duration) error {
	s, err := p.Acquire()
	if errors.Is(err, ErrFull) && timeout > 0 { // waitForRelease(0) would wait for ever
		if err = p.waitForRelease(timeout); err == nil {
			s, err = p.Acquire()
		}
	}
	if err != nil {
		return fmt.Errorf("publish end of stream on %s: %w", p.name, err)
	}
	p.Set(CounterEndOfStream, 1) // before the marker: a consumer that sees it reads the counter set
	p.Publish(s, HeapInfo{Flags: FlagEndOfStream, TimestampNs: realtimeNanos()})
	return nil
}

// Add adds n to a counter. Only the producer's goroutine writes counters, so a plain read of its own
// last value is safe; the store is atomic because other goroutines (recv's stats logger) and processes
// read the counters while it runs (spec §2.6: untorn, unordered). Measured: no cost per packet over the
// plain store this replaces (BenchmarkAssemble1Packet, same run).
func (p *Producer) Add(c Counter, n uint64) { atomic.StoreUint64(&p.stats[c], p.stats[c]+n) }

// Set sets a counter.
func (p *Producer) Set(c Counter, v uint64) { atomic.StoreUint64(&p.stats[c], v) }

// Stats returns the ring's counters.
func (p *Producer) Stats() Stats { return readStats(p.stats, uint32(numCounters)) }

// Interrupt makes a blocked Acquire return ErrClosed; safe from any goroutine.
func (p *Producer) Interrupt() {
	p.interrupted.Store(true)
	if p.prodFutex != nil {
		futexWakeAll(p.prodFutex)
	}
}

func (p *Producer) heartbeat() {
	defer p.beatDone.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stopBeat:
			return
		case <-t.C:
			atomic.StoreUint64(u64at(p.ctl, offHeartbeat), realtimeNanos())
		}
	}
}

// Close marks the ring CLOSED, wakes the consumer, removes the ring's files and releases the producer's
// locks (spec §7.6). An attached consumer keeps its mappings, drains what was published, then sees the
// end of stream.
func (p *Producer) Close() error {
	p.closeOnce.Do(func() {
		p.Interrupt()
		if p.stopBeat != nil {
			close(p.stopBeat)
			p.beatDone.Wait()
		}
		if p.ctl != nil {
			atomic.StoreUint32(u32at(p.ctl, offState), uint32(StateClosed))
			futexWakeAll(p.consFutex)
		}
		var errs []error
		if p.ctlFile != nil {
			errs = append(errs, os.Remove(p.ctlPath))
		}
		if p.dataFile != nil {
			errs = append(errs, os.Remove(p.dataPath))
		}
		errs = append(errs, p.release())
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// release unmaps and closes everything, dropping the locks.
func (p *Producer) release() error {
	return unmapAndClose([]*[]byte{&p.ctl, &p.data}, []**os.File{&p.ctlFile, &p.dataFile, &p.lockFile})
}
