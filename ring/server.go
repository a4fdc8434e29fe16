package ring

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// member is one attached consumer as the producer sees it: its row in the consumer table (producer
// memory) and its region (consumer-writable, never trusted).
type member struct {
	index  int
	row    []byte // its 128-byte row in the control memory
	region shm
	conn   *net.UnixConn
	pid    int32

	tail      *atomic.Uint64
	consWait  *atomic.Uint32
	consFutex *atomic.Uint32
	relFutex  *atomic.Uint32
	wakeAt    *atomic.Uint64
	released  uint64 // last valid tail, under Producer.mu
	detached  bool

	// Consumer groups (spec §14). group is the hello's group_id (0: an independent consumer); minor the
	// hello's minor: a member of minor 2 or later publishes read and handed (§14.2).
	group uint32
	minor uint16
	// readW and handedW are a 2.2 member's read and handed words in its region (never trusted).
	readW, handedW *atomic.Uint64
	// The producer's bookkeeping of a member, all under Producer.mu (spec §14.2–§14.7): read, its read
	// position as last accepted (its tail for an independent consumer and a 2.1 member); queued, the
	// positions assigned to it in [read, head); oldestQ, the oldest of those (valid while queued > 0);
	// outstanding, those assigned and not released; relAssigned, those it released; skipped, released
	// assigned positions less handed (the most seen); lastPick orders ties (round robin); assigned, positions
	// assigned since it attached (its row's); swept, its released as of the last sweep (bits below it are
	// cleared); lastQ, the last position assigned to it, in commit number lastQCommit (its wake, §14.4).
	read, queued, oldestQ, outstanding, relAssigned, skipped uint64
	lastPick, assigned, swept, lastQ, lastQCommit            uint64
}

// v22 reports a group member that follows layout 2.2's rules: it publishes read and handed and skips
// lapped descriptors (spec §14.1).
// hangUp closes the member's connection; one admitted without a connection (the simulation's replay
// admits through admit alone) has none.
func (m *member) hangUp() {
	if m.conn != nil {
		_ = m.conn.Close()
	}
}

func (m *member) v22() bool { return m.group != 0 && m.minor >= 2 }

// memberSet is an immutable list of attached consumers the hot path wakes without taking a lock, and the
// groups among them it assigns positions to (spec §14; nil without groups).
type memberSet struct {
	gen     uint64
	members []*member
	groups  [][]*member
}

var errClosed = errors.New("detached before the welcome")

// helloTimeout bounds how long a connection may take to say hello, so a silent stranger holds nothing.
const helloTimeout = 2 * time.Second

// listen binds the ring's socket inside the ring directory through its descriptor (spec §1.1): a stale
// socket (we hold the lock, so its producer is dead) is removed first.
func (p *Producer) listen() error {
	if err := p.dir.unlink(SocketName(p.name)); err != nil {
		return err
	}
	addr := &net.UnixAddr{Name: p.dir.procPath(SocketName(p.name)), Net: "unixpacket"}
	old := unix.Umask(0o177) // the socket is born 0600: no window in which others could connect
	ln, err := net.ListenUnix("unixpacket", addr)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.SocketPath(), err)
	}
	ln.SetUnlinkOnClose(false) // the /proc path is gone with the descriptor; release() unlinks by dirfd
	p.ln = ln
	if p.gid >= 0 {
		name := SocketName(p.name)
		if err := unix.Fchownat(p.dir.fd, name, -1, p.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("give %s to group %s: %w", p.SocketPath(), p.cfg.Group, os.NewSyscallError("fchownat", err))
		}
		if err := unix.Fchmodat(p.dir.fd, name, 0o660, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", p.SocketPath(), os.NewSyscallError("fchmodat", err))
		}
	}
	return nil
}

// serve accepts connections until the listener closes; each is handled on its own goroutine.
func (p *Producer) serve() {
	defer p.serveDone.Done()
	var refusedLogged atomic.Int64 // unix ns of the last refusal logged; handlers run in parallel
	for {
		c, err := p.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		if fdsLeft(c) < fdReserve {
			p.refuseLowFDs(c)
			continue
		}
		p.handlers.Add(1)
		go func() {
			defer p.handlers.Done()
			why := p.handle(c)
			if why == "" || p.cfg.Log == nil {
				return
			}
			// A stranger connecting in a loop gets one line a second: the handler that swaps the time logs.
			now, last := time.Now().UnixNano(), refusedLogged.Load()
			if now-last > int64(time.Second) && refusedLogged.CompareAndSwap(last, now) {
				p.cfg.Log.Warn().Str("ring", p.name).Str("reason", why).Msg("refused a client")
			}
		}()
	}
}

// refuseLowFDs refuses a connection at once, on the accepting goroutine, when the descriptor reserve is
// reached: a flood of connections must not use it up. The hello is read first (50 ms at most; a client
// sends it right after connecting): closing a socket with unread data resets it, and the client would
// lose the reason.
func (p *Producer) refuseLowFDs(c *net.UnixConn) {
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var buf [HelloSize + 1]byte
	_, _ = c.Read(buf[:])
	_, _ = c.Write(encodeRefusal(StatusBusy, fmt.Sprintf("ring %s is busy: fewer than %d file descriptors left to the producer (RLIMIT_NOFILE)", p.name, fdReserve)))
	c.Close()
}

// handle runs one connection: hello, permission, welcome, then wait for its end. It returns why a client
// was refused ("" if it was not).
func (p *Producer) handle(c *net.UnixConn) string {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		c.Close()
		return ""
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	cred, groups, err := peerCred(c)
	if err != nil {
		c.Close()
		return err.Error()
	}
	refuse := func(status uint32, msg string) string {
		_, _ = c.Write(encodeRefusal(status, msg))
		c.Close()
		return fmt.Sprintf("pid %d uid %d: %s", cred.Pid, cred.Uid, msg)
	}
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	buf := make([]byte, ErrorRecordMax)
	n, err := c.Read(buf)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			p.helloTimeouts.Add(1)
		}
		c.Close()
		return fmt.Sprintf("pid %d: no hello: %v", cred.Pid, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	h, err := decodeHello(buf[:n])
	switch {
	case err != nil:
		return refuse(StatusProtocol, fmt.Sprintf("ring %s: %v", p.name, err))
	case !p.permitted(cred, groups):
		return refuse(StatusNotAllowed, fmt.Sprintf("ring %s: uid %d may not attach (the producer runs as uid %d)", p.name, cred.Uid, os.Geteuid()))
	case h.Major != MajorVersion:
		return refuse(StatusVersion, fmt.Sprintf("ring %s is layout %d.%d; this client speaks %d.%d", p.name, MajorVersion, MinorVersion, h.Major, h.Minor))
	case h.Role != RoleConsumer && h.Role != RoleObserver, h.Start != StartOldest && h.Start != StartHead:
		return refuse(StatusProtocol, fmt.Sprintf("ring %s: role %d, start %d", p.name, h.Role, h.Start))
	case h.Role == RoleObserver && h.Group != 0:
		return refuse(StatusProtocol, fmt.Sprintf("ring %s: an observer in group %#x", p.name, h.Group))
	}
	if h.Role == RoleObserver {
		if msg := p.serveObserver(c, buf); msg != "" {
			return refuse(StatusBusy, msg)
		}
		return ""
	}
	if h.Group != 0 && !p.mayJoin(cred, groups, h.Group) {
		return refuse(StatusNotAllowed, fmt.Sprintf("ring %s: not permitted to join group %s", p.name, p.groupName(h.Group)))
	}
	m, status, msg := p.admit(c, cred, h)
	if m == nil {
		return refuse(status, msg)
	}
	p.serveConsumer(c, m, buf)
	return ""
}

// serveObserver welcomes an observer with the control memory and holds the connection until it closes,
// or returns the busy message when --max-observers are connected already.
func (p *Producer) serveObserver(c *net.UnixConn, buf []byte) string {
	p.mu.Lock()
	full := p.observers >= p.cfg.MaxObservers
	if !full {
		p.observers++
	}
	p.mu.Unlock()
	if full {
		return fmt.Sprintf("ring %s is busy: %d observers (--max-observers)", p.name, p.cfg.MaxObservers)
	}
	defer func() {
		p.mu.Lock()
		p.observers--
		p.mu.Unlock()
	}()
	w := welcome{Index: noConsumerIndex, SessionID: p.sid, CtlSize: uint64(len(p.ctlMem.mem))}
	if _, _, err := c.WriteMsgUnix(w.encode(), unix.UnixRights(p.ctlMem.fd), nil); err == nil {
		_, _ = c.Read(buf) // hold the connection until the observer closes it
	}
	c.Close()
	return ""
}

// serveConsumer sends an admitted consumer its welcome and descriptors, then holds the attachment until
// the connection ends, and detaches it.
func (p *Producer) serveConsumer(c *net.UnixConn, m *member, buf []byte) {
	w := welcome{Index: uint32(m.index), Generation: u32at(m.row, rowGeneration).Load(),
		SessionID: p.sid, CtlSize: uint64(len(p.ctlMem.mem)), DataSize: p.geo.DataSize, RegionLength: RegionSize}
	// Under mu: Close may be tearing the ring down, and must not see a descriptor half given away.
	p.mu.Lock()
	err := errClosed
	if !m.detached {
		_, _, err = c.WriteMsgUnix(w.encode(), unix.UnixRights(p.ctlMem.fd, p.dataMem.fd, m.region.fd), nil)
	}
	// The producer keeps only its mapping of the region: the consumer's descriptor is its own now.
	if m.region.fd >= 0 {
		unix.Close(m.region.fd)
		m.region.fd = -1
	}
	p.mu.Unlock()
	if err == nil {
		// Nothing is sent after the welcome: whatever ends this read (EOF at death or detach, a stray
		// record) ends the attachment.
		_, _ = c.Read(buf)
	}
	p.mu.Lock()
	p.detachLocked(m, ConsumerGone, "connection closed")
	p.mu.Unlock()
}

// permitted is the SO_PEERCRED gate (spec §1.2): the producer's own user, root, or a process whose
// effective or supplementary groups (SO_PEERGROUPS: the peer's real groups, not /etc/group) include
// --group.
func (p *Producer) permitted(cred *unix.Ucred, groups []uint32) bool {
	if cred.Uid == 0 || int(cred.Uid) == os.Geteuid() {
		return true
	}
	if p.gid < 0 {
		return false
	}
	return int(cred.Gid) == p.gid || slices.Contains(groups, uint32(p.gid))
}

// peerCred reads the peer's credentials and supplementary groups from the connection.
func peerCred(c *net.UnixConn) (*unix.Ucred, []uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var cred *unix.Ucred
	var groups []uint32
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		if cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr == nil {
			groups, cerr = peerGroups(int(fd))
		}
	}); err != nil {
		return nil, nil, err
	}
	if cerr != nil {
		return nil, nil, cerr
	}
	return cred, groups, nil
}

// fdReserve is how many file descriptors the producer keeps in hand (layout 2.1 §C): with fewer left it
// refuses new clients as busy, saying so, rather than failing later with a misleading reason (a memfd it
// cannot create, a group it cannot look up).
const fdReserve = 32

// fdsLeft bounds how many descriptors the process may still open: the kernel gives a new connection the
// lowest free number, so every number below c's is in use.
func fdsLeft(c *net.UnixConn) int {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return fdReserve
	}
	fd := -1
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(f uintptr) { fd = int(f) })
	}
	if fd < 0 || uint64(fd) >= lim.Cur {
		return 0
	}
	return int(min(lim.Cur-uint64(fd)-1, 1<<30))
}

// soPeerGroups is SO_PEERGROUPS (asm-generic/socket.h): the peer's supplementary groups at connect.
const soPeerGroups = 59

// peerGroups reads SO_PEERGROUPS, growing the buffer when the kernel says ERANGE (at most NGROUPS_MAX).
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soPeerGroups,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e == unix.ERANGE && int(n/4) > len(buf) && n/4 <= 65536 {
			buf = make([]uint32, n/4)
			continue
		}
		if e != 0 {
			return nil, os.NewSyscallError("getsockopt(SO_PEERGROUPS)", e)
		}
		return buf[:n/4], nil
	}
}

// admit gives a consumer a table row and a fresh region whose tail is its start position, under the lock
// reclaiming takes, so no slot of a position at or after that tail is reused before it releases it (spec
// §7.1). A nil member comes with the error record's status and message.
func (p *Producer) admit(c *net.UnixConn, cred *unix.Ucred, h hello) (*member, uint32, string) {
	region, err := newShm("ibvbridge."+p.name+".consumer", RegionSize)
	if err != nil {
		return nil, StatusBusy, fmt.Sprintf("ring %s: no memory for a consumer region: %v", p.name, err)
	}
	if err := seal(region.fd, sealsRegion); err != nil {
		region.close()
		return nil, StatusBusy, fmt.Sprintf("ring %s: %v", p.name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing || u32at(p.ctl, offState).Load() == uint32(StateClosed) {
		region.close()
		return nil, StatusClosing, fmt.Sprintf("ring %s is closing: the stream has ended", p.name)
	}
	index := p.freeRowLocked()
	if index < 0 {
		region.close()
		return nil, StatusBusy, fmt.Sprintf("ring %s is busy: %d consumers are attached, the most it takes (--max-consumers)", p.name, p.cfg.MaxConsumers)
	}
	start, group := h.Start, h.Group
	r := region.mem
	m := &member{index: index, row: p.rowAt(index), region: *region, conn: c, pid: cred.Pid,
		tail: u64at(r, regTail), consWait: u32at(r, regConsWaiting), consFutex: u32at(r, regConsFutex),
		relFutex: u32at(r, regReleaseFutex), wakeAt: u64at(r, regWakeAt), group: group, minor: h.Minor,
		readW: u64at(r, regRead), handedW: u64at(r, regHanded)}
	m.released = p.oldestHeldLocked()
	if group != 0 {
		// A group member starts at head (spec §14.1), and every position from its start on is assigned: a
		// commit that saw no group (it stores head without mu) must be over before head is loaded, and
		// the later ones take mu until the member is in the set (commitWake).
		p.groupAttach.Store(true)
		defer p.groupAttach.Store(false) // after the set is published, before mu is released
		for p.inCommit.Load() {
			runtime.Gosched()
		}
	}
	if start == StartHead || group != 0 {
		m.released = p.head.Load()
	}
	m.read, m.swept = m.released, m.released
	m.tail.Store(m.released)
	m.readW.Store(m.released)
	row, le := m.row, u64at
	le(row, rowPID).Store(uint64(cred.Pid))
	le(row, rowUID).Store(uint64(cred.Uid))
	le(row, rowAttachNs).Store(realtimeNanos())
	le(row, rowReleased).Store(m.released)
	le(row, rowWakes).Store(0)
	le(row, rowLostHeaps).Store(0)
	le(row, rowAssigned).Store(0)
	le(row, rowRead).Store(m.released)
	le(row, rowQueued).Store(0)
	le(row, rowSkipped).Store(0)
	u32at(row, rowGroupID).Store(group)
	u32at(row, rowClientMinor).Store(uint32(h.Minor))
	gen := u32at(row, rowGeneration)
	gen.Store(gen.Load() + 1)
	u32at(row, rowState).Store(uint32(ConsumerAttached)) // last: the row is complete
	p.members = append(p.members, m)
	p.settleFrontSet = false // reclaim now finds the frontier from the attached consumers
	p.publishSetLocked()
	select {
	case p.attachC <- struct{}{}:
	default:
	}
	return m, StatusOK, ""
}

// oldestHeldLocked is where a consumer attaching at the oldest heap starts (spec §7.1, §14.5): the lowest
// position an attached independent consumer has not released, or with none the oldest heap the ring still
// holds — never below scan: below it a group member may hold some positions' slots while others' were
// reused. It only reads cursors: the free pool is the hot path's. mu held.
func (p *Producer) oldestHeldLocked() uint64 {
	p.readCursorsLocked(false)
	start, found := p.scan, false
	for _, m := range p.members {
		// an independent's released is at or past scan (scan stops at the lowest of them)
		if m.group == 0 && (!found || m.released-p.scan < start-p.scan) {
			start, found = m.released, true
		}
	}
	return start
}

// freeRowLocked is the first consumer-table row a new consumer may take, -1 when none. A departed
// member's row is free at once: its positions were settled at its detach (spec §14.7). mu held.
func (p *Producer) freeRowLocked() int {
	for i := range p.cfg.MaxConsumers {
		if ConsumerState(u32at(p.rowAt(i), rowState).Load()) != ConsumerAttached {
			return i
		}
	}
	return -1
}

func (p *Producer) rowAt(i int) []byte {
	off := offTable + TableRowSize*i
	return p.ctl[off : off+TableRowSize : off+TableRowSize]
}

// publishSetLocked makes the hot path's next commit see the current members and groups. mu held.
func (p *Producer) publishSetLocked() {
	p.setGen++
	s := &memberSet{gen: p.setGen, members: slices.Clone(p.members)}
	for _, m := range s.members {
		if m.group == 0 {
			continue
		}
		i := slices.IndexFunc(s.groups, func(g []*member) bool { return g[0].group == m.group })
		if i < 0 {
			s.groups = append(s.groups, []*member{m})
		} else {
			s.groups[i] = append(s.groups[i], m)
		}
	}
	p.snap.Store(s)
	p.stats[CounterConsumersAttached].Store(uint64(len(p.members)))
}

// bumpLocked counts one on a consumer counter: those change under mu from any goroutine, never in a
// hot-path batch. mu held.
func (p *Producer) bumpLocked(c Counter) {
	p.stats[c].Store(p.stats[c].Load() + 1)
}

// detachLocked ends an attachment for why (spec §2.2 states 2–4): the row says so, the consumer no longer
// holds back the reclaim point, its socket is closed, and its region is unmapped once the hot path can no
// longer be reading it. A blocked producer waiting on its release futex is woken. Idempotent. mu held.
func (p *Producer) detachLocked(m *member, why ConsumerState, detail string) {
	if m.detached {
		return
	}
	m.detached = true
	// The consumer's final cursor (spec §7.2), if valid: what it released before it went is not lost.
	head := p.head.Load()
	if t := m.tail.Load(); t-m.released <= head-m.released {
		p.acceptCursorLocked(m, t, head, false)
	}
	// Layout 2.1 §A: lost_heaps, then the state (a sequentially consistent store: the full fence), and only
	// after that may any slot the consumer held be reused — a consumer that reads its row after reading a
	// heap's bytes and sees it attached knows those bytes were the heap's.
	if !testMutants["row-late"] {
		u64at(m.row, rowLostHeaps).Store(head - m.released)
	}
	if int64(m.released-p.readMark) > 0 {
		p.readMark = m.released
	}
	i := slices.Index(p.members, m)
	p.members = slices.Delete(p.members, i, i+1)
	p.publishSetLocked()
	p.grave = append(p.grave, m)
	if m.group != 0 {
		p.settleLocked(m, head)
	}
	if !testMutants["row-late"] {
		u32at(m.row, rowState).Store(uint32(why))
	}
	switch why {
	case ConsumerOverrun:
		p.bumpLocked(CounterConsumerOverruns)
	case ConsumerBadCursor:
		p.bumpLocked(CounterConsumerErrors)
	}
	if why != ConsumerGone && p.cfg.Log != nil {
		p.cfg.Log.Warn().Str("ring", p.name).Int32("consumer_pid", m.pid).Str("reason", why.String()).
			Str("detail", detail).Msg("detached a consumer")
	}
	futexWakeAll(m.relFutex)
	m.hangUp()
	if !testMutants["no-unmap"] {
		p.buryLocked() // at once, unless the hot path is using regions right now (then at its next commit)
	}
}

// buryLocked unmaps the regions of detached consumers unless the hot path may be using them (layout 2.1
// §C): it loads the member set afresh in each commit, so outside one, none of them is reachable from it.
// mu held.
func (p *Producer) buryLocked() {
	if p.hotInUse() {
		return
	}
	p.buryAllLocked()
}

// buryAllLocked unmaps every detached consumer's region: for Close, once the hot path has returned. mu held.
func (p *Producer) buryAllLocked() {
	for _, m := range p.grave {
		m.region.close()
	}
	clear(p.grave)
	p.grave = p.grave[:0]
}

// hotInUse reports whether the hot path may be reading members' regions from a member set published
// before this call: asleep on a release futex, or inside a commit's wakes (it stored head, and has not
// yet stored the same position to hotDone). hotDone is loaded before head: a commit that starts after
// the load of hotDone loads the current set.
func (p *Producer) hotInUse() bool {
	if p.hotBusy.Load() {
		return true
	}
	done := p.hotDone.Load()
	return p.head.Load() != done
}
