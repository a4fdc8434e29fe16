package ring_test

import (
	"encoding/binary"
	"errors"
	"github.com/ibvbridge/ibvbridge/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// The test binary doubles as a producer process for the kill -9 tests.
func TestMain(m *testing.M) {
	if role := os.Getenv("RING_TEST_ROLE"); role != "" {
		childMain(role)
		return
	}
	if dir := os.Getenv("RING_TEST_CHILD_DIR"); dir != "" {
		childProducer(dir, os.Getenv("RING_TEST_CHILD_NAME"))
		return
	}
	code := testenv.Main(m) // a ring directory of its own: nothing lands in /run/ibvbridge
	if publicExe != "" {
		os.RemoveAll(filepath.Dir(publicExe)) // the copy another user could run: nothing left in /tmp
	}
	os.Exit(code)
}

// childProducer publishes a few heaps, reports on stdout, then waits to be killed.
func childProducer(dir, name string) {
	p, err := ring.Create(name, ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096})
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(1)
	}
	pb := pattern.Publisher{P: p, Size: 100, Fill: true}
	for cnt := uint64(1); cnt <= 3; cnt++ {
		if _, err := pb.Publish(cnt, 0); err != nil {
			os.Exit(1)
		}
	}
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Minute)
	os.Exit(0)
}

func testConfig(t *testing.T) ring.Config {
	return ring.Config{Dir: t.TempDir(), HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096}
}

func publish(t *testing.T, p *ring.Producer, cnt uint64, size int) {
	t.Helper()
	pb := pattern.Publisher{P: p, Size: size, Fill: true}
	if _, err := pb.Publish(cnt, uint64(time.Now().UnixNano())); err != nil {
		t.Fatalf("publish %d: %v", cnt, err)
	}
}

func checkHeap(t *testing.T, h ring.Heap, cnt uint64, size int) {
	t.Helper()
	if h.HeapCnt != cnt || h.Received != uint64(size) || len(h.Payload) != size || h.Flags != ring.FlagComplete {
		t.Fatalf("heap %+v, want cnt %d size %d", h, cnt, size)
	}
	if i := pattern.VerifyPattern(h.Payload, cnt); i >= 0 {
		t.Fatalf("heap %d: byte %d is wrong", cnt, i)
	}
	it, ok := h.Item(pattern.CntItemID)
	if !ok || !it.Immediate() || it.Value != cnt {
		t.Fatalf("heap %d: cnt item %+v", cnt, it)
	}
	pl, ok := h.Item(pattern.PayloadItemID)
	if !ok || pl.Immediate() || len(h.ItemBytes(pl)) != size {
		t.Fatalf("heap %d: payload item %+v", cnt, pl)
	}
}

func TestRoundTrip(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "rt", cfg)
	c := ringtest.Attach(t, "rt", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if c.SessionID() == 0 {
		t.Fatal("session id 0")
	}
	for round := 0; round < 5; round++ { // several laps of the 8-slot ring
		for i := 0; i < 6; i++ {
			publish(t, p, uint64(round*6+i+1), 100+i*8)
		}
		for i := 0; i < 6; i++ {
			h, err := c.Next(time.Second)
			if err != nil {
				t.Fatal(err)
			}
			checkHeap(t, h, uint64(round*6+i+1), 100+i*8)
			c.Release(h)
		}
	}
	st := c.Stats()
	if st.Get(ring.CounterHeaps) != 30 || st.Get(ring.CounterPackets) != 30 {
		t.Fatalf("stats %v", st.Map())
	}
	if _, ok, _ := c.TryNext(); ok {
		t.Fatal("heap out of nothing")
	}
}

func TestHeldSlotsSurviveFullLapDropPolicy(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "drop", cfg)
	c := ringtest.Attach(t, "drop", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 8; cnt++ {
		publish(t, p, cnt, 256)
	}
	// Hold three heaps unreleased while the producer tries to run a whole lap.
	var held []ring.Heap
	for i := 0; i < 3; i++ {
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	dropped := 0
	pb := pattern.Publisher{P: p, Size: 256, Fill: true}
	for cnt := uint64(9); cnt <= 20; cnt++ {
		if _, err := pb.Publish(cnt, 0); errors.Is(err, ring.ErrFull) {
			p.Add(ring.CounterDroppedHeaps, 1)
			dropped++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if dropped != 12 {
		t.Fatalf("dropped %d heaps, want all 12 (no slot was released)", dropped)
	}
	for i, h := range held {
		checkHeap(t, h, uint64(i+1), 256)
	}
	c.Release(held[1]) // releases heaps 1 and 2
	publish(t, p, 21, 256)
	publish(t, p, 22, 256)
	if _, err := pb.Publish(23, 0); !errors.Is(err, ring.ErrFull) {
		t.Fatalf("third publish after releasing two: %v", err)
	}
	checkHeap(t, held[2], 3, 256)
	want := []uint64{4, 5, 6, 7, 8, 21, 22}
	for _, cnt := range want {
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 256)
	}
	if got := c.Stats().Get(ring.CounterDroppedHeaps); got != 12 {
		t.Fatalf("dropped_heaps %d", got)
	}
}

func TestBlockPolicyLosesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "block", cfg)
	c := ringtest.Attach(t, "block", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	const n = 2000
	done := make(chan error, 1)
	go func() {
		pb := pattern.Publisher{P: p, Size: 64, Fill: true}
		for cnt := uint64(1); cnt <= n; cnt++ {
			if _, err := pb.Publish(cnt, 0); err != nil {
				done <- err
				return
			}
		}
		done <- p.PublishEndOfStream(0, time.Second)
	}()
	for cnt := uint64(1); cnt <= n; cnt++ {
		h, err := c.Next(5 * time.Second)
		if err != nil {
			t.Fatalf("heap %d: %v", cnt, err)
		}
		checkHeap(t, h, cnt, 64)
		if cnt%97 == 0 {
			time.Sleep(time.Millisecond) // let the producer fill the ring and sleep
		}
		c.Release(h)
	}
	if _, err := c.Next(time.Second); !errors.Is(err, ring.ErrEndOfStream) {
		t.Fatalf("after the last heap: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestBlockedProducerInterrupted: a block producer waiting on its consumer's release futex stays blocked
// past a whole sleep slice (it re-sleeps, it does not give up), and Interrupt's futex wake wakes it —
// by the kernel's count, so the test fails if the wake is removed (then only the 250 ms slice would end
// the sleep).
func TestBlockedProducerInterrupted(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "intr", cfg)
	ringtest.Attach(t, "intr", ring.AttachOptions{Dir: cfg.Dir}) // holds every heap: reads and releases none
	for cnt := uint64(1); cnt <= 8; cnt++ {
		publish(t, p, cnt, 8)
	}
	errc := make(chan error, 1)
	go func() { _, err := p.Acquire(); errc <- err }()
	select {
	case err := <-errc:
		t.Fatalf("Acquire returned %v from a ring its consumer holds full", err)
	case <-time.After(300 * time.Millisecond): // longer than the 250 ms sleep slice
	}
	woken := p.FutexWokenForTest()
	p.Interrupt()
	select {
	case err := <-errc:
		if !errors.Is(err, ring.ErrClosed) {
			t.Fatalf("interrupted acquire: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Interrupt did not end the blocked Acquire")
	}
	if n := p.FutexWokenForTest() - woken; n < 1 {
		t.Fatal("Interrupt's futex wake woke no sleeper: the producer was not woken, its slice ran out")
	}
}

// TestWaitWakesAndTimesOut: Next times out on an empty ring; a consumer asleep on its futex is woken by the
// producer's futex wake when a heap is published — the futex wait itself says a wake ended it, so the test
// fails if the wake is removed (the sleep slice alone would still deliver the heap, late).
func TestWaitWakesAndTimesOut(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "wait", cfg)
	c := ringtest.Attach(t, "wait", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	start := time.Now()
	if _, err := c.Next(30 * time.Millisecond); !errors.Is(err, ring.ErrTimeout) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("empty ring: %v", err)
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("returned before the timeout")
	}
	done := make(chan struct{})
	defer func() { <-done }() // the producer's memory must outlive the publisher goroutine
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond) // past the spin: the consumer is asleep on the futex
		pb := pattern.Publisher{P: p, Size: 32, Fill: true}
		pb.Publish(7, 0)
	}()
	h, err := c.Next(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 7, 32)
	if c.FutexWakeupsForTest() < 1 || c.Wakes() < 1 {
		t.Fatalf("no FUTEX_WAKE ended the consumer's sleep (%d wakes counted): the heap came by the sleep slice", c.Wakes())
	}
}

func TestSecondProducerRefusedConsumersShare(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxConsumers = 2
	p := ringtest.New(t, "one", cfg)
	if _, err := ring.Create("one", cfg); !errors.Is(err, ring.ErrInUse) {
		t.Fatalf("second producer: %v", err)
	}
	c := ringtest.Attach(t, "one", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	c2 := ringtest.Attach(t, "one", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if _, err := ring.Attach("one", ring.AttachOptions{Dir: cfg.Dir, Timeout: -1}); !errors.Is(err, ring.ErrBusy) {
		t.Fatalf("third consumer of a 2-consumer ring: %v", err)
	}
	for cnt := uint64(1); cnt <= 4; cnt++ {
		publish(t, p, cnt, 40)
	}
	for _, cons := range []*ring.Consumer{c, c2} { // both see every heap
		for cnt := uint64(1); cnt <= 4; cnt++ {
			h, err := cons.Next(time.Second)
			if err != nil {
				t.Fatal(err)
			}
			checkHeap(t, h, cnt, 40)
			if cnt < 4 {
				cons.Release(h)
			}
		}
	}
	c.Close()
	waitConsumers(t, p, 1)
	// A consumer that attaches later starts at the oldest heap the ring still holds: c2 holds heap 4.
	c3 := ringtest.Attach(t, "one", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	h, err := c3.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 4, 40)
	c4, err := ring.Attach("one", ring.AttachOptions{Dir: cfg.Dir, Timeout: -1, FromHead: true})
	if !errors.Is(err, ring.ErrBusy) {
		t.Fatalf("attach while two are attached: %v", err)
	}
	c3.Close()
	waitConsumers(t, p, 1)
	c4, err = ring.Attach("one", ring.AttachOptions{Dir: cfg.Dir, Timeout: -1, FromHead: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	publish(t, p, 5, 40)
	if h, err := c4.Next(time.Second); err != nil || h.HeapCnt != 5 {
		t.Fatalf("consumer from head: %+v %v", h, err)
	}
}

// waitConsumers waits for the producer to count n attached consumers (a detach is seen on the socket).
func waitConsumers(t testing.TB, p *ring.Producer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Consumers() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers attached, want %d", p.Consumers(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAttachErrors(t *testing.T) {
	cfg := testConfig(t)
	if _, err := ring.Attach("nope", ring.AttachOptions{Dir: cfg.Dir, Timeout: 20 * time.Millisecond}); !errors.Is(err, ring.ErrNotFound) {
		t.Fatalf("missing ring: %v", err)
	}
	for _, bad := range []string{"", ".hidden", "a/b", "x y", string(make([]byte, 65))} {
		if _, err := ring.Create(bad, cfg); !errors.Is(err, ring.ErrBadName) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	if _, err := ring.Create("cfg", ring.Config{Dir: cfg.Dir, HugePages: ring.HugePagesOff, SlotCount: 3}); !errors.Is(err, ring.ErrBadConfig) {
		t.Fatalf("slot count 3: %v", err)
	}
}

// patchCtl rewrites a header field of a live ring's control memory, as a corrupt or foreign producer would.
func patchCtl(p *ring.Producer, off int, val []byte) { copy(ring.CtlForTest(p)[off:], val) }

func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }

func TestVersionAndGeometryChecks(t *testing.T) {
	cases := []struct {
		name string
		off  int
		val  []byte
		want error
	}{
		{"major 3", 0x08, le16(3), ring.ErrVersion},
		{"bad magic", 0x00, le64(0x1234), ring.ErrCorrupt},
		{"slot count not a power of two", 0x30, le64(6), ring.ErrCorrupt},
		{"slot count huge", 0x30, le64(1 << 40), ring.ErrCorrupt},
		{"slot size not multiple of 64", 0x38, le64(100), ring.ErrCorrupt},
		{"max items 0", 0x40, le32(0), ring.ErrCorrupt},
		{"desc size", 0x44, le32(32), ring.ErrCorrupt},
		{"item size", 0x48, le32(16), ring.ErrCorrupt},
		{"payload past end", 0x78, le64(1 << 30), ring.ErrCorrupt},
		{"payload unaligned", 0x78, le64(4096*3 + 8), ring.ErrCorrupt},
		{"items overlap descriptors", 0x60, le64(0), ring.ErrCorrupt},
		{"data size mismatch", 0x50, le64(1 << 24), ring.ErrCorrupt},
		{"max consumers 0", 0x9C, le32(0), ring.ErrCorrupt},
		{"max consumers 65", 0x9C, le32(65), ring.ErrCorrupt},
		{"state INIT", 0x10, le32(0), ring.ErrCorrupt},
		{"state unknown (5)", 0x10, le32(5), ring.ErrCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := ringtest.New(t, "geo", cfg)
			patchCtl(p, tc.off, tc.val)
			_, err := ring.Attach("geo", ring.AttachOptions{Dir: cfg.Dir, Timeout: -1})
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.want == ring.ErrVersion {
				var ve *ring.VersionError
				if !errors.As(err, &ve) || ve.Found != 3 || ve.Supported != 2 {
					t.Fatalf("version error %v does not name both versions", err)
				}
			}
		})
	}
	t.Run("newer minor accepted", func(t *testing.T) {
		cfg := testConfig(t)
		p := ringtest.New(t, "minor", cfg)
		patchCtl(p, 0x0A, le16(7))
		c := ringtest.Attach(t, "minor", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
		publish(t, p, 1, 8)
		if _, err := c.Next(time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// mapDataRW is the producer's writable view of the data memory, as only a corrupting producer has.
func mapDataRW(t *testing.T, p *ring.Producer) []byte { return ring.DataForTest(p) }

func TestAttackCorruptDescriptorRejected(t *testing.T) {
	cases := []struct {
		name string
		off  int
		val  []byte
	}{
		{"seq", 0x00, le64(99)},
		{"slot", 0x28, le32(8)},
		{"item count", 0x30, le32(65)},
		{"received", 0x18, le64(4097)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := ringtest.New(t, "cd", cfg)
			c := ringtest.Attach(t, "cd", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
			publish(t, p, 1, 64)
			data := mapDataRW(t, p)
			copy(data[int(p.Geometry().DescOffset)+tc.off:], tc.val)
			if _, err := c.Next(time.Second); !errors.Is(err, ring.ErrCorrupt) {
				t.Fatalf("got %v", err)
			}
		})
	}
	t.Run("item outside slot", func(t *testing.T) {
		cfg := testConfig(t)
		p := ringtest.New(t, "ci", cfg)
		c := ringtest.Attach(t, "ci", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
		publish(t, p, 1, 64)
		data := mapDataRW(t, p)
		g := p.Geometry()
		// slot 0's first item is the payload item: make it reach one byte past the slot.
		copy(data[g.ItemsOffset+8:], le64(4000))
		copy(data[g.ItemsOffset+16:], le64(97))
		if _, err := c.Next(time.Second); !errors.Is(err, ring.ErrCorrupt) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestAttackDataMappedReadOnly(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "ro", cfg)
	c := ringtest.Attach(t, "ro", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p, 1, 64)
	h, err := c.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	faulted := func() (f bool) {
		defer func() { f = recover() != nil }()
		h.Payload[0] = 0xFF
		return false
	}()
	if !faulted {
		t.Fatal("a consumer write into heap memory did not fault")
	}
	checkHeap(t, h, 1, 64)
	// The memory itself is sealed: nobody who receives it can map it writable or resize it.
	for _, fd := range []int{ring.DataFDForTest(p), ring.CtlFDForTest(p)} {
		if b, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			unix.Munmap(b)
			t.Fatal("a new writable mapping of sealed memory succeeded")
		}
		if err := unix.Ftruncate(fd, 4096); err == nil {
			t.Fatal("sealed memory was resized")
		}
		ro, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Mprotect(ro, unix.PROT_READ|unix.PROT_WRITE); err == nil {
			t.Fatal("a read-only mapping of sealed memory was made writable")
		}
		unix.Munmap(ro)
		if f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDWR, 0); err == nil {
			if b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
				unix.Munmap(b)
				t.Fatal("a writable re-open through /proc mapped sealed memory writable")
			}
			f.Close()
		}
	}
}

func TestEndOfStreamAndClose(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "eos", cfg)
	c := ringtest.Attach(t, "eos", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p, 1, 8)
	if err := p.PublishEndOfStream(42, time.Second); err != nil {
		t.Fatal(err)
	}
	h, err := c.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 1, 8)
	if _, err := c.Next(time.Second); !errors.Is(err, ring.ErrEndOfStream) {
		t.Fatalf("marker: %v", err)
	}

	// Close without a marker: the consumer drains, then sees the end.
	p2 := ringtest.New(t, "close", cfg)
	c2 := ringtest.Attach(t, "close", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p2, 5, 8)
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(cfg.Dir, "close.*")); len(left) != 0 {
		t.Fatalf("files left after close: %v", left)
	}
	h, err = c2.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 5, 8)
	if _, err := c2.Next(time.Second); !errors.Is(err, ring.ErrEndOfStream) {
		t.Fatalf("after close: %v", err)
	}
}

func TestCursorsWrapAround2to64(t *testing.T) {
	cfg := testConfig(t)
	cfg.InitialPosition = ^uint64(0) - 5
	p := ringtest.New(t, "wrap", cfg)
	c := ringtest.Attach(t, "wrap", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 40; cnt++ {
		publish(t, p, cnt, 16)
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatalf("heap %d: %v", cnt, err)
		}
		checkHeap(t, h, cnt, 16)
		c.Release(h)
	}
}

func TestFutexWordWraps(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "fw", cfg)
	c := ringtest.Attach(t, "fw", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	c.SetFutexForTest(^uint32(0) - 1)
	done := make(chan struct{})
	defer func() { <-done }()
	go func() { // one goroutine owns the producer; each heap comes after the consumer fell asleep
		defer close(done)
		pb := pattern.Publisher{P: p, Size: 8, Fill: true}
		for cnt := uint64(1); cnt <= 4; cnt++ {
			time.Sleep(60 * time.Millisecond)
			pb.Publish(cnt, 0)
		}
	}()
	for cnt := uint64(1); cnt <= 4; cnt++ {
		h, err := c.Next(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 8)
		c.Release(h)
	}
}

func TestDescriptorsMetadata(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "meta", cfg)
	c := ringtest.Attach(t, "meta", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if ds, err := c.Descriptors(); err != nil || len(ds) != 0 {
		t.Fatalf("fresh ring: %v %v", ds, err)
	}
	want := []ring.ItemDescriptor{
		{ID: 0x1000, Name: "Test item 0", Description: "a test", DType: "{'descr': '>u4', 'fortran_order': False, 'shape': (8,)}", Shape: []int64{8}, ShapeKnown: true},
		{ID: 0x1001, Name: "v", Format: []byte{'u', 0, 0, 32}, Shape: []int64{-1, 3}, ShapeKnown: true},
		{ID: 0x1002, Name: "unknown shape"},
	}
	if err := p.SetDescriptors(want); err != nil {
		t.Fatal(err)
	}
	got, err := c.Descriptors()
	if err != nil || len(got) != 3 {
		t.Fatalf("%v %v", got, err)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Name != w.Name || g.Description != w.Description || g.DType != w.DType ||
			string(g.Format) != string(w.Format) || g.ShapeKnown != w.ShapeKnown || len(g.Shape) != len(w.Shape) {
			t.Fatalf("descriptor %d: got %+v want %+v", i, g, w)
		}
		for j := range w.Shape {
			if g.Shape[j] != w.Shape[j] {
				t.Fatalf("descriptor %d shape %v", i, g.Shape)
			}
		}
	}
	big := []ring.ItemDescriptor{{Name: string(make([]byte, 70000))}}
	if err := p.SetDescriptors(big); err == nil {
		t.Fatal("oversized descriptors accepted")
	}
}

func startChild(t *testing.T, dir, name string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RING_TEST_CHILD_DIR="+dir, "RING_TEST_CHILD_NAME="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if string(buf[:n]) != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("child producer said %q", buf[:n])
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestProducerKilledThenRestarted(t *testing.T) {
	dir := t.TempDir()
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096}
	child := startChild(t, dir, "kill")
	c := ringtest.Attach(t, "kill", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	oldSession := c.SessionID()
	if !c.ProducerAlive() {
		t.Fatal("live producer reported dead")
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	for cnt := uint64(1); cnt <= 3; cnt++ { // what it published before dying is still delivered
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 100)
		c.Release(h)
	}
	start := time.Now()
	_, err := c.Next(10 * time.Second)
	if !errors.Is(err, ring.ErrProducerGone) {
		t.Fatalf("after kill -9: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("noticed the dead producer after %v, want < 1 s", d)
	}
	// The stale socket and lock are still there; a new producer replaces them and gets a new session.
	if _, err := os.Stat(filepath.Join(dir, ring.SocketName("kill"))); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	p := ringtest.New(t, "kill", cfg)
	publish(t, p, 100, 8)
	c.Close()
	c2 := ringtest.Attach(t, "kill", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if c2.SessionID() == oldSession {
		t.Fatal("restarted producer has the old session id")
	}
	h, err := c2.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 100, 8)
}

func TestConsumerOnOldInodeSeesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096}
	child := startChild(t, dir, "epoch")
	c := ringtest.Attach(t, "epoch", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	ringtest.New(t, "epoch", cfg) // a new producer serves the name, but not the old attachment
	for i := 0; i < 3; i++ {
		h, _ := c.Next(time.Second)
		c.Release(h)
	}
	if _, err := c.Next(5 * time.Second); !errors.Is(err, ring.ErrProducerGone) {
		t.Fatalf("consumer of the old ring: %v", err)
	}
}

func TestConcurrentProducerConsumer(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 64
	p := ringtest.New(t, "conc", cfg)
	c := ringtest.Attach(t, "conc", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	const n = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	var dropped uint64
	go func() {
		defer wg.Done()
		pb := pattern.Publisher{P: p, Size: 24, Fill: true}
		for cnt := uint64(1); cnt <= n; cnt++ {
			if _, err := pb.Publish(cnt, 0); errors.Is(err, ring.ErrFull) {
				dropped++
				p.Add(ring.CounterDroppedHeaps, 1)
			}
		}
		p.PublishEndOfStream(0, 5*time.Second)
	}()
	var got, last uint64
	for {
		h, err := c.Next(5 * time.Second)
		if errors.Is(err, ring.ErrEndOfStream) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.HeapCnt <= last {
			t.Fatalf("heap %d after %d", h.HeapCnt, last)
		}
		last = h.HeapCnt
		checkHeap(t, h, h.HeapCnt, 24)
		got++
		c.Release(h)
	}
	wg.Wait()
	if got+dropped != n || c.Stats().Get(ring.CounterDroppedHeaps) != dropped {
		t.Fatalf("received %d + dropped %d != %d (counter %d)", got, dropped, n, c.Stats().Get(ring.CounterDroppedHeaps))
	}
}

func TestHugePages(t *testing.T) {
	dir := t.TempDir()
	free := hugePagesFree(t)
	if free == 0 {
		if _, err := ring.Create("nohuge", ring.Config{Dir: dir, HugePages: ring.HugePagesRequire, SlotCount: 4, SlotSize: 64}); !errors.Is(err, ring.ErrNoHugePages) {
			t.Fatalf("require hugepages with none free: %v", err)
		}
	}
	// More than the pool holds: refused with one line naming the sizes, or a fallback to 4 KiB pages.
	big := ring.Config{Dir: dir, SlotCount: 1 << 14, SlotSize: 1 << 20}
	big.HugePages = ring.HugePagesRequire
	if _, err := ring.Create("toobig", big); !errors.Is(err, ring.ErrNoHugePages) || !strings.Contains(err.Error(), "MiB") {
		t.Fatalf("16 GiB of hugepages: %v", err)
	}
	p, err := ring.Create("fallback", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 4, SlotSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	if p.Huge() || p.Geometry().PageSize != 4096 {
		t.Fatalf("hugepages off: huge=%v page %d", p.Huge(), p.Geometry().PageSize)
	}
	p.Close()
	if free < 2 {
		t.Skipf("only %d free hugepages (make test reserves them as root)", free)
	}
	name := "huge" + strconv.Itoa(os.Getpid())
	p, err = ring.Create(name, ring.Config{Dir: dir, HugePages: ring.HugePagesRequire, SlotCount: 4, SlotSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Huge() || p.Geometry().PageSize < 2<<20 {
		t.Fatalf("not on hugepages: page %d", p.Geometry().PageSize)
	}
	c, err := ring.Attach(name, ring.AttachOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, p, 3, 4096)
	h, err := c.Next(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkHeap(t, h, 3, 4096)
	c.Close()
	p.Close()
	if got := waitHugePagesBack(t, free); got < free {
		t.Fatalf("free hugepages %d after close, %d before: memory outlived the ring", got, free)
	}
}

// waitHugePagesBack waits up to 5 s for HugePages_Free to be back at free and returns it: other test
// packages may hold hugepages of their own meanwhile, but ours must come back.
func waitHugePagesBack(t *testing.T, free int) int {
	deadline := time.Now().Add(5 * time.Second)
	for hugePagesFree(t) < free && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return hugePagesFree(t)
}

func hugePagesFree(t *testing.T) int {
	b, err := os.ReadFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(string(b[:len(b)-1]))
	return n
}

func TestDiscardOutOfOrder(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "disc", cfg)
	c := ringtest.Attach(t, "disc", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	var slots []*ring.Slot
	for i := 0; i < 8; i++ {
		s, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	if _, err := p.Acquire(); !errors.Is(err, ring.ErrFull) {
		t.Fatalf("ninth acquire: %v", err)
	}
	p.Discard(slots[3])
	p.Discard(slots[0])
	seen := map[uint32]bool{}
	for i := 0; i < 2; i++ {
		s, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		seen[s.Index] = true
	}
	if !seen[slots[3].Index] || !seen[slots[0].Index] {
		t.Fatalf("discarded slots not reused: %v", seen)
	}
	pattern.FillPattern(slots[5].Payload[:10], 9)
	p.Publish(slots[5], ring.HeapInfo{HeapCnt: 9, HeapSize: 10, Received: 10, Flags: ring.FlagComplete})
	h, err := c.Next(time.Second)
	if err != nil || h.Slot != slots[5].Index || pattern.VerifyPattern(h.Payload, 9) >= 0 {
		t.Fatalf("%+v %v", h, err)
	}
}

func TestEndOfStreamWhileHoldingHeaps(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "eoshold", cfg)
	c := ringtest.Attach(t, "eoshold", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	publish(t, p, 1, 8)
	publish(t, p, 2, 8)
	p.PublishEndOfStream(0, time.Second)
	h1, _ := c.Next(time.Second)
	h2, _ := c.Next(time.Second)
	if _, err := c.Next(time.Second); !errors.Is(err, ring.ErrEndOfStream) {
		t.Fatalf("marker: %v", err)
	}
	position := func() uint64 { // what the producer accepted from c: it reads the cursor when it reclaims
		p.Unread()
		i, err := ring.Inspect(p.SocketPath(), "")
		if err != nil || len(i.Consumers) != 1 {
			t.Fatalf("inspect: %+v %v", i, err)
		}
		return i.Head - i.Consumers[0].Position
	}
	c.Release(h1)
	c.Next(0) // finds nothing: stores the tail. Heap 2 is still held, so the marker must not go with it
	if lag := position(); lag != 2 {
		t.Fatalf("lag %d: held heap released with the marker", lag)
	}
	c.Release(h2)
	c.Next(0)
	if lag := position(); lag != 0 {
		t.Fatalf("lag %d after everything was released", lag)
	}
}

func TestRemove(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "rm", cfg)
	if err := ring.Remove(cfg.Dir, "rm"); !errors.Is(err, ring.ErrInUse) {
		t.Fatalf("remove with a live producer: %v", err)
	}
	if l, err := ring.List(cfg.Dir); err != nil || len(l) != 1 || l[0].Name != "rm" || !l[0].Socket || !l[0].Lock {
		t.Fatalf("list: %+v %v", l, err)
	}
	p.Close()
	if l, _ := ring.List(cfg.Dir); len(l) != 0 { // a clean close leaves nothing
		t.Fatalf("after close: %+v", l)
	}
	// What kill -9 leaves: the socket and the lock file, which Remove takes away.
	for _, f := range []string{ring.SocketName("rm"), "rm.v2.lock"} {
		if err := os.WriteFile(filepath.Join(cfg.Dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := ring.Remove(cfg.Dir, "rm"); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(cfg.Dir); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	if err := ring.Remove(cfg.Dir, "../x"); !errors.Is(err, ring.ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
}

func TestWaitDrained(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "drain", cfg)
	c := ringtest.Attach(t, "drain", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	for cnt := uint64(1); cnt <= 3; cnt++ {
		publish(t, p, cnt, 8)
	}
	if p.Consumers() != 1 {
		t.Fatal("attached consumer not seen")
	}
	stop := make(chan struct{})
	close(stop)
	if err := p.WaitDrained(stop); !errors.Is(err, ring.ErrClosed) || p.Unread() != 3 {
		t.Fatalf("stopped wait: %v, unread %d", err, p.Unread())
	}
	done := make(chan error, 1)
	go func() { done <- p.WaitDrained(nil) }()
	for i := 0; i < 3; i++ {
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		c.Release(h)
	}
	c.Next(10 * time.Millisecond) // finds nothing: hands the released slots back
	select {
	case err := <-done:
		if err != nil || p.Unread() != 0 {
			t.Fatalf("drained: %v, unread %d", err, p.Unread())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitDrained did not return after the consumer released everything")
	}
	publish(t, p, 4, 8)
	c.Close()
	waitConsumers(t, p, 0)
	if err := p.WaitDrained(nil); !errors.Is(err, ring.ErrNoConsumer) {
		t.Fatalf("nobody to drain: %v", err)
	}
}

func TestBatchPublishesAtEndBatch(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "batch", cfg)
	c := ringtest.Attach(t, "batch", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	p.BeginBatch()
	for cnt := uint64(1); cnt <= 3; cnt++ {
		publish(t, p, cnt, 64)
	}
	if _, ok, err := c.TryNext(); ok || err != nil {
		t.Fatalf("a staged heap is visible before EndBatch (ok %v, err %v)", ok, err)
	}
	if got := c.Stats().Get(ring.CounterHeaps); got != 0 {
		t.Fatalf("heaps counter %d before EndBatch, want 0", got)
	}
	p.EndBatch()
	if got := c.Stats().Get(ring.CounterHeaps); got != 3 {
		t.Fatalf("heaps counter %d after EndBatch, want 3", got)
	}
	for cnt := uint64(1); cnt <= 3; cnt++ {
		h, err := c.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		checkHeap(t, h, cnt, 64)
		c.Release(h)
	}

	// A batch longer than the ring: Acquire publishes what is staged when the pool runs dry, so the
	// consumer can release and the block producer never waits on its own batch.
	const n = 50 // > 8 slots
	done := make(chan error, 1)
	go func() {
		p.BeginBatch()
		pb := pattern.Publisher{P: p, Size: 64, Fill: true}
		for cnt := uint64(4); cnt < 4+n; cnt++ {
			if _, err := pb.Publish(cnt, 0); err != nil {
				done <- err
				return
			}
		}
		// The end of stream is published at once, even inside a batch.
		done <- p.PublishEndOfStream(0, 5*time.Second)
	}()
	for cnt := uint64(4); cnt < 4+n; cnt++ {
		h, err := c.Next(5 * time.Second)
		if err != nil {
			t.Fatalf("heap %d: %v", cnt, err)
		}
		checkHeap(t, h, cnt, 64)
		c.Release(h)
	}
	if _, err := c.Next(5 * time.Second); !errors.Is(err, ring.ErrEndOfStream) {
		t.Fatalf("after the batch: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestUnreadHeapsAfterConsumersLeave (layout 2.1 §D): the detach reads the consumer's final cursor, so a
// consumer that read everything and left leaves nothing unread (the ring still holds the heaps for a
// later consumer: Backlog), and one that left two behind leaves exactly two.
func TestUnreadHeapsAfterConsumersLeave(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "unreadleave", cfg)
	for _, tc := range []struct{ read, want int }{{4, 0}, {2, 2}} {
		c, err := ring.Attach("unreadleave", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second, FromHead: true})
		if err != nil {
			t.Fatal(err)
		}
		for cnt := uint64(1); cnt <= 4; cnt++ {
			publish(t, p, cnt, 64)
		}
		for range tc.read {
			h, err := c.Next(time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c.Release(h)
		}
		c.Close()
		waitConsumers(t, p, 0)
		if got := p.UnreadHeaps(); got != uint64(tc.want) {
			t.Errorf("read %d of 4 and left: UnreadHeaps %d, want %d (Backlog %d)", tc.read, got, tc.want, p.Backlog())
		}
	}
}

// TestNothingPublishedAfterEndOfStream: END_OF_STREAM is final (spec §4.1). A slot taken before the marker
// cannot be published after it, no slot can be taken, no second marker, no chunk: each is refused with
// ErrStreamEnded and head stays where the marker left it.
func TestNothingPublishedAfterEndOfStream(t *testing.T) {
	cfg := testConfig(t)
	cfg.Chunks = ring.ChunkGeometry{Heaps: 2, Axis: 1, HeapSize: 64, Step: 1, TimeItem: 0x1600}
	cfg.SlotSize = 0 // sized from the chunk geometry
	p := ringtest.New(t, "eosfinal", cfg)
	early, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PublishEndOfStream(7, time.Second); err != nil {
		t.Fatal(err)
	}
	head := func() uint64 { return binary.LittleEndian.Uint64(ring.CtlForTest(p)[0x200:]) }
	h0 := head()
	if err := p.Publish(early, ring.HeapInfo{HeapCnt: 8, Flags: ring.FlagComplete}); !errors.Is(err, ring.ErrStreamEnded) {
		t.Fatalf("Publish after the marker: %v, want ErrStreamEnded", err)
	}
	if _, err := p.Acquire(); !errors.Is(err, ring.ErrStreamEnded) {
		t.Fatalf("Acquire after the marker: %v, want ErrStreamEnded", err)
	}
	if s := p.TryAcquire(); s != nil {
		t.Fatalf("TryAcquire after the marker gave slot %d", s.Index)
	}
	if err := p.PublishEndOfStream(9, time.Second); !errors.Is(err, ring.ErrStreamEnded) {
		t.Fatalf("second marker: %v, want ErrStreamEnded", err)
	}
	if err := p.PublishChunk(early, ring.ChunkInfo{ID: 3}); !errors.Is(err, ring.ErrStreamEnded) {
		t.Fatalf("PublishChunk after the marker: %v, want ErrStreamEnded", err)
	}
	if h := head(); h != h0 {
		t.Fatalf("head moved from %d to %d after the end-of-stream marker", h0, h)
	}
}
