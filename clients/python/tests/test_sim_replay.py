"""The replayer of the ring simulation's replay stream (sim_replay.py) checks what it says it checks: a stream
the producer answers as recorded passes, and one expected value changed fails, naming the seed and step."""

import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SIMLOG_SRC = os.path.join(REPO, "internal", "ringsim", "simlog")
RECORD = struct.Struct("<BBHIQQQ")
HEAD, STATE0, DROPPED = 0x200, 0x1000, 0x500 + 8 * 4  # ctl words: head, row 0 state, dropped_heaps
M64 = (1 << 64) - 1


def rec(kind, a=0, b=0, c=0, x=0, y=0, z=0):
    return RECORD.pack(ord(kind), a, b, c, x, y, z)


def replay(stream):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, os.path.join(HERE, "sim_replay.py")], input=stream,
                          capture_output=True, env=env, timeout=600)


def handwritten(p0=0):
    """Seed 7: a drop ring of 4 slots and 2 rows starting at p0; one consumer at head; 4 heaps published, the
    fifth dropped (the only consumer holds the ring back); the consumer releases all; it leaves."""
    s = [rec("N", 0, 2, 4, p0, 7)]
    s += [rec("A", 0, 2, 0, 1, p0, 0 | 0 << 16 | 1 << 32), rec("S"), rec("O", 8, 0, HEAD, p0),
          rec("O", 4, 0, STATE0, 1), rec("E", c=0)]
    for i in range(4):
        s += [rec("P", 0, 0), rec("S"), rec("O", 8, 0, HEAD, (p0 + i + 1) & M64), rec("E", c=1 + i)]
    s += [rec("P", 0, 1), rec("S"), rec("O", 8, 0, HEAD, (p0 + 4) & M64), rec("O", 8, 0, DROPPED, 1), rec("E", c=5)]
    s += [rec("W", 0, 0, 0, (p0 + 4) & M64), rec("S"), rec("F", x=4), rec("E", c=6)]
    s += [rec("C", c=0), rec("S"), rec("O", 4, 0, STATE0, 4), rec("E", c=7)]
    return s


@pytest.mark.parametrize("p0", [0, (1 << 64) - 2])
def test_handwritten_stream_passes_and_counts_its_steps(p0):
    r = replay(b"".join(handwritten(p0)) + rec("Z"))
    assert (r.returncode, r.stdout.decode()) == (0, "ok 8 1 0\n"), r.stderr.decode()


@pytest.mark.parametrize("index, want", [
    (16, "seed 7 step 3: head: got 3, want 4"),  # an 'O' word: head after the third publish
    (22, "seed 7 step 5: publish at head 4: got dropped, want published"),  # a 'P' result
    (25, "seed 7 step 5: dropped_heaps: got 1, want 2"),
    (29, "seed 7 step 6: free slots: got 4, want 3"),  # an 'F' count
    (33, "seed 7 step 7: row 0 state: got 4, want 1"),  # the close detaches it
    (1, "seed 7 step 0: attach: status, row: got (0, 0), want (0, 1)"),
])
def test_one_flipped_expected_value_fails_naming_seed_and_step(index, want):
    s = handwritten()
    k, a, b, c, x, y, z = RECORD.unpack(s[index])
    if k == ord("P"):
        b = 0
    elif k == ord("A"):
        z ^= 1 << 16
    elif k == ord("F"):
        x -= 1
    elif k == ord("O") and c == STATE0:
        x = 1
    else:
        x += 1
    s[index] = RECORD.pack(k, a, b, c, x, y, z)
    r = replay(b"".join(s) + rec("Z"))
    assert (r.returncode, r.stdout.decode()) == (1, want + "\n"), r.stderr.decode()


def test_settle_reads_the_cursors_after_the_pending_publish_goes():
    """A block ring of 2 slots with one member holding both; the next publish waits. The member releases the
    first position and stores a read one past head (not valid yet: taken as its tail). The settle's retry
    publishes, then the cursors are read at the new head (as the model's Settle does): the read is valid
    now and nothing is queued; read before the publish only, the read would stay at the tail, one queued."""
    g, read, queued = 0x1234, STATE0 + 0x48, STATE0 + 0x50
    s = [rec("N", 1, 2, 2, 0, 9), rec("A", 0, 2, g, 1, 0, 1 << 32), rec("W", 1, 0, 0, 0), rec("S"), rec("E", c=0)]
    s += [rec("P"), rec("P"), rec("S"), rec("O", 8, 0, HEAD, 2), rec("O", 8, 0, queued, 2), rec("E", c=1)]
    s += [rec("P", 0, 2), rec("S", 1), rec("E", c=2)]
    s += [rec("W", 1, 0, 0, 3), rec("W", 0, 0, 0, 1), rec("S"), rec("O", 8, 0, HEAD, 3), rec("O", 8, 0, read, 3),
          rec("O", 8, 0, queued, 0), rec("O", 8, 0, STATE0 + 0x38, 3), rec("E", c=3)]
    r = replay(b"".join(s) + rec("Z"))
    assert (r.returncode, r.stdout.decode()) == (0, "ok 4 1 0\n"), r.stderr.decode()


def test_a_stream_that_is_not_one_is_refused():
    r = replay(b"".join(handwritten()))
    assert r.returncode == 2 and "without its end record" in r.stderr.decode()
    r = replay(b"".join(handwritten()) + rec("Z")[:7])
    assert r.returncode == 2 and "inside a record" in r.stderr.decode()
    r = replay(b"".join(handwritten()[1:]) + rec("Z"))
    assert r.returncode == 2 and "does not begin with a scenario" in r.stderr.decode()
    s = handwritten()
    del s[5]  # step 0's end
    r = replay(b"".join(s) + rec("Z"))
    assert r.returncode == 2 and "step 1 ends after step -1" in r.stderr.decode()


def _go():
    go = shutil.which("go") or "/usr/local/go/bin/go"
    return go if os.access(go, os.X_OK) else None


@pytest.fixture(scope="module")
def simlog(tmp_path_factory):
    if _go() is None:
        pytest.skip("Go is not installed: simlog cannot write a stream")
    if not os.path.isdir(SIMLOG_SRC):
        pytest.skip("not in the source tree: no internal/ringsim/simlog")
    path = tmp_path_factory.mktemp("simlog") / "simlog"
    subprocess.run([_go(), "build", "-o", str(path), "./internal/ringsim/simlog"], cwd=REPO, check=True,
                   timeout=600)
    return str(path)


def test_simlog_stream_plays_every_step_of_every_scenario(simlog):
    g = subprocess.run([simlog, "-from", "1", "-seeds", "6", "-steps", "400"], capture_output=True, check=True,
                       timeout=120)
    want = re.search(rb"simlog: (\d+) scenarios, (\d+) steps", g.stderr)
    r = replay(g.stdout)
    assert (r.returncode, r.stdout.decode()) == (0, f"ok {int(want[2])} {int(want[1])} 0\n"), r.stderr.decode()
    assert b"released up to the model's start" in r.stderr  # the start §7.1 lets this producer choose


def test_simlog_stream_fails_where_one_answer_is_changed(simlog):
    out = subprocess.run([simlog, "-from", "2", "-seeds", "2", "-steps", "300"], capture_output=True,
                         check=True, timeout=120).stdout
    # the first head check after step 20 of the first scenario, one more than recorded
    recs = list(RECORD.iter_unpack(out))
    seed, step = recs[0][5], 0
    for i, (k, a, b, c, x, y, z) in enumerate(recs):
        if k == ord("E"):
            step = c + 1
        elif k == ord("O") and c == HEAD and step > 20:
            break
    else:
        pytest.fail("no head check after step 20")
    bad = bytearray(out)
    RECORD.pack_into(bad, i * RECORD.size, k, a, b, c, (x + 1) & M64, y, z)
    r = replay(bytes(bad))
    assert (r.returncode, r.stdout.decode()) == (1, f"seed {seed} step {step}: head: got {x}, want {(x + 1) & M64}\n")
    assert replay(out).returncode == 0
