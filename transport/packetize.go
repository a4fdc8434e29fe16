package transport

import (
	"context"

	"github.com/ibvbridge/ibvbridge/spead"
)

// FrameQueue is a sender that lends the buffers packets are written into (the kernel-bypass senders: a
// NIC's registered memory, an AF_XDP UMEM), so a heap is packetized straight into the frames that leave.
type FrameQueue interface {
	// Buffer returns the next packet's payload buffer, waiting for one to be free.
	Buffer(ctx context.Context) ([]byte, error)
	// Commit queues the packet just written into the buffer: n bytes of payload.
	Commit(ctx context.Context, n int) error
	// Discard gives back the buffer Buffer returned, unused.
	Discard()
}

// Packetize writes heap h, packet by packet with enc, into the buffers q lends and commits each. It
// allocates nothing.
func Packetize(ctx context.Context, enc *spead.Encoder, h *spead.Heap, q FrameQueue) error {
	if err := enc.Reset(h); err != nil {
		return err
	}
	for enc.More() {
		buf, err := q.Buffer(ctx)
		if err != nil {
			return err
		}
		n, err := enc.Next(buf)
		if err != nil {
			q.Discard()
			return err
		}
		if err := q.Commit(ctx, n); err != nil {
			return err
		}
	}
	return nil
}
