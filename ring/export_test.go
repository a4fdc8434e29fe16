package ring

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Test hooks: the producer's own writable mappings and descriptors, for tests that play a corrupt or
// hostile producer (no client can reach these: its mappings are read-only and the memory is sealed).

func CtlForTest(p *Producer) []byte  { return p.ctl }
func DataForTest(p *Producer) []byte { return p.data }
func DataFDForTest(p *Producer) int  { return p.dataMem.fd }
func CtlFDForTest(p *Producer) int   { return p.ctlMem.fd }

// SetFutexForTest sets the consumer's futex word, as a long-running ring would have it.
func (c *Consumer) SetFutexForTest(v uint32) { c.consFutex.Store(v); c.futexAtAttach = v }

// StoreTailForTest writes the consumer's cursor as a buggy or hostile consumer would.
func (c *Consumer) StoreTailForTest(v uint64) { c.tail.Store(v) }

// HeadForTest is the published head a consumer sees.
func (c *Consumer) HeadForTest() uint64 { return c.head.Load() }

// FutexWokenForTest is how many sleepers the producer's futex wakes (of consumers, and Interrupt's of its
// own wait) actually woke, by the kernel's count.
func (p *Producer) FutexWokenForTest() uint64 { return p.futexWoken.Load() }

// FutexWakeupsForTest is how many of the consumer's sleeps a FUTEX_WAKE ended (rather than the slice).
func (c *Consumer) FutexWakeupsForTest() uint64 { return c.futexWakeups }

// AbsorbsAtForTest is Absorbs at a given time, so a test sets the stream's rate exactly.
func (p *Producer) AbsorbsAtForTest(now time.Time, max time.Duration) time.Duration {
	return p.absorbsAt(now, max)
}

// RetainedForTest is how many departed consumers the producer still keeps any record of.
func RetainedForTest(p *Producer) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grave)
}

// WaitingForTest reports whether the consumer has announced that it sleeps (consumer_waiting).
func WaitingForTest(c *Consumer) bool { return c.consWait.Load() != 0 }

// ReleaseUnreadForTest moves a member's tail and read to pos without handing anything out, as a member
// that releases its share unread would.
func ReleaseUnreadForTest(c *Consumer, pos uint64) {
	c.readW.Store(pos)
	c.tail.Store(pos)
}

// SetHelloMinorForTest makes later Attach calls state minor m in their hello (a 2.1 client is minor 1),
// until the test ends.
func SetHelloMinorForTest(t interface{ Cleanup(func()) }, m uint16) {
	helloMinor = m
	t.Cleanup(func() { helloMinor = MinorVersion })
}

// StoreReadForTest writes a member's read word as a buggy or hostile member would.
func StoreReadForTest(c *Consumer, v uint64) { c.readW.Store(v) }

// AssignForTest is the assign mask the producer wrote into position q's descriptor (spec §14.3).
func (p *Producer) AssignForTest(q uint64) uint64 {
	return atomic.LoadUint64(&p.descs[q&p.mask].Assign)
}

// TailForTest is the consumer's cursor (right after Attach: its start).
func (c *Consumer) TailForTest() uint64 { return c.tail.Load() }

// AdmitForTest admits a consumer through the producer's admission code without a socket (the ring
// simulation's replay, internal/ringsim): its row, generation, the producer's mapping of its region, and
// the handshake status.
func (p *Producer) AdmitForTest(group uint32, minor uint16, start uint32) (int, uint32, []byte, uint32) {
	cred := &unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}
	m, st, _ := p.admit(nil, cred, hello{Major: MajorVersion, Minor: minor, Role: RoleConsumer, Start: start, Group: group})
	if m == nil {
		return -1, 0, nil, st
	}
	p.mu.Lock() // as serveConsumer does once the consumer has its descriptor
	if m.region.fd >= 0 {
		unix.Close(m.region.fd)
		m.region.fd = -1
	}
	p.mu.Unlock()
	return m.index, u32at(m.row, rowGeneration).Load(), m.region.mem, StatusOK
}

// GoneForTest detaches the consumer in row as the end of its connection does.
func (p *Producer) GoneForTest(row int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.members {
		if m.index == row {
			p.detachLocked(m, ConsumerGone, "connection closed")
			return
		}
	}
}

// SlotNowForTest reports whether a slot may be taken now, after the looks a waiting block producer makes
// before it would sleep (waitFor's test, again at once when a look detached a consumer: the detach wakes
// it): Acquire then returns at once.
func (p *Producer) SlotNowForTest() bool {
	if p.slotReady() {
		return true
	}
	p.commit()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		n := len(p.members)
		if p.slotFreeLocked() {
			return true
		}
		if len(p.members) == n {
			return false
		}
	}
}

// SetMutantForTest breaks (on) or restores one of the guards IBVBRIDGE_TEST_MUTANT names.
func SetMutantForTest(name string, on bool) { testMutants[name] = on }
