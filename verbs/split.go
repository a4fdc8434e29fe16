package verbs

import "github.com/ibvbridge/ibvbridge/internal/rxloop"

// SplitWR is one receive work request of SplitQueue.PostSplit. With a Region it is split: the frame's
// first HdrLen bytes go to the head of its slot, the next len(Region) bytes to Region (memory of the
// caller's, e.g. a ring slot, inside the registered memory), and anything longer to the slot again, right
// after the head — so a frame of up to the slot's size is received whole, as with a plain work request,
// only in up to three pieces. Without a Region it is the slot's plain work request (one piece, the slot).
type SplitWR struct {
	ID     uint64 // the receive slot (work request id)
	HdrLen int    // frame bytes into the head of the slot; 1..slot size − len(Region)
	Region []byte // nil: a plain work request
}

// SplitQueue is a receive queue whose work requests may scatter a frame over its slot and a region of
// other registered memory: the device Receiver opened with RecvConfig.Place, and verbstest's fake.
// transport/ibv uses it to receive payloads straight into ring slots. Work requests are filled and
// completed in the order they were posted.
type SplitQueue interface {
	rxloop.Queue
	// Slots is the number of receive work requests, all posted (plain) when the queue opens.
	Slots() int
	// PostSplit posts wrs, in order, as one batch. A slot must not be posted while it is posted already.
	PostSplit(wrs []SplitWR) error
	// Covers reports whether region lies inside the registered memory, so a split work request may
	// point at it.
	Covers(region []byte) bool
	// Flush puts the queue in its error state: every posted work request completes with
	// rxloop.StatusFlushed and nothing more is written into any of them. There is no way back; the queue
	// only polls after it.
	Flush() error
}
