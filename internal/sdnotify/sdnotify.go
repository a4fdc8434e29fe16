// Package sdnotify owns recv's side of systemd's service notification protocol (sd_notify(3)): READY=1
// once the ring serves, STATUS= lines, WATCHDOG=1 pings at half of WATCHDOG_USEC, STOPPING=1. It speaks
// the protocol itself (one datagram per message to $NOTIFY_SOCKET) so it needs no libsystemd; without
// $NOTIFY_SOCKET every call does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// Notifier sends notifications to the service manager. The zero value and nil do nothing.
type Notifier struct {
	mu       sync.Mutex
	conn     *net.UnixConn
	interval time.Duration // watchdog ping interval (half of WATCHDOG_USEC), 0: no watchdog
	lastPing time.Time
}

// FromEnv returns a Notifier for $NOTIFY_SOCKET (nil when it is unset) and unsets the variables so
// children do not inherit them, as sd_notify's unset_environment does. A watchdog is armed when
// $WATCHDOG_USEC is set (and $WATCHDOG_PID, if set, is this process).
func FromEnv() (*Notifier, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	usec := os.Getenv("WATCHDOG_USEC")
	pid := os.Getenv("WATCHDOG_PID")
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
		os.Unsetenv(v)
	}
	if path == "" {
		return nil, nil
	}
	if path[0] == '@' { // abstract namespace
		path = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("sd_notify: connect $NOTIFY_SOCKET %q: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	n := &Notifier{conn: conn}
	if usec != "" && (pid == "" || pid == strconv.Itoa(os.Getpid())) {
		us, err := strconv.ParseUint(usec, 10, 63)
		if err != nil || us == 0 {
			conn.Close()
			return nil, fmt.Errorf("sd_notify: $WATCHDOG_USEC %q: want a positive number of microseconds", usec)
		}
		n.interval = time.Duration(us) * time.Microsecond / 2
	}
	return n, nil
}

// Send sends one notification (lines such as "READY=1\nSTATUS=receiving").
func (n *Notifier) Send(state string) error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	_, err := n.conn.Write([]byte(state))
	return err
}

// WatchdogInterval is how often Ping sends WATCHDOG=1 (0: no watchdog armed).
func (n *Notifier) WatchdogInterval() time.Duration {
	if n == nil {
		return 0
	}
	return n.interval
}

// Ping sends WATCHDOG=1 when the watchdog is armed and most of its interval (four fifths: a caller that
// calls every fifth of it or more often then pings at least every interval, not up to a call late) has
// passed since the last ping. Call it from the loop whose liveness it vouches for.
func (n *Notifier) Ping(now time.Time) error {
	if n == nil || n.interval == 0 {
		return nil
	}
	n.mu.Lock()
	due := now.Sub(n.lastPing) >= n.interval*4/5
	if due {
		n.lastPing = now
	}
	n.mu.Unlock()
	if !due {
		return nil
	}
	return n.Send("WATCHDOG=1")
}

// Close closes the connection.
func (n *Notifier) Close() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}
