package ring_test

// Consumer groups, layout 2.2 (spec §14.3–§14.7): who holds the ring back, settling a departure at the
// detach, and the row reuse that follows.

import (
	"errors"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// tryPublish publishes heap cnt of size bytes, or reports false when the drop policy finds no slot.
func tryPublish(t *testing.T, p *ring.Producer, cnt uint64, size int) bool {
	t.Helper()
	pb := pattern.Publisher{P: p, Size: size, Fill: true}
	if _, err := pb.Publish(cnt, uint64(time.Now().UnixNano())); err != nil {
		if errors.Is(err, ring.ErrFull) {
			return false
		}
		t.Fatalf("publish %d: %v", cnt, err)
	}
	return true
}

// member attaches a member of group g to p (closed at the test's end).
func member(t *testing.T, p *ring.Producer, g string) *ring.Consumer {
	t.Helper()
	return ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{Group: g})
}

// withDeadline runs f and panics (failing the whole test binary at once) if it does not return within d:
// a producer looping under its lock would otherwise hang the test's cleanup too.
func withDeadline(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		panic(what + ": did not return within " + d.String())
	}
}

// TestGroupStoppedMemberAloneIsDetachedUnderDrop (spec §14.6): three members of a group and an independent
// monitor under drop; one member stops reading. Only the stopped member holds the ring back: it is
// detached as overrun, losing only its own positions (group_lost), while the monitor and the two healthy
// members stay attached and no heap is dropped.
func TestGroupStoppedMemberAloneIsDetachedUnderDrop(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 16
	p := ringtest.New(t, "stopped", cfg)
	a, b, stopped := member(t, p, "g"), member(t, p, "g"), member(t, p, "g")
	mon := ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{})
	const total = 200
	dropped, seen := 0, map[uint64]int{}
	var monGot int
	for cnt := uint64(1); cnt <= total; cnt++ {
		if !tryPublish(t, p, cnt, 64) {
			dropped++
		}
		for _, c := range []*ring.Consumer{a, b} {
			got, _ := readAll(t, c, false)
			for _, g := range got {
				seen[g]++
			}
		}
		got, _ := readAll(t, mon, false)
		monGot += len(got)
	}
	if dropped != 0 || monGot != total {
		t.Fatalf("%d heaps dropped, monitor read %d of %d: want none dropped, every heap read", dropped, monGot, total)
	}
	_, _, err := stopped.TryNext()
	var oe *ring.OverrunError
	if !errors.As(err, &oe) {
		t.Fatalf("the stopped member: %v, want an overrun", err)
	}
	lost := p.Stats().Get(ring.CounterGroupLost)
	if lost == 0 || lost > 2 || uint64(len(seen))+lost != total {
		t.Fatalf("healthy members read %d heaps, %d lost for the group: want all %d but the stopped member's 1 or 2", len(seen), lost, total)
	}
	for cnt, n := range seen {
		if n != 1 {
			t.Fatalf("heap %d read %d times", cnt, n)
		}
	}
	if st := p.Stats(); st.Get(ring.CounterConsumerOverruns) != 1 || p.Consumers() != 3 {
		t.Fatalf("%d overruns, %d attached: want only the stopped member detached", st.Get(ring.CounterConsumerOverruns), p.Consumers())
	}
}

// departedRowReused sets up the row reuse of spec §14.7 and returns the heaps the holder still holds: an
// independent holder and a member attach; first heaps are published, the holder reads and holds them, the
// member reads and releases them all (and the producer sees it); second more are published, the member
// reads none of them, the holder reads them and releases its first holderRelease heaps; the member leaves
// and a new independent consumer attaching at the oldest heap (the holder's tail) takes the member's row.
func departedRowReused(t *testing.T, p *ring.Producer, first, second, holderRelease int) (holder, n *ring.Consumer, held []ring.Heap) {
	t.Helper()
	holder = ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{})
	m, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	cnt := uint64(0)
	for range first {
		cnt++
		publish(t, p, cnt, 64)
	}
	_, held = readAll(t, holder, true)
	if got, _ := readAll(t, m, false); len(got) != first {
		t.Fatalf("the only member was handed %d heaps, want %d", len(got), first)
	}
	p.Unread() // a reclaim: the producer sees the member's releases
	for range second {
		cnt++
		publish(t, p, cnt, 64)
	}
	_, more := readAll(t, holder, true)
	held = append(held, more...)
	if holderRelease > 0 {
		if err := holder.Release(held[holderRelease-1]); err != nil {
			t.Fatal(err)
		}
		held = held[holderRelease:]
		readAll(t, holder, true) // finds nothing new: stores the released cursor
	}
	row := m.Index()
	m.Close()
	waitFor(t, func() bool { return p.Consumers() == 1 })
	n = ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{})
	if n.Index() != row {
		t.Fatalf("the new consumer took row %d, want the member's %d", n.Index(), row)
	}
	return holder, n, held
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestGroupDepartedRowReusedBehindItsReleasesDoesNotHang (spec §14.7): the new consumer in the departed
// member's row starts behind what the member had released. Publishing then returns at once: settling a
// departure never walks positions it has passed (before, the settle walked ~2^64 positions under the lock).
func TestGroupDepartedRowReusedBehindItsReleasesDoesNotHang(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 128
	p := ringtest.New(t, "reuse", cfg)
	holder, n, _ := departedRowReused(t, p, 60, 0, 0)
	withDeadline(t, 5*time.Second, "publishing after the row was reused", func() {
		for cnt := uint64(61); cnt <= 65; cnt++ {
			publish(t, p, cnt, 64)
		}
		p.Unread()
	})
	if got, _ := readAll(t, n, false); len(got) != 65 || got[0] != 1 {
		t.Fatalf("the new consumer read %d heaps from %v, want all 65 from heap 1", len(got), got[:min(len(got), 1)])
	}
	if got, _ := readAll(t, holder, false); len(got) != 5 {
		t.Fatalf("the holder read %d new heaps, want 5", len(got))
	}
}

// TestGroupDepartedRowReusedLeaksNoSlot (spec §14.7): the member left with positions assigned and not
// released, and the new consumer in its row starts between what the member released and head. Every
// slot comes back: three rings' worth of heaps later none was dropped, and both consumers read them all.
func TestGroupDepartedRowReusedLeaksNoSlot(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 16
	p := ringtest.New(t, "leak", cfg)
	// The member releases heaps 1-4, leaves with 5-12 assigned and unreleased; the holder releases 1-7,
	// so the new consumer starts at heap 8: between the member's releases and head.
	holder, n, held := departedRowReused(t, p, 4, 8, 7)
	if got, _ := readAll(t, n, false); len(got) != 5 || got[0] != 8 {
		t.Fatalf("the new consumer read %v, want heaps 8-12", got)
	}
	if err := holder.Release(held[len(held)-1]); err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for cnt := uint64(13); cnt < 13+3*16; cnt++ {
		if !tryPublish(t, p, cnt, 64) {
			dropped++
		}
		readAll(t, n, false)
		readAll(t, holder, false)
	}
	if dropped != 0 || p.FreeSlots() == 0 {
		t.Fatalf("%d heaps dropped, %d free slots: slots of the departed member's positions leaked", dropped, p.FreeSlots())
	}
	if lost := p.Stats().Get(ring.CounterGroupLost); lost != 8 {
		t.Fatalf("group_lost %d, want the 8 positions the member left unreleased", lost)
	}
}

// TestGroupIdleMemberChurnRetainsNothing (spec §14.7): members attaching and leaving on an idle ring (no
// heap published) leave nothing behind in the producer: each departure is settled at its detach.
func TestGroupIdleMemberChurnRetainsNothing(t *testing.T) {
	p := ringtest.New(t, "churn", testConfig(t))
	publish(t, p, 1, 64)
	for range 200 {
		m, err := ring.Attach(p.SocketPath(), ring.AttachOptions{Group: "g"})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	waitFor(t, func() bool { return p.Consumers() == 0 })
	if n := ring.RetainedForTest(p); n != 0 {
		t.Fatalf("the producer retains %d departed members after 200 idle attach/detach cycles, want 0", n)
	}
}
