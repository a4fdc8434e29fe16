// Package relay owns putting a ring back on the wire (`ibvbridge send --ring`): it reads a ring as a
// consumer and hands every heap, its items as SPEAD item pointers and its bytes straight from the ring's
// slot, to a transport.HeapSender, then ends the stream with a stream-stop heap when the ring ends. It is
// the last stage of a local pipeline: recv → (C, Python or Go stages) → relay.
package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Config tunes Run.
type Config struct {
	// Incomplete also sends heaps the ring holds flagged INCOMPLETE or TRUNCATED (their missing bytes
	// are whatever the slot holds); by default they are skipped and counted.
	Incomplete bool
	// NoStop leaves the stream open at the ring's end (no stream-stop heap).
	NoStop bool
	// Flavour is the flavour the sender encodes in, for the item descriptors Run announces (default 64-40).
	Flavour spead.Flavour
}

// Result counts what Run did.
type Result struct {
	Heaps             uint64 `json:"heaps"`              // heaps sent
	SkippedIncomplete uint64 `json:"skipped_incomplete"` // incomplete or truncated heaps not sent
	EndOfStream       bool   `json:"end_of_stream"`      // the ring ended (and the stop heap went out)
	Interrupted       bool   `json:"interrupted"`        // ctx was cancelled first (the stop heap still went out)
	LastHeapCnt       uint64 `json:"last_heap_cnt"`
}

// wait is how long one wait for a heap lasts before Run checks its context again.
const wait = 250 * time.Millisecond

// Run sends the heaps of c through hs until the ring's end of stream (then a stream-stop heap, unless
// NoStop), ctx's cancellation, or an error (the producer gone, the sender failing). Each heap is released
// as soon as the sender has taken its bytes. It flushes the sender before it returns.
func Run(ctx context.Context, c *ring.Consumer, hs transport.HeapSender, cfg Config) (Result, error) {
	var res Result
	var heap spead.Heap
	announced := false
	for {
		if ctx.Err() != nil { // also on a busy ring, which never lets Next time out
			res.Interrupted = true
			return res, finish(hs, cfg, &res)
		}
		h, err := c.Next(wait)
		switch {
		case errors.Is(err, ring.ErrTimeout):
			continue
		case errors.Is(err, ring.ErrEndOfStream):
			res.EndOfStream = true
			return res, finish(hs, cfg, &res)
		case err != nil:
			return res, flush(hs, fmt.Errorf("relay: %w", err))
		}
		if h.Flags&(ring.FlagIncomplete|ring.FlagTruncated) != 0 && !cfg.Incomplete {
			res.SkippedIncomplete++
			c.Release(h)
			continue
		}
		toSPEAD(&heap, &h)
		if !announced {
			// A relay that attached after the heap carrying the stream's descriptors still names and shapes
			// the items downstream: the ring's metadata holds them (updated before that heap was
			// published), and they ride in the first heap sent, as spead2 puts them in its first heap.
			announced = true
			if h.Flags&ring.FlagHasDescriptors == 0 {
				if err := appendDescriptors(&heap, c, cfg.Flavour); err != nil {
					c.Release(h)
					return res, flush(hs, err)
				}
			}
		}
		err = hs.SendHeap(ctx, &heap)
		c.Release(h) // the sender has copied the bytes into its packets
		if err != nil {
			if ctx.Err() != nil {
				res.Interrupted = true
				return res, finish(hs, cfg, &res)
			}
			return res, flush(hs, fmt.Errorf("relay: heap %d: %w", h.HeapCnt, err))
		}
		res.Heaps++
		res.LastHeapCnt = h.HeapCnt
	}
}

// toSPEAD makes h's SPEAD form in dst, reusing its item slice: immediates travel in their pointers,
// address items point at their bytes in the ring (the encoder copies them into packets).
func toSPEAD(dst *spead.Heap, h *ring.Heap) {
	dst.Cnt = h.HeapCnt
	dst.Items = dst.Items[:0]
	for _, it := range h.Items {
		if it.Immediate() {
			dst.Items = append(dst.Items, spead.Item{ID: it.ID, Immediate: true, Value: it.Value})
		} else {
			dst.Items = append(dst.Items, spead.Item{ID: it.ID, Data: h.ItemBytes(it)})
		}
	}
}

// appendDescriptors adds the ring's item descriptors to heap as descriptor items (0x5).
func appendDescriptors(heap *spead.Heap, c *ring.Consumer, f spead.Flavour) error {
	ds, err := c.Descriptors()
	if err != nil {
		return fmt.Errorf("relay: stream metadata: %w", err)
	}
	if f == 0 {
		f = spead.Flavour64_40
	}
	for _, rd := range ds {
		b, err := spead.EncodeDescriptor(descriptorFromRing(rd, f), f)
		if err != nil {
			return fmt.Errorf("relay: descriptor of item %#x: %w", rd.ID, err)
		}
		heap.Items = append(heap.Items, spead.Item{ID: spead.DescriptorID, Data: b})
	}
	return nil
}

// finish ends the stream downstream: the stop heap (unless NoStop) and the queue go out, within a second
// even when the run was cancelled, so a receiver sees the end instead of waiting for it.
func finish(hs transport.HeapSender, cfg Config, res *Result) error {
	if !cfg.NoStop {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		stop := spead.StreamStopHeap(res.LastHeapCnt + 1)
		if err := hs.SendHeap(ctx, &stop); err != nil {
			return fmt.Errorf("relay: stream stop: %w", err)
		}
	}
	return flush(hs, nil)
}

// flush empties the sender's queue, briefly even when the run was cancelled, and returns cause (or the
// flush's own error).
func flush(hs transport.HeapSender, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := hs.Flush(ctx); err != nil && cause == nil {
		return fmt.Errorf("relay: flush: %w", err)
	}
	return cause
}

// descriptorFromRing is the descriptor a sender of flavour f announces for an item the ring's stream
// metadata describes (the inverse of what the assembler, spead/assemble, stores there). The ring keeps the format field
// raw, in the field width of the flavour it arrived in: f's width is tried first, then the other
// flavour's, and the first that splits it into known type codes is taken.
func descriptorFromRing(rd ring.ItemDescriptor, f spead.Flavour) spead.Descriptor {
	d := spead.Descriptor{ID: rd.ID, Name: rd.Name, Description: rd.Description, DType: rd.DType, Flavour: f}
	if rd.DType == "" && rd.ShapeKnown {
		d.Shape = rd.Shape // with a numpy header, the shape travels in it (as spead2 sends it)
	}
	for _, fl := range []spead.Flavour{f, spead.Flavour64_40, spead.Flavour64_48} {
		if ff, err := spead.ParseFormat(rd.Format, fl); err == nil && knownCodes(ff) {
			d.Format = ff
			break
		}
	}
	return d
}

// knownCodes reports whether every field has one of SPEAD's type codes.
func knownCodes(ff []spead.FormatField) bool {
	for _, x := range ff {
		if !strings.ContainsRune("uifcb", rune(x.Code)) {
			return false
		}
	}
	return true
}
