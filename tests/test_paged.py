"""Paged KV (block_table, block_size) on every backend against the fp64 golden of the same
tokens laid out contiguously: decode and prefill, TND batches mixing decode and chunked
prefill (q_len < kv_len), sparse modes 0/3/4, both cache shapes, shared and
non-contiguous blocks; and the errors for bad paged input."""
from __future__ import annotations

import math

import pytest
import torch

import pasa_npu
from pasa_npu import paging
from _paged import PAGED_CASES, paged_case
from _support import (BACKENDS, DEVICE_OF, assert_measured, device_kind, dtype_name,
                      interpreter_skip, on_device, rel_rmse, skip_unsupported)

#: the allocations with paged variants of their own (pasa-exact's block means, pasa's shift, and
#: fa-fp32 without a shift); the others share their addressing
ALGORITHMS = ("fa-fp32", "pasa", "pasa-exact")


@pytest.fixture(scope="module")
def golden_cache():
    return {}


def _case(cache, name, dtype):
    if (name, dtype) not in cache:
        q, k_cache, v_cache, kw, (k, v, dense_kw) = paged_case(PAGED_CASES[name], dtype)
        cache[name, dtype] = (q, k_cache, v_cache, kw,
                              pasa_npu.reference_attention(q, k, v, **dense_kw))
    return cache[name, dtype]


GOLDEN_FACTOR = 1.5  # as the golden matrix's (tests/test_golden.py)


def _check(out, lse, gold, gold_lse, dtype, algorithm, backend, name):
    """Finite, and relative RMSE and LSE error within 1.5x the measured (tests/measured.json,
    key family "paged-<case>")."""
    out, lse = out.cpu(), lse.cpu()
    assert out.shape == gold.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    key = f"{device_kind(backend)}/{dtype_name(dtype)}/{algorithm}/paged-{name}"
    assert_measured(rel_rmse(out, gold), "golden-rmse", key, GOLDEN_FACTOR, name)
    lse_err = float((lse.double() - gold_lse).abs().max())
    assert_measured(lse_err, "golden-lse", key, GOLDEN_FACTOR, name)


def _run_and_check(q, k_cache, v_cache, kw, gold, gold_lse, dtype, algorithm, backend, name):
    """The paged call on ``backend``'s device (the table and mask moved there too)."""
    kw = dict(kw, block_table=on_device(backend, kw["block_table"])[0])
    if "atten_mask" in kw:
        kw["atten_mask"] = on_device(backend, kw["atten_mask"])[0]
    with skip_unsupported(backend):
        out, lse = pasa_npu.fused_attention(*on_device(backend, q, k_cache, v_cache),
                                            algorithm=algorithm, backend=backend, **kw)
    _check(out, lse, gold, gold_lse, dtype, algorithm, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_matches_golden(name, algorithm, backend, golden_cache):
    dtype = torch.float16
    q, k_cache, v_cache, kw, (gold, gold_lse) = _case(golden_cache, name, dtype)
    _run_and_check(q, k_cache, v_cache, kw, gold, gold_lse, dtype, algorithm, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algorithm", ("fa-fp32", "pasa"))
@pytest.mark.parametrize("name", ["decode-bsh-3d", "tnd-mixed-3d-causal"])
def test_paged_bf16_matches_golden(name, algorithm, backend, golden_cache):
    """bf16 caches: fa-fp32 reads them through the table, PASA's fp16 compute takes a
    converted copy of the rows the table names."""
    dtype = torch.bfloat16
    if reason := interpreter_skip(backend, algorithm, dtype):
        pytest.skip(reason)
    q, k_cache, v_cache, kw, (gold, gold_lse) = _case(golden_cache, name, dtype)
    _run_and_check(q, k_cache, v_cache, kw, gold, gold_lse, dtype, algorithm, backend, name)


# ---- bad paged input --------------------------------------------------------------------

def _decode_call(**changes):
    """A valid paged decode call (BNSD, 4-D caches of 4 blocks of 16), with ``changes``."""
    gen = torch.Generator().manual_seed(1)
    args = dict(query=torch.randn(2, 2, 1, 16, generator=gen).half(),
                key=torch.randn(4, 1, 16, 16, generator=gen).half(),
                value=torch.randn(4, 1, 16, 16, generator=gen).half(),
                num_heads=2, num_key_value_heads=1, input_layout="BNSD",
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), block_size=16,
                actual_seq_lengths_kv=[20, 32], scale=0.25)
    args.update(changes)
    return args


def _call(args):
    return pasa_npu.fused_attention(args.pop("query"), args.pop("key"), args.pop("value"),
                                    backend="torch", **args)


def test_valid_decode_call_runs():
    out, _ = _call(_decode_call())
    assert out.shape == (2, 2, 1, 16) and torch.isfinite(out).all()


@pytest.mark.parametrize("changes, error, words", [
    (dict(block_table=torch.tensor([[0, 4], [2, 3]], dtype=torch.int32)), ValueError,
     r"block_table\[0, 1\] = 4 .*\[0, 4\)"),
    (dict(block_table=torch.tensor([[0, 1], [-1, 3]], dtype=torch.int32)), ValueError,
     r"block_table\[1, 0\] = -1"),
    (dict(block_size=24, key=torch.zeros(4, 1, 24, 16).half(),
          value=torch.zeros(4, 1, 24, 16).half()), ValueError,
     r"block_size must be a multiple of 16 up to 512 in decode"),
    (dict(actual_seq_lengths_kv=[20, 33]), ValueError,
     r"actual_seq_lengths_kv\[1\] = 33 is outside \[0, 32\] \(block_table's 2 blocks"),
    (dict(actual_seq_lengths_kv=None), ValueError, r"actual_seq_lengths_kv is required"),
    (dict(block_table=torch.tensor([[0, 1]], dtype=torch.int32)), ValueError,
     r"block_table has 1 rows but the batch is 2"),
    (dict(block_table=torch.tensor([[0, 1], [2, 3]])), TypeError,
     r"block_table must be a 2-D int32 tensor"),
    (dict(block_table=None), ValueError, r"block_size=16 needs a block_table"),
    (dict(block_size=0), ValueError, r"block_table needs block_size > 0"),
    (dict(key=torch.zeros(4, 1, 32, 16).half()), ValueError,
     r"key cache \(4, 1, 32, 16\) does not fit \(num_blocks, N_kv, block_size, D\)"),
    (dict(value=torch.zeros(3, 1, 16, 16).half()), ValueError,
     r"value cache has 3 blocks but the key cache 4"),
    (dict(key=torch.zeros(4, 16, 16).half(), value=torch.zeros(4, 16, 16).half(),
          input_layout="BSH", query=torch.zeros(2, 1, 32).half()), None, None),
    (dict(key=torch.zeros(4, 8, 16).half(), value=torch.zeros(4, 8, 16).half(),
          input_layout="BSH", query=torch.zeros(2, 1, 32).half()), ValueError,
     r"key cache \(4, 8, 16\) does not fit \(num_blocks, block_size, N_kv \* D\)"),
    (dict(input_layout="BSND", query=torch.zeros(2, 1, 2, 16).half()), ValueError,
     r"key cache with block_table must be \(num_blocks, block_size, N_kv \* D\)"),
])
def test_bad_paged_input_names_the_argument(changes, error, words):
    if error is None:  # the 3-D cache with a BSH query is valid: the control of the next
        _call(_decode_call(**changes))
        return
    with pytest.raises(error, match=words):
        _call(_decode_call(**changes))


def test_host_table_is_checked_on_every_call():
    """A host table is checked on each call, also after a write PyTorch's version counter
    does not see (numpy's view of it), and a bad entry names block_table."""
    args = _decode_call()
    table = args["block_table"]
    _call(dict(args))
    table.numpy()[1, 0] = 7
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 7 .*\[0, 4\)"):
        _call(dict(args))


def test_entries_past_the_kv_lengths_are_not_checked():
    """Entries no key reaches (padding) may hold anything, -1 included."""
    args = _decode_call(block_table=torch.tensor([[0, 1, -1], [2, 3, 99]], dtype=torch.int32),
                        actual_seq_lengths_kv=[20, 32])
    out, _ = _call(args)
    assert torch.isfinite(out).all()


def test_device_table_check_is_kept_per_version(monkeypatch):
    """A device table's read-back runs once per version of the table (its in-place writes,
    through any view, make a new version); its kv lengths do not matter. An inference
    tensor, which has no version, is read back on every call."""
    reads = []
    real = paging._valid_prefix
    monkeypatch.setattr(paging, "_valid_prefix", lambda t, n: reads.append(1) or real(t, n))
    memo = paging.TensorMemo()

    def prefix(table, num_blocks):
        return paging.checked_prefix(table, num_blocks, memo)

    table = torch.tensor([[0, 1, 9], [2, 3, 1]], dtype=torch.int32)
    assert prefix(table, 4) == (2, 3)
    assert prefix(table, 4) == (2, 3) and len(reads) == 1
    table[0].fill_(3)  # a write through a view
    assert prefix(table, 4) == (3, 3) and len(reads) == 2
    table[1, 0] = -1
    assert prefix(table, 4) == (3, 0) and len(reads) == 3
    assert prefix(table, 8) == (3, 0) and len(reads) == 4  # another cache size
    assert prefix(table.clone(), 8) == (3, 0) and len(reads) == 5  # another tensor
    assert prefix(table[:], 8) == (3, 0) and len(reads) == 5  # a fresh view of the same
    assert prefix(table[:1], 8) == (3,) and len(reads) == 6  # a view of other rows
    with torch.inference_mode():
        frozen = torch.tensor([[0, 1]], dtype=torch.int32)
    prefix(frozen, 4)
    prefix(frozen, 4)
    assert len(reads) == 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_with_column_stride_reads_as_contiguous(backend):
    """A table whose entries are not adjacent in memory (a transposed copy's view) gives
    the result of the same entries in a contiguous table."""
    q, k_cache, v_cache, kw, _ = paged_case(PAGED_CASES["decode-bnsd-4d"], torch.float16)
    strided = kw["block_table"].T.contiguous().T
    assert strided.stride(1) != 1
    q, k_cache, v_cache = on_device(backend, q, k_cache, v_cache)
    with skip_unsupported(backend):
        want = pasa_npu.fused_attention(q, k_cache, v_cache, backend=backend, algorithm="pasa",
                                        **dict(kw, block_table=on_device(
                                            backend, kw["block_table"])[0]))
    got = pasa_npu.fused_attention(q, k_cache, v_cache, backend=backend, algorithm="pasa",
                                   **dict(kw, block_table=on_device(backend, strided)[0]))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _slots_by_loop(table, kv_lens, block_size, entries):
    """page_slots' rule written out: a whole block's entries share its first whole entry's
    slot; every other entry keeps its own."""
    first, slots = {}, []
    for b, n in enumerate(kv_lens):
        for j in range(entries):
            own = b * entries + j
            whole = (j + 1) * block_size <= n
            slots.append(first.setdefault(int(table[b, j]), own) if whole else own)
    return slots


def test_page_slots_share_whole_blocks():
    """Shared whole blocks map to their first whole reference; ragged last blocks, entries
    past the kv length and padding keep their own slot (the Triton backend's K' slots)."""
    from pasa_npu.fallback.kernel_common import Binding
    from pasa_npu.fallback.triton.shift import page_slots
    dev = DEVICE_OF["triton"]
    table = torch.tensor([[5, 2, 7, 0, -1], [2, 5, 3, 7, 4], [7, 2, 2, 6, 1]], dtype=torch.int32)
    kv_lens = [48, 64, 33]  # block_size 16: 3, 4 and 2 whole blocks
    got = page_slots(table.to(dev), torch.tensor(kv_lens, dtype=torch.int32, device=dev), 16,
                     4, 8, Binding(None))
    want = _slots_by_loop(table, kv_lens, 16, 4)
    assert want[4 + 0] == 1 and want[8 + 0] == 2  # sharing happens in this case
    assert got.dtype == torch.int32 and got.shape == (3, 4)
    assert got.flatten().tolist() == want


@pytest.mark.parametrize("block_size", [16, 64, 640])
def test_prefill_block_size_follows_torch_npu(block_size):
    """S1 > 1 takes block sizes that are multiples of 128 up to 512 only."""
    q = torch.randn(1, 2, 4, 16).half()
    cache = torch.randn(2, 2, block_size, 16).half()
    with pytest.raises(ValueError, match=r"block_size must be a multiple of 128 up to 512 "
                                         r"when S1 > 1"):
        pasa_npu.fused_attention(q, cache, cache, num_heads=2, input_layout="BNSD",
                                 block_table=torch.tensor([[0]], dtype=torch.int32),
                                 block_size=block_size, actual_seq_lengths_kv=[4],
                                 scale=1 / math.sqrt(16))


@pytest.mark.parametrize("name", ["decode-bsh-3d", "tnd-mixed-4d-band"])
def test_paged_call_under_torch_compile_equals_eager(name):
    """The compiled operator's fake outputs take their shapes from the paged caches."""
    q, k_cache, v_cache, kw, _ = paged_case(PAGED_CASES[name], torch.float16)
    want = pasa_npu.fused_attention(q, k_cache, v_cache, backend="torch", **kw)
    compiled = torch.compile(
        lambda q, k, v: pasa_npu.fused_attention(q, k, v, backend="torch", **kw),
        fullgraph=True)
    got = compiled(q, k_cache, v_cache)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
def test_gpu_paged_decode_reads_the_table_at_replay(algorithm):
    """A paged decode captured in a CUDA graph (the table on the device: not checked
    during capture, no host synchronisation) reads the table when replayed: with its rows
    swapped in place, the replay gives the eager result of the swapped table."""
    q, k_cache, v_cache, kw, _ = paged_case(PAGED_CASES["decode-bnsd-4d"], torch.float16)
    q, k_cache, v_cache, table = (t.cuda() for t in (q, k_cache, v_cache, kw["block_table"]))
    kw = dict(kw, block_table=table, backend="triton", algorithm=algorithm)
    want = pasa_npu.fused_attention(q, k_cache, v_cache, **kw)  # plan and compile first
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pasa_npu.fused_attention(q, k_cache, v_cache, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = pasa_npu.fused_attention(q, k_cache, v_cache, **kw)
    graph.replay()
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    # swapped: request 1 now reads request 0's last block, whose slots past request 0's
    # length hold the cache's NaN poison, so its rows are NaN, in the replay as eagerly
    table.copy_(table.flip(0))
    want = pasa_npu.fused_attention(q, k_cache, v_cache, **kw)
    graph.replay()
    for got, expected in ((out, want[0]), (lse, want[1])):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (host syncs)")
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("table_on", ["cuda", "cpu"])
def test_gpu_paged_prefill_runs_without_host_sync(algorithm, table_on):
    """A paged prefill call with a table checked before (on the device) or a host table
    makes no synchronising CUDA call (torch's sync debug mode raises on one), and a bad
    entry written into the device table in place is still found, naming block_table."""
    q, k_cache, v_cache, kw, _ = paged_case(PAGED_CASES["prefill-bnsd-4d-causal"],
                                            torch.float16)
    q, k_cache, v_cache = (t.cuda() for t in (q, k_cache, v_cache))
    kw = dict(kw, block_table=kw["block_table"].to(table_on), backend="triton",
              algorithm=algorithm)
    kw["atten_mask"] = kw["atten_mask"].cuda()
    want = pasa_npu.fused_attention(q, k_cache, v_cache, **kw)  # plan, compile, check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = pasa_npu.fused_attention(q, k_cache, v_cache, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    kw["block_table"][0, 0] = k_cache.shape[0]
    with pytest.raises(ValueError, match=rf"block_table\[0, 0\] = {k_cache.shape[0]} "):
        pasa_npu.fused_attention(q, k_cache, v_cache, **kw)
