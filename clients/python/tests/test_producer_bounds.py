"""Layout 2.1 §C/§D on the Python producer: nothing a connection creates outlives it (regions unmapped when a
consumer leaves an idle ring, silent connections closed after HELLO_TIMEOUT and counted, a descriptor
reserve so a flood is refused as busy with the true reason), group membership from the peer's real groups
(SO_PEERGROUPS), sizes checked before anything is made."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from ibvbridge import Producer, Ring, RingBusy
from ibvbridge import layout as L
from ibvbridge import producer as producer_mod

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
PY = sys.executable


def usage():
    """(mapping lines, open descriptors) of this process."""
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return maps, len(os.listdir("/proc/self/fd"))


def hello_cycle(path, role=L.ROLE_CONSUMER):
    """One raw attach and detach: hello, welcome (its descriptors closed at once), close."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(5)
        s.connect(path)
        s.sendall(L.pack_hello(role, L.START_HEAD))
        msg, fds, _, _ = socket.recv_fds(s, L.ERROR_RECORD_MAX, 8)
        for fd in fds:
            os.close(fd)
        return L.unpack_record(msg)
    finally:
        s.close()


def wait_until(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_attack_idle_attach_detach_churn_keeps_maps_and_fds_bounded(tmp_path):
    with Producer.create("churn", slot_count=4, slot_size=64, hugepages="off", directory=str(tmp_path)) as p:
        for _ in range(50):  # warm up: first-use allocations of the interpreter are not a leak
            assert hello_cycle(p.socket_path)["status"] == L.STATUS_OK
            wait_until(lambda: not p.conns, "consumer not gone")
        before = usage()
        n = 3000
        for _ in range(n):
            assert hello_cycle(p.socket_path)["status"] == L.STATUS_OK
            wait_until(lambda: not p.conns, "consumer not gone")
        assert p.stats()["consumers_attached"] == 0 and p.head == 0  # idle: nothing was published
        after = usage()
        # each cycle maps a 4 KiB region and holds a socket: n leaked cycles would add n lines / descriptors
        assert after[0] - before[0] <= 16 and after[1] - before[1] <= 4, (before, after)


def test_attack_observer_flood_holds_nothing(tmp_path):
    with Producer.create("obs", slot_count=4, slot_size=64, hugepages="off", directory=str(tmp_path)) as p:
        before = usage()
        for _ in range(300):
            w = hello_cycle(p.socket_path, L.ROLE_OBSERVER)
            assert w["status"] == L.STATUS_OK and w["consumer_index"] == L.NO_CONSUMER_INDEX
        with Ring.attach(p.socket_path, timeout=2) as ring:  # a consumer still gets in
            assert ring.session_id == p.session_id
        after = usage()
        assert after[1] - before[1] <= 4, (before, after)


def test_attack_silent_connections_are_closed_after_the_hello_timeout_and_do_not_block_attach(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setattr(producer_mod, "HELLO_TIMEOUT", 0.5)
    with Producer.create("quiet", slot_count=4, slot_size=64, hugepages="off", directory=str(tmp_path)) as p:
        silent = []
        try:
            for _ in range(40):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(p.socket_path)
                silent.append(s)
            # 2.0 answered connections one at a time, waiting up to 1 s for each hello: 40 s for this attach
            with Ring.attach(p.socket_path, timeout=5) as ring:
                assert ring.session_id == p.session_id
            wait_until(lambda: p.hello_timeouts == 40, f"{p.hello_timeouts} silent connections closed, want 40")
            for s in silent:
                s.settimeout(5)
                assert s.recv(256) == b""  # closed by the producer
        finally:
            for s in silent:
                s.close()


FD_CHILD = """
import os, resource, socket, sys, time
sys.path.insert(0, sys.argv[1])
from ibvbridge import Producer
p = Producer.create("fds", slot_count=4, slot_size=64, hugepages="off", directory=sys.argv[2])
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print("ready", flush=True)
sys.stdin.read()
p.close()
"""


def test_attack_descriptor_flood_is_refused_busy_with_the_true_reason(tmp_path):
    child = subprocess.Popen([PY, "-c", FD_CHILD, PKG, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    held = []
    try:
        assert child.stdout.readline().strip() == "ready"
        path = str(tmp_path / "fds.v2.sock")
        for _ in range(30):  # silent connections: each holds one of the producer's descriptors
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            held.append(s)
        with pytest.raises(RingBusy, match="busy: the producer has [0-9]+ file descriptors left \\(keeps 32 in "
                           "reserve\\)"):
            Ring.attach(path, timeout=5)
    finally:
        for s in held:
            s.close()
        child.stdin.close()
        child.wait(10)


def test_huge_geometry_is_refused_in_one_line_before_anything_is_made(tmp_path):
    d = tmp_path / "ring"
    with pytest.raises(ValueError, match="^a ring of 16777216 slots x 1099511627776 bytes with 1 items each needs "
                       "[0-9]+ bytes of data memory, more than the 9223372036854775807 a ring can have$"):
        Producer.create("big", slot_count=16777216, slot_size=1 << 40, max_items=1, hugepages="off",
                        directory=str(d))
    assert not d.exists()
    r = subprocess.run([PY, "-m", "ibvbridge.produce", "--ring", "big", "--dir", str(d), "--slots", "16777216",
                        "--heap-size", str(1 << 40), "--hugepages", "off"], cwd=PKG, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1 and "more than" in r.stderr, r.stderr
    assert not d.exists()


def test_group_member_by_real_groups_not_etc_group():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a consumer with a group given by setgroups")
    uid = 20000 + os.getpid() % 20000
    gid = uid + 1  # in no /etc/group entry: only SO_PEERGROUPS can tell the producer
    d = tempfile.mkdtemp(prefix="ibvb-groups-", dir="/dev/shm")
    try:
        os.chmod(d, 0o755)
        with Producer.create("grp", slot_count=4, slot_size=64, hugepages="off", directory=d, group=gid,
                             policy="block") as p:
            p.end_of_stream(timeout=1)
            env = dict(os.environ, PYTHONPATH=PKG)
            r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={gid}", PY, "-m",
                                "ibvbridge.consume", "--ring", f"{d}/grp.v2.sock", "--timeout-ms", "5000"],
                               capture_output=True, text=True, env=env, cwd=PKG, timeout=60)
            out = json.loads(r.stdout)
            assert r.returncode == 0 and out["result"] == "eos" and out["session_id"] == p.session_id, \
                (out, r.stderr)
            os.chmod(f"{d}/grp.v2.sock", 0o666)  # past the file mode: only the producer's gate decides now
            r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", PY, "-m",
                                "ibvbridge.consume", "--ring", f"{d}/grp.v2.sock", "--timeout-ms", "5000"],
                               capture_output=True, text=True, env=env, cwd=PKG, timeout=60)
            assert r.returncode == 1 and f"uid {uid} may not attach" in r.stderr, r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)
