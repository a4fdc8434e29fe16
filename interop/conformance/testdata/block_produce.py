"""The Python producer for the conformance suite's long-lived rings (python3 block_produce.py DIR NAME SLOTS MODE).
MODE block: a block ring that publishes, once a consumer attached, until it blocks on its consumers; closing
its standard input makes another thread call Producer.interrupt(), so only the producer's wake (not a
signal's EINTR) can end the wait; it prints "interrupted" and exits 0 when the blocked publish raised
Interrupted. MODE idle: a drop ring that publishes SLOTS/2 heaps, then does nothing until its standard input
closes."""
import sys
import threading

from ibvbridge import Interrupted, Producer


def main():
    d, name, slots, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    p = Producer.create(name, slot_count=slots, slot_size=4096, max_items=2,
                        policy="block" if mode == "block" else "drop", hugepages="off", directory=d)
    try:
        if mode == "idle":
            for cnt in range(1, slots // 2 + 1):
                p.publish(p.acquire(), cnt, 0)
            sys.stdin.buffer.read()
            return
        p.wait_consumers(1, timeout=30)

        def watch():
            sys.stdin.buffer.read()
            p.interrupt()
        threading.Thread(target=watch, daemon=True).start()
        cnt = 0
        try:
            while True:
                s = p.acquire()
                cnt += 1
                p.publish(s, cnt, 0)
        except Interrupted:
            print("interrupted", flush=True)
    finally:
        p.close()


if __name__ == "__main__":
    main()
