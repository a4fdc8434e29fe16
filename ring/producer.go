package ring

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"os/user"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/internal/rate"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// HugePages says which pages back the data memory.
type HugePages int

const (
	// HugePagesAuto uses hugetlbfs when it is mounted and has the pages, else /dev/shm with a warning.
	HugePagesAuto HugePages = iota
	// HugePagesRequire fails when hugepages cannot back the data memory.
	HugePagesRequire
	// HugePagesOff uses 4 KiB pages.
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
	// Dir is the ring directory for the socket and the lock file (default DefaultDir(): spec §1.1; should a
	// stranger have made that shared-memory default first, the next default under /tmp).
	Dir          string
	dirDefaulted bool // Dir was not given: the next default may replace an unsafe one
	// MaxConsumers is how many consumers may attach at once (default 8, at most 64).
	MaxConsumers int
	// MaxObservers is how many observers (stat, ls) may be connected at once (default 4): each holds a
	// connection and a descriptor, so a flood of them is refused, not served.
	MaxObservers int
	// Group, if set, lets members of this group attach (socket mode 0660, SO_PEERCRED group check).
	Group string
	// ReplayTimestamps marks descriptors' timestamps as capture times (header feature REPLAY_TIMESTAMPS).
	ReplayTimestamps bool
	// InitialPosition starts the cursors somewhere other than 0: tests use values near 2^64 to prove
	// that every client handles wrap-around.
	InitialPosition uint64
	// Chunks, if its Heaps is set, makes a chunk-mode ring (spec §13): each position a chunk of heaps with a
	// presence map. Axis and Step default to 1; SlotSize, if 0, is derived (payload + presence map, rounded
	// up to 64), else must hold both.
	Chunks ChunkGeometry
	// Groups, if not empty, grants consumer groups (spec §14.1): only these groups may be joined, each by
	// the uids and gids it lists (and root); independent consumers are admitted as before. Without it
	// every group is open.
	Groups map[string]GroupGrant
	// Version is the producing program's name and version, written to the header's producer_version
	// (2.2, spec §2; cut to ProducerVersionMax bytes) so stat and consumers can say what serves the ring.
	Version string
	Log     *zerolog.Logger // warnings (hugepage fallback, stale ring replaced); nil: silent
	// NoHeartbeat, for tests that must be deterministic (internal/ringsim), runs no heartbeat: heartbeat_ns
	// stays at creation's and the table's released columns move only when the producer reads cursors.
	NoHeartbeat bool
}

func (c *Config) setDefaults() error {
	if err := c.setChunkDefaults(); err != nil {
		return err
	}
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
		c.Dir, c.dirDefaulted = DefaultDir(), true
	}
	if c.MaxConsumers == 0 {
		c.MaxConsumers = DefaultMaxConsumer
	}
	if c.MaxObservers == 0 {
		c.MaxObservers = DefaultMaxObservers
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
	case c.MaxConsumers < 1 || c.MaxConsumers > MaxConsumersLimit:
		return fmt.Errorf("%w: max consumers %d must be in 1..%d", ErrBadConfig, c.MaxConsumers, MaxConsumersLimit)
	case c.MaxObservers < 1:
		return fmt.Errorf("%w: max observers %d must be at least 1", ErrBadConfig, c.MaxObservers)
	case c.Policy != PolicyDrop && c.Policy != PolicyBlock:
		return fmt.Errorf("%w: policy %d", ErrBadConfig, c.Policy)
	}
	c.SlotSize = int(alignUp(uint64(c.SlotSize), 64))
	return c.checkSizes()
}

// checkSizes refuses a geometry whose memory size does not fit in 64 bits (each product and sum checked:
// spec §3's regions one after another, each 4096-aligned), before anything is sized or mapped.
func (c *Config) checkSizes() error {
	n := uint64(c.SlotCount)
	total, ok := uint64(0), true
	add := func(v uint64, okv bool) {
		var carry uint64
		total, carry = bits.Add64(total, v+RegionAlign, 0)
		ok = ok && okv && carry == 0 && v+RegionAlign > v
	}
	mul := func(a, b uint64) (uint64, bool) {
		hi, lo := bits.Mul64(a, b)
		return lo, hi == 0
	}
	add(mul(n, DescSize))
	add(mul(n, uint64(c.MaxItems)*ItemSize))
	add(uint64(c.MetaSize), true)
	add(mul(n, uint64(c.SlotSize)))
	add(uint64(c.PacketArea), true)
	if !ok || total > 1<<62 {
		return fmt.Errorf("%w: %d slots × %d bytes (%d items each) do not fit in memory: the ring's size overflows", ErrBadConfig, c.SlotCount, c.SlotSize, c.MaxItems)
	}
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

// DefaultMaxObservers is how many observers a ring serves at once unless Config.MaxObservers says.
const DefaultMaxObservers = 4

// Producer creates a ring, serves its consumers and publishes heaps into it. Its methods other than
// Close, Interrupt, Consumers, Backlog and Stats must be called from one goroutine (the hot path).
type Producer struct {
	name string
	cfg  Config
	geo  Geometry
	huge bool
	sid  uint64

	dir      *ringDir
	lockFile *os.File
	ctlMem   shm // read-only for clients once sealed
	dataMem  shm
	ctl      []byte
	data     []byte
	ln       *net.UnixListener
	gid      int // --group's gid, -1 without

	head     *atomic.Uint64
	oldest   *atomic.Uint64
	prodWait *atomic.Uint32
	stats    *[StatsSlots]atomic.Uint64

	descs []descriptor
	slots []Slot
	mask  uint64
	pos   uint64 // next position to publish
	// committed is head as last stored: positions in [committed, pos) are staged, not yet visible.
	committed uint64
	batching  bool // between BeginBatch and EndBatch: Publish stages, Add accumulates in pending
	ended     bool // END_OF_STREAM is published: it is final (spec §4.1), nothing may follow it
	pending   [numCounters]uint64
	dirty     uint32   // bit c: pending[c] holds an unstored increment
	posSlot   []uint32 // slot named by each unreleased position
	// posNeed, per position (& mask): the rows of group members that must still release it before its slot
	// is free (spec §14); 0 without groups. Hot path only (reclaim runs on it, under mu).
	posNeed []uint64
	// scan: positions below it have been looked at by reclaim and freed unless a group member still holds
	// them; every position from scan to head holds its slot (so a new consumer may start there).
	scan uint64
	// windowEnd: no slot is taken for a position at or past it — every consumer must stay within
	// slot_count positions of head, and posSlot within one ring of the oldest held position (spec §14: a
	// group member behind by a whole ring holds the others back). inflight: slots taken, not yet
	// published or discarded.
	windowEnd, inflight uint64
	picks               uint64 // assignments made: a member's lastPick orders ties (round robin)
	commits             uint64 // commits that assigned positions: a member's lastQCommit says it got one
	// free is a LIFO of free slots (capacity: every slot, so pushing never allocates): the slot released
	// last is filled next, still in cache, so a ring's size costs no CPU while consumers keep up.
	free []uint32
	// reclaimEvery: the hot path looks for released slots every this many acquires, not only when the
	// pool is empty, so the pool's top stays the slots consumers just released; sinceReclaim counts.
	reclaimEvery, sinceReclaim int
	absorbRate                 rate.Meter // positions published per second, for Absorbs

	// mu guards the consumer set, the table rows, reclaim and grave: admission (server goroutine) and
	// reclaiming (hot path: when the pool is empty, and every reclaimEvery takes) must agree on which
	// positions are held.
	mu        sync.Mutex
	reclaim   uint64    // positions below this have had their slots returned to the pool
	members   []*member // attached consumers
	observers int       // connected observers, at most cfg.MaxObservers
	readMark  uint64    // the furthest any detached consumer released: what no consumer read starts here
	grave     []*member // detached ones whose regions the hot path may still be reading (hotInUse)
	// rescan: a departure or a release seen off the hot path cleared bits below scan; the next reclaim
	// frees what became free (spec §14.7). holders is holdersLocked's reused list.
	rescan  bool
	holders []*member
	// settleFront (while settleFrontSet): a departed member's settled positions before it that no attached
	// independent consumer needed at its detach are free (spec §14.7); with nobody attached the hot path's
	// reclaim advances scan to it (with somebody attached, reclaim finds them itself). An attach clears it.
	settleFront    uint64
	settleFrontSet bool
	grants         map[uint32]grant // Config.Groups by group id; nil: every group is open
	// blockedOn is the row + 1 the hot path waits for (ctl blocked_on), blockedSince when that began, and
	// blockLogged when the log last said so (hot path only).
	blockedOn                 uint32
	blockedSince, blockLogged time.Time
	// hotBusy is set while the hot path sleeps on a member's release futex (outside mu); hotDone is the
	// head of the last commit whose wakes are done, so head != hotDone while a commit reads members'
	// regions. A region detached meanwhile waits in grave; otherwise it is unmapped at detach.
	hotBusy atomic.Bool
	hotDone atomic.Uint64
	// inCommit: the hot path is inside a commit that may store head without mu; groupAttach: a group
	// member's attach is under way (commits take mu meanwhile). See commitWake.
	inCommit, groupAttach atomic.Bool

	helloTimeouts atomic.Uint64 // connections closed for sending no hello within helloTimeout
	closing       bool
	setGen        uint64
	snap          atomic.Pointer[memberSet] // attached consumers, for the hot path's lock-free wakes
	hotSnap       *memberSet                // the set the hot path last woke from
	attachC       chan struct{}             // a consumer attached (wakes a block producer with none)

	waitWord    atomic.Pointer[atomic.Uint32] // the futex word a blocked hot path sleeps on, for Interrupt
	interrupted atomic.Bool
	futexWoken  atomic.Uint64 // sleepers the kernel woke for our futex wakes of consumers and Interrupt (tests)
	stopBeat    chan struct{}
	beatDone    sync.WaitGroup
	serveDone   sync.WaitGroup
	handlers    sync.WaitGroup             // connection goroutines: they use the memfds until they end
	conns       map[*net.UnixConn]struct{} // every open connection, under mu
	closeOnce   sync.Once
	closeErr    error
}

// Create makes ring name: its memory (sized and reserved before anything is written), the sealed
// descriptors consumers will receive, and the socket that serves them (spec §1). A live producer's ring
// is refused with ErrInUse; a dead one's leftovers are replaced.
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
	p = &Producer{name: name, cfg: cfg, gid: -1, ctlMem: shm{fd: -1}, dataMem: shm{fd: -1},
		attachC: make(chan struct{}, 1), conns: map[*net.UnixConn]struct{}{}}
	defer func() {
		if err != nil {
			p.release()
			p = nil
		}
	}()
	if cfg.Group != "" {
		g, gerr := user.LookupGroup(cfg.Group)
		if gerr != nil {
			return p, fmt.Errorf("create ring %s: %w: group %q: %v", name, ErrBadConfig, cfg.Group, gerr)
		}
		p.gid, _ = strconv.Atoi(g.Gid)
	}
	if err = p.setGrants(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if p.dir, err = p.openDefaultDir(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	var held bool
	if p.lockFile, held, err = p.dir.lock(name); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if held {
		return p, fmt.Errorf("create ring %s: %w (%s)", name, ErrInUse, p.SocketPath())
	}
	if err = p.createData(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if err = p.createCtl(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	if err = p.listen(); err != nil {
		return p, fmt.Errorf("create ring %s: %w", name, err)
	}
	p.stopBeat = make(chan struct{})
	if !cfg.NoHeartbeat {
		p.beatDone.Add(1)
		go p.heartbeat()
	}
	p.serveDone.Add(1)
	go p.serve()
	return p, nil
}

// openDefaultDir opens the ring directory: the one configured, or, when none was, the first default that
// passes openRingDir's checks (spec §1.1): a stranger who made /dev/shm/ibvbridge-UID first is skipped with
// one warning, not obeyed, and the ring is made in the next default. A configured directory that fails
// is refused, never skipped.
func (p *Producer) openDefaultDir() (*ringDir, error) {
	if !p.cfg.dirDefaulted {
		return openRingDir(p.cfg.Dir)
	}
	dirs := defaultDirs()
	var err error
	for i, d := range dirs {
		var rd *ringDir
		if rd, err = openRingDir(d); err == nil {
			p.cfg.Dir = d
			return rd, nil
		}
		if !errors.Is(err, ErrUnsafeDir) || i == len(dirs)-1 {
			return nil, err
		}
		if p.cfg.Log != nil {
			p.cfg.Log.Warn().Err(err).Str("next", dirs[i+1]).Msgf("skipping %s; using %s", d, dirs[i+1])
		}
	}
	return nil, err
}

// createData makes the data memory: a hugetlb memfd when asked and possible, else shmem (spec §1).
func (p *Producer) createData() error {
	c := &p.cfg
	var geoErr error
	lay := func(pageSize uint32) {
		p.geo = layoutGeometry(uint64(c.SlotCount), uint64(c.SlotSize), uint32(c.MaxItems),
			uint64(c.MetaSize), uint64(c.PacketArea), pageSize)
		if err := p.geo.Validate(); err != nil { // the consumers' check, before anything is sized
			geoErr = fmt.Errorf("%w: %v", ErrBadConfig, err)
		}
	}
	memName := "ibvbridge." + p.name + ".data"
	if c.HugePages != HugePagesOff {
		fd, pageSize, err := newHugeMemfd(memName)
		if err == nil {
			lay(pageSize)
			if geoErr != nil {
				unix.Close(fd)
				return geoErr
			}
			var b []byte
			if b, err = sizeAndMap(fd, p.geo.DataSize, true); err == nil {
				p.dataMem, p.huge = shm{fd: fd, mem: b}, true
				return nil
			}
			unix.Close(fd)
		}
		if c.HugePages == HugePagesRequire {
			if errors.Is(err, ErrNoHugePages) {
				return err
			}
			return fmt.Errorf("%w: %v (see README: echo N > /proc/sys/vm/nr_hugepages)", ErrNoHugePages, err)
		}
		if c.Log != nil {
			c.Log.Warn().Err(err).Str("ring", p.name).Msg("no hugepages for the ring data; using 4 KiB pages")
		}
	}
	lay(uint32(os.Getpagesize()))
	if geoErr != nil {
		return geoErr
	}
	s, err := newShm(memName, p.geo.DataSize)
	if err != nil {
		return err
	}
	p.dataMem = *s
	return nil
}

func (p *Producer) createCtl() error {
	ctlSize := CtlSizeFor(p.cfg.MaxConsumers)
	s, err := newShm("ibvbridge."+p.name+".ctl", uint64(ctlSize))
	if err != nil {
		return err
	}
	p.ctlMem = *s
	p.ctl, p.data = p.ctlMem.mem, p.dataMem.mem
	var sid [8]byte
	for binary.LittleEndian.Uint64(sid[:]) == 0 {
		if _, err := rand.Read(sid[:]); err != nil {
			return fmt.Errorf("session id: %w", err)
		}
	}
	p.sid = binary.LittleEndian.Uint64(sid[:])
	le, c, g := binary.LittleEndian, p.ctl, p.geo
	le.PutUint16(c[offMajor:], MajorVersion)
	le.PutUint16(c[offMinor:], MinorVersion)
	le.PutUint32(c[offCtlSize:], uint32(ctlSize))
	le.PutUint32(c[offPolicy:], uint32(p.cfg.Policy))
	le.PutUint64(c[offSessionID:], p.sid)
	le.PutUint64(c[offProducerPID:], uint64(os.Getpid()))
	le.PutUint64(c[offProducerStart:], realtimeNanos())
	le.PutUint64(c[offSlotCount:], g.SlotCount)
	le.PutUint64(c[offSlotSize:], g.SlotSize)
	le.PutUint32(c[offMaxItems:], g.MaxItems)
	le.PutUint32(c[offDescSize:], DescSize)
	le.PutUint32(c[offItemSize:], ItemSize)
	le.PutUint32(c[offPageSize:], g.PageSize)
	le.PutUint64(c[offDataSize:], g.DataSize)
	le.PutUint64(c[offDescOffset:], g.DescOffset)
	le.PutUint64(c[offItemsOffset:], g.ItemsOffset)
	le.PutUint64(c[offMetaOffset:], g.MetaOffset)
	le.PutUint64(c[offMetaSize:], g.MetaSize)
	le.PutUint64(c[offPayloadOffset:], g.PayloadOffset)
	le.PutUint64(c[offPacketOffset:], g.PacketOffset)
	le.PutUint64(c[offPacketSize:], g.PacketSize)
	var features uint64
	if p.cfg.ReplayTimestamps {
		features |= FeatureReplayTimestamps
	}
	if p.cfg.Chunks.Enabled() {
		features |= FeatureChunks
		p.cfg.Chunks.write(c)
	}
	le.PutUint64(c[offFeatures:], features)
	le.PutUint32(c[offStatsCount:], uint32(numCounters))
	le.PutUint32(c[offMaxConsumers:], uint32(p.cfg.MaxConsumers))
	le.PutUint64(c[offHeartbeat:], realtimeNanos())
	copy(c[offProducerVersion:offProducerVersion+ProducerVersionMax], p.cfg.Version)
	p.bindShared()
	p.head.Store(p.cfg.InitialPosition)
	p.oldest.Store(p.cfg.InitialPosition)
	u64at(c, offMagic).Store(Magic)
	u32at(c, offState).Store(uint32(StateReady))
	// From here on no client can write, grow or shrink either memory; our own mappings stay writable.
	if err := seal(p.dataMem.fd, sealsReadOnly); err != nil {
		return fmt.Errorf("seal data memory: %w", err)
	}
	if err := seal(p.ctlMem.fd, sealsReadOnly); err != nil {
		return fmt.Errorf("seal control memory: %w", err)
	}
	return nil
}

// bindShared points the producer's fields at the shared words and sets up its private slot pool.
func (p *Producer) bindShared() {
	c, g := p.ctl, p.geo
	p.head, p.oldest, p.prodWait = u64at(c, offHead), u64at(c, offOldest), u32at(c, offProdWaiting)
	p.stats = (*[StatsSlots]atomic.Uint64)(unsafe.Pointer(&c[offStats]))
	n := int(g.SlotCount)
	p.mask = g.SlotCount - 1
	p.descs = unsafe.Slice((*descriptor)(unsafe.Pointer(&p.data[g.DescOffset])), n)
	items := unsafe.Slice((*Item)(unsafe.Pointer(&p.data[g.ItemsOffset])), n*int(g.MaxItems))
	p.slots = make([]Slot, n)
	p.free = make([]uint32, 0, n)
	p.posSlot = make([]uint32, n)
	p.posNeed = make([]uint64, n)
	p.holders = make([]*member, 0, MaxConsumersLimit)
	for i := range p.slots {
		off := g.PayloadOffset + uint64(i)*g.SlotSize
		p.slots[i] = Slot{Index: uint32(i), Payload: p.data[off : off+g.SlotSize : off+g.SlotSize],
			items: items[i*int(g.MaxItems) : (i+1)*int(g.MaxItems)]}
		p.free = append(p.free, uint32(n-1-i)) // slot 0 on top: filled first
	}
	// About 256 KiB of slots between looks, 64 at most (a consumer stores its cursor every 64 releases at
	// most, spec §7.4): a look (a mutex and each consumer's cursor) costs far less than the cache misses a
	// deeper working set costs the kernel's copy into the slots, and small heaps pay it once per 64.
	p.reclaimEvery = max(1, min(64, (256<<10)/int(max(1, g.SlotSize))))
	p.pos, p.reclaim, p.readMark = p.cfg.InitialPosition, p.cfg.InitialPosition, p.cfg.InitialPosition
	p.committed = p.cfg.InitialPosition // head as stored above: nothing staged
	p.scan, p.windowEnd = p.cfg.InitialPosition, p.cfg.InitialPosition+g.SlotCount
	p.hotDone.Store(p.cfg.InitialPosition)
	p.snap.Store(&memberSet{})
	p.hotSnap = p.snap.Load()
}

// Name is the ring's name.
func (p *Producer) Name() string { return p.name }

// Geometry is where the ring's regions lie in the data memory.
func (p *Producer) Geometry() Geometry { return p.geo }

// SlotSize is the payload bytes per slot.
func (p *Producer) SlotSize() int { return int(p.geo.SlotSize) }

// SocketPath is where consumers connect.
func (p *Producer) SocketPath() string { return p.cfg.Dir + "/" + SocketName(p.name) }

// Dir is the ring directory (socket and lock file).
func (p *Producer) Dir() string { return p.cfg.Dir }

// SessionID is this producer run's random epoch.
func (p *Producer) SessionID() uint64 { return p.sid }

// Huge reports whether the data memory is backed by hugepages.
func (p *Producer) Huge() bool { return p.huge }

// Policy is what the producer does when the ring is full.
func (p *Producer) Policy() Policy { return p.cfg.Policy }

// PacketArea is the region of the data memory reserved for a frame-level transport's receive buffers; it
// is inside the one mapping a NIC registers.
func (p *Producer) PacketArea() []byte {
	g := p.geo
	return p.data[g.PacketOffset : g.PacketOffset+g.PacketSize : g.PacketOffset+g.PacketSize]
}

// freeSlot returns a slot to the pool's top.
func (p *Producer) freeSlot(s uint32) { p.free = append(p.free, s) }

// reclaimLocked reads every attached consumer's cursor (spec §7.2) and returns to the pool the slots of
// the positions all of them have released — for a group member, only the positions assigned to it
// (§14.5). With nobody attached, drop reclaims the oldest position that holds a slot (the ring keeps the
// newest heaps for a later consumer); block keeps everything. Hot path, mu held.
func (p *Producer) reclaimLocked() {
	defer p.setWindowLocked()
	if len(p.members) == 0 {
		// A departed member's settled positions are free now, under block too (spec §14.7): a slot free and
		// within the window is taken without waiting for an attach.
		if p.settleFrontSet {
			p.settleFrontSet = false
			for ; before(p.scan, p.settleFront); p.scan++ { // at most slot_count: settleFront ≤ committed
				if p.posNeed[p.scan&p.mask] == 0 {
					p.freePos(p.scan)
				}
			}
			p.oldest.Store(p.scan)
		}
		p.rescanLocked()
		for before(p.reclaim, p.scan) && p.posSlot[p.reclaim&p.mask] == noSlot {
			p.reclaim++
		}
		if p.cfg.Policy != PolicyDrop || p.slotReady() {
			return
		}
		to := p.reclaim
		for before(to, p.pos) && p.posSlot[to&p.mask] == noSlot {
			to++
		}
		if before(to, p.pos) {
			to++
		}
		for ; before(p.reclaim, to); p.reclaim++ {
			p.freePos(p.reclaim)
		}
		// Passed scan (none attached: no group holds anything), up to pos itself: reclaim never stays ahead
		// of scan, or the loops above that walk from reclaim to scan would walk the long way round.
		if p.reclaim-p.scan <= p.pos-p.scan {
			p.scan = p.reclaim
		}
		p.oldest.Store(p.scan)
		return
	}
	p.readCursorsLocked(true)
	if len(p.members) == 0 { // every member was detached just now
		return
	}
	p.rescanLocked()
	// The independent consumers' frontier: positions below it are free unless a group member holds them.
	// Staged positions (from committed on) are not assigned yet: never past them.
	to := p.committed
	for _, m := range p.members {
		if m.group == 0 && before(m.released, to) {
			to = m.released
		}
	}
	for ; before(p.scan, to); p.scan++ {
		if p.posNeed[p.scan&p.mask] == 0 {
			p.freePos(p.scan)
		}
	}
	for before(p.reclaim, p.scan) && p.posSlot[p.reclaim&p.mask] == noSlot {
		p.reclaim++
	}
	p.oldest.Store(p.scan)
}

// rescanLocked frees, after bits were cleared off the hot path (a settle, a sweep), the positions below scan
// that nobody needs any more (at most slot_count), and moves reclaim past those that hold no slot. Hot path,
// mu held.
func (p *Producer) rescanLocked() {
	if !p.rescan {
		return
	}
	p.rescan = false
	start, ok := p.span(p.reclaim, p.scan)
	for q := start; ok && q != p.scan; q++ {
		if p.posNeed[q&p.mask] == 0 {
			p.freePos(q)
		}
	}
	for before(p.reclaim, p.scan) && p.posSlot[p.reclaim&p.mask] == noSlot {
		p.reclaim++
	}
}

// freePos returns position q's slot to the pool, if it still holds one.
func (p *Producer) freePos(q uint64) {
	if s := p.posSlot[q&p.mask]; s != noSlot {
		p.freeSlot(s)
		p.posSlot[q&p.mask] = noSlot
	}
}

// windowFull reports whether the next slot taken could not be published within the window (spec §14).
func (p *Producer) windowFull() bool { return int64(p.pos+p.inflight-p.windowEnd) >= 0 }

// slotReady reports whether a slot may be taken now: the pool has one and its position is within the
// window (spec §14).
func (p *Producer) slotReady() bool { return len(p.free) != 0 && !p.windowFull() }

// Acquire takes a free slot for a new heap. With the drop policy it returns ErrFull when none is free
// (the caller counts the dropped heap); with the block policy it waits for the slowest consumer, and
// returns ErrClosed if Interrupt is called meanwhile.
func (p *Producer) Acquire() (*Slot, error) {
	if p.ended {
		return nil, p.endedError("acquire a slot")
	}
	if !p.slotReady() {
		p.commit() // staged heaps first: consumers cannot release what they cannot see
		p.mu.Lock()
		p.reclaimLocked()
		if !p.slotReady() && p.cfg.Policy == PolicyDrop && !p.overrunLocked() {
			p.mu.Unlock()
			return nil, ErrFull
		}
		p.mu.Unlock()
		if !p.slotReady() {
			if err := p.waitFor(p.slotFreeLocked, nil, 0); err != nil {
				return nil, err
			}
		}
	}
	return p.takeFree(), nil
}

// TryAcquire takes a free slot if the pool has one, without waiting: for a slot taken ahead
// of need (the assembler's next heaps), which Discard gives back if it goes unused. nil when none.
func (p *Producer) TryAcquire() *Slot {
	if !p.slotReady() || p.ended {
		return nil
	}
	return p.takeFree()
}

// ConsumerRows reads the consumer table's non-free rows as stat shows them (pid, row, lag behind head),
// for naming a slow consumer in a log line. Safe from any goroutine.
func (p *Producer) ConsumerRows() []ConsumerInfo {
	return consumerRows(p.ctl, p.cfg.MaxConsumers, p.head.Load())
}

// FreeSlots is how many slots the pool holds now, without reclaiming. Hot path only.
func (p *Producer) FreeSlots() int { return len(p.free) }

// takeFree pops the pool's top: the slot released last. Every reclaimEvery takes it first returns the
// slots consumers have released since, if the lock is free (never waits: the server goroutine may hold it).
func (p *Producer) takeFree() *Slot {
	if p.sinceReclaim++; p.sinceReclaim >= p.reclaimEvery && p.mu.TryLock() {
		p.sinceReclaim = 0
		p.reclaimLocked()
		p.mu.Unlock()
	}
	n := len(p.free) - 1
	s := &p.slots[p.free[n]]
	p.free = p.free[:n]
	p.inflight++
	s.ResetItems()
	return s
}

func (p *Producer) slotFreeLocked() bool {
	p.reclaimLocked()
	return p.slotReady()
}

// waitFor sleeps until done (called with mu held) reports true: the mirror of the consumer's wait (spec
// §7.4), on the release futex of the slowest consumer, or on an attach when none is attached. A zero
// timeout waits until stop is closed or Interrupt is called (ErrClosed); a timeout that passes is ErrFull.
func (p *Producer) waitFor(done func() bool, stop <-chan struct{}, timeout time.Duration) error {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	spinUntil := time.Now().Add(spinFor)
	for {
		if p.interrupted.Load() {
			p.noteBlocked(nil)
			return ErrClosed
		}
		select {
		case <-stop:
			p.noteBlocked(nil)
			return ErrClosed
		default:
		}
		p.mu.Lock()
		ok := done()
		slow := p.blockerLocked()
		p.mu.Unlock()
		if ok {
			p.noteBlocked(nil)
			return nil
		}
		p.noteBlocked(slow)
		now := time.Now()
		if !deadline.IsZero() && now.After(deadline) {
			p.noteBlocked(nil)
			return ErrFull
		}
		if now.Before(spinUntil) {
			continue
		}
		slice := testWaitSlice // maxWaitSlice but in a test binary (testhooks.go)
		if stop != nil {
			slice = 50 * time.Millisecond // stop is a channel, not a futex
		}
		if !deadline.IsZero() {
			slice = max(min(slice, time.Until(deadline)), time.Millisecond)
		}
		if slow == nil {
			select {
			case <-p.attachC:
			case <-stop:
			case <-time.After(slice):
			}
			continue
		}
		p.sleepOnRelease(done, slow, slice)
	}
}

// blockLogAfter is how long a block producer waits for one consumer before its log names it (spec §14.6:
// within a second); blockLogEvery how often it says so again while the wait goes on.
const (
	blockLogAfter = 500 * time.Millisecond
	blockLogEvery = 10 * time.Second
)

// noteBlocked says whom a waiting producer waits for (spec §14.6): ctl blocked_on (row + 1) and
// blocked_since_ns, and, once the wait has lasted blockLogAfter, a log line naming the consumer's row,
// pid, group and the position the producer waits to publish. nil: not waiting (both words 0). Hot path.
func (p *Producer) noteBlocked(m *member) {
	if m == nil {
		if p.blockedOn != 0 {
			p.blockedOn = 0
			u32at(p.ctl, offBlockedOn).Store(0)
			u64at(p.ctl, offBlockedSince).Store(0)
		}
		return
	}
	now := time.Now()
	if row := uint32(m.index + 1); p.blockedOn != row {
		p.blockedOn, p.blockedSince, p.blockLogged = row, now, time.Time{}
		u64at(p.ctl, offBlockedSince).Store(uint64(now.UnixNano()))
		u32at(p.ctl, offBlockedOn).Store(row)
	}
	if p.cfg.Log == nil || now.Sub(p.blockedSince) < blockLogAfter || !p.blockLogged.IsZero() && now.Sub(p.blockLogged) < blockLogEvery {
		return
	}
	p.blockLogged = now
	group := "none"
	if m.group != 0 {
		group = p.groupName(m.group)
	}
	p.cfg.Log.Warn().Str("ring", p.name).Int("row", m.index).Int32("consumer_pid", m.pid).Str("group", group).
		Uint64("position", p.pos+p.inflight).Dur("waiting", now.Sub(p.blockedSince)).
		Msg("block policy: waiting for a consumer to release")
}

// sleepOnRelease sleeps up to slice on slow's release futex unless done (mu taken) has become true
// (spec §7.4). slow's region stays mapped meanwhile: the hot path is busy with it (hotBusy).
func (p *Producer) sleepOnRelease(done func() bool, slow *member, slice time.Duration) {
	p.mu.Lock()
	if slow.detached {
		p.mu.Unlock()
		return
	}
	p.hotBusy.Store(true)
	p.mu.Unlock()
	f := slow.relFutex.Load()
	p.prodWait.Store(1) // sequentially consistent: the fence before the re-check
	p.mu.Lock()
	ok := done()
	p.mu.Unlock()
	if !ok {
		p.waitWord.Store(slow.relFutex)
		if !p.interrupted.Load() {
			futexWaitOn(slow.relFutex, f, slice)
		}
		p.waitWord.Store(nil)
	}
	p.prodWait.Store(0)
	p.mu.Lock()
	p.hotBusy.Store(false)
	p.buryLocked()
	p.mu.Unlock()
}

// behindLocked is how far the attached consumer furthest behind head is: head minus the least released
// position (0 with none attached), as ibvbridge stat and the C and Python producers count unread heaps
// (spec §2.2). Not slowestLocked's order: a group member behind the reclaim point holds no slot, yet
// the positions assigned to it past there are unread. A cursor past head (readCursorsLocked's bound on
// the hot path is what it committed, which may be ahead of the head a caller loaded) counts 0. mu held.
func (p *Producer) behindLocked(head uint64) uint64 {
	var most uint64
	for _, m := range p.members {
		if d := head - m.released; int64(d) > 0 {
			most = max(most, d)
		}
	}
	return most
}

// Unread is how many published positions the attached consumer furthest behind has not released (0 with
// none attached). For the hot path's goroutine.
func (p *Producer) Unread() uint64 {
	p.commit()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reclaimLocked()
	return p.behindLocked(p.pos)
}

// UnreadHeaps is how many published heaps no consumer has read (layout 2.1 §D): head minus the least
// released position of the attached consumers, or, with none attached, head minus the furthest a departed
// consumer released (or the oldest heap the ring still holds, if that is later). A consumer that read
// everything and left leaves 0, whatever the ring still holds for a later one. Safe from any goroutine.
func (p *Producer) UnreadHeaps() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readCursorsLocked(false)
	head := p.head.Load() // after the cursors: none is past it (each was at most the head loaded after it)
	if len(p.members) > 0 {
		return p.behindLocked(head)
	}
	from := p.readMark
	if oldest := p.oldest.Load(); int64(oldest-from) > 0 {
		from = oldest
	}
	if int64(head-from) < 0 {
		return 0
	}
	return head - from
}

// Backlog is how many published heaps still hold their slots (head − oldest), safe from any goroutine
// (a metrics scrape): what the slowest consumer has not released, or, with none attached, what a
// consumer attaching at the oldest position would find.
func (p *Producer) Backlog() uint64 { return p.head.Load() - p.oldest.Load() }

// WaitDrained waits until every attached consumer has released everything published, so closing the
// ring loses nothing. It returns ErrNoConsumer as soon as no consumer is attached (nobody would ever
// drain it), and ErrClosed when stop is closed or Interrupt is called.
func (p *Producer) WaitDrained(stop <-chan struct{}) error {
	p.commit()
	none := false
	err := p.waitFor(func() bool {
		p.reclaimLocked()
		if len(p.members) == 0 {
			none = true
			return true
		}
		return p.reclaim == p.pos && p.behindLocked(p.pos) == 0
	}, stop, 0)
	if err == nil && none {
		return ErrNoConsumer
	}
	return err
}

// HelloTimeouts is how many connections were closed for sending no hello within 2 s (layout 2.1 §C): a
// silent stranger holds a descriptor that long at most. Safe from any goroutine.
func (p *Producer) HelloTimeouts() uint64 { return p.helloTimeouts.Load() }

// Consumers is how many consumers are attached now. Safe from any goroutine.
func (p *Producer) Consumers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.members)
}

// Discard returns an acquired slot to the pool unpublished (a heap dropped after its slot was taken).
func (p *Producer) Discard(s *Slot) {
	p.inflight--
	p.freeSlot(s.Index)
}

// Publish makes the heap in s visible to consumers: item table, descriptor, then the head cursor with a
// release store, then a wake for every consumer that sleeps (spec §7.3, §7.5). Inside a batch the last
// two steps wait for EndBatch. After PublishEndOfStream it publishes nothing, returns s to the pool and
// returns ErrStreamEnded: the marker is final (§4.1).
func (p *Producer) Publish(s *Slot, h HeapInfo) error {
	if p.ended {
		p.freeSlot(s.Index)
		return p.endedError("publish heap " + strconv.FormatUint(h.HeapCnt, 10))
	}
	p.writeDesc(s.Index, s.nItems, s.overflw, h)
	if !p.batching {
		p.commit()
	}
	return nil
}

// endedError is the refusal of anything after the end-of-stream marker (spec §4.1: it is final).
func (p *Producer) endedError(what string) error {
	return fmt.Errorf("ring %s: cannot %s: %w", p.name, what, ErrStreamEnded)
}

// BeginBatch starts a batch: heaps published until EndBatch become visible together, with one head store
// and one wake check for the lot, and counter increments are stored once, at EndBatch. A source brackets
// each receive batch (a recvmmsg, a completion-queue poll) with them: the head store is a cache line the
// consumers are reading, and on x86-64 each of Go's atomic stores is a full fence. Acquire, WaitDrained,
// Unread and PublishEndOfStream publish what is staged first, so a batch never waits on itself.
func (p *Producer) BeginBatch() { p.batching = true }

// EndBatch publishes the batch's heaps and stores its counters.
func (p *Producer) EndBatch() {
	p.batching = false
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
	d.Assign = 0 // commit assigns it when groups exist (spec §14)
	d.Seq = p.pos + 1
	p.posSlot[p.pos&p.mask] = slot
	p.posNeed[p.pos&p.mask] = 0
	p.inflight--
	p.pos++
}

// commit stores the pending counters, then publishes the staged positions (spec §7.3) and wakes the
// consumers that sleep (§7.5). Counters first: a consumer that sees a heap sees it counted.
func (p *Producer) commit() { p.commitWake(false) }

// commitWake is commit; force wakes every sleeping consumer whatever position it asked to be woken at.
func (p *Producer) commitWake(force bool) {
	for d := p.dirty; d != 0; d &= d - 1 {
		c := bits.TrailingZeros32(d)
		p.stats[c].Store(p.stats[c].Load() + p.pending[c]) // this goroutine is the only writer
		p.pending[c] = 0
	}
	p.dirty = 0
	if p.committed == p.pos {
		return
	}
	// inCommit brackets a commit that may store head without mu (Dekker with the first group member's
	// attach: it stores groupAttach, then waits for inCommit 0 before it loads head as the member's start,
	// so no position published unassigned comes after that start).
	p.inCommit.Store(true)
	if p.snap.Load().groups != nil || p.groupAttach.Load() {
		p.inCommit.Store(false)
		// Groups: positions are assigned, and head stored, under mu (spec §14.7), from cursors read just
		// now (§14.3), so a detach settles exactly the positions published before it.
		p.mu.Lock()
		p.reclaimLocked()
		p.assignLocked(p.snap.Load().groups)
		p.committed = p.pos
		p.head.Store(p.pos) // sequentially consistent: the release plus the fence of §7.5
		p.mu.Unlock()
	} else {
		p.committed = p.pos
		p.head.Store(p.pos) // sequentially consistent: the release plus the fence of §7.5
		p.inCommit.Store(false)
	}
	// The head store above marks the wakes' start and hotDone their end (both sequentially consistent, the
	// set loaded between them): a detach that publishes its new set, then finds hotDone == head, knows the
	// hot path is not inside a commit that loaded the old set (hotInUse). One store per commit.
	s := p.snap.Load()
	for _, m := range s.members {
		head := p.pos
		if m.v22() && !force {
			// A 2.2 member is woken only for a position assigned to it (spec §14.4).
			if m.lastQCommit != p.commits {
				continue
			}
			head = m.lastQ + 1
		}
		if woke, n := wakeIfWaiting(m.consWait, m.consFutex, m.wakeAt, head, force); woke {
			p.futexWoken.Add(uint64(n))
			w := u64at(m.row, rowWakes)
			w.Add(1) // rows are written under mu or by the hot path alone; Add is one instruction
		}
	}
	p.hotDone.Store(p.pos)
	if s != p.hotSnap {
		p.adopt(s)
	}
}

// adopt notes that the hot path has moved to a new consumer set and unmaps the regions detached while it
// was busy (none are reachable from it now).
func (p *Producer) adopt(s *memberSet) {
	p.hotSnap = s
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buryLocked()
}

// PublishEndOfStream publishes the end-of-stream marker (spec §4.1) for the stream-stop heap stopCnt (0
// when the input ended without one). It needs a free slot; with none free it waits up to timeout (≤ 0:
// not at all) for the consumers and otherwise returns ErrFull (Close still marks the ring CLOSED, which a
// consumer also reads as the end).
func (p *Producer) PublishEndOfStream(stopCnt uint64, timeout time.Duration) error {
	if p.ended {
		return p.endedError("publish a second end-of-stream marker")
	}
	s, err := p.Acquire()
	if errors.Is(err, ErrFull) && timeout > 0 {
		if err = p.waitFor(p.slotFreeLocked, nil, timeout); err == nil {
			s, err = p.Acquire()
		}
	}
	if err != nil {
		return fmt.Errorf("publish end of stream on %s: %w", p.name, err)
	}
	p.Set(CounterEndOfStream, 1) // before the marker: a consumer that sees it reads the counter set
	p.writeDesc(s.Index, 0, false, HeapInfo{HeapCnt: stopCnt, Flags: FlagEndOfStream, TimestampNs: realtimeNanos()})
	p.ended = true
	p.commitWake(true) // even inside a batch, and for consumers whose wakes are coalesced
	return nil
}

// PublishStreamEnd publishes a STREAM_END marker (2.2, spec §4.1) for the stream-stop heap stopCnt: one
// stream ended and the ring goes on, so a consumer learns where the stream ended and the next begins, in
// order with the heaps. Like the end-of-stream marker it takes a slot (waiting up to timeout for one) and
// wakes every sleeping consumer; unlike it, it is not final. It counts streams_ended.
func (p *Producer) PublishStreamEnd(stopCnt uint64, timeout time.Duration) error {
	if p.ended {
		return p.endedError("publish a stream-end marker")
	}
	s, err := p.Acquire()
	if errors.Is(err, ErrFull) && timeout > 0 {
		if err = p.waitFor(p.slotFreeLocked, nil, timeout); err == nil {
			s, err = p.Acquire()
		}
	}
	if err != nil {
		return fmt.Errorf("publish stream end on %s: %w", p.name, err)
	}
	p.Add(CounterStreamsEnded, 1)
	p.writeDesc(s.Index, 0, false, HeapInfo{HeapCnt: stopCnt, Flags: FlagStreamEnd, TimestampNs: realtimeNanos()})
	p.commitWake(true)
	return nil
}

// Add adds n to a counter (inside a batch: at EndBatch). Only the producer's goroutine writes counters
// other than the consumer ones (which change under mu), so a plain read of its own last value is safe;
// the store is atomic because other goroutines and processes read the counters while it runs (spec §2.3:
// untorn, unordered).
func (p *Producer) Add(c Counter, n uint64) {
	if p.batching {
		p.pending[c] += n
		p.dirty |= 1 << c
		return
	}
	p.stats[c].Store(p.stats[c].Load() + n)
}

// Set sets a counter now, dropping any increment of it still pending in a batch.
func (p *Producer) Set(c Counter, v uint64) {
	p.pending[c] = 0
	p.dirty &^= 1 << c
	p.stats[c].Store(v)
}

// Stats returns the ring's counters.
func (p *Producer) Stats() Stats { return readStats(p.stats, uint32(numCounters)) }

// Interrupt makes a blocked Acquire or WaitDrained return ErrClosed; safe from any goroutine.
func (p *Producer) Interrupt() {
	p.interrupted.Store(true)
	// Under mu: the word is in a consumer region, which stays mapped while the hot path, busy with it,
	// has not cleared hotBusy (under mu).
	p.mu.Lock()
	if w := p.waitWord.Load(); w != nil && !testMutants["no-wake"] {
		p.futexWoken.Add(uint64(futexWakeAll(w)))
	}
	p.mu.Unlock()
}

func (p *Producer) heartbeat() {
	defer p.beatDone.Done()
	t := time.NewTicker(testBeat) // 100 ms but in a test binary (testhooks.go)
	defer t.Stop()
	for {
		select {
		case <-p.stopBeat:
			return
		case <-t.C:
			u64at(p.ctl, offHeartbeat).Store(realtimeNanos())
			// Keep the consumer table's positions current for `stat` while the stream is idle.
			p.mu.Lock()
			p.readCursorsLocked(false)
			p.buryLocked()
			p.mu.Unlock()
		}
	}
}

// Close marks the ring CLOSED, wakes every consumer, stops serving, removes the socket and the lock file
// and unmaps (spec §7.6). Attached consumers keep their mappings, drain what was published, then see the
// end of stream; the memory is freed when the last of them unmaps. Call it once the hot path has
// returned (Interrupt stops a blocked one).
func (p *Producer) Close() error {
	p.closeOnce.Do(func() {
		p.Interrupt()
		if p.stopBeat != nil {
			close(p.stopBeat)
			p.beatDone.Wait()
		}
		if p.ctl != nil {
			u32at(p.ctl, offState).Store(uint32(StateClosed))
		}
		p.closeErr = p.release()
	})
	return p.closeErr
}

// release stops serving, detaches every consumer (after waking it: it reads CLOSED, or, if Create failed,
// never got anything), unmaps and closes everything, and removes the socket and the lock file.
func (p *Producer) release() error {
	var errs []error
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	if p.ln != nil {
		errs = append(errs, p.ln.Close())
		p.serveDone.Wait()
	}
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	for _, m := range p.members {
		// The row stays "attached": a consumer drains what was published, then reads CLOSED as the end.
		futexWakeAll(m.consFutex)
		m.detached = true
		m.hangUp()
		m.region.close()
	}
	p.members = nil
	p.hotBusy.Store(false) // the hot path has returned (Close's contract)
	p.buryAllLocked()
	p.mu.Unlock()
	p.handlers.Wait() // none may still be passing a descriptor we are about to close
	p.ctl, p.data = nil, nil
	errs = append(errs, p.ctlMem.close(), p.dataMem.close())
	if p.dir != nil {
		if p.ln != nil {
			errs = append(errs, p.dir.unlink(SocketName(p.name)))
		}
		if p.lockFile != nil {
			// Unlinked while still locked: a producer that opened the old inode sees it replaced (lock()).
			errs = append(errs, p.dir.unlink(lockName(p.name)))
		}
	}
	if p.lockFile != nil {
		errs = append(errs, p.lockFile.Close())
		p.lockFile = nil
	}
	errs = append(errs, p.dir.close())
	return errors.Join(errs...)
}
