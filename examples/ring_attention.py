"""Ring attention over several processes: the paper's overflow on a long sequence, split
across ranks.

Q, K and V ~ U(29.5, 30.5) (the paper's uniform inputs, eq. 17) with head dim 128: every
query-key product is about 1.15e5, beyond fp16's 65504. The sequence is split into contiguous
shards, one per rank; ``pasa_npu.distributed.ring_attention`` passes the K/V shards around the
ring and merges the partial results by their log-sum-exp. With fp16 scores
(``algorithm="fa-fp16s"``) every step overflows and the output is NaN; PASA's is finite and
close to the fp64 golden of the whole sequence (computed on rank 0).

    python examples/ring_attention.py                         # 2 CPU processes, gloo
    python examples/ring_attention.py --world 4 --seq 8192
    torchrun --nproc-per-node 2 examples/ring_attention.py --device cuda    # NCCL
"""
from __future__ import annotations

import argparse
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import pasa_npu
from pasa_npu.distributed import ring_attention

ALGORITHMS = ("fa-fp16s", "pasa", "pasa-exact", "fa-fp32")


def inputs(seq: int, heads: int, dim: int = 128, x0: float = 30.0, amplitude: float = 0.5):
    """The whole sequence, (1, S, N, D) fp16, the same on every rank."""
    gen = torch.Generator().manual_seed(0)
    return tuple(((torch.rand(1, seq, heads, dim, generator=gen, dtype=torch.float64) * 2 - 1)
                  * amplitude + x0).half() for _ in range(3))


def shard_lengths(seq: int, world: int) -> list[int]:
    """The ranks' shard lengths: as equal as they can be, the first ``seq % world`` one longer."""
    return [seq // world + (r < seq % world) for r in range(world)]


def run(rank: int, world: int, args) -> dict | None:
    """This rank's part; rank 0 returns {algorithm: (relative RMSE, NaN share)}."""
    device = torch.device("cpu")
    if args.device != "cpu":
        device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    q, k, v = inputs(args.seq, args.heads)
    lens = shard_lengths(args.seq, world)
    shard = slice(sum(lens[:rank]), sum(lens[:rank + 1]))
    causal = dict(sparse_mode=3) if args.causal else {}
    common = dict(num_heads=args.heads, input_layout="BSND", scale=q.shape[-1] ** -0.5)
    report = {}
    for algorithm in ALGORITHMS:
        out, _ = ring_attention(*(x[:, shard].to(device) for x in (q, k, v)), algorithm=algorithm,
                                seq_lens=lens, **common, **causal)
        padded = out.new_zeros(1, lens[0], *out.shape[2:])  # gather takes equal sizes
        padded[:, :out.shape[1]] = out
        parts = [torch.empty_like(padded) for _ in range(world)] if rank == 0 else None
        dist.gather(padded, parts, dst=0)
        if rank == 0:
            report[algorithm] = torch.cat([p[:, :n].cpu() for p, n in zip(parts, lens)], dim=1)
    if rank != 0:
        return None
    mask = dict(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask()) if args.causal else {}
    gold, _ = pasa_npu.reference_attention(q, k, v, **common, **mask)
    return {name: (((out.double() - gold).norm() / gold.norm()).item(),
                   out.isnan().float().mean().item()) for name, out in report.items()}


def show(report: dict, args, world: int) -> None:
    lens = sorted(set(shard_lengths(args.seq, world)))
    print(f"S={args.seq} over {world} ranks ({' or '.join(map(str, lens))} tokens each), "
          f"{args.heads} heads x 128, {'causal' if args.causal else 'no mask'}; "
          f"Q, K, V ~ U(29.5, 30.5)")
    for name, (err, nan) in report.items():
        print(f"  {name:>10}: relative RMSE vs fp64 {err:.2e}, NaN {nan:.0%}")


def _spawned(rank: int, world: int, init_file: str, args) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    report = run(rank, world, args)
    if report is not None:
        show(report, args, world)
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes to spawn (CPU)")
    parser.add_argument("--seq", type=int, default=2048, help="the whole sequence's length")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, torchrun)")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    args = parser.parse_args(argv)
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
        world = dist.get_world_size()
        report = run(dist.get_rank(), world, args)
        if report is not None:
            show(report, args, world)
        dist.destroy_process_group()
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(args.world, os.path.join(tmp, "init"), args),
                 nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
