"""``pasa-compare``'s reports as a reader sees them: the per-head plot's legend and NaN
marks, one verdict per table cell, the mask of an input file stated."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch

from pasa_npu.tools.compare import Item, build_candidates, compare
from pasa_npu.tools.compare import plots, report
from pasa_npu.tools.compare.evaluate import Comparison
from pasa_npu.tools.compare.cli import main

HEADS, S, D = 6, 32, 64
BIASED_HEADS = (0, 1, 2)   # unscaled QK^T near 1e5 there: fa-fp16s and fa-fp16 overflow


@pytest.fixture(scope="module")
def comparison():
    """Every allocation and SDPA on one item whose first heads overflow fp16 scores."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, HEADS, S, D, generator=gen) for _ in range(3))
    for t in (q, k):
        t[:, list(BIASED_HEADS)] += 40
    item = Item("biased heads", q.half(), k.half(), v.half(), D ** -0.5)
    cands, skipped = build_candidates(list(__import__("pasa_npu").ALGORITHM_NAMES), ["torch"],
                                      ["sdpa"])
    return compare([item], cands, skipped, baseline="sdpa")


def _inside(inner, outer) -> bool:
    return (inner.x0 >= outer.x0 - 0.5 and inner.x1 <= outer.x1 + 0.5
            and inner.y0 >= outer.y0 - 0.5 and inner.y1 <= outer.y1 + 0.5)


def test_head_plot_legend_shows_every_candidate_whole(comparison):
    plt = plots.pyplot_module()
    for width_items in (1, 2):   # one panel (narrow figure) and two side by side
        comp = comparison
        if width_items == 2:
            comp = Comparison(comparison.items * 2, comparison.candidates,
                                     comparison.skipped, comparison.baseline,
                                     comparison.records)
        fig = plots.head_figure(comp, plt)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        texts = [t.get_text() for t in legend.get_texts()]
        assert texts == comparison.labels
        for text in legend.get_texts():
            assert _inside(text.get_window_extent(renderer), fig.bbox), text.get_text()
        plt.close(fig)


def test_head_plot_nan_marks_do_not_overlap(comparison):
    """One mark per (head, overflowing candidate), in the band above every line, no two
    covering each other."""
    plt = plots.pyplot_module()
    fig = plots.head_figure(comparison, plt)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    marks = [line for line in ax.get_lines() if line.get_gid() == "nan-mark"]
    nan_candidates = {"fa-fp16s", "fa-fp16"}
    for name in nan_candidates:
        rec = comparison.record("biased heads", name)
        assert [h for h, p in enumerate(rec.heads["nonfinite_pct"]) if p] == list(BIASED_HEADS)
    assert len(marks) == len(BIASED_HEADS) * len(nan_candidates)
    boxes = [m.get_window_extent(renderer) for m in marks]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    lowest_mark = min(b.y0 for b in boxes)
    data = [line for line in ax.get_lines() if line.get_gid() is None]
    top_of_data = max(ax.transData.transform((0, y))[1] for line in data
                      for y in line.get_ydata())
    assert top_of_data < lowest_mark
    for b in boxes:
        assert _inside(b, ax.bbox)
    plt.close(fig)


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the grid that follows the line starting with ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading)) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_each_verdict_has_a_column_of_its_own(comparison):
    text = report.console(comparison, "title")
    single = _table(text, "Ascend single-benchmark")
    dual = _table(text, "Ascend dual-benchmark")
    labels = comparison.labels
    assert single[0] == ["item"] + labels and dual[0] == ["item"] + labels
    # "biased heads" is two words: the cells are the last len(labels) fields of a row
    assert {c for c in single[1][-len(labels):]} <= {"PASS", "FAIL"}
    assert {c for c in dual[1][-len(labels):]} <= {"L2", "L1", "L0", "FAIL", "-"}
    assert dual[1][-1] == "-"   # the baseline against itself
    assert dual[1][labels.index("fa-fp32") - len(labels)] in ("L2", "L1", "L0")


def test_summary_md_has_one_verdict_per_cell(comparison, tmp_path):
    path = report.write_markdown(comparison, str(tmp_path), "title", {}, [])
    md = open(path).read()
    start = md.index("## Ascend precision standards")
    section = md[start:md.index("\n## ", start)]
    rows = [line for line in section.splitlines() if line.startswith("| biased heads")]
    assert len(rows) == 2
    single, dual = ([c.strip() for c in row.strip("|").split("|")][1:] for row in rows)
    assert set(single) <= {"PASS", "FAIL"} and len(single) == len(comparison.labels)
    assert set(dual) <= {"L2", "L1", "L0", "FAIL", "-"} and len(dual) == len(comparison.labels)


def test_a_mask_from_the_file_is_stated(tmp_path, capsys):
    """An .npz with an atten_mask: the console's title and summary.md say so, with its shape
    and the share it masks; without one, they say "mask: none"."""
    gen = np.random.default_rng(0)
    q, k, v = (gen.standard_normal((1, 2, 16, 8)).astype(np.float16) for _ in range(3))
    mask = np.triu(np.ones((16, 16), bool), 1)   # causal: 120 of 256 pairs
    np.savez(tmp_path / "masked.npz", q=q, k=k, v=v, atten_mask=mask)
    np.savez(tmp_path / "plain.npz", q=q, k=k, v=v)
    for name, expected in (("masked", "mask: atten_mask (1, 16, 16) (True = masked), 46.9% of"),
                           ("plain", "mask: none")):
        out = tmp_path / name
        rc = main(["file", str(tmp_path / f"{name}.npz"), "--allocations", "fa-fp32",
                   "--third-party", "--no-plots", "--quiet", "--out", str(out)])
        assert rc == 0
        console = capsys.readouterr().out
        assert expected in console.splitlines()[0], console.splitlines()[0]
        summary = (out / "summary.md").read_text()
        assert expected in summary.splitlines()[0]
        assert f"mask = {expected[len('mask: '):]}" in summary


@pytest.fixture(scope="module")
def sweep_items():
    """Three of the sweep's kinds of item, small: zero-mean V (x0 = 0), where every candidate
    fails the single benchmark; x0 = 5, where they pass; resonance, named with '|'."""
    from pasa_npu.tools.compare import case_item
    from pasa_npu.tools.inputs import Case
    cases = (Case("uniform", 0, 0.5), Case("uniform", 5, 0.5), Case("resonance", 0, 3e4))
    items = [case_item(c, (1, 1, 128, 64)) for c in cases]
    cands, skipped = build_candidates(["fa-fp32", "pasa-exact", "fa-fp16s"], ["torch"], ["sdpa"])
    return compare(items, cands, skipped, baseline="sdpa")


def _md_tables(md: str) -> list[list[list[str]]]:
    """Every table of a Markdown text, as rows of cells split at unescaped '|'."""
    tables, rows = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_summary_md_tables_escape_pipes(sweep_items, tmp_path):
    """A '|' in a name or header ('resonance |S|~30000', 'max |QK^T|') is escaped: every
    row of every table, the score range's among them, has the header's cell count."""
    assert report.markdown_table(["a|b"], [["|S|"]]) == "| a\\|b |\n|---|\n| \\|S\\| |"
    md = open(report.write_markdown(sweep_items, str(tmp_path), "title", {}, [], sweep=True)).read()
    tables = _md_tables(md)
    assert len(tables) >= 5
    for rows in tables:
        assert all(len(r) == len(rows[0]) for r in rows), rows
        assert set(rows[1]) == {"---"}
    scores = next(t for t in tables if t[0][0] == "item" and "> fp16 max" in t[0])
    assert scores[0][3:5] == ["max \\|QK^T\\|", "max \\|scale*QK^T\\|"]
    assert [r[0] for r in scores[2:]][-1] == "resonance \\|S\\|~30000"
    table4 = next(t for t in tables if t[0][0] == "distribution")
    assert table4[-1][:3] == ["resonance", "-", "\\|S\\|~30000"]


def test_single_benchmark_failure_of_every_candidate_is_explained(sweep_items, tmp_path):
    """Where fa-fp32 and SDPA fail too, a note under the verdicts names the items and the
    criterion and says why."""
    note = report.single_note(sweep_items)
    assert note.startswith("Every candidate, fa-fp32 and sdpa included, fails the single "
                           "benchmark on 1 of 3 items: uniform x0=0 Am=0.5 (MARE)."), note
    assert "(|G| + 1e-7)" in note and "x0=5" not in note
    text = report.console(sweep_items, "title")
    verdicts = text[text.index("Ascend single-benchmark"):text.index("Ascend dual-benchmark")]
    assert verdicts.rstrip().endswith(note)
    md = open(report.write_markdown(sweep_items, str(tmp_path), "title", {}, [])).read()
    section = md[md.index("## Ascend precision standards"):md.index("The dual-benchmark")]
    assert section.rstrip().endswith(note)
    passing = Comparison(sweep_items.items[1:], sweep_items.candidates, sweep_items.skipped,
                         sweep_items.baseline, sweep_items.records)
    assert report.single_note(passing) is None
