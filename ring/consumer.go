package ring

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AttachOptions tune Attach.
type AttachOptions struct {
	// Timeout bounds the attach: retrying a stale socket (and, with Wait, a missing name) and the wait for
	// the welcome (default 5 s; <0: connect once, the welcome still gets 5 s).
	Timeout time.Duration
	// Wait retries a name that no trusted directory serves yet every 10 ms until Timeout; without it a
	// missing ring fails at once with ErrNotFound ("ring NAME not found (looked in DIR, ...)").
	Wait bool
	// Dir is where a ring is looked up by name ("": the spec's directories, §1.1).
	Dir string
	// Warnings receives one line per lookup directory skipped as untrusted (default os.Stderr).
	Warnings io.Writer
	// FromHead starts at the newest heap instead of the oldest one the ring still holds (spec §7.1).
	FromHead bool
	// MaxLatency, if positive, lets a moving stream's heaps wait up to this long before Next wakes for
	// them (coalesced wakes, spec §7.5): less CPU per heap, up to MaxLatency more latency. An idle stream
	// still sleeps until its next heap. 0 (the default): a wake per heap.
	MaxLatency time.Duration
	// SpinBudget bounds how long Next spins before sleeping (default 20 µs, <0: never spin). It spins only
	// while recent waits averaged at most half of it.
	SpinBudget time.Duration
	// Group, if not "", attaches as a member of this consumer group (spec §14): the members of a group
	// share the stream, each heap handed to exactly one of them, while consumers without a group read
	// every heap. A member starts at the newest heap (FromHead is implied). The producer knows the group
	// by GroupID(Group), a 32-bit hash: two names with the same hash are one group. A producer that does
	// not know groups refuses the attach (ErrProtocol).
	Group string
}

func (o AttachOptions) warnings() io.Writer {
	if o.Warnings != nil {
		return o.Warnings
	}
	return os.Stderr
}

// Consumer reads heaps from a ring. It is not safe for concurrent use.
type Consumer struct {
	name   string
	hdr    header
	sock   int // the attachment: closing it detaches; its hang-up is the producer's death
	ctl    []byte
	data   []byte
	region []byte
	index  uint32
	gen    uint32

	head      *atomic.Uint64
	state     *atomic.Uint32
	prodWait  *atomic.Uint32
	rowState  *atomic.Uint32
	rowGen    *atomic.Uint32
	tail      *atomic.Uint64
	consWait  *atomic.Uint32
	consFutex *atomic.Uint32
	relFutex  *atomic.Uint32
	stats     *[StatsSlots]atomic.Uint64

	descs      []descriptor
	items      []Item // the ring's item tables: read only by copying (a hostile producer may rewrite them)
	itemCopy   []Item // private copies of the item tables of held heaps, max_items per position
	mask       uint64
	read       uint64 // next position to read
	cachedHead uint64
	released   uint64 // released position, published to tail in batches

	wakeAt        *atomic.Uint64
	maxLatency    time.Duration // AttachOptions.MaxLatency
	spinBudget    time.Duration // AttachOptions.SpinBudget
	waitAvg       time.Duration // moving average of waits that found a heap
	active        bool          // the last wait found a heap: with maxLatency, sleep coalesced
	coalesceHeaps uint64        // a coalesced sleep asks to be woken when this many heaps wait
	futexAtAttach uint32        // consumer_futex when attached: Wakes counts from here
	stored        uint64        // last value stored to tail
	batch         uint64        // releases per tail store
	futexWakeups  uint64        // sleeps a FUTEX_WAKE ended (not the slice): tests prove the wake with it
	eosPending    bool          // an end-of-stream marker was read but not yet released
	eosPos        uint64

	// A group member (spec §14) hands out only the positions whose assign mask has bit; held lists, in
	// position order, those it handed out and has not released (the positions it passed over are released
	// as soon as nothing before them is held). It publishes read and handed (§14.2) in its region
	// (readW, handedW; storedRead and storedHanded are what it stored last). group is 0 for an
	// independent consumer.
	group                    uint32
	bit                      uint64
	held                     posQueue
	handed                   uint64
	readW, handedW           *atomic.Uint64
	storedRead, storedHanded uint64
}

// posQueue is a FIFO of positions: a ring buffer that doubles when full (a member holds at most
// slot_count heaps), so a steady state allocates nothing.
type posQueue struct {
	buf        []uint64
	front, len int
}

func (q *posQueue) push(v uint64) {
	if q.len == len(q.buf) {
		nb := make([]uint64, max(64, 2*len(q.buf)))
		for i := range q.len {
			nb[i] = q.buf[(q.front+i)%len(q.buf)]
		}
		q.buf, q.front = nb, 0
	}
	q.buf[(q.front+q.len)%len(q.buf)] = v
	q.len++
}

func (q *posQueue) first() uint64 { return q.buf[q.front] }

func (q *posQueue) pop() {
	q.front = (q.front + 1) % len(q.buf)
	q.len--
}

// Heap is a heap read from the ring. Its descriptor fields and Items are the consumer's private, validated
// copies; Payload views ring memory (read-only). Under the drop policy the producer may overrun a consumer
// that falls a whole ring behind and reuse the slots it holds (layout 2.1 §A): Payload's bytes are the
// heap's only while Consumer.Valid reports true, so check Valid (or Release's error) AFTER reading them.
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

// StreamEnd reports whether h is a STREAM_END marker (returned with ErrStreamEnd), not a heap.
func (h *Heap) StreamEnd() bool { return h.Flags&FlagStreamEnd != 0 }

// Complete reports whether every byte of the heap is in Payload: COMPLETE and not TRUNCATED (a producer
// never sets both, spec §4.1; a 2.1 producer did, so both are checked).
func (h *Heap) Complete() bool { return h.Flags&FlagComplete != 0 && h.Flags&FlagTruncated == 0 }

// Item returns the first item with id.
func (h *Heap) Item(id uint64) (Item, bool) {
	for _, it := range h.Items {
		if it.ID == id {
			return it, true
		}
	}
	return Item{}, false
}

// ItemData returns an address item's bytes within the payload, refusing a cut one: ErrItemCut when the
// item ran past the slot of a TRUNCATED heap (ItemBytes hands out its first bytes), ErrImmediate for an
// immediate item.
func (h *Heap) ItemData(it Item) ([]byte, error) {
	switch {
	case it.Immediate():
		return nil, fmt.Errorf("item %#x: %w", it.ID, ErrImmediate)
	case it.Cut():
		return nil, fmt.Errorf("item %#x of heap %d (%d bytes in a %d-byte slot): %w", it.ID, h.HeapCnt, h.HeapSize, cap(h.Payload), ErrItemCut)
	}
	return h.ItemBytes(it), nil
}

// ItemBytes returns an address item's bytes within the payload, or nil for an immediate item: for a cut
// item (it.Cut()) the first bytes only, as kept — ItemData refuses those. The consumer validated offset and
// length against the slot when it read the heap.
func (h *Heap) ItemBytes(it Item) []byte {
	if it.Immediate() {
		return nil
	}
	full := h.Payload[:cap(h.Payload)]
	return full[it.Value : it.Value+it.Length : it.Value+it.Length]
}

// helloMinor is the minor a consumer's hello states (tests play a 2.1 member with it).
var helloMinor = MinorVersion

// Attach connects to ring nameOrPath (a name, or a socket path containing '/') as one of its consumers
// (spec §9).
func Attach(nameOrPath string, opt AttachOptions) (c *Consumer, err error) {
	role := hello{Major: MajorVersion, Minor: helloMinor, Role: RoleConsumer, Start: StartOldest, Group: GroupID(opt.Group)}
	if opt.FromHead || role.Group != 0 {
		role.Start = StartHead
	}
	a, err := dial(nameOrPath, dialOptions{dir: opt.Dir, timeout: opt.Timeout, wait: opt.Wait, warn: opt.warnings()}, role)
	if err != nil {
		return nil, err
	}
	c = &Consumer{name: a.name, sock: a.sock, maxLatency: opt.MaxLatency, spinBudget: opt.SpinBudget, index: a.w.Index, gen: a.w.Generation}
	if c.spinBudget == 0 {
		c.spinBudget = spinFor
	}
	defer func() {
		if err != nil {
			c.unmap()
			c = nil
		}
	}()
	if err = c.mapAll(a); err != nil {
		return c, fmt.Errorf("attach %s: %w", a.name, err)
	}
	c.released = c.tail.Load()
	c.read, c.cachedHead, c.stored = c.released, c.released, c.released
	// Storing tail once per batch rather than per heap keeps the producer from taking a cache miss on it
	// per heap; an eighth of the ring keeps the producer supplied with free slots (spec §7.4).
	c.batch = min(max(c.hdr.SlotCount/8, 1), 64)
	if role.Group != 0 {
		c.group, c.bit = role.Group, 1<<c.index
		c.readW, c.handedW = u64at(c.region, regRead), u64at(c.region, regHanded)
		c.storedRead = c.read
	}
	return c, nil
}

// attachment is what the handshake hands over: the connected socket, the welcome and its descriptors.
type attachment struct {
	name string
	path string // the socket it connected to
	sock int
	w    welcome
	fds  []int
}

func (a *attachment) closeFDs() {
	for _, fd := range a.fds {
		unix.Close(fd)
	}
	a.fds = nil
}

// connectSeqpacket connects to a Unix SOCK_SEQPACKET socket; a path too long for sockaddr_un is reached
// through its directory's descriptor.
func connectSeqpacket(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	target := path
	if len(path) >= 100 {
		dfd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(fd)
			return -1, os.NewSyscallError("open", err)
		}
		defer unix.Close(dfd)
		target = "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + filepath.Base(path)
	}
	if err := retryEINTR(func() error { return unix.Connect(fd, &unix.SockaddrUnix{Name: target}) }); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("connect", err)
	}
	return fd, nil
}

// retryEINTR repeats a system call a signal interrupted (the Go runtime's own preemption signals among them).
func retryEINTR(call func() error) error {
	for {
		if err := call(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// trustedProducer is the client's check of who serves the socket (spec §1.2, layout 2.1 §B): root,
// ourselves, or the owner of the trusted directory it was found in.
func trustedProducer(uid uint32, c candidate) bool {
	return uid == 0 || int(uid) == os.Geteuid() || uid == c.owner
}

// handshake sends the hello and reads the welcome with its descriptors, within left (spec §1.2).
func (a *attachment) handshake(c candidate, h hello, left time.Duration) error {
	cred, err := unix.GetsockoptUcred(a.sock, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return os.NewSyscallError("getsockopt(SO_PEERCRED)", err)
	}
	if !trustedProducer(cred.Uid, c) {
		return fmt.Errorf("%w: %s is served by uid %d, which is not trusted (not root, not us, not the owner of its directory)",
			ErrPermission, c.path, cred.Uid)
	}
	tv := unix.NsecToTimeval(left.Nanoseconds())
	if err := unix.SetsockoptTimeval(a.sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return os.NewSyscallError("setsockopt(SO_RCVTIMEO)", err)
	}
	// A producer refusing a connection at once (busy) or stopping may have closed it before the hello: an
	// error record may still be there to read, so a closed peer is not the answer yet.
	if err := retryEINTR(func() error { _, err := unix.Write(a.sock, h.encode()); return err }); err != nil &&
		!errors.Is(err, unix.EPIPE) && !errors.Is(err, unix.ECONNRESET) {
		return fmt.Errorf("send hello: %w", os.NewSyscallError("write", err))
	}
	buf := make([]byte, ErrorRecordMax)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn, flags int
	err = retryEINTR(func() (err error) {
		n, oobn, flags, _, err = unix.Recvmsg(a.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		return err
	})
	if errors.Is(err, unix.ECONNRESET) {
		n, err = 0, nil // closed by the producer before it read our hello: as an empty answer
	}
	if err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return fmt.Errorf("%w: the producer did not answer within %v", ErrProtocol, left)
		}
		return fmt.Errorf("receive welcome: %w", os.NewSyscallError("recvmsg", err))
	}
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range msgs {
			if fds, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				a.fds = append(a.fds, fds...)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: the producer closed the connection without an answer (it is stopping)", ErrProducerGone)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fmt.Errorf("%w: the producer's answer was longer than the spec allows", ErrProtocol)
	}
	if a.w, err = decodeWelcome(buf[:n]); err != nil {
		return err
	}
	want := 3
	if h.Role == RoleObserver {
		want = 1
	}
	if len(a.fds) != want {
		return fmt.Errorf("%w: welcome carried %d descriptors, want %d", ErrProtocol, len(a.fds), want)
	}
	return nil
}

// mapControl checks and maps the control memory read-only and parses its header (spec §9 steps 4–5).
func mapControl(a *attachment) ([]byte, header, error) {
	if err := checkSealed(a.fds[0], "control", needReadOnly, a.w.CtlSize); err != nil {
		return nil, header{}, err
	}
	if a.w.CtlSize < offTable || a.w.CtlSize > uint64(CtlSizeFor(MaxConsumersLimit)) {
		return nil, header{}, fmt.Errorf("%w: ctl_size %d", ErrCorrupt, a.w.CtlSize)
	}
	ctl, err := unix.Mmap(a.fds[0], 0, int(a.w.CtlSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, header{}, fmt.Errorf("map control memory: %w", os.NewSyscallError("mmap", err))
	}
	h, err := parseHeader(ctl)
	if err != nil {
		unix.Munmap(ctl)
		return nil, header{}, err
	}
	return ctl, h, nil
}

func (c *Consumer) mapAll(a *attachment) error {
	defer a.closeFDs() // the mappings keep the memory
	var err error
	if c.ctl, c.hdr, err = mapControl(a); err != nil {
		return err
	}
	g := c.hdr.Geometry
	if g.DataSize != a.w.DataSize || uint64(c.index) >= uint64(c.hdr.MaxConsumers) || a.w.RegionLength != RegionSize {
		return fmt.Errorf("%w: welcome (data %d, row %d, region %d) disagrees with the header (data %d, %d rows)",
			ErrCorrupt, a.w.DataSize, c.index, a.w.RegionLength, g.DataSize, c.hdr.MaxConsumers)
	}
	if err := checkSealed(a.fds[1], "data", needReadOnly, g.DataSize); err != nil {
		return err
	}
	if err := checkSealed(a.fds[2], "consumer region", needRegion, RegionSize); err != nil {
		return err
	}
	if c.data, err = unix.Mmap(a.fds[1], 0, int(g.DataSize), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("map data memory: %w", os.NewSyscallError("mmap", err))
	}
	if c.region, err = unix.Mmap(a.fds[2], 0, RegionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("map consumer region: %w", os.NewSyscallError("mmap", err))
	}
	ct, rg := c.ctl, c.region
	row := offTable + TableRowSize*int(c.index)
	c.head, c.state, c.prodWait = u64at(ct, offHead), u32at(ct, offState), u32at(ct, offProdWaiting)
	c.rowState, c.rowGen = u32at(ct, row+rowState), u32at(ct, row+rowGeneration)
	c.tail, c.consWait, c.consFutex = u64at(rg, regTail), u32at(rg, regConsWaiting), u32at(rg, regConsFutex)
	c.relFutex, c.wakeAt = u32at(rg, regReleaseFutex), u64at(rg, regWakeAt)
	c.coalesceHeaps = max(1, g.SlotCount/2)
	u64at(rg, regSpinBudget).Store(uint64(max(c.spinBudget, 0)))
	c.futexAtAttach = c.consFutex.Load()
	c.stats = (*[StatsSlots]atomic.Uint64)(unsafe.Pointer(&ct[offStats]))
	c.descs = unsafe.Slice((*descriptor)(unsafe.Pointer(&c.data[g.DescOffset])), g.SlotCount)
	c.items = unsafe.Slice((*Item)(unsafe.Pointer(&c.data[g.ItemsOffset])), g.SlotCount*uint64(g.MaxItems))
	c.itemCopy = make([]Item, g.SlotCount*uint64(g.MaxItems))
	c.mask = g.SlotCount - 1
	return nil
}

// Index is this consumer's row in the ring's consumer table.
func (c *Consumer) Index() int { return int(c.index) }

// GroupID is the group this consumer is a member of (GroupID of AttachOptions.Group), 0 for none.
func (c *Consumer) GroupID() uint32 { return c.group }

// attached reports whether the producer still counts this consumer as attached (layout 2.1 §A): the row's
// state, then its generation, two separate acquire loads in that order. While it holds, no slot this
// consumer holds has been reused.
func (c *Consumer) attached() bool {
	return c.rowState != nil && ConsumerState(c.rowState.Load()) == ConsumerAttached &&
		c.rowGen.Load() == c.gen
}

// detached reports why the producer detached this consumer (spec §7.6), nil while it is attached.
func (c *Consumer) detached() error {
	if c.attached() {
		return nil
	}
	if c.rowState == nil {
		return fmt.Errorf("ring %s: %w (closed)", c.name, ErrDetached)
	}
	st := ConsumerState(c.rowState.Load())
	row := c.ctl[offTable+TableRowSize*int(c.index):]
	switch {
	case st > ConsumerGone: // a minor never adds a row state (spec §8)
		return fmt.Errorf("%w: ring %s: consumer row %d has unknown state %d", ErrCorrupt, c.name, c.index, uint32(st))
	case c.rowGen.Load() != c.gen:
		return fmt.Errorf("ring %s: %w (its row was given to another consumer)", c.name, ErrDetached)
	case st == ConsumerOverrun:
		return &OverrunError{Ring: c.name, Lost: u64at(row, rowLostHeaps).Load()}
	case st == ConsumerBadCursor:
		return fmt.Errorf("ring %s: %w: invalid cursor", c.name, ErrDetached)
	}
	return fmt.Errorf("ring %s: %w (%s)", c.name, ErrDetached, st)
}

// Valid reports whether h's bytes are still h's: the consumer is still attached, so the producer has not
// reused the slot, and h is held (read, not yet released). Check it after reading Payload: bytes read
// before a true Valid were the heap's (layout 2.1 §A).
func (c *Consumer) Valid(h Heap) bool {
	return h.Position-c.released < c.read-c.released && c.attached()
}

// SessionID identifies the producer run (the ring's epoch).
func (c *Consumer) SessionID() uint64 { return c.hdr.SessionID }

// ProducerPID is the producer's process id as its header states it (for messages).
func (c *Consumer) ProducerPID() uint64 { return c.hdr.ProducerPID }

// Geometry is where the ring's regions lie, as validated at attach.
func (c *Consumer) Geometry() Geometry { return c.hdr.Geometry }

// Policy is what the producer does when the ring is full.
func (c *Consumer) Policy() Policy { return c.hdr.Policy }

// Stats reads the producer's counters.
func (c *Consumer) Stats() Stats { return readStats(c.stats, c.hdr.StatsCount) }

// TryNext returns the next heap without waiting; ok is false when none is published yet.
func (c *Consumer) TryNext() (Heap, bool, error) {
	for {
		h, ok, passed, err := c.tryRead()
		if !passed {
			return h, ok, err
		}
	}
}

// tryRead is one step of TryNext; passed reports a position a group member passed over (spec §14.4: not
// assigned to it, or lapped), after which TryNext reads on.
func (c *Consumer) tryRead() (h Heap, ok, passed bool, err error) {
	if c.read == c.cachedHead {
		c.cachedHead = c.head.Load()
		if err := c.detached(); err != nil {
			return Heap{}, false, false, err
		}
		if c.read == c.cachedHead {
			c.flushRelease() // caught up: hand the released slots back now
			return Heap{}, false, false, nil
		}
		if c.group != 0 && c.cachedHead-c.read > c.hdr.SlotCount {
			// Lapped (row checked just above): the positions missed were not this member's (§14.4).
			c.lap(c.cachedHead)
		}
		if c.cachedHead-c.released > c.hdr.SlotCount {
			return Heap{}, false, false, fmt.Errorf("%w: head %d is %d positions past tail %d", ErrCorrupt, c.cachedHead, c.cachedHead-c.released, c.released)
		}
	}
	d := c.descs[c.read&c.mask] // a copy: no field is read from shared memory twice
	if c.group != 0 {
		// Seq again after the copy: a descriptor rewritten meanwhile (only another member's can be, §14.5)
		// is a lapped one, whatever the copy says.
		seq := atomic.LoadUint64(&c.descs[c.read&c.mask].Seq)
		if ahead := seq - (c.read + 1); seq != d.Seq || ahead != 0 && ahead < 1<<63 && ahead%c.hdr.SlotCount == 0 {
			if derr := c.detached(); derr != nil {
				return Heap{}, false, false, derr
			}
			c.lap(c.head.Load())
			return Heap{}, false, true, nil
		}
		if d.Assign&c.bit == 0 && d.Flags&(FlagEndOfStream|FlagStreamEnd) == 0 {
			// Another member's position: only its seq is checked (its slot and items are not read).
			if d.Seq != c.read+1 {
				if derr := c.detached(); derr != nil {
					return Heap{}, false, false, derr
				}
				return Heap{}, false, false, fmt.Errorf("%w: descriptor of position %d has seq %d", ErrCorrupt, c.read, d.Seq)
			}
			c.passOver(c.read + 1)
			return Heap{}, false, true, nil
		}
	}
	h, err = c.heapFrom(c.read, &d)
	// Checked on every call, after the copies: a heap whose slot was reused while it was being read is
	// never handed out, and an overrun consumer learns it (with the heaps it lost) at its next call.
	if derr := c.detached(); derr != nil {
		return Heap{}, false, false, derr
	}
	if err != nil {
		return Heap{}, false, false, err
	}
	if c.group != 0 {
		if h.Flags&(FlagEndOfStream|FlagStreamEnd) != 0 { // for everyone: passed over, released with what is before it
			c.passOver(c.read + 1)
			if h.Flags&FlagStreamEnd != 0 {
				return Heap{Position: h.Position, HeapCnt: h.HeapCnt, TimestampNs: h.TimestampNs, Flags: h.Flags}, false, false, ErrStreamEnd
			}
			return Heap{}, false, false, ErrEndOfStream
		}
		c.read++
		c.held.push(h.Position)
		c.handed++
		return h, true, false, nil
	}
	c.read++
	if h.Flags&(FlagEndOfStream|FlagStreamEnd) != 0 {
		// The marker goes back with the heaps before it: releasing it now would also release heaps the
		// consumer still holds. (A later marker replaces a pending one: the earlier goes back with the
		// release of any heap after it.)
		c.eosPending, c.eosPos = true, h.Position
		if c.released == h.Position {
			_ = c.Release(h) // attachment checked just above
		}
		if h.Flags&FlagStreamEnd != 0 {
			return Heap{Position: h.Position, HeapCnt: h.HeapCnt, TimestampNs: h.TimestampNs, Flags: h.Flags}, false, false, ErrStreamEnd
		}
		return Heap{}, false, false, ErrEndOfStream
	}
	return h, true, false, nil
}

// lap moves a lapped member past the positions whose descriptors were rewritten (spec §14.4): to
// head − slot_count (its own oldest queued position is never older: §14.5; if that descriptor is being
// rewritten, it was not its own and the seq check finds it), or at least one position on (the one found
// rewritten, when head had not yet moved a ring past it).
func (c *Consumer) lap(head uint64) {
	if head-c.read > c.cachedHead-c.read {
		c.cachedHead = head
	}
	to := head - c.hdr.SlotCount
	if to-c.read > head-c.read || to == c.read { // not ahead of read
		to = c.read + 1
	}
	c.passOver(to)
}

// passOver moves a group member's read to next past positions that were not its own (spec §14.4): they
// are released at once when nothing before them is held, else with the held heap before them.
func (c *Consumer) passOver(next uint64) {
	c.read = next
	if c.held.len == 0 {
		c.released = next
	}
	if c.released-c.stored >= c.batch || c.read-c.storedRead >= c.batch {
		c.flushRelease()
	}
}

// heapAt copies position pos's descriptor and item table into private memory and validates the copies
// against the geometry (spec §7.3 step 2): nothing validated is read from shared memory again, so a
// producer rewriting them meanwhile cannot make the consumer read out of bounds.
func (c *Consumer) heapAt(pos uint64) (Heap, error) {
	d := c.descs[pos&c.mask] // a copy
	return c.heapFrom(pos, &d)
}

// heapFrom validates d, a private copy of position pos's descriptor, copies its item table and returns
// the heap.
func (c *Consumer) heapFrom(pos uint64, d *descriptor) (Heap, error) {
	items, err := validateHeap(&c.hdr.Geometry, pos, d, c.items, c.itemCopy)
	h := Heap{Position: pos, HeapCnt: d.HeapCnt, HeapSize: d.HeapSize, Received: d.Received,
		TimestampNs: d.TimestampNs, Flags: d.Flags, Packets: d.Packets, Slot: d.Slot, Items: items}
	if err != nil {
		return h, err
	}
	off := c.hdr.PayloadOffset + uint64(d.Slot)*c.hdr.SlotSize
	h.Payload = c.data[off : off+d.Received : off+c.hdr.SlotSize]
	return h, nil
}

// validateHeap checks a private copy d of position pos's descriptor (seq, slot, item count, received),
// copies its item entries from shared into private (max_items entries per position) and checks every
// address item against the slot. It returns the private item slice.
func validateHeap(g *Geometry, pos uint64, d *descriptor, shared, private []Item) ([]Item, error) {
	if d.Seq != pos+1 {
		return nil, fmt.Errorf("%w: descriptor of position %d has seq %d", ErrCorrupt, pos, d.Seq)
	}
	if uint64(d.Slot) >= g.SlotCount || d.ItemCount > g.MaxItems || d.Received > g.SlotSize {
		return nil, fmt.Errorf("%w: position %d: slot %d, items %d, received %d out of range", ErrCorrupt, pos, d.Slot, d.ItemCount, d.Received)
	}
	n := uint64(d.ItemCount)
	src := uint64(d.Slot) * uint64(g.MaxItems)
	dst := (pos & (g.SlotCount - 1)) * uint64(g.MaxItems)
	items := private[dst : dst+n : dst+n]
	copy(items, shared[src:src+n])
	for _, it := range items {
		if !it.Immediate() && (it.Value > g.SlotSize || it.Length > g.SlotSize-it.Value) {
			return nil, fmt.Errorf("%w: position %d: item %#x [%d,+%d) outside slot", ErrCorrupt, pos, it.ID, it.Value, it.Length)
		}
	}
	return items, nil
}

// Next waits up to timeout (<0: forever) for the next heap. It returns ErrEndOfStream after the last heap
// of a stream that ended, ErrProducerGone when the producer died and everything it published has been
// read, and ErrTimeout when the time runs out.
//
// Waiting (spec §7.5): it spins only while recent waits were shorter than the spin budget, then sleeps on
// its futex. With MaxLatency, a moving stream is read in coalesced sleeps: the producer wakes it only
// when half the ring is waiting, and it wakes itself after MaxLatency; a sleep that finds nothing new
// makes the stream idle again, and the next heap wakes it at once.
func (c *Consumer) Next(timeout time.Duration) (Heap, error) {
	if h, ok, err := c.TryNext(); ok || err != nil {
		return h, err
	}
	c.flushRelease() // about to wait: the producer may be waiting for these slots
	start := time.Now()
	if spin := c.spinLimit(); spin > 0 {
		for spins := 0; ; spins++ {
			if h, ok, err := c.TryNext(); ok || err != nil {
				c.noteWait(start)
				return h, err
			}
			if spins%64 == 63 && time.Since(start) >= spin {
				break
			}
		}
	}
	for {
		coalesce := c.maxLatency > 0 && c.active
		wakeAt := c.read + 1
		if coalesce {
			wakeAt = c.read + c.coalesceHeaps
		}
		f := c.consFutex.Load()
		c.wakeAt.Store(wakeAt)
		c.consWait.Store(1) // sequentially consistent: the fence before re-reading head
		if h, ok, err := c.TryNext(); ok || err != nil {
			c.consWait.Store(0)
			c.noteWait(start)
			return h, err
		}
		st := State(c.state.Load())
		if st != StateReady && st != StateClosed { // a minor never adds a header state (spec §8)
			c.consWait.Store(0)
			return Heap{}, fmt.Errorf("%w: ring %s: header state %d", ErrCorrupt, c.name, uint32(st))
		}
		if st == StateClosed {
			// Everything was published before CLOSED was stored: one more look drains it.
			c.consWait.Store(0)
			if h, ok, err := c.TryNext(); ok || err != nil {
				return h, err
			}
			return Heap{}, ErrEndOfStream
		}
		slice := maxWaitSlice
		if coalesce {
			slice = c.maxLatency
		}
		if timeout >= 0 {
			left := timeout - time.Since(start)
			if left <= 0 {
				c.consWait.Store(0)
				return Heap{}, ErrTimeout
			}
			slice = min(slice, left)
		}
		sliceStart := time.Now()
		if futexWaitOn(c.consFutex, f, slice) {
			c.futexWakeups++
		}
		if time.Since(sliceStart) < slice {
			continue // woken (or a spurious wake): look again
		}
		if coalesce {
			// The latency bound passed: read what came; nothing at all means the stream went idle.
			if h, ok, err := c.TryNext(); ok || err != nil {
				c.consWait.Store(0)
				c.noteWait(start)
				return h, err
			}
			c.active = false
		}
		if err := c.detached(); err != nil {
			return Heap{}, err
		}
		if err := c.checkProducer(); err != nil {
			return Heap{}, err
		}
	}
}

// spinLimit is how long Next spins before it sleeps: not at all with MaxLatency (the caller chose CPU
// over latency), otherwise up to the spin budget while recent waits averaged at most half of it —
// spinning for a heap that comes later than that costs more than the futex round trip it saves.
func (c *Consumer) spinLimit() time.Duration {
	if c.maxLatency > 0 || c.spinBudget <= 0 || c.waitAvg > c.spinBudget/2 {
		return 0
	}
	return c.spinBudget
}

// noteWait records how long a wait that found a heap took (a moving average of the last ~8) and marks
// the stream active.
func (c *Consumer) noteWait(start time.Time) {
	c.waitAvg += (time.Since(start) - c.waitAvg) / 8
	c.active = true
}

// Wakes is how many times the producer has woken this consumer since it attached (the movement of the
// consumer futex word, spec §7.4): what a sleeping consumer costs the producer in syscalls.
func (c *Consumer) Wakes() uint32 { return c.consFutex.Load() - c.futexAtAttach }

// checkProducer reports ErrProducerGone once the producer has hung up the attachment and everything it
// published has been read (spec §7.6).
func (c *Consumer) checkProducer() error {
	if c.ProducerAlive() {
		return nil
	}
	if State(c.state.Load()) == StateClosed {
		return nil // a clean close: the wait loop reports end of stream after draining
	}
	if c.head.Load() != c.read {
		return nil // published heaps are still to be read
	}
	return fmt.Errorf("ring %s: %w (pid %d)", c.name, ErrProducerGone, c.hdr.ProducerPID)
}

// ProducerAlive reports whether the producer still holds the attachment open.
func (c *Consumer) ProducerAlive() bool { return socketAlive(c.sock) }

// socketAlive polls a connected socket without waiting: a hang-up, an error or a read of 0 bytes is the
// peer gone.
func socketAlive(fd int) bool {
	if fd < 0 {
		return false
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	n, err := unix.Poll(pfd, 0)
	if err != nil {
		return errors.Is(err, unix.EINTR) // interrupted: ask again next time
	}
	if n == 0 {
		return true
	}
	if pfd[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
		return false
	}
	var b [1]byte
	m, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return !(err == nil && m == 0)
}

// Release gives back h and every heap read before it, in position order (spec §7.3 step 5). The shared
// cursor is stored once per batch of releases, and always before the consumer waits or detaches. It
// returns an *OverrunError (errors.Is ErrOverrun) when the producer overran this consumer while it held h
// (h's bytes may have been rewritten while it was read), or another ErrDetached error when the producer
// detached it for another reason; nil otherwise.
func (c *Consumer) Release(h Heap) error {
	next := h.Position + 1
	if next-c.released > c.read-c.released { // not read yet, or released already
		return c.detached()
	}
	if c.group != 0 {
		// A member: the positions it passed over after h go back with it, up to the next heap it holds;
		// and its tail is stored at once, so the producer sees its share done (§14.4).
		for c.held.len > 0 && c.held.first()-c.released < next-c.released { // before next
			c.held.pop()
		}
		c.released = c.read
		if c.held.len > 0 {
			c.released = c.held.first()
		}
		c.flushRelease()
		return c.detached()
	}
	c.released = next
	if c.eosPending && next == c.eosPos {
		c.released, c.eosPending = next+1, false
	}
	if c.released-c.stored >= c.batch {
		c.flushRelease()
	}
	return c.detached()
}

// flushRelease publishes the released position to the producer and wakes it if it waits (spec §7.4); a
// member stores its read and handed first (§14.2: the producer reads them after tail).
func (c *Consumer) flushRelease() {
	if c.group != 0 && (c.storedRead != c.read || c.storedHanded != c.handed) {
		c.storedRead, c.storedHanded = c.read, c.handed
		c.handedW.Store(c.handed)
		c.readW.Store(c.read)
		if c.stored == c.released && c.prodWait.Load() != 0 {
			c.relFutex.Store(c.relFutex.Load() + 1)
			futexWake(c.relFutex)
		}
	}
	if c.stored == c.released {
		return
	}
	c.stored = c.released
	c.tail.Store(c.released) // sequentially consistent: the fence before reading producer_waiting
	if c.prodWait.Load() != 0 {
		c.relFutex.Store(c.relFutex.Load() + 1)
		futexWake(c.relFutex)
	}
}

// Close detaches: what was released is handed back, and closing the connection tells the producer this
// consumer holds nothing any more.
func (c *Consumer) Close() error {
	if c.region != nil {
		c.flushRelease()
	}
	return c.unmap()
}

func (c *Consumer) unmap() error {
	c.rowState, c.rowGen = nil, nil // Valid and Release after Close: detached, not a fault
	var errs []error
	for _, m := range []*[]byte{&c.data, &c.ctl, &c.region} {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	if c.sock >= 0 {
		errs = append(errs, unix.Close(c.sock))
		c.sock = -1
	}
	return errors.Join(errs...)
}
