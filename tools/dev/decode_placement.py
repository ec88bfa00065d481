"""Where paged decode loses to contiguous K/V, on a CUDA GPU (a development tool; not installed
with the package).

    python tools/dev/decode_placement.py [--splits] [--passes N]

Decode (B = 8, 32 query heads, d = 128, S2 = 32k, GQA 4:1 and 8:1), replayed from a CUDA graph,
in GB/s of K+V read: SDPA cuDNN on contiguous K/V, and each allocation on contiguous K/V, on
``pasa-bench``'s paged cache (shuffled blocks) and on the same cache with its blocks in order
(an identity table). ``--splits`` instead forces each kv split count of SPLITS on the decode
kernel (``launch.decode_splits``) beside the launch's own choice, contiguous and paged.
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

from pasa_npu import plans
from pasa_npu.fallback.triton import launch
from pasa_npu.tools import bench_paged
from pasa_npu.tools.bench import _sdpa, ours_call

CASES = ((8, 32, 4, 32768), (8, 32, 8, 32768))  # (batch, query heads, kv heads, kv length)
HEAD_DIM = 128
ALGORITHMS = ("fa-fp32", "pasa-exact", "pasa")
SPLITS = (2, 3, 4, 5, 8)


def replay_ms(call) -> float:
    """ms per ``call`` replayed from a CUDA graph (median)."""
    call()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(call, rep=300, return_mode="median")


def gbs(call, k) -> float:
    """GB/s of K+V read by ``call`` (graph replay, median); ``k``: the BNSD keys."""
    return 2 * k.numel() * k.element_size() / (replay_ms(call) * 1e-3) / 1e9


def in_order(k, v):
    """(key cache, value cache, identity table) of BNSD ``k``, ``v``: paged_kv's cache, unshuffled."""
    b, _, s, _ = k.shape
    return bench_paged.paged_kv(k, v, None, "4d", order=torch.arange(b * s // bench_paged.BLOCK_SIZE,
                                                                      device=k.device))


def ours(algorithm, q, k, v, heads, kv_heads, cache=None):
    """A call of ``algorithm`` on ``q`` and contiguous ``k``, ``v``, or on ``cache`` (key cache,
    value cache, table) where given, through a plan made afresh."""
    plans.clear()  # a plan keeps the split count its first call chose
    if cache is None:
        call = ours_call(algorithm, None, heads, kv_heads, HEAD_DIM)
        return lambda: call(q, k, v, False, True)
    kc, vc, table = cache
    call = bench_paged.paged_call(algorithm, None, table, heads, kv_heads, HEAD_DIM)
    return lambda: call(q, kc, vc, False, True)


def timed(algorithm, q, k, v, heads, kv_heads, cache=None) -> float:
    """GB/s of :func:`ours`' call."""
    return gbs(ours(algorithm, q, k, v, heads, kv_heads, cache), k)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", action="store_true", help="force each kv split count of SPLITS")
    parser.add_argument("--passes", type=int, default=1, help="times to measure every case")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), flush=True)
    chosen = launch.decode_splits
    for _ in range(args.passes):
        for b, h, hkv, s in CASES:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, n, rows, HEAD_DIM, device="cuda", dtype=torch.float16, generator=gen)
                       for n, rows in ((h, 1), (hkv, s), (hkv, s)))
            sdpa = _sdpa("sdpa-cudnn")
            line = [f"cudnn {gbs(lambda: sdpa(q, k, v, False, True), k):.0f}"]
            shuffled = bench_paged.paged_kv(k, v, gen, "4d")
            for algorithm in ALGORITHMS:
                if args.splits:
                    for cache, label in ((None, "contig"), (shuffled, "paged")):
                        cells = []
                        for n in SPLITS + (None,):
                            launch.decode_splits = chosen if n is None else (lambda *_, n=n: n)
                            cells.append(f"{n or 'own'}: {timed(algorithm, q, k, v, h, hkv, cache):.0f}")
                        launch.decode_splits = chosen
                        line.append(f"{algorithm} {label} " + " ".join(cells))
                else:
                    line.append(f"{algorithm}: contig {timed(algorithm, q, k, v, h, hkv):.0f}, "
                                f"shuffled {timed(algorithm, q, k, v, h, hkv, shuffled):.0f}, "
                                f"in order {timed(algorithm, q, k, v, h, hkv, in_order(k, v)):.0f}")
            print(f"B{b} H{h}/{hkv} S{s} | " + " | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
