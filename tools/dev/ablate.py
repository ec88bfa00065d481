"""``python -m pasa_npu.tools.dev.ablate``: what each part of the Triton prefill costs, on a CUDA GPU.

Times ``pasa-exact`` (``fa-fp32`` and ``pasa`` too for the load paths) through
``pasa_npu.fused_attention`` at the benchmark's shapes, in one process, against:

* the backend's default (on an H100 the warp-specialised Gluon prefill for pasa-exact and
  fa-fp32) and the Triton kernel (``prefill=triton``); every row below times the Triton
  kernel, ``prefill_kernel``;
* the Triton backend's other tuning switches (``loads``, ``row_constant``);
* every kv-block loop compiled in (fa-fp32 too), against only those a problem can enter;
* other launch configurations (BLOCK_M, warps, stages), for ``pasa`` too;
* a plain FlashAttention-2 forward written as a minimal Triton kernel (the baseline
  Triton itself reaches on this GPU).

Each variant is a :class:`pasa_npu.fallback.triton.tuning.Tuning`, made active around its
timing. It also splits a pasa-exact and a pasa call into its GPU kernels (torch.profiler),
so that the separate key-shift pass's share of each timing is seen (``--kernels-only``:
that split alone, without the variants). Prints TFLOP/s (4 B H S^2 d / t, half for causal).

``--check-cost`` instead times what the overflow check (``repair_overflow``, on by
default) costs where nothing overflows: ``pasa`` and ``pasa-exact`` prefill at the shapes
above after decode at pasa-bench's S2 = 8k shapes (GQA 4:1 and 8:1; ``--no-decode``:
none), replayed from a CUDA graph with the check on, off and off again, in an order that
rotates, ``--reps`` times (5): the median and range of the runs' on/off ratios, read
against the off/off ratios, the spread between runs of the same kernels.
``--check-kernels`` splits instead one eager call of each into its GPU kernels
(torch.profiler) with the check on and off, at the same cases: device time per kernel
both ways, so that a cost the kernels added by the check (the row flags' fill, the repair
launch) account for is told from one inside the attention kernel; the gaps between
kernels, which a graph replay times too, are in neither.
``--check-instructions`` counts instead, under Nsight Compute (``ncu``, CUDA's profiler), the
warp instructions every kernel of one call issues with the check on and off, at the same
cases: a count, not a time, so it shows a change far below the spread between timings.

``--host-time`` (any machine) instead measures host time per call (:mod:`host_time`).
"""
from __future__ import annotations

import argparse
import csv
import functools
import shutil
import statistics
import subprocess
import sys

import torch
import triton
import triton.language as tl

import pasa_npu
from pasa_npu.fallback.triton import tuning as triton_tuning
from pasa_npu.tools import bench
from pasa_npu.tools.dev import host_time

SHAPES = ((128, 4096, 4, 16), (128, 16384, 1, 16), (64, 4096, 4, 32), (64, 16384, 1, 32))
CONFIGS = ((128, 8, 3), (128, 8, 2), (128, 4, 2), (64, 4, 3), (64, 4, 2))  # (BLOCK_M, warps, stages)
PLAIN_CONFIGS = ((128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 64, 8, 3))


def triton_kernel_tuning(**switches) -> triton_tuning.Tuning:
    """The default tuning on the Triton prefill kernel, with ``switches`` changed."""
    return triton_tuning.DEFAULT_TUNING.replace(prefill="triton", **switches)


@triton.jit
def plain_fa2(Q, K, V, O, sm_scale, seq, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """Minimal FlashAttention-2 forward over contiguous (B*H, S, D) fp16, S a multiple of
    the blocks: the baseline, no feature of the operator."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * seq * HEAD_DIM
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :])
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    hi = (pid_m + 1) * BLOCK_M if CAUSAL else seq
    for n0 in range(0, hi, BLOCK_N):
        k = tl.load(K + base + (n0 + cols)[:, None] * HEAD_DIM + dims[None, :])
        v = tl.load(V + base + (n0 + cols)[:, None] * HEAD_DIM + dims[None, :])
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL:
            qk = tl.where(rows[:, None] >= (n0 + cols)[None, :], qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)  # noqa: E741
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m = m_new
    tl.store(O + base + rows[:, None] * HEAD_DIM + dims[None, :],
             (acc / l[:, None]).to(tl.float16))


def plain(q, k, v, causal, block_m=128, block_n=128, warps=8, stages=3):
    batch, heads, seq, d = q.shape
    out = torch.empty_like(q)
    plain_fa2[(seq // block_m, batch * heads)](q, k, v, out, d ** -0.5, seq, block_m, block_n,
                                               d, causal, num_warps=warps, num_stages=stages)
    return out


@functools.lru_cache(maxsize=None)
def _causal_mask(device: torch.device) -> torch.Tensor:
    """One mask object per device, as a caller holds it: a new mask on every call would be
    validated on every call, and the timing would be of that host work."""
    return pasa_npu.compressed_causal_mask(device)


def ours(algorithm, q, k, v, causal):
    """``algorithm`` through ``pasa_npu.fused_attention``, called as pasa-bench calls it."""
    return bench.ours_call(algorithm, _causal_mask(q.device), q.shape[1], k.shape[1],
                           q.shape[3])(q, k, v, causal, False)


def _time_ms(fn):
    import triton.testing
    try:
        return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
    except Exception as err:  # a variant that does not fit is reported, not hidden
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"


def candidates():
    """(label, tuning, call): ``call(q, k, v, causal)`` is timed with ``tuning`` active
    (None: the backend's default)."""
    out = [("fa-fp32", None, lambda q, k, v, c: ours("fa-fp32", q, k, v, c))]
    for cfg in PLAIN_CONFIGS:
        out.append((f"plain Triton FA2 (BLOCK_M, BLOCK_N, warps, stages) = {cfg}", None,
                    lambda q, k, v, c, cfg=cfg: plain(q, k, v, c, *cfg)))

    def ours_with(label, tuning, algorithm="pasa-exact"):
        out.append((f"{algorithm} {label}", tuning,
                    lambda q, k, v, c: ours(algorithm, q, k, v, c)))

    out.append(("pasa-exact", None, lambda q, k, v, c: ours("pasa-exact", q, k, v, c)))
    for algorithm in ("fa-fp32", "pasa-exact"):
        ours_with("prefill=triton", triton_kernel_tuning(), algorithm)
        ours_with("with every kv-block loop compiled in", triton_kernel_tuning(loops=7),
                  algorithm)
    for loads in ("tma", "pointers"):
        for algorithm in ("fa-fp32", "pasa"):
            ours_with(f"loads={loads}", triton_kernel_tuning(loads=loads), algorithm)
        for row_constant in ("precomputed", "in-kernel"):
            ours_with(f"loads={loads} row_constant={row_constant}",
                      triton_kernel_tuning(loads=loads, row_constant=row_constant))
    for algorithm in ("pasa-exact", "pasa"):
        for config in CONFIGS:
            ours_with(f"(BLOCK_M, warps, stages) = {config}",
                      triton_kernel_tuning(row_constant="precomputed", launch=config), algorithm)
    return out


def per_call_device_us(events, calls: int) -> dict:
    """Device time per call by kernel name (C++ template arguments and parameter lists
    dropped), from profiler ``events`` (``key``, ``self_device_time_total`` in
    microseconds) recorded over ``calls`` calls."""
    out: dict = {}
    for event in events:
        if event.self_device_time_total > 0:
            name = event.key.removeprefix("void ").split("<")[0].split("(")[0]
            out[name] = out.get(name, 0.0) + event.self_device_time_total / calls
    return out


def kernel_times_us(fn, calls: int = 20) -> dict:
    """The GPU kernels one call of ``fn`` launches, with their device time per call, from
    its third call on (a plan records its launches at the first, captures them at the
    second)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return per_call_device_us(prof.key_averages(), calls)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ablate", description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--host-time", action="store_true",
                        help="only host time per call: the API layer's (no GPU needed), and "
                             "an eager decode step's where there is a GPU")
    parser.add_argument("--check-cost", action="store_true",
                        help="only the overflow check's cost: repair_overflow on against off")
    parser.add_argument("--reps", type=int, default=5,
                        help="--check-cost: runs of on, off and off again per case")
    parser.add_argument("--no-decode", action="store_true",
                        help="--check-cost: prefill cases only")
    parser.add_argument("--check-kernels", action="store_true",
                        help="only the overflow check's cost per GPU kernel: device time "
                             "of each kernel of one call, on against off (torch.profiler)")
    parser.add_argument("--check-instructions", action="store_true",
                        help="only the overflow check's issued instructions, on against "
                             "off, counted by Nsight Compute (ncu)")
    parser.add_argument("--one-call", nargs=7, help=argparse.SUPPRESS)  # ncu's child
    parser.add_argument("--kernels-only", action="store_true",
                        help="only split a pasa-exact and a pasa call into their GPU kernels "
                             "(no timing-only variants: a minute, not tens)")
    args = parser.parse_args(argv)
    if args.host_time:
        host_time.print_host_times()
        return 0
    if not torch.cuda.is_available():
        print("ablate: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.one_call:
        _one_profiled_call(*args.one_call)
        return 0
    if args.check_cost:
        _check_cost(args)
        return 0
    if args.check_kernels:
        _check_kernels(args)
        return 0
    if args.check_instructions:
        return _check_instructions(args)
    _time_variants(args)
    return 0


def _check_cases(args) -> list[tuple]:
    """``--check-cost``'s cases, (d, S, B, H, H_kv, causal; None for decode), and labels."""
    cases = [] if args.no_decode else [(128, 8192, 8, 32, kv_heads, None) for kv_heads in (8, 4)]
    cases += [(d, seq, batch, heads, heads, causal) for d, seq, batch, heads in SHAPES
              if d in args.dims
              for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]]
    return [(case, _case_label(*case)) for case in cases]


def _case_label(d, seq, batch, heads, kv_heads, causal) -> str:
    if causal is None:
        return f"decode d={d} S2={seq} B={batch} H={heads} H_kv={kv_heads}"
    return f"prefill d={d} S={seq} B={batch} H={heads} {'causal' if causal else 'no mask'}"


def _case_inputs(d, seq, batch, heads, kv_heads, causal, gen):
    q = torch.randn(batch, heads, 1 if causal is None else seq, d, device="cuda",
                    dtype=torch.float16, generator=gen)
    k, v = (torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=torch.float16,
                        generator=gen) for _ in range(2))
    return q, k, v


#: the allocations whose overflow check ``--check-cost``, ``--check-kernels`` and
#: ``--check-instructions`` measure
CHECKED_ALGORITHMS = ("pasa", "pasa-exact")


def _case_call(algorithm, check: bool, q, k, v, causal):
    """One case's call with ``repair_overflow=check``, as pasa-bench makes it (``causal``
    None for decode)."""
    return functools.partial(bench.ours_call(algorithm, _causal_mask(q.device), q.shape[1],
                                             k.shape[1], q.shape[3], repair_overflow=check),
                             q, k, v, bool(causal), False)


def _checked_calls(args):
    """``--check-cost``'s and ``--check-kernels``' calls: for each case (inputs from one
    seeded generator, in order) and checked allocation, its label, the allocation and its
    calls {True: checked, False: unchecked}."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (d, seq, batch, heads, kv_heads, causal), what in _check_cases(args):
        q, k, v = _case_inputs(d, seq, batch, heads, kv_heads, causal, gen)
        for algorithm in CHECKED_ALGORITHMS:
            yield what, algorithm, {check: _case_call(algorithm, check, q, k, v, causal)
                                    for check in (True, False)}


def _one_profiled_call(d, seq, batch, heads, kv_heads, causal, algorithm_check) -> None:
    """The child ``--check-instructions`` runs under ncu: one case's call, once to compile
    and once between cudaProfilerStart and Stop (ncu profiles only that one)."""
    algorithm, check = algorithm_check.rsplit(":", 1)
    causal = None if causal == "decode" else causal == "causal"
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = _case_inputs(int(d), int(seq), int(batch), int(heads), int(kv_heads), causal, gen)
    call = _case_call(algorithm, check == "on", q, k, v, causal)
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


INSTRUCTIONS = "smsp__inst_executed.sum"


def ncu_instructions(report: str) -> dict[str, int]:
    """Warp instructions issued per kernel name (summed over its launches) in ncu's
    ``--csv`` report of :data:`INSTRUCTIONS`; lines that are not CSV rows (ncu's own
    ``==PROF==`` messages) are skipped."""
    rows = csv.DictReader(line for line in report.splitlines() if line.startswith('"'))
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("Metric Name") == INSTRUCTIONS:
            name = row["Kernel Name"]
            counts[name] = counts.get(name, 0) + int(row["Metric Value"].replace(",", ""))
    return counts


def _ncu() -> str | None:
    return shutil.which("ncu") or shutil.which("ncu", path="/usr/local/cuda/bin")


def _check_instructions(args) -> int:
    """:func:`main`'s ``--check-instructions``: per case and allocation, the warp
    instructions all kernels of one call issue with the check off and on (ncu's
    :data:`INSTRUCTIONS`, every launch between the child's profiler start and stop)."""
    ncu = _ncu()
    if ncu is None:
        print("ablate: error: --check-instructions needs Nsight Compute (ncu) on the PATH",
              file=sys.stderr)
        return 2
    print(f"overflow check on / off: warp instructions issued by one call ({INSTRUCTIONS}, "
          f"all its kernels, Nsight Compute)")
    for case, label in _check_cases(args):
        causal = case[5]
        mode = "decode" if causal is None else ("causal" if causal else "none")
        for algorithm in CHECKED_ALGORITHMS:
            counts = {}
            for check in ("off", "on"):
                # the child imports pasa_npu as this process did (-P: not from the cwd)
                child = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m",
                         "pasa_npu.tools.dev.ablate", "--one-call", *map(str, case[:5]), mode,
                         f"{algorithm}:{check}"]
                done = subprocess.run([ncu, "--profile-from-start", "off", "--metrics",
                                       INSTRUCTIONS, "--csv", *child],
                                      capture_output=True, text=True)
                counts[check] = ncu_instructions(done.stdout)
                if done.returncode != 0 or not counts[check]:
                    print(f"ablate: error: ncu exited {done.returncode} with no instruction "
                          f"count:\n{(done.stdout + done.stderr)[-2000:]}", file=sys.stderr)
                    return 2
            off, on = (sum(counts[c].values()) for c in ("off", "on"))
            print(f"  {label} {algorithm:10s}: off {off:,} ({len(counts['off'])} kernels), "
                  f"on {on:,} ({len(counts['on'])} kernels): +{on - off:,} "
                  f"(+{100 * (on - off) / off:.2f}%)", flush=True)
    return 0


def _check_cost(args) -> None:
    """:func:`main`'s ``--check-cost``: graph-replay times with ``repair_overflow`` on and
    twice off, in an order that rotates from run to run; per case the median of the
    runs' on/off ratios and their range, against the unchecked call timed against itself
    (off/off, the spread between runs of the same kernels)."""
    print(f"overflow check on / off, graph replay, {args.reps} runs of on, off and off again "
          f"(order rotating); medians of the runs' ratios [min, max]")
    for what, algorithm, calls in _checked_calls(args):
        ratios = {"on/off": [], "off/off": []}
        for run in range(args.reps):
            sides = ("on", "off", "off again")
            order = sides[run % 3:] + sides[:run % 3]
            ms = {side: bench.graph_replay_ms(calls[side == "on"]) for side in order}
            ratios["on/off"].append(ms["on"] / ms["off"])
            ratios["off/off"].append(ms["off again"] / ms["off"])
        line = "; ".join(f"{name} {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"
                         for name, r in ratios.items())
        print(f"  {what} {algorithm:10s}: {line}", flush=True)


def kernel_cost_lines(on: dict, off: dict) -> list[str]:
    """:func:`kernel_times_us`' splits of a call with the check on and off, kernel by
    kernel (the longest first; "-" where the call launches no such kernel), then their
    sums: one line each."""
    def us(times, name):
        return f"{times[name]:9.1f}" if name in times else f"{'-':>9s}"

    lines = []
    for name in sorted(on.keys() | off.keys(), key=lambda n: -max(on.get(n, 0), off.get(n, 0))):
        change = on.get(name, 0.0) - off.get(name, 0.0)
        lines.append(f"{name[:40]:40s} off {us(off, name)} us  on {us(on, name)} us  "
                     f"{change:+8.1f} us")
    total_on, total_off = sum(on.values()), sum(off.values())
    lines.append(f"{'all kernels':40s} off {total_off:9.1f} us  on {total_on:9.1f} us  "
                 f"{total_on - total_off:+8.1f} us ({100 * (total_on / total_off - 1):+.2f}%)")
    return lines


def _check_kernels(args) -> None:
    """:func:`main`'s ``--check-kernels``: per case and allocation, the device time of each
    kernel of one eager call with ``repair_overflow`` off and on (:func:`kernel_cost_lines`)."""
    profiled = 20
    print(f"overflow check on / off: device time per kernel of one call (torch.profiler, "
          f"{profiled} calls each; gaps between kernels not included)")
    for what, algorithm, calls in _checked_calls(args):
        times = {check: kernel_times_us(calls[check], profiled) for check in (False, True)}
        print(f"  {what} {algorithm}:", flush=True)
        for line in kernel_cost_lines(times[True], times[False]):
            print(f"    {line}", flush=True)


def _time_variants(args) -> None:
    """Every candidate (none with ``--kernels-only``) and the kernel split, at each shape."""
    runs = [] if args.kernels_only else candidates()
    for d, seq, batch, heads in SHAPES:
        if d not in args.dims:
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.float16,
                               generator=gen) for _ in range(3))
        for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
            flops = 4.0 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)
            print(f"=== d={d} S={seq} B={batch} H={heads} "
                  f"{'causal' if causal else 'no mask'}", flush=True)
            for label, tuning, call in runs:
                with triton_tuning.using(tuning or triton_tuning.DEFAULT_TUNING):
                    ms = _time_ms(lambda: call(q, k, v, causal))
                text = ms if isinstance(ms, str) else f"{flops / ms / 1e9:7.1f} TFLOP/s"
                print(f"  {label:58s} {text}", flush=True)
            for algorithm in ("pasa-exact", "pasa"):
                times = kernel_times_us(functools.partial(ours, algorithm, q, k, v, causal))
                total = sum(times.values())
                parts = ", ".join(f"{name} {us:.0f} us ({100 * us / total:.1f}%)"
                                  for name, us in sorted(times.items(), key=lambda x: -x[1]))
                print(f"  {algorithm} kernels per call: {parts}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
