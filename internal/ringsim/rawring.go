package ringsim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets of the layout (docs/ring-layout.md §1.2–§4), as a client written from the spec uses them.
const (
	magic         = 0x474E495242564249
	ctlHead       = 0x200
	ctlProdWait   = 0x280
	ctlBlockedOn  = 0x310
	ctlOldest     = 0x308
	ctlStats      = 0x500
	ctlTable      = 0x1000
	hdrDescOffset = 0x58
	rowSize       = 128
	regTail       = 0x000
	regWaiting    = 0x080
	regWakeAt     = 0x088
	regRead       = 0x090
	regHanded     = 0x098
	regRelFutex   = 0x100
	descSize      = 64
	descAssign    = 0x38
	descFlags     = 0x2C
	flagEOS       = 0x08
	futexWake     = 1 // FUTEX_WAKE, shared (spec §7.4: no FUTEX_PRIVATE_FLAG)
)

// Stats indices (spec §2.3).
const (
	statEOS          = 9
	statDropped      = 4
	statOverruns     = 11
	statErrors       = 12
	statGroupLost    = 17
	statGroupSkipped = 18
)

// rawRing is the consumer side of a real ring, played from the spec through its socket and its memory:
// raw hellos, the welcome's descriptors mapped, cursors stored as a client stores them (§7.4).
type rawRing struct {
	sock  string
	slots uint64
	rows  int
	ctl   []byte // read-only mapping (an observer's)
	data  []byte // read-only mapping (from the first consumer's welcome)
	obsFD int
	cons  map[int]*rawCons // by row
}

type rawCons struct {
	fd     int
	gen    uint32
	region []byte
}

func openRaw(sock string, slots uint64, rows int) (*rawRing, error) {
	r := &rawRing{sock: sock, slots: slots, rows: rows, obsFD: -1, cons: map[int]*rawCons{}}
	fd, w, fds, err := r.hello(0, 2, 2, 0)
	if err != nil {
		return nil, err
	}
	if st := binary.LittleEndian.Uint32(w[0x0C:]); st != 0 || len(fds) != 1 {
		unix.Close(fd)
		closeAll(fds)
		return nil, fmt.Errorf("observer hello: status %d, %d descriptors", st, len(fds))
	}
	ctlSize := binary.LittleEndian.Uint64(w[0x20:])
	r.ctl, err = unix.Mmap(fds[0], 0, int(ctlSize), unix.PROT_READ, unix.MAP_SHARED)
	unix.Close(fds[0])
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map control memory: %w", err)
	}
	r.obsFD = fd
	return r, nil
}

func closeAll(fds []int) {
	for _, f := range fds {
		unix.Close(f)
	}
}

// hello connects and says hello (spec §1.2), returning the connection, the answer and its descriptors.
func (r *rawRing) hello(group uint32, minor uint16, role, start uint32) (int, []byte, []int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: r.sock}); err != nil {
		unix.Close(fd)
		return -1, nil, nil, fmt.Errorf("connect %s: %w", r.sock, err)
	}
	h := make([]byte, 32)
	le := binary.LittleEndian
	le.PutUint64(h[0:], magic)
	le.PutUint16(h[8:], 2)
	le.PutUint16(h[10:], minor)
	le.PutUint32(h[12:], role)
	le.PutUint32(h[16:], start)
	le.PutUint32(h[20:], group)
	if _, err := unix.Write(fd, h); err != nil {
		unix.Close(fd)
		return -1, nil, nil, err
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		unix.Close(fd)
		return -1, nil, nil, fmt.Errorf("welcome: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			f, _ := unix.ParseUnixRights(&m)
			fds = append(fds, f...)
		}
	}
	if n < 16 {
		unix.Close(fd)
		closeAll(fds)
		return -1, nil, nil, fmt.Errorf("welcome of %d bytes", n)
	}
	return fd, buf[:n], fds, nil
}

func (r *rawRing) Attach(group uint32, minor uint16, start uint32, observer bool) (int, uint32, uint64, int, error) {
	role := uint32(1)
	if observer {
		role = 2
	}
	fd, w, fds, err := r.hello(group, minor, role, start)
	if err != nil {
		return -1, 0, 0, 0, err
	}
	le := binary.LittleEndian
	if st := le.Uint32(w[0x0C:]); st != 0 {
		unix.Close(fd)
		closeAll(fds)
		return -1, 0, 0, int(st), nil
	}
	if observer {
		unix.Close(fd)
		closeAll(fds)
		return -1, 0, 0, StatusOK, nil
	}
	defer closeAll(fds)
	if len(fds) != 3 || len(w) < 64 {
		unix.Close(fd)
		return -1, 0, 0, 0, fmt.Errorf("consumer welcome: %d descriptors, %d bytes", len(fds), len(w))
	}
	row, gen := int(le.Uint32(w[0x10:])), le.Uint32(w[0x14:])
	if r.data == nil {
		r.data, err = unix.Mmap(fds[1], 0, int(le.Uint64(w[0x28:])), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			unix.Close(fd)
			return -1, 0, 0, 0, fmt.Errorf("map data memory: %w", err)
		}
	}
	region, err := unix.Mmap(fds[2], 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, 0, 0, 0, fmt.Errorf("map region: %w", err)
	}
	r.cons[row] = &rawCons{fd: fd, gen: gen, region: region}
	return row, gen, u64(region, regTail).Load(), StatusOK, nil
}

func u64(b []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&b[off])) }
func u32(b []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[off])) }

// Close closes the consumer's socket and waits for the producer to mark its row (spec §7.6).
func (r *rawRing) Close(row int, gen uint32) error {
	c := r.cons[row]
	if c == nil || c.gen != gen {
		return nil
	}
	delete(r.cons, row)
	unix.Close(c.fd)
	defer unix.Munmap(c.region)
	deadline := time.Now().Add(3 * time.Second)
	for {
		if st, g := r.RowState(row); st != RowAttached || g != gen {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("row still says attached 3 s after its socket closed")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (r *rawRing) Head() uint64 { return u64(r.ctl, ctlHead).Load() }

func (r *rawRing) Desc(q uint64) (uint64, uint64, bool) {
	if r.data == nil {
		return 0, 0, false
	}
	off := int(binary.LittleEndian.Uint64(r.ctl[hdrDescOffset:])) + int(q&(r.slots-1))*descSize
	seq := u64(r.data, off).Load()
	return seq, u64(r.data, off+descAssign).Load(), u32(r.data, off+descFlags).Load()&flagEOS != 0
}

func (r *rawRing) RowState(row int) (uint32, uint32) {
	off := ctlTable + rowSize*row
	st := u32(r.ctl, off).Load()
	return st, u32(r.ctl, off+4).Load()
}

// Store writes a region field as a client does: a release store, then for tail, read and handed the
// fence and the producer's wake when it waits (spec §7.4, §14.2).
func (r *rawRing) Store(row int, f Field, v uint64) {
	c := r.cons[row]
	if c == nil {
		return
	}
	switch f {
	case FTail:
		u64(c.region, regTail).Store(v)
	case FRead:
		u64(c.region, regRead).Store(v)
	case FHanded:
		u64(c.region, regHanded).Store(v)
	case FWakeAt:
		u64(c.region, regWakeAt).Store(v)
		return
	case FWaiting:
		u32(c.region, regWaiting).Store(uint32(v))
		return
	}
	if u32(r.ctl, ctlProdWait).Load() != 0 { // Go's atomic store above is the full fence
		w := u32(c.region, regRelFutex)
		w.Store(w.Load() + 1)
		_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, 1, 0, 0, 0)
	}
}

// observe reads what the spec lets a reader see: head, counters, the table, assign words, blocked_on.
func (r *rawRing) observe() Outcome {
	o := Outcome{Head: r.Head(), Free: -1}
	st := func(i int) uint64 { return u64(r.ctl, ctlStats+8*i).Load() }
	o.Stats = Stats{Dropped: st(statDropped), Overruns: st(statOverruns), Errors: st(statErrors),
		GroupLost: st(statGroupLost), GroupSkipped: st(statGroupSkipped), EOS: st(statEOS)}
	o.BlockedOn = u32(r.ctl, ctlBlockedOn).Load()
	for i := range r.rows {
		off := ctlTable + rowSize*i
		row := Row{State: u32(r.ctl, off).Load(), Gen: u32(r.ctl, off+4).Load(),
			Released: u64(r.ctl, off+0x20).Load(), Wakes: u64(r.ctl, off+0x28).Load(), Lost: u64(r.ctl, off+0x30).Load(),
			Assigned: u64(r.ctl, off+0x38).Load(), Group: u32(r.ctl, off+0x40).Load(), Minor: u32(r.ctl, off+0x44).Load(),
			Read: u64(r.ctl, off+0x48).Load(), Queued: u64(r.ctl, off+0x50).Load(), Skipped: u64(r.ctl, off+0x58).Load()}
		o.Rows = append(o.Rows, row)
	}
	return o
}

// masks fills o's assign words of the positions whose descriptors are still current (from, head].
func (r *rawRing) masks(o *Outcome, p0 uint64) {
	o.MaskFrom = p0
	if o.Head-p0 > r.slots {
		o.MaskFrom = o.Head - r.slots
	}
	for q := o.MaskFrom; q != o.Head; q++ {
		_, m, _ := r.Desc(q)
		o.Masks = append(o.Masks, m)
	}
}

func (r *rawRing) close() {
	for row, c := range r.cons {
		unix.Close(c.fd)
		unix.Munmap(c.region)
		delete(r.cons, row)
	}
	if r.obsFD >= 0 {
		unix.Close(r.obsFD)
	}
	if r.ctl != nil {
		unix.Munmap(r.ctl)
	}
	if r.data != nil {
		unix.Munmap(r.data)
	}
}
