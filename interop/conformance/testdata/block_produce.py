"""The Python producer for the conformance suite's interrupt test: a block ring (python3 block_produce.py DIR
NAME SLOTS) that publishes until it blocks on its consumers; closing its standard input makes another
thread call Producer.interrupt(), so only the producer's wake (not a signal's EINTR) can end the wait.
Prints "interrupted" and exits 0 when the blocked publish raised Interrupted."""
import sys
import threading

from ibvbridge import Interrupted, Producer


def main():
    d, name, slots = sys.argv[1], sys.argv[2], int(sys.argv[3])
    p = Producer.create(name, slot_count=slots, slot_size=4096, max_items=2, policy="block", hugepages="off",
                        directory=d)
    try:
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
