package interop_test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
)

// notifyListener is a service manager's end of sd_notify (systemd's $NOTIFY_SOCKET): it records every
// datagram with its arrival time.
type notifyListener struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []notifyMsg
}

type notifyMsg struct {
	at   time.Time
	text string
}

func listenNotify(t *testing.T) *notifyListener {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifyListener{path: path, conn: conn}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, notifyMsg{time.Now(), string(buf[:k])})
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n
}

// check reports what went wrong: no READY=1, or a gap between watchdog pings (from READY on) longer than
// the watchdog's timeout; it returns the pings counted.
func (n *notifyListener) check(watchdog time.Duration, until time.Time) (pings int, problem string) {
	pings, _, problem = n.checkGaps(watchdog, until)
	return pings, problem
}

// checkGaps is check, also returning the longest gap between pings.
func (n *notifyListener) checkGaps(watchdog time.Duration, until time.Time) (pings int, longest time.Duration, problem string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var last time.Time
	for _, m := range n.msgs {
		for _, line := range strings.Split(m.text, "\n") {
			switch {
			case line == "READY=1":
				last = m.at
			case line == "WATCHDOG=1" && !last.IsZero():
				gap := m.at.Sub(last)
				longest = max(longest, gap)
				if gap > watchdog && problem == "" {
					problem = "watchdog gap " + gap.String()
				}
				last = m.at
				pings++
			}
		}
	}
	if problem != "" {
		return pings, longest, problem
	}
	if last.IsZero() {
		return 0, 0, "no READY=1"
	}
	if gap := until.Sub(last); gap > watchdog {
		return pings, longest, "watchdog silent for " + gap.String() + " before the stop"
	}
	return pings, longest, ""
}

type streamTally = bench.StreamTally

// serviceRecv is `recv --keep-going` under a notify listener with a watchdog, as a supervisor runs it.
type serviceRecv struct {
	cmd    *exec.Cmd
	notify *notifyListener
	log    *bench.LockedBuffer // stderr
	out    *bench.LockedBuffer
	wait   func() error
}

// startServiceRecv starts it on ring name and port, and returns once it said READY=1 and n consumers
// (started before it, with --wait) are attached.
func startServiceRecv(t *testing.T, name, port string, watchdog time.Duration, n int, slots string) *serviceRecv {
	t.Helper()
	r := &serviceRecv{notify: listenNotify(t), log: &bench.LockedBuffer{}, out: &bench.LockedBuffer{}}
	r.cmd = exec.Command(goTool, "recv", "--ring", name, "--keep-going", "--slots", slots, "--slot-size", "16K",
		"--hugepages", "off", "--log-format", "json", "127.0.0.1:"+port)
	r.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+r.notify.path, "WATCHDOG_USEC="+strconv.Itoa(int(watchdog/time.Microsecond)))
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.log
	r.wait = startProcess(t, r.cmd)
	if !testutil.WaitFor(10*time.Second, func() bool { _, p := r.notify.check(time.Hour, time.Now()); return p == "" }) {
		t.Fatalf("recv never said READY=1: %s", r.log.String())
	}
	waitAllAttached(t, name, n)
	return r
}

// stop sends SIGTERM, waits for recv and returns when it was stopped and its final JSON counters.
func (r *serviceRecv) stop(t *testing.T) (time.Time, map[string]any) {
	t.Helper()
	at := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	if err := r.wait(); err != nil {
		t.Fatalf("recv: %v\n%s", err, r.log.String())
	}
	var m map[string]any
	if err := json.Unmarshal(bench.LastLine(r.out.Bytes()), &m); err != nil {
		t.Fatalf("recv output %q: %v", r.out.String(), err)
	}
	return at, m
}

// waitAllAttached waits until n consumers are attached to ring name (started before recv, they attach
// as soon as it serves: with --wait they find it whichever started first).
func waitAllAttached(t *testing.T, name string, n int) {
	t.Helper()
	if !testutil.WaitFor(30*time.Second, func() bool {
		i, err := ring.Inspect(name, "")
		return err == nil && i.Attached() >= n
	}) {
		t.Fatalf("%d consumers did not attach to %s", n, name)
	}
}

// TestServiceStreamsAcrossConsumers is recv as a service (`recv --keep-going` under a notify listener with a
// watchdog): Go, C and Python consumers, started before recv (--wait), read four streams across their
// boundaries — two complete ones that reuse the same heap cnts, a sender that stops without a stream stop
// and restarts with the same cnts (one stream to recv), the end of the ring — and each sees every heap of
// every stream and each STREAM_END marker in order; the ring's END_OF_STREAM comes only when recv stops.
// The watchdog (500 ms) is pinged all along, idle stretches included.
func TestServiceStreamsAcrossConsumers(t *testing.T) {
	name, port := uniqueRing(t, "service"), freeUDPPort(t)
	kinds := consumers(t)
	waits := map[string]func() result{}
	for _, k := range kinds {
		extra := []string{"--streams"}
		if k == "c" {
			extra = append(extra, "--wait")
		}
		waits[k] = startConsumerVerify(t, k, name, true, extra...)
	}
	const watchdog = 500 * time.Millisecond
	recv := startServiceRecv(t, name, port, watchdog, len(kinds), "512")
	rerr := recv.log
	send := func(args ...string) {
		t.Helper()
		out, err := exec.Command(goTool, append([]string{"send", "127.0.0.1:" + port, "--heap-size", "4096",
			"--pattern"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("send %v: %v\n%s", args, err, out)
		}
	}
	send("--heaps", "30")
	send("--heaps", "30") // the same cnts again: a new stream's own
	send("--heaps", "10", "--no-stop")
	time.Sleep(300 * time.Millisecond) // a sender restarting without a stop: its cnts 1..10 again, later
	send("--heaps", "20")
	// Every consumer has read the three streams before recv stops: then only the ring's end follows.
	if !testutil.WaitFor(20*time.Second, func() bool { return strings.Count(rerr.String(), "stream ended") == 3 }) {
		t.Fatalf("recv did not log three stream ends: %s", rerr.String())
	}
	time.Sleep(2 * watchdog) // pings go on while the service idles between streams
	stopAt, m := recv.stop(t)
	if m["result"] != "interrupted" || m["heaps"] != 90.0 || m["streams"] != 3.0 || m["streams_ended"] != 3.0 ||
		m["end_of_stream"] != 1.0 || m["duplicate_packets"] != 0.0 {
		t.Fatalf("recv: %v; want 90 heaps in 3 ended streams, then END_OF_STREAM at the stop\n%s", m, rerr.String())
	}
	if pings, problem := recv.notify.check(watchdog, stopAt); problem != "" || pings < 4 {
		t.Errorf("watchdog: %d pings, %s", pings, problem)
	}
	sum := func(n uint64) uint64 { return n * (n + 1) / 2 }
	want := []streamTally{
		{Heaps: 30, HeapCntSum: sum(30), Ended: true, StopHeapCnt: 31},
		{Heaps: 30, HeapCntSum: sum(30), Ended: true, StopHeapCnt: 31},
		{Heaps: 30, HeapCntSum: sum(10) + sum(20), Ended: true, StopHeapCnt: 21},
	} // and no heap after the last marker: the tools list no empty last stream
	for _, k := range kinds {
		r := waits[k]()
		if r.exitCode != 0 || r.Result != "eos" || r.VerifyErrors != 0 || r.Heaps != 90 {
			t.Errorf("%s consumer: exit %d, %+v", k, r.exitCode, r.ConsumeResult)
			continue
		}
		if len(r.Streams) != len(want) {
			t.Errorf("%s consumer: streams %+v, want %+v", k, r.Streams, want)
			continue
		}
		for i := range want {
			if r.Streams[i] != want[i] {
				t.Errorf("%s consumer: stream %d is %+v, want %+v", k, i, r.Streams[i], want[i])
			}
		}
	}
}

// procStat reads a process's resident memory (bytes) and open descriptors.
func procStat(pid int) (rss uint64, fds int) {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			rss = kb << 10
		}
	}
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return rss, len(ents)
}

// TestServiceSoak is `recv --keep-going` kept running under a supervisor's notify socket and watchdog
// through many streams — most stopped by their sender, every tenth sender restarting without a stop, every
// tenth killed mid-stream (the stream goes on with a new sender) — read across the boundaries by Go, C and
// Python consumers at once. Every heap of every stream is accounted (each consumer read exactly what recv
// published; a stream whose sender was not killed has every heap it sent), each consumer saw every stream
// end in order, recv's RSS and descriptors stay flat, and the watchdog is never missed. make test runs it
// short (IBVBRIDGE_SOAK_STREAMS, default 12); `make soak-service` runs 200 streams over 10 minutes
// (IBVBRIDGE_SOAK_SECONDS paces them).
func TestServiceSoak(t *testing.T) {
	streams, seconds := 12, 0
	if s := os.Getenv("IBVBRIDGE_SOAK_STREAMS"); s != "" {
		streams, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("IBVBRIDGE_SOAK_SECONDS"); s != "" {
		seconds, _ = strconv.Atoi(s)
	}
	name, port := uniqueRing(t, "soak"), freeUDPPort(t)
	kinds := consumers(t)
	waits := map[string]func() result{}
	for _, k := range kinds {
		waits[k] = startConsumerVerify(t, k, name, true, "--streams", "--wait", "--timeout-ms", "60000")
	}
	// Half the unit's WatchdogSec (10 s): pings every 2 s. On a shared 2-core machine a process can be
	// descheduled for a second or two; the longest gap is reported.
	const watchdog = 5 * time.Second
	recv := startServiceRecv(t, name, port, watchdog, len(kinds), "256")
	rerr := recv.log
	sendArgs := func(heaps int, extra ...string) *exec.Cmd {
		return exec.Command(goTool, append([]string{"send", "127.0.0.1:" + port, "--heap-size", "8192", "--pattern",
			"--rate", "0.05", "--heaps", strconv.Itoa(heaps)}, extra...)...)
	}
	run := func(c *exec.Cmd) {
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c.Args[1:], err, out)
		}
	}
	type planned struct {
		heaps  uint64 // heaps sent whole (for a stream without a killed sender), else 0
		killed bool
		stop   uint64
	}
	var plan []planned
	var rss0, rssMax uint64
	fds0, fdsMax := 0, 0
	start := time.Now()
	for i := range streams {
		switch {
		case i%10 == 3: // a sender restarts without a stop: its cnts again, the same stream to recv
			run(sendArgs(15, "--no-stop"))
			time.Sleep(150 * time.Millisecond)
			run(sendArgs(25))
			plan = append(plan, planned{heaps: 40, stop: 26})
		case i%10 == 7: // a sender killed mid-stream; a new one finishes the stream
			c := sendArgs(100000, "--no-stop")
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(120 * time.Millisecond)
			c.Process.Kill()
			c.Wait()
			time.Sleep(150 * time.Millisecond)
			run(sendArgs(20))
			plan = append(plan, planned{killed: true, stop: 21})
		default:
			n := 20 + i%7
			run(sendArgs(n))
			plan = append(plan, planned{heaps: uint64(n), stop: uint64(n + 1)})
		}
		if !testutil.WaitFor(20*time.Second, func() bool { return strings.Count(rerr.String(), "stream ended") == i+1 }) {
			t.Fatalf("stream %d: recv did not end it: %s", i, rerr.String())
		}
		rss, fds := procStat(recv.cmd.Process.Pid)
		if i == 1 {
			rss0, fds0 = rss, fds
		}
		rssMax, fdsMax = max(rssMax, rss), max(fdsMax, fds)
		if seconds > 0 { // pace the streams over the soak's length
			if left := time.Until(start.Add(time.Duration(seconds) * time.Second * time.Duration(i+1) / time.Duration(streams))); left > 0 {
				time.Sleep(left)
			}
		}
	}
	stopAt, m := recv.stop(t)
	recvHeaps := uint64(m["heaps"].(float64))
	tc, _ := m["transport_counters"].(map[string]any)
	if m["streams"] != float64(streams) || m["end_of_stream"] != 1.0 || m["dropped_heaps"] != 0.0 {
		t.Errorf("recv: %v; want %d streams ended, no heap dropped", m, streams)
	}
	if tc["kernel_drops"] != 0.0 {
		t.Logf("kernel drops %v: heaps lost whole before recv (the per-stream check is then relaxed)", tc["kernel_drops"])
	}
	pings, longest, problem := recv.notify.checkGaps(watchdog, stopAt)
	if problem != "" {
		t.Errorf("watchdog: %s (after %d pings)", problem, pings)
	}
	if rssMax > rss0+rss0/10+4<<20 || fdsMax > fds0+2 { // +2: a connection being served (an observer, a hello)
		t.Errorf("recv not flat: RSS %d after the first streams, at most %d; descriptors %d, at most %d", rss0, rssMax, fds0, fdsMax)
	}
	var first []streamTally
	for _, k := range kinds {
		r := waits[k]()
		if r.exitCode != 0 || r.Result != "eos" || r.VerifyErrors != 0 || r.Heaps != recvHeaps {
			t.Errorf("%s consumer: exit %d, %d heaps of recv's %d, %+v", k, r.exitCode, r.Heaps, recvHeaps, r.ConsumeResult)
			continue
		}
		if len(r.Streams) != streams {
			t.Errorf("%s consumer: %d streams, want %d", k, len(r.Streams), streams)
			continue
		}
		for i, s := range r.Streams {
			p := plan[i]
			if !s.Ended || s.StopHeapCnt != p.stop || (!p.killed && tc["kernel_drops"] == 0.0 && s.Heaps != p.heaps) {
				t.Errorf("%s consumer: stream %d %+v, planned %+v", k, i, s, p)
			}
		}
		if first == nil {
			first = r.Streams
		} else if !slices.Equal(first, r.Streams) {
			t.Errorf("%s consumer read other streams than %s: %+v vs %+v", k, kinds[0], r.Streams, first)
		}
	}
	t.Logf("%d streams in %v, %d heaps; recv RSS %d → max %d bytes, %d → max %d descriptors; %d watchdog pings (timeout %v), longest gap %v; incomplete discarded %v",
		streams, stopAt.Sub(start).Round(time.Second), recvHeaps, rss0, rssMax, fds0, fdsMax, pings, watchdog,
		longest.Round(time.Millisecond), m["discarded_incomplete_heaps"])
}
