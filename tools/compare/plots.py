"""PNG plots of a comparison (matplotlib, Agg backend).

Sweeps: the paper's Figures 9 (uniform) and 10 (hybrid): relative RMSE against
the mean x0 (left) and the amplitude Am (right), one line per candidate, log y,
and a NaN output drawn as a text mark at the top of the panel, as the paper
does; Table 4 as a table image. Other runs: relative RMSE per head of each item
and, with several items (layers), per item.
"""
from __future__ import annotations

import math
import os

from pasa_npu.tools.inputs import paper_cases

from .errors import CompareError
from .evaluate import Comparison
from .report import table4_rows

MAX_HEAD_PANELS = 8


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise CompareError("plots need matplotlib (pip install 'pasa-npu[compare]'); or pass "
                           "--no-plots") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _styles(labels):
    import matplotlib
    colors = matplotlib.colormaps["tab10"].colors
    third = ("sdpa", "npu-ip0", "npu-ip1")
    return {lab: dict(color=colors[i % 10], marker="os^Dv<>ph*"[i % 10],
                      linestyle="--" if lab in third else "-") for i, lab in enumerate(labels)}


def _panel(ax, comp: Comparison, xs, names, xlabel, styles):
    """One panel: a line per candidate over items ``names`` at positions ``xs``."""
    nan_marks = {}   # x -> list of (label, pct)
    finite = []
    for lab in comp.labels:
        px, py = [], []
        for x, name in zip(xs, names):
            rec = comp.record(name, lab)
            if rec is None or rec.status != "ok":
                continue
            if rec.metrics["nonfinite_pct"]:
                nan_marks.setdefault(x, []).append((lab, rec.metrics["nonfinite_pct"]))
                continue
            px.append(x)
            py.append(rec.metrics["rel_rmse"])
        finite += py
        ax.plot(px, py, label=lab, linewidth=1.6, markersize=5, **styles[lab])
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("relative RMSE vs fp64")
    ax.set_xticks(list(xs))
    ax.margins(x=0.1)
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    if finite:
        lo, hi = min(v for v in finite if v > 0), max(finite)
        ax.set_ylim(lo / 2, hi * 30)   # head room for the NaN marks
    for x, marks in nan_marks.items():
        for j, (lab, pct) in enumerate(marks):
            ax.annotate(f"NaN {pct:.3g}%", xy=(x, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(0, -12 - 11 * j), textcoords="offset points", ha="center",
                        fontsize=7.5, color=styles[lab]["color"], fontweight="bold")


def sweep_figures(comp: Comparison, folder: str, shape) -> list[str]:
    plt = _pyplot()
    styles = _styles(comp.labels)
    names = {(it["meta"].get("kind"), it["meta"].get("x0"), it["meta"].get("amplitude")): it["name"]
             for it in comp.items}
    paths = []
    for fig_no, kind in ((9, "uniform"), (10, "hybrid")):
        panels = []
        for sweep, axis, xlabel in ((f"{kind}-mean", "x0", "mean x0"),
                                    (f"{kind}-amplitude", "amplitude", "amplitude Am")):
            cases = [c for c in paper_cases() if c.sweep == sweep
                     and (c.kind, c.x0, c.amplitude) in names]
            if len(cases) >= 2:
                fixed = (f"Am = {cases[0].amplitude:g}" if axis == "x0"
                         else f"x0 = {cases[0].x0:g}")
                panels.append((cases, axis, xlabel, fixed))
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
        for ax, (cases, axis, xlabel, fixed) in zip(axes[0], panels):
            xs = [getattr(c, axis) for c in cases]
            item_names = [names[(c.kind, c.x0, c.amplitude)] for c in cases]
            _panel(ax, comp, xs, item_names, xlabel, styles)
            ax.set_title(f"{kind}, {fixed}")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9,
                   frameon=False)
        fig.suptitle(f"Figure {fig_no} (paper): {kind} inputs, shape (B,N,S,D) = "
                     f"{tuple(shape)}; NaN outputs marked in text", fontsize=11)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        path = os.path.join(folder, f"fig{fig_no}_{kind}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    header, rows = table4_rows(comp)
    if rows:
        paths.append(_table_image(header, rows, os.path.join(folder, "table4_nan.png"),
                                  "Table 4: NaN/Inf % of the outputs at shape "
                                  f"{tuple(shape)} (column 'paper': its FA16-FP32, i.e. "
                                  "fa-fp16s, at (1, 16, 1280, 128))"))
    return paths


def _table_image(header, rows, path, title) -> str:
    plt = _pyplot()
    width = max(6.0, 1.05 * len(header))
    fig, ax = plt.subplots(figsize=(width, 0.5 + 0.32 * (len(rows) + 1)))
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8.5)
    table.scale(1, 1.25)
    for (r, c), cell in table.get_celld().items():
        text = cell.get_text().get_text()
        if r == 0:
            cell.set_facecolor("#dde4ee")
            cell.get_text().set_fontweight("bold")
        elif text.endswith("%") and text not in ("0.00%",) and c >= 3:
            cell.set_facecolor("#f7d4d4")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def item_figures(comp: Comparison, folder: str) -> list[str]:
    """Per-head panels (at most MAX_HEAD_PANELS items) and, with several items, a per-item plot."""
    plt = _pyplot()
    styles = _styles(comp.labels)
    paths = []
    shown = comp.items[:MAX_HEAD_PANELS]
    cols = min(len(shown), 2)
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.9 * rows), squeeze=False)
    for ax, it in zip(axes.flat, shown):
        heads = list(range(it["shape"][1]))
        _head_panel(ax, comp, it["name"], heads, styles)
        ax.set_title(it["name"], fontsize=10)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9,
               frameon=False)
    more = len(comp.items) - len(shown)
    fig.suptitle("relative RMSE per head vs fp64 golden"
                 + (f" (first {len(shown)} items; {more} more in per_head.csv)" if more else ""),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.07 + 0.03 / rows, 1, 1))
    path = os.path.join(folder, "rmse_by_head.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    if len(comp.items) > 1:
        fig, ax = plt.subplots(figsize=(max(6.5, 0.6 * len(comp.items) + 3), 4.6))
        xs = list(range(len(comp.items)))
        _panel(ax, comp, xs, [it["name"] for it in comp.items], "", styles)
        ax.set_xticks(xs, [it["name"] for it in comp.items], rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8, ncol=2)
        ax.set_title("relative RMSE per item vs fp64 golden")
        fig.tight_layout()
        path = os.path.join(folder, "rmse_by_item.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _head_panel(ax, comp, name, heads, styles):
    for lab in comp.labels:
        rec = comp.record(name, lab)
        if rec is None or rec.status != "ok":
            continue
        ys = rec.heads["rel_rmse"]
        pts = [(h, y) for h, y in zip(heads, ys) if math.isfinite(y)]
        bad = [h for h, p in zip(heads, rec.heads["nonfinite_pct"]) if p]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=lab, linewidth=1.4, markersize=4,
                **styles[lab])
        for h in bad:
            ax.annotate("NaN", xy=(h, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -10),
                        textcoords="offset points", ha="center", fontsize=7,
                        color=styles[lab]["color"])
    ax.set_yscale("log")
    ax.set_xlabel("head")
    ax.set_ylabel("relative RMSE")
    ax.set_xticks(heads if len(heads) <= 16 else heads[::max(1, len(heads) // 16)])
    ax.grid(True, alpha=0.3)
