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


def pyplot_module():
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


def _legend_below(fig, handles, labels) -> float:
    """The candidates' legend centred under the panels, in as many columns as fit the
    figure's width (at most 7), so that no entry is cut off. Returns the fraction of the
    figure's height it takes, for ``tight_layout``'s rect."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(labels), 7), 0, -1):
        legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9,
                            frameon=False)
        box = legend.get_window_extent(renderer)
        if box.width <= 0.98 * fig.bbox.width or ncol == 1:
            return box.height / fig.bbox.height + 0.01
        legend.remove()
    return 0.0


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
    plt = pyplot_module()
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
        bottom = _legend_below(fig, *axes[0][0].get_legend_handles_labels())
        fig.suptitle(f"Figure {fig_no} (paper): {kind} inputs, shape (B,N,S,D) = "
                     f"{tuple(shape)}; NaN outputs marked in text", fontsize=11)
        fig.tight_layout(rect=(0, bottom, 1, 1))
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
    plt = pyplot_module()
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
    plt = pyplot_module()
    styles = _styles(comp.labels)
    fig = head_figure(comp, plt, styles)
    path = os.path.join(folder, "rmse_by_head.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths = [path]
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


def head_figure(comp: Comparison, plt=None, styles=None):
    """The figure of ``rmse_by_head.png``: one panel per item (the first MAX_HEAD_PANELS),
    relative RMSE per head, NaN/Inf heads marked in a band at the top of the panel."""
    plt = plt or pyplot_module()
    styles = styles or _styles(comp.labels)
    shown = comp.items[:MAX_HEAD_PANELS]
    cols = min(len(shown), 2)
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.9 * rows), squeeze=False)
    marks = [_head_panel(ax, comp, it["name"], list(range(it["shape"][1])), styles)
             for ax, it in zip(axes.flat, shown)]
    for ax, it in zip(axes.flat, shown):
        ax.set_title(it["name"], fontsize=10)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles, labels = {}, []
    for ax in axes.flat:   # every candidate once, NaN-only ones included
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    bottom = _legend_below(fig, [handles[lab] for lab in labels], labels)
    more = len(comp.items) - len(shown)
    fig.suptitle("relative RMSE per head vs fp64 golden"
                 + (f" (first {len(shown)} items; {more} more in per_head.csv)" if more else ""),
                 fontsize=11)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    for ax, nan_heads in zip(axes.flat, marks):
        _nan_band(ax, nan_heads, styles)
    return fig


def _head_panel(ax, comp, name, heads, styles) -> dict:
    """Relative RMSE per head, one line per candidate; returns {head: [labels]} of the
    candidates with NaN/Inf outputs in that head, for :func:`_nan_band`."""
    nan_heads = {}
    for lab in comp.labels:
        rec = comp.record(name, lab)
        if rec is None or rec.status != "ok":
            continue
        ys = rec.heads["rel_rmse"]
        pts = [(h, y) for h, y in zip(heads, ys) if math.isfinite(y)]
        for h, pct in zip(heads, rec.heads["nonfinite_pct"]):
            if pct:
                nan_heads.setdefault(h, []).append(lab)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=lab, linewidth=1.4, markersize=4,
                **styles[lab])
    ax.set_yscale("log")
    ax.set_xlabel("head")
    ax.set_ylabel("relative RMSE")
    ax.set_xticks(heads if len(heads) <= 16 else heads[::max(1, len(heads) // 16)])
    ax.margins(x=0.04)
    ax.grid(True, alpha=0.3)
    return nan_heads


#: spacing of the stacked NaN marks and their size, in points
NAN_STEP_PT = 8.0
NAN_MARKER_PT = 5.0


def _nan_band(ax, nan_heads: dict, styles) -> None:
    """Marks a head whose outputs hold NaN/Inf with the candidate's marker in a band at the
    top of the panel, labelled "NaN" beside the axis, the marks of one head stacked so that
    none covers another. Raises the panel's top so that no line enters the band. Call after
    the layout is final: the band's height is set in points."""
    if not nan_heads:
        return
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory
    fig = ax.figure
    depth = max(len(labs) for labs in nan_heads.values())
    band_pt = NAN_STEP_PT * depth + NAN_MARKER_PT + 2
    height_pt = ax.get_window_extent().height * 72.0 / fig.dpi
    band = min(band_pt / height_pt, 0.6)
    low, high = ax.get_ylim()
    ax.set_yticks([t for t in ax.get_yticks() if low <= t <= high])  # no tick label in the band
    ax.set_ylim(low, high * (high / low) ** (band / (1.0 - band)))
    top = blended_transform_factory(ax.transData, ax.transAxes)
    for head, labs in nan_heads.items():
        for j, lab in enumerate(labs):
            shift = ScaledTranslation(0, -(NAN_MARKER_PT / 2 + 2 + NAN_STEP_PT * j) / 72.0,
                                      fig.dpi_scale_trans)
            ax.plot([head], [1.0], transform=top + shift, linestyle="none", clip_on=False,
                    marker=styles[lab]["marker"], color=styles[lab]["color"],
                    markersize=NAN_MARKER_PT, gid="nan-mark")
    ax.plot([0, 1], [1.0 - band] * 2, transform=ax.transAxes, color="0.6", linewidth=0.6,
            linestyle=":", gid="nan-band")
    ax.annotate("NaN", xy=(0, 1.0 - band / 2), xycoords="axes fraction", xytext=(-4, 0),
                textcoords="offset points", ha="right", va="center", fontsize=8, color="0.25")
