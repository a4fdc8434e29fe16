package ring_test

// The trust boundary (spec §0): what a stranger, a hostile consumer, or a crash can do to a ring. Tests
// that need another user run a child of this test binary as nobody (setpriv).

import (
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
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// nobodyChild runs this test binary as uid/gid 65534 in role (see childMain), returning its combined
// output and exit code. The binary is copied where nobody can execute it.
func nobodyChild(t *testing.T, role string, env ...string) (string, int) {
	t.Helper()
	cmd := asUser(t, 65534, 65534, publicCopy(t), "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "RING_TEST_ROLE="+role), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

var publicExe string

// publicCopy copies the test binary into a directory any user can traverse.
func publicCopy(t *testing.T) string {
	if publicExe != "" {
		return publicExe
	}
	dir, err := os.MkdirTemp("", "ibvb-ringtest")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	self, _ := os.Executable()
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, "ring.test"), os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(dst, src)
	dst.Close()
	publicExe = dst.Name()
	return publicExe
}

// childMain is what a child of this binary does, named by RING_TEST_ROLE; it exits with a code the
// parent checks, and prints a line saying what happened.
func childMain(role string) {
	sock := os.Getenv("RING_TEST_SOCKET")
	say := func(code int, format string, args ...any) {
		os.Stdout.WriteString(strings.TrimSpace(fmtS(format, args...)) + "\n")
		os.Exit(code)
	}
	switch role {
	case "squat-default": // a user without XDG_RUNTIME_DIR whose /dev/shm default a stranger made first
		log := zerolog.New(os.Stderr)
		p, err := ring.Create("squat", ring.Config{HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Log: &log})
		if err != nil {
			say(1, "create: %v", err)
		}
		defer p.Close()
		c, err := ring.Attach("squat", ring.AttachOptions{Timeout: 5 * time.Second})
		if err != nil {
			say(1, "attach by name: %v", err)
		}
		c.Close()
		say(0, "made in %s and attached by name", p.Dir())
	case "stranger": // attach, then try the files a 1.0 ring exposed
		_, err := ring.Attach(sock, ring.AttachOptions{Timeout: -1})
		if err == nil {
			say(1, "attached as a stranger")
		}
		if f, ferr := os.OpenFile(filepath.Join(filepath.Dir(sock), filepath.Base(strings.TrimSuffix(sock, ".sock"))+".lock"), os.O_RDONLY, 0); ferr == nil {
			f.Close()
			say(1, "opened the lock file")
		}
		say(0, "refused: %v", err)
	case "joiner": // attach as a member of RING_TEST_GROUP ("" independent), say whether it was let in
		c, err := ring.Attach(sock, ring.AttachOptions{Timeout: 5 * time.Second, Group: os.Getenv("RING_TEST_GROUP")})
		if err != nil {
			say(0, "refused: %v", err)
		}
		c.Close()
		say(0, "attached")
	case "member": // a permitted consumer of another user: read the pattern heaps, then try to write
		c, err := ring.Attach(sock, ring.AttachOptions{Timeout: 5 * time.Second})
		if err != nil {
			say(1, "attach: %v", err)
		}
		h, err := c.Next(5 * time.Second)
		if err != nil || pattern.VerifyPattern(h.Payload, h.HeapCnt) >= 0 {
			say(1, "read: %v", err)
		}
		c.StoreTailForTest(c.HeadForTest() + 1000) // a hostile cursor: past head
		for range 100 {
			if _, err := c.Next(50 * time.Millisecond); errors.Is(err, ring.ErrDetached) {
				say(0, "read heap %d, then detached: %v", h.HeapCnt, err)
			}
		}
		say(1, "never detached")
	case "squatter": // serve a ring of spoofed heaps under the victim's default name, until killed
		p, err := ring.Create(os.Getenv("RING_TEST_NAME"), ring.Config{Dir: os.Getenv("RING_TEST_DIR"), HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096})
		if err != nil {
			say(1, "squat: %v", err)
		}
		pb := pattern.Publisher{P: p, Size: 100, Fill: true}
		if _, err := pb.Publish(666, 0); err != nil {
			say(1, "squat publish: %v", err)
		}
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
	case "victim": // attach by name with the default lookup, read one heap, say which
		c, err := ring.Attach(os.Getenv("RING_TEST_NAME"), ring.AttachOptions{Timeout: 5 * time.Second, Warnings: os.Stdout})
		if err != nil {
			say(1, "attach: %v", err)
		}
		h, err := c.Next(5 * time.Second)
		if err != nil {
			say(1, "read: %v", err)
		}
		say(0, "read heap %d", h.HeapCnt)
	case "lowfd-producer": // serve a ring with a low descriptor limit until killed
		lim := unix.Rlimit{Cur: 128, Max: 128}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			say(1, "setrlimit: %v", err)
		}
		p, err := ring.Create(os.Getenv("RING_TEST_NAME"), ring.Config{Dir: os.Getenv("RING_TEST_DIR"), HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, MaxObservers: 1000})
		if err != nil {
			say(1, "create: %v", err)
		}
		_ = p
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
	case "huge-producer": // a hugepage-backed ring, until killed
		p, err := ring.Create(os.Getenv("RING_TEST_NAME"), ring.Config{Dir: os.Getenv("RING_TEST_DIR"), HugePages: ring.HugePagesRequire, SlotCount: 8, SlotSize: 4096})
		if err != nil {
			say(3, "nohuge %v", err)
		}
		pb := pattern.Publisher{P: p, Size: 100, Fill: true}
		for cnt := uint64(1); cnt <= 3; cnt++ {
			if _, err := pb.Publish(cnt, 0); err != nil {
				say(1, "publish: %v", err)
			}
		}
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
	case "consumer-sleep": // attach, read one heap, hold it, wait to be killed
		c, err := ring.Attach(sock, ring.AttachOptions{Timeout: 5 * time.Second})
		if err != nil {
			say(1, "attach: %v", err)
		}
		if _, err := c.Next(5 * time.Second); err != nil {
			say(1, "read: %v", err)
		}
		os.Stdout.WriteString("holding\n")
		time.Sleep(time.Minute)
	}
	say(2, "unknown role %q", role)
}

// TestAttackStrangerIsRefused: another local user can neither attach nor touch the lock, whatever the modes say;
// the producer's stream is unaffected.
func TestAttackStrangerIsRefused(t *testing.T) {
	dir := publicDir(t)
	p := ringtest.New(t, "strange", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096})
	c := ringtest.Attach(t, "strange", ring.AttachOptions{Dir: dir})
	sock := p.SocketPath()
	out, code := nobodyChild(t, "stranger", "RING_TEST_SOCKET="+sock)
	// Mode 0600: the kernel refuses the connect itself (a 0666 socket would leave it to SO_PEERCRED).
	if code != 0 || !strings.Contains(out, "permission denied") || strings.Contains(out, "may not attach") {
		t.Fatalf("socket mode 0600: exit %d: %s; want connect refused by the socket's mode", code, out)
	}
	// Even with the socket opened to everyone, SO_PEERCRED refuses a stranger, with a message.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	out, code = nobodyChild(t, "stranger", "RING_TEST_SOCKET="+sock)
	if code != 0 || !strings.Contains(out, "not permitted") || !strings.Contains(out, "uid 65534 may not attach") {
		t.Fatalf("socket mode 0666: exit %d: %s", code, out)
	}
	publish(t, p, 1, 64)
	h, err := c.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 1, 64)
	if p.Consumers() != 1 {
		t.Fatalf("%d consumers after two refusals", p.Consumers())
	}
}

// TestAttackGroupMemberCannotHarm: with --group, another user of that group reads the stream; its
// hostile cursor detaches only it, and the owner's consumer keeps every heap it holds.
func TestAttackGroupMemberCannotHarm(t *testing.T) {
	dir := publicDir(t)
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Group: "nogroup"}
	p := ringtest.New(t, "grp", cfg)
	var st unix.Stat_t
	if err := unix.Stat(p.SocketPath(), &st); err != nil || st.Mode&0o777 != 0o660 || st.Gid != 65534 {
		t.Fatalf("socket mode %o gid %d: %v", st.Mode&0o777, st.Gid, err)
	}
	own := ringtest.Attach(t, "grp", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 4; cnt++ {
		publish(t, p, cnt, 100)
	}
	var held []ring.Heap
	for range 4 {
		h, err := own.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	done := make(chan struct{})
	go func() { // the producer keeps publishing while the member misbehaves
		defer close(done)
		for cnt := uint64(5); cnt <= 40; cnt++ {
			pb := pattern.Publisher{P: p, Size: 100, Fill: true}
			pb.Publish(cnt, 0) // full ring: dropped and counted by the caller in real life
			time.Sleep(5 * time.Millisecond)
		}
	}()
	out, code := nobodyChild(t, "member", "RING_TEST_SOCKET="+p.SocketPath())
	<-done
	if code != 0 || !strings.Contains(out, "read heap 1, then detached") || !strings.Contains(out, "invalid cursor") {
		t.Fatalf("member: exit %d: %s", code, out)
	}
	if got := p.Stats().Get(ring.CounterConsumerErrors); got != 1 {
		t.Fatalf("consumer_errors %d", got)
	}
	for i, h := range held { // nothing the member wrote made the producer reuse a slot we hold
		checkHeap(t, h, uint64(i+1), 100)
	}
}

// publicDir is a ring directory another user can search (but not write): 0755, owned by root.
func publicDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "ibvb-ring")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestAttackUnsafeRingDirRefused: the producer creates nothing in a directory someone else could write or
// replace, nor through a planted link.
func TestAttackUnsafeRingDirRefused(t *testing.T) {
	base := publicDir(t)
	other := filepath.Join(base, "other")
	os.Mkdir(other, 0o755)
	os.Chown(other, 65534, 65534)
	link := filepath.Join(base, "link")
	os.Symlink(t.TempDir(), link)
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o1777) // like /dev/shm itself
	for _, tc := range []struct{ dir, want string }{
		{other, "owned by uid 65534"},
		{link, "not a directory"},
		{open, "writable by group or others"},
	} {
		_, err := ring.Create("r", ring.Config{Dir: tc.dir, HugePages: ring.HugePagesOff, SlotCount: 4, SlotSize: 64})
		if !errors.Is(err, ring.ErrUnsafeDir) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrUnsafeDir saying %q", tc.dir, err, tc.want)
		}
		if ents, _ := os.ReadDir(tc.dir); len(ents) != 0 {
			t.Errorf("%s: created %v", tc.dir, ents)
		}
	}
	// A link planted in place of the lock file (only the owner could, but even so) is not followed.
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(target, []byte("keep"), 0o600)
	os.Symlink(target, filepath.Join(dir, "r.v2.lock"))
	if _, err := ring.Create("r", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 4, SlotSize: 64}); err == nil {
		t.Fatal("created a ring through a planted lock link")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("the link's target was touched")
	}
	var st unix.Stat_t
	unix.Stat(target, &st)
	if st.Mode&0o777 != 0o600 {
		t.Fatalf("the link's target changed mode to %o", st.Mode&0o777)
	}
}

// TestAttackBadCursorDetachesOnlyThatConsumer: a consumer writing a cursor past head, or backwards, is detached
// (counted); the other consumer keeps its held heaps and sees every heap.
func TestAttackBadCursorDetachesOnlyThatConsumer(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail func(c *ring.Consumer) uint64
	}{
		{"past head", func(c *ring.Consumer) uint64 { return c.HeadForTest() + 1 }},
		{"backwards", func(c *ring.Consumer) uint64 { return ^uint64(0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := ringtest.New(t, "bad", cfg)
			good := ringtest.Attach(t, "bad", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
			bad := ringtest.Attach(t, "bad", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
			for cnt := uint64(1); cnt <= 8; cnt++ {
				publish(t, p, cnt, 64)
			}
			var held []ring.Heap
			for range 8 {
				h, _ := good.Next(time.Second)
				held = append(held, h)
			}
			bad.StoreTailForTest(tc.tail(bad))
			if _, err := p.Acquire(); !errors.Is(err, ring.ErrFull) { // reclaim reads the cursors
				t.Fatalf("acquire with every slot held by the good consumer: %v", err)
			}
			if _, err := bad.Next(time.Second); !errors.Is(err, ring.ErrDetached) || !strings.Contains(err.Error(), "invalid cursor") {
				t.Fatalf("bad consumer: %v", err)
			}
			for i, h := range held {
				checkHeap(t, h, uint64(i+1), 64)
			}
			if p.Stats().Get(ring.CounterConsumerErrors) != 1 || p.Consumers() != 1 {
				t.Fatalf("errors %d, consumers %d", p.Stats().Get(ring.CounterConsumerErrors), p.Consumers())
			}
		})
	}
}

// TestAttackStalledConsumerOverrunUnderDrop: under drop, a consumer that stops reading is detached as overrun
// once it holds the ring back; the others lose nothing, and it learns why and how much it lost.
func TestAttackStalledConsumerOverrunUnderDrop(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "ovr", cfg)
	fast := ringtest.Attach(t, "ovr", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	slow := ringtest.Attach(t, "ovr", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	h, err := slow.Next(10 * time.Millisecond) // nothing yet
	if !errors.Is(err, ring.ErrTimeout) {
		t.Fatalf("%+v %v", h, err)
	}
	pb := pattern.Publisher{P: p, Size: 64, Fill: true}
	for cnt := uint64(1); cnt <= 100; cnt++ {
		if _, err := pb.Publish(cnt, 0); err != nil {
			t.Fatalf("heap %d: %v (the stalled consumer must not cost the fast one a heap)", cnt, err)
		}
		h, err := fast.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 64)
		fast.Release(h)
	}
	if p.Stats().Get(ring.CounterConsumerOverruns) != 1 || p.Stats().Get(ring.CounterDroppedHeaps) != 0 {
		t.Fatalf("overruns %d dropped %d", p.Stats().Get(ring.CounterConsumerOverruns), p.Stats().Get(ring.CounterDroppedHeaps))
	}
	_, err = slow.Next(time.Second)
	if !errors.Is(err, ring.ErrOverrun) || !strings.Contains(err.Error(), "heaps lost") {
		t.Fatalf("stalled consumer: %v", err)
	}
	info, err := ring.Inspect(p.SocketPath(), "")
	if err != nil {
		t.Fatal(err)
	}
	var overrun int
	for _, c := range info.Consumers {
		if c.State == "overrun" && c.LostHeaps == 8 {
			overrun++
		}
	}
	if overrun != 1 || info.Attached() != 1 {
		t.Fatalf("consumer table %+v", info.Consumers)
	}
}

// TestAttackSlowestConsumerPacesBlockProducer: under block, every heap reaches every consumer, the slowest sets the pace.
func TestAttackSlowestConsumerPacesBlockProducer(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "pace", cfg)
	cs := []*ring.Consumer{ringtest.Attach(t, "pace", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}), ringtest.Attach(t, "pace", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}), ringtest.Attach(t, "pace", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})}
	const n = 300
	done := make(chan error, 1)
	go func() {
		pb := pattern.Publisher{P: p, Size: 64, Fill: true}
		for cnt := uint64(1); cnt <= n; cnt++ {
			if _, err := pb.Publish(cnt, 0); err != nil {
				done <- err
				return
			}
		}
		done <- p.PublishEndOfStream(0, 10*time.Second)
	}()
	errs := make(chan error, len(cs))
	for i, c := range cs {
		go func() {
			for cnt := uint64(1); cnt <= n; cnt++ {
				h, err := c.Next(5 * time.Second)
				if err != nil || h.HeapCnt != cnt || pattern.VerifyPattern(h.Payload, cnt) >= 0 {
					errs <- errors.New("consumer " + strconv.Itoa(i) + ": heap " + strconv.FormatUint(cnt, 10) + ": " + errS(err))
					return
				}
				if i == 2 && cnt%50 == 0 {
					time.Sleep(20 * time.Millisecond) // the slow one
				}
				c.Release(h)
			}
			_, err := c.Next(5 * time.Second)
			if !errors.Is(err, ring.ErrEndOfStream) {
				errs <- errors.New("consumer " + strconv.Itoa(i) + ": after the last heap: " + errS(err))
				return
			}
			errs <- nil
		}()
	}
	for range cs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := p.WaitDrained(nil); err != nil {
		t.Fatalf("drained: %v", err)
	}
}

// TestAttackKillNineLeavesNothing: a hugepage-backed producer (a child process) and its consumer are
// killed with SIGKILL: every hugepage comes back (HugePages_Free as before), the ring directory holds only
// the stale socket and lock, which the next producer of the name takes over. Without free hugepages the
// test skips, saying so: it cannot prove the memory half then.
func TestAttackKillNineLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	name := fmtS("k9-%d", os.Getpid())
	free0 := hugePagesFree(t)
	child := roleCmd("huge-producer", "RING_TEST_NAME="+name, "RING_TEST_DIR="+dir)
	if line := startRole(t, child)(); strings.HasPrefix(line, "nohuge") {
		t.Skipf("SKIPPED, NOT PASSED: no hugepage-backed ring could be made (HugePages_Free %d: %s); as root: echo 64 > /proc/sys/vm/nr_hugepages", free0, strings.TrimSpace(line))
	} else if line != "ready\n" {
		t.Fatalf("hugepage producer said %q", line)
	}
	if held := hugePagesFree(t); held >= free0 {
		t.Fatalf("HugePages_Free %d with the child's ring, %d before: the ring is not hugepage-backed", held, free0)
	}
	sock := filepath.Join(dir, ring.SocketName(name))
	cons := roleCmd("consumer-sleep", "RING_TEST_SOCKET="+sock)
	if line := startRole(t, cons)(); line != "holding\n" {
		t.Fatalf("consumer: %q", line)
	}
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	cons.Process.Signal(syscall.SIGKILL)
	cons.Wait()
	if got := waitHugePagesBack(t, free0); got < free0 {
		t.Fatalf("HugePages_Free %d after kill -9 of producer and consumer, %d before: memory outlived every process", got, free0)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{name + ".v2.lock", ring.SocketName(name)}; strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("ring directory after kill -9: %v, want only %v", names, want)
	}
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096}
	p := ringtest.New(t, name, cfg) // the stale socket and lock are taken over
	c := ringtest.Attach(t, name, ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p, 1, 64)
	if h, err := c.Next(time.Second); err != nil || h.HeapCnt != 1 {
		t.Fatalf("%+v %v", h, err)
	}
}

// TestAttackKilledConsumerSlotsReclaimed: a consumer killed with SIGKILL while it holds every slot is
// detached as gone, and the slots it held return to the producer: a drop ring that refused new heaps
// while it held them takes a whole ring of new heaps once it is dead.
func TestAttackKilledConsumerSlotsReclaimed(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "killedcons", cfg)
	cons := roleCmd("consumer-sleep", "RING_TEST_SOCKET="+p.SocketPath())
	held := startRole(t, cons)
	waitConsumers(t, p, 1)
	for cnt := uint64(1); cnt <= uint64(cfg.SlotCount); cnt++ {
		publish(t, p, cnt, 64)
	}
	if line := held(); line != "holding\n" {
		t.Fatalf("consumer: %q", line)
	}
	pb := pattern.Publisher{P: p, Size: 64, Fill: true}
	if _, err := pb.Publish(99, 0); !errors.Is(err, ring.ErrFull) {
		t.Fatalf("publish into a ring a live consumer holds: %v, want ErrFull", err)
	}
	cons.Process.Signal(syscall.SIGKILL)
	cons.Wait()
	waitConsumers(t, p, 0)
	for cnt := uint64(100); cnt < 100+uint64(cfg.SlotCount); cnt++ {
		if _, err := pb.Publish(cnt, 0); err != nil {
			t.Fatalf("heap %d after the consumer was killed: %v (its slots were not reclaimed)", cnt, err)
		}
	}
	if got := p.Stats().Get(ring.CounterConsumerErrors) + p.Stats().Get(ring.CounterConsumerOverruns); got != 0 {
		t.Fatalf("a killed consumer counted as %d errors/overruns; it is gone, not hostile", got)
	}
}

func fmtS(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func errS(err error) string {
	if err == nil {
		return "wrong heap"
	}
	return err.Error()
}

// TestAttackHandshakeRefusals: a client speaking another major, or sending garbage, gets an error record that
// names the problem, and holds nothing; a 1.0 control-file path is refused naming both versions.
func TestAttackHandshakeRefusals(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "hs", cfg)
	talk := func(rec []byte) string {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: p.SocketPath()}); err != nil {
			t.Skipf("socket path too long to connect to directly: %v", err)
		}
		unix.Write(fd, rec)
		buf := make([]byte, 512)
		n, _ := unix.Read(fd, buf)
		return string(buf[:n])
	}
	hello := make([]byte, 32)
	copy(hello, "IBVBRING")
	hello[8] = 3 // major 3
	hello[12] = 1
	if got := talk(hello); !strings.Contains(got, fmtS("is layout 2.%d; this client speaks 3.0", ring.MinorVersion)) || got[12] != 1 {
		t.Fatalf("major 3: %q", got)
	}
	if got := talk([]byte("hello?")); !strings.Contains(got, "not an ibvbridge hello") || got[12] != 5 {
		t.Fatalf("garbage: %q", got)
	}
	if p.Consumers() != 0 {
		t.Fatal("a refused client counts as attached")
	}
	if _, err := ring.Attach("/dev/shm/ibvbridge.x.v1.ctl", ring.AttachOptions{Timeout: -1}); !errors.Is(err, ring.ErrVersion) ||
		!strings.Contains(err.Error(), "layout 1.0") || !strings.Contains(err.Error(), fmtS("speaks layout 2.%d", ring.MinorVersion)) {
		t.Fatalf("1.0 path: %v", err)
	}
}

// TestAttachAndDeathLatency logs how long an attach takes and how long a sleeping consumer takes to notice
// a producer's kill -9 (spec: ≤ 250 ms each); only a generous bound is asserted, timings being noisy.
func TestAttachAndDeathLatency(t *testing.T) {
	dir := t.TempDir()
	child := startChild(t, dir, "lat")
	var worst time.Duration
	for range 20 {
		start := time.Now()
		c, err := ring.Attach("lat", ring.AttachOptions{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(start))
		c.Close()
	}
	c, err := ring.Attach("lat", ring.AttachOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		h, _ := c.Next(time.Second)
		c.Release(h)
	}
	killed := make(chan time.Time, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the consumer is asleep on its futex by then
		killed <- time.Now()
		child.Process.Signal(syscall.SIGKILL)
	}()
	_, err = c.Next(10 * time.Second)
	noticed := time.Now()
	child.Wait()
	if !errors.Is(err, ring.ErrProducerGone) {
		t.Fatalf("after kill -9: %v", err)
	}
	detect := noticed.Sub(<-killed)
	t.Logf("attach: worst of 20 %v; producer death noticed after %v", worst, detect)
	if worst > time.Second || detect > time.Second {
		t.Fatalf("attach took %v, death noticed after %v", worst, detect)
	}
}

// TestAttackOverrunMidReadNeverTorn (layout 2.1 §A): a slow consumer S holds a heap while the producer,
// kept busy by a fast consumer F under drop, laps the ring and rewrites that heap's slot. S's bytes are then
// not the heap's, and S is told so: Valid is false after the read, Release reports the overrun with the
// heaps lost, and so does its next call — no torn heap is ever passed off as valid.
func TestAttackOverrunMidReadNeverTorn(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "torn", cfg)
	slow := ringtest.Attach(t, "torn", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	fast := ringtest.Attach(t, "torn", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p, 1, 256)
	publish(t, p, 2, 256)
	h, err := slow.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 1, 256)
	if !slow.Valid(h) {
		t.Fatal("a heap just read and held is not valid while its consumer is attached")
	}
	// F releases every heap until the pool runs dry and S is detached, then holds the next heaps: the free
	// pool hands out the slot released last (LIFO), so only F holding slots makes the producer reach the one
	// S's heap was in.
	n := uint64(cfg.SlotCount)
	var held []ring.Heap
	for cnt := uint64(1); cnt <= 2*n; cnt++ {
		if cnt > 2 {
			publish(t, p, cnt, 256)
		}
		fh, err := fast.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cnt > n+1 {
			held = append(held, fh)
			continue
		}
		if err := fast.Release(fh); err != nil {
			t.Fatalf("fast consumer: %v", err)
		}
	}
	for _, fh := range held {
		if err := fast.Release(fh); err != nil {
			t.Fatalf("fast consumer: %v", err)
		}
	}
	torn := pattern.VerifyPattern(h.Payload, 1) >= 0 // the slot was reused: the bytes belong to a later heap
	if !torn {
		t.Fatal("the producer did not reuse the held slot: the test proves nothing")
	}
	if slow.Valid(h) {
		t.Fatal("Valid is true for a heap whose slot the producer rewrote")
	}
	var oe *ring.OverrunError
	if err := slow.Release(h); !errors.As(err, &oe) || !errors.Is(err, ring.ErrOverrun) || !errors.Is(err, ring.ErrDetached) {
		t.Fatalf("Release of the overrun heap: %v, want an *OverrunError", err)
	}
	if oe.Lost != uint64(cfg.SlotCount) {
		t.Errorf("Release: %d heaps lost, want %d (head %d at the detach − tail 0)", oe.Lost, cfg.SlotCount, cfg.SlotCount)
	}
	// Heap 2 was published before the lap and S's cached head covers it: it must not be handed out.
	if h2, err := slow.Next(time.Second); !errors.As(err, &oe) || oe.Lost != uint64(cfg.SlotCount) {
		t.Fatalf("next call after the overrun: heap %d, %v; want the overrun with %d heaps lost", h2.HeapCnt, err, cfg.SlotCount)
	}
}

// startRole starts cmd (this test binary in a RING_TEST_ROLE), kills it when the test ends, and returns
// a function that waits for the first line it prints (its "ready", "holding" or why not).
func startRole(t *testing.T, cmd *exec.Cmd) (firstLine func() string) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return func() string {
		line := make([]byte, 512)
		n, _ := out.Read(line)
		return string(line[:n])
	}
}

// roleCmd is this test binary in role, with env added (RING_TEST_* values).
func roleCmd(role string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "RING_TEST_ROLE="+role), env...)
	return cmd
}

// asUser runs cmd as uid:gid with no supplementary groups (setpriv), skipping when that cannot be done.
func asUser(t *testing.T, uid, gid int, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as another user")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed")
	}
	return exec.Command(setpriv, append([]string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups"}, args...)...)
}

// TestAttackParentSymlinkDirRefused (layout 2.1 §B): another user's symlink anywhere in --dir's path makes
// the producer refuse, naming it, and nothing is created inside the symlink's target.
func TestAttackParentSymlinkDirRefused(t *testing.T) {
	target := filepath.Join(t.TempDir(), "attacker")
	if err := os.Mkdir(target, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(target, 0o777)
	os.Chown(target, 65534, 65534)
	link := filepath.Join(os.TempDir(), fmtS("ibvb-parentlink-%d", os.Getpid()))
	if out, err := asUser(t, 65534, 65534, "ln", "-s", target, link).CombinedOutput(); err != nil {
		t.Fatalf("ln -s as nobody: %v %s", err, out)
	}
	t.Cleanup(func() { os.Remove(link) })
	_, err := ring.Create("plink", ring.Config{Dir: filepath.Join(link, "y", "z"), HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096})
	if !errors.Is(err, ring.ErrUnsafeDir) || !strings.Contains(err.Error(), link) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("--dir through another user's symlink: %v; want one ErrUnsafeDir line naming %s", err, link)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Fatalf("the producer created %v inside the symlink's target", ents)
	}
}

// TestAttackSquattedLookupDirSkipped (layout 2.1 §B): nobody makes the victim's per-user directory
// (/dev/shm/ibvbridge-UID, 0755) and serves a ring of spoofed heaps there under the real ring's name. The
// victim, attaching by name, skips that directory with a warning naming it and reads the real ring's heaps
// from /run/ibvbridge — never the spoofed ones.
// It runs in a private mount namespace whose /run and /dev/shm are fresh: the machine's stay untouched.
func TestAttackSquattedLookupDirSkipped(t *testing.T) {
	if os.Getenv(privateDirsEnv) == "" {
		inPrivateMachineDirs(t, "TestAttackSquattedLookupDirSkipped")
		return
	}
	const victim = 65533
	exe := publicCopy(t)
	name := fmtS("squat-%d", os.Getpid())
	squatDir := fmtS("/dev/shm/ibvbridge-%d", victim)
	if _, err := os.Lstat(squatDir); err == nil {
		t.Skipf("%s exists already; not touching it", squatDir)
	}
	t.Cleanup(func() { os.RemoveAll(squatDir) })
	p := ringtest.New(t, name, ring.Config{Dir: ring.RunDir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Group: "nogroup"})
	publish(t, p, 1, 100)
	sq := asUser(t, 65534, 65534, exe, "-test.run=^$")
	sq.Env = append(os.Environ(), "RING_TEST_ROLE=squatter", "RING_TEST_NAME="+name, "RING_TEST_DIR="+squatDir, "XDG_RUNTIME_DIR=")
	if line := startRole(t, sq)(); !strings.Contains(line, "ready") {
		t.Fatalf("squatter: %s", line)
	}
	v := asUser(t, victim, 65534, exe, "-test.run=^$")
	v.Env = append(os.Environ(), "RING_TEST_ROLE=victim", "RING_TEST_NAME="+name, "XDG_RUNTIME_DIR=", ring.EnvDir+"=")
	got, _ := v.CombinedOutput()
	if !strings.Contains(string(got), "read heap 1") || strings.Contains(string(got), "666") ||
		!strings.Contains(string(got), "skipping "+squatDir+": ") || !strings.Contains(string(got), "owned by uid 65534") {
		t.Fatalf("victim: %s; want the real heap 1 and a warning that %s was skipped", got, squatDir)
	}
}

// privateDirsEnv marks the child inPrivateMachineDirs starts.
const privateDirsEnv = "RING_TEST_PRIVATE_DIRS"

// inPrivateMachineDirs runs test again in a child process whose /run and /dev/shm are fresh tmpfs mounts
// of a mount namespace of its own: a test of the machine-wide ring directories (/run/ibvbridge,
// /dev/shm/ibvbridge-UID) then creates nothing in the machine's. The child's users (setpriv) share it.
func inPrivateMachineDirs(t *testing.T, test string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a private mount namespace needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) for a private mount namespace")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := `mount -t tmpfs -o mode=0755 ibvb-run /run && mount -t tmpfs -o mode=1777 ibvb-shm /dev/shm && exec "$0" "$@"`
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c", script, exe,
		"-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), privateDirsEnv+"=1")
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "--- SKIP: "+test) {
		t.Skipf("in a private mount namespace: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatalf("%s in a private mount namespace: %v\n%s", test, err, out)
	}
}

// TestAttachMissingNameFailsAtOnce (layout 2.1 §B): a name no directory serves is ErrNotFound at once,
// naming where it looked (a typo does not wait out the timeout); with Wait the same attach waits for the
// producer and gets its ring.
func TestAttachMissingNameFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	done := make(chan error, 1)
	go func() {
		_, err := ring.Attach("nosuch", ring.AttachOptions{Dir: dir, Timeout: time.Hour})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ring.ErrNotFound) || err.Error() != "ring nosuch not found (looked in "+dir+")" {
			t.Fatalf("missing name: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a missing name waited for the attach timeout")
	}
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096}
	attached := make(chan error, 1)
	go func() {
		c, err := ring.Attach("later", ring.AttachOptions{Dir: dir, Timeout: time.Minute, Wait: true})
		if err == nil {
			c.Close()
		}
		attached <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ringtest.New(t, "later", cfg)
	if err := <-attached; err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestAttachStaleSocketSaysSo: a socket nobody serves any more is retried until the timeout, then named
// as stale with the command that removes it.
func TestAttachStaleSocketSaysSo(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, ring.SocketName("gone"))
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Skipf("bind %s: %v", path, err)
	}
	unix.Close(fd) // bound, never listening: connect is refused, as after kill -9
	_, err = ring.Attach("gone", ring.AttachOptions{Dir: dir, Timeout: 100 * time.Millisecond})
	want := "ring gone: stale socket " + path + " (no producer; `ibvbridge rm --stale --dir " + dir + "` removes it)"
	if !errors.Is(err, ring.ErrNotFound) || err.Error() != want {
		t.Fatalf("stale socket: %v; want %q", err, want)
	}
}

// countLines is how many lines /proc/self/maps has, or entries /proc/self/fd.
func procCounts(t *testing.T) (maps, fds int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n"), len(ents)
}

// rawAttachDetach is one attachment by the wire protocol alone (spec §1.2): hello, welcome with its three
// descriptors (closed at once), close.
func rawAttachDetach(t *testing.T, sock string) {
	fd, st := rawHello(t, sock, ring.RoleConsumer)
	unix.Close(fd)
	if st != ring.StatusOK {
		t.Fatalf("attach refused with status %d", st)
	}
}

// TestAttackIdleAttachDetachChurnBounded (layout 2.1 §C): 50 000 attach/detach cycles on a ring where
// nothing is published leave the producer's mappings and descriptors where they were: a detached
// consumer's region is unmapped at detach, not at the next publish (on main every cycle leaked a 4 KiB
// mapping until the producer died of it).
func TestAttackIdleAttachDetachChurnBounded(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "churn", cfg)
	sock := directSocket(t, p.SocketPath())
	settle := func() (int, int) {
		deadline := time.Now().Add(10 * time.Second)
		for p.Consumers() != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // the handlers' last detach bookkeeping
		return procCounts(t)
	}
	for range 100 {
		rawAttachDetach(t, sock)
	}
	maps0, fds0 := settle()
	const cycles = 50000
	for range cycles {
		rawAttachDetach(t, sock)
	}
	maps1, fds1 := settle()
	if maps1 > maps0+64 || fds1 > fds0+16 {
		t.Fatalf("after %d idle attach/detach cycles: %d mappings (was %d), %d descriptors (was %d)", cycles, maps1, maps0, fds1, fds0)
	}
	t.Logf("%d cycles: mappings %d -> %d, descriptors %d -> %d", cycles, maps0, maps1, fds0, fds1)
}

// TestAttackParallelMalformedHellosRaceFree: malformed hellos arriving in parallel each get a protocol
// refusal and the producer's refusal log stays race-free (go test -race found a data race here) and
// rate-limited to about one line a second.
func TestAttackParallelMalformedHellosRaceFree(t *testing.T) {
	cfg := testConfig(t)
	var logBuf lockedWriter
	lg := zerolog.New(&logBuf)
	cfg.Log = &lg
	p := ringtest.New(t, "malformed", cfg)
	sock := directSocket(t, p.SocketPath())
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer unix.Close(fd)
			if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
				errs <- err.Error()
				return
			}
			unix.Write(fd, []byte("not a hello"))
			buf := make([]byte, 512)
			if n, _ := unix.Read(fd, buf); n <= 12 || buf[12] != ring.StatusProtocol {
				errs <- fmtS("answer %q", buf[:n])
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := strings.Count(logBuf.String(), "refused a client"); n < 1 || n > 3 {
		t.Errorf("%d refusal lines logged for 64 parallel refusals, want 1 (a line a second)", n)
	}
}

// lockedWriter is an io.Writer safe for the producer's goroutines.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// directSocket skips the test when sock is too long for sockaddr_un (the raw clients here connect to it
// directly), else returns it.
func directSocket(t *testing.T, sock string) string {
	t.Helper()
	if len(sock) >= 100 {
		t.Skipf("socket path %s too long to connect to directly", sock)
	}
	return sock
}

// rawHello connects to sock and sends a hello of role, returning the socket and the answer's status (its
// descriptors closed).
func rawHello(t *testing.T, sock string, role byte) (int, byte) {
	t.Helper()
	return rawHelloPatched(t, sock, func(h []byte) { h[12] = role })
}

// rawHelloPatched is rawHello with the hello's bytes after magic, major and minor set by patch.
func rawHelloPatched(t *testing.T, sock string, patch func(h []byte)) (int, byte) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, ring.HelloSize)
	copy(hello, "IBVBRING")
	hello[8], hello[10] = byte(ring.MajorVersion), byte(ring.MinorVersion)
	patch(hello)
	unix.Write(fd, hello)
	buf, oob := make([]byte, ring.ErrorRecordMax), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, rerr := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for i := range msgs {
		fds, _ := unix.ParseUnixRights(&msgs[i])
		for _, f := range fds {
			unix.Close(f)
		}
	}
	if n <= 12 {
		t.Fatalf("answer of %d bytes: %v", n, rerr)
	}
	return fd, buf[12]
}

// TestAttackObserverFloodRefusedConsumersServed (layout 2.1 §C): observers beyond --max-observers (default
// 4) are refused as busy naming the limit, a consumer still attaches, and a closed observer frees its place.
func TestAttackObserverFloodRefusedConsumersServed(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "obsflood", cfg)
	sock := directSocket(t, p.SocketPath())
	var held []int
	t.Cleanup(func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	})
	for range ring.DefaultMaxObservers {
		fd, st := rawHello(t, sock, ring.RoleObserver)
		held = append(held, fd)
		if st != ring.StatusOK {
			t.Fatalf("observer %d refused with status %d", len(held), st)
		}
	}
	for range 20 {
		fd, st := rawHello(t, sock, ring.RoleObserver)
		unix.Close(fd)
		if st != ring.StatusBusy {
			t.Fatalf("observer beyond the limit: status %d, want busy", st)
		}
	}
	_, err := ring.Inspect(sock, "")
	if !errors.Is(err, ring.ErrBusy) || !strings.Contains(err.Error(), "busy: 4 observers") || strings.Contains(err.Error(), "consumer row") {
		t.Fatalf("stat during the flood: %v (want the producer's reason only)", err)
	}
	c := ringtest.Attach(t, "obsflood", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}) // consumers are not observers: still served
	publish(t, p, 1, 64)
	if h, err := c.Next(time.Second); err != nil || h.HeapCnt != 1 {
		t.Fatalf("consumer during the observer flood: %v", err)
	}
	unix.Close(held[0])
	held = held[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := ring.Inspect(sock, ""); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("a closed observer's place was never freed: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttackSupplementaryGroupMemberAdmitted: --group admits a process that has the group only as a
// supplementary group given to it (setpriv --groups), not in /etc/group: the producer reads the peer's
// real groups (SO_PEERGROUPS).
func TestAttackSupplementaryGroupMemberAdmitted(t *testing.T) {
	dir := publicDir(t)
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Group: "daemon"}
	p := ringtest.New(t, "supgrp", cfg)
	publish(t, p, 1, 100)
	exe := publicCopy(t)
	cmd := asUser(t, 65534, 65534, exe, "-test.run=^$")
	// asUser clears the groups; give exactly the ring's group as a supplementary one instead.
	for i, a := range cmd.Args {
		if a == "--clear-groups" {
			cmd.Args[i] = "--groups=daemon"
		}
	}
	cmd.Env = append(os.Environ(), "RING_TEST_ROLE=member", "RING_TEST_SOCKET="+p.SocketPath())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "read heap 1") {
		t.Fatalf("member by supplementary group: %v: %s", err, out)
	}
}

// TestInspectUnreadIsSlowestAttachedLag (layout 2.1 §D): stat's unread heaps are head minus the slowest
// attached consumer's released position — not head minus oldest, which also counts heaps the ring keeps.
func TestInspectUnreadIsSlowestAttachedLag(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "unread", cfg)
	a, b := ringtest.Attach(t, "unread", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second}), ringtest.Attach(t, "unread", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 4; cnt++ {
		publish(t, p, cnt, 64)
	}
	read := func(c *ring.Consumer, n int) {
		var h ring.Heap
		for range n {
			var err error
			if h, err = c.Next(time.Second); err != nil {
				t.Fatal(err)
			}
		}
		c.Release(h)
		c.Next(0) // caught up or not: a wait publishes the released position
	}
	read(a, 4)
	read(b, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := ring.Inspect(p.SocketPath(), "")
		if err != nil {
			t.Fatal(err)
		}
		if info.Unread == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unread %d (head %d, oldest %d, consumers %+v), want 2", info.Unread, info.Head, info.Oldest, info.Consumers)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackConnectionFloodKeepsFDReserve (layout 2.1 §C): a producer under a 128-descriptor limit, flooded
// with 200 connections it lets stay (observers, with a limit of 1000), refuses the flood's tail and then a
// consumer as busy for want of descriptors — the true reason, not a memfd or group lookup failing with
// EMFILE — and serves the consumer once the flood is gone.
func TestAttackConnectionFloodKeepsFDReserve(t *testing.T) {
	dir := t.TempDir()
	child := roleCmd("lowfd-producer", "RING_TEST_NAME=lowfd", "RING_TEST_DIR="+dir)
	if line := startRole(t, child)(); !strings.Contains(line, "ready") {
		t.Fatalf("producer: %s", line)
	}
	sock := directSocket(t, filepath.Join(dir, ring.SocketName("lowfd")))
	var flood []int
	busy := 0
	for range 200 { // observers the producer lets stay (--max-observers 1000): each holds a descriptor
		fd, st := rawHello(t, sock, ring.RoleObserver)
		flood = append(flood, fd)
		if st == ring.StatusBusy {
			busy++
		}
	}
	if busy == 0 {
		t.Fatal("200 held connections under a 128-descriptor limit and none refused as busy")
	}
	_, err := ring.Attach(sock, ring.AttachOptions{Timeout: 2 * time.Second})
	if !errors.Is(err, ring.ErrBusy) || !strings.Contains(err.Error(), "file descriptors") {
		t.Errorf("attach during the flood: %v; want busy for want of descriptors", err)
	}
	for _, fd := range flood {
		unix.Close(fd)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := ring.Attach(sock, ring.AttachOptions{Timeout: 2 * time.Second})
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attach after the flood: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackExplicitUntrustedDirRefused (layout 2.1 §B): a directory given explicitly that another user
// owns in a place anyone may create in (or that anyone may write) is refused in one line naming it and
// why, before anything is connected to.
func TestAttackExplicitUntrustedDirRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another user")
	}
	for _, tc := range []struct {
		uid  int
		mode os.FileMode
		why  string
	}{{65534, 0o755, "owned by uid 65534, not 0 or root"}, {0, 0o777, "writable by group or others"}} {
		parent := t.TempDir() // anyone may create here, as in /tmp or /dev/shm: no root-only parent
		os.Chmod(parent, 0o1777)
		dir := filepath.Join(parent, "d")
		if err := os.Mkdir(dir, tc.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, tc.mode)
		os.Chown(dir, tc.uid, tc.uid)
		_, err := ring.Attach("x", ring.AttachOptions{Dir: dir, Timeout: -1})
		if !errors.Is(err, ring.ErrUnsafeDir) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("explicit dir uid %d mode %o: %v; want ErrUnsafeDir naming it: %s", tc.uid, tc.mode, err, tc.why)
		}
	}
}

// TestAttackSilentConnectionTimesOut (layout 2.1 §C): a connection that sends no hello is closed after the
// hello timeout (2 s) and counted; the producer holds nothing for it.
func TestAttackSilentConnectionTimesOut(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "silent", cfg)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: directSocket(t, p.SocketPath())}); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Sec: 30}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 64)
	if n, err := unix.Read(fd, buf); n != 0 || err != nil { // EOF: the producer closed it
		t.Fatalf("silent connection: read %d bytes, %v; want the producer to close it", n, err)
	}
	if got := p.HelloTimeouts(); got != 1 {
		t.Fatalf("HelloTimeouts %d, want 1", got)
	}
}

// TestProducerSkipsASquattedDefaultDir (spec §1.1, 2.2): a stranger who made /dev/shm/ibvbridge-UID first
// does not stop that user's producer: it is skipped with a warning, the ring is made in the next default,
// /tmp/ibvbridge-UID, and a consumer of the same user finds it there by name. Run in a mount namespace of its
// own whose /run, /dev/shm and /tmp are fresh, so nothing of the machine's is touched.
func TestProducerSkipsASquattedDefaultDir(t *testing.T) {
	if os.Getenv(privateDirsEnv) == "" {
		inPrivateMachineDirs(t, "TestProducerSkipsASquattedDefaultDir")
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe := "/run/squat.test" // /run is this namespace's own tmpfs; /tmp is about to be replaced
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("ibvb-tmp", "/tmp", "tmpfs", 0, "mode=1777"); err != nil {
		t.Skipf("a private /tmp: %v", err)
	}
	// Unmounted before the test binary's own temporary directory (made under the real /tmp) is removed.
	t.Cleanup(func() { _ = unix.Unmount("/tmp", unix.MNT_DETACH) })
	squat := ring.ShmDirPrefix + "65534"
	if err := os.Mkdir(squat, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(squat, 1, 1); err != nil { // a stranger's (uid 1) directory where nobody's default lies
		t.Fatal(err)
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, ring.EnvDir+"=") && !strings.HasPrefix(e, "XDG_RUNTIME_DIR=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, "RING_TEST_ROLE=squat-default")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "made in "+ring.TmpDirPrefix+"65534 and attached by name") {
		t.Fatalf("producer as nobody beside a squatted %s: %v\nstdout %s\nstderr %s", squat, err, out, stderr.String())
	}
	if !strings.Contains(stderr.String(), "skipping "+squat) {
		t.Fatalf("no warning naming the skipped %s: %s", squat, stderr.String())
	}
}
