// Package testenv owns the environment every ibvbridge test binary runs in: a ring directory of its own.
// Main runs a package's tests with $IBVBRIDGE_RING_DIR pointing at a fresh temporary directory, so a test
// that names no ring directory (and every recv, C or Python client it starts, which inherit the variable)
// creates nothing in the machine-wide /run/ibvbridge or /dev/shm/ibvbridge-UID, and fails the run when
// something of this process appeared there anyway. It imports nothing of ibvbridge, so any package's
// tests, internal or external, can use it.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EnvDir is ring.EnvDir (TestEnvDirIsRings checks they agree).
const EnvDir = "IBVBRIDGE_RING_DIR"

// MachineDirs are the machine-wide ring directories no test may write into.
func MachineDirs() []string {
	dirs := []string{"/run/ibvbridge"}
	m, _ := filepath.Glob("/dev/shm/ibvbridge-*")
	return append(dirs, m...)
}

// Main runs m in a ring directory of its own (see the package comment) and returns the exit code: m's,
// or 1 when an entry naming this process's pid was created in a machine-wide directory while the tests
// ran, even if removed again (inotify sees the creation), or is left there (test rings are named with the
// pid; what other processes on the machine create is not ours to judge).
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ibvb-rings")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // as a ring directory: a consumer as nobody may look in
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	os.Setenv(EnvDir, dir)
	pid := strconv.Itoa(os.Getpid())
	before := snapshot()
	w := watch(pid, append(MachineDirs(), "/dev/shm"))
	code := m.Run()
	left := append(appeared(before, snapshot(), pid), w.stop()...)
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "testenv: FAIL: tests created %s in a machine-wide ring directory (give them a directory of their own)\n", strings.Join(left, ", "))
		if code == 0 {
			code = 1
		}
	}
	return code
}

// watcher records the entries created in the machine-wide directories that name pid.
type watcher struct {
	fd      int
	names   map[int]string // watch descriptor → directory
	mu      sync.Mutex
	created []string
	done    chan struct{}
}

func watch(pid string, dirs []string) *watcher {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil // no inotify: the snapshot comparison still runs
	}
	w := &watcher{fd: fd, names: map[int]string{}, done: make(chan struct{})}
	for _, d := range dirs {
		if wd, err := unix.InotifyAddWatch(fd, d, unix.IN_CREATE|unix.IN_MOVED_TO); err == nil {
			w.names[wd] = d
		}
	}
	go w.run(pid)
	return w
}

func (w *watcher) run(pid string) {
	buf := make([]byte, 64<<10)
	pfd := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		select {
		case <-w.done:
			return
		default:
		}
		if n, _ := unix.Poll(pfd, 100); n <= 0 {
			continue
		}
		n, err := unix.Read(w.fd, buf)
		for off := 0; err == nil && off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			name := strings.TrimRight(string(nameBytes), "\x00")
			dir := w.names[int(ev.Wd)]
			if strings.Contains(name, pid) && (dir != "/dev/shm" || strings.HasPrefix(name, "ibvbridge-")) {
				w.mu.Lock()
				w.created = append(w.created, filepath.Join(dir, name))
				w.mu.Unlock()
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// stop ends the watch and returns what was created.
func (w *watcher) stop() []string {
	if w == nil {
		return nil
	}
	close(w.done)
	time.Sleep(150 * time.Millisecond) // the reader's last poll
	unix.Close(w.fd)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.created
}

func snapshot() map[string]bool {
	s := map[string]bool{}
	for _, d := range MachineDirs() {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			s[filepath.Join(d, e.Name())] = true
		}
	}
	return s
}

// appeared lists the entries of after that are not in before and name pid.
func appeared(before, after map[string]bool, pid string) []string {
	var out []string
	for p := range after {
		if !before[p] && strings.Contains(filepath.Base(p), pid) {
			out = append(out, p)
		}
	}
	return out
}
