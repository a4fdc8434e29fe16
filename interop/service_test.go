package interop_test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
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
	n.mu.Lock()
	defer n.mu.Unlock()
	var last time.Time
	for _, m := range n.msgs {
		for _, line := range strings.Split(m.text, "\n") {
			switch {
			case line == "READY=1":
				last = m.at
			case line == "WATCHDOG=1" && !last.IsZero():
				if gap := m.at.Sub(last); gap > watchdog {
					return pings, "watchdog gap " + gap.String()
				}
				last = m.at
				pings++
			}
		}
	}
	if last.IsZero() {
		return 0, "no READY=1"
	}
	if gap := until.Sub(last); gap > watchdog {
		return pings, "watchdog silent for " + gap.String() + " before the stop"
	}
	return pings, ""
}

type streamTally = bench.StreamTally

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
	notify := listenNotify(t)
	const watchdog = 500 * time.Millisecond
	recv := exec.Command(goTool, "recv", "--ring", name, "--keep-going", "--slots", "512", "--slot-size", "16K",
		"--hugepages", "off", "--log-format", "json", "127.0.0.1:"+port)
	recv.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify.path, "WATCHDOG_USEC="+
		strconv.Itoa(int(watchdog/time.Microsecond)))
	var rout, rerr bench.LockedBuffer
	recv.Stdout, recv.Stderr = &rout, &rerr
	waitRecv := startProcess(t, recv)
	if !testutil.WaitFor(10*time.Second, func() bool {
		_, problem := notify.check(time.Hour, time.Now())
		return problem == ""
	}) {
		t.Fatalf("recv never said READY=1: %s", rerr.String())
	}
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
	stopAt := time.Now()
	recv.Process.Signal(syscall.SIGTERM)
	if err := waitRecv(); err != nil {
		t.Fatalf("recv: %v\n%s", err, rerr.String())
	}
	var m map[string]any
	if err := json.Unmarshal(bench.LastLine(rout.Bytes()), &m); err != nil {
		t.Fatalf("recv output %q: %v", rout.String(), err)
	}
	if m["result"] != "interrupted" || m["heaps"] != 90.0 || m["streams"] != 3.0 || m["streams_ended"] != 3.0 ||
		m["end_of_stream"] != 1.0 || m["duplicate_packets"] != 0.0 {
		t.Fatalf("recv: %v; want 90 heaps in 3 ended streams, then END_OF_STREAM at the stop\n%s", m, rerr.String())
	}
	if pings, problem := notify.check(watchdog, stopAt); problem != "" || pings < 4 {
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
