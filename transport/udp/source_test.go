package udp

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/transport"
	"golang.org/x/sys/unix"
)

// perSocket tallies kept packets by the tag in their first 4 bytes (the sending socket) and counts
// sequence numbers (the next 4 bytes) that do not follow the previous one of their tag.
func perSocket(pkts [][]byte) (perTag map[uint32]int, reorder int) {
	perTag, lastSeq := map[uint32]int{}, map[uint32]int64{}
	for _, p := range pkts {
		if len(p) < 8 {
			continue
		}
		tag, seq := binary.LittleEndian.Uint32(p), int64(binary.LittleEndian.Uint32(p[4:]))
		perTag[tag]++
		if last, ok := lastSeq[tag]; ok && seq != last+1 {
			reorder++
		}
		lastSeq[tag] = seq
	}
	return perTag, reorder
}

func loopback(t *testing.T, n int, cfg Config) *Source {
	t.Helper()
	for range n {
		cfg.Endpoints = append(cfg.Endpoints, transport.Endpoint{Addr: netip.MustParseAddr("127.0.0.1")})
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// run starts the source and returns a function that cancels it and checks it stops promptly.
func run(t *testing.T, s *Source, sink transport.Sink) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, sink) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Run did not stop within 2 s of cancel")
		}
	}
}

func waitCount(t *testing.T, sink *testutil.RecordingSink, want int) {
	t.Helper()
	if !sink.WaitCount(want, 5*time.Second) || sink.Count() != want {
		t.Fatalf("sink got %d packets, want %d", sink.Count(), want)
	}
}

func sender(t *testing.T, ep transport.Endpoint) *Sender {
	t.Helper()
	s, err := NewSender(SenderConfig{Dest: netip.AddrPortFrom(ep.Addr, ep.Port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSeveralEndpointsBatched(t *testing.T) {
	const perEndpoint = 2000
	s := loopback(t, 3, Config{})
	sink := testutil.NewRecordingSink(true)
	stop := run(t, s, sink)
	defer stop()
	eps := s.LocalEndpoints()
	pkts := make([][]byte, 50)
	for i := range pkts {
		pkts[i] = make([]byte, 1000)
	}
	for tag, ep := range eps {
		snd := sender(t, ep)
		for seq := 0; seq < perEndpoint; seq += len(pkts) {
			for i, p := range pkts {
				binary.LittleEndian.PutUint32(p, uint32(tag))
				binary.LittleEndian.PutUint32(p[4:], uint32(seq+i))
			}
			if err := snd.Send(pkts); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitCount(t, sink, 3*perEndpoint)
	perTag, reorder := perSocket(sink.Packets())
	for tag := range eps {
		if got := perTag[uint32(tag)]; got != perEndpoint {
			t.Errorf("endpoint %d: %d packets, want %d", tag, got, perEndpoint)
		}
	}
	if reorder != 0 {
		t.Errorf("%d packets out of order within a socket", reorder)
	}
	st := s.Stats()
	if st.Packets != 3*perEndpoint || st.Bytes != 3*perEndpoint*1000 || st.Truncated != 0 || st.Errors != 0 {
		t.Errorf("stats %+v", st)
	}
	if st.Batches >= st.Packets {
		t.Logf("no batching seen: %d batches for %d packets (a fast reader may see one packet per call)", st.Batches, st.Packets)
	}
}

func TestTruncatedDatagramsCounted(t *testing.T) {
	s := loopback(t, 1, Config{MaxPacketSize: 100})
	sink := testutil.NewRecordingSink(false)
	stop := run(t, s, sink)
	defer stop()
	snd := sender(t, s.LocalEndpoints()[0])
	if err := snd.Send([][]byte{make([]byte, 200), make([]byte, 100), make([]byte, 101), make([]byte, 50)}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, sink, 2)
	deadline := time.Now().Add(2 * time.Second)
	for s.Stats().Truncated < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := s.Stats(); st.Truncated != 2 || st.Packets != 2 || st.Bytes != 150 {
		t.Errorf("stats %+v: want 2 truncated, 2 packets of 150 bytes", st)
	}
}

func TestPortInUse(t *testing.T) {
	s := loopback(t, 1, Config{})
	_, err := Open(Config{Endpoints: s.LocalEndpoints()})
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("second bind: %v, want EADDRINUSE", err)
	}
}

func TestStopsWhenIdle(t *testing.T) {
	s := loopback(t, 2, Config{})
	stop := run(t, s, testutil.NewRecordingSink(false))
	time.Sleep(20 * time.Millisecond)
	stop()
}

func TestBufferSize(t *testing.T) {
	s := loopback(t, 1, Config{BufferSize: 1 << 20})
	if s.BufferSize() < 64<<10 {
		t.Errorf("buffer %d", s.BufferSize())
	}
}

// TestNoAllocsPerPacket: a steady stream costs no allocation per packet in the reader (the sender is
// allocation-free after its first batch too).
func TestNoAllocsPerPacket(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, coalesce := range []time.Duration{0, DefaultCoalesce} {
		t.Run("coalesce-"+coalesce.String(), func(t *testing.T) { noAllocsPerPacket(t, coalesce) })
	}
}

func noAllocsPerPacket(t *testing.T, coalesce time.Duration) {
	s := loopback(t, 1, Config{Coalesce: coalesce})
	sink := testutil.NewRecordingSink(false)
	stop := run(t, s, sink)
	defer stop()
	snd := sender(t, s.LocalEndpoints()[0])
	pkts := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = make([]byte, 512)
	}
	sent := 0
	send := func(batches int) {
		for range batches {
			if err := snd.Send(pkts); err != nil {
				t.Fatal(err)
			}
			sent += len(pkts)
			for sink.Count() < sent-1000 { // keep within the socket buffer
				runtime.Gosched()
			}
		}
		waitCount(t, sink, sent)
	}
	send(10)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	send(300)
	runtime.ReadMemStats(&m1)
	if per := float64(m1.Mallocs-m0.Mallocs) / float64(300*len(pkts)); per > 0.01 {
		t.Errorf("%.3f allocations per packet (%d over %d packets)", per, m1.Mallocs-m0.Mallocs, 300*len(pkts))
	}
}

// TestCoalesceOutOfRangeRejected: a negative sleep, or one longer than the raw wait's bound (what a
// stop-the-world may wait on a receive thread), is refused with one clear error.
func TestCoalesceOutOfRangeRejected(t *testing.T) {
	ep := []transport.Endpoint{{Addr: netip.MustParseAddr("127.0.0.1")}}
	for _, d := range []time.Duration{-time.Microsecond, busyWait + time.Microsecond, time.Second} {
		if s, err := Open(Config{Endpoints: ep, Coalesce: d}); err == nil {
			s.Close()
			t.Errorf("Open with Coalesce %v: nil error", d)
		}
	}
}

// TestCoalescedStreamArrivesInOrder: with coalesced reads every datagram of a paced stream arrives, in
// order (the sleeps between reads lose and reorder nothing).
func TestCoalescedStreamArrivesInOrder(t *testing.T) {
	s := loopback(t, 1, Config{Coalesce: DefaultCoalesce})
	sink := testutil.NewRecordingSink(true)
	stop := run(t, s, sink)
	defer stop()
	snd := sender(t, s.LocalEndpoints()[0])
	const batches, per = 200, 8
	pkts := make([][]byte, per)
	for i := range pkts {
		pkts[i] = make([]byte, 256)
	}
	for b := range batches {
		for i, p := range pkts {
			binary.LittleEndian.PutUint32(p, 7)
			binary.LittleEndian.PutUint32(p[4:], uint32(b*per+i))
		}
		if err := snd.Send(pkts); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Microsecond)
	}
	waitCount(t, sink, batches*per)
	perTag, reorder := perSocket(sink.Packets())
	if perTag[7] != batches*per || reorder != 0 {
		t.Errorf("got %d datagrams with %d out of order, want %d in order", perTag[7], reorder, batches*per)
	}
}

func TestParseDrops(t *testing.T) {
	text := "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n" +
		"  1: 0100007F:1BEC 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n" +
		"  2: 0100007F:1BED 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 5\n"
	if got := parseDrops([]byte(text), []uint64{4242, 9999}); got != 17 {
		t.Errorf("drops %d, want 17", got)
	}
}

func TestBufferShortfallAdvisesOnlyWhatHelps(t *testing.T) {
	for _, c := range []struct {
		want, got int
		forced    bool
		say       string
	}{
		{1 << 30, 1<<30 - 1, true, ""},                 // root asked for 1G: the kernel's ceiling, one byte short
		{8 << 20, 8 << 20, false, ""},                  // granted
		{8 << 20, 212992, false, "net.core.rmem_max"},  // capped, not root: raise the sysctl
		{4 << 30, 1<<30 - 1, true, "kernel's largest"}, // root beyond the kernel's ceiling: no advice to be root
		{8 << 20, 212992, true, "kernel's largest"},    // forced yet small: never "run as root"
	} {
		msg := bufferShortfall(c.want, c.got, c.forced)
		if c.say == "" && msg != "" || c.say != "" && !strings.Contains(msg, c.say) {
			t.Errorf("want %d, got %d, forced %v: %q, want it to say %q", c.want, c.got, c.forced, msg, c.say)
		}
		if c.forced && strings.Contains(msg, "root") {
			t.Errorf("forced: %q advises root to the root", msg)
		}
	}
}

// threadsWithTimerSlack counts this process's threads whose timer slack is slack.
func threadsWithTimerSlack(t *testing.T, slack time.Duration) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + task.Name() + "/timerslack_ns") // a thread's own, by its id
		if err != nil {
			continue // the thread exited since the listing
		}
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v == slack.Nanoseconds() {
			n++
		}
	}
	return n
}

// TestCoalescingReceiveThreadSleepsWithMicrosecondSlack: a coalescing receive thread sleeps with a 1 µs
// timer slack (the default 50 µs would end a heap-bounded sleep after the heap is due), only that thread,
// and it hands the thread back to Go with the default slack when it stops.
func TestCoalescingReceiveThreadSleepsWithMicrosecondSlack(t *testing.T) {
	if _, err := os.Stat("/proc/" + strconv.Itoa(unix.Gettid()) + "/timerslack_ns"); err != nil {
		t.Skipf("this kernel does not show a thread's timer slack: %v", err)
	}
	if n := threadsWithTimerSlack(t, coalesceTimerSlack); n != 0 {
		t.Fatalf("%d threads already have a %v timer slack before any receiver runs", n, coalesceTimerSlack)
	}
	for _, tc := range []struct {
		coalesce time.Duration
		want     int
	}{{0, 0}, {DefaultCoalesce, 1}} {
		s := loopback(t, 1, Config{Coalesce: tc.coalesce})
		sink := testutil.NewRecordingSink(true)
		stop := run(t, s, sink)
		if err := sender(t, s.LocalEndpoints()[0]).Send([][]byte{make([]byte, 64)}); err != nil {
			t.Fatal(err)
		}
		waitCount(t, sink, 1) // the receive thread is in its loop
		if n := threadsWithTimerSlack(t, coalesceTimerSlack); n != tc.want {
			t.Errorf("coalesce %v: %d threads with a %v timer slack while receiving, want %d", tc.coalesce, n,
				coalesceTimerSlack, tc.want)
		}
		stop()
		if n := threadsWithTimerSlack(t, coalesceTimerSlack); n != 0 {
			t.Errorf("coalesce %v: %d threads keep a %v timer slack after the receiver stopped", tc.coalesce, n,
				coalesceTimerSlack)
		}
	}
}
