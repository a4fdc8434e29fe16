package conformance_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// The producers under test. Each is started as a process with the same flags (ibvb-produce's): the Go one
// is this test binary re-executed as a ring.Producer publishing pattern heaps (goProducerMain).
var producerKinds = []string{"go", "c", "python"}

const (
	goProducerEnv = "IBVB_CONF_GO_PRODUCER"
	// mutantEnv switches on, in a test build of a producer, one broken guard so that a test can prove the
	// suite catches it: row-late (a detached consumer's row is written after its slots are reused),
	// no-wake (Interrupt does not wake a producer blocked on a release futex), no-unmap (a detached
	// consumer's region is not unmapped at the detach). Only test builds read it: the Go producer in a
	// test binary, the C library built with -DIBVB_TEST_HOOKS, the Python producer (it has no build step).
	mutantEnv = "IBVBRIDGE_TEST_MUTANT"
	// sliceEnv sets, in a test build, the longest sleep of a blocked producer on a release futex (spec §7.4:
	// ≤ 250 ms): a long one makes a missing wake visible by a count instead of by a 250 ms bound.
	sliceEnv = "IBVBRIDGE_TEST_WAIT_SLICE_MS"
)

// prodOpts are a producer's flags.
type prodOpts struct {
	heaps, heapSize, slots, wait int
	policy                       string
	env                          []string // extra environment: mutants, the wait slice
	// interruptOnEOF starts, instead of the produce tool, a block producer publishing until it blocks whose
	// other thread interrupts it when its standard input closes (producer.interrupt): the Go producer's
	// --interrupt-on-eof, testdata/block_produce.c and testdata/block_produce.py.
	interruptOnEOF bool
	grants         []string // --consumer-group NAME=UID|@GID[,...] (spec §14.1)
	// idle starts instead a drop producer that publishes slots/2 heaps and then does nothing until its
	// standard input closes (the Go producer's --idle-until-eof, the same programs with idle).
	idle bool
}

// producer is a running producer process.
type producer struct {
	kind, dir, name string
	cmd             *exec.Cmd
	stdin           io.WriteCloser // with interruptOnEOF: closing it interrupts the producer
	out, errb       syncBuffer     // written by the running process, read by the test meanwhile
	done            chan struct{}
	err             error
}

// syncBuffer is a bytes.Buffer a running process writes into while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes is a copy of what was written so far.
func (s *syncBuffer) Bytes() []byte { return []byte(s.String()) }

// sock is the ring's socket path.
func (p *producer) sock() string { return filepath.Join(p.dir, ring.SocketName(p.name)) }

func (p *producer) pid() int { return p.cmd.Process.Pid }

// startProducer starts a producer of kind publishing o.heaps pattern heaps (heap_cnt 1 … heaps) into a ring
// in a fresh directory of the test's, once o.wait consumers attached. The test's cleanup kills it.
func startProducer(t *testing.T, kind string, o prodOpts) *producer {
	t.Helper()
	dir := t.TempDir()
	p := &producer{kind: kind, dir: dir, name: "conf", done: make(chan struct{})}
	args := []string{"--ring", p.name, "--dir", dir, "--heaps", strconv.Itoa(o.heaps), "--heap-size",
		strconv.Itoa(o.heapSize), "--slots", strconv.Itoa(o.slots), "--policy", o.policy, "--pattern",
		"--hugepages", "off"}
	if o.wait > 0 {
		args = append(args, "--wait-consumers", strconv.Itoa(o.wait))
	}
	for _, g := range o.grants {
		args = append(args, "--consumer-group", g)
	}
	mode := "block"
	if o.idle {
		mode = "idle"
	}
	switch {
	case o.idle && kind == "go":
		p.cmd = exec.Command(os.Args[0], "--ring", p.name, "--dir", dir, "--slots", strconv.Itoa(o.slots),
			"--heaps", strconv.Itoa(o.slots/2), "--heap-size", "4096", "--idle-until-eof")
		p.cmd.Env = append(os.Environ(), goProducerEnv+"=1")
	case o.interruptOnEOF && kind == "go":
		p.cmd = exec.Command(os.Args[0], append(args, "--interrupt-on-eof")...)
		p.cmd.Env = append(os.Environ(), goProducerEnv+"=1")
	case (o.interruptOnEOF || o.idle) && kind == "c":
		p.cmd = exec.Command(filepath.Join(filepath.Dir(cProduceTool(t)), "block_produce"), dir, p.name,
			strconv.Itoa(o.slots), mode)
		p.cmd.Env = os.Environ()
	case (o.interruptOnEOF || o.idle) && kind == "python":
		needPython(t)
		p.cmd = exec.Command("/usr/bin/python3", filepath.Join(repoRoot, "interop/conformance/testdata/block_produce.py"),
			dir, p.name, strconv.Itoa(o.slots), mode)
		p.cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
	}
	switch {
	case p.cmd != nil:
	case kind == "go":
		p.cmd = exec.Command(os.Args[0], args...)
		p.cmd.Env = append(os.Environ(), goProducerEnv+"=1")
	case kind == "c":
		p.cmd = exec.Command(cProduceTool(t), args...)
		p.cmd.Env = os.Environ()
	case kind == "python":
		needPython(t)
		p.cmd = exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.produce"}, args...)...)
		p.cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
	default:
		t.Fatalf("no %s producer", kind)
	}
	p.cmd.Env = append(p.cmd.Env, o.env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errb
	if o.interruptOnEOF || o.idle {
		w, err := p.cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdin = w
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.done
		ring.Remove(dir, p.name) // a killed producer leaves its files
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ring.Inspect(p.sock(), ""); err == nil { // listening, not only bound
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s producer exited before making its ring: %v: %s", kind, p.err, p.errb.String())
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s producer made no ring in 30 s", kind)
		}
	}
}

// exited waits up to d for the producer to exit and reports whether it did.
func (p *producer) exited(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// exitCode is the producer's exit status once it exited (-1 if killed by a signal).
func (p *producer) exitCode() int {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		return -1
	}
	return 0
}

// waitInfo polls the ring (every 2 ms, up to 20 s) until ok reports true, and returns what ok accepted. An
// inspection that fails (a loaded machine can make an observer's hello time out) is tried again until then.
func (p *producer) waitInfo(t *testing.T, what string, ok func(*ring.Info) bool) *ring.Info {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := ring.Inspect(p.sock(), "")
		if err == nil && ok(&info) {
			return &info
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s producer: %s never came (last: %v, head %d, consumers %+v, counters %v; stderr %q)",
				p.kind, what, err, info.Head, info.Consumers, info.Counters, p.errb.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var (
	cBuildOnce sync.Once
	cBuildDone = make(chan struct{})
	cBuildDir  string
	cBuildErr  error
)

// buildC builds ibvb-produce and ibvb-consume from clients/c with the test hooks (-DIBVB_TEST_HOOKS), and
// testdata/block_produce.c, into a directory of this run's. TestMain starts it beside the Go build.
func buildC() {
	cBuildOnce.Do(func() {
		defer close(cBuildDone)
		dir, err := os.MkdirTemp("", "ibvb-conf-c")
		if err != nil {
			cBuildErr = err
			return
		}
		cBuildDir = dir
		b := filepath.Join(dir, "build")
		cmd := exec.Command("make", "-s", "-C", filepath.Join(repoRoot, "clients/c"), "B="+b,
			"EXTRA_CFLAGS=-DIBVB_TEST_HOOKS", b+"/ibvb-produce", b+"/ibvb-consume")
		if out, err := cmd.CombinedOutput(); err != nil {
			cBuildErr = fmt.Errorf("build the C producer with test hooks: %v: %s", err, out)
			return
		}
		cmd = exec.Command("cc", "-std=c11", "-O2", "-Wall", "-Werror", "-I", filepath.Join(repoRoot, "clients/c"),
			filepath.Join(repoRoot, "interop/conformance/testdata/block_produce.c"), b+"/libibvbridge.a",
			"-o", b+"/block_produce", "-lpthread")
		if out, err := cmd.CombinedOutput(); err != nil {
			cBuildErr = fmt.Errorf("build testdata/block_produce.c: %v: %s", err, out)
		}
	})
}

// cProduceTool is the C build's ibvb-produce (buildC); without a C compiler or make the test skips,
// unless IBVBRIDGE_REQUIRE_CLIENTS.
func cProduceTool(t *testing.T) string {
	t.Helper()
	buildC()
	<-cBuildDone
	if cBuildErr != nil {
		if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
			t.Fatal(cBuildErr)
		}
		t.Skip(cBuildErr)
	}
	return filepath.Join(cBuildDir, "build", "ibvb-produce")
}

func cleanupBuilds() {
	<-cBuildDone
	if cBuildDir != "" {
		os.RemoveAll(cBuildDir)
	}
}

// needPython skips (or, under IBVBRIDGE_REQUIRE_CLIENTS, fails) without Debian's python3 and numpy.
func needPython(t *testing.T) {
	t.Helper()
	pyOnce.Do(func() {
		pyErr = exec.Command("/usr/bin/python3", "-c", "import numpy").Run()
	})
	if pyErr != nil {
		if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
			t.Fatalf("/usr/bin/python3 with numpy: %v", pyErr)
		}
		t.Skipf("no /usr/bin/python3 with numpy: %v", pyErr)
	}
}

var (
	pyOnce sync.Once
	pyErr  error
)

// goProducerMain is the Go producer process: ibvb-produce's flags and JSON summary, on ring.Producer.
// SIGINT or SIGTERM interrupts it (Interrupt) as recv does; it then exits 1.
func goProducerMain(args []string) int {
	fs := flag.NewFlagSet("go-producer", flag.ContinueOnError)
	name := fs.String("ring", "", "")
	dir := fs.String("dir", "", "")
	heaps := fs.Uint64("heaps", 1000, "")
	size := fs.Int("heap-size", 4096, "")
	slots := fs.Int("slots", 256, "")
	policy := fs.String("policy", "drop", "")
	waitN := fs.Int("wait-consumers", 0, "")
	fs.Bool("pattern", true, "")
	fs.String("hugepages", "off", "")
	var grants []string
	fs.Func("consumer-group", "grant NAME=UID|@GID[,...] (repeatable)", func(v string) error { grants = append(grants, v); return nil })
	onEOF := fs.Bool("interrupt-on-eof", false, "interrupt when standard input closes (from a goroutine, not a signal)")
	idle := fs.Bool("idle-until-eof", false, "publish, then do nothing until standard input closes")
	if err := fs.Parse(args); err != nil {
		return 1
	}
	cfg := ring.Config{Dir: *dir, SlotCount: *slots, SlotSize: *size, MaxConsumers: 16, HugePages: ring.HugePagesOff}
	if *policy == "block" {
		cfg.Policy = ring.PolicyBlock
	}
	for _, g := range grants {
		name, grant, err := ring.ParseGroupGrant(g)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go producer:", err)
			return 1
		}
		if cfg.Groups == nil {
			cfg.Groups = map[string]ring.GroupGrant{}
		}
		cfg.Groups[name] = grant
	}
	p, err := ring.Create(*name, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go producer:", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	stopped := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopped); p.Interrupt() }) }
	go func() { <-sig; stop() }()
	if *onEOF {
		go func() { io.Copy(io.Discard, os.Stdin); stop() }()
	}
	interrupted := func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}
	for deadline := time.Now().Add(30 * time.Second); p.Consumers() < *waitN && !interrupted(); {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "go producer: only %d of %d consumers attached within 30 s\n", p.Consumers(), *waitN)
			p.Close()
			return 1
		}
		time.Sleep(time.Millisecond)
	}
	pb := pattern.Publisher{P: p, Size: *size, Fill: true}
	var published, dropped uint64
	code := 0
	for cnt := uint64(1); cnt <= *heaps && !interrupted(); cnt++ {
		_, err := pb.Publish(cnt, 0)
		switch {
		case errors.Is(err, ring.ErrFull):
			dropped++
			p.Add(ring.CounterDroppedHeaps, 1)
		case err != nil && interrupted():
		case err != nil:
			fmt.Fprintln(os.Stderr, "go producer: publish:", err)
			code = 1
		default:
			published++
		}
		if code != 0 {
			break
		}
	}
	if *idle {
		io.Copy(io.Discard, os.Stdin)
		p.Close()
		return code
	}
	if interrupted() {
		fmt.Fprintln(os.Stderr, "go producer: interrupted")
		code = 1
	} else if code == 0 {
		if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "go producer: end of stream:", err)
			code = 1
		} else if cfg.Policy == ring.PolicyBlock {
			if err := p.WaitDrained(stopped); err != nil && !interrupted() && !errors.Is(err, ring.ErrNoConsumer) {
				fmt.Fprintln(os.Stderr, "go producer: wait drained:", err)
				code = 1
			}
		}
	}
	p.Close()
	out, _ := json.Marshal(map[string]uint64{"heaps": published, "dropped": dropped})
	fmt.Println(string(out))
	return code
}
