"""``pasa-bench --distributed``: sequence-parallel attention over the GPUs of one host.

Three engines, each with PASA as its local attention and with a flash-attention local
attention for comparison, measured in the same run:

* ``ring``: :func:`pasa_npu.distributed.ring_attention` (its flash attention: our
  ``fa-fp32``, FlashAttention-2 with fp32 softmax);
* ``yunchang-ring``: yunchang's ``LongContextAttention`` as a ring over every rank;
* ``yunchang-ulysses``: yunchang's ``UlyssesAttention`` over every rank.

yunchang's flash attention is SDPA's flash kernel (flash-attn is not required); it takes no
grouped keys, so that local attention repeats the K/V heads of its own step (the ring and
the all-to-all move the grouped K/V, as for PASA). Each cell is timed with CUDA events
(median of ``--runs`` after a warm-up) on 1 GPU and on ``--gpus``; TFLOP/s per GPU is
4 B Nq S^2 d / (t * GPUs), half for causal. "exposed" is the share of the time that the
local attention alone does not explain: each rank times the local calls it makes (same
shapes, no communication), the slowest rank counts, and exposed = 1 - t_local / t. Scaling
efficiency = t(1 GPU) / (GPUs * t(GPUs)). Up to ``--check-len`` tokens the multi-GPU
output is gathered and compared with one process's output of the same local attention and
with the fp64 golden. Writes ``distributed.json`` and ``distributed.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pasa_npu.tools.command_line import out_folder, positive_int

ENGINES = {"ring": ("pasa", "fa-fp32"), "yunchang-ring": ("pasa", "sdpa-flash"),
           "yunchang-ulysses": ("pasa", "sdpa-flash")}


def sdpa_flash_forward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                       window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                       return_softmax=False, deterministic=False, return_attn_probs=False):
    """flash-attn's forward contract (as pasa_npu.integrations.yunchang's) by SDPA's flash
    kernel: q (B, S1, Nq, D), k/v (B, S2, Nkv, D), K/V heads repeated for Nq > Nkv.
    Returns (out (B, S1, Nq, D), lse (B, Nq, S1) fp32)."""
    group = q.shape[2] // k.shape[2]
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    flash = (torch.ops.aten._scaled_dot_product_flash_attention if q.is_cuda
             else torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    out, lse = flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.0,
                     is_causal=causal, scale=softmax_scale)[:2]
    return out.transpose(1, 2), lse


def _local(local: str):
    """The local attention ``local`` in flash-attn's forward contract."""
    if local == "sdpa-flash":
        return sdpa_flash_forward
    from pasa_npu.integrations.yunchang import pasa_flash_attn_forward
    return functools.partial(pasa_flash_attn_forward, algorithm=local)


def _engine(name: str, local: str, world: int, scale: float):
    """A callable (q, k, v shards, BSND) -> this rank's output shard."""
    if name == "ring":
        from pasa_npu.distributed import ring_attention

        def call(q, k, v, causal):
            kw = dict(sparse_mode=3) if causal else {}
            return ring_attention(q, k, v, num_heads=q.shape[2], num_key_value_heads=k.shape[2],
                                  input_layout="BSND", scale=scale, algorithm=local, **kw)[0]
        return call
    from yunchang import LongContextAttention, UlyssesAttention
    from yunchang.globals import PROCESS_GROUP
    from yunchang.kernels import AttnType
    if name == "yunchang-ring":
        module = LongContextAttention(ring_impl_type="basic", attn_type=None,
                                      attn_processor=_local(local))
    else:
        module = UlyssesAttention(PROCESS_GROUP.ULYSSES_PG, attn_type=AttnType.TORCH_MATH)
        module.attn_fn = _local(local)
    return lambda q, k, v, causal: module(q, k, v, softmax_scale=scale, causal=causal)


def _local_work(name: str, local: str, q, k, v, scale: float, causal: bool, world: int,
                rank: int):
    """The local calls this rank makes in ``name``, without the communication."""
    fn = _local(local)
    if name == "yunchang-ulysses":  # one call: the whole sequence, 1/world of the heads
        heads, kv_heads = q.shape[2] // world, max(1, k.shape[2] // world)
        full = (lambda t, n: t[:, :, :n].repeat(1, world, 1, 1))
        return lambda: fn(full(q, heads), full(k, kv_heads), full(v, kv_heads),
                          softmax_scale=scale, causal=causal)

    def steps():
        for step in range(world):
            src = (rank - step) % world
            if causal and src > rank:
                continue
            fn(q, k, v, softmax_scale=scale, causal=causal and src == rank)
    return steps


def _time_ms(fn, runs: int, device) -> float:
    """Median milliseconds of ``fn`` over ``runs`` calls after a warm-up (which compiles), the
    ranks lined up by a barrier before each; CUDA events on a GPU, the wall clock on a CPU.
    Each call's time is the slowest rank's: a rank with less work (rank 0 of a causal ring)
    finishes early."""
    fn()
    times = []
    for _ in range(runs):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor(times, dtype=torch.float64,
                           device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def _worker(rank: int, world: int, args: dict, init_file: str, out_file: str) -> None:
    try:
        cuda = args["backend"] == "nccl"
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(args["backend"], init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        import yunchang
        rows = []
        nq, nkv, d, dtype = args["heads"], args["kv_heads"], args["head_dim"], torch.float16
        scale = d ** -0.5
        for seq in args["seqs"]:
            gen = torch.Generator(device=device).manual_seed(seq)
            q, k, v = (torch.randn(1, seq, n, d, generator=gen, device=device).to(dtype)
                       for n in (nq, nkv, nkv))
            part = slice(rank * seq // world, (rank + 1) * seq // world)
            lq, lk, lv = (t[:, part].contiguous() for t in (q, k, v))
            for name, locals_ in ENGINES.items():
                ulysses = name == "yunchang-ulysses"
                yunchang.set_seq_parallel_pg(world if ulysses else 1, 1 if ulysses else world,
                                             rank, world)
                for local in locals_:
                    call = _engine(name, local, world, scale)
                    for causal in (False, True):
                        t = _time_ms(lambda: call(lq, lk, lv, causal), args["runs"], device)
                        work = _local_work(name, local, lq, lk, lv, scale, causal, world, rank)
                        t_local = _time_ms(work, args["runs"], device)
                        row = dict(engine=name, local=local, seq=seq, causal=causal, gpus=world,
                                   ms=t, local_ms=float(t_local),
                                   tflops_per_gpu=4 * nq * seq * seq * d * (0.5 if causal else 1)
                                   / (t * 1e-3) / world / 1e12)
                        if world > 1 and seq <= args["check_len"]:
                            row.update(_check(call, local, q, k, v, lq, lk, lv, causal, scale,
                                              world, rank))
                        rows.append(row)
                        if rank == 0 and not args["quiet"]:
                            print(f"[{world} GPU] {name:16s} {local:10s} S={seq:7d} "
                                  f"{'causal' if causal else 'full  '} {t:9.2f} ms "
                                  f"{row['tflops_per_gpu']:7.1f} TFLOP/s/GPU", flush=True)
            del q, k, v, lq, lk, lv
        if rank == 0:
            pathlib.Path(out_file).write_text(json.dumps(rows))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        pathlib.Path(out_file + f".rank{rank}.err").write_text(traceback.format_exc())
        raise SystemExit(1)


def _check(call, local, q, k, v, lq, lk, lv, causal, scale, world, rank) -> dict:
    """The gathered multi-GPU output against one process's and the fp64 golden's (rank 0)."""
    import pasa_npu
    out = call(lq, lk, lv, causal).contiguous()
    parts = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(parts, out)
    if rank != 0:
        return {}
    gathered = torch.cat(parts, dim=1).double()
    single = _local(local)(q, k, v, softmax_scale=scale, causal=causal)[0].double()
    kw = dict(num_heads=q.shape[2], num_key_value_heads=k.shape[2], input_layout="BSND",
              scale=scale)
    if causal:
        kw.update(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask(q.device))
    gold = pasa_npu.reference_attention(q, k, v, **kw)[0]
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    return dict(rmse_vs_single=rel(gathered, single), rmse_multi=rel(gathered, gold),
                rmse_single=rel(single, gold))


def make_parser() -> argparse.ArgumentParser:
    """The options of ``pasa-bench --distributed``."""
    parser = argparse.ArgumentParser(prog="pasa-bench --distributed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=out_folder, default="bench-out",
                        help="folder for distributed.json/.md, made where missing "
                             "(default bench-out)")
    parser.add_argument("--gpus", type=positive_int("gpus"), default=None,
                        help="ranks, 2 or more (default: every GPU; with --backend gloo, 2)")
    parser.add_argument("--seqs", type=positive_int("seqs"), nargs="+",
                        default=[32768, 65536, 131072, 262144],
                        help="tokens per GPU group, each a multiple of the ranks "
                             "(default 32k 64k 128k 256k)")
    parser.add_argument("--heads", type=positive_int("heads"), default=32,
                        help="query heads, a multiple of --kv-heads (default 32)")
    parser.add_argument("--kv-heads", type=positive_int("kv-heads"), default=None,
                        help="kv heads, a multiple of the ranks, among which yunchang-ulysses "
                             "splits them (default 4, GQA 8:1 at 32 heads; with more ranks, "
                             "the ranks)")
    parser.add_argument("--head-dim", type=positive_int("head-dim"), default=128,
                        help="head dim (default 128)")
    parser.add_argument("--runs", type=positive_int("runs"), default=3,
                        help="timed calls per cell (default 3)")
    parser.add_argument("--check-len", type=int, default=32768,
                        help="longest sequence checked against one process and fp64; 0: none "
                             "(default 32768)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help="nccl: a rank per GPU; gloo: CPU ranks, for a dry run at small "
                             "sizes (default nccl)")
    parser.add_argument("--quiet", action="store_true", help="no line per cell as it is timed")
    return parser


def run(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    visible = torch.cuda.device_count()
    if args.backend == "nccl" and visible == 0:
        parser.error("no CUDA device is visible here for --backend nccl (the default); "
                     "--backend gloo runs the ranks on the CPU, a dry run at small sizes "
                     "(e.g. --seqs 256 --heads 4 --kv-heads 2 --head-dim 32)")
    gpus = args.gpus or (visible if args.backend == "nccl" else 2)
    if args.backend == "nccl" and visible < gpus:
        parser.error(f"--gpus {gpus} needs that many CUDA devices; {visible} visible")
    if args.gpus == 1:
        parser.error("--gpus must be 2 or more, got 1")
    if gpus < 2:
        parser.error("--distributed needs 2 or more GPUs; 1 CUDA device visible")
    if args.kv_heads is None:
        args.kv_heads = max(4, gpus)
    if args.heads % args.kv_heads:
        parser.error(f"--heads must be a multiple of --kv-heads ({args.kv_heads}), "
                     f"got {args.heads}")
    if args.kv_heads % gpus:
        parser.error(f"--kv-heads must be a multiple of the ranks ({gpus}), among which "
                     f"yunchang-ulysses splits them, got {args.kv_heads}")
    uneven = [seq for seq in args.seqs if seq % gpus]
    if uneven:
        parser.error(f"--seqs must be multiples of the ranks ({gpus}), got "
                     f"{' '.join(map(str, uneven))}")
    out = args.out
    worker_args = vars(args)
    rows = []
    for world in (1, gpus):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "rows.json")
            try:
                mp.spawn(_worker, args=(world, worker_args, os.path.join(tmp, "init"), result),
                         nprocs=world, join=True)
            except mp.ProcessExitedException:
                for err in sorted(pathlib.Path(tmp).glob("rows.json.rank*.err")):
                    print(f"pasa-bench --distributed: {err.name[10:-4]} failed:\n{err.read_text()}")
                return 1
            rows += json.loads(pathlib.Path(result).read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "distributed.json").write_text(json.dumps(dict(gpus=gpus, rows=rows), indent=1))
    (out / "distributed.md").write_text(markdown(rows, gpus))
    print(markdown(rows, gpus))
    return 0


def markdown(rows: list, gpus: int) -> str:
    single = {(r["engine"], r["local"], r["seq"], r["causal"]): r for r in rows if r["gpus"] == 1}
    lines = [f"| engine | local | S | mask | ms ({gpus} GPUs) | TFLOP/s/GPU | exposed | "
             f"scaling 1→{gpus} | vs 1 process | vs fp64 (1 process) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["gpus"] == 1:
            continue
        one = single[(r["engine"], r["local"], r["seq"], r["causal"])]
        exposed = max(0.0, 1 - r["local_ms"] / r["ms"])
        check = (f"{r['rmse_vs_single']:.1e} | {r['rmse_multi']:.2e} ({r['rmse_single']:.2e})"
                 if "rmse_vs_single" in r else "- | -")
        seq = f"{r['seq'] // 1024}k" if r["seq"] % 1024 == 0 else str(r["seq"])
        lines.append(f"| {r['engine']} | {r['local']} | {seq} | "
                     f"{'causal' if r['causal'] else 'full'} | {r['ms']:.1f} | "
                     f"{r['tflops_per_gpu']:.0f} | {exposed:.0%} | "
                     f"{one['ms'] / (gpus * r['ms']):.0%} | {check} |")
    return "\n".join(lines) + "\n"
