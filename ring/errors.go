package ring

import (
	"errors"
	"fmt"
	"os"
)

// Errors a producer or consumer returns; test them with errors.Is.
var (
	ErrBadName    = errors.New("bad ring name")
	ErrNotFound   = errors.New("ring not found")
	ErrInUse      = errors.New("ring name in use by a live producer")
	ErrBusy       = errors.New("ring busy") // the producer's message says why: consumer rows, observer places or descriptors
	ErrPermission = errors.New("not permitted")
	ErrClosing    = errors.New("ring closing: the stream has ended")
	ErrProtocol   = errors.New("ring protocol error")
	// ErrDetached: the producer detached this consumer (spec §7.6); ErrOverrun matches it too.
	ErrDetached     = errors.New("detached by the producer")
	ErrOverrun      = fmt.Errorf("overrun: %w after falling a whole ring behind", ErrDetached)
	ErrVersion      = errors.New("unsupported ring layout version")
	ErrCorrupt      = errors.New("corrupt ring")
	ErrProducerGone = errors.New("producer gone")
	ErrEndOfStream  = errors.New("end of stream")
	// ErrStreamEnd: a STREAM_END marker (2.2, spec §4.1) — one stream ended and the ring goes on; the next
	// Next reads the next stream's first heap. It matches ErrEndOfStream too, so a loop written for one
	// stream ends at the end of its stream; a loop that reads on checks ErrStreamEnd first. The Heap
	// returned with it is the marker (StreamEnd true): its HeapCnt is the stop heap's, TimestampNs when
	// the stream ended.
	ErrStreamEnd = fmt.Errorf("%w: the stream ended, the ring goes on with the next", ErrEndOfStream)
	// ErrStreamEnded: the producer already published END_OF_STREAM, which is final (spec §4.1).
	ErrStreamEnded = errors.New("the stream has ended: nothing may follow the end-of-stream marker")
	// ErrItemCut: an item of a TRUNCATED heap ran past its slot; only its first bytes are in the ring
	// (raise recv --slot-size; Heap.ItemBytes hands out the partial bytes).
	ErrItemCut = errors.New("item cut: the heap was longer than its slot")
	// ErrImmediate: an immediate item has no bytes in the payload (its Value is the item).
	ErrImmediate   = errors.New("immediate item: its value is the item")
	ErrFull        = errors.New("ring full")
	ErrNoConsumer  = errors.New("no consumer attached")
	ErrClosed      = errors.New("ring closed")
	ErrNoHugePages = errors.New("no hugepages available")
	ErrNoSpace     = errors.New("not enough memory for the ring")
	ErrBadConfig   = errors.New("bad ring configuration")
	// ErrNotChunk: a chunk was asked of a ring not in chunk mode, or of a position that is not a chunk.
	ErrNotChunk = errors.New("not a chunk")
	// ErrMetaBusy: the metadata area was rewritten during every read for 1000 tries or 10 ms (spec §6).
	ErrMetaBusy = errors.New("metadata area busy")
	// ErrTimeout is returned when a wait's deadline passes; it matches os.ErrDeadlineExceeded.
	ErrTimeout = fmt.Errorf("ring wait: %w", os.ErrDeadlineExceeded)
)

// VersionError names both versions when a consumer meets a layout major it does not know.
type VersionError struct {
	Found, Supported uint16
}

// Error names the version found and the one supported.
func (e *VersionError) Error() string {
	return fmt.Sprintf("ring layout major version %d, this client supports %d", e.Found, e.Supported)
}

// Is makes errors.Is(err, ErrVersion) true.
func (e *VersionError) Is(target error) bool { return target == ErrVersion }

// OverrunError is the detachment of a consumer that fell a whole ring behind under the drop policy (spec
// §7.3): the producer reused the slots it held. Lost is how many heaps it lost (head at the detach minus
// its last release). errors.Is(err, ErrOverrun) and errors.Is(err, ErrDetached) are true.
type OverrunError struct {
	Ring string // the ring's name
	Lost uint64 // heaps lost: published but never released by this consumer
}

// Error names the ring and the heaps lost.
func (e *OverrunError) Error() string {
	return fmt.Sprintf("ring %s: %v, %d heaps lost", e.Ring, ErrOverrun, e.Lost)
}

// Is makes errors.Is(err, ErrOverrun) and errors.Is(err, ErrDetached) true.
func (e *OverrunError) Is(target error) bool { return target == ErrOverrun || target == ErrDetached }
