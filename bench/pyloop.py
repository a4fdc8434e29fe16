"""The receiving loop of `ibvbridge bench python`: one loop body per mode, over spead2's Python receiver or
over an ibvbridge ring, so the two differ only in what feeds the loop.

    python3 pyloop.py spead2 heaps PORT BUFFER RING_HEAPS HEAP_SIZE
    python3 pyloop.py ibvbridge heaps RING_NAME
    python3 pyloop.py spead2 chunks PORT BUFFER RING_CHUNKS HEAPS_PER_CHUNK HEAP_SIZE PLACE_SO
    python3 pyloop.py ibvbridge chunks RING_NAME

Heaps: every heap goes through ``ig.update(heap)``; a heap that carries the sender's ``send_ns`` item (its
send time, CLOCK_REALTIME nanoseconds modulo 2**48) gives one latency sample: the loop's receive time minus
it. Chunks (spead2.recv.ChunkRingStream placing with the compiled ``place`` of PLACE_SO, or a chunk-mode
ring): every chunk's presence map is counted, and a chunk whose last heap arrived gives one latency sample
from the send time that heap carries in its first 8 bytes. At the end of the stream one JSON line: heaps
seen (present), stamped heaps, chunks, latency median / p99 / max in µs, the process's own CPU seconds from
its first heap or chunk (getrusage, every thread), and, for spead2, the stream's counters.
"""
import json
import resource
import sys
import time

MASK = (1 << 48) - 1
STREAM_CTRL_ID = 0x06  # its value tells spead2's place (bench/cplace/spead2_place.c) the stream-stop heap
INTERRUPTED = [False]  # SIGINT ended the loop before its stream did: the summary says so


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summary(lat, heaps, chunks, cpu0, extra):
    lat.sort()
    n = len(lat)
    out = {"heaps": heaps, "stamped": n, "chunks": chunks, "cpu_seconds": cpu() - cpu0 if cpu0 is not None else 0.0,
           "interrupted": INTERRUPTED[0]}
    if n:
        out.update(latency_median_us=lat[n // 2] / 1e3, latency_p99_us=lat[min(n - 1, n * 99 // 100)] / 1e3,
                   latency_max_us=lat[-1] / 1e3)
    out.update(extra)
    print(json.dumps(out), flush=True)


def loop(source, ig):
    """The heap loop body both receivers share."""
    lat = []
    heaps = 0
    cpu0 = None
    time_ns = time.time_ns
    try:
        for heap in source:
            items = ig.update(heap)
            now = time_ns()
            if cpu0 is None:
                cpu0 = cpu()
            heaps += 1
            stamp = items.get("send_ns")
            if stamp is not None:
                lat.append((now - stamp.value) & MASK)
    except KeyboardInterrupt:  # the harness ends a loop whose stream stop never came (lost with other heaps)
        INTERRUPTED[0] = True
    return lat, heaps, 0, cpu0


def chunk_loop(source):
    """The chunk loop body both receivers share: a chunk's data is [time, axis, heap bytes] and its presence
    map [time, axis], on either side."""
    import numpy as np
    lat = []
    heaps = chunks = 0
    cpu0 = None
    time_ns = time.time_ns
    count = np.count_nonzero
    try:
        for chunk in source:
            present = chunk.present
            now = time_ns()
            if cpu0 is None:
                cpu0 = cpu()
            chunks += 1
            heaps += int(count(present))
            if present[-1, 0]:
                lat.append((now - int(chunk.data[-1, 0, :8].view(np.uint64)[0])) & MASK)
    except KeyboardInterrupt:
        INTERRUPTED[0] = True
    return lat, heaps, chunks, cpu0


def compiled_place(path, heaps, heap_size):
    """spead2's place callback: function ``place`` of the shared object at path, as the tuple spead2 takes (a
    PyCapsule named by its signature, its context the geometry [heaps per chunk, heap bytes]; what
    scipy.LowLevelCallable makes), holding what the capsule points to."""
    import ctypes
    lib = ctypes.CDLL(path)
    geometry = (ctypes.c_int64 * 2)(heaps, heap_size)
    signature = b"void (void *, size_t, void *)"
    new, set_context = ctypes.pythonapi.PyCapsule_New, ctypes.pythonapi.PyCapsule_SetContext
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    set_context.restype, set_context.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_void_p)
    capsule = new(ctypes.cast(lib.place, ctypes.c_void_p), signature, None)
    if set_context(capsule, ctypes.addressof(geometry)) != 0:
        raise RuntimeError("PyCapsule_SetContext failed")
    return (capsule, lib, geometry, signature)


def spead2_chunks(stream):
    """The chunks of a ChunkRingStream, each given back to the stream once the loop has read it."""
    for chunk in stream.data_ringbuffer:
        yield chunk
        stream.add_free_chunk(chunk)


def main():
    receiver, mode = sys.argv[1], sys.argv[2]
    if receiver == "spead2":
        import spead2
        import spead2.recv
        port, buffer, ring = (int(x) for x in sys.argv[3:6])
        if mode == "chunks":
            import numpy as np
            heaps, heap_size = int(sys.argv[6]), int(sys.argv[7])
            config = spead2.recv.ChunkStreamConfig(items=[spead2.HEAP_CNT_ID, STREAM_CTRL_ID],
                                                   place=compiled_place(sys.argv[8], heaps, heap_size))
            stream = spead2.recv.ChunkRingStream(spead2.ThreadPool(), spead2.recv.StreamConfig(), config,
                                                 spead2.recv.ChunkRingbuffer(ring),
                                                 spead2.recv.ChunkRingbuffer(ring + config.max_chunks))
            for _ in range(ring + config.max_chunks):  # np.full writes every page now: the run sees no first touches
                stream.add_free_chunk(spead2.recv.Chunk(present=np.full((heaps, 1), 0, np.uint8),
                                                        data=np.full((heaps, 1, heap_size), 0, np.uint8)))
            source, counters = spead2_chunks(stream), ("too_old_heaps", "rejected_heaps")
        else:
            heap_size = int(sys.argv[6])
            pool = spead2.MemoryPool(heap_size, heap_size + 4096, ring + 8, ring + 8)
            stream = spead2.recv.Stream(spead2.ThreadPool(), spead2.recv.StreamConfig(memory_allocator=pool),
                                        spead2.recv.RingStreamConfig(heaps=ring))
            source, counters = stream, ()
        stream.add_udp_reader(port, max_size=9200, buffer_size=buffer, bind_hostname="127.0.0.1")
        print("ready", file=sys.stderr, flush=True)
        lat, heaps, chunks, cpu0 = chunk_loop(source) if mode == "chunks" else loop(source, spead2.ItemGroup())
        st = stream.stats
        extra = {"incomplete": int(st["incomplete_heaps_evicted"]) + int(st["incomplete_heaps_flushed"])}
        extra.update((k, int(st[k])) for k in counters)
        stream.stop()
        summary(lat, heaps, chunks, cpu0, extra)
        return
    import ibvbridge
    with ibvbridge.attach(sys.argv[3], timeout=60) as ring:
        print("ready", file=sys.stderr, flush=True)
        lat, heaps, chunks, cpu0 = chunk_loop(ring.chunks()) if mode == "chunks" else loop(ring, ibvbridge.ItemGroup())
    summary(lat, heaps, chunks, cpu0, {})


if __name__ == "__main__":
    main()
