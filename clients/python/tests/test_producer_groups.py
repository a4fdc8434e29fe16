"""Consumer groups (spec §14) on the Python producer (ibvbridge.Producer): assignment, reclaim per member,
the window and a departing member's group_lost, read by the Python client's members."""

import functools
import os
import socket
import time

import numpy as np
import pytest

from ibvbridge import layout as L
from ibvbridge import Overrun, Ring, Timeout
from fake_producer import until


@pytest.fixture
def make(make_public_producer):
    return functools.partial(make_public_producer, "g", slot_count=16)


def payload(cnt):
    return ((np.arange(200, dtype=np.uint32) + cnt * 31) & 0xFF).astype(np.uint8)


def publish(p, cnts, timeout=None):
    cnts = list(cnts)
    return p.publish_batch(np.stack([payload(c) for c in cnts]), cnts, items=[(0x1000, 0, 200, 0)],
                           timeout=timeout)


def drain(ring, cnts=None, hold=False):
    """heap_cnts of every heap ring can read now, each verified (released unless hold)."""
    got = [] if cnts is None else cnts
    while True:
        try:
            h = ring.next(timeout=0)
        except Timeout:
            return got
        if h.end_of_stream:
            return got
        assert bytes(h.payload[:200]) == payload(h.heap_cnt).tobytes()
        got.append(h.heap_cnt)
        if not hold:
            h.release()


def attach(p, group=None):
    return Ring.attach(p.socket_path, timeout=2.0, group=group)


def test_members_share_every_heap_once_and_an_independent_consumer_reads_all(make):
    p = make()
    a, b, mon = attach(p, "work"), attach(p, "work"), attach(p)
    got_a, got_b, got_mon = [], [], []
    for start in range(1, 101, 10):  # 100 heaps through a 16-slot ring: slots come back per member
        assert publish(p, range(start, start + 10)) == 10
        drain(a, got_a), drain(b, got_b), drain(mon, got_mon)
    assert got_a and got_b and not set(got_a) & set(got_b)
    assert sorted(got_a + got_b) == list(range(1, 101)) and got_mon == list(range(1, 101))
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    ra, rb, rm = p.row(a.consumer_index), p.row(b.consumer_index), p.row(mon.consumer_index)
    assert ra["group_id"] == rb["group_id"] == L.group_id("work") and rm["group_id"] == 0
    assert (ra["assigned"], rb["assigned"], rm["assigned"]) == (len(got_a), len(got_b), 0)
    assert p.stats()["group_lost"] == 0 and p.stats()["dropped_heaps"] == 0
    assert int.from_bytes(p.ctl[L.OFF_STATS_COUNT:L.OFF_STATS_COUNT + 4], "little") == 20  # 2.2: through streams_ended
    p.end_of_stream()
    for r in (a, b, mon):
        with pytest.raises(Exception):  # EndOfStream (a member sees the marker too)
            r.next(timeout=1)
        r.close()


def test_a_member_that_read_everything_shares_the_next_heaps_whatever_it_holds(make):
    """Spec §14.3 (2.2): from facts — b read its three heaps and holds them, a read and released its own:
    neither has anything queued, so the next heaps go round robin, a (picked least recently) first."""
    p = make()
    a, b = attach(p, "work"), attach(p, "work")
    publish(p, range(1, 7))
    assert drain(b, hold=True) == [2, 4, 6]  # ties alternate, a (lower row) first
    assert drain(a) == [1, 3, 5]
    publish(p, range(7, 11))
    assert drain(a) == [7, 9] and drain(b) == [8, 10]
    p._beat()  # the producer reads the members' cursors (every 100 ms, and before it assigns)
    ra, rb = p.row(a.consumer_index), p.row(b.consumer_index)
    assert (ra["client_minor"], rb["client_minor"]) == (L.MINOR_VERSION, L.MINOR_VERSION)
    assert ra["queued"] == rb["queued"] == 0 and ra["read"] == rb["read"] == 10
    a.close(), b.close()


def test_a_member_that_stopped_reading_gets_no_more_than_the_busiest_other(make):
    """Spec §14.3: a member that stopped reading gets at most as many positions queued as the busiest of
    the others, and nothing once they drain theirs."""
    p = make(slot_count=64)
    a, b, c = attach(p, "w"), attach(p, "w"), attach(p, "w")
    publish(p, range(1, 10))  # 3 each; a reads nothing from now on
    assert len(drain(b)) == 3 and len(drain(c)) == 3
    got = []
    for cnt in range(10, 30):  # b and c drain theirs: a, with 3 queued, gets nothing
        publish(p, [cnt])
        drain(b, got), drain(c, got)
    assert sorted(got) == list(range(10, 30))
    publish(p, range(30, 39))  # b and c stop too: they take 3 each, then all three are level
    p._beat()
    assert [p.row(m.consumer_index)["queued"] for m in (a, b, c)] == [4, 4, 4]
    assert len(drain(a)) == 4
    a.close(), b.close(), c.close()


def test_a_2_1_member_is_assigned_by_what_it_holds(make):
    """Spec §14.9: a 2.1 member (hello minor 1) publishes no read; its read is its tail, so the heaps it
    holds count as queued (2.1's rule: fewest outstanding)."""
    p = make()
    old = attach_minor(p, "w", 1)
    new = attach(p, "w")
    assert p.row(old.consumer_index)["client_minor"] == 1
    publish(p, range(1, 5))
    held = drain(old, hold=True)  # a 2.1 client's read is invisible: the producer sees held = queued
    assert held == [1, 3] and drain(new) == [2, 4]
    publish(p, range(5, 8))  # new reaches old's 2 queued, then the tie goes to old (picked least recently)
    assert drain(new) == [5, 6] and drain(old) == [7]
    old.close(), new.close()


def attach_minor(p, group, minor):
    """A member whose hello says minor (a 2.1 client: it publishes no read nor handed)."""
    orig = L.pack_hello

    def hello(*a, **kw):
        kw["minor"] = minor
        return orig(*a, **kw)
    L.pack_hello = hello
    try:
        r = attach(p, group)
    finally:
        L.pack_hello = orig
    r._group_bit_minor = minor
    r._publish_progress = lambda: None  # a 2.1 client does not know read and handed
    return r


def test_member_leaving_loses_its_heaps_and_its_row_inherits_none(make):
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    ia = a.consumer_index
    publish(p, range(1, 9))
    got_b = drain(b)
    assigned_a = p.row(ia)["assigned"]
    assert got_b and assigned_a > 1 and len(got_b) + assigned_a == 8
    h = a.next(timeout=1)  # a reads one of its heaps and releases it, then leaves
    first_a = h.heap_cnt
    h.release()
    a.close()
    for _ in range(5000):  # the serving thread notices the closed socket
        if p.stats()["group_lost"] == assigned_a - 1 and p.consumers == 1:
            break
        time.sleep(0.001)
    assert p.stats()["group_lost"] == assigned_a - 1 and p.consumers == 1
    c = attach(p, "g")
    assert c.consumer_index == ia  # the departed member's row
    publish(p, range(9, 17))
    got_c = drain(c)
    drain(b, got_b)
    assert got_c and min(got_c) > 8  # nothing of the departed member's
    assert first_a not in got_b + got_c and not set(got_b) & set(got_c)
    assert len(got_b) + len(got_c) == 16 - (assigned_a - 1) - 1
    assert p.row(ia)["assigned"] == len(got_c)
    assert publish(p, range(17, 33)) == 16  # every slot came back: a whole ring more without a drop
    assert p.stats()["dropped_heaps"] == 0 and p.stats()["group_lost"] == assigned_a - 1
    b.close(), c.close()


def test_member_a_ring_behind_is_overrun_not_overwritten(make):
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    held, got_b = None, []
    for cnt in range(1, 41):
        assert publish(p, [cnt]) == 1
        if held is None:
            try:
                held = a.next(timeout=0)  # a holds this heap and reads nothing more
            except Timeout:
                pass
        if cnt == 16:
            assert p.stats()["consumer_overruns"] == 0
        drain(b, got_b)
    assert held is not None
    st = p.stats()
    assert st["consumer_overruns"] == 1 and st["dropped_heaps"] == 0
    assert st["group_lost"] >= 1 and len(got_b) + st["group_lost"] == 40
    assert not held.valid
    with pytest.raises(Overrun):
        a.next(timeout=0)
    a.close(), b.close()


def test_member_holding_under_a_quarter_never_stalls_block(make):
    """Spec §14's starvation rule: a member that keeps its last 3 heaps (under a quarter of 16 slots) and reads
    a fourth before it releases the oldest, beside one that releases at once, is handed its next heap before
    the ring fills (else publish would wait for a release that never comes: Timeout)."""
    p = make(policy="block")
    a, b = attach(p, "g"), attach(p, "g")
    held, got = [], []
    for cnt in range(1, 301):
        assert publish(p, [cnt], timeout=10) == 1
        drain(b, got)
        while True:
            try:
                h = a.next(timeout=0)
            except Timeout:
                break
            assert bytes(h.payload[:200]) == payload(h.heap_cnt).tobytes()
            got.append(h.heap_cnt)
            held.append(h)
        while len(held) > 3:
            held.pop(0).release()
    assert sorted(got) == list(range(1, 301))
    a.close(), b.close()


def test_group_holes_are_not_read_by_a_new_consumer(make):
    """Positions are freed out of order (spec §14), so an independent consumer attaching with start = 0
    begins at oldest, where every published position still holds its slot: member a holds heap 1, member b
    released heaps 2 and 4, and the new consumer reads from heap 5 on, never the freed holes."""
    p = make(policy="drop")
    a, b = attach(p, "g"), attach(p, "g")
    publish(p, range(1, 5))
    ha = a.next(timeout=0)
    assert ha.heap_cnt == 1  # held
    assert drain(b) == [2, 4]
    publish(p, [5])  # its commit reclaims what b released
    assert p.oldest == 4
    mon = attach(p)
    publish(p, [6])
    assert drain(mon) == [5, 6]
    assert ha.valid and bytes(ha.payload[:200]) == payload(1).tobytes()
    h = a.next(timeout=0)  # a's other heap (3) kept its slot
    assert h.heap_cnt == 3 and bytes(h.payload[:200]) == payload(3).tobytes()
    mon.close(), a.close(), b.close()


def test_observer_in_a_group_and_nonzero_reserved_bytes_are_refused_status_5(make):
    p = make()

    def status(hello):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(p.socket_path)
            s.send(hello)
            msg, _, _, _ = socket.recv_fds(s, 1024, 4)
            return int.from_bytes(msg[12:16], "little")

    assert status(L.pack_hello(role=L.ROLE_OBSERVER, group_id=7)) == L.STATUS_PROTOCOL
    bad = bytearray(L.pack_hello(group_id=7))
    bad[0x18] = 1
    assert status(bytes(bad)) == L.STATUS_PROTOCOL
    assert status(L.pack_hello(group_id=7)) == 0  # a member is welcome


def test_drop_detaches_only_the_stalled_member_whatever_the_attach_order(make):
    """Spec §14.6: under drop, the consumers holding the ring back are detached when another is not among
    them — here the stalled member attached between an independent consumer and the other member, and
    neither of those loses a heap."""
    p = make(policy="drop")
    mon = attach(p)
    a = attach(p, "g")
    b = attach(p, "g")
    held, got_b, got_mon = None, [], []
    for cnt in range(1, 61):
        assert publish(p, [cnt]) == 1
        if held is None:
            try:
                held = a.next(timeout=0)  # a holds its first heap and reads nothing more
            except Timeout:
                pass
        drain(b, got_b), drain(mon, got_mon)
    st = p.stats()
    assert st["consumer_overruns"] == 1 and st["dropped_heaps"] == 0
    assert p.row(a.consumer_index)["state"] == L.CONSUMER_OVERRUN
    assert got_mon == list(range(1, 61)) and len(got_b) + st["group_lost"] == 60
    with pytest.raises(Overrun):
        a.next(timeout=0)
    a.close(), b.close(), mon.close()


def test_block_names_the_member_it_waits_for_in_ctl_and_in_the_log_within_a_second(make, caplog):
    """Spec §14.6: a block producer held back by a stalled member waits on it, stores its row + 1 in ctl
    blocked_on and when it began in blocked_since_ns, and logs whom it waits for (row, pid, group,
    position) within a second; when the member leaves (settled at the detach, §14.7) it goes on."""
    import threading
    p = make(policy="block", groups={"w": [0]})
    a, b = attach(p, "w"), attach(p, "w")
    held = []
    done = threading.Event()

    def run():
        for cnt in range(1, 41):
            publish(p, [cnt], timeout=10)
            drain(b)
        done.set()
    caplog.set_level("WARNING", logger="ibvbridge.producer")
    t0 = time.time_ns()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    until(lambda: held or not held.append(a.next(timeout=1)))  # a takes one heap and stops reading
    until(lambda: p.c32[L.OFF_BLOCKED_ON >> 2] != 0, timeout=5)
    assert p.c32[L.OFF_BLOCKED_ON >> 2] == a.consumer_index + 1
    since = p.c64[L.OFF_BLOCKED_SINCE_NS >> 3]
    assert t0 <= since <= time.time_ns()
    until(lambda: any("waiting for consumer row" in r.getMessage() for r in caplog.records),
          timeout=(since + 1_000_000_000 - time.time_ns()) / 1e9 + 0.05)
    line = next(r.getMessage() for r in caplog.records if "waiting for consumer row" in r.getMessage())
    assert f"row {a.consumer_index} (pid {os.getpid()}, group w)" in line
    assert not done.is_set()
    held[0].release()
    a.close()  # the member leaves: what it had queued is lost for the group, and the producer goes on
    assert done.wait(10)
    t.join(5)
    assert p.c32[L.OFF_BLOCKED_ON >> 2] == 0 and p.c64[L.OFF_BLOCKED_SINCE_NS >> 3] == 0
    assert p.stats()["heaps"] == 40 and p.stats()["dropped_heaps"] == 0
    b.close()


def test_a_member_that_releases_its_share_unread_shows_as_skipped(make):
    """Spec §14.7: released assigned positions minus handed is what a 2.2 member let go unread: its row's
    skipped, summed (with departed members') in group_skipped."""
    p = make()
    honest, thief = attach(p, "w"), attach(p, "w")
    publish(p, range(1, 11))
    assert len(drain(honest)) == 5 and len(drain(thief)) == 5
    thief._handed = 0  # as a consumer that releases without handing anything out would report
    thief._flush_release()
    publish(p, [11])  # the producer reads the cursors before it assigns
    assert p.row(thief.consumer_index)["skipped"] == 5 and p.row(honest.consumer_index)["skipped"] == 0
    assert p.stats()["group_skipped"] == 5
    thief.close()
    until(lambda: p.consumers == 1)
    publish(p, [12])
    assert p.stats()["group_skipped"] == 5  # a departed member's stays counted
    honest.close()


def test_a_sleeping_member_is_woken_only_for_its_own_positions(make):
    """Spec §14.4 (2.2): a member asleep in next() is woken when a position assigned to it is published,
    not for the other members' positions (2.1 woke it for every heap)."""
    import threading
    p = make(slot_count=64)
    a, b = attach(p, "w"), attach(p, "w")
    got_a = []

    def run():
        for h in a:
            got_a.append(h.heap_cnt)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    asleep = lambda: p.conns[a.consumer_index].r32[L.REG_CONSUMER_WAITING >> 2] == 1  # noqa: E731
    got_b = []
    for cnt in range(1, 21):
        until(asleep)
        n = len(got_a)
        publish(p, [cnt])
        if p.row(a.consumer_index)["assigned"] > n:
            until(lambda: len(got_a) > n)
        drain(b, got_b)
    until(asleep)
    assert sorted(got_a + got_b) == list(range(1, 21)) and got_a and got_b
    assert p.row(a.consumer_index)["wakes"] == len(got_a)
    p.end_of_stream()
    t.join(5)
    a.close(), b.close()


def _as_nobody(code, env=None):
    """Run python code as nobody (uid/gid 65534, no other groups); (returncode, stdout, stderr)."""
    import subprocess
    import sys
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                       env=dict(os.environ, PYTHONPATH=pkg, **(env or {})), capture_output=True, text=True,
                       timeout=30)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def public_dir():
    """A ring directory nobody can reach (0755, owned by root, outside pytest's 0700 tree), removed after."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="ibvb-grant-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as nobody")
def test_grants_admit_the_granted_and_refuse_others_with_status_2(make_public_producer, public_dir):
    """Spec §14.1: with grants, a hello for a group whose grant does not name the peer (uid, primary gid
    or SO_PEERGROUPS) is refused with status 2, "not permitted to join group NAME"; a group that is not
    granted at all likewise; root is always permitted; consumers without a group are admitted as before."""
    p = make_public_producer("g", directory=public_dir, group=65534,
                             groups={"byuid": [65534], "bygid": ["@65534"], "closed": [1234]})
    code = ("import ibvbridge, sys\n"
            "for g in sys.argv[1:] if False else %r:\n"
            "    try:\n"
            "        r = ibvbridge.Ring.attach(%r, timeout=5, group=g or None); print(g, 'ok', r.group_id); r.close()\n"
            "    except ibvbridge.PermissionDenied as e:\n"
            "        print(g, 'refused', str(e).replace(chr(10), ' '))\n") % (["byuid", "bygid", "closed", "other", ""],
                                                                           p.socket_path)
    rc, out, err = _as_nobody(code)
    assert rc == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert lines["byuid"].startswith("ok") and lines["bygid"].startswith("ok")
    assert "refused" in lines["closed"] and "not permitted to join group closed" in lines["closed"]
    assert "refused" in lines["other"] and "not permitted to join group" in lines["other"]
    assert lines[""].startswith("ok")  # no group: admitted as before
    assert any(st == L.STATUS_NOT_PERMITTED for st, _ in p.refused)
    with attach(p, "closed") as r:  # root is always permitted
        assert p.row(r.consumer_index)["group_id"] == L.group_id("closed")


def test_grants_are_checked_when_the_producer_starts(make_public_producer):
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        make_public_producer("g", groups={"x" * 65: [0]})
    with pytest.raises(ValueError, match="not a uid"):
        make_public_producer("g", groups={"w": [-1]})
    with pytest.raises(Exception, match="does not exist"):
        make_public_producer("g", groups={"w": ["@no-such-group-here"]})


def test_group_names_are_1_to_64_bytes_of_utf8(make):
    """Spec §14.1: a group's name is hashed as its UTF-8 bytes, 1 ... 64 of them: a longer one is refused
    before anything is sent; a non-ASCII one is its UTF-8 bytes' hash."""
    p = make()
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        attach(p, "é" * 33)  # 66 bytes
    with attach(p, "é" * 32) as r:
        assert r.group_id == L.group_id("é" * 32) and p.row(r.consumer_index)["group_id"] == r.group_id
    h = 0x811C9DC5
    for c in "é".encode("utf-8"):
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    assert L.group_id("é") == h


def test_produce_cli_grants_consumer_groups(tmp_path):
    """python -m ibvbridge.produce --consumer-group NAME=UID|@GID[,...] (repeatable) is Producer(groups=);
    a malformed one is one line on stderr and exit 1."""
    import subprocess
    import sys
    from ibvbridge.produce import parse_consumer_groups
    assert parse_consumer_groups([]) is None
    assert parse_consumer_groups(["w=1001,@2000", "w=root", "x=@wheel"]) == {"w": [1001, "@2000", "root"],
                                                                             "x": ["@wheel"]}
    for bad in ("w", "w=", "=1", "w=1,,2"):
        with pytest.raises(ValueError, match="--consumer-group"):
            parse_consumer_groups([bad])
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "ibvbridge.produce", "--ring", "cg", "--dir", str(tmp_path), "--heaps",
                        "0", "--hugepages", "off", "--consumer-group", "w=1,"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=pkg), timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--consumer-group 'w=1,'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ibvbridge.produce", "--ring", "cg", "--dir", str(tmp_path), "--heaps",
                        "0", "--hugepages", "off", "--consumer-group", "w=0,@0"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=pkg), timeout=60)
    assert r.returncode == 0, r.stderr


def test_vectorised_assignment_equals_the_rule_applied_one_position_at_a_time():
    """producer._round_robin (a whole publish_batch at once) picks exactly what spec §14.3's rule picks one
    position at a time: the fewest queued, ties to the one picked least recently, each pick queued."""
    import random
    from ibvbridge.producer import _round_robin

    def one_at_a_time(queued, last, k):
        queued, last, out = list(queued), list(last), []
        t = max(last) + 1
        for _ in range(k):
            b = min(range(len(queued)), key=lambda i: (queued[i], last[i]))
            out.append(b)
            queued[b] += 1
            last[b] = t
            t += 1
        return out
    rnd = random.Random(7)
    for _ in range(2000):
        n = rnd.randint(1, 7)
        queued = [rnd.choice((0, 0, 1, 2, 5, 40)) for _ in range(n)]
        last = rnd.sample(range(1000), n)
        k = rnd.randint(1, 60)
        choice, counts, lastidx = _round_robin(queued, last, k)
        want = one_at_a_time(queued, last, k)
        assert choice.tolist() == want
        assert counts == [want.count(i) for i in range(n)]
        assert lastidx == [max((j for j, x in enumerate(want) if x == i), default=-1) for i in range(n)]


def test_single_position_assignment_equals_the_vectorised_one():
    """The single-heap publish's assignment (_assign_one_locked) leaves members, rows, picks and the assign
    word exactly as the vectorised one (_assign_run_locked) does for a run of one: ties on queued and last
    pick among members never picked included, several groups, and the END_OF_STREAM marker (nobody's)."""
    import copy
    import random
    from types import SimpleNamespace as NS

    import numpy as np

    from ibvbridge import layout as L
    from ibvbridge.producer import M64, Producer

    def state(members, q, picks, eos):
        s = NS(mask=7, desc=np.zeros(8, L.DESC_DTYPE), _picks=picks, _pos_need=np.zeros(8, np.uint64), rows={})
        s.desc["flags"][q & 7] = L.FLAG_END_OF_STREAM if eos else L.FLAG_COMPLETE
        s.row_set = lambda i, **kw: s.rows.setdefault(i, []).append(kw)
        groups = {}
        for m in members:
            groups.setdefault(m.group, []).append(m)
        return s, groups

    def view(s, members):
        return ([vars(m) for m in members], s._picks, s.desc["assign"].tolist(), s._pos_need.tolist(), s.rows)

    rnd = random.Random(11)
    for _ in range(3000):
        n = rnd.randint(1, 7)
        members = [NS(index=i, group=rnd.choice((0x11, 0x22)), queued=rnd.choice((0, 0, 1, 3)),
                      last_pick=rnd.choice((0, 0, 4, 9)), oq=None, assigned=rnd.randint(0, 5), commit_end=None)
                   for i in sorted(rnd.sample(range(12), n))]
        q = rnd.choice((0, 5, M64, M64 - 3))
        picks, eos = rnd.randint(9, 20), rnd.random() < 0.1
        other = copy.deepcopy(members)
        a, ga = state(members, q, picks, eos)
        b, gb = state(other, q, picks, eos)
        Producer._assign_one_locked(a, q, ga)
        Producer._assign_run_locked(b, q, 1, gb)
        assert view(a, members) == view(b, other)
