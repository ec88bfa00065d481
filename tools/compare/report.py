"""Reports of a :class:`~.evaluate.Comparison`: console tables, CSV, JSON, Markdown.

Files the ``write_*`` functions put into the output folder:

* ``results.csv``: one row per (item, candidate): every metric, the verdicts,
  the item's QK^T range;
* ``per_head.csv``: the same metrics per head;
* ``results.json``: all of it plus the run's settings (NaN/Inf stored as null);
* ``summary.md``: the tables below and the plots.
"""
from __future__ import annotations

import csv
import json
import math
import os
from typing import Optional

from .evaluate import Comparison, Record
from .inputs import PAPER_TABLE4

METRICS = ("rel_rmse", "max_abs", "cosine", "rel_l1", "bias", "nonfinite_pct", "rmse", "mere",
           "mare")


# --------------------------------------------------------------------------- cells


def rmse_cell(rec: Optional[Record]) -> str:
    """Relative RMSE, or the share of NaN/Inf outputs, or why there is no number."""
    if rec is None:
        return "-"
    if rec.status != "ok":
        return "error"
    bad = rec.metrics["nonfinite_pct"]
    if bad:
        return f"NaN {bad:.2f}%"
    return f"{rec.metrics['rel_rmse']:.2e}"


def single_cell(rec: Optional[Record]) -> str:
    """The single-benchmark verdict, PASS or FAIL ("-": no record, "error": it failed)."""
    if rec is None or rec.status != "ok":
        return "-" if rec is None else "error"
    return rec.single.label


def dual_cell(rec: Optional[Record]) -> str:
    """The dual-benchmark level, L2, L1, L0 or FAIL ("-": the baseline itself or no
    record, "n/a": the baseline's output is not finite, "error": it failed)."""
    if rec is None or rec.status != "ok":
        return "-" if rec is None else "error"
    return rec.dual.label if rec.dual else "-"


def grid(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header)] + [line(r) for r in rows])


def markdown_cell(value) -> str:
    """``value`` as one Markdown table cell: ``|`` escaped, line breaks as spaces."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table; every cell goes through :func:`markdown_cell`."""
    def line(cells):
        return "| " + " | ".join(markdown_cell(c) for c in cells) + " |"
    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def rmse_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["item"] + comp.labels
    rows = [[it["name"]] + [rmse_cell(comp.record(it["name"], c)) for c in comp.labels]
            for it in comp.items]
    return header, rows


def verdict_rows(comp: Comparison, cell) -> tuple[list[str], list[list[str]]]:
    """Items by candidates, one verdict per cell: ``cell`` is :func:`single_cell` or
    :func:`dual_cell`."""
    header = ["item"] + comp.labels
    rows = [[it["name"]] + [cell(comp.record(it["name"], c)) for c in comp.labels]
            for it in comp.items]
    return header, rows


SINGLE_TEXT = ("single-benchmark verdict against the fp64 golden: PASS when MERE < 2^-10 and "
               "MARE < 10*2^-10 (bf16: 2^-7 and 10*2^-7), else FAIL")


def single_note(comp: Comparison) -> Optional[str]:
    """Why the single-benchmark verdict fails every candidate on some items: the items, the
    criteria every candidate fails there, and on how many of them the fp64 golden rounded to
    the item's dtype fails MARE too; None where no item fails every candidate."""
    failing = []
    for it in comp.items:
        verdicts = [r.single for r in (comp.record(it["name"], c) for c in comp.labels)
                    if r is not None and r.status == "ok" and r.single is not None]
        if not verdicts or any(v.passed for v in verdicts):
            continue
        criteria = []
        if all(not v.mere < v.mere_limit for v in verdicts):
            criteria.append("MERE")
        if all(not v.mare < v.mare_limit for v in verdicts):
            criteria.append("MARE")
        rounded = it.get("golden_rounded")
        failing.append((it["name"], " and ".join(criteria) or "MERE or MARE",
                        rounded is not None and not rounded["mare"] < verdicts[0].mare_limit))
    if not failing:
        return None
    cand = {c.label: c for c in comp.candidates}
    ref = [c for c in comp.labels if cand[c].third_party or cand[c].allocation == "fa-fp32"]
    included = f", {' and '.join(ref)} included," if ref else ""
    listed = "; ".join(f"{name} ({criteria})" for name, criteria, _ in failing)
    rounded_fails = sum(r for _, _, r in failing)
    return (f"Every candidate{included} fails the single benchmark on {len(failing)} of "
            f"{len(comp.items)} items: {listed}. MERE and MARE are the mean and the largest "
            f"|O - G| / (|G| + 1e-7): where outputs are near zero (sums of V values of both "
            f"signs) or hinge on scores of 1e4 and more, whose fp32 rounding moves the softmax "
            f"weights, an error small against the values summed is large against |G|"
            + (f"; even the fp64 golden rounded to the inputs' dtype fails MARE on "
               f"{rounded_fails} of these items" if rounded_fails else "")
            + ". There the verdict reflects the inputs more than the implementation: compare "
            "by relative RMSE or the dual-benchmark level.")


DUAL_TEXT = ("dual-benchmark level against {baseline}: the MARE/MERE/RMSE ratios within "
             "2/1.2/1.2 L2, 5/1.5/1.5 L1, 10/2/2 L0, else FAIL")


def score_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["item", "shape (B,N,S1,D)", "dtype", "max |QK^T|", "max |scale*QK^T|", "> fp16 max"]
    rows = [[it["name"], "x".join(map(str, it["shape"])), it["dtype"],
             f"{it['scores']['max_abs_qk']:.3g}", f"{it['scores']['max_abs_scaled']:.3g}",
             "yes" if it["scores"]["exceeds_fp16"] else "no"] for it in comp.items]
    return header, rows


def table4_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The paper's Table 4 next to the NaN % of every candidate; other items where
    some candidate returned NaN/Inf follow, marked as not in the paper's table."""
    header = ["distribution", "x0", "Am", "paper"] + comp.labels
    rows, seen = [], set()
    by_key = {(it["meta"].get("kind"), it["meta"].get("x0"), it["meta"].get("amplitude")): it
              for it in comp.items}
    def nan_cells(name):
        cells = []
        for c in comp.labels:
            rec = comp.record(name, c)
            cells.append("-" if rec is None or rec.status != "ok"
                         else f"{rec.metrics['nonfinite_pct']:.2f}%")
        return cells
    for (kind, x0, am), paper in PAPER_TABLE4.items():
        it = by_key.get((kind, x0, am))
        if it is None:
            continue
        seen.add(it["name"])
        rows.append([kind, f"{x0:g}", f"{am:g}", f"{paper:g}%"] + nan_cells(it["name"]))
    for it in comp.items:
        if it["name"] in seen:
            continue
        recs = [comp.record(it["name"], c) for c in comp.labels]
        if any(r and r.status == "ok" and r.metrics["nonfinite_pct"] for r in recs):
            m = it["meta"]
            if m.get("kind") == "resonance":
                cells = ["resonance", "-", f"|S|~{m['amplitude']:g}"]
            elif "kind" in m:
                cells = [m["kind"], f"{m['x0']:g}", f"{m['amplitude']:g}"]
            else:
                cells = [it["name"], "-", "-"]
            rows.append(cells + ["not in table"] + nan_cells(it["name"]))
    return header, rows


REPAIR_TEXT = ("query rows the overflow check recomputed by fa-fp32 because their fp16 scores "
               "or statistics were not finite or their shifted scores or recovered block "
               "offsets reached the resolution limit (in brackets: their share of the item's "
               "rows)")


def repair_rows(comp: Comparison) -> Optional[tuple[list[str], list[list[str]]]]:
    """Items by checked candidates: rows recomputed by fa-fp32, for the items where some
    candidate recomputed any; None where none did."""
    labels = [c for c in comp.labels
              if any(r.repaired_rows is not None for r in comp.records if r.candidate == c)]
    rows = []
    for it in comp.items:
        recs = [comp.record(it["name"], c) for c in labels]
        if not any(r is not None and r.repaired_rows for r in recs):
            continue
        total = it["shape"][0] * it["shape"][1] * it["shape"][2]
        rows.append([it["name"]] + [
            "-" if r is None or r.repaired_rows is None
            else f"{r.repaired_rows} ({100 * r.repaired_rows / total:.2f}%)" for r in recs])
    return (["item"] + labels, rows) if rows else None


# --------------------------------------------------------------------------- text


def console(comp: Comparison, title: str, sweep: bool = False) -> str:
    parts = [title, "", "relative RMSE vs fp64 golden (NaN x%: share of NaN/Inf outputs)",
             grid(*rmse_rows(comp)), "", "Ascend " + SINGLE_TEXT,
             grid(*verdict_rows(comp, single_cell)), ""]
    note = single_note(comp)
    if note:
        parts += [note, ""]
    if comp.baseline:
        parts += ["Ascend " + DUAL_TEXT.format(baseline=comp.baseline),
                  grid(*verdict_rows(comp, dual_cell))]
    else:
        parts += ["Ascend dual-benchmark level: no third-party candidate ran"]
    if sweep:
        parts += ["", "Table 4: NaN/Inf % of the outputs (column 'paper': its FA16-FP32, our "
                  "fa-fp16s, at "
                  "(1, 16, 1280, 128))",
                  grid(*table4_rows(comp))]
    repaired = repair_rows(comp)
    if repaired:
        parts += ["", "Overflow repair: " + REPAIR_TEXT, grid(*repaired)]
    over = [it["name"] for it in comp.items if it["scores"]["exceeds_fp16"]]
    parts += ["", f"items whose unscaled QK^T exceeds the fp16 range (65504): "
                  f"{', '.join(over) if over else 'none'}"]
    for label, reason in comp.skipped.items():
        parts.append(f"skipped {label}: {reason}")
    return "\n".join(parts)


def _clean(x):
    """JSON-safe copy: NaN/Inf -> None, tuples -> lists, dataclass verdicts -> dicts."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return _clean({k: getattr(x, k) for k in x.__dataclass_fields__})
    return x


def write_csv(comp: Comparison, folder: str) -> list[str]:
    cand = {c.label: c for c in comp.candidates}
    items = {it["name"]: it for it in comp.items}
    path = os.path.join(folder, "results.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["item", "candidate", "allocation", "backend", "status", "reason", *METRICS,
                    "single_verdict", "dual_verdict", "dual_baseline", "mare_ratio", "mere_ratio",
                    "rmse_ratio", "max_abs_qk", "qk_exceeds_fp16", "seconds"])
        for r in comp.records:
            c = cand[r.candidate]
            m = [r.metrics.get(k, "") for k in METRICS]
            dual = r.dual.ratios if r.dual else ("", "", "")
            w.writerow([r.item, r.candidate, c.allocation or "", c.backend or "", r.status,
                        r.reason, *m, r.single.label if r.single else "",
                        r.dual.label if r.dual else "", comp.baseline or "", *dual,
                        items[r.item]["scores"]["max_abs_qk"],
                        items[r.item]["scores"]["exceeds_fp16"], f"{r.seconds:.3f}"])
    head_path = os.path.join(folder, "per_head.csv")
    with open(head_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["item", "candidate", "head", *METRICS, "max_abs_qk"])
        for r in comp.records:
            if r.status != "ok":
                continue
            qk = items[r.item]["scores"]["max_abs_qk_per_head"]
            for h in range(len(r.heads["rel_rmse"])):
                w.writerow([r.item, r.candidate, h, *(r.heads[k][h] for k in METRICS), qk[h]])
    return [path, head_path]


def write_json(comp: Comparison, folder: str, settings: dict) -> str:
    path = os.path.join(folder, "results.json")
    doc = {"settings": settings, "baseline": comp.baseline, "skipped": comp.skipped,
           "candidates": [{"label": c.label, "allocation": c.allocation, "backend": c.backend,
                           "device": c.device} for c in comp.candidates],
           "items": comp.items, "records": comp.records,
           "note": "null stands for NaN or Inf"}
    with open(path, "w") as f:
        json.dump(_clean(doc), f, indent=1)
    return path


def write_markdown(comp: Comparison, folder: str, title: str, settings: dict, plots: list[str],
                   sweep: bool = False) -> str:
    lines = [f"# {title}", "", "Settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()),
             "", "## Relative RMSE vs the fp64 golden", "",
             "`NaN x%`: that share of the outputs is NaN/Inf.", "",
             markdown_table(*rmse_rows(comp)),
             "", "## Ascend precision standards", "",
             f"The {SINGLE_TEXT}.", "", markdown_table(*verdict_rows(comp, single_cell)), ""]
    note = single_note(comp)
    if note:
        lines += [note, ""]
    if comp.baseline:
        lines += [f"The {DUAL_TEXT.format(baseline=f'`{comp.baseline}`')}.", "",
                  markdown_table(*verdict_rows(comp, dual_cell))]
    else:
        lines += ["Dual-benchmark level: no third-party candidate ran."]
    if sweep:
        lines += ["", "## Table 4: NaN/Inf percentages", "",
                  "Column `paper`: the paper's FA16-FP32 (our `fa-fp16s`) at (1, 16, 1280, 128); "
                  "the other columns: this run, at the shape in the settings.", "",
                  markdown_table(*table4_rows(comp))]
    repaired = repair_rows(comp)
    lines += ["", "## Overflow repair", ""]
    lines += ([f"The {REPAIR_TEXT}.", "", markdown_table(*repaired)] if repaired
              else ["No candidate's overflow check recomputed a row."])
    lines += ["", "## Score range", "", markdown_table(*score_rows(comp))]
    if comp.skipped:
        lines += ["", "## Skipped candidates", ""]
        lines += [f"- `{k}`: {v}" for k, v in comp.skipped.items()]
    errors = [r for r in comp.records if r.status != "ok"]
    if errors:
        lines += ["", "## Errors", ""] + [f"- `{r.candidate}` on {r.item}: {r.reason}"
                                          for r in errors]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})"
                                         for p in plots]
    path = os.path.join(folder, "summary.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
