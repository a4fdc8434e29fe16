"""Reference consumer CLI: read a ring to the end, checksum (and optionally verify) every payload byte.

    python3 -m ibvbridge.consume --ring NAME_OR_SOCKET [--dir DIR] [--start oldest|head] [--verify]
                                 [--max-heaps N] [--timeout-ms T] [--hold N] [--sleep-us U] [--batch N]
                                 [--stop-first] [--wait] [--no-touch] [--group-name NAME] [--work N]
                                 [--streams]

The ring is a name (looked up in --dir, else $IBVBRIDGE_RING_DIR, else the default ring directories) or the
path of its socket (NAME.v2.sock). A ring that does not exist is an error at once, unless --wait: then the
tool waits for it up to --timeout-ms. --start: begin at the oldest heap the ring holds (default) or at the
next one published.

Prints exactly one JSON object on stdout:
    {"heaps", "bytes", "checksum", "verify_errors", "overrun_heaps", "incomplete", "first_heap_cnt",
     "last_heap_cnt", "heap_cnt_out_of_order", "seconds", "cpu_seconds", "result", "error", "counters",
     "session_id", "chunks", "heaps_present", "heap_cnt_sum", "group_id"}
and, with --streams (read on across STREAM_END markers of recv --keep-going until the ring ends; without it
the first stream end ends the read), "streams": one {"heaps", "heap_cnt_sum", "ended", "stop_heap_cnt"} per
stream, in order.
Exit status: 0 eos / max, 2 producer_gone, 3 timeout, 4 overrun (detached after falling a whole ring
behind), 5 detached (any other reason), 1 anything else. Every result but eos / max also prints its error as
one line on stderr.

checksum: wrapping uint64 sum over all heaps of payload[0:received] read as little-endian uint64 words
(the last partial word zero-padded). --verify: byte i of payload[0:received] must be
(heap_cnt*31 + i) & 0xff and item 0x1001, if present, immediate with value == heap_cnt; each heap failing
either check counts one verify error. Every heap's bytes are read (and verified) first, then its validity
is checked (layout 2.1 §A): a heap the producer overran while this consumer held it counts in
overrun_heaps (not in verify_errors, nor in heaps, bytes or checksum: its bytes were not the heap's), and
the tool stops with result overrun. Incomplete heaps are not verified: their holes hold unspecified
bytes. heap_cnt_out_of_order counts heaps whose heap_cnt is not greater
than the previous heap's. first/last_heap_cnt are 0 when no heap was read. seconds runs from the end of
attach to the end of reading. --no-touch takes and releases each heap without reading its payload (checksum
0, nothing verified): the cost of the ring itself.

A ring in chunk mode (spec §13) is read chunk by chunk (with --batch N, up to N chunks at once through
Ring.next_chunk_batch, released with one tail store, whenever at least 64 wait): "heaps" counts the ring
positions read, here chunks (as the Go consume tool does), "chunks" likewise, "heaps_present" the heap
positions the presence maps mark present; bytes is the sum of the chunks' received; checksum runs over
the present heaps' bytes; first/last_heap_cnt are chunk ids and incomplete counts incomplete chunks.
--verify checks each present heap position against the pattern of heap cnt chunk_id × positions +
t × axis + a + 1 (send --pattern --timestamp-step, whose heaps count from 1); a wrong position is one
verify error. --no-touch still reads the presence maps.

--group-name NAME attaches as a member of consumer group NAME (spec §14; a member starts at head): the tool
reads only the heaps the producer assigns to it. heap_cnt_sum (wrapping uint64 sum of the heap_cnts read, as
the Go tool's) lets a test check that a group's members together read every heap exactly once. A member
cannot use --batch (batches would hold other members' positions); it reads a chunk ring chunk by chunk.

--work N (chunk rings, benchmarks): before accounting each chunk, compute its power per channel N times as
examples/chunks/power.py does, in float32 (int8 (re, im) pairs → float32 → |x|² summed over time, per axis
value): CPU-bound numpy work per chunk (~1.7 ms per pass over 64 heaps of 8 KiB), the same for every
consumer, so `ibvbridge bench group` can compare one consumer with a group sharing the stream.
"""

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Deque, Dict, Optional, Union

from . import layout as L
from .errors import Detached, EndOfStream, Overrun, ProducerGone, RingError, StreamEnd, Timeout
from .chunks import Chunk, ChunkBatch
from .ring import Batch, Heap, Ring

if TYPE_CHECKING:
    import numpy as np
else:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None

M64 = (1 << 64) - 1
VERIFY_ITEM = 0x1001
# Chunks waiting before --batch takes them as a ChunkBatch. Its numpy calls cost little hot but ~10-25 us each
# on the cold caches a wake finds: a batch and its accounting cost ~240 us whatever its size, 64 chunks taken
# one by one about the same (tests/bench_chunks.py --cold-wakes 16,32,64,128: 114/151/229/381 us), so fewer
# are read one by one.
CHUNK_BATCH_MIN = 64
EXIT = {"eos": 0, "max": 0, "producer_gone": 2, "timeout": 3, "overrun": 4, "detached": 5, "error": 1}


def chunk_power(data, present, passes):
    """--work: one chunk's power per channel [axis, channel] (float32, summed over its present heaps) from
    its bytes (uint8 [time, axis, heap bytes]) and presence map (bool [time, axis]), computed passes times
    (each pass the whole reduction again: CPU-bound work per chunk)."""
    x = data.view(np.int8).reshape(data.shape[:2] + (-1, 2))  # [time, axis, channel, re/im]: a view of the ring
    if not present.all():
        x = x * present[:, :, None, None].astype(np.int8)  # absent heaps' bytes are undefined: zero them
    power = None
    for _ in range(passes):
        f = x.astype(np.float32)
        f *= f
        power = f.sum(axis=(0, 3))
    return power


def chunk_work(item, passes):
    """--work on a chunk or a ChunkBatch: chunk_power of each of its chunks (nothing when passes is 0)."""
    if not passes:
        return
    if isinstance(item, ChunkBatch):
        present = item.present
        for i in range(len(item)):
            chunk_power(item.chunk(i), present[i], passes)
    else:
        chunk_power(item.data, item.present, passes)


def read_chunks(ring, st, timeout, work, limit):
    """Every chunk through the ring's iterator, as a user's ``for chunk in ring.chunks()`` reads them: the
    cheapest path (a chunk's descriptor checked once, releases stored in batches), and the one a wake runs
    on cold caches. Returns "eos", or "max" at limit heaps; raises as the iterator does (Overrun at the
    step after a chunk found overrun)."""
    for c in ring.chunks(timeout):
        chunk_work(c, work)
        if not st.chunk(c):
            ring.release(c)  # overrun while read: raises Overrun
            raise RingError("chunk invalid but the ring still counts this consumer")
        if limit is not None and st.heaps >= limit:
            return "max"
    return "eos"


class _Terminated(Exception):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated("terminated by signal %d" % signum)


class Stats:
    def __init__(self, verify, slot_size, touch=True):
        self.verify = verify
        self.touch = touch
        self.heaps = self.bytes = self.checksum = self.verify_errors = self.incomplete = self.overrun_heaps = 0
        self.chunks = self.heaps_present = self.heap_cnt_sum = 0
        self.first: Optional[int] = None
        self.last: Optional[int] = None
        self.out_of_order = 0
        self.streams = []  # closed streams (--streams)
        self.cur_heaps = self.cur_sum = 0  # the stream being read
        # pattern[b] = bytes (b + i) & 0xff for i < slot_size (+255 so any start fits)
        self._pat = bytes((i & 0xFF) for i in range(slot_size + 256)) if verify else b""

    # ---------------------------------------------------------------- one heap
    def heap(self, h):
        """Account one heap: read (and verify) its bytes, THEN check it is still valid. False (counted in
        overrun_heaps, nothing else) when the producer overran this consumer while it held the heap."""
        n = h.received
        if not self.touch:
            return self._count(h.heap_cnt, n, h.flags, h.valid)
        pl = h.payload
        n8 = n & ~7
        if n8 <= 512 or np is None:
            s = sum(pl[:n8].cast("Q")) if n8 else 0
        else:
            s = int(np.frombuffer(pl, "<u8", n8 >> 3).sum(dtype=np.uint64))
        if n8 != n:
            s += int.from_bytes(pl[n8:n], "little")
        cnt = h.heap_cnt
        ok = True
        if self.verify and not h.flags & L.FLAG_INCOMPLETE:  # holes hold unspecified bytes
            b = (cnt * 31) & 0xFF
            m = n
            if h.flags & L.FLAG_HAS_DESCRIPTORS:  # the pattern covers the payload before the descriptors
                m = min([n] + [it.value for it in h.items if it.id == 0x5 and not it.immediate])
            ok = bytes(pl[:m]) == self._pat[b:b + m]
            if ok:
                it = h.find(VERIFY_ITEM)
                ok = it is None or (it.immediate and it.value == cnt)
        return self._count(cnt, n, h.flags, h.valid, s, 0 if ok else 1)

    def _count(self, cnt, n, flags, valid, s=0, bad=0):
        """Account one position read (a heap, or a chunk: cnt its chunk id) once its validity is known."""
        if not valid:
            self.overrun_heaps += 1
            return False
        if bad:
            self.verify_errors += bad
        if s:
            self.checksum = (self.checksum + s) & M64
        self.bytes += n
        if flags & L.FLAG_INCOMPLETE:
            self.incomplete += 1
        last = self.last
        if last is None:
            self.first = cnt
        elif cnt <= last and self.cur_heaps:  # a new stream may count from 1 again
            self.out_of_order += 1
        self.last = cnt
        self.heaps += 1
        self.heap_cnt_sum += cnt  # wrapped to u64 when reported (heap_cnt_sum_u64)
        self.cur_heaps += 1
        self.cur_sum += cnt
        return True

    # ---------------------------------------------------------------- one chunk (spec §13)
    def chunk(self, c):
        """Account one chunk: count its present heaps (the presence map), checksum their bytes and, with
        --verify, check each present heap position (t, a) holds the pattern of heap cnt chunk_id ×
        positions + t × axis + a + 1 (send --pattern --timestamp-step, counting heaps from 1); a wrong
        position is one verify error. Then check validity (read, then check): False when overrun."""
        npres = c.heaps_present
        s = bad = 0
        if npres and self.touch:
            s, bad = self._present_bytes(c.data, c.present, c.chunk_id, npres)
        if not self._count(c.chunk_id, c.received, c.flags, c.valid, s, bad):
            return False
        self.chunks += 1
        self.heaps_present += npres
        return True

    def _present_bytes(self, data, present, chunk_id, npres):
        """(checksum, verify errors) of one chunk's present heap positions: data uint8 [time, axis, bytes],
        present bool [time, axis] (npres of them True)."""
        npos, hs = present.size, data.shape[-1]
        pres = present.reshape(npos)
        d = data.reshape(npos, hs)
        rows = d if npres == npos else d[pres]
        s = bad = 0
        hs8 = hs & ~7
        if hs8:
            s = int(rows[:, :hs8].view("<u8").sum(dtype=np.uint64)) if hs8 == hs else int(
                np.ascontiguousarray(rows[:, :hs8]).view("<u8").sum(dtype=np.uint64))
        if hs8 != hs:
            tail = np.zeros((len(rows), 8), np.uint8)
            tail[:, :hs - hs8] = rows[:, hs8:]
            s += int(tail.view("<u8").sum(dtype=np.uint64))
        if self.verify:
            cnt = np.arange(npos, dtype=np.uint64) + np.uint64((chunk_id * npos + 1) & M64)
            start = ((cnt * np.uint64(31)) & np.uint64(0xFF)).astype(np.uint8)
            expect = start[:, None] + np.arange(hs, dtype=np.uint8)[None, :]  # uint8 wraps: & 0xff
            bad = int(np.count_nonzero((d != expect).any(axis=1) & pres))
        return s & M64, bad

    def chunk_batch(self, cb):
        """Account a chunk batch as chunk() does each chunk: False (all n in overrun_heaps) when overrun.
        The descriptor fields are taken out as Python lists and counted chunk by chunk: a batch follows a
        wake, when every numpy call runs on cold caches and costs more than a short Python loop."""
        n = len(cb)
        present = cb.present
        ids = cb.chunk_id.tolist()
        s = bad = 0
        if self.touch:
            npres = np.count_nonzero(present.reshape(n, -1), axis=1).tolist()
            for i in range(n):
                if npres[i]:
                    si, bi = self._present_bytes(cb.chunk(i), present[i], ids[i], npres[i])
                    s, bad = (s + si) & M64, bad + bi
            total = sum(npres)
        else:
            total = int(np.count_nonzero(present))
        if not cb.valid:
            self.overrun_heaps += n
            return False
        count = self._count
        for cid, recv, flags in zip(ids, cb.received.tolist(), cb.flags.tolist()):
            count(cid, recv, flags, True)
        if s or bad:
            self.checksum = (self.checksum + s) & M64
            self.verify_errors += bad
        self.chunks += n
        self.heaps_present += total
        return True

    # ---------------------------------------------------------------- a batch (vectorised)
    def batch(self, b):
        """Account a batch as heap() does one heap: False (all n in overrun_heaps) when it was overrun."""
        n = len(b)
        recv = b.received
        if not self.touch:  # --no-touch: the descriptors only
            return self._account_batch(b, n, recv, 0, 0)
        maxr = int(recv.max())
        nb = (maxr + 7) & ~7
        arr = b.payloads(nb)
        full = bool((recv == nb).all())
        if full:
            data = arr
        else:
            mask = np.arange(nb, dtype=np.uint64)[None, :] < recv[:, None]
            data = np.where(mask, arr, np.uint8(0))
        s = 0
        if nb:
            try:
                words = data.view("<u8")
            except ValueError:
                words = np.ascontiguousarray(data).view("<u8")
            s = int(words.sum(dtype=np.uint64))
        hc = b.heap_cnt
        flags = b.flags
        nbad = 0
        if self.verify:
            start = ((hc * np.uint64(31)) & np.uint64(0xFF)).astype(np.uint8)
            expect = start[:, None] + np.arange(nb, dtype=np.uint8)[None, :]  # uint8 wraps: & 0xff
            diff = arr != expect
            if not full:
                diff &= mask
            if (flags & L.FLAG_HAS_DESCRIPTORS).any():  # the pattern covers the payload before descriptors
                items, valid = b.item_table()
                if items.shape[1]:
                    isdesc = valid & (items["id"] == 5) & ((items["flags"] & L.ITEM_IMMEDIATE) == 0)
                    lim = np.where(isdesc, items["value"], np.uint64(nb)).min(axis=1)
                    diff &= np.arange(nb, dtype=np.uint64)[None, :] < lim[:, None]
            bad = diff.any(axis=1)
            found, items = b.find_item(VERIFY_ITEM)
            bad |= found & (((items["flags"] & L.ITEM_IMMEDIATE) == 0) | (items["value"] != hc))
            bad &= (flags & L.FLAG_INCOMPLETE) == 0  # holes hold unspecified bytes
            nbad = int(np.count_nonzero(bad))
        return self._account_batch(b, n, recv, s, nbad)

    def _account_batch(self, b, n, recv, s, nbad):
        """Account a batch read (checksum s, nbad verify errors) once its validity is known."""
        if not b.valid:
            self.overrun_heaps += n
            return False
        hc = b.heap_cnt
        self.verify_errors += nbad
        self.checksum = (self.checksum + s) & M64
        self.bytes += int(recv.sum(dtype=np.uint64))
        self.incomplete += int(np.count_nonzero(b.flags & L.FLAG_INCOMPLETE))
        ooo = int(np.count_nonzero(hc[1:] <= hc[:-1]))
        if self.first is None:
            self.first = int(hc[0])
        elif self.last is not None and int(hc[0]) <= self.last:
            ooo += 1
        self.out_of_order += ooo
        self.last = int(hc[-1])
        self.heaps += n
        self.heap_cnt_sum += int(hc.sum(dtype=np.uint64))
        return True


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ibvbridge.consume", description=__doc__.split("\n")[0])
    ap.add_argument("--ring", required=True, help="ring name, or path of its socket (NAME.v2.sock)")
    ap.add_argument("--dir", default=None, help="ring directory to look the name up in")
    ap.add_argument("--start", choices=("oldest", "head"), default="oldest",
                    help="begin at the oldest heap the ring holds, or at the next one published")
    ap.add_argument("--verify", action="store_true", help="check the test pattern and item 0x1001")
    ap.add_argument("--max-heaps", type=int, default=0, help="stop after N heaps (0: no limit)")
    ap.add_argument("--timeout-ms", type=float, default=10000, help="attach timeout and per-wait timeout")
    ap.add_argument("--wait", action="store_true", help="wait up to --timeout-ms for a ring that does not exist yet")
    ap.add_argument("--max-latency-us", type=float, default=0,
                    help="let heaps of a moving stream wait up to this long for coalesced wakes (0: a wake per heap)")
    ap.add_argument("--hold", type=int, default=0, help="keep up to N heaps unreleased")
    ap.add_argument("--sleep-us", type=float, default=0, help="sleep after each heap (each batch with --batch)")
    ap.add_argument("--batch", type=int, default=0, help="use next_batch with up to N heaps")
    ap.add_argument("--no-touch", action="store_true",
                    help="take and release each heap without reading its payload (a chunk's presence map is read)")
    ap.add_argument("--stop-first", action="store_true",
                    help="after taking the first heap (or batch), stop this process (SIGSTOP) before reading it, "
                         "until SIGCONT (a consumer stalled mid-read, for tests)")
    ap.add_argument("--group-name", default="",
                    help="attach as a member of this consumer group (spec §14): read only the heaps assigned to it")
    ap.add_argument("--streams", action="store_true",
                    help="read on across stream ends (STREAM_END, recv --keep-going) until the ring ends, each "
                         "stream tallied in \"streams\" (default: the first stream end ends the read)")
    ap.add_argument("--work", type=int, default=0,
                    help="chunk rings: compute each chunk's power per channel N times (CPU-bound work, benchmarks)")
    a = ap.parse_args(argv)
    timeout = a.timeout_ms / 1000.0
    out: Dict[str, Any] = {"heaps": 0, "bytes": 0, "checksum": 0, "verify_errors": 0, "overrun_heaps": 0, "incomplete": 0,
           "first_heap_cnt": 0,
           "last_heap_cnt": 0, "heap_cnt_out_of_order": 0, "seconds": 0.0, "cpu_seconds": 0.0, "result": "error",
           "error": "",
           "counters": {}, "session_id": 0, "chunks": 0, "heaps_present": 0, "heap_cnt_sum": 0,
           "group_id": 0}
    signal.signal(signal.SIGTERM, _on_sigterm)
    ring = None
    st = None
    t0 = time.perf_counter()
    cpu0 = None  # CPU seconds at attach: cpu_seconds is the stream's cost alone
    held: Deque[Any] = collections.deque()
    held_n = 0
    try:
        ring = Ring.attach(a.ring, timeout=timeout, directory=a.dir, start=a.start,
                           max_latency=a.max_latency_us / 1e6, wait=a.wait, group=a.group_name or None)
        out["session_id"], out["group_id"] = ring.session_id, ring.group_id
        st = Stats(a.verify, ring.slot_size, touch=not a.no_touch)
        cg = ring.chunk_geometry
        chunked = cg is not None
        if (a.batch or chunked) and np is None:
            raise RingError("--batch and chunk rings need numpy")
        if a.work and not (cg is not None and cg.heap_size % 2 == 0):
            raise RingError("--work needs a chunk-mode ring whose heaps hold int8 (re, im) pairs")
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        sleep = a.sleep_us / 1e6
        stop_first = a.stop_first
        limit = a.max_heaps if a.max_heaps > 0 else None
        hold = a.hold
        batch_chunks = chunked and not ring.group_id and a.batch >= CHUNK_BATCH_MIN
        result = None
        if chunked and not (a.batch or hold or sleep or stop_first):
            result = read_chunks(ring, st, timeout, a.work, limit)
        while result is None:
            if limit is not None and st.heaps >= limit:
                result = "max"
                break
            try:
                item: Union[Heap, Batch, Chunk, ChunkBatch]
                if chunked:
                    # A batch's numpy set-up costs several chunks' worth of the per-chunk path: batch only
                    # when enough chunks wait (after a coalesced wake, or behind), else take the next one.
                    want = 0
                    if batch_chunks and (ring.head - ring.position) & M64 >= CHUNK_BATCH_MIN:
                        want = a.batch if limit is None else min(a.batch, limit - st.heaps)
                    if want >= CHUNK_BATCH_MIN:
                        item = ring.next_chunk_batch(want, timeout)
                        k = len(item)
                        chunk_work(item, a.work)  # read, then check: accounting checks validity after it
                        ok = st.chunk_batch(item) if not stop_first else None
                    else:
                        item = ring.next_chunk(timeout)
                        k = 1
                        chunk_work(item, a.work)
                        ok = st.chunk(item) if not stop_first else None
                elif a.batch:
                    want = a.batch if limit is None else min(a.batch, limit - st.heaps)
                    item = ring.next_batch(want, timeout)
                    k = len(item)
                    ok = None
                else:
                    item = ring.next(timeout)
                    k = 1
                    ok = None
                if stop_first:
                    stop_first = False
                    # to this thread: one sent to the process may be taken by another thread (numpy's),
                    # and this one would read on until that thread ran
                    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
                    ok = None
                if ok is None:  # not accounted yet: a heap or batch, or the first item of --stop-first
                    if chunked:
                        ok = st.chunk_batch(item) if isinstance(item, ChunkBatch) else st.chunk(item)
                    else:
                        ok = st.batch(item) if a.batch else st.heap(item)
                if not ok:
                    ring.release(item._batch if isinstance(item, ChunkBatch) else item)  # overrun while held: raises Overrun
                    raise RingError("heap invalid but the ring still counts this consumer")
            except StreamEnd as e:
                if not a.streams:
                    result = "eos"
                    break
                st.streams.append({"heaps": st.cur_heaps, "heap_cnt_sum": st.cur_sum & M64, "ended": True,
                                   "stop_heap_cnt": e.heap_cnt})
                st.cur_heaps = st.cur_sum = 0
                continue
            except EndOfStream:
                result = "eos"
                break
            if hold:
                held.append((item, k))
                held_n += k
                while held and held_n > hold:
                    x, kx = held.popleft()
                    x.release()
                    held_n -= kx
            else:
                item.release()
            if sleep:
                time.sleep(sleep)
        out["result"] = result
    except ProducerGone as e:
        out["result"], out["error"] = "producer_gone", str(e)
    except Overrun as e:
        out["result"], out["error"] = "overrun", str(e)
    except Detached as e:
        out["result"], out["error"] = "detached", str(e)
    except Timeout as e:
        out["result"], out["error"] = "timeout", str(e)
    except RingError as e:
        out["result"], out["error"] = "error", f"{type(e).__name__}: {e}"
    except KeyboardInterrupt:
        out["result"], out["error"] = "error", "interrupted"
    except _Terminated as e:
        out["result"], out["error"] = "error", str(e)
    except Exception as e:  # report, never a traceback instead of the JSON line
        out["result"], out["error"] = "error", f"{type(e).__name__}: {e}"
    out["seconds"] = round(time.perf_counter() - t0, 6)
    if cpu0 is not None:
        out["cpu_seconds"] = round(time.process_time() - cpu0, 6)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if ring is not None:
        try:
            for x, _ in held:
                x.release()
            held.clear()
            out["counters"] = ring.stats()
        except Exception:
            pass
        ring.close()
    if st is not None:
        out.update(heaps=st.heaps, bytes=st.bytes, checksum=st.checksum, verify_errors=st.verify_errors,
                   overrun_heaps=st.overrun_heaps,
                   incomplete=st.incomplete, first_heap_cnt=st.first or 0, last_heap_cnt=st.last or 0,
                   heap_cnt_out_of_order=st.out_of_order, chunks=st.chunks, heaps_present=st.heaps_present,
                   heap_cnt_sum=st.heap_cnt_sum & M64)
        if a.streams:
            if st.cur_heaps or not st.streams:
                st.streams.append({"heaps": st.cur_heaps, "heap_cnt_sum": st.cur_sum & M64, "ended": False,
                                   "stop_heap_cnt": 0})
            out["streams"] = st.streams
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    if out["result"] not in ("eos", "max"):
        msg = " ".join((out["error"] or out["result"]).split())  # one line, whatever the message held
        sys.stderr.write(f"ibvbridge.consume: {out['result']}: {msg}\n")
        sys.stderr.flush()
    return EXIT[out["result"]]


if __name__ == "__main__":
    sys.exit(main())
