"""The warp-specialised Gluon prefill (fallback/gluon/prefill.py) on an H100: it runs
where it applies, computes what the Triton kernel computes for the same allocation (bit
for bit for fa-fp32; pasa and pasa-exact sum on the tensor cores, in another order),
agrees with the CPU backend, and stays out of the cases it does not cover.
Gluon has no interpreter: on a CPU-only machine these tests skip, and
tests/fallback/triton/test_triton_compile.py compiles the kernel for sm_90 instead."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import record, triton_tuning
from _bounds import (assert_triton_matches_cpu, lse_bound, lse_scale, lse_scale_ulps, lse_unit,
                     out_bound, row_scale_ulps)

# The Gluon kernel against the Triton kernel, one allocation: the derived bounds of two
# implementations of it (tests/_bounds.py, "derived bounds"), at the most kv blocks a row
# walks in this file (2000 keys in blocks of 128; the bounds grow with them). The share of
# outputs and LSE values that differ is recorded as information: a flip moves whole rows.
MAX_KV_BLOCKS = 16


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = pytest.mark.skipif(
    not _hopper(), reason="needs an sm_90 (Hopper) GPU: the Gluon prefill runs nowhere else, "
                          "and not under the Triton interpreter")

# none a multiple of the 128-row tiles; the last one a single partial query tile
SHAPES = [(1000, 1000), (300, 520), (520, 300), (100, 1300)]
MODES = {"no mask": dict(), "causal (2)": dict(sparse_mode=2), "causal (3)": dict(sparse_mode=3),
         "band (4)": dict(sparse_mode=4, pre_tokens=200, next_tokens=30)}


@pytest.fixture
def gluon_launches(monkeypatch):
    """The number of Gluon prefill launches while the test runs: a plan's first call
    through :func:`gluon_prefill.run`, a later one repeating the launch it recorded."""
    from pasa_npu.fallback import kernel_common
    from pasa_npu.fallback.gluon import prefill as gluon_prefill

    launches = []
    run = gluon_prefill.run
    monkeypatch.setattr(gluon_prefill, "run", lambda *a: launches.append(1) or run(*a))
    repeat = kernel_common.PreparedLaunch.run

    def counted(bound, roles):
        if bound.name == "prefill_ws_kernel":
            launches.append(1)
        repeat(bound, roles)

    monkeypatch.setattr(kernel_common.PreparedLaunch, "run", counted)
    return launches


def _inputs(layout, s1, s2, heads, kv_heads, d, seed):
    gen = torch.Generator().manual_seed(seed)

    def make(s, h, shift=0.0):
        shape = (2, h, s, d) if layout == "BNSD" else (2, s, h, d)
        t = torch.randn(*shape, generator=gen) + shift
        return (t.reshape(2, s, h * d) if layout == "BSH" else t).half()

    return make(s1, heads), make(s2, kv_heads, 2.0), make(s2, kv_heads)


def _call(q, k, v, kw, prefill: str):
    with triton_tuning(prefill=prefill):
        return pasa_npu.fused_attention(q, k, v, backend="triton", **kw)


def _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse):
    """Bit for bit for fa-fp32. pasa's block mean and block sum, and pasa-exact's block
    sum, add the same fp16 values in fp32 on the tensor cores, in their order, so an fp16
    rounding flips now and then (a few outputs in 10^4 on large shapes): the output and LSE
    within the derived bounds of two implementations of one allocation."""
    if algorithm == "fa-fp32":
        assert torch.equal(out, kernel_out), (out.float() - kernel_out.float()).abs().max()
        assert torch.equal(lse, kernel_lse), (lse - kernel_lse).abs().max()
        return
    for name, got, want in (("output", out, kernel_out), ("lse", lse, kernel_lse)):
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), name
        differ = (got != want) & torch.isfinite(want)
        record("gluon-vs-triton-share", f"cuda/{algorithm}/{name}", differ.float().mean().item())
    out_ulps = row_scale_ulps(out.cpu(), kernel_out.cpu())
    assert out_ulps <= out_bound(algorithm, out.dtype, MAX_KV_BLOCKS), (algorithm, out_ulps)
    lse_err = lse_scale_ulps(lse.cpu(), kernel_lse.cpu(), lse_unit(algorithm, out.dtype))
    assert lse_err <= lse_bound(algorithm, lse_scale(kernel_lse.cpu())), (algorithm, lse_err)


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("layout,d", [("BNSD", 128), ("BSND", 128), ("BSH", 128), ("BNSD", 64)])
def test_gpu_gluon_prefill_equals_triton_kernel(layout, d, mode, algorithm, gluon_launches):
    case = sum(map(ord, f"{layout}{d}{mode}{algorithm}"))  # picks a shape and a GQA ratio
    s1, s2 = SHAPES[case % len(SHAPES)]
    kv_heads = 4 if layout == "BSH" else (2, 4)[case % 2]  # GQA 2:1 and MHA
    q, k, v = _inputs(layout, s1, s2, 4, kv_heads, d, case)
    kw = dict(num_heads=4, num_key_value_heads=kv_heads, input_layout=layout, scale=d ** -0.5,
              algorithm=algorithm, softmax_lse_flag=True, **MODES[mode])
    if "sparse_mode" in kw:
        kw["atten_mask"] = pasa_npu.compressed_causal_mask()
    ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
    qd, kd, vd = (t.cuda() for t in (q, k, v))
    if "atten_mask" in kw:
        kw["atten_mask"] = kw["atten_mask"].cuda()

    out, lse = _call(qd, kd, vd, kw, "warp-specialised")
    assert len(gluon_launches) == 1, "the Gluon prefill did not run"
    kernel_out, kernel_lse = _call(qd, kd, vd, kw, "triton")
    assert len(gluon_launches) == 1
    _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse)
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"{layout}-d{d}-{mode}",
                              kernel="gluon", call=(q, k, v, kw), kv_lens=[s2])


def test_gpu_gluon_prefill_rows_that_see_no_key(gluon_launches):
    """A band (keys from 300 to 200 positions back) that leaves the first 200 query rows
    without a key, and the first 128-row tile without a kv block to visit: output 0
    and LSE +inf there (invalid rows, docs/fia-conformance.md r30), as the Triton kernel
    path gives (no NaN from
    their -inf maximum, no wait on a block that never comes)."""
    q, k, v = (t.cuda() for t in _inputs("BNSD", 300, 300, 2, 2, 128, 3))
    kw = dict(num_heads=2, input_layout="BNSD", scale=128 ** -0.5, softmax_lse_flag=True,
              sparse_mode=4, pre_tokens=300, next_tokens=-200, inner_precise=2,
              atten_mask=pasa_npu.compressed_causal_mask().cuda())
    for algorithm in ("pasa-exact", "pasa", "fa-fp32"):
        out, lse = _call(q, k, v, dict(kw, algorithm=algorithm), "warp-specialised")
        kernel_out, kernel_lse = _call(q, k, v, dict(kw, algorithm=algorithm), "triton")
        assert torch.isposinf(lse[:, :, :200]).all() and (out[:, :, :200] == 0).all()
        assert torch.isfinite(lse[:, :, 200:]).all() and torch.isfinite(out.float()).all()
        _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse)
    assert len(gluon_launches) == 3


@pytest.mark.parametrize("mode", ["no mask", "causal (3)"])
def test_gpu_gluon_prefill_more_pairs_than_a_grid_axis_holds(mode, gluon_launches):
    """4097 batches x 16 heads, more (batch, head) pairs than CUDA's 65535 on a grid's
    second axis: the kernel's 1-D grid, and under the causal mask its groups of pairs
    scheduled together (492 pairs of this size per group; the last group is partial)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(4097, 16, s, 64, generator=gen, device="cuda").half()
               for s in (3, 5, 5))
    kw = dict(num_heads=16, input_layout="BNSD", scale=0.125, softmax_lse_flag=True,
              algorithm="pasa-exact", **MODES[mode])
    if "sparse_mode" in kw:
        kw["atten_mask"] = pasa_npu.compressed_causal_mask().cuda()
    out, lse = _call(q, k, v, kw, "warp-specialised")
    assert len(gluon_launches) == 1
    kernel_out, kernel_lse = _call(q, k, v, kw, "triton")
    _assert_same_as_triton_kernel("pasa-exact", out, lse, kernel_out, kernel_lse)


PERSISTENT_MODES = dict(MODES, **{"band, first rows keyless": dict(sparse_mode=4, pre_tokens=300,
                                                                   next_tokens=-200)})


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("mode", ["no mask", "causal (3)", "band (4)", "band, first rows keyless"])
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_gluon_prefill_programs_take_many_tiles(d, algorithm, mode, gluon_launches):
    """4 batches x 16 heads (GQA 4:1) x 16 query tiles of S = 2000 (11 of 192 rows where d =
    64 has three consumer groups): over 700 tiles for one program per SM, so every program
    takes several, of different weights under the masks, and under the last band the
    first tile of each (batch, head) sees no kv block at all (with 192-row tiles, the
    first group of a tile may see none while the others do).
    Two launches in a row, each with its own tile counter; each gives the Triton kernel's
    output (bit for bit but pasa, :func:`_assert_same_as_triton_kernel`): a tile left out
    or taken twice would leave rows unwritten or wrong."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(4, 16, 2000, d, generator=gen, device="cuda").half()
    k, v = (torch.randn(4, 4, 2000, d, generator=gen, device="cuda").half() for _ in "kv")
    kw = dict(num_heads=16, num_key_value_heads=4, input_layout="BNSD", scale=d ** -0.5,
              algorithm=algorithm, softmax_lse_flag=True, **PERSISTENT_MODES[mode])
    if "sparse_mode" in kw:
        kw["atten_mask"] = pasa_npu.compressed_causal_mask().cuda()
    kernel_out, kernel_lse = _call(q, k, v, kw, "triton")
    for launch in (1, 2):
        out, lse = _call(q, k, v, kw, "warp-specialised")
        assert len(gluon_launches) == launch
        _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse)


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa"])
@pytest.mark.parametrize("s2", [2000, 4096])
def test_gpu_gluon_prefill_shifts_keys_in_its_launch(algorithm, s2, gluon_launches,
                                                     monkeypatch):
    """Tuning.shift "in-launch": the programs shift K at the start of the Gluon launch (512 kv
    blocks at S2 = 4096, several per program; a part-filled last one at 2000) and no
    separate pass runs. K' is the separate pass's but for the order of the column sums,
    so the output is the Gluon kernel's after the separate pass, within the bounds of two
    implementations. Three launches in a row, the first recorded and the others repeated,
    give the same output bit for bit: each leaves the barrier's counter zeroed."""
    from pasa_npu.fallback import kernel_common

    names = []
    launch = kernel_common.Binding.launch

    def named(binding, kernel, *args, **kwargs):
        names.append(getattr(kernel, "fn", kernel).__name__)
        return launch(binding, kernel, *args, **kwargs)

    monkeypatch.setattr(kernel_common.Binding, "launch", named)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(4, 16, 512, 128, generator=gen, device="cuda").half()
    k = (torch.randn(4, 4, s2, 128, generator=gen, device="cuda") + 2.0).half()
    v = torch.randn(4, 4, s2, 128, generator=gen, device="cuda").half()
    kw = dict(num_heads=16, num_key_value_heads=4, input_layout="BNSD", scale=128 ** -0.5,
              algorithm=algorithm, softmax_lse_flag=True)
    separate_out, separate_lse = _call(q, k, v, kw, "warp-specialised")
    assert "_shift_keys" in names and len(gluon_launches) == 1
    names.clear()
    with triton_tuning(shift="in-launch"):
        outs = [_call(q, k, v, kw, "warp-specialised") for _ in range(3)]
    assert len(gluon_launches) == 4
    assert "_shift_keys" not in names and "prefill_ws_kernel" in names, names
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])
    _assert_same_as_triton_kernel(algorithm, *outs[0], separate_out, separate_lse)


AUTO = [  # (algorithm, head dim, mask mode) where Tuning.prefill "auto" picks the Gluon kernel
    ("pasa-exact", 128, "no mask"), ("pasa", 128, "causal (3)"), ("fa-fp32", 64, "no mask"),
    ("pasa-exact", 64, "causal (3)"), ("pasa-exact", 64, "no mask"), ("pasa", 64, "causal (3)"),
    ("pasa", 64, "no mask"),
]


@pytest.mark.parametrize("algorithm,d,mode", AUTO)
def test_gpu_auto_prefill_picks_the_gluon_kernel_where_it_applies(algorithm, d, mode,
                                                                   gluon_launches):
    q, k, v = (t.cuda() for t in _inputs("BNSD", 520, 520, 4, 4, d, 1))
    kw = dict(num_heads=4, input_layout="BNSD", scale=d ** -0.5, algorithm=algorithm,
              **MODES[mode])
    if "sparse_mode" in kw:
        kw["atten_mask"] = pasa_npu.compressed_causal_mask().cuda()
    _call(q, k, v, kw, "auto")
    assert len(gluon_launches) == 1


@pytest.mark.parametrize("switch,value", [("shift", "fused"), ("loads", "pointers"),
                                          ("row_constant", "in-kernel")])
def test_gpu_auto_prefill_measures_the_triton_kernel_its_switches_ask_for(switch, value,
                                                                          gluon_launches):
    """A switch only the Triton kernel has, set away from its default (as pasa-bench
    --tuning does), sends an ``auto`` prefill there instead of being ignored."""
    q, k, v = (t.cuda() for t in _inputs("BNSD", 520, 520, 4, 4, 128, 1))
    kw = dict(num_heads=4, input_layout="BNSD", scale=128 ** -0.5, algorithm="pasa-exact")
    _call(q, k, v, kw, "auto")
    assert len(gluon_launches) == 1
    with triton_tuning(**{switch: value}):
        _call(q, k, v, kw, "auto")
    assert len(gluon_launches) == 1


UNSUPPORTED = {  # name: (arguments changed, what the Gluon kernel does not cover)
    "ragged kv": dict(actual_seq_lengths_kv=[520, 400]),
    "explicit mask": dict(atten_mask="dense"),
    "rounding guard": dict(rounding_guard=True),
    "head dim 96": dict(d=96),
    "bf16 fa-fp32": dict(dtype=torch.bfloat16, algorithm="fa-fp32"),
    "kv_block 64": dict(kv_block=64),
    "pasa-mixed": dict(algorithm="pasa-mixed"),
    "fa-fp16": dict(algorithm="fa-fp16"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_gpu_gluon_prefill_leaves_other_cases_to_the_triton_kernel(case, gluon_launches):
    """Forced on (``warp-specialised``), the Gluon kernel still leaves these to the Triton
    kernel. (The explicit mask at d = 128 also checks that the Triton kernel fits its
    mask tile in shared memory: three stages of K, V and mask did not.)"""
    change = dict(UNSUPPORTED[case])
    d = change.pop("d", 128)
    dtype = change.pop("dtype", torch.float16)
    q, k, v = (t.to(dtype).cuda() for t in _inputs("BNSD", 300, 520, 4, 2, d, 7))
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", scale=d ** -0.5,
              algorithm="pasa-exact", softmax_lse_flag=True)
    kw.update(change)
    if kw.get("atten_mask") == "dense":
        kw["atten_mask"] = torch.rand(1, 300, 520, device="cuda") < 0.2
    out, _ = _call(q, k, v, kw, "warp-specialised")
    assert not gluon_launches, f"{case}: the Gluon prefill ran"
    assert torch.isfinite(out.float()).all()


def _paged(k: torch.Tensor, block_size: int, order: torch.Tensor, cache: str):
    """BNSD ``k`` (B, N, S, D) in the physical blocks ``order`` names (batch-major), as
    torch_npu's "4d" (num_blocks, N, block_size, D) or "3d" (num_blocks, block_size, N*D)
    cache with two spare blocks."""
    b, n, s, d = k.shape
    blocks = k.unflatten(2, (s // block_size, block_size)).transpose(1, 2).flatten(0, 1)
    out = torch.full((order.numel() + 2, n, block_size, d), float("nan"), dtype=k.dtype,
                     device=k.device)
    out[order] = blocks
    return out if cache == "4d" else out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("cache,block_size", [("4d", 128), ("3d", 256)])
@pytest.mark.parametrize("mode", ["no mask", "causal (3)"])
def test_gpu_gluon_prefill_reads_paged_kv(algorithm, cache, block_size, mode, gluon_launches):
    """Paged K/V (shuffled blocks, the first block shared by both batches, NaN in the spare
    blocks; 384 queries after 512 keys: chunked prefill) through the Gluon kernel: the
    result of the same K/V laid out contiguously, and of the Triton kernel reading the same
    pages (:func:`_assert_same_as_triton_kernel` for both)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 4, 384, 128, generator=gen, device="cuda").half()
    k, v = (torch.randn(2, 2, 512, 128, generator=gen, device="cuda").half() for _ in "kv")
    k[1, :, :block_size], v[1, :, :block_size] = k[0, :, :block_size], v[0, :, :block_size]
    per_batch = 512 // block_size
    order = torch.randperm(2 * per_batch + 2, generator=gen, device="cuda")[:2 * per_batch]
    table = order.view(2, per_batch).to(torch.int32)
    table[1, 0] = table[0, 0]
    order = table.flatten().long()  # batch 1's first block lands on batch 0's (same tokens)
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", scale=128 ** -0.5,
              algorithm=algorithm, softmax_lse_flag=True, **MODES[mode])
    if "sparse_mode" in kw:
        kw["atten_mask"] = pasa_npu.compressed_causal_mask().cuda()
    dense_out, dense_lse = _call(q, k, v, kw, "warp-specialised")
    paged_kw = dict(kw, block_table=table, block_size=block_size,
                    actual_seq_lengths_kv=[512, 512])
    k_cache, v_cache = (_paged(t, block_size, order, cache) for t in (k, v))
    out, lse = _call(q, k_cache, v_cache, paged_kw, "warp-specialised")
    assert len(gluon_launches) == 2, "the Gluon prefill did not take the paged case"
    _assert_same_as_triton_kernel(algorithm, out, lse, dense_out, dense_lse)
    kernel_out, kernel_lse = _call(q, k_cache, v_cache, paged_kw, "triton")
    assert len(gluon_launches) == 2
    _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse)


def test_gpu_gluon_prefill_leaves_ragged_paged_kv_to_the_triton_kernel(gluon_launches):
    """Paged kv lengths that differ, or are not whole kv blocks: the Triton kernel."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    q = torch.randn(2, 2, 100, 128, generator=gen, device="cuda").half()
    k_cache, v_cache = (torch.randn(6, 2, 128, 128, generator=gen, device="cuda").half()
                        for _ in "kv")
    table = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32, device="cuda")
    for lens in ([256, 200], [200, 200]):
        out, _ = _call(q, k_cache, v_cache, dict(
            num_heads=2, input_layout="BNSD", scale=128 ** -0.5, algorithm="pasa-exact",
            block_table=table, block_size=128, actual_seq_lengths_kv=lens), "warp-specialised")
        assert torch.isfinite(out.float()).all()
    assert not gluon_launches


def test_gpu_gluon_prefill_flags_overflow_for_the_repair(gluon_launches):
    """Scores beyond fp16 on the first 100 query rows, 520 keys (a part-filled last kv
    block too): the Gluon kernel flags those rows and the repair launch recomputes them by
    fa-fp32, as after the Triton kernel: the same rows reported, finite outputs."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, 520, 64, generator=gen)
    q[:, :, :100] *= 1e4
    k = torch.randn(2, 2, 520, 64, generator=gen) * 10
    v = torch.randn(2, 2, 520, 64, generator=gen)
    q, k, v = (t.half().cuda() for t in (q, k, v))
    kw = dict(num_heads=2, input_layout="BNSD", scale=64 ** -0.5, softmax_lse_flag=True)
    for algorithm in ("pasa-exact", "pasa"):
        out, lse = _call(q, k, v, dict(kw, algorithm=algorithm), "warp-specialised")
        rows = pasa_npu.overflow_report().rows
        kernel_out, kernel_lse = _call(q, k, v, dict(kw, algorithm=algorithm), "triton")
        assert rows == pasa_npu.overflow_report().rows > 0
        assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
        _assert_same_as_triton_kernel(algorithm, out, lse, kernel_out, kernel_lse)
    assert len(gluon_launches) == 2


@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_gluon_prefill_flags_output_overflow(head_dim, gluon_launches):
    """V = 5000 |N(0, 1)|, 520 keys: P'V beyond fp16 on most rows while the statistics stay
    finite (tests/api/test_overflow.py, test_output_overflow_is_repaired): the Gluon kernel's
    test of the output (its row sums on the tensor cores at d = 64, on the CUDA cores at
    d = 128) flags those rows, the repair recomputes them (fa-fp32's values, to an fp16
    rounding), and the other rows are bit for bit the unchecked result."""
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(2, 2, 520, head_dim, generator=gen).half().cuda() for _ in range(2))
    v = (torch.randn(2, 2, 520, head_dim, generator=gen).abs() * 5000).half().cuda()
    kw = dict(num_heads=2, input_layout="BNSD", scale=head_dim ** -0.5, softmax_lse_flag=True)
    fa32, _ = _call(q, k, v, dict(kw, algorithm="fa-fp32"), "warp-specialised")
    for algorithm in ("pasa-exact", "pasa"):
        raw, raw_lse = _call(q, k, v, dict(kw, algorithm=algorithm, repair_overflow=False),
                             "warp-specialised")
        bad = ~torch.isfinite(raw.float()).all(-1)
        assert bad.any() and torch.isfinite(raw_lse).all()
        out, lse = _call(q, k, v, dict(kw, algorithm=algorithm), "warp-specialised")
        assert pasa_npu.overflow_report().rows == int(bad.sum())
        assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
        assert torch.equal(out[~bad], raw[~bad]) and torch.equal(lse[~bad], raw_lse[~bad])
        torch.testing.assert_close(out[bad], fa32[bad], rtol=2e-3, atol=1e-2)
    assert len(gluon_launches) == 5


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("where", ["v-nan", "v-inf", "k-nan"])
def test_gpu_gluon_prefill_nonfinite_inputs_give_fa_fp32s_rows(where, head_dim,
                                                                gluon_launches):
    """One NaN or inf in V or K (position 150 of 520, causal): the checked Gluon kernel's
    non-finite output rows are exactly fa-fp32's, and the report counts them as rows that
    stayed non-finite after the repair (its test of the output sees them, at each head
    dim's row sums); the rows the unchecked call left finite are bit for bit its result."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 520, head_dim, generator=gen).half() for _ in range(3))
    {"v-nan": v, "v-inf": v, "k-nan": k}[where][0, 1, 150, 5] = (
        float("inf") if where == "v-inf" else float("nan"))
    q, k, v = (t.cuda() for t in (q, k, v))
    kw = dict(num_heads=2, input_layout="BNSD", scale=head_dim ** -0.5, sparse_mode=3,
              atten_mask=pasa_npu.compressed_causal_mask("cuda"))
    fa32, _ = _call(q, k, v, dict(kw, algorithm="fa-fp32"), "warp-specialised")
    want = ~torch.isfinite(fa32.float()).all(-1)
    assert want.any() and not want.all()
    for algorithm in ("pasa-exact", "pasa"):
        raw, _ = _call(q, k, v, dict(kw, algorithm=algorithm, repair_overflow=False),
                       "warp-specialised")
        out, _ = _call(q, k, v, dict(kw, algorithm=algorithm), "warp-specialised")
        got = ~torch.isfinite(out.float()).all(-1)
        assert torch.equal(got, want), (algorithm, got.sum(), want.sum())
        assert pasa_npu.overflow_report().nonfinite_rows == int(want.sum()), algorithm
        fine = torch.isfinite(raw.float()).all(-1)  # rows the check left alone
        assert torch.equal(out[fine], raw[fine]), algorithm
    assert len(gluon_launches) == 5
