package ring

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex operations (linux/futex.h). The ring's futex words live in a shared mapping, so the shared
// (non-private) variants are required.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// maxWaitSlice bounds every futex sleep, so a dead peer is noticed within this time (spec §7.4).
const maxWaitSlice = 250 * time.Millisecond

// spinFor is how long a waiter polls before sleeping (a consumer's default spin budget): a futex wake
// across cores costs tens of µs, a spinning hand-off ~65 ns, so a short spin absorbs bursts without
// paying for the syscall round trip.
const spinFor = 20 * time.Microsecond

// u64at and u32at view a word of shared memory (8- and 4-byte aligned by the layout) as a typed atomic:
// every access to a shared word goes through Load/Store/Add/Swap, so a plain, possibly torn or reordered
// access does not compile.
func u64at(b []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&b[off])) }
func u32at(b []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[off])) }

// futexWaitOn sleeps while *addr == val, at most d. Spurious returns are fine: callers re-check. It
// reports whether a FUTEX_WAKE ended the sleep (not the timeout, a signal, or a changed word).
func futexWaitOn(addr *atomic.Uint32, val uint32, d time.Duration) bool {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	return e == 0
}

// futexWake wakes every sleeper on addr without touching the word (the caller changed it).
func futexWake(addr *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(1<<31-1), 0, 0, 0)
}

// futexWakeAll bumps the futex word and wakes every sleeper on it; it returns how many it woke (the
// kernel's count: tests prove a wake-up with it).
func futexWakeAll(addr *atomic.Uint32) int {
	addr.Add(1)
	n, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(1<<31-1), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(n)
}

// wakeIfWaiting is the publishing side of the wait protocol (spec §7.5): after the cursor store (a
// sequentially consistent atomic in Go, so the full fence the spec asks for is implied), wake the consumer
// only if it announced that it is going to sleep and head has reached the position it asked to be woken
// at (unless force: the end of the stream). wakeAt is the consumer's to write: a wrong value only delays
// its own wake, which its own timeout bounds. The exchange makes it one wake per sleep; it reports whether
// it woke the futex and how many sleepers the kernel woke.
func wakeIfWaiting(waiting, futex *atomic.Uint32, wakeAt *atomic.Uint64, head uint64, force bool) (bool, int) {
	if waiting.Load() == 0 || (!force && int64(head-wakeAt.Load()) < 0) {
		return false, 0
	}
	if waiting.Swap(0) != 0 {
		return true, futexWakeAll(futex)
	}
	return false, 0
}

// lockExclusive takes a non-blocking exclusive flock; held reports that someone else has it.
func lockExclusive(f *os.File) (held bool, err error) {
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	return false, nil
}

func realtimeNanos() uint64 { return uint64(time.Now().UnixNano()) }

func unsafePointer(b []byte, off int) unsafe.Pointer { return unsafe.Pointer(&b[off]) }

// unmapAndClose unmaps and closes what is set, clearing each so a second call is harmless, and joins the
// errors.
func unmapAndClose(maps []*[]byte, files []**os.File) error {
	var errs []error
	for _, m := range maps {
		if *m != nil {
			errs = append(errs, unix.Munmap(*m))
			*m = nil
		}
	}
	for _, f := range files {
		if *f != nil {
			errs = append(errs, (*f).Close())
			*f = nil
		}
	}
	return errors.Join(errs...)
}
