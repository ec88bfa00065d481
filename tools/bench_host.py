"""``pasa-bench --host``: the host time of a ``fused_attention`` call, on any machine.

Each argument form of the golden matrix (dense prefill, causal, decode with lengths, paged
decode, packed TND, the v2 call with sinks, a checked PASA call) is called on small CPU
tensors with the backend's kernel replaced by a no-op that records, as the Triton backend
records a plan's first call, so that what is timed is the Python work around the kernel
on the path a GPU call takes: validation, normalisation, the plan, output allocation and
the overflow check's bookkeeping. Median microseconds per call over ``--calls`` calls,
beside a peer measured in the same run: a torch SDPA decode call on the same K/V (one
query row, fp32; its host work and a computation of a few microseconds). Each form is
timed called whole (``fused_attention``) and planned once, then run (``pasa_npu.plan``). Writes ``host.json`` and ``host.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Callable

import torch

import pasa_npu
from pasa_npu.fallback.torch import blockwise as torch_blockwise
from pasa_npu.tools.command_line import out_folder, positive_int

B, NQ, NKV, S, D = 2, 8, 2, 128, 64


@contextlib.contextmanager
def no_op_kernel():
    """The torch backend's kernel replaced by one that writes nothing and, as the Triton
    backend's first call of a plan records its launches, records that it ran; with a
    no-op ``repeat`` (:mod:`pasa_npu.backends`), so that a plan's later calls take the path
    of a recording backend's. Plans made under it are dropped after."""
    def record(problem):
        if problem.plan_state is not None:
            problem.plan_state["no-op"] = True

    run = torch_blockwise.run
    torch_blockwise.run, torch_blockwise.repeat = record, lambda plan_state, tensors: True
    pasa_npu.plans.clear()
    try:
        yield
    finally:
        torch_blockwise.run = run
        del torch_blockwise.repeat
        pasa_npu.plans.clear()


def forms() -> dict:
    """name -> (the call as (entry point, query, key, value, keywords), its SDPA peer)."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen).half()  # noqa: E731
    q, k, v = rand(B, NQ, S, D), rand(B, NKV, S, D), rand(B, NKV, S, D)
    q1 = rand(B, 1, NQ * D)
    k1, v1 = rand(B, S, NKV * D), rand(B, S, NKV * D)
    cache_k, cache_v = rand(4, 128, NKV * D), rand(4, 128, NKV * D)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    qt, kt, vt = rand(2 * S, NQ, D), rand(2 * S, NKV, D), rand(2 * S, NKV, D)
    mask = pasa_npu.compressed_causal_mask()
    base = dict(num_heads=NQ, num_key_value_heads=NKV, scale=D ** -0.5, backend="torch",
                algorithm="fa-fp32")
    calls = {
        "prefill BNSD": ("v1", q, k, v, dict(input_layout="BNSD", **base)),
        "prefill BNSD causal": ("v1", q, k, v, dict(input_layout="BNSD", sparse_mode=3,
                                                       atten_mask=mask, **base)),
        "prefill BNSD, pasa checked": ("v1", q, k, v,
                                       dict(input_layout="BNSD", **dict(base, algorithm="pasa"))),
        "decode BSH, kv lengths": ("v1", q1, k1, v1, dict(
            input_layout="BSH", actual_seq_lengths_kv=[S, S // 2], **base)),
        "paged decode BSH": ("v1", q1, cache_k, cache_v, dict(
            input_layout="BSH", block_table=table, block_size=128,
            actual_seq_lengths_kv=[200, 150], **base)),
        "prefill TND causal": ("v1", qt, kt, vt, dict(
            input_layout="TND", sparse_mode=3, atten_mask=mask, actual_seq_lengths=[S, 2 * S],
            actual_seq_lengths_kv=[S, 2 * S], **base)),
        "v2 TND with sinks": ("v2", qt, kt, vt, dict(
            num_query_heads=NQ, num_key_value_heads=NKV, input_layout="TND",
            softmax_scale=D ** -0.5, actual_seq_qlen=[S, 2 * S], actual_seq_kvlen=[S, 2 * S],
            learnable_sink=torch.zeros(NQ), backend="torch", algorithm="fa-fp32")),
    }
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q32, k32, v32 = q[:, :, :1].float(), k.float(), v.float()
    peer = lambda: sdpa(q32, k32, v32, enable_gqa=True)  # noqa: E731
    return {name: (call, peer) for name, call in calls.items()}


def entries(version: str) -> tuple[Callable, Callable]:
    """(the call, its plan) of ``version``, "v1" or "v2"."""
    if version == "v1":
        return pasa_npu.fused_attention, pasa_npu.plan
    return pasa_npu.fused_attention_v2, pasa_npu.plan_v2


def eager(call) -> Callable[[], object]:
    """The form's ``fused_attention`` (or ``_v2``) call, arguments validated every time."""
    version, q, k, v, keywords = call
    entry = entries(version)[0]
    return lambda: entry(q, k, v, **keywords)


def planned(call) -> Callable[[], object]:
    """The form planned once (``pasa_npu.plan``), then run on its tensors."""
    version, q, k, v, keywords = call
    plan = entries(version)[1](q, k, v, **keywords)
    return lambda: plan.run(q, k, v)


def _median_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def make_parser() -> argparse.ArgumentParser:
    """The options of ``pasa-bench --host``."""
    parser = argparse.ArgumentParser(prog="pasa-bench --host",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=out_folder, default="bench-out",
                        help="folder for host.json/.md, made where missing (default bench-out)")
    parser.add_argument("--calls", type=positive_int("calls"), default=2000,
                        help="timed calls per form (default 2000)")
    return parser


def run(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # host work is one thread's; no intra-op pool to wake
    with no_op_kernel():
        for name, (call, peer) in forms().items():
            rows.append(dict(form=name, fused_attention_us=_median_us(eager(call), args.calls),
                             plan_run_us=_median_us(planned(call), args.calls),
                             sdpa_us=_median_us(peer, args.calls)))
    torch.set_num_threads(threads)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "host.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (out / "host.md").write_text(table)
    print(table)
    return 0


def markdown(rows: list) -> str:
    lines = ["| argument form | fused_attention (µs) | plan, then run (µs) | SDPA decode call (µs) "
             "| ratios to SDPA |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['form']} | {r['fused_attention_us']:.0f} | {r['plan_run_us']:.0f} | "
                     f"{r['sdpa_us']:.0f} | {r['fused_attention_us'] / r['sdpa_us']:.1f} / "
                     f"{r['plan_run_us'] / r['sdpa_us']:.1f} |")
    return "\n".join(lines) + "\n"
