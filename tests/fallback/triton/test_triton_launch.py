"""The Triton backend's launch geometry, each choice against the CPU backend: decode's
kv split counts and their merge by the last split to finish, query groups larger than one program's tile cut into
chunks, and grids with more than 65535 (batch, head) pairs, CUDA's limit on a grid's
second and third axes."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _support import BACKENDS, interpreted, on_device
from _bounds import assert_triton_matches_cpu, triton_numerics

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("splits", ["one", "chosen", "one per block"])
def test_decode_split_counts_agree_with_cpu_backend(splits, algorithm, monkeypatch):
    """Decode cuts each (batch, kv head)'s keys into splits merged by log-sum-exp. Every
    split count gives the CPU backend's result: one split, the launch heuristic's count,
    and a split per kv block, with a short batch whose later splits see no key at all."""
    from pasa_npu.fallback.triton import launch as triton_launch

    block, n_blocks = (16, 37) if interpreted("triton") else (128, 67)
    gen = torch.Generator().manual_seed(3)
    d, s2 = 32 if interpreted("triton") else 128, n_blocks * block
    q = torch.randn(2, 1, 8, d, generator=gen).half()
    k, v = (torch.randn(2, s2, 2, d, generator=gen).half() + 2.0 for _ in range(2))
    kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BSND", scale=d ** -0.5,
              kv_block=block, actual_seq_lengths_kv=[s2, 3 * block + 5],
              softmax_lse_flag=True, algorithm=algorithm)
    with triton_numerics("decode"):
        ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)

    used = []
    heuristic = triton_launch.decode_splits
    forced = {"one": 1, "chosen": None, "one per block": n_blocks}[splits]
    monkeypatch.setattr(triton_launch, "decode_splits",
                        lambda *a: used.append(forced or heuristic(*a)) or used[-1])
    out, lse = pasa_npu.fused_attention(*on_device("triton", q, k, v), backend="triton", **kw)
    assert len(used) == 1
    if forced:
        assert used == [forced]
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"splits-{splits}", path="decode",
                              what=f"{used} splits", call=(q, k, v, kw),
                              kv_lens=kw["actual_seq_lengths_kv"], kv_block=block)


def test_decode_fills_one_wave_of_programs():
    """The split count keeps every group's kv blocks covered and launches no more programs
    than the GPU holds at once (more splits than blocks, or a second partial wave, are
    slower on an H100)."""
    from pasa_npu.fallback.triton.launch import decode_splits

    for n_blocks in (1, 7, 64, 1024):
        for groups in (1, 4, 32, 64, 128, 500):
            for resident in (1, 2):
                n = decode_splits(n_blocks, groups, 132, resident)
                assert 1 <= n <= n_blocks
                assert n == 1 or n * groups <= resident * 132
                assert n == n_blocks or (n + 1) * groups > resident * 132


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("head_dim,group", [(256, 64)])
def test_decode_cuts_large_query_groups_into_chunks(head_dim, group, algorithm, monkeypatch):
    """MQA-like groups: more query heads per kv head than one decode program's tile holds
    (64 rows at d = 256 overflow an H100's shared memory for fa-*) run as several
    programs over the same K/V blocks, each merged into its own rows. (FIA refuses groups
    above 64, so 64 at d = 256 is the largest group a call can bring.)"""
    from pasa_npu.fallback.triton import launch as triton_launch

    gen = torch.Generator().manual_seed(8)
    s2 = 100 if interpreted("triton") else 1000
    q = torch.randn(2, group, 1, head_dim, generator=gen).half()
    k, v = (torch.randn(2, 1, s2, head_dim, generator=gen).half() + 1.0 for _ in range(2))
    kw = dict(num_heads=group, num_key_value_heads=1, input_layout="BNSD",
              scale=head_dim ** -0.5, kv_block=16 if interpreted("triton") else 128,
              actual_seq_lengths_kv=[s2, s2 // 3], softmax_lse_flag=True, algorithm=algorithm)
    with triton_numerics("decode"):
        ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
    picked = []
    block_g = triton_launch.decode_block_g
    monkeypatch.setattr(triton_launch, "decode_block_g",
                        lambda *a: picked.append(block_g(*a)) or picked[-1])
    out, lse = pasa_npu.fused_attention(*on_device("triton", q, k, v), backend="triton", **kw)
    assert len(picked) == 1 and picked[0] < group  # cut into group / picked[0] chunks
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"chunks-d{head_dim}-g{group}",
                              path="decode", what=f"{group // picked[0]} chunks",
                              call=(q, k, v, kw), kv_lens=kw["actual_seq_lengths_kv"],
                              kv_block=kw["kv_block"])


@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("query_len", [1, 3], ids=["decode", "prefill"])
def test_more_batch_heads_than_a_grid_axis_holds(query_len, algorithm, monkeypatch):
    """More (batch, head) pairs than CUDA's 65535 on a grid's second axis: every launch
    puts them on the first. On a GPU 4097 batches x 16 heads (as many kv heads, for the
    key shift and decode); under the interpreter, which has no such limit and would run
    65k programs one by one, the limit is lowered to 3 for 2 x 4 pairs."""
    from pasa_npu.fallback.triton import launch as triton_launch

    batch, heads = 4097, 16
    if interpreted("triton"):
        batch, heads = 2, 4
        monkeypatch.setattr(triton_launch, "GRID_AXIS_MAX", 3)
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(batch, heads, query_len, 16, generator=gen).half()
    k, v = (torch.randn(batch, heads, 5, 16, generator=gen).half() for _ in range(2))
    kw = dict(num_heads=heads, input_layout="BNSD", scale=0.25, softmax_lse_flag=True,
              algorithm=algorithm)
    path = "decode" if query_len == 1 else "prefill"
    with triton_numerics(path):
        ref, ref_lse = pasa_npu.fused_attention(q, k, v, backend="torch", **kw)
    out, lse = pasa_npu.fused_attention(*on_device("triton", q, k, v), backend="triton", **kw)
    assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm, f"grid-{path}", path=path,
                              call=(q, k, v, kw), kv_lens=[k.shape[2]])


@pytest.mark.parametrize("shared, regs, want_per_sm", [
    (116736, 168, 1),  # 114 KiB: two would fit but for the 1 KiB reserved per program
    (65536, 128, 3),   # shared memory (3 x 65 KiB) binds before registers (4 x 128 x 128)
    (0, 170, 2),       # none: registers bind, 170 a thread allocated as 176 (3 would fit)
    (0, 32, 16),       # small: the SM's 2048 threads bind
])
def test_resident_programs_fill_one_wave(shared, regs, want_per_sm, monkeypatch):
    """The repair's grid: the SMs times the programs of a compiled kernel that fit an SM
    at once, from the kernel's shared memory (1 KiB more reserved per program), registers
    and threads against the device's; compiled once per kernel and constexprs."""
    from types import SimpleNamespace

    from pasa_npu.fallback import kernel_common

    props = SimpleNamespace(multi_processor_count=132, max_threads_per_multi_processor=2048,
                            regs_per_multiprocessor=65536,
                            shared_memory_per_multiprocessor=233472)  # an H100's
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    compiled = SimpleNamespace(metadata=SimpleNamespace(num_warps=4, shared=shared),
                               n_regs=regs, _init_handles=lambda: None)
    warmups = []

    class Kernel:
        def warmup(self, *args, grid, **kwargs):
            warmups.append((args, grid, kwargs))
            return compiled

    kernel = Kernel()
    monkeypatch.setattr(kernel_common, "_RESIDENT", {})
    args, constexprs = (torch.zeros(2, dtype=torch.float16), 7), dict(BLOCK_M=64, num_warps=4)
    assert kernel_common.resident_programs(kernel, 0, args, constexprs) == 132 * want_per_sm
    assert kernel_common.resident_programs(kernel, 0, args, constexprs) == 132 * want_per_sm
    assert len(warmups) == 1 and warmups[0][1] == (1,) and warmups[0][2] == constexprs
    kernel_common.resident_programs(kernel, 0, args, dict(constexprs, BLOCK_M=32))
    assert len(warmups) == 2
