"""pasa-beta: the optimal accuracy condition as a table (paper Table 3).

For each starting beta: the ideal invariance beta/(1-beta), the practical
invariance of the shifting matrix as stored, their relative error, then the
optimal beta and its invariances (equal by construction). A setting where the
condition has no solution in (0, 1) ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

import torch

from pasa_npu.beta import ideal_invariance, optimal_beta, practical_invariance

DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16}
PAPER_BETA0 = (0.9, 1 - 2 ** -4, 1 - 2 ** -5, 1 - 2 ** -6, 0.99, 0.999)


def table(n: int, dtype: torch.dtype, scale: float, starts=PAPER_BETA0) -> list[dict]:
    rows = []
    for beta0 in starts:
        best = optimal_beta(beta0, n, dtype, scale)
        rows.append({
            "beta0": beta0,
            "inv_ideal": ideal_invariance(beta0),
            "inv_practical": practical_invariance(beta0, n, dtype, scale),
            "beta": best,
            "inv_opt_ideal": ideal_invariance(best),
            "inv_opt_practical": practical_invariance(best, n, dtype, scale),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    head = (f"{'initial beta':>12} {'Inva':>9} {'Inva_r':>9} {'rel.err':>8}   "
            f"{'optimal beta':>12} {'Inva':>9} {'Inva_r':>9} {'rel.err':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        err0 = abs(r["inv_ideal"] - r["inv_practical"]) / r["inv_ideal"]
        err1 = abs(r["inv_opt_ideal"] - r["inv_opt_practical"]) / r["inv_opt_ideal"]
        lines.append(f"{r['beta0']:12.6f} {r['inv_ideal']:9.4g} {r['inv_practical']:9.4g} "
                     f"{err0:8.2%}   {r['beta']:12.6f} {r['inv_opt_ideal']:9.4g} "
                     f"{r['inv_opt_practical']:9.4g} {err1:8.2%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pasa-beta", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=128,
                        help="size of the shifting matrix = kv block size s2 (default 128)")
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES),
                        help="dtype the shifting matrix is stored in (default fp16)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="softmax scale folded into the matrix (default 1: the paper's table; "
                             "the kernels fold the call's scale)")
    parser.add_argument("--beta0", type=float, nargs="*", default=None,
                        help="starting betas, each in (0, 1) (default: the paper's "
                             f"{' '.join(f'{b:g}' for b in PAPER_BETA0)})")
    args = parser.parse_args(argv)
    try:
        rows = table(args.n, DTYPES[args.dtype], args.scale, args.beta0 or PAPER_BETA0)
    except ValueError as err:
        print(f"pasa-beta: error: {err}", file=sys.stderr)
        return 2
    print(f"optimal accuracy condition: n={args.n}, {args.dtype}, scale={args.scale:g}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
