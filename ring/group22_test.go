package ring_test

// Consumer groups, layout 2.2 (spec §14.3–§14.7): who holds the ring back, settling a departure at the
// detach, and the row reuse that follows.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

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

// TestGroupGrantsAdmitOnlyGrantedPeers (spec §14.1): with grants, another user joins a group granted to
// its uid, is refused with status 2 ("not permitted to join group NAME") for a group granted to others and
// for a group not granted at all, and still attaches as an independent consumer; root joins any group.
func TestGroupGrantsAdmitOnlyGrantedPeers(t *testing.T) {
	dir := publicDir(t)
	cfg := ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 8, SlotSize: 4096, Group: "nogroup",
		Groups: map[string]ring.GroupGrant{"work": {UIDs: []uint32{65534}}, "admins": {UIDs: []uint32{1}, GIDs: []uint32{1}}}}
	p := ringtest.New(t, "grants", cfg)
	for _, tc := range []struct{ group, want string }{
		{"work", "attached"},
		{"admins", "refused: ring grants: not permitted: ring grants: not permitted to join group admins"},
		{"other", "not permitted to join group 0x"},
		{"", "attached"},
	} {
		out, code := nobodyChild(t, "joiner", "RING_TEST_SOCKET="+p.SocketPath(), "RING_TEST_GROUP="+tc.group)
		if code != 0 || !strings.Contains(out, tc.want) && !strings.Contains(out, strings.TrimPrefix(tc.want, "refused: ring grants: not permitted: ")) {
			t.Fatalf("nobody joining %q: exit %d: %s; want %q", tc.group, code, out, tc.want)
		}
	}
	root := member(t, p, "admins") // uid 0 is always permitted
	if root.GroupID() != ring.GroupID("admins") {
		t.Fatal("root's member has no group")
	}
	if _, err := ring.Create("bad", ring.Config{Dir: t.TempDir(), Groups: map[string]ring.GroupGrant{"": {}}}); !errors.Is(err, ring.ErrBadConfig) {
		t.Fatalf("an empty group name: %v, want ErrBadConfig", err)
	}
	for _, bad := range []string{"work", "=1", "work=", "work=@nosuchgroup-xyz", "work=nosuchuser-xyz"} {
		if _, _, err := ring.ParseGroupGrant(bad); !errors.Is(err, ring.ErrBadConfig) {
			t.Errorf("ParseGroupGrant(%q): %v, want ErrBadConfig", bad, err)
		}
	}
	name, g, err := ring.ParseGroupGrant("work=65534,@0,root")
	if err != nil || name != "work" || len(g.UIDs) != 2 || g.UIDs[0] != 65534 || g.UIDs[1] != 0 || len(g.GIDs) != 1 || g.GIDs[0] != 0 {
		t.Fatalf("ParseGroupGrant: %q %+v %v", name, g, err)
	}
}

// TestGroupBlockNamesWhomItWaitsFor (spec §14.6): a block producer waiting for a member that reads nothing
// stores its row + 1 in ctl blocked_on and when the wait began in blocked_since_ns, and its log names the
// row, the pid and the group within a second; when the member reads, the words go back to 0.
func TestGroupBlockNamesWhomItWaitsFor(t *testing.T) {
	cfg := testConfig(t)
	cfg.Policy = ring.PolicyBlock
	cfg.Groups = map[string]ring.GroupGrant{"work": {}}
	var logBuf lockedWriter
	lg := zerolog.New(&logBuf)
	cfg.Log = &lg
	p := ringtest.New(t, "blocked", cfg)
	mon := ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{})
	m := member(t, p, "work")
	for cnt := uint64(1); cnt <= 8; cnt++ {
		publish(t, p, cnt, 64)
	}
	readAll(t, mon, false)
	ctl := ring.CtlForTest(p)
	blockedOn := func() uint32 { return binary.LittleEndian.Uint32(ctl[0x310:]) }
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); publish(t, p, 9, 64) }()
	waitFor(t, func() bool { return blockedOn() != 0 })
	since := binary.LittleEndian.Uint64(ctl[0x318:])
	if blockedOn() != uint32(m.Index()+1) || since < uint64(start.UnixNano()) || since > uint64(time.Now().UnixNano()) {
		t.Fatalf("blocked_on %d since %d, want row %d + 1 since the wait began", blockedOn(), since, m.Index())
	}
	want := fmt.Sprintf(`"row":%d,"consumer_pid":%d,"group":"work"`, m.Index(), os.Getpid())
	for !strings.Contains(logBuf.String(), want) {
		if time.Since(start) > time.Second+200*time.Millisecond {
			t.Fatalf("no log line naming %s within a second: %q", want, logBuf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	info, err := ring.Inspect(p.SocketPath(), "")
	if err != nil || info.BlockedOn != m.Index()+1 {
		t.Fatalf("stat: blocked on %d (%v), want row %d + 1", info.BlockedOn, err, m.Index())
	}
	readAll(t, m, false)
	<-done
	if blockedOn() != 0 || binary.LittleEndian.Uint64(ctl[0x318:]) != 0 {
		t.Fatalf("blocked_on %d after the wait ended, want 0", blockedOn())
	}
}

// TestGroupMemberRowsPublishReadQueuedSkipped (spec §14.2, §14.7): a member's row shows its hello's minor,
// the read position and queued count the producer accepted, and skipped — its positions it released
// without handing them out, summed in group_skipped.
func TestGroupMemberRowsPublishReadQueuedSkipped(t *testing.T) {
	p := ringtest.New(t, "rows", testConfig(t))
	a, b := twoMembers(t, p)
	for cnt := uint64(1); cnt <= 4; cnt++ { // both idle: a gets 1 and 3, b 2 and 4 (round robin)
		publish(t, p, cnt, 64)
	}
	readAll(t, a, false)
	p.Unread() // a cursor read
	start := a.HeadForTest() - 4
	if m := rowField(p, a.Index(), 0x44, 4); m != 2 {
		t.Fatalf("row client_minor %d, want 2", m)
	}
	if r, q := rowField(p, a.Index(), 0x48, 8), rowField(p, a.Index(), 0x50, 8); r != start+4 || q != 0 {
		t.Fatalf("a's row: read %d queued %d, want %d and 0", r-start, q, 4)
	}
	if r, q := rowField(p, b.Index(), 0x48, 8), rowField(p, b.Index(), 0x50, 8); r != start || q != 2 {
		t.Fatalf("b's row: read %d queued %d, want 0 and 2", r-start, q)
	}
	// b releases its two positions without handing them out: a thief, or a consumer misused.
	ring.ReleaseUnreadForTest(b, start+4)
	p.Unread()
	if s := rowField(p, b.Index(), 0x58, 8); s != 2 || p.Stats().Get(ring.CounterGroupSkipped) != 2 || rowField(p, a.Index(), 0x58, 8) != 0 {
		t.Fatalf("b skipped %d, group_skipped %d, a skipped %d: want 2, 2, 0", s, p.Stats().Get(ring.CounterGroupSkipped), rowField(p, a.Index(), 0x58, 8))
	}
}

// TestGroupMemberWokenOnlyForItsOwnPositions (spec §14.4): a sleeping 2.2 member is not woken for a
// position assigned to another member, and is woken for its own.
func TestGroupMemberWokenOnlyForItsOwnPositions(t *testing.T) {
	p := ringtest.New(t, "ownwake", testConfig(t))
	a, b := twoMembers(t, p)
	publish(t, p, 1, 64) // both idle, neither picked yet: a (attached first)
	if got, _ := readAll(t, a, false); len(got) != 1 {
		t.Fatalf("a read %v, want heap 1", got)
	}
	got := make(chan uint64, 1)
	go func() {
		h, err := a.Next(5 * time.Second)
		if err != nil {
			t.Error(err)
		} else {
			a.Release(h) // before the test goes on: a consumer is not safe for concurrent use
		}
		got <- h.HeapCnt
	}()
	waitFor(t, func() bool { return ring.WaitingForTest(a) })
	wakes := a.Wakes()
	publish(t, p, 2, 64) // both idle: b, picked less recently
	time.Sleep(50 * time.Millisecond)
	if w := a.Wakes(); w != wakes || !ring.WaitingForTest(a) {
		t.Fatalf("a was woken %d times for heap 2, b's", w-wakes)
	}
	if g, _ := readAll(t, b, false); len(g) != 1 || g[0] != 2 {
		t.Fatalf("b read %v, want heap 2", g)
	}
	publish(t, p, 3, 64) // a's turn
	select {
	case cnt := <-got:
		if cnt != 3 || a.Wakes() != wakes+1 {
			t.Fatalf("a woke %d times with heap %d, want once with heap 3", a.Wakes()-wakes, cnt)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a was not woken for its own heap")
	}
}

// TestGroup21MemberTreatedBy21Rules (spec §14.1, §14.9): a member whose hello says minor 1 is held to 2.1's
// rules: whatever its region's read word says, the producer takes its tail as its read, so the heap it
// holds counts as queued and the next positions go to the 2.2 member that has nothing queued.
func TestGroup21MemberTreatedBy21Rules(t *testing.T) {
	p := ringtest.New(t, "v21", testConfig(t))
	ring.SetHelloMinorForTest(t, 1)
	old := member(t, p, "g")
	ring.SetHelloMinorForTest(t, ring.MinorVersion)
	cur := member(t, p, "g")
	publish(t, p, 1, 64) // both idle: the 2.1 member, attached first
	_, held := readAll(t, old, true)
	if len(held) != 1 {
		t.Fatalf("the 2.1 member was handed %d heaps, want heap 1", len(held))
	}
	for cnt := uint64(2); cnt <= 4; cnt++ {
		publish(t, p, cnt, 64)
		readAll(t, cur, false)
	}
	if m, r, rel := rowField(p, old.Index(), 0x44, 4), rowField(p, old.Index(), 0x48, 8), rowField(p, old.Index(), 0x20, 8); m != 1 || r != rel {
		t.Fatalf("2.1 member's row: minor %d, read %d, released %d: want minor 1, read = released", m, r, rel)
	}
	if got, _ := readAll(t, old, true); len(got) != 0 {
		t.Fatalf("the 2.1 member holding a heap was handed %v, want nothing (its held heap counts as queued)", got)
	}
}

// TestGroupMemberHostileReadHarmsOnlyItself (spec §14.2): a member's read word past head or before its tail
// is taken as its tail, one that moves back is counted afresh: no detach, no stall, and the other member
// and the ring go on.
func TestGroupMemberHostileReadHarmsOnlyItself(t *testing.T) {
	p := ringtest.New(t, "hostileread", testConfig(t))
	bad, good := twoMembers(t, p)
	total := 0
	for cnt := uint64(1); cnt <= 40; cnt++ {
		switch cnt % 4 {
		case 0:
			ring.StoreReadForTest(bad, bad.HeadForTest()+1000) // past head
		case 1:
			ring.StoreReadForTest(bad, 0) // before its tail (wraps)
		case 2:
			ring.StoreReadForTest(bad, bad.HeadForTest()-1) // back, within [tail, head]
		}
		if !tryPublish(t, p, cnt, 64) {
			t.Fatalf("heap %d dropped", cnt)
		}
		got, _ := readAll(t, good, false)
		total += len(got)
		if h, ok, err := bad.TryNext(); err != nil {
			t.Fatalf("the member writing nonsense into read: %v", err)
		} else if ok {
			bad.Release(h)
		}
	}
	ring.StoreReadForTest(bad, bad.HeadForTest()+1000)
	p.Unread() // a cursor read
	if r, rel := rowField(p, bad.Index(), 0x48, 8), rowField(p, bad.Index(), 0x20, 8); r != rel {
		t.Fatalf("a read past head was accepted as %d (tail %d), want taken as the tail", r, rel)
	}
	if total == 0 || p.Consumers() != 2 {
		t.Fatalf("the good member read %d heaps, %d consumers attached: want some, both", total, p.Consumers())
	}
}

// TestGroupFirstMemberStartsAfterEveryUnassignedPosition (spec §14.1, §14.3): the first member of any group
// attaches while the hot path commits without groups (no lock, no assignment). Every position from the
// member's start on must carry its bit: one published by a commit that had not seen the member carries
// none, and no member reads it nor counts it lost (the heap one short that group tests found).
func TestGroupFirstMemberStartsAfterEveryUnassignedPosition(t *testing.T) {
	cfg := testConfig(t)
	cfg.SlotCount = 64
	cfg.Policy = ring.PolicyDrop
	p := ringtest.New(t, "firstmember", cfg)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the hot path: small heaps, one commit each, as fast as it can
		defer close(done)
		for cnt := uint64(1); ; cnt++ {
			select {
			case <-stop:
				return
			default:
			}
			if !tryPublish(t, p, cnt, 64) {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for i := 0; i < 2000; i++ {
		c := ringtest.Attach(t, p.SocketPath(), ring.AttachOptions{Group: "g"})
		start, bit := c.TailForTest(), uint64(1)<<c.Index()
		waitFor(t, func() bool { return c.HeadForTest()-start >= 4 })
		for q := start; q != start+4; q++ {
			if a := p.AssignForTest(q); a&bit == 0 {
				t.Fatalf("attach %d: position %d (the member's start %d) assigned %#x, not to the member (bit %#x)", i, q, start, a, bit)
			}
		}
		c.Close()
		waitFor(t, func() bool { return p.Consumers() == 0 })
	}
}
