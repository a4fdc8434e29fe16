"""The ring simulation's driver for the Python producer (internal/ringsim, docs/ring-layout.md §7, §14).

The Go harness plays the consumers itself (raw hellos, their mapped regions); this program runs the
producer's side and answers one line per command read on stdin:

  create DIR SLOTS ROWS POLICY START  -> ok SOCKET_PATH
  publish EOS WAIT_MS                 -> published | dropped | full | pending  (pending: still waiting, block)
  await WAIT_MS                       -> published | full | pending            (the waiting publish, if any)
  unread                              -> ok      (reads every cursor, as the heartbeat does; no reclaim)
  free                                -> N       (reclaims, then counts free slots; never while pending)
  quit                                -> bye

Publishing runs on one worker thread (the hot path); every other command on the main thread, under the
producer's lock where it touches its state."""

import sys
import threading

from ibvbridge.errors import Interrupted, RingFull
from ibvbridge.producer import Q_HEAD, Producer


def main():
    p = None
    worker = None
    result = []

    def out(s):
        sys.stdout.write(s + "\n")
        sys.stdout.flush()

    def run(eos):
        try:
            if eos:
                p.end_of_stream(0, None)
            else:
                s = p.acquire()
                p.publish(s, 1)
            result.append("published")
        except RingFull:
            if not eos:
                p.add("dropped_heaps", 1)  # the caller counts what it drops
            result.append("full" if eos else "dropped")
        except Interrupted:
            result.append("interrupted")

    def wait(ms):
        nonlocal worker
        worker.join(ms / 1000)
        if worker.is_alive():
            return "pending"
        worker = None
        return result.pop()

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "create":
            d, slots, rows, policy, start = cmd[1], int(cmd[2]), int(cmd[3]), cmd[4], int(cmd[5])
            p = Producer("sim", slot_count=slots, slot_size=64, max_items=1, meta_size=4096, policy=policy,
                         hugepages="off", directory=d, max_consumers=rows, start_position=start)
            out(f"ok {p.directory}/sim.v2.sock")
        elif cmd[0] == "publish":
            worker = threading.Thread(target=run, args=(cmd[1] == "1",), daemon=True)
            worker.start()
            out(wait(int(cmd[2])))
        elif cmd[0] == "await":
            out(wait(int(cmd[1])) if worker else "none")
        elif cmd[0] == "unread":
            with p.lock:
                p._read_cursors_locked(p.c64[Q_HEAD])
            out("ok")
        elif cmd[0] == "free":
            with p.lock:
                p._reclaim_locked()
                out(str(p._nfree()))
        elif cmd[0] == "quit":
            if p is not None:
                p.interrupt()
                if worker:
                    worker.join(3)
                p.close()
            out("bye")
            return


if __name__ == "__main__":
    main()
