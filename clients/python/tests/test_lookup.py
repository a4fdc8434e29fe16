"""Layout 2.1 §B: a name is looked up only in trusted directories (not writable by group or others, owned by
the caller or root, or made by root); an untrusted default directory is skipped with one warning line and
never connected to; the producer must be root, the caller or the trusted directory's owner."""

import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ibvbridge import PermissionDenied, Producer, Ring, RingNotFound
from ibvbridge import layout as L
from ibvbridge import shared
from fake_producer import FakeProducer, pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable
NOBODY = 65534


def test_trust_rule_owner_mode_symlink_and_root_made(tmp_path):
    euid = 1000
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    os.chown(own, euid, euid)
    fd, owner = shared.open_trusted_dir(str(own), euid)
    os.close(fd)
    assert owner == euid
    os.chmod(own, 0o775)
    with pytest.raises(shared.Untrusted, match="writable by group or others"):
        shared.open_trusted_dir(str(own), euid)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(shared.Untrusted, match="a symbolic link"):
        shared.open_trusted_dir(str(link), euid)
    # owned by a third uid: trusted only because its parent is root's and nobody else can write it
    nested = tmp_path / "parent"
    nested.mkdir(mode=0o755)
    (nested / "svc").mkdir(mode=0o755)
    os.chown(nested / "svc", 4242, 4242)
    fd, owner = shared.open_trusted_dir(str(nested / "svc"), euid)
    os.close(fd)
    assert owner == 4242
    os.chown(nested, NOBODY, NOBODY)  # a parent another user owns: that user could have made it
    with pytest.raises(shared.Untrusted, match=f"owned by uid 4242, not {euid} or root"):
        shared.open_trusted_dir(str(nested / "svc"), euid)
    with pytest.raises(FileNotFoundError):
        shared.open_trusted_dir(str(tmp_path / "missing"), euid)
    assert shared.peer_trusted(0, 4242, euid) and shared.peer_trusted(euid, 4242, euid)
    assert shared.peer_trusted(4242, 4242, euid) and not shared.peer_trusted(NOBODY, 4242, euid)


def test_untrusted_given_directory_is_refused_in_one_line(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(PermissionDenied, match=f"^ring r: ring directory {d} is not trusted: writable by group or "
                       "others \\(mode 0777\\)$"):
        Ring.attach("r", directory=str(d), timeout=1)
    with pytest.raises(PermissionDenied, match="not trusted"):
        Ring.attach(str(d / "r.v2.sock"), timeout=1)


def test_untrusted_default_directory_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    squat, run = tmp_path / "nobodys" / "squat", tmp_path / "run"
    squat.mkdir(mode=0o755, parents=True)
    os.chmod(squat.parent, 0o755)
    os.chown(squat.parent, NOBODY, NOBODY)  # squat/'s parent is not root's: squat/ is not root-made
    os.chown(squat, NOBODY, NOBODY)
    monkeypatch.delenv(L.ENV_DIR, raising=False)
    monkeypatch.setattr(shared, "own_default_dirs", lambda: [str(squat)])
    monkeypatch.setattr(L, "RUN_DIR", str(run))
    p = FakeProducer(str(run), "r")
    try:
        with caplog.at_level(logging.WARNING, logger="ibvbridge.ring"):
            with Ring.attach("r", timeout=2) as ring:
                assert ring.session_id == p.session_id and ring.socket_path == str(run / "r.v2.sock")
        lines = [r.getMessage() for r in caplog.records]
        assert lines == [f"ibvbridge: skipping {squat}: owned by uid {NOBODY}, not {os.geteuid()} or root"]
        with pytest.raises(RingNotFound, match=f"ring gone not found \\(looked in {squat}, {run}\\)"):
            Ring.attach("gone", timeout=2)
    finally:
        p.close()


SQUATTER = """
import os, sys, time
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests")]
from fake_producer import FakeProducer, imm, pattern
mode, d, name = sys.argv[2:5]
if mode == "silent":  # a listener that never answers
    import socket
    os.makedirs(d, 0o755)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(os.path.join(d, name + ".v2.sock"))
    s.listen(8)
else:  # a full fake ring that lets anyone in and serves spoofed heaps 1000...
    class Squat(FakeProducer):
        def _permitted(self, uid, gid):
            return True
    p = Squat(d, name, slot_count=8, slot_size=256)
    for k in range(3):
        p.publish(1000 + k, pattern(1000 + k, 64), items=[imm(0x1001, 1000 + k)])
    p.publish_eos()
os.chmod(os.path.join(d, name + ".v2.sock"), 0o666)  # open to every victim
print("ready", flush=True)
time.sleep(60)
"""


PRIVATE_DIRS = "IBVB_TEST_PRIVATE_DIRS"


@pytest.mark.parametrize("squatter", ["spoofing", "silent"])
def test_attack_squatted_per_user_directory_never_reached_by_name(squatter, tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, setpriv and unshare to run the squatter as nobody and the victim as another uid")
    if not os.environ.get(PRIVATE_DIRS):
        # The body runs again in a mount namespace of its own whose /run and /dev/shm are fresh: the
        # machine's ring directories stay untouched.
        script = ('mount -t tmpfs -o mode=0755 ibvb-run /run && mount -t tmpfs -o mode=1777 ibvb-shm /dev/shm '
                  '&& exec "$0" "$@"')
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, PY, "-m",
                            "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner"),
                            f"{__file__}::test_attack_squatted_per_user_directory_never_reached_by_name[{squatter}]"],
                           capture_output=True, text=True, env=dict(os.environ, **{PRIVATE_DIRS: "1"}), timeout=120)
        assert r.returncode == 0 and " passed" in r.stdout, r.stdout + r.stderr
        return
    victim = 20000 + os.getpid() % 20000
    squat = f"/dev/shm/ibvbridge-{victim}"
    if os.path.lexists(squat):
        pytest.skip(f"{squat} exists already (not ours to remove)")
    name = f"squat-test-{os.getpid()}"
    run_dir = L.RUN_DIR
    made_run = not os.path.exists(run_dir)
    env = {k: v for k, v in os.environ.items() if k not in (L.ENV_DIR, "XDG_RUNTIME_DIR")}
    env["PYTHONPATH"] = PKG
    sq = None
    p = Producer.create(name, slot_count=8, slot_size=256, policy="block", hugepages="off", directory=run_dir,
                        group=victim)
    try:
        for cnt in (1, 2, 3):
            s = p.acquire(timeout=1)
            s.payload[:64] = np.frombuffer(pattern(cnt, 64), np.uint8)
            s.add_item(0x1001, cnt, 5, immediate=True)
            p.publish(s, heap_cnt=cnt, received=64)
        p.end_of_stream(timeout=1)
        sq = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", PY, "-c",
                               SQUATTER, PKG, squatter, squat, name], stdout=subprocess.PIPE, text=True, env=env,
                              cwd="/")
        assert sq.stdout.readline().strip() == "ready"
        assert os.stat(squat).st_uid == NOBODY and os.path.exists(f"{squat}/{name}.v2.sock")
        r = subprocess.run(["setpriv", f"--reuid={victim}", f"--regid={victim}", "--clear-groups", PY, "-m",
                            "ibvbridge.consume", "--ring", name, "--verify", "--timeout-ms", "5000"],
                           capture_output=True, text=True, env=env, cwd=PKG, timeout=60)
        out = json.loads(r.stdout)
        assert r.returncode == 0 and out["result"] == "eos", (out, r.stderr)
        assert out["session_id"] == p.session_id  # the real ring, not the squatter's
        assert out["heaps"] == 3 and out["first_heap_cnt"] == 1 and out["verify_errors"] == 0, out
        assert r.stderr == f"ibvbridge: skipping {squat}: owned by uid {NOBODY}, not {victim} or root\n"
    finally:
        p.close()
        if sq is not None:
            sq.kill()
            sq.wait()
        shutil.rmtree(squat, ignore_errors=True)
        if made_run:
            try:
                os.rmdir(run_dir)
            except OSError:
                pass


SQUAT_NEXT = r"""
import logging, os, sys
sys.path.insert(0, sys.argv[1])
from ibvbridge import shared
shared.SHARED_PREFIXES = (sys.argv[2] + "/ibvbridge-", sys.argv[3] + "/ibvbridge-")  # stand-ins for /dev/shm, /tmp
import ibvbridge
logging.basicConfig(level=logging.WARNING, format="%(message)s")
with ibvbridge.Producer.create("nextdefault", slot_count=8, slot_size=256, hugepages="off") as p:
    print(p.directory, flush=True)
    with ibvbridge.Ring.attach("nextdefault", timeout=5) as r:  # by name, as any consumer of this user
        print(r.socket_path, flush=True)
"""


def test_producer_skips_a_default_directory_a_stranger_made_and_uses_the_next():
    """Spec §1.1: with XDG_RUNTIME_DIR unset, a stranger who made /dev/shm/ibvbridge-UID first does not stop a
    producer of UID from starting: it skips that directory with one warning naming it and why, and makes its
    ring in the next default, /tmp/ibvbridge-UID, where its consumers find it by name. Run as a child of
    another uid, with both bases replaced by world-writable (sticky) temporary directories of this test."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the stranger as nobody and the producer as another uid")
    import tempfile
    uid = 20000 + os.getpid() % 20000
    bases = [tempfile.mkdtemp(prefix="ibvb-base-", dir="/tmp") for _ in range(2)]
    try:
        for b in bases:
            os.chmod(b, 0o1777)
        squat = os.path.join(bases[0], f"ibvbridge-{uid}")
        env = {k: v for k, v in os.environ.items() if k not in (L.ENV_DIR, "XDG_RUNTIME_DIR")}
        subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "mkdir", "-m",
                        "0755", squat], check=True, env=env, cwd="/")
        assert os.stat(squat).st_uid == NOBODY
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", PY, "-c", SQUAT_NEXT,
                            PKG, *bases], capture_output=True, text=True, env=env, cwd="/", timeout=60)
        assert r.returncode == 0, r.stderr
        nxt = os.path.join(bases[1], f"ibvbridge-{uid}")
        assert r.stdout.splitlines() == [nxt, os.path.join(nxt, "nextdefault.v2.sock")]
        lines = r.stderr.splitlines()
        assert lines[0].startswith(f"ibvbridge: skipping {squat}: ") and lines[0].endswith(f"; using {nxt}")
        assert f"owned by uid {NOBODY}, not {uid}" in lines[0]
        assert lines[1:] == [f"ibvbridge: skipping {squat}: owned by uid {NOBODY}, not {uid} or root"]
        assert os.listdir(squat) == [] and os.listdir(nxt) == []  # the producer removed its socket and lock
    finally:
        for b in bases:
            shutil.rmtree(b, ignore_errors=True)


def test_client_connects_through_the_directory_it_checked(tmp_path, monkeypatch):
    """Spec §1.1 (check, then connect through what was checked): the client connects to
    /proc/self/fd/N/NAME.v2.sock, N the descriptor of the directory it checked, so a directory swapped in
    at the same path after the check (here another producer's) is never the one connected to."""
    checked, impostor = tmp_path / "ring", tmp_path / "other"
    checked.mkdir(mode=0o755)
    impostor.mkdir(mode=0o755)
    real = FakeProducer(str(checked), "r")
    fake = FakeProducer(str(impostor), "r")
    real_open = shared.open_trusted_dir
    swapped = []

    def open_then_swap(d, *a):
        fd, owner = real_open(d, *a)
        if d == str(checked) and not swapped:  # between the check and the connect: swap the directories
            os.rename(checked, tmp_path / "moved")
            os.rename(impostor, checked)
            swapped.append(True)
        return fd, owner
    monkeypatch.setattr(shared, "open_trusted_dir", open_then_swap)
    try:
        with Ring.attach("r", directory=str(checked), timeout=2) as ring:
            assert swapped and ring.session_id == real.session_id != fake.session_id
    finally:
        real.close()
        fake.close()


SHARED_PRODUCER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import ibvbridge
ps = [ibvbridge.Producer.create("shared", slot_count=8, slot_size=256, hugepages="off", directory=d,
                                group=int(sys.argv[2])) for d in sys.argv[3:]]
print(" ".join(str(p.session_id) for p in ps), flush=True)
sys.stdin.read()
for p in ps:
    p.close()
"""

SHARED_CONSUMER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import ibvbridge
for d in sys.argv[2:]:
    try:
        with ibvbridge.Ring.attach("shared", directory=d, timeout=5) as r:
            print("ok", r.session_id, flush=True)
    except ibvbridge.PermissionDenied as e:
        print("refused", str(e).replace(chr(10), " "), flush=True)
"""


def test_a_ring_is_shared_with_a_group_and_root_from_a_directory_only_root_could_have_made():
    """Spec §1.3, setup 2: root makes a directory (root, 0755) and one per producing user inside it; a
    producer of uid A with --group G makes its ring there, and a member of G (uid B) and root attach to it
    (trusted: the parent is root's and not writable by others; the producer is the directory's owner). The
    same directory of A's inside a directory everyone may write (as /dev/shm) is refused by B and by root
    alike: root is not exempt from the check."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the producer and the group member as two other uids")
    import tempfile
    a = 20000 + os.getpid() % 20000
    b, g = a + 1, a + 2
    roots = tempfile.mkdtemp(prefix="ibvb-run-", dir="/tmp")  # stands in for /run/ibvbridge (root, 0755)
    shm = tempfile.mkdtemp(prefix="ibvb-shm-", dir="/tmp")  # stands in for /dev/shm (root, 1777)
    prod = None
    try:
        os.chmod(roots, 0o755)
        os.chmod(shm, 0o1777)
        good, bad = os.path.join(roots, "alice"), os.path.join(shm, "alice")
        for d in (good, bad):
            os.mkdir(d, 0o755)
            os.chown(d, a, a)
        env = {k: v for k, v in os.environ.items() if k not in (L.ENV_DIR, "XDG_RUNTIME_DIR")}
        prod = subprocess.Popen(["setpriv", f"--reuid={a}", f"--regid={a}", f"--groups={g}", PY, "-c",
                                 SHARED_PRODUCER, PKG, str(g), good, bad], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env, cwd="/")
        sessions = prod.stdout.readline().split()
        assert len(sessions) == 2, "the producer did not start"
        r = subprocess.run(["setpriv", f"--reuid={b}", f"--regid={b}", f"--groups={g}", PY, "-c", SHARED_CONSUMER,
                            PKG, good, bad], capture_output=True, text=True, env=env, cwd="/", timeout=60)
        member = r.stdout.splitlines()
        assert member[0] == f"ok {sessions[0]}", r.stderr
        assert member[1].startswith("refused") and f"ring directory {bad} is not trusted: owned by uid {a}" in member[1]
        with Ring.attach("shared", directory=good, timeout=5) as ring:  # root
            assert ring.session_id == int(sessions[0]) and ring.producer_uid == a
        with pytest.raises(PermissionDenied, match=f"ring directory {bad} is not trusted"):
            Ring.attach("shared", directory=bad, timeout=5)
    finally:
        if prod is not None:
            prod.stdin.close()
            prod.wait(10)
            prod.stdout.close()
        shutil.rmtree(roots, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
