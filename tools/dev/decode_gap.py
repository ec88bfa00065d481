"""Where our decode kernel loses to a kernel that only reads K/V, on a CUDA GPU (a development
tool; not installed with the package).

    python tools/dev/decode_gap.py

Decode (B = 8, 32 query heads, d = 128, GQA 4:1 and 8:1) at several S2, replayed from a CUDA
graph, in µs per call: SDPA cuDNN on contiguous K/V; a kernel that only reads the blocks
through the table (``read_blocks``), with our split count at d = 128, on the cache in order
and shuffled as ``pasa-bench`` shuffles it, alone and with a merge tail like ours (each split
stores a partial, counts its arrival, and the last merges); and our allocations on contiguous
K/V and on the shuffled cache. A least-squares line time = fixed + slope * S2 for each tells
the fixed cost (launch, prologue and tail) from the rate.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pasa_npu.fallback.triton import launch
from pasa_npu.tools import bench_paged
from pasa_npu.tools.bench import _sdpa
from pasa_npu.tools.dev.decode_placement import in_order, ours, replay_ms

HEAD_DIM = 128
BLOCK = bench_paged.BLOCK_SIZE
SEQS = (8192, 16384, 32768, 65536)
ALGORITHMS = ("fa-fp32", "pasa-exact", "pasa")


@triton.jit
def read_blocks(k_cache, v_cache, table, part, count, out, table_stride, blocks_per_split,
                KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
                STAGES: tl.constexpr, TAIL: tl.constexpr):
    """Sum every K and V block of one (batch, kv head) split into ``part``; TAIL: the last
    split of a (batch, kv head) to arrive (``count``, left zeroed) sums the splits' parts into
    ``out``, as the decode kernel's merge does."""
    group = tl.program_id(0)  # batch * KV_HEADS + kv head
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    batch = group // KV_HEADS
    head = group % KV_HEADS
    tile = tl.arange(0, BLOCK_SIZE)[:, None] * D + tl.arange(0, D)[None, :]
    dims = tl.arange(0, D)
    acc = tl.zeros((D,), tl.float32)
    first = split * blocks_per_split
    for j in tl.range(first, first + blocks_per_split, num_stages=STAGES):
        block = tl.load(table + batch * table_stride + j).to(tl.int64)
        base = (block * KV_HEADS + head) * BLOCK_SIZE * D
        acc += tl.sum(tl.load(k_cache + base + tile).to(tl.float32)
                      + tl.load(v_cache + base + tile).to(tl.float32), axis=0)
    tl.store(part + (group * splits + split) * D + dims, acc)
    if TAIL:
        tl.debug_barrier()
        if tl.atomic_add(count + group, 1, sem="acq_rel") == splits - 1:
            tl.store(count + group, 0)
            total = tl.zeros((D,), tl.float32)
            for s in range(0, splits):
                total += tl.load(part + (group * splits + s) * D + dims, cache_modifier=".cg")
            tl.store(out + group * D + dims, total)


def read_call(cache, splits, tail):
    """A call of ``read_blocks`` on ``cache`` (key cache, value cache, table) with ``splits``
    programs per (batch, kv head), which must divide each batch's blocks; ``tail``: with the
    merge tail."""
    kc, vc, table = cache
    b, per_batch = table.shape
    if per_batch % splits:
        raise ValueError(f"splits must divide the {per_batch} blocks of a batch, got {splits}")
    n_kv = kc.shape[1]
    part = torch.empty(b * n_kv * splits * HEAD_DIM, device=kc.device)
    count = torch.zeros(b * n_kv, dtype=torch.int32, device=kc.device)
    out = torch.empty(b * n_kv * HEAD_DIM, device=kc.device)

    def call():
        read_blocks[(b * n_kv, splits)](kc, vc, table, part, count, out, table.stride(0),
                                        per_batch // splits, KV_HEADS=n_kv,
                                        BLOCK_SIZE=BLOCK, D=HEAD_DIM, STAGES=3, TAIL=tail,
                                        num_warps=4)
    return call


def us(call) -> float:
    """µs per ``call`` replayed from a CUDA graph (median)."""
    return replay_ms(call) * 1e3


def main() -> int:
    print(torch.cuda.get_device_name(), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sdpa = _sdpa("sdpa-cudnn")
    for hkv in (4, 8):
        rows = {}
        for s in SEQS:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(8, n, r, HEAD_DIM, device="cuda", dtype=torch.float16,
                                   generator=gen) for n, r in ((32, 1), (hkv, s), (hkv, s)))
            # the decode launch's split count (its kv blocks are BLOCK keys at d = 128)
            _, _, splits, _ = launch.decode_programs(32 // hkv, HEAD_DIM, "scores", s // BLOCK,
                                                     8 * hkv, sms)
            shuffled = bench_paged.paged_kv(k, v, gen, "4d")
            ordered = in_order(k, v)
            cells = {"cudnn": us(lambda: sdpa(q, k, v, False, True)),
                     "read": us(read_call(ordered, splits, False)),
                     "read+tail": us(read_call(ordered, splits, True)),
                     "read shuffled": us(read_call(shuffled, splits, False)),
                     "read shuffled+tail": us(read_call(shuffled, splits, True))}
            for algorithm in ALGORITHMS:
                cells[algorithm] = us(ours(algorithm, q, k, v, 32, hkv))
                cells[algorithm + " paged"] = us(ours(algorithm, q, k, v, 32, hkv, shuffled))
            rows[s] = cells
            print(f"GQA {32 // hkv}:1 S2 {s} splits {splits} | "
                  + " | ".join(f"{name} {t:.1f}" for name, t in cells.items()), flush=True)
        fits = []
        x = torch.tensor(SEQS, dtype=torch.float64)
        for name in rows[SEQS[0]]:
            y = torch.tensor([rows[s][name] for s in SEQS], dtype=torch.float64)
            slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
            fits.append(f"{name}: fixed {y.mean() - slope * x.mean():.1f} µs, "
                        f"{slope * 1024:.3f} µs/1k keys")
        print(f"GQA {32 // hkv}:1 least-squares fit | " + " | ".join(fits), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
