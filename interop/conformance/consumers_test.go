package conformance_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
)

// The consumers: the consume tool of each language (`ibvbridge consume`, ibvb-consume, python -m
// ibvbridge.consume), each verifying the test pattern.
var consumerKinds = []string{"go", "c", "python"}

// consumer is a running consume tool.
type consumer struct {
	kind      string
	cmd       *exec.Cmd
	out, errb syncBuffer // written by the running process, read by the test meanwhile
	done      chan struct{}
	err       error
}

// result is a consume tool's JSON summary and its exit status.
type result struct {
	bench.ConsumeResult
	exitCode int
	stderr   string
}

// startConsumer starts a consume tool of kind on the ring at sock, with --verify and extra arguments; the
// test's cleanup kills it.
func startConsumer(t *testing.T, kind, sock string, extra ...string) *consumer {
	t.Helper()
	args := append([]string{"--ring", sock, "--timeout-ms", "30000", "--verify"}, extra...)
	c := &consumer{kind: kind, done: make(chan struct{})}
	switch kind {
	case "go":
		c.cmd = exec.Command(goTool, append([]string{"consume", "--wait"}, args...)...)
	case "c":
		tool := filepath.Join(filepath.Dir(cProduceTool(t)), "ibvb-consume")
		c.cmd = exec.Command(tool, append(args, "--wait")...)
	case "python":
		needPython(t)
		c.cmd = exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.consume", "--wait"}, args...)...)
		c.cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
	default:
		t.Fatalf("no %s consumer", kind)
	}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.errb
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.cmd.Process.Signal(syscall.SIGCONT)
		c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("%s consumer %v: %v; stderr %q", kind, extra, c.err, c.errb.String())
		}
	})
	return c
}

func (c *consumer) pid() int { return c.cmd.Process.Pid }

// wait waits (up to 60 s, then kills it) for the tool's exit and returns its JSON result.
func (c *consumer) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
		t.Errorf("%s consumer ran more than 60 s", c.kind)
	}
	r := result{stderr: c.errb.String()}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		r.exitCode = ee.ExitCode()
	}
	lines := bytes.Split(bytes.TrimSpace(c.out.Bytes()), []byte("\n"))
	if err := json.Unmarshal(lines[len(lines)-1], &r.ConsumeResult); err != nil {
		t.Fatalf("%s consumer printed %q (stderr %q, exit %v): %v", c.kind, c.out.String(), c.errb.String(), c.err, err)
	}
	return r
}

// stopped waits up to 20 s until the process is in state T (stopped: its own SIGSTOP, --stop-first).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for procState(pid) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("process %d never stopped (state %c)", pid, procState(pid))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// procState is the state letter of /proc/PID/stat (R, S, T, Z …), 0 if the process is gone.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
