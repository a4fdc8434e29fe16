"""The ring simulation's replay stream played against the Python producer (internal/ringsim/replay.go).

    go run ./internal/ringsim/simlog -seeds 100 -steps 3000 | PYTHONPATH=clients/python \
        /usr/bin/python3 clients/python/tests/sim_replay.py

Reads the stream (32-byte records, the format in the comment at the top of internal/ringsim/replay.go) on
stdin and makes every call it records of an ibvbridge.Producer in this process, comparing each answer with
the model's as it goes. Nothing runs beside it: the producer is made without its serving thread (serve=False),
so no heartbeat reads cursors or notices a hang-up between two records — the stream says when cursors are
read ('S', 'F') and when a connection ends ('C'), and the producer does then exactly what its serving thread
does (_read_cursors_locked, _consumer_left). A consumer is admitted by the producer's own _answer, over a
socketpair (SO_PEERCRED says this process), and the welcome it sends is what is compared; its region is the
producer's own mapping of it (shared memory: the consumer's stores are the same words). Nothing waits: a
block publish tries once (acquire with a zero timeout: its reclaim and its wait's first look) and is "pending"
if no slot is free, and is tried again at each 'S', before the cursors are read.

Where the spec lets the producer choose (§7.1: the start of an independent consumer attaching with start 0;
this producer's is its oldest) the producer first reclaims, when any consumer is attached, as the model does
at once; a consumer it then started before the recorded start releases up to it at once; one started after
it cannot follow the stream, and its scenario is cut short there (counted).

Prints "ok STEPS SCENARIOS CUT" (the steps played, the scenarios begun, those cut short) and exits 0 at the
stream's end record; at the first difference prints one line "seed S step K: WHAT: got G, want W" and exits
1; a stream that is not one (truncated, an unknown record) gets one line on stderr and exit 2."""

import logging
import os
import shutil
import socket
import struct
import sys
import tempfile
from functools import partial
from itertools import chain

from ibvbridge import layout as L
from ibvbridge.errors import RingFull, Timeout
from ibvbridge.producer import Producer
from ibvbridge.shared import I_CONSUMER_WAITING, M64, Q_HANDED, Q_HEAD, Q_READ, Q_TAIL, Q_WAKE_AT

RECORD = struct.Struct("<BBHIQQQ")
BLOCK = RECORD.size << 15  # records read at once
RESULTS = ("published", "dropped", "pending", "full")
# 'W' fields (replay.go): tail, read, handed, wake_at as 64-bit words, consumer_waiting as a 32-bit one
STORE_Q = (Q_TAIL, Q_READ, Q_HANDED, Q_WAKE_AT)
ASSIGN = 0x38  # the assign word's offset in a descriptor (spec §4)
_WELCOME = struct.Struct("<III")  # status, consumer_index, generation
assert (L.WELCOME_STATUS + 4, L.WELCOME_STATUS + 8) == (L.WELCOME_CONSUMER_INDEX, L.WELCOME_GENERATION)
_ROW_FIELD = {getattr(L, "ROW_" + f.upper()): f for f in L.ROW_FIELDS}


class Difference(Exception):
    """The producer answered otherwise than the model: what, got, want."""


class Cut(Exception):
    """The producer chose a start the spec allows and the stream cannot follow (Replay.attach)."""


class BadStream(Exception):
    """The input is not a replay stream."""


def word_name(off):
    """A control-memory word by name: head, a counter, a row's field (spec §2)."""
    if off == L.OFF_HEAD:
        return "head"
    if L.OFF_STATS <= off < L.OFF_STATS + 8 * L.STATS_COUNT:
        return L.COUNTER_NAMES[(off - L.OFF_STATS) >> 3]
    if off >= L.OFF_CONSUMER_TABLE:
        row, f = divmod(off - L.OFF_CONSUMER_TABLE, L.ROW_SIZE)
        return f"row {row} {_ROW_FIELD.get(f, hex(f))}"
    return f"ctl word {off:#x}"


class Replay:
    """One producer at a time, as the 'N' records make them, and the consumers admitted to it."""

    def __init__(self, directory):
        self.dir = directory
        self.p = None
        self.members = {}  # row -> the Member admitted there by the last 'A' (what its 'C' closes)
        self.pending = False
        self.views = ()
        self.rebased = 0  # consumers moved to the model's start (a start §7.1 lets producers choose)
        self.cut = 0  # scenarios cut short at such a start the consumer cannot move to

    def new(self, policy, rows, slots, start):
        self.close()
        self.p = p = Producer("sim", slot_count=slots, slot_size=64, max_items=1, meta_size=4096,
                              policy="block" if policy else "drop", hugepages="off", directory=self.dir,
                              max_consumers=rows, start_position=start, serve=False)
        assert p.data is not None
        self.dq = memoryview(p.data).cast("Q")
        self.views = (self.dq,)
        self.pending = False
        return p

    def close(self):
        for v in self.views:
            v.release()
        self.views = ()
        self.members = {}
        if self.p is not None:
            self.p.close()
            self.p = None

    def attach(self, observer, minor, group, start, want_tail, want):
        """'A': a hello answered by the producer's own admission code; the welcome and the start compared."""
        if observer:
            return  # not replayed (replay.go)
        p = self.p
        if not group and start == L.START_OLDEST and p.conns:
            with p.lock:  # the model reclaims at once what every attached consumer released (replay.go)
                p._reclaim_locked()
        cli, srv = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            p._answer(srv, L.pack_hello(role=L.ROLE_CONSUMER, start=start, minor=minor, group_id=group))
            msg, fds, _, _ = socket.recv_fds(cli, L.ERROR_RECORD_MAX, 4, socket.MSG_DONTWAIT)
        finally:
            cli.close()
        for f in fds:
            os.close(f)
        status, row, gen = _WELCOME.unpack_from(msg, L.WELCOME_STATUS)
        if status != L.STATUS_OK:
            row, gen = 0xFFFF, 0
        wst, wrow, wgen = want & 0xFFFF, (want >> 16) & 0xFFFF, want >> 32
        if (status, row) != (wst, wrow):
            raise Difference("attach: status, row", (status, row), (wst, wrow))
        if status != L.STATUS_OK:
            return
        if gen != wgen:
            raise Difference(f"attach row {row}: generation", gen, wgen)
        m = p.conns[row]
        t = m.r64[Q_TAIL]
        if t != want_tail:
            # Spec §7.1 lets a producer start an independent consumer (start oldest) at any position from
            # which it still holds every slot (the Python producer: oldest; the model: the lowest position an
            # attached independent consumer has not released); the lockstep run then moves the model to that
            # start (Model.Rebase). The stream cannot: it goes on from the model's start. A consumer started
            # before it follows the model by releasing, unread, the positions before it (a tail store any
            # consumer may make); one started after it cannot go back, and the scenario ends here (cut).
            head = p.c64[Q_HEAD]
            if group or start != L.START_OLDEST or (head - t) & M64 > p.slot_count or \
                    (head - want_tail) & M64 > p.slot_count:
                raise Difference(f"attach row {row}: start", t, want_tail)
            if (want_tail - t) & M64 > (head - t) & M64:
                raise Cut()
            m.r64[Q_TAIL] = want_tail
            self.rebased += 1
        self.members[row] = m

    def gone(self, row):
        """'C': the consumer's connection ended, as the serving thread sees it."""
        m = self.members.pop(row, None)
        if m is not None:
            self.p._consumer_left(m)

    def publish(self, eos):
        """'P': one heap (or the end-of-stream marker), never waiting; the Result's index."""
        p = self.p
        if eos:
            try:
                p.end_of_stream(0, 0)
                return 0
            except RingFull:
                return 3
        try:
            p.publish(p.acquire(0), 1)
            return 0
        except RingFull:  # drop: the caller counts what it drops (as recv does)
            p.add("dropped_heaps", 1)
            return 1
        except Timeout:  # block: it would wait
            self.pending = True
            return 2

    def retry(self):
        """The pending block publish, tried once (acquire's reclaim and its wait's first look); True when
        it went."""
        p = self.p
        try:
            s = p.acquire(0)
        except Timeout:
            return False
        p.publish(s, 1)
        self.pending = False
        return True


def run(stream):
    """Play stream (a binary file) to its end record. Returns (steps, scenarios, moved, cut): the steps played
    (a scenario cut short counts those before its cut), the scenarios begun, consumers moved to the model's
    start, scenarios cut short (Replay.attach).
    Difference, BadStream."""
    tmp = tempfile.mkdtemp(prefix="sim-replay-")
    r = Replay(tmp)
    try:
        steps, scenarios = _play(stream, r)
        return steps, scenarios, r.rebased, r.cut
    finally:
        r.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _records(stream):
    """The stream's records as tuples, read BLOCK bytes at a time (decoded in C, no Python step per record)."""
    return chain.from_iterable(map(_unpack, iter(partial(stream.read, BLOCK), b"")))


def _unpack(block):
    if len(block) % RECORD.size:  # only the last block is short (BufferedReader.read reads to BLOCK or EOF)
        raise BadStream("the stream ends inside a record")
    return RECORD.iter_unpack(block)


def _play(stream, r):
    records = _records(stream)
    steps = scenarios = step = 0
    seed = None
    first = next(records, None)
    if first is None or first[0] not in (78, 90):  # 'N', 'Z'
        raise BadStream("the stream does not begin with a scenario ('N') record")
    records = chain((first,), records)
    p = c32 = c64 = dq = conns = lock = None
    mask = desc = 0
    # fresh: the cursors were read and nothing a read looks at (a region's words, the consumers, head) has
    # changed since: another read finds what the last one left (every valid cursor taken, every invalid one's
    # consumer detached) and changes nothing, and is skipped
    fresh = False
    try:
        while True:
            try:
                for k, a, b, c, x, y, z in records:
                    if k == 79:  # 'O'
                        got = c64[c >> 3] if a == 8 else c32[c >> 2]
                        if got != x:
                            raise Difference(word_name(c), got, x)
                    elif k == 69:  # 'E'
                        if c != step:
                            raise BadStream(f"seed {seed}: step {c} ends after step {step - 1}")
                        step = c + 1
                        steps += 1
                    elif k == 83:  # 'S': the pending publish tried, then the cursors read (at the new head)
                        if r.pending and r.retry():
                            fresh = False  # head moved
                        if not fresh:
                            with lock:
                                p._read_cursors_locked(c64[Q_HEAD])
                            fresh = True
                        if r.pending != (a == 1):
                            raise Difference("settle: the block publish pending", r.pending, a == 1)
                    elif k == 77:  # 'M'
                        got = dq[(desc + (x & mask) * 64 + ASSIGN) >> 3]
                        if got != y:
                            raise Difference(f"assign of position {x}", hex(got), hex(y))
                    elif k == 87:  # 'W'
                        m = conns.get(c)
                        if m is not None:  # else detached: its region is nobody's now
                            fresh = False
                            if a == 4:
                                m.r32[I_CONSUMER_WAITING] = x & 0xFFFFFFFF
                            else:
                                m.r64[STORE_Q[a]] = x
                    elif k == 80:  # 'P'
                        got = r.publish(a)
                        fresh = False
                        if got != b:
                            what = "end-of-stream marker" if a else "publish"
                            raise Difference(f"{what} at head {c64[Q_HEAD]}", RESULTS[got], RESULTS[b])
                    elif k == 70:  # 'F'
                        with lock:
                            p._reclaim_locked()  # reads the cursors first
                            got = p._nfree()
                        fresh = True
                        if got != x:
                            raise Difference("free slots", got, x)
                    elif k == 65:  # 'A'
                        r.attach(a, b, c, x, y, z)
                        fresh = False
                    elif k == 67:  # 'C'
                        r.gone(c)
                        fresh = False
                    elif k == 78:  # 'N'
                        seed, step = y, 0
                        scenarios += 1
                        p = r.new(a, b, c, x)
                        fresh = False
                        c32, c64, dq, conns, lock = p.c32, p.c64, r.dq, p.conns, p.lock
                        mask, desc = p.mask, p._desc_off
                    elif k == 90:  # 'Z'
                        return steps, scenarios
                    else:
                        raise BadStream(f"record kind {k:#x} at step {step} of seed {seed}")
                raise BadStream(f"the stream ends without its end record ({steps} steps read)")
            except Cut:
                # the rest of this scenario follows a start the producer did not choose: on to the next one
                r.cut += 1
                for rec in records:
                    if rec[0] in (78, 90):
                        records = chain((rec,), records)
                        break
    except Difference as e:
        what, got, want = e.args
        e.args = (f"seed {seed} step {step}: {what}: got {got}, want {want}",)
        raise


def main():
    logging.getLogger("ibvbridge.producer").setLevel(logging.ERROR)  # refusals are the stream's business
    try:
        steps, scenarios, rebased, cut = run(sys.stdin.buffer)
    except Difference as e:
        print(e.args[0], flush=True)
        return 1
    except BadStream as e:
        print(f"sim_replay: {e}", file=sys.stderr, flush=True)
        return 2
    if rebased or cut:
        print(f"sim_replay: {rebased + cut} consumers started where the spec lets this producer differ from the "
              f"model (§7.1): {rebased} released up to the model's start, {cut} after it cut their scenario short",
              file=sys.stderr)
    print(f"ok {steps} {scenarios} {cut}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
