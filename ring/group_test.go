package ring_test

// Consumer groups (spec §14): the hello's group_id, assignment at publish, reclaim per member, a member's
// read and release, and a member's death.

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// rowField reads a u64 (or, with four bytes, a u32) of consumer-table row idx from the producer's memory.
func rowField(p *ring.Producer, idx, off, size int) uint64 {
	b := ring.CtlForTest(p)[0x1000+ring.TableRowSize*idx+off:]
	if size == 4 {
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

// helloStatus sends a consumer's hello with patch applied and returns the answer's status (0: a welcome).
func helloStatus(t *testing.T, sock string, patch func(h []byte)) byte {
	t.Helper()
	fd, st := rawHelloPatched(t, sock, func(h []byte) { h[12] = ring.RoleConsumer; patch(h) })
	unix.Close(fd)
	return st
}

func TestHelloGroupIDAcceptedReservedBytesRefused(t *testing.T) {
	p := ringtest.New(t, "hello", testConfig(t))
	if st := helloStatus(t, p.SocketPath(), func(h []byte) { h[0x1C] = 1 }); st != ring.StatusProtocol {
		t.Fatalf("non-zero reserved byte at 0x1c: status %d, want %d", st, ring.StatusProtocol)
	}
	if st := helloStatus(t, p.SocketPath(), func(h []byte) { h[12] = ring.RoleObserver; h[0x14] = 7 }); st != ring.StatusProtocol {
		t.Fatalf("an observer with a group: status %d, want %d", st, ring.StatusProtocol)
	}
	if st := helloStatus(t, p.SocketPath(), func(h []byte) { binary.LittleEndian.PutUint32(h[0x14:], 0xabcd) }); st != ring.StatusOK {
		t.Fatalf("a group_id: status %d, want a welcome", st)
	}
	c, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "workers"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if id := ring.GroupID("workers"); c.GroupID() != id || rowField(p, c.Index(), 0x40, 4) != uint64(id) || id == 0 {
		t.Fatalf("group id %#x, row says %#x, want FNV-1a %#x", c.GroupID(), rowField(p, c.Index(), 0x40, 4), id)
	}
	if ring.GroupID("") != 0 || ring.GroupID("a") != 0xe40c292c { // FNV-1a 32 of "a"
		t.Fatalf("GroupID(\"a\") = %#x", ring.GroupID("a"))
	}
}

// twoMembers attaches two members of group "g" to p, in this order (closed at the test's end).
func twoMembers(t *testing.T, p *ring.Producer) (*ring.Consumer, *ring.Consumer) {
	t.Helper()
	var cs [2]*ring.Consumer
	for i := range cs {
		c, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "g"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs[0], cs[1]
}

// drain reads c until the end of the stream, releasing each heap after check, and returns the heap
// counters it was handed; hold > 0 makes it stop after that many heaps and leave the last hold unreleased.
func drain(t *testing.T, c *ring.Consumer, stopAfter, hold int) []uint64 {
	var got []uint64
	var held []ring.Heap
	for {
		h, err := c.Next(5 * time.Second)
		if errors.Is(err, ring.ErrEndOfStream) {
			return got
		}
		if err != nil {
			t.Errorf("consumer %d: %v", c.Index(), err)
			return got
		}
		got = append(got, h.HeapCnt)
		if stopAfter > 0 && len(got) > stopAfter-hold {
			held = append(held, h)
			if len(got) == stopAfter {
				return got[:stopAfter-hold] // the held ones were not processed
			}
			continue
		}
		if err := c.Release(h); err != nil {
			t.Errorf("consumer %d release: %v", c.Index(), err)
		}
	}
}

// TestGroupEveryHeapOnceMonitorSeesAllMemberDeathCounted: four members of one group and an independent
// monitor on one ring (block policy): every heap goes to exactly one member, the monitor sees every heap in
// order, and a member that leaves holding heaps loses exactly those for the group (group_lost) while the
// others go on.
func TestGroupEveryHeapOnceMonitorSeesAllMemberDeathCounted(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount, cfg.Policy = 32, ring.PolicyBlock
	p := ringtest.New(t, "grp", cfg)
	const total = 3000
	var members []*ring.Consumer
	for i := range 4 {
		// Member 0 holds heaps while it waits for more: it sleeps at once (no spin), so the producer sees
		// it waiting and gives it the next heap before the ring fills up to its held ones.
		c, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "work", SpinBudget: map[bool]time.Duration{true: -1}[i == 0]})
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, c)
	}
	mon, err := ring.Attach(p.SocketPath(), ring.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	got := make([][]uint64, 5)
	var wg sync.WaitGroup
	for i, c := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 0 { // dies after 200 heaps, holding 3 of them
				got[i] = drain(t, c, 200, 3)
				c.Close()
				return
			}
			got[i] = drain(t, c, 0, 0)
			c.Close()
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); got[4] = drain(t, mon, 0, 0) }()
	for cnt := uint64(1); cnt <= total; cnt++ {
		publish(t, p, cnt, 64)
	}
	if err := p.PublishEndOfStream(0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(got[4]) != total {
		t.Fatalf("monitor saw %d heaps, want %d", len(got[4]), total)
	}
	for i, cnt := range got[4] {
		if cnt != uint64(i+1) {
			t.Fatalf("monitor's heap %d is cnt %d", i, cnt)
		}
	}
	seen := map[uint64]int{}
	for i, g := range got[:4] {
		if len(g) == 0 {
			t.Errorf("member %d got no heap", i)
		}
		for _, cnt := range g {
			if seen[cnt]++; seen[cnt] > 1 {
				t.Fatalf("heap %d processed twice", cnt)
			}
		}
	}
	lost := p.Stats().Get(ring.CounterGroupLost)
	if lost < 3 || uint64(len(seen))+lost != total {
		t.Fatalf("%d heaps processed once, %d counted lost: want %d in all, at least the 3 held", len(seen), lost, total)
	}
	var assigned uint64
	for _, c := range members[1:] {
		assigned += rowField(p, c.Index(), 0x38, 8)
	}
	info, err := ring.Inspect(p.SocketPath(), "") // what stat shows: each member's group and share
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range info.Consumers {
		want := ring.GroupID("work")
		if r.Index == mon.Index() {
			want = 0
		}
		if r.GroupID != want || r.Index != mon.Index() && r.Assigned == 0 {
			t.Fatalf("stat row %+v: want group %#x and a share", r, want)
		}
	}
	t.Logf("shares: %d %d %d %d, lost %d, rows 1-3 assigned %d", len(got[0]), len(got[1]), len(got[2]), len(got[3]), lost, assigned)
	if assigned != uint64(len(got[1])+len(got[2])+len(got[3])) {
		t.Fatalf("rows say %d assigned to members 1-3, they processed %d", assigned, len(got[1])+len(got[2])+len(got[3]))
	}
}

// TestGroupStoppedMemberHoldsOnlyItsOwnUntilARingBehind (drop policy, spec §14.3, §14.6): a member that
// takes one heap and stops reading gets one more position queued (round robin while it had read all it was
// given) and nothing after, while the other member gets every later heap and the pool keeps the rest free
// — until the ring has moved a whole ring past its held heap: then it alone holds the ring back, is
// detached as overrun, its two positions lost for the group, and the ring goes on without a drop.
func TestGroupStoppedMemberHoldsOnlyItsOwnUntilARingBehind(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 16
	p := ringtest.New(t, "slow", cfg)
	slow, fast := twoMembers(t, p)
	var held ring.Heap
	fastGot := 0
	poll := func() {
		if held.HeapCnt == 0 { // the slow member reads until it has one heap, then stops
			for {
				h, ok, err := slow.TryNext()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				held = h
			}
		}
		got, _ := readAll(t, fast, false)
		fastGot += len(got)
	}
	for cnt := uint64(1); cnt <= 15; cnt++ {
		publish(t, p, cnt, 64)
		poll()
	}
	p.Unread() // a reclaim
	if held.HeapCnt != 1 || fastGot != 13 || p.FreeSlots() != 14 {
		t.Fatalf("slow holds heap %d, fast got %d, free slots %d: want heap 1 held, 13, 14 free (one more queued for slow)", held.HeapCnt, fastGot, p.FreeSlots())
	}
	checkHeap(t, held, held.HeapCnt, 64)
	if !slow.Valid(held) {
		t.Fatal("the held heap is no longer valid while its member is within the ring")
	}
	for cnt := uint64(16); cnt <= 40; cnt++ { // a whole ring past the held heap
		publish(t, p, cnt, 64)
		poll()
	}
	var oe *ring.OverrunError
	if err := slow.Release(held); !errors.As(err, &oe) {
		t.Fatalf("slow member a ring behind: release says %v, want an overrun", err)
	}
	st := p.Stats()
	if st.Get(ring.CounterGroupLost) != 2 || st.Get(ring.CounterConsumerOverruns) != 1 || st.Get(ring.CounterDroppedHeaps) != 0 || fastGot != 38 {
		t.Fatalf("group_lost %d, overruns %d, dropped %d, fast got %d: want 2, 1, 0, 38",
			st.Get(ring.CounterGroupLost), st.Get(ring.CounterConsumerOverruns), st.Get(ring.CounterDroppedHeaps), fastGot)
	}
}

// TestGroupMemberReleasesPassedPositionsInOrder: a member holding its heap does not release the positions
// it passed over after it until it releases that heap; then its tail moves past all of them at once.
func TestGroupMemberReleasesPassedPositionsInOrder(t *testing.T) {
	p := ringtest.New(t, "order", testConfig(t))
	a, _ := twoMembers(t, p) // b reads nothing: its positions are a's to pass over
	for cnt := uint64(1); cnt <= 4; cnt++ {
		publish(t, p, cnt, 64)
	}
	// Nothing is released meanwhile, so the counts tie in turn: a gets 1 and 3, b 2 and 4 (round robin).
	var mine []ring.Heap
	for {
		h, ok, err := a.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		mine = append(mine, h)
	}
	if len(mine) != 2 || mine[0].HeapCnt != 1 || mine[1].HeapCnt != 3 {
		t.Fatalf("member a was handed %v, want heaps 1 and 3", mine)
	}
	tail := func() uint64 { return rowField(p, a.Index(), 0x20, 8) }
	if err := a.Release(mine[0]); err != nil {
		t.Fatal(err)
	}
	p.Unread()
	if got := tail() - mine[0].Position; got != 2 {
		t.Fatalf("after releasing heap 1, a's tail is %d past it, want 2 (heap 1 and b's heap 2)", got)
	}
	if !a.Valid(mine[1]) || a.Valid(mine[0]) {
		t.Fatal("Valid: heap 3 still held, heap 1 released")
	}
	if err := a.Release(mine[1]); err != nil {
		t.Fatal(err)
	}
	p.Unread()
	if got := tail() - mine[0].Position; got != 4 {
		t.Fatalf("after releasing heap 3, a's tail is %d past heap 1, want 4 (everything read)", got)
	}
}

// TestGroupUnreadCountsAMemberBehindReclaim: a member that has read nothing while the other read and
// released everything of its own sits behind the reclaim point (the positions between are the other's,
// freed), yet its heaps are unread: Unread and UnreadHeaps count head minus its tail, as ibvbridge stat and
// the C and Python producers do (spec §2.2), not head minus the member that is done.
func TestGroupUnreadCountsAMemberBehindReclaim(t *testing.T) {
	p := ringtest.New(t, "unreadgroup", testConfig(t))
	a, _ := twoMembers(t, p) // b reads nothing
	for cnt := uint64(1); cnt <= 4; cnt++ {
		publish(t, p, cnt, 64)
	}
	for range 2 { // a's heaps 1 and 3 (round robin), released: a's tail passes b's 2 and 4
		h, err := a.Next(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(h); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.Unread(); got != 4 {
		t.Errorf("Unread %d, want 4 (member b has read none of the 4 positions)", got)
	}
	if got := p.UnreadHeaps(); got != 4 {
		t.Errorf("UnreadHeaps %d, want 4", got)
	}
	info, err := ring.Inspect(p.SocketPath(), "")
	if err != nil {
		t.Fatal(err)
	}
	if info.Unread != p.UnreadHeaps() {
		t.Errorf("stat's unread %d, the producer's %d: one definition", info.Unread, p.UnreadHeaps())
	}
}

// TestGroupHolesNotReadByANewConsumer: while a member holds an old heap whose neighbours' slots were
// reused, oldest (ctl 0x308) is past the holes and a consumer attaching at the oldest heap starts there,
// reading only heaps whose slots still hold them (spec §14, §7.1).
func TestGroupHolesNotReadByANewConsumer(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 16
	p := ringtest.New(t, "holes", cfg)
	a, b := twoMembers(t, p)
	publish(t, p, 1, 64)
	held, ok, err := a.TryNext()
	if err != nil || !ok || held.HeapCnt != 1 {
		t.Fatalf("member a: %+v %v %v, want heap 1", held, ok, err)
	}
	for cnt := uint64(2); cnt <= 10; cnt++ {
		publish(t, p, cnt, 64)
		for {
			h, ok, err := b.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			b.Release(h)
		}
	}
	p.Unread() // a reclaim
	oldest := binary.LittleEndian.Uint64(ring.CtlForTest(p)[0x308:])
	if oldest != held.Position+10 {
		t.Fatalf("oldest %d, want %d (past every freed slot, at head)", oldest, held.Position+10)
	}
	c, err := ring.Attach(p.SocketPath(), ring.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for cnt := uint64(11); cnt <= 14; cnt++ { // fills the slots b released, LIFO
		publish(t, p, cnt, 64)
	}
	for cnt := uint64(11); cnt <= 14; cnt++ {
		h, ok, err := c.TryNext()
		if err != nil || !ok {
			t.Fatalf("new consumer: %v %v", ok, err)
		}
		checkHeap(t, h, cnt, 64)
		c.Release(h)
	}
	checkHeap(t, held, 1, 64)
	if !a.Valid(held) {
		t.Fatal("member a's held heap 1 is not valid")
	}
}

// readAll takes every heap c is handed now (TryNext), releasing each unless hold; it returns their counters
// and the heaps it holds.
func readAll(t *testing.T, c *ring.Consumer, hold bool) (cnts []uint64, held []ring.Heap) {
	t.Helper()
	for {
		h, ok, err := c.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return cnts, held
		}
		cnts = append(cnts, h.HeapCnt)
		if hold {
			held = append(held, h)
		} else if err := c.Release(h); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGroupLaggingMemberWithUnreadHeapsLeavesNextHeapToIdleMember (spec §14, under block): a member that
// holds the ring back by three quarters while it works on its oldest heap, with more than a quarter of the
// ring assigned and not released (3 of 8: a queue of its own), is not starved: the next heap goes to the
// member with the fewest outstanding. Before, a member three quarters behind took every heap, and in
// `bench group` one of four members read 245 of 300 chunks while the others idled (1.03× one consumer).
func TestGroupLaggingMemberWithUnreadHeapsLeavesNextHeapToIdleMember(t *testing.T) {
	cfg := testConfig(t) // 8 slots: three quarters is 6 positions, a quarter 2
	cfg.Policy = ring.PolicyBlock
	p := ringtest.New(t, "lag", cfg)
	a, b := twoMembers(t, p)
	for cnt := uint64(1); cnt <= 6; cnt++ { // nothing released meanwhile: a gets 1, 3, 5 and b 2, 4, 6
		publish(t, p, cnt, 64)
	}
	if got, _ := readAll(t, b, false); len(got) != 3 || got[0] != 2 || got[2] != 6 {
		t.Fatalf("member b read %v, want 2, 4, 6", got)
	}
	h, ok, err := a.TryNext() // a works on heap 1: 3 and 5 wait for it, b has nothing left
	if err != nil || !ok || h.HeapCnt != 1 {
		t.Fatalf("member a: %+v %v %v, want heap 1", h, ok, err)
	}
	p.Unread()           // a reclaim: the producer sees b's releases
	publish(t, p, 7, 64) // 6 positions past a's tail
	if got, _ := readAll(t, b, false); len(got) != 1 || got[0] != 7 {
		t.Fatalf("idle member b got %v after a lagging member with two heaps queued, want heap 7", got)
	}
	if err := a.Release(h); err != nil {
		t.Fatal(err)
	}
	if got, _ := readAll(t, a, false); len(got) != 2 || got[0] != 3 || got[1] != 5 {
		t.Fatalf("member a then read %v, want 3, 5", got)
	}
}

// TestGroupMemberHoldingAQuarterNeverStallsBlock (spec §14, under block): a member that keeps its last 4
// heaps (a quarter of a 16-slot ring) and wants a fifth before it releases the oldest, beside a member
// that releases each heap at once, is always handed its next heap before the ring fills: 300 heaps, the
// ring never full, every heap read by one of them. (Keeping 5 stalls the ring, as the spec says.)
func TestGroupMemberHoldingAQuarterNeverStallsBlock(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount, cfg.Policy = 16, ring.PolicyBlock
	p := ringtest.New(t, "hold", cfg)
	a, b := twoMembers(t, p)
	const hold = 4
	var held []ring.Heap
	var sum, n uint64
	for cnt := uint64(1); cnt <= 300; cnt++ {
		if u := p.Unread(); u >= 16 { // Acquire would wait for a release that never comes
			t.Fatalf("before heap %d: the ring is full (%d unread) while member a holds %d heaps and waits for its next", cnt, u, len(held))
		}
		publish(t, p, cnt, 64)
		got, _ := readAll(t, b, false)
		for _, c := range got {
			sum, n = sum+c, n+1
		}
		got, hs := readAll(t, a, true)
		for _, c := range got {
			sum, n = sum+c, n+1
		}
		held = append(held, hs...)
		for len(held) > hold {
			if err := a.Release(held[0]); err != nil {
				t.Fatal(err)
			}
			held = held[1:]
		}
	}
	if n != 300 || sum != 300*301/2 {
		t.Fatalf("the members read %d heaps (cnt sum %d), want each of 300 once", n, sum)
	}
}
