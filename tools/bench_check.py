"""``pasa-bench --overflow-check compare``'s statistics and report: the overflow check's
timings against the spread between runs (:func:`check_comparison`), how many cells fall
outside against what chance alone gives (:func:`check_summary`), and ``check.md``."""
from __future__ import annotations

import math
import statistics

from pasa_npu.tools.bench_report import case_text, throughput_key


def check_comparison(off_runs: list, on_runs: list) -> list:
    """The overflow check against the spread between runs. ``off_runs`` and ``on_runs``:
    runs with the check off and on, each the rows of one pass over the same cases in the
    same order. For each case and candidate timed in every run: the unchecked runs'
    throughputs (``off``), the checked runs' (``on``), ``ratio`` = median on / median off,
    and ``within``: the checked median lies between the smallest and largest unchecked
    run. The SDPA peers run the same code both ways, so their rows show the spread of
    unchanged kernels."""
    rows = []
    for i, first in enumerate(off_runs[0]):
        key = throughput_key(first)
        names = [n for n, e in first.items() if isinstance(e, dict) and key in e]
        for name in names:
            cells = {}
            for check, runs in (("off", off_runs), ("on", on_runs)):
                cells[check] = [run[i].get(name, {}).get(key) for run in runs]
            if any(v is None for v in cells["off"] + cells["on"]):
                continue  # failed in some run: no spread to compare
            off_median, on_median = (statistics.median(cells[c]) for c in ("off", "on"))
            rows.append(dict(case=case_text(first), name=name, unit=key, **cells,
                             ratio=on_median / off_median,
                             within=min(cells["off"]) <= on_median <= max(cells["off"])))
    return rows


def chance_outside(runs: int) -> float:
    """The probability that a cell falls outside the spread (:func:`check_comparison`) when
    the check changes nothing: its ``runs`` checked and ``runs`` unchecked throughputs
    then come from one distribution, every order of the 2 ``runs`` values is equally
    likely, and the checked median (the middle run, ``runs`` odd) lies below the smallest
    unchecked run exactly where the (``runs`` + 1) / 2 smallest values are all checked
    runs; above the largest likewise."""
    if runs < 3 or runs % 2 == 0:
        raise ValueError(f"runs: an odd number of at least 3, so that the checked median "
                         f"is one run, got {runs}")
    first = (runs + 1) // 2
    return 2 * math.comb(2 * runs - first, runs) / math.comb(2 * runs, runs)


def check_summary(comparison: list, runs: int) -> list:
    """The cells outside the spread, counted for our candidates and for the SDPA peers
    (the control) against what chance alone gives (:func:`chance_outside`, the cells
    taken as independent): per group, ``cells``, ``outside``, ``expected`` outside,
    ``p_value`` = the chance of at least ``outside`` cells outside, ``consistent`` (that
    chance is 5% or more) and ``ratio`` (the geometric mean of checked / unchecked)."""
    p = chance_outside(runs)
    groups = []
    for group, peer in (("ours", False), ("SDPA peers", True)):
        rows = [row for row in comparison if row["name"].startswith("sdpa") == peer]
        if not rows:
            continue
        n, k = len(rows), sum(not row["within"] for row in rows)
        p_value = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))
        groups.append(dict(group=group, cells=n, outside=k, expected=n * p,
                           p_value=p_value, consistent=p_value >= 0.05,
                           ratio=math.exp(statistics.fmean(math.log(row["ratio"])
                                                           for row in rows))))
    return groups


def check_markdown(result) -> str:
    """:func:`check_comparison`'s rows as a Markdown table, after :func:`check_summary`."""
    def spread(values):
        return (f"{statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}]")
    units = {"tflops": "TFLOP/s", "gbs": "GB/s (graph)"}
    runs = result["runs"]
    lines = [f"Device: {result['device']}; torch {result['torch']}, triton {result['triton']}. "
             f"Overflow check off and on, {runs} runs each (each run times every "
             "case once; the runs alternate which setting comes first). Throughput: "
             "median [smallest, largest run]; within: the checked median lies in the "
             "unchecked runs' range, which a cell whose check costs nothing misses with "
             f"probability {chance_outside(runs):.1%}. The SDPA peers run the same code both "
             "ways.", ""]
    for group in check_summary(result["comparison"], runs):
        verdict = ("as many as chance gives" if group["consistent"]
                   else "more than chance gives")
        lines.append(f"- {group['group']}: {group['outside']} of {group['cells']} cells "
                     f"outside the spread, chance alone {group['expected']:.1f} "
                     f"(at least {group['outside']} with probability "
                     f"{group['p_value']:.0%}: {verdict}); checked / unchecked "
                     f"{group['ratio']:.4f} (geometric mean)")
    lines += ["", "| case | candidate | unit | unchecked | checked | checked / unchecked "
              "| within |", "|---|---|---|---|---|---|---|"]
    for row in result["comparison"]:
        lines.append(f"| {row['case']} | {row['name']} | {units[row['unit']]} | "
                     f"{spread(row['off'])} | {spread(row['on'])} | {row['ratio']:.3f} | "
                     f"{'yes' if row['within'] else 'no'} |")
    return "\n".join(lines) + "\n"
