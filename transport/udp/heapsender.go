//go:build linux

package udp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

// HeapSenderConfig describes a HeapSender.
type HeapSenderConfig struct {
	SenderConfig
	Encoder *spead.Encoder // packetizes heaps: flavour and largest packet
	Batch   int            // packets per sendmmsg call (default 64)
	Rate    float64        // bits per second of UDP payload; 0: as fast as the socket takes them
	// GSO sends runs of full-size packets as one message the kernel segments (UDP_SEGMENT): the
	// per-packet cost of the stack is paid once per run. Where the kernel refuses it, the sender falls
	// back to a datagram per message and GSOActive reports false.
	GSO bool
}

// MaxBatch is the most packets one sendmmsg call takes (send --batch).
const MaxBatch = 1024

// HeapSender is the socket path of transport.HeapSender: heaps are packetized into a batch of
// preallocated buffers and full batches leave in one sendmmsg, paced by a byte budget when a rate is set;
// with GSO each run of equal-length packets is one message. It allocates nothing per heap.
type HeapSender struct {
	s       *Sender
	enc     *spead.Encoder
	bufs    [][]byte
	pkts    [][]byte
	pacer   *transport.Pacer
	opened  time.Time
	packets uint64
	bytes   uint64

	gso  bool       // runs of equal-length packets leave as one message each (SendRuns)
	runs [][][]byte // the batch cut into runs, reused
}

var _ transport.HeapSender = (*HeapSender)(nil)

// OpenHeapSender opens a socket connected to cfg.Dest and the batch buffers.
func OpenHeapSender(cfg HeapSenderConfig) (*HeapSender, error) {
	if cfg.Encoder == nil {
		return nil, errors.New("udp: heap sender needs an encoder")
	}
	batch := cfg.Batch
	if batch == 0 {
		batch = 64
	}
	if batch < 1 || batch > MaxBatch {
		return nil, fmt.Errorf("udp: batch %d: want 1..%d", batch, MaxBatch)
	}
	if !(cfg.Rate >= 0) || math.IsInf(cfg.Rate, 0) { // NaN fails the first test
		return nil, fmt.Errorf("udp: rate %g b/s: want a finite rate >= 0", cfg.Rate)
	}
	s, err := NewSender(cfg.SenderConfig)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	hs := &HeapSender{s: s, enc: cfg.Encoder, pacer: transport.NewPacer(cfg.Rate), opened: now, pkts: make([][]byte, 0, batch)}
	size := cfg.Encoder.MaxPacketSize()
	mem := make([]byte, batch*size)
	for i := range batch {
		hs.bufs = append(hs.bufs, mem[i*size:(i+1)*size:(i+1)*size])
	}
	if cfg.GSO && s.EnableGSO(size) == nil {
		hs.gso = true
		hs.runs = make([][][]byte, 0, batch)
	}
	return hs, nil
}

// SendHeap implements transport.HeapSender.
func (hs *HeapSender) SendHeap(ctx context.Context, h *spead.Heap) error {
	if err := hs.enc.Reset(h); err != nil {
		return err
	}
	for {
		// A flush cancelled mid-wait (Ctrl-C of a paced send) leaves the queue full; the next heap (the
		// stream-stop, sent with a fresh context) must flush it before it takes a buffer.
		if len(hs.pkts) == cap(hs.pkts) {
			if err := hs.Flush(ctx); err != nil {
				return err
			}
		}
		buf := hs.bufs[len(hs.pkts)]
		n, err := hs.enc.Next(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		hs.pkts = append(hs.pkts, buf[:n])
	}
}

// Flush implements transport.HeapSender: the queued packets leave once the bytes before them have had
// their time. A cancelled ctx ends the wait (the packets stay queued).
func (hs *HeapSender) Flush(ctx context.Context) error {
	if len(hs.pkts) == 0 {
		return nil
	}
	var n uint64
	for _, p := range hs.pkts {
		n += uint64(len(p))
	}
	if err := hs.pacer.Wait(ctx, hs.bytes); err != nil {
		return err
	}
	if hs.gso {
		if err := hs.s.SendRuns(hs.cutRuns()); err != nil {
			return err
		}
	} else if err := hs.s.Send(hs.pkts); err != nil {
		return err
	}
	hs.packets += uint64(len(hs.pkts))
	hs.bytes += n
	hs.pkts = hs.pkts[:0]
	return nil
}

// cutRuns cuts the batch into GSO runs: consecutive packets of one length (a heap's packets but its
// last), closed by a shorter packet — the kernel lets only a run's last datagram be short — or by the
// message limits (MaxGSOSegments datagrams, MaxGSOBytes). One-packet heaps of one size make runs too.
func (hs *HeapSender) cutRuns() [][][]byte {
	runs := hs.runs[:0]
	pkts := hs.pkts
	for start := 0; start < len(pkts); {
		seg := len(pkts[start])
		end, bytes := start+1, seg
		for end < len(pkts) && end-start < MaxGSOSegments && bytes+len(pkts[end]) <= MaxGSOBytes &&
			len(pkts[end]) <= seg && len(pkts[end-1]) == seg {
			bytes += len(pkts[end])
			end++
		}
		runs = append(runs, pkts[start:end])
		start = end
	}
	hs.runs = runs
	return runs
}

// GSOActive reports whether the socket segments messages (HeapSenderConfig.GSO, and the kernel agreed).
func (hs *HeapSender) GSOActive() bool { return hs.gso }

// Totals implements transport.HeapSender.
func (hs *HeapSender) Totals() transport.SendTotals {
	return transport.SendTotals{Packets: hs.packets, Bytes: hs.bytes, Start: hs.opened}
}

// Close implements transport.HeapSender.
func (hs *HeapSender) Close() error { return hs.s.Close() }
