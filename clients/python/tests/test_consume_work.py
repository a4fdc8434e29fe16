"""The consume tool's --work (CPU-bound work per chunk for `ibvbridge bench group`): chunk_power computes
power per channel over the present heaps, and the tool with --work reads a chunk ring exactly as without."""

import os

import numpy as np
import pytest

from ibvbridge import layout as L
from ibvbridge.consume import chunk_power
from test_chunks import CB, NP, S, chunk_producer, pattern_chunk
from test_consume import consume


def test_chunk_power_sums_re2_plus_im2_per_channel_over_present_heaps_only():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=(4, 3, 32), dtype=np.uint8)  # [time, axis, 16 channels × (re, im)]
    present = np.ones((4, 3), bool)
    present[1, 2] = present[3, 0] = False
    x = data.view(np.int8).astype(np.float64).reshape(4, 3, 16, 2)
    want = ((x ** 2).sum(axis=-1) * present[:, :, None]).sum(axis=0)  # [axis, channel]
    for passes in (1, 3):
        got = chunk_power(data, present, passes)
        assert got.shape == (3, 16) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert chunk_power(data, present, 0) is None  # no pass, no work


@pytest.mark.parametrize("batch", [[], ["--batch", "64"]])  # 64: the tool batches when 64 chunks wait
def test_consume_tool_with_work_reads_a_chunk_ring_as_without(make_producer, batch):
    outs = []
    for work in ([], ["--work", "2"]):
        p = chunk_producer(make_producer, slot_count=128)  # the stream fits: nothing overwritten before attach
        for cid in range(70):
            p.publish(cid, pattern_chunk(cid, [1] * NP), flags=L.FLAG_CHUNK | L.FLAG_COMPLETE, heap_size=CB, received=CB)
        p.publish_eos()
        rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--verify", *batch, *work)
        assert rc == 0 and out["result"] == "eos", out
        outs.append(out)
        p.close()
    keys = ("heaps", "chunks", "heaps_present", "checksum", "verify_errors", "heap_cnt_sum", "bytes")
    assert [outs[1][k] for k in keys] == [outs[0][k] for k in keys] == [70, 70, 70 * NP, outs[0]["checksum"], 0, 70 * 69 // 2, 70 * CB]


def test_consume_tool_work_refuses_a_heap_ring(make_producer):
    p = make_producer(slot_count=16, slot_size=128)
    p.publish(1, bytes(64))
    p.publish_eos()
    rc, out = consume("--ring", "r", "--dir", os.path.dirname(p.socket_path), "--work", "1")
    assert rc == 1 and out["result"] == "error" and "--work needs a chunk-mode ring" in out["error"]
