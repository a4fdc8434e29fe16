package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// TestSendRecvChunksGoConsumer: the README's chunk mode example end to end — send with a timestamp
// stepping by 4096 and an axis item of 4 values, recv placing them in chunks of 8 × 4 heaps, a Go
// consumer reading every chunk: ids in order, every presence byte 1, every heap position's bytes its
// heap's pattern; recv's final JSON and stat show the chunk counters and geometry; send --ring refuses to
// relay a chunk ring, consume --verify to check one.
func TestSendRecvChunksGoConsumer(t *testing.T) {
	chunks, m := recvChunks(t, "0x4101:4", func(name string) {
		_, relayErr, code := runCmd(t, 10*time.Second, "send", "--ring", name, "127.0.0.1:9")
		if code == 0 || !strings.Contains(relayErr, "is in chunk mode") {
			t.Errorf("send --ring of a chunk ring: exit %d, %q; want a refusal", code, relayErr)
		}
		verifyOut, _, code := runCmd(t, 10*time.Second, "consume", "--ring", name, "--verify")
		if code == 0 || !strings.Contains(verifyOut, "is in chunk mode") {
			t.Errorf("consume --verify of a chunk ring: exit %d, %q; want a refusal", code, verifyOut)
		}
		statOut, _, code := runCmd(t, 10*time.Second, "stat", name)
		if code != 0 || !strings.Contains(statOut, "8 heaps x 4 axis x 8192 bytes per chunk; time item 0x1600 step 4096, axis item 0x4101") ||
			!strings.Contains(statOut, "too_old_heaps") {
			t.Errorf("stat shows no chunk geometry or counters:\n%s", statOut)
		}
	}, "--chunk-by", "0x1600:4096", "--chunk-axis", "0x4101:4")
	var ids []uint64
	bad := 0
	for _, ch := range chunks {
		ids = append(ids, ch.id)
		for pos := range uint64(32) {
			cnt := ch.id*32 + pos + 1
			if ch.present[pos] != 1 || pattern.VerifyPattern(ch.data[pos*8192:(pos+1)*8192], cnt) >= 0 {
				bad++
			}
		}
	}
	if len(ids) != 10 || bad != 0 {
		t.Fatalf("%d chunks %v, %d positions absent or wrong; recv %v", len(ids), ids, bad, m)
	}
	for i, id := range ids {
		if id != uint64(i) {
			t.Fatalf("chunk ids %v, want 0..9 in order", ids)
		}
	}
	for k, v := range map[string]uint64{"chunks": 10, "incomplete_chunks": 0, "heaps": 320, "too_old_heaps": 0, "rejected_heaps": 0} {
		if got := num(m, k); got != v {
			t.Errorf("recv's final %s = %d, want %d (%v)", k, got, v, m)
		}
	}
}

// placedChunk is a chunk as a consumer read it: id, payload and presence map, copied.
type placedChunk struct {
	id            uint64
	data, present []byte
}

// chunksRead is what readChunks read: every chunk, or the error that stopped it.
type chunksRead struct {
	chunks []placedChunk
	err    error
}

// recvChunks runs recv with chunkArgs on a fresh ring (chunks of 8 time positions of 8 KiB), attaches a Go
// consumer, calls before with the ring's name, sends 320 heaps of 8 KiB with the test pattern, stamped with
// a timestamp stepping by 4096 and an axis item of sendAxis (ITEM:COUNT), and returns every chunk the
// consumer read and recv's final counters.
func recvChunks(t *testing.T, sendAxis string, before func(name string), chunkArgs ...string) ([]placedChunk, map[string]any) {
	t.Helper()
	name, port := testRing(t, "chunks"), freePort(t)
	args := append([]string{"--ring", name, "--slots", "64", "--hugepages", "off", "--log-format", "json",
		"--chunk-heaps", "8", "--chunk-heap-size", "8K"}, chunkArgs...)
	recv, out := startRecv(t, append(args, "127.0.0.1:"+port)...)
	c, err := ring.Attach(name, ring.AttachOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if before != nil {
		before(name)
	}
	done := readChunks(c)
	stdout, stderr, code := runCmd(t, 60*time.Second, "send", "127.0.0.1:"+port, "--heaps", "320", "--heap-size", "8K",
		"--packet-size", "8972", "--pattern", "--rate", "0.5", "--timestamp-step", "4096", "--axis", sendAxis)
	if code != 0 || !strings.HasPrefix(stdout, "sent 320 heaps") {
		t.Fatalf("send: exit %d, %s %s", code, stdout, stderr)
	}
	m := waitRecv(t, recv, out, 20*time.Second)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.chunks, m
}

// readChunks reads c's chunks, copying and releasing each, until the end of the stream (or an error,
// or 20 s without a chunk), in a goroutine; the channel gives the result.
func readChunks(c *ring.Consumer) <-chan chunksRead {
	done := make(chan chunksRead, 1)
	go func() {
		var r chunksRead
		for {
			ch, err := c.NextChunk(20 * time.Second)
			if errors.Is(err, ring.ErrEndOfStream) {
				break
			}
			if err != nil {
				r.err = err
				break
			}
			r.chunks = append(r.chunks, placedChunk{ch.ID, bytes.Clone(ch.Data), bytes.Clone(ch.Present)})
			c.Release(ch.Heap)
		}
		done <- r
	}()
	return done
}
