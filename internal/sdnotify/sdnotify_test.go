package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNotifyReadyAndWatchdog: with $NOTIFY_SOCKET and $WATCHDOG_USEC set, FromEnv arms the watchdog at half
// the timeout, Send delivers READY=1, Ping sends WATCHDOG=1 no more often than most of that interval, and
// the variables are unset for children; without $NOTIFY_SOCKET everything is a no-op.
func TestNotifyReadyAndWatchdog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "1000000")
	n, err := FromEnv()
	if err != nil || n == nil {
		t.Fatalf("FromEnv: %v, %v", n, err)
	}
	defer n.Close()
	if n.WatchdogInterval() != 500*time.Millisecond {
		t.Errorf("interval %v, want half of 1 s", n.WatchdogInterval())
	}
	if err := n.Send("READY=1"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 399 * time.Millisecond, 400 * time.Millisecond} {
		if err := n.Ping(t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	var got []string
	conn.SetReadDeadline(time.Now().Add(time.Second))
	for len(got) < 3 {
		k, err := conn.Read(buf)
		if err != nil {
			break
		}
		got = append(got, string(buf[:k]))
	}
	if strings.Join(got, ",") != "READY=1,WATCHDOG=1,WATCHDOG=1" {
		t.Errorf("received %q: want READY=1 then a ping at 0 and at 400 ms (not at 100 or 399 ms)", got)
	}
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC"} {
		if _, set := lookupEnv(v); set {
			t.Errorf("%s still set for children", v)
		}
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if n, err := FromEnv(); n != nil || err != nil || n.Send("READY=1") != nil || n.Ping(time.Now()) != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, %v; want a no-op", n, err)
	}
}

func lookupEnv(k string) (string, bool) { return os.LookupEnv(k) }
