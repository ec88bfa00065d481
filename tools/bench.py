"""``pasa-bench``: forward speed on a CUDA GPU against torch SDPA's flash and cuDNN backends.

Every number is measured in this process, with CUDA events (``triton.testing.do_bench``,
median) after warm-up, so the ratios compare like with like. Prefill is reported
in TFLOP/s = 4 B H S1 S2 d / t (half for causal); decode in GB/s of K and V
read, against the device-to-device copy bandwidth measured here too (bytes read
plus written). Our calls go through ``pasa_npu.fused_attention`` with BNSD
inputs, so argument handling and the PASA key shift are part of every timing.
Decode is timed twice for every candidate: replayed from a CUDA graph (the GPU
time, as serving engines run decode) and called eagerly (adding the host time of
each call, which at tens of microseconds per step can exceed the kernels).

``--distributed`` times sequence-parallel attention over the host's GPUs instead
(:mod:`bench_distributed`), ``--host`` the host time of a call on CPU tensors
(:mod:`bench_host`), each with its own options. Writes ``bench.json``, ``bench.md`` and
``bench.png`` (``--out``); ``--plot FILE.json``
redraws the plot from a saved run. ``--overflow-check compare`` instead times every case
``--runs`` times with the check off and on (alternating which comes first) and writes
``check.json`` and ``check.md``: whether each checked cell lies within the spread between
the unchecked runs, and how many cells fall outside against what chance alone gives
(:mod:`bench_check`). The tables and the plot are :mod:`bench_report`'s.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

import pasa_npu
from pasa_npu.fallback import kernel_common
from pasa_npu.fallback.triton import tuning as triton_tuning
from pasa_npu.tools import bench_paged
from pasa_npu.tools.bench_check import chance_outside, check_comparison, check_markdown
from pasa_npu.tools.bench_report import markdown, plot, plot_problem, row_text
from pasa_npu.tools.command_line import out_folder, positive_int

PREFILL_ALGORITHMS = ("pasa-exact", "pasa", "pasa-mixed", "fa-fp32", "fa-fp16s", "fa-fp16")
DECODE_ALGORITHMS = ("pasa-exact", "pasa", "fa-fp32")
TOKENS = 16384  # B * S kept constant so that every shape fills the GPU
HIDDEN = 2048   # H * d


#: the torch switches of SDPA's backends, each set on or off for a peer's call
_SDPA_SWITCHES = ("flash", "cudnn", "mem_efficient", "math")


def _sdpa(backend_name):
    """torch SDPA on one backend, as a caller who has picked it once calls it: the backend's
    switch on and the others off (torch's global switches, set before each call at a
    fraction of a microsecond; ``sdpa_kernel``'s context manager costs microseconds per
    call, which the peer's host time must not carry)."""
    only = {"sdpa-flash": "flash", "sdpa-cudnn": "cudnn"}[backend_name]
    setters = [(getattr(torch._C, f"_set_sdp_use_{name}"), name == only)
               for name in _SDPA_SWITCHES]

    def call(q, k, v, causal, gqa):
        for set_switch, on in setters:
            set_switch(on)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=gqa)
    return call


def _all_sdpa_backends() -> None:
    """torch's default: every SDPA backend switched on."""
    for name in _SDPA_SWITCHES:
        getattr(torch._C, f"_set_sdp_use_{name}")(True)


def ours_call(algorithm, mask, heads: int, kv_heads: int, head_dim: int, **options):
    """``fused_attention`` with ``algorithm`` on the triton backend as the benchmark calls
    it, on BNSD inputs of ``heads`` query heads, ``kv_heads`` kv heads and ``head_dim``
    (``options``: further keyword arguments, e.g. ``repair_overflow``). The keywords are
    made once, as a model's layer holds them, not derived from the inputs on every call
    (which would time the caller's work as ours)."""
    plain = dict(num_heads=heads, num_key_value_heads=kv_heads, input_layout="BNSD",
                 scale=head_dim ** -0.5, algorithm=algorithm, backend="triton", **options)
    causal_kw = dict(plain, sparse_mode=3, atten_mask=mask)

    def call(q, k, v, causal, gqa):
        return pasa_npu.fused_attention(q, k, v, **(causal_kw if causal else plain))[0]
    return call


def _time_ms(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median")


def graph_replay_ms(fn) -> float:
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=400, return_mode="median")


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read plus written, in GB/s."""
    src = torch.randn(512 * 1024 * 1024, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def prefill_cases(dims=(64, 128), seqs=(1024, 4096, 16384)):
    for d in dims:
        for s in seqs:
            for causal in (False, True):
                yield dict(kind="prefill", d=d, s=s, causal=causal, b=max(1, TOKENS // s),
                           h=HIDDEN // d)


def decode_cases(kv_lens=(8192, 32768), ratios=(4, 8), d=128, heads=32, batch=8):
    for s2 in kv_lens:
        for ratio in ratios:
            yield dict(kind="decode", d=d, s=s2, ratio=ratio, b=batch, h=heads,
                       hkv=heads // ratio)


def run_case(case, algorithms, mask, progress=print, paged_cache=None,
             overflow_check=True) -> dict:
    """Time every candidate on ``case``; with ``paged_cache`` ("4d" or "3d", see
    :mod:`bench_paged`), also our paged allocations on the same K/V in a paged cache
    (decode, and prefill at d = 128), as "<algorithm> paged" entries. ``overflow_check``:
    our calls' ``repair_overflow``."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    d, b, h = case["d"], case["b"], case["h"]
    dt = torch.float16
    if case["kind"] == "prefill":
        s1 = s2 = case["s"]
        hkv = h
        flops = 4.0 * b * h * s1 * s2 * d * (0.5 if case["causal"] else 1.0)
    else:
        s1, s2, hkv = 1, case["s"], case["hkv"]
        flops = 4.0 * b * h * s2 * d
    q = torch.randn(b, h, s1, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(b, hkv, s2, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(b, hkv, s2, d, device="cuda", dtype=dt, generator=gen)
    causal = case.get("causal", False)
    gqa = hkv != h
    kv_bytes = 2 * k.numel() * k.element_size() if case["kind"] == "decode" else None
    candidates = {name: ours_call(name, mask, h, hkv, d, repair_overflow=overflow_check)
                  for name in algorithms}
    for name in ("sdpa-flash", "sdpa-cudnn"):
        candidates[name] = _sdpa(name)
    row = dict(case)
    calls = {}
    for name, fn in candidates.items():
        calls[name] = lambda fn=fn: fn(q, k, v, causal, gqa)
        row[name] = _timed(calls[name], flops, kv_bytes)
    paged = [a for a in bench_paged.PAGED_ALGORITHMS if a in algorithms]
    paged_fns = {}  # algorithm -> its call on the paged cache
    if paged_cache and paged and (case["kind"] == "decode" or d == 128):
        k_cache, v_cache, table = bench_paged.paged_kv(k, v, gen, paged_cache)
        for name in paged:
            fn = paged_fns[name] = bench_paged.paged_call(name, mask, table, h, hkv, d,
                                                          repair_overflow=overflow_check)
            paged_call = lambda fn=fn: fn(q, k_cache, v_cache, causal, gqa)  # noqa: E731
            row[f"{name} paged"] = _timed(paged_call, flops, kv_bytes)
            calls[f"{name} paged"] = paged_call
            if case["kind"] == "prefill":  # the kernels alone, without the host's time
                plain = candidates[name]
                _add_graph_tflops(row[name], lambda: plain(q, k, v, causal, gqa), flops)
                _add_graph_tflops(row[f"{name} paged"], paged_call, flops)
    timed = [n for n in calls if "error" not in row[n]]
    for name, us in host_us({n: calls[n] for n in timed}).items():
        row[name]["host_us"] = us
    # each candidate on inputs at addresses its earlier calls did not use (paged: the query)
    views = [views_at_new_addresses(t) for t in (q, k, v)]
    elsewhere = {}
    for name in timed:
        at = [in_turn(t) for t in views]
        if name.endswith(" paged"):
            fn = paged_fns[name.removesuffix(" paged")]
            elsewhere[name] = lambda fn=fn, at=at: fn(at[0](), k_cache, v_cache, causal, gqa)
        else:
            elsewhere[name] = (lambda fn=candidates[name], at=at:
                               fn(at[0](), at[1](), at[2](), causal, gqa))
    for name, us in host_us(elsewhere).items():
        row[name]["host_us_new"] = us
    ours = [n for n in timed if not n.startswith("sdpa")]
    for name in ours:
        row[name]["launches"], row[name]["graph"] = triton_launches(elsewhere[name])
    _all_sdpa_backends()
    progress(row_text(row, algorithms))
    return row


def _timed(call, flops: float, kv_bytes) -> dict:
    """One candidate's timing entry: ms and TFLOP/s; for decode (``kv_bytes`` given) GB/s
    eagerly and replayed from a CUDA graph; an error entry where the candidate fails (a
    peer that refuses a shape is reported, not hidden)."""
    try:
        ms = _time_ms(call)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
    entry = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    if kv_bytes is not None:
        entry["eager_gbs"] = kv_bytes / (ms * 1e-3) / 1e9
        try:
            entry["graph_ms"] = graph_replay_ms(call)
            entry["gbs"] = kv_bytes / (entry["graph_ms"] * 1e-3) / 1e9
        except Exception as err:
            entry["graph_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return entry


def host_us(calls: dict, rounds: int = 10, per_round: int = 5) -> dict:
    """name -> median microseconds of host time per call of ``calls[name]``, measured while
    the GPU is kept busy by work queued ahead of the calls (so that no call waits for it,
    and each call's time is its Python and launch work alone). The candidates take turns,
    ``per_round`` calls each per round, so that a drift of the host's speed during the
    cell falls on all of them alike; the order of the turns rotates from round to round, so
    that no candidate always goes first after the GPU was idle."""
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    times: dict = {name: [] for name in calls}
    order = list(calls.items())
    for turn in range(rounds):
        torch.cuda._sleep(1 << 27)  # about 70 ms of GPU work ahead of the round's calls
        for name, call in order[turn % len(order):] + order[:turn % len(order)]:
            for _ in range(per_round):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


#: distinct addresses :func:`views_at_new_addresses` makes: more than :func:`host_us` calls
#: one candidate (51)
NEW_ADDRESSES = 64


def views_at_new_addresses(t: torch.Tensor) -> list:
    """Tensors of ``t``'s shape, strides and dtype (contiguous) at :data:`NEW_ADDRESSES`
    distinct addresses: views 128 bytes apart into one buffer of random values."""
    step = 128 // t.element_size()
    flat = torch.randn(t.numel() + NEW_ADDRESSES * step, device=t.device, dtype=t.dtype)
    return [flat[i * step:i * step + t.numel()].view(t.shape) for i in range(NEW_ADDRESSES)]


def in_turn(views: list):
    """A function returning ``views`` one after the other, each call the next: a
    candidate's calls at addresses none of its earlier calls used."""
    turn = [-1]

    def at():
        turn[0] = (turn[0] + 1) % len(views)
        return views[turn[0]]
    return at


def triton_launches(call) -> tuple[int, bool]:
    """(the Triton kernels that one call of a plan already recorded runs, whether it
    replayed them as one CUDA graph), for a call made as ``call`` makes it (the bench's:
    at new addresses)."""
    call()
    call()
    counters = kernel_common.FAST_LAUNCHES, kernel_common.GRAPH_KERNELS
    before, replays = [c[0] for c in counters], kernel_common.GRAPH_REPLAYS[0]
    call()
    return (sum(c[0] - b for c, b in zip(counters, before)),
            kernel_common.GRAPH_REPLAYS[0] > replays)


def empty_launch_us():
    """Host µs of one launch of an empty Triton kernel the way a recorded call launches its
    kernels (:class:`~pasa_npu.fallback.kernel_common.PreparedLaunch`: Triton's C launcher,
    no argument binding), measured as :func:`host_us` measures calls: the floor of each
    launch in a call's host time. None where this Triton's launches are not recorded."""
    import triton

    @triton.jit
    def empty(x):
        pass

    x = torch.zeros(1, device="cuda")
    roles = {"x": x}
    binding = kernel_common.Binding(roles)
    binding.launch(empty, (1,), x)
    prepared = binding.prepared()
    if prepared is None:
        return None  # a Triton whose internals the direct launch does not know
    (launch,) = prepared.actions
    return host_us({"empty": lambda: launch.run(roles)})["empty"]


def _add_graph_tflops(entry: dict, call, flops: float) -> None:
    """``entry`` gains TFLOP/s replayed from a CUDA graph (host time excluded)."""
    if "error" in entry:
        return
    try:
        entry["graph_tflops"] = flops / (graph_replay_ms(call) * 1e-3) / 1e12
    except Exception as err:
        entry["graph_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"


def make_parser() -> argparse.ArgumentParser:
    """The options of the GPU benchmark (``--distributed`` and ``--host`` have their own)."""
    parser = argparse.ArgumentParser(prog="pasa-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder, default="bench-out",
                        help="folder for bench.json/.md/.png, made where missing "
                             "(default bench-out)")
    parser.add_argument("--host", action="store_true",
                        help="the host time of a call, on CPU tensors with a no-op kernel "
                             "(see --host --help)")
    parser.add_argument("--distributed", action="store_true",
                        help="sequence parallelism over the host's GPUs (see --distributed "
                             "--help for its options)")
    parser.add_argument("--plot", metavar="JSON",
                        help="only redraw bench.png of a saved bench.json into --out")
    parser.add_argument("--quick", action="store_true",
                        help="no decode; prefill at S = 1k 4k unless --seqs is given")
    parser.add_argument("--dims", type=positive_int("dims"), nargs="+", default=[64, 128],
                        help=f"prefill head dims, each with {HIDDEN} // d heads "
                             f"(default 64 128)")
    parser.add_argument("--seqs", type=positive_int("seqs"), nargs="+", default=None,
                        help="prefill sequence lengths (default 1k 4k 16k)")
    parser.add_argument("--no-decode", action="store_true", help="skip the decode cases")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill cases")
    parser.add_argument("--paged", choices=bench_paged.CACHE_SHAPES + ("none",), default="4d",
                        help="also time pasa-exact/pasa/fa-fp32 reading K/V through a block "
                             "table from a paged cache of this shape (decode, prefill at "
                             "d=128); none: skip (default 4d)")
    parser.add_argument("--tuning", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Triton backend switches (fallback/triton/tuning.py Tuning), "
                             "e.g. shift=fused row_constant=in-kernel (default: none, the "
                             "backend's own)")
    parser.add_argument("--algorithms", nargs="+", default=list(PREFILL_ALGORITHMS),
                        choices=pasa_npu.ALGORITHM_NAMES, metavar="NAME",
                        help="our precision allocations to time; decode times those of "
                             f"{' '.join(DECODE_ALGORITHMS)} among them (default "
                             f"{' '.join(PREFILL_ALGORITHMS)}; choices: "
                             f"{' '.join(pasa_npu.ALGORITHM_NAMES)})")
    parser.add_argument("--overflow-check", choices=("on", "off", "compare"), default="on",
                        help="our calls' repair_overflow (off: what the PASA kernels cost "
                             "without the overflow check; compare: both, --runs times, "
                             "into check.json/.md) (default on)")
    parser.add_argument("--runs", type=int, default=None,
                        help="with --overflow-check compare: runs per setting, odd "
                             "(default 9)")
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--distributed" in argv:  # sequence parallel over the host's GPUs: its own options
        from pasa_npu.tools import bench_distributed
        return bench_distributed.run(argv)
    if "--host" in argv:  # the host time of a call, on CPU tensors: its own options
        from pasa_npu.tools import bench_host
        return bench_host.run(argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.runs is not None and args.overflow_check != "compare":
        parser.error(f"--runs applies to --overflow-check compare, not "
                     f"--overflow-check {args.overflow_check}")
    if args.overflow_check == "compare":
        args.runs = 9 if args.runs is None else args.runs
        try:
            chance_outside(args.runs)  # the run counts the comparison can judge
        except ValueError as err:
            parser.error(f"--{err}")
    if args.no_prefill and (args.no_decode or args.quick):
        parser.error(f"--no-prefill with {'--no-decode' if args.no_decode else '--quick'} "
                     f"leaves no case to time")
    if max(args.dims) > HIDDEN:
        parser.error(f"--dims must be at most {HIDDEN} (heads x head dim), got {max(args.dims)}")
    out = args.out
    if args.plot:
        try:
            result = json.loads(pathlib.Path(args.plot).read_text())
        except (OSError, ValueError) as err:
            print(f"pasa-bench: error: cannot read {args.plot}: {err}", file=sys.stderr)
            return 2
        problem = plot_problem(result)
        if problem:
            print(f"pasa-bench: error: {args.plot} is not a pasa-bench bench.json ({problem})",
                  file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        return 0 if plot(result, out / "bench.png") else 1
    switches = {}
    for item in args.tuning:
        key, _, value = item.partition("=")
        choices = triton_tuning.CHOICES.get(key)
        if choices is None or value not in choices:
            known = "; ".join(f"{k}={'|'.join(v)}" for k, v in triton_tuning.CHOICES.items())
            print(f"pasa-bench: error: --tuning {item!r} is not one of: {known}",
                  file=sys.stderr)
            return 2
        switches[key] = value
    tuning = triton_tuning.DEFAULT_TUNING.replace(**switches)
    if not torch.cuda.is_available():
        print("pasa-bench: error: needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    with triton_tuning.using(tuning):
        return _run(args, tuning, out)


def _run(args, tuning, out: pathlib.Path) -> int:
    """Time every case with ``tuning`` active and write bench.json/.md/.png to ``out``."""
    import triton

    out.mkdir(parents=True, exist_ok=True)
    mask = pasa_npu.compressed_causal_mask("cuda")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "algorithms": args.algorithms,
              "tuning": {key: getattr(tuning, key) for key in triton_tuning.CHOICES},
              "decode_algorithms": [a for a in DECODE_ALGORITHMS if a in args.algorithms],
              "copy_gbs": copy_bandwidth_gbs(), "rows": [],
              "overflow_check": args.overflow_check,
              "paged_cache": None if args.paged == "none" else args.paged}
    launch_us = result["empty_launch_us"] = empty_launch_us()
    launch_text = "not recorded" if launch_us is None else f"{launch_us:.1f} µs of host time"
    print(f"{result['device']}: copy bandwidth {result['copy_gbs']:.0f} GB/s; an empty "
          f"kernel's launch {launch_text}; tuning {result['tuning']}", flush=True)
    seqs = args.seqs or ((1024, 4096) if args.quick else (1024, 4096, 16384))
    cases = [] if args.no_prefill else list(prefill_cases(dims=args.dims, seqs=seqs))
    if not (args.quick or args.no_decode):
        cases += list(decode_cases())
    if args.overflow_check == "compare":
        return _compare_check(args, cases, mask, result, out)
    result["rows"] = _pass(cases, args.algorithms, mask, result, args.overflow_check == "on")
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (out / "bench.md").write_text(text)
    print(text, flush=True)
    plot(result, out / "bench.png")
    return 0


def _pass(cases, algorithms, mask, result, overflow_check: bool, label: str = "") -> list:
    """One row per case, each case timed once."""
    rows = []
    for i, case in enumerate(cases):
        algos = algorithms if case["kind"] == "prefill" else result["decode_algorithms"]
        rows.append(run_case(case, algos, mask,
                             lambda text: print(f"[{label}{i + 1}/{len(cases)}] {text}",
                                                flush=True),
                             result["paged_cache"], overflow_check))
        # each case alone, as a model running that shape: the cell's plans, and the
        # workspaces they keep (within their budget), go before the next case
        pasa_npu.plans.clear()
        torch.cuda.empty_cache()
    return rows


def _compare_check(args, cases, mask, result, out: pathlib.Path) -> int:
    """``--overflow-check compare``: ``args.runs`` passes over ``cases`` per setting, the
    settings alternating which comes first, then :func:`check_comparison`."""
    runs = {"off": [], "on": []}
    for r in range(args.runs):
        for check in (("off", "on") if r % 2 == 0 else ("on", "off")):
            runs[check].append(_pass(cases, args.algorithms, mask, result, check == "on",
                                     f"run {r + 1}/{args.runs}, check {check}: "))
    result.update(runs=args.runs, off_runs=runs["off"], on_runs=runs["on"],
                  comparison=check_comparison(runs["off"], runs["on"]))
    (out / "check.json").write_text(json.dumps(result, indent=1))
    text = check_markdown(result)
    (out / "check.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
