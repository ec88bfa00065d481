"""``pasa-sweep``: the paper's overflow sweeps on CPU, every allocation against fp64.

Runs the uniform and hybrid cases of the paper (DESIGN.md §4) and the resonance
case of §2.4, and prints one row per case: relative RMSE per allocation, or the
percentage of NaN/Inf outputs where the allocation overflowed. The default
shape is (1, 4, 1280, 128), the paper's with 4 heads instead of 16, so that it
finishes in about a minute on two cores; ``--heads 16`` gives the paper's.
"""
from __future__ import annotations

import argparse
import sys
import time

import pasa_npu
from pasa_npu.tools.inputs import Case, paper_cases
from pasa_npu.tools.metrics import nonfinite_percent, relative_rmse


def run_sweep(shape, algorithms, seed=0, progress=None, beta=None) -> list[dict]:
    cases = paper_cases(unique=True) + [Case("resonance", 0, 3e4),
                                                   Case("resonance", 0, 1e5)]
    kw = dict(num_heads=shape[1], input_layout="BNSD", scale=shape[3] ** -0.5)
    rows = []
    for i, case in enumerate(cases):
        q, k, v = case.make(shape, seed=seed)
        gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
        row = {"case": case.label}
        for name in algorithms:
            shifted = pasa_npu.ALLOCATIONS[name].shift == "pseudo_average"
            out, _ = pasa_npu.fused_attention(q, k, v, algorithm=name,
                                              beta=beta if shifted else None, **kw)
            bad = nonfinite_percent(out)
            row[name] = {"nonfinite_pct": bad, "rel_rmse": None if bad else relative_rmse(out, gold)}
        rows.append(row)
        if progress:
            progress(i + 1, len(cases), case.label)
    return rows


def format_rows(rows, algorithms) -> str:
    width = max(len(r["case"]) for r in rows)
    lines = [f"{'case':<{width}} " + " ".join(f"{a:>11}" for a in algorithms)]
    for r in rows:
        cells = []
        for a in algorithms:
            m = r[a]
            cells.append(f"{'NaN ' + format(m['nonfinite_pct'], '.2f') + '%':>11}"
                         if m["nonfinite_pct"] else f"{m['rel_rmse']:11.2e}")
        lines.append(f"{r['case']:<{width}} " + " ".join(cells))
    return "\n".join(lines)


def _progress(done, total, label):
    bar = "#" * (20 * done // total)
    print(f"\r[{bar:<20}] {done}/{total} {label:<28}", end="" if done < total else "\n",
          file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pasa-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4, help="heads N (paper: 16; default 4)")
    parser.add_argument("--seq", type=int, default=1280, help="sequence length S (default 1280)")
    parser.add_argument("--dim", type=int, default=128, help="head dim D (default 128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=list(pasa_npu.ALGORITHM_NAMES),
                        choices=pasa_npu.ALGORITHM_NAMES)
    parser.add_argument("--beta0", type=float, default=None,
                        help="start of the optimal-beta iteration for pasa and pasa-mixed "
                             "(default: the package's, 1 - 2**-6)")
    args = parser.parse_args(argv)
    for name in ("heads", "seq", "dim"):
        if getattr(args, name) < 1:
            print(f"pasa-sweep: error: --{name} must be >= 1", file=sys.stderr)
            return 2
    shape = (1, args.heads, args.seq, args.dim)
    beta = None
    if args.beta0 is not None:
        try:
            beta = pasa_npu.optimal_beta(args.beta0, pasa_npu.DEFAULT_TILING.kv_block,
                                         scale=args.dim ** -0.5)
        except ValueError as err:
            print(f"pasa-sweep: error: --beta0: {err}", file=sys.stderr)
            return 2
    print(f"paper sweeps at shape (B, N, S, D) = {shape}, fp16 inputs, scale 1/sqrt(D); "
          f"relative RMSE vs fp64, or % NaN/Inf outputs"
          + ("" if beta is None else f"; pasa beta = {beta:.6f}"))
    start = time.time()
    rows = run_sweep(shape, args.algorithms, args.seed, _progress, beta)
    print(format_rows(rows, args.algorithms))
    print(f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
