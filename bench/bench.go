// Package bench owns ibvbridge's benchmark harness: the ring benchmark (a Go producer and a consumer
// process in C, Python or Go), the loopback and veth UDP/AF_XDP receive benchmarks (send → recv →
// consumer processes, a search for the highest lossless rate), the floor receiver (the cheapest receiver
// of a UDP stream: what the kernel alone costs), the side-by-side run with spead2_recv (bench udp
// --peer), launching the consumer tools, CPU accounting, the memcpy reference, medians and the JSON
// results. `ibvbridge bench` parses flags and
// prints; everything measured is here, so tests and other tools can run the same benchmarks.
package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Env is where a benchmark runs: the ibvbridge binary it launches for recv, send and the Go consumer,
// and where it reports progress.
type Env struct {
	Binary string    // default: this executable (bin/ibvbridge runs its own benchmarks)
	Log    io.Writer // progress lines; nil: discarded
}

func (e Env) binary() (string, error) {
	if e.Binary != "" {
		return e.Binary, nil
	}
	return os.Executable()
}

func (e Env) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, format, args...)
	}
}

// ConsumerCommand builds the consumer process of a benchmark or test: the Go consumer is this binary's
// `consume`; the C and Python tools are found next to the source tree (or via IBVBRIDGE_C_CONSUME /
// IBVBRIDGE_PYTHON_CLIENT).
func ConsumerCommand(env Env, kind, ringName string, batch int, extra ...string) (*exec.Cmd, error) {
	args := append([]string{"--ring", ringName, "--timeout-ms", "60000"}, extra...)
	switch kind {
	case "go":
		self, err := env.binary()
		if err != nil {
			return nil, err
		}
		return exec.Command(self, append([]string{"consume"}, args...)...), nil
	case "c":
		tool, err := FindTool("IBVBRIDGE_C_CONSUME", "clients/c/build/ibvb-consume")
		if err != nil {
			return nil, err
		}
		return exec.Command(tool, args...), nil
	case "python":
		pkg, err := FindTool("IBVBRIDGE_PYTHON_CLIENT", "clients/python")
		if err != nil {
			return nil, err
		}
		if batch > 0 {
			args = append(args, "--batch", strconv.Itoa(batch))
		}
		cmd := exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.consume"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg, "PYENV_VERSION=system")
		return cmd, nil
	}
	return nil, fmt.Errorf("%w: consumer %q: want go, c or python", ErrBadOption, kind)
}

// FindTool locates a path of the source tree: from an environment variable, the working directory, or
// upwards from the executable (bin/ibvbridge in the tree).
func FindTool(env, rel string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, wd)
	}
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, filepath.Dir(exe))
	}
	for _, r := range roots {
		for d := r; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, rel)); err == nil {
				return filepath.Join(d, rel), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", fmt.Errorf("%s not found (build it with make, or set %s)", rel, env)
}

// ErrBadOption marks an option a benchmark cannot run with; the CLI reports it as a usage error.
var ErrBadOption = errors.New("bad option")

func cmdRunning(cmd *exec.Cmd) bool {
	return cmd.ProcessState == nil && cmd.Process.Signal(syscall.Signal(0)) == nil
}

// LastLine is the last non-empty line of a process's output: where every tool prints its JSON result.
func LastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

// memcpyRate measures single-core copy throughput over a working set as large as the ring's payload, so
// the comparison is against memory, not cache.
func memcpyRate(workingSet int) float64 {
	n := max(workingSet, 64<<20)
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	var copied int
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		copy(dst, src)
		copied += n
	}
	return float64(copied) / time.Since(start).Seconds()
}

// clkTck is /proc's clock tick (USER_HZ): 100 on Linux.
const clkTck = 100

// cpuTime reads a process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are fields 14 and 15.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// waitSettled waits, up to d, until none of the processes used CPU for settleQuiet: what they still do
// after start-up (a consumer mapping a large ring, the kernel zeroing its pages) must not land in the
// stream's figures. Past d it returns: a process that never idles is measured as it is.
func waitSettled(d time.Duration, pids ...int) {
	deadline := time.Now().Add(d)
	last := make([]time.Duration, len(pids))
	quietSince := time.Now()
	for time.Now().Before(deadline) {
		busy := false
		for i, pid := range pids {
			c, err := cpuTime(pid)
			if err != nil {
				return // gone: the run reports why
			}
			busy = busy || c != last[i]
			last[i] = c
		}
		if busy {
			quietSince = time.Now()
		} else if time.Since(quietSince) >= settleQuiet {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settleQuiet is how long a process must not tick (10 ms of CPU) to count as settled.
const settleQuiet = 200 * time.Millisecond

// receiver is a receiving process (recv, spead2_recv, the floor) started with a goroutine waiting for it.
type receiver struct {
	cmd    *exec.Cmd
	done   chan error
	reaped bool
}

// startReceiver starts cmd; the caller defers kill, so the process is gone on every return.
func startReceiver(cmd *exec.Cmd) (*receiver, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	r := &receiver{cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	return r, nil
}

// startReady starts cmd with its output collected, then waits up to d for ready; on timeout it kills
// it and returns an error with its stderr. The caller defers kill, so the process is gone on every return.
func startReady(cmd *exec.Cmd, stdout io.Writer, stderr *LockedBuffer, d time.Duration, ready func() bool) (*receiver, error) {
	cmd.Stdout, cmd.Stderr = stdout, stderr
	r, err := startReceiver(cmd)
	if err != nil {
		return nil, err
	}
	if err := waitFor(d, ready); err != nil {
		r.kill()
		return nil, fmt.Errorf("%s did not start: %s", filepath.Base(cmd.Path), strings.TrimSpace(stderr.String()))
	}
	return r, nil
}

// recvReceiving reports whether recv logged (JSON) that its transport is open: a kernel-bypass one opens
// after the ring exists.
func recvReceiving(stderr *LockedBuffer) func() bool {
	return func() bool { return strings.Contains(stderr.String(), `"message":"receiving"`) }
}

// finish waits for the receiver to end at the end of its stream; a lossy run may have lost the stop heap
// itself, so after grace it is interrupted (it then prints what it has). Its exit error.
func (r *receiver) finish(grace time.Duration) error {
	var err error
	select {
	case err = <-r.done:
	case <-time.After(grace):
		_ = r.cmd.Process.Signal(syscall.SIGINT)
		err = <-r.done // bounded by the command's context, which kills it
	}
	r.reaped = true
	return err
}

// kill ends and reaps the receiver unless finish has.
func (r *receiver) kill() {
	if !r.reaped {
		_ = r.cmd.Process.Kill()
		<-r.done
		r.reaped = true
	}
}

// LockedBuffer collects a child process's output while another goroutine reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Bytes returns a copy of what was written.
func (l *LockedBuffer) Bytes() []byte { return []byte(l.String()) }

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}
