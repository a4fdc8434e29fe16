"""The receiving loop of `ibvbridge bench python`: one ItemGroup loop body, over spead2's Python receiver
or over an ibvbridge ring, so the two differ only in what feeds the loop.

    python3 pyloop.py spead2 PORT BUFFER RING_HEAPS HEAP_SIZE
    python3 pyloop.py ibvbridge RING_NAME

Every heap goes through ``ig.update(heap)``; a heap that carries the sender's ``send_ns`` item (its send
time, CLOCK_REALTIME nanoseconds modulo 2**48) gives one latency sample: the loop's receive time minus
it. At the end of the stream one JSON line: heaps seen, stamped heaps, latency median / p99 / max in µs,
the process's own CPU seconds from its first heap (getrusage, every thread), and, for spead2, the
stream's counters.
"""
import json
import resource
import sys
import time

MASK = (1 << 48) - 1


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summary(lat, heaps, cpu0, extra):
    lat.sort()
    n = len(lat)
    out = {"heaps": heaps, "stamped": n, "cpu_seconds": cpu() - cpu0 if cpu0 is not None else 0.0}
    if n:
        out.update(latency_median_us=lat[n // 2] / 1e3, latency_p99_us=lat[min(n - 1, n * 99 // 100)] / 1e3,
                   latency_max_us=lat[-1] / 1e3)
    out.update(extra)
    print(json.dumps(out), flush=True)


def loop(source, ig):
    """The loop body both receivers share."""
    lat = []
    heaps = 0
    cpu0 = None
    time_ns = time.time_ns
    for heap in source:
        items = ig.update(heap)
        now = time_ns()
        if cpu0 is None:
            cpu0 = cpu()
        heaps += 1
        stamp = items.get("send_ns")
        if stamp is not None:
            lat.append((now - stamp.value) & MASK)
    return lat, heaps, cpu0


def main():
    mode = sys.argv[1]
    if mode == "spead2":
        import spead2
        import spead2.recv
        port, buffer, ring_heaps, heap_size = (int(x) for x in sys.argv[2:6])
        pool = spead2.MemoryPool(heap_size, heap_size + 4096, ring_heaps + 8, ring_heaps + 8)
        stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(memory_allocator=pool),
                                    spead2.recv.RingStreamConfig(heaps=ring_heaps))
        stream.add_udp_reader(port, max_size=9200, buffer_size=buffer, bind_hostname="127.0.0.1")
        print("ready", file=sys.stderr, flush=True)
        lat, heaps, cpu0 = loop(stream, spead2.ItemGroup())
        st = stream.stats
        extra = {"incomplete": int(st["incomplete_heaps_evicted"]) + int(st["incomplete_heaps_flushed"])}
        stream.stop()
        summary(lat, heaps, cpu0, extra)
        return
    import ibvbridge
    with ibvbridge.attach(sys.argv[2], timeout=60) as ring:
        print("ready", file=sys.stderr, flush=True)
        lat, heaps, cpu0 = loop(ring, ibvbridge.ItemGroup())
    summary(lat, heaps, cpu0, {})


if __name__ == "__main__":
    main()
