"""How fast any kernel can read pasa-bench's paged decode cache, on a CUDA GPU (a development
tool; not installed with the package).

    python tools/dev/paged_roofline.py [--passes N]

Decode's K/V (B = 8, d = 128, S2 = 32k, 4 or 8 kv heads, block_size 128, the cache
(blocks, N_kv, block_size, D)), replayed from a CUDA graph, in GB/s of K+V read:

* ``read``: a kernel that only reads every K and V block through the table (and sums it),
  the faster of its two launch configurations (``CONFIGS``), with the blocks placed as
  ``pasa-bench`` places them (``shuffled``: a random permutation of blocks), in order (an
  identity table), and shuffled by 2 MiB runs of blocks (the blocks of a run keep their
  order: shuffled pages, not blocks);
* SDPA cuDNN's decode on contiguous K/V, and ours (``fa-fp32``, ``pasa-exact``) on
  contiguous K/V and on the shuffled cache.

Where even the read kernel is slower on the shuffled cache than cuDNN's decode on contiguous
K/V, no decode kernel reading that cache can match cuDNN's contiguous figure.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from pasa_npu.tools import bench_paged
from pasa_npu.tools.bench import _sdpa
from pasa_npu.tools.dev.decode_placement import gbs, in_order, timed

CASES = ((8, 32, 4, 32768), (8, 32, 8, 32768))  # (batch, query heads, kv heads, kv length)
HEAD_DIM = 128
BLOCK = bench_paged.BLOCK_SIZE
PAGE_BYTES = 2 << 20
# (splits, warps, stages): on an H100 at GQA 8:1 a sweep of 4-32 splits, 4 or 8 warps and 2-4
# stages read fastest at 4 splits and 4 warps, with 3 or 4 stages, at every placement
CONFIGS = ((4, 4, 3), (8, 4, 3))


@triton.jit
def _read_blocks(k_cache, v_cache, table, out, table_stride, blocks_per_split,
                 KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
                 STAGES: tl.constexpr):
    group = tl.program_id(0)  # batch * KV_HEADS + kv head
    split = tl.program_id(1)
    batch = group // KV_HEADS
    head = group % KV_HEADS
    tile = tl.arange(0, BLOCK_SIZE)[:, None] * D + tl.arange(0, D)[None, :]
    acc = tl.zeros((D,), tl.float32)
    first = split * blocks_per_split
    for j in tl.range(first, first + blocks_per_split, num_stages=STAGES):
        block = tl.load(table + batch * table_stride + j).to(tl.int64)
        base = (block * KV_HEADS + head) * BLOCK_SIZE * D
        kv = tl.load(k_cache + base + tile).to(tl.float32) + tl.load(v_cache + base + tile).to(tl.float32)
        acc += tl.sum(kv, axis=0)
    tl.store(out + (group * tl.num_programs(1) + split) * D + tl.arange(0, D), acc)


def page_order(n_blocks, block_bytes, gen, device):
    """A permutation of ``n_blocks`` that shuffles runs of blocks filling a 2 MiB page,
    each run's blocks in order."""
    run = min(n_blocks, max(1, PAGE_BYTES // block_bytes))
    runs = torch.randperm(n_blocks // run, generator=gen, device=device)
    return (runs[:, None] * run + torch.arange(run, device=device)).flatten()


def read_rate(cache, k) -> tuple:
    """(GB/s, (splits, warps, stages)) of the fastest read of ``cache`` among CONFIGS."""
    kc, vc, table = cache
    b, per_batch = table.shape
    n_kv = kc.shape[1]
    best = (0.0, None)
    for splits, warps, stages in CONFIGS:
        if per_batch % splits:
            continue
        out = torch.empty(b * n_kv * splits * HEAD_DIM, device=k.device)

        def call(splits=splits, warps=warps, stages=stages, out=out):
            _read_blocks[(b * n_kv, splits)](kc, vc, table, out, table.stride(0), per_batch // splits,
                                             KV_HEADS=n_kv, BLOCK_SIZE=BLOCK, D=HEAD_DIM,
                                             STAGES=stages, num_warps=warps)
        best = max(best, (gbs(call, k), (splits, warps, stages)), key=lambda r: r[0])
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=1, help="times to measure every case")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), flush=True)
    for _ in range(args.passes):
        for b, h, hkv, s in CASES:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, n, rows, HEAD_DIM, device="cuda", dtype=torch.float16, generator=gen)
                       for n, rows in ((h, 1), (hkv, s), (hkv, s)))
            n_blocks = b * s // BLOCK
            block_bytes = hkv * BLOCK * HEAD_DIM * k.element_size()
            shuffled = bench_paged.paged_kv(k, v, gen, "4d")
            pages = bench_paged.paged_kv(k, v, None, "4d", order=page_order(n_blocks, block_bytes, gen, "cuda"))
            sdpa = _sdpa("sdpa-cudnn")
            cells = [f"cudnn contig {gbs(lambda: sdpa(q, k, v, False, True), k):.0f}"]
            for label, cache in (("shuffled", shuffled), ("in order", in_order(k, v)), ("pages shuffled", pages)):
                rate, config = read_rate(cache, k)
                cells.append(f"read {label} {rate:.0f} {config}")
            for algorithm in ("fa-fp32", "pasa-exact"):
                cells.append(f"{algorithm} contig {timed(algorithm, q, k, v, h, hkv):.0f} "
                             f"shuffled {timed(algorithm, q, k, v, h, hkv, shuffled):.0f}")
            print(f"B{b} H{h}/{hkv} S{s} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
