package interop_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ibvbridge/ibvbridge/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

var (
	repoRoot string
	goTool   string // bin of ./cmd/ibvbridge built for this test run
)

func TestMain(m *testing.M) {
	if os.Getenv("INTEROP_CHILD_DIR") != "" {
		childProducer()
		return
	}
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Dir(filepath.Dir(file))
	dir, err := os.MkdirTemp("", "interop")
	if err != nil {
		panic(err)
	}
	goTool = filepath.Join(dir, "ibvbridge")
	build := exec.Command("go", "build", "-o", goTool, "./cmd/ibvbridge")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ibvbridge: %v\n%s", err, out)
		os.Exit(1)
	}
	code := testenv.Main(m) // a ring directory of its own: nothing lands in /run/ibvbridge
	os.RemoveAll(dir)
	os.Exit(code)
}

// consumers lists the consumer implementations; a missing C or Python build is a failure under
// `make test` (IBVBRIDGE_REQUIRE_CLIENTS=1) and a skip for a bare `go test`.
func consumers(t *testing.T) []string {
	kinds := []string{"go"}
	cTool := filepath.Join(repoRoot, "clients/c/build/ibvb-consume")
	if _, err := os.Stat(cTool); err == nil {
		kinds = append(kinds, "c")
	} else if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
		t.Fatalf("C consumer %s missing: %v", cTool, err)
	} else {
		t.Logf("skipping the C consumer: %s not built (make build)", cTool)
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		kinds = append(kinds, "python")
	} else if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
		t.Fatal("/usr/bin/python3 missing")
	}
	return kinds
}

// result is a consumer tool's JSON summary and the process's exit status.
type result struct {
	bench.ConsumeResult
	exitCode int
}

func consumerCmd(t *testing.T, kind, ctlPath string, verify bool, extra ...string) *exec.Cmd {
	args := append([]string{"--ring", ctlPath, "--timeout-ms", "10000"}, extra...)
	if verify {
		args = append(args, "--verify")
	}
	var cmd *exec.Cmd
	switch kind {
	case "go":
		// --wait: a consumer may start before its producer has made the ring (layout 2.1 §B: a missing
		// ring otherwise fails at once).
		cmd = exec.Command(goTool, append([]string{"consume", "--wait"}, args...)...)
	case "c":
		cmd = exec.Command(filepath.Join(repoRoot, "clients/c/build/ibvb-consume"), args...)
	case "python":
		// Layout 2.1: a ring that does not exist yet is an error at once unless --wait (tests start some
		// consumers together with their producer).
		args = append(args, "--wait")
		cmd = exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.consume"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
	}
	return cmd
}

// startConsumer starts a consumer process that verifies the test pattern; wait returns its JSON result.
func startConsumer(t *testing.T, kind, ctlPath string, extra ...string) (wait func() result) {
	t.Helper()
	return startConsumerVerify(t, kind, ctlPath, true, extra...)
}

func startConsumerVerify(t *testing.T, kind, ctlPath string, verify bool, extra ...string) (wait func() result) {
	t.Helper()
	cmd := consumerCmd(t, kind, ctlPath, verify, extra...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	waitCmd := startProcess(t, cmd)
	return func() result {
		t.Helper()
		err := waitCmd()
		var r result
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			r.exitCode = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s consumer: %v", kind, err)
		}
		lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
		if jerr := json.Unmarshal(lines[len(lines)-1], &r); jerr != nil {
			t.Fatalf("%s consumer printed %q (stderr %q): %v", kind, out.String(), errb.String(), jerr)
		}
		return r
	}
}

// startProcess starts cmd; the test's cleanup kills it unless wait was called, and wait kills it after 60 s.
func startProcess(t *testing.T, cmd *exec.Cmd) (wait func() error) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return func() error {
		timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
		err := cmd.Wait()
		timer.Stop()
		close(done)
		return err
	}
}

func waitAttached(t *testing.T, p *ring.Producer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := ring.Inspect(p.SocketPath(), "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Attached() > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("consumer did not attach")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitProducerConsumers waits up to 30 s until n consumers are attached to p.
func waitProducerConsumers(t *testing.T, p *ring.Producer, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.Consumers() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d consumers attached", p.Consumers(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newRing(t *testing.T, name string, cfg ring.Config) *ring.Producer {
	t.Helper()
	if cfg.SlotCount == 0 {
		cfg.SlotCount = 16
	}
	if cfg.SlotSize == 0 {
		cfg.SlotSize = 8192
	}
	return ringtest.New(t, name, cfg)
}

// sizeOf gives heap cnt a size that varies, including sizes that are not multiples of 8.
func sizeOf(cnt uint64, max int) int { return 1 + int(cnt*977)%max }

func checkCounters(t *testing.T, kind string, got map[string]uint64, want ring.Stats) {
	t.Helper()
	for _, c := range ring.Counters() {
		if c == ring.CounterConsumersAttached {
			continue // a gauge: the consumer read it while attached, the producer after it left
		}
		if got[c.String()] != want.Get(c) {
			t.Errorf("%s consumer: counter %s = %d, producer says %d", kind, c, got[c.String()], want.Get(c))
		}
	}
}

func TestEveryConsumerReadsEveryByte(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "all-"+kind, ring.Config{Policy: ring.PolicyBlock})
			wait := startConsumer(t, kind, p.SocketPath())
			waitAttached(t, p)
			const n = 3000
			var sum, bytes uint64
			for cnt := uint64(1); cnt <= n; cnt++ {
				pb := pattern.Publisher{P: p, Size: sizeOf(cnt, 8192), Fill: true}
				s, err := pb.Publish(cnt, uint64(time.Now().UnixNano()))
				if err != nil {
					t.Fatal(err)
				}
				sum += s
				bytes += uint64(pb.Size)
			}
			p.Add(ring.CounterMalformedPackets, 7) // every counter travels, not just the ones publishing sets
			if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			r := wait()
			if r.Result != "eos" || r.exitCode != 0 || r.Heaps != n || r.Bytes != bytes || r.Checksum != sum ||
				r.VerifyErrors != 0 || r.OutOfOrder != 0 || r.FirstHeapCnt != 1 || r.LastHeapCnt != n {
				t.Fatalf("%s consumer: %+v (want %d heaps, %d bytes, checksum %#x)", kind, r, n, bytes, sum)
			}
			checkCounters(t, kind, r.Counters, p.Stats())
		})
	}
}

func TestWrappedCursors(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "wrap-"+kind, ring.Config{Policy: ring.PolicyBlock, InitialPosition: ^uint64(0) - 20})
			wait := startConsumer(t, kind, p.SocketPath())
			waitAttached(t, p)
			pb := pattern.Publisher{P: p, Size: 200, Fill: true}
			for cnt := uint64(1); cnt <= 100; cnt++ {
				if _, err := pb.Publish(cnt, 0); err != nil {
					t.Fatal(err)
				}
			}
			p.PublishEndOfStream(0, 5*time.Second)
			if r := wait(); r.Result != "eos" || r.Heaps != 100 || r.VerifyErrors != 0 {
				t.Fatalf("%+v", r)
			}
		})
	}
}

func TestFullRingDropPolicyCountsExactly(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "drop-"+kind, ring.Config{SlotCount: 8})
			// A slow consumer: 2 ms per heap while the producer offers a heap every 100 µs.
			wait := startConsumer(t, kind, p.SocketPath(), "--sleep-us", "2000")
			waitAttached(t, p)
			pb := pattern.Publisher{P: p, Size: 512, Fill: true}
			const n = 400
			var dropped uint64
			for cnt := uint64(1); cnt <= n; cnt++ {
				if _, err := pb.Publish(cnt, 0); errors.Is(err, ring.ErrFull) {
					dropped++
					p.Add(ring.CounterDroppedHeaps, 1)
				} else if err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Microsecond)
			}
			if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			r := wait()
			if dropped == 0 {
				t.Fatal("the slow consumer never filled the ring: the test proves nothing")
			}
			if r.Heaps+dropped != n || r.Counters["dropped_heaps"] != dropped || r.VerifyErrors != 0 || r.OutOfOrder != 0 {
				t.Fatalf("received %d + dropped %d != %d; %+v", r.Heaps, dropped, n, r)
			}
		})
	}
}

func TestFullRingBlockPolicyLosesNothing(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "block-"+kind, ring.Config{SlotCount: 4, Policy: ring.PolicyBlock})
			wait := startConsumer(t, kind, p.SocketPath(), "--sleep-us", "300", "--hold", "2")
			waitAttached(t, p)
			pb := pattern.Publisher{P: p, Size: 1000, Fill: true}
			for cnt := uint64(1); cnt <= 300; cnt++ {
				if _, err := pb.Publish(cnt, 0); err != nil {
					t.Fatal(err)
				}
			}
			p.PublishEndOfStream(0, 10*time.Second)
			if r := wait(); r.Result != "eos" || r.Heaps != 300 || r.VerifyErrors != 0 || r.Counters["dropped_heaps"] != 0 {
				t.Fatalf("%+v", r)
			}
		})
	}
}

func TestConsumerAttachesMidStream(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "mid-"+kind, ring.Config{SlotCount: 16})
			pb := pattern.Publisher{P: p, Size: 64, Fill: true}
			for cnt := uint64(1); cnt <= 40; cnt++ { // nobody reads: the ring keeps the newest 16, nothing is dropped
				if _, err := pb.Publish(cnt, 0); err != nil {
					t.Fatal(err)
				}
			}
			// A consumer attaching later starts at the oldest heap the ring still holds.
			if r := startConsumer(t, kind, p.SocketPath(), "--max-heaps", "5")(); r.Result != "max" || r.Heaps != 5 || r.FirstHeapCnt != 25 || r.LastHeapCnt != 29 {
				t.Fatalf("first consumer: %+v", r)
			}
			wait := startConsumer(t, kind, p.SocketPath(), "--start", "head")
			waitAttached(t, p)
			for cnt := uint64(41); cnt <= 50; cnt++ {
				for {
					if _, err := pb.Publish(cnt, 0); err == nil {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			p.PublishEndOfStream(0, 5*time.Second)
			r := wait()
			if r.Result != "eos" || r.FirstHeapCnt != 41 || r.Heaps != 10 || r.VerifyErrors != 0 || r.Counters["dropped_heaps"] != 0 {
				t.Fatalf("consumer from head: %+v", r)
			}
		})
	}
}

// TestManyConsumersThreeLanguages: eight consumers — Go, C and Python — read one ring at once; each sees
// every heap byte for byte, the slowest pacing the block-policy producer.
func TestManyConsumersThreeLanguages(t *testing.T) {
	kinds := consumers(t)
	p := newRing(t, "many", ring.Config{Policy: ring.PolicyBlock, MaxConsumers: 8})
	var waits []func() result
	var names []string
	for i := range 8 {
		kind := kinds[i%len(kinds)]
		waits = append(waits, startConsumer(t, kind, p.SocketPath()))
		names = append(names, kind)
	}
	waitProducerConsumers(t, p, 8)
	const n = 2000
	var sum, nbytes uint64
	for cnt := uint64(1); cnt <= n; cnt++ {
		pb := pattern.Publisher{P: p, Size: sizeOf(cnt, 8192), Fill: true}
		s, err := pb.Publish(cnt, 0)
		if err != nil {
			t.Fatal(err)
		}
		sum += s
		nbytes += uint64(pb.Size)
	}
	if err := p.PublishEndOfStream(0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, wait := range waits {
		r := wait()
		if r.Result != "eos" || r.Heaps != n || r.Bytes != nbytes || r.Checksum != sum || r.VerifyErrors != 0 || r.OutOfOrder != 0 {
			t.Errorf("consumer %d (%s): %+v", i, names[i], r)
		}
	}
	info, err := ring.Inspect(p.SocketPath(), "")
	if err != nil {
		t.Fatal(err)
	}
	if info.Counters["consumer_overruns"] != 0 || info.Counters["consumer_errors"] != 0 {
		t.Fatalf("counters %v", info.Counters)
	}
}

// childProducer is this test binary re-executed as a producer process, for kill -9.
func childProducer() {
	p, err := ring.Create("killed", ring.Config{Dir: os.Getenv("INTEROP_CHILD_DIR"), SlotCount: 8, SlotSize: 4096})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	pb := pattern.Publisher{P: p, Size: 333, Fill: true}
	for cnt := uint64(1); cnt <= 5; cnt++ {
		pb.Publish(cnt, 0)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

func TestProducerKilled(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			// The killed producer's data file may be on /dev/hugepages: a dead ring's files stay until removed.
			t.Cleanup(func() { ring.Remove(dir, "killed") })
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), "INTEROP_CHILD_DIR="+dir)
			out, _ := child.StdoutPipe()
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			defer child.Process.Kill()
			buf := make([]byte, 16)
			if n, _ := out.Read(buf); string(buf[:n]) != "ready\n" {
				t.Fatalf("child: %q", buf[:n])
			}
			ctl := filepath.Join(dir, ring.SocketName("killed"))
			wait := startConsumer(t, kind, ctl)
			for { // the consumer has read all five heaps and sleeps on the futex
				info, err := ring.Inspect(ctl, "")
				if err != nil {
					t.Fatal(err)
				}
				if info.Attached() == 1 && info.Consumers[0].Lag == 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			killed := time.Now()
			child.Process.Signal(syscall.SIGKILL)
			child.Wait()
			r := wait()
			if d := time.Since(killed); d > 1500*time.Millisecond { // 1 s to notice, plus process exit
				t.Fatalf("%s consumer took %v to notice the dead producer", kind, d)
			}
			if r.Result != "producer_gone" || r.exitCode != 2 || r.Heaps != 5 || r.VerifyErrors != 0 {
				t.Fatalf("%+v exit %d", r, r.exitCode)
			}
		})
	}
}

// TestGoldenLayout checks that Go, C and Python name the same offsets with the same values.
func TestGoldenLayout(t *testing.T) {
	want := ring.LayoutTable()
	tables := map[string]*exec.Cmd{}
	for _, kind := range consumers(t) {
		switch kind {
		case "c":
			tables[kind] = exec.Command(filepath.Join(repoRoot, "clients/c/build/layout_dump"))
		case "python":
			cmd := exec.Command("/usr/bin/python3", "-m", "ibvbridge.layout")
			cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
			tables[kind] = cmd
		}
	}
	for kind, cmd := range tables {
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s layout dump: %v", kind, err)
		}
		got := map[string]uint64{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				t.Fatalf("%s layout line %q", kind, line)
			}
			v, err := strconv.ParseUint(f[1], 0, 64)
			if err != nil {
				t.Fatalf("%s layout line %q: %v", kind, line, err)
			}
			got[f[0]] = v
		}
		var diffs []string
		for k, v := range want {
			if g, ok := got[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s missing (Go %d)", k, v))
			} else if g != v {
				diffs = append(diffs, fmt.Sprintf("%s = %d, Go %d", k, g, v))
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s only in %s", k, kind))
			}
		}
		sort.Strings(diffs)
		if len(diffs) > 0 {
			t.Errorf("%s layout differs from Go:\n%s", kind, strings.Join(diffs, "\n"))
		}
	}
}

// TestVerifyCatchesBadBytes proves every consumer's --verify can fail: one complete heap with a wrong
// byte is an error, an incomplete heap (holes are unspecified) is counted but not verified.
func TestVerifyCatchesBadBytes(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "bad-"+kind, ring.Config{Policy: ring.PolicyBlock})
			wait := startConsumer(t, kind, p.SocketPath())
			waitAttached(t, p)
			publish := func(cnt uint64, flags uint32, corrupt bool) {
				s, err := p.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				pattern.FillPattern(s.Payload[:100], cnt)
				if corrupt {
					s.Payload[37] ^= 0xFF
				}
				p.Publish(s, ring.HeapInfo{HeapCnt: cnt, HeapSize: 100, Received: 100, Flags: flags, Packets: 1})
			}
			publish(1, ring.FlagComplete, false)
			publish(2, ring.FlagComplete, true)
			publish(3, ring.FlagIncomplete, true)
			p.PublishEndOfStream(0, 5*time.Second)
			r := wait()
			if r.Heaps != 3 || r.VerifyErrors != 1 || r.Incomplete != 1 {
				t.Fatalf("%s consumer: %+v, want 3 heaps, 1 verify error, 1 incomplete", kind, r)
			}
		})
	}
}

// TestConsumerKilledWhileHolding: a consumer killed (-9) while it holds heaps blocks nobody: the producer
// (drop policy) carries on without a drop, and the next consumer attaches at once and reads the newest heaps.
func TestConsumerKilledWhileHolding(t *testing.T) {
	for _, kind := range consumers(t) {
		t.Run(kind, func(t *testing.T) {
			p := newRing(t, "ckill-"+kind, ring.Config{SlotCount: 8})
			pb := pattern.Publisher{P: p, Size: 300, Fill: true}
			cmd := consumerCmd(t, kind, p.SocketPath(), true, "--hold", "4", "--sleep-us", "1000000")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, p)
			for cnt := uint64(1); cnt <= 8; cnt++ { // the ring is full of heaps it holds or has not read
				if _, err := pb.Publish(cnt, 0); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := pb.Publish(9, 0); !errors.Is(err, ring.ErrFull) {
				t.Fatalf("publish into a ring its only consumer holds: %v", err)
			}
			p.Add(ring.CounterDroppedHeaps, 1)
			time.Sleep(300 * time.Millisecond) // it reads heap 1, then sleeps a second holding it
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			deadline := time.Now().Add(5 * time.Second)
			for p.Consumers() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the producer did not notice the killed consumer")
				}
				time.Sleep(time.Millisecond)
			}
			for cnt := uint64(10); cnt <= 20; cnt++ { // nothing it held blocks the producer
				if _, err := pb.Publish(cnt, 0); err != nil {
					t.Fatalf("heap %d after the consumer died: %v", cnt, err)
				}
			}
			if err := p.PublishEndOfStream(0, 0); err != nil {
				t.Fatal(err)
			}
			r := startConsumer(t, kind, p.SocketPath())() // the ring keeps the newest 8 positions: 14..20 and the marker
			if r.Result != "eos" || r.FirstHeapCnt != 14 || r.Heaps != 7 || r.VerifyErrors != 0 || r.Counters["dropped_heaps"] != 1 {
				t.Fatalf("next consumer %+v", r)
			}
		})
	}
}
