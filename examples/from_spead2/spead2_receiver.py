#!/usr/bin/env python3
"""A typical spead2 receiver: items by name, asyncio. Prints one line per heap.

The original of receiver.py (docs/how-to/migrate-from-spead2.md puts them side by side); it needs spead2 installed.
"""
import argparse
import asyncio
import sys

import numpy as np
import spead2
import spead2.recv.asyncio


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int, help="UDP port the stream arrives on")
    parser.add_argument("--heaps", type=int, default=0, help="stop after N heaps (0: at the stream's end)")
    return parser.parse_args()


async def receive(args):
    stream = spead2.recv.asyncio.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(max_heaps=4))
    stream.add_udp_reader(args.port, buffer_size=8 << 20)
    ig = spead2.ItemGroup()
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
    stream.stop()
    print(f"{n} heaps", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(receive(parse_args()))
