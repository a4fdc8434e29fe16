#!/usr/bin/env python3
"""The ibvbridge twin of a typical spead2 receiver: items by name, asyncio. Prints one line per heap.

spead2_receiver.py is the original; docs/how-to/migrate-from-spead2.md puts them side by side.
"""
import argparse
import asyncio
import sys

import numpy as np
import ibvbridge


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ring", help="the ring `ibvbridge recv --ring NAME PORT` writes the stream to")
    parser.add_argument("--heaps", type=int, default=0, help="stop after N heaps (0: at the stream's end)")
    return parser.parse_args()


async def receive(args):
    # wait=True: the recipe starts recv with &, so its ring may not exist yet (without it a missing ring is an
    # error at once, so a typo in the name says so rather than waiting)
    stream = ibvbridge.attach(args.ring, wait=True)  # recv --max-heaps 4 --buffer 8M holds the stream
    ig = ibvbridge.ItemGroup()
    n = 0
    async for heap in stream:
        changed = ig.update(heap)
        if "timestamp" not in changed:
            continue  # a heap of descriptors only
        data = ig["Test item 0"].value  # a numpy array, dtype and shape from its descriptor
        print(f"heap_cnt={ig['heap_cnt'].value} timestamp={ig['timestamp'].value} "
              f"dtype={data.dtype} shape={data.shape} first={int(data[0])} sum={int(data.sum(dtype=np.uint64))}")
        n += 1
        if n == args.heaps:
            break
    stream.close()
    print(f"{n} heaps", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(receive(parse_args()))
