package conformance_test

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A consumer written from the spec alone (docs/ring-layout.md §1.2, §3, §14), for what no consume tool
// does: a group member that releases its share unread.

// groupID is the hello's group_id of a group name (spec §14.1: FNV-1a 32 of its UTF-8 bytes, 0 mapped to
// 1); 0 for "": an independent consumer.
func groupID(name string) uint32 {
	if name == "" {
		return 0
	}
	h := uint32(0x811C9DC5)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 0x01000193
	}
	if h == 0 {
		h = 1
	}
	return h
}

// rawMember is an attached consumer's connection and mappings.
type rawMember struct {
	fd          int
	index       uint32
	ctl, region []byte
}

// rawAttach says a consumer hello (minor 2, start 1) with group_id of group to the ring at sock. A refusal
// is returned as its status and message.
func rawAttach(sock, group string) (*rawMember, uint32, string, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, "", err
	}
	fail := func(err error) (*rawMember, uint32, string, error) { unix.Close(fd); return nil, 0, "", err }
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		return fail(fmt.Errorf("connect %s: %w", sock, err))
	}
	le := binary.LittleEndian
	h := make([]byte, 32)
	le.PutUint64(h[0:], 0x474E495242564249)
	le.PutUint16(h[8:], 2)
	le.PutUint16(h[10:], 2)
	le.PutUint32(h[12:], 1)
	le.PutUint32(h[16:], 1)
	le.PutUint32(h[20:], groupID(group))
	if _, err := unix.Write(fd, h); err != nil {
		return fail(err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("welcome: %w", err))
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	defer func() {
		for _, f := range fds {
			unix.Close(f)
		}
	}()
	if n < 17 {
		return fail(fmt.Errorf("welcome of %d bytes", n))
	}
	if st := le.Uint32(buf[0x0C:]); st != 0 {
		msg := buf[0x10:n]
		for i, b := range msg {
			if b == 0 {
				msg = msg[:i]
				break
			}
		}
		unix.Close(fd)
		return nil, st, string(msg), nil
	}
	if len(fds) != 3 || n < 64 {
		return fail(fmt.Errorf("welcome: %d bytes, %d descriptors", n, len(fds)))
	}
	m := &rawMember{fd: fd, index: le.Uint32(buf[0x10:])}
	if m.ctl, err = unix.Mmap(fds[0], 0, int(le.Uint64(buf[0x20:])), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fail(err)
	}
	if m.region, err = unix.Mmap(fds[2], 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		unix.Munmap(m.ctl)
		return fail(err)
	}
	return m, 0, "", nil
}

func (m *rawMember) u64(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off]))
}

func (m *rawMember) u32(b []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off]))
}

// releaseUnread is a thief (spec §14.7 "released unread"): until the ring is CLOSED or d passes, it
// publishes read = tail = head every millisecond and never hands a heap out (handed stays 0), waking a
// waiting producer as a release does (§7.4). Once the end of stream is published it keeps the marker
// (assigned to nobody) unreleased until hold is closed, so that a block producer stays open, its table
// readable, while the test reads the thief's row.
// It returns at once when stop is closed: the caller closes the mappings only after that.
func (m *rawMember) releaseUnread(d time.Duration, hold, stop <-chan struct{}) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		select {
		case <-stop:
			return
		default:
		}
		head := m.u64(m.ctl, 0x200).Load()
		if m.u64(m.ctl, 0x500+9*8).Load() != 0 { // end_of_stream (§2.3)
			select {
			case <-hold:
			default:
				head--
			}
		}
		m.u64(m.region, 0x090).Store(head)   // read
		m.u64(m.region, 0x000).Store(head)   // tail
		if m.u32(m.ctl, 0x280).Load() != 0 { // producer_waiting
			f := m.u32(m.region, 0x100)
			f.Store(f.Load() + 1)
			unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&m.region[0x100])), 1, 1, 0, 0, 0)
		}
		if m.u32(m.ctl, 0x10).Load() == 2 { // state CLOSED (§2.1)
			return
		}
	}
}

func (m *rawMember) close() {
	unix.Munmap(m.region)
	unix.Munmap(m.ctl)
	unix.Close(m.fd)
}
