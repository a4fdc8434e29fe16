package verbs

import "context"

// Hooks for the external tests (package verbs_test), which drive the send loop with verbstest's fake
// queues (verbstest imports verbs, so tests inside package verbs cannot use it).

type SendLoop = sendLoop

const MaxPacingLag = maxPacingLag

func NewSendLoop(q SendQueue, cfg SendLoopConfig) (*SendLoop, error) { return newSendLoop(q, cfg) }

func (l *sendLoop) Next(ctx context.Context) (uint32, []byte, error) { return l.next(ctx) }
func (l *sendLoop) Commit(ctx context.Context, frameLen, payload int) error {
	return l.commit(ctx, frameLen, payload)
}
func (l *sendLoop) Flush(ctx context.Context) error     { return l.flush(ctx) }
func (l *sendLoop) Stats() SendStats                    { return l.stats }
func (l *sendLoop) Batch() int                          { return l.batch }
func (l *sendLoop) Window() (head, posted, tail uint64) { return l.head, l.posted, l.tail }
