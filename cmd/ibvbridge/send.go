package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/relay"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
)

func runSend(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("send", stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), sendUsage)
		fs.PrintDefaults()
	}
	o := sendFlags(fs)
	if err := parseSend(fs, o, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	senders, err := openSenders(o)
	defer func() {
		for _, hs := range senders {
			hs.Close()
		}
	}()
	if err != nil {
		return err
	}
	if o.waitRing != "" {
		if err := waitForRing(ctx, o.waitRing, o.waitDir, o.waitConsumers, o.waitTimeout); err != nil {
			return fmt.Errorf("--wait-ring: %w", err)
		}
	}
	res := bench.SendResult{}
	if o.ring != "" {
		res.Heaps, res.SkippedIncomplete, err = sendRing(ctx, o.ring, senders[0], relay.Config{Incomplete: o.incomplete, NoStop: o.noStop, Flavour: o.flavour})
	} else {
		res.Heaps, err = sendGenerated(ctx, o, senders)
	}
	if err != nil {
		return err
	}
	return printSendResult(stdout, o.json, res, sumTotals(senders))
}

// openSenders opens one sender per destination through o's transport, each paced at its share of the
// rate (it carries 1/N of the heaps). The senders opened before a failure are returned with it.
func openSenders(o *sendOptions) ([]transport.HeapSender, error) {
	tr, err := lookupTransport(o.transport, "udp", func(t transportKind) bool { return t.send != nil })
	if err != nil {
		return nil, err
	}
	senders := make([]transport.HeapSender, 0, len(o.eps))
	for _, e := range o.eps {
		// an encoder is one sender's: it keeps the heap it is packetizing
		enc, err := spead.NewEncoder(o.flavour, o.packetSize)
		if err != nil {
			return senders, usageError("--packet-size %d: %v", o.packetSize, err)
		}
		hs, err := tr.send(o, e, enc)
		if err != nil {
			return senders, err
		}
		senders = append(senders, hs)
	}
	return senders, nil
}

// sendGenerated sends o's generated stream over senders, destination d on lane d mod --threads.
func sendGenerated(ctx context.Context, o *sendOptions, senders []transport.HeapSender) (uint64, error) {
	lanes := make([]transport.Lane, o.threads)
	for d, hs := range senders {
		l := &lanes[d%o.threads]
		l.Dests, l.Senders = append(l.Dests, d), append(l.Senders, hs)
	}
	for i := range lanes {
		g, err := pattern.NewHeapGenOptions(o.flavour, o.heapSize, o.items,
			pattern.Options{Pattern: o.pattern, Descriptors: o.descriptors, Timestamp: o.timestamp})
		if err != nil {
			return 0, err
		}
		if o.chunkItems != nil {
			if err := g.SetChunkItems(*o.chunkItems); err != nil {
				return 0, usageError("--timestamp-step/--axis: %v", err)
			}
		}
		lanes[i].Heap = g.Heap
	}
	return transport.SendSpread(ctx, lanes, len(senders), o.heaps, !o.noStop)
}

// printSendResult completes res with the senders' totals and prints it: one line, or JSON.
func printSendResult(stdout io.Writer, asJSON bool, res bench.SendResult, tot transport.SendTotals) error {
	res.Packets, res.Bytes = tot.Packets, tot.Bytes
	res.Seconds = time.Since(tot.Start).Seconds()
	res.Gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
	res.HeapsPS = float64(res.Heaps) / res.Seconds
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "sent %d heaps, %d packets, %d bytes in %.3f s: %.3f Gb/s, %.0f heaps/s\n",
		res.Heaps, res.Packets, res.Bytes, res.Seconds, res.Gbps, res.HeapsPS)
	if res.SkippedIncomplete > 0 {
		fmt.Fprintf(stdout, "skipped %d incomplete or truncated heaps of the ring (--incomplete sends them)\n", res.SkippedIncomplete)
	}
	return nil
}

// sumTotals adds up what several senders sent, from the first one's start.
func sumTotals(senders []transport.HeapSender) transport.SendTotals {
	var t transport.SendTotals
	for _, hs := range senders {
		st := hs.Totals()
		t.Packets += st.Packets
		t.Bytes += st.Bytes
		if t.Start.IsZero() || st.Start.Before(t.Start) {
			t.Start = st.Start
		}
	}
	return t
}

// sendRing transmits ring name through hs (relay.Run) until the ring ends or ctx is cancelled.
func sendRing(ctx context.Context, name string, hs transport.HeapSender, cfg relay.Config) (heaps, skipped uint64, err error) {
	c, err := ring.Attach(name, ring.AttachOptions{Timeout: 10 * time.Second})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if _, chunks := c.Chunks(); chunks {
		return 0, 0, usageError("ring %s is in chunk mode: send --ring relays rings of heaps (a chunk's heaps lost their items)", name)
	}
	res, err := relay.Run(ctx, c, hs, cfg)
	return res.Heaps, res.SkippedIncomplete, err
}
