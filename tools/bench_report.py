"""``pasa-bench``'s report of a run: the Markdown tables (prefill, decode, host time, and
:mod:`bench_paged`'s paged table), the progress line of a case and the plot. Reads a result
dict (``bench.json``) only: no GPU needed. Also the check of ``--plot FILE`` before any
work."""
from __future__ import annotations

import math
import sys

from pasa_npu.tools import bench_paged


#: the keys :func:`plot` reads: of the result, and of a row of each kind
PLOT_KEYS = ("device", "algorithms", "decode_algorithms", "copy_gbs", "rows")
ROW_KEYS = {"prefill": ("d", "s", "causal"), "decode": ("d", "s", "ratio", "b")}


def plot_problem(result) -> str | None:
    """None where :func:`plot` can draw ``result`` (a loaded ``bench.json``), else what it
    lacks, naming the pasa-bench output it is where it is another one."""
    if isinstance(result, list) and result and all(
            isinstance(r, dict) and "form" in r for r in result):
        return "it is pasa-bench --host's host.json, which has no plot; its table is host.md"
    if not isinstance(result, dict):
        return f"it holds a JSON {'array' if isinstance(result, list) else 'value'}, " \
               f"not an object"
    rows = result.get("rows")
    if "gpus" in result and isinstance(rows, list) and all(
            isinstance(r, dict) and "engine" in r for r in rows):
        return ("it is pasa-bench --distributed's distributed.json, which has no plot; its "
                "table is distributed.md")
    if "comparison" in result:
        return ("it is --overflow-check compare's check.json, which has no plot; its tables "
                "are check.md")
    missing = [key for key in PLOT_KEYS if key not in result]
    if missing:
        return "no " + ", ".join(repr(key) for key in missing)
    if not isinstance(rows, list) or not rows:
        return "no prefill or decode rows"
    for i, row in enumerate(rows):
        keys = ROW_KEYS.get(row.get("kind")) if isinstance(row, dict) else None
        if keys is None:
            return f"row {i} is not a prefill or decode row"
        if any(key not in row for key in keys):
            return f"row {i} ({row['kind']}) lacks one of {', '.join(keys)}"
    return None


def _ratio(row, a, b, key="tflops"):
    if key in row.get(a, {}) and key in row.get(b, {}):
        return row[a][key] / row[b][key]
    return None


def throughput_key(row) -> str:
    """The throughput pasa-bench reports for a row: prefill TFLOP/s (called eagerly),
    decode GB/s (replayed from a CUDA graph)."""
    return "tflops" if row["kind"] == "prefill" else "gbs"


def mask_text(row) -> str:
    """A prefill row's mask as every table and progress line names it."""
    return "causal" if row["causal"] else "none"


def row_text(row, algorithms) -> str:
    if row["kind"] == "prefill":
        head = f"d={row['d']:<4} S={row['s']:<6} {mask_text(row):<6}"
    else:
        head = f"decode d={row['d']} S2={row['s']} GQA {row['ratio']}:1"
    cells = []
    unit = throughput_key(row)
    names = list(algorithms) + ["sdpa-flash", "sdpa-cudnn"]
    names += [n for n in row if isinstance(n, str) and n.endswith(" paged")]
    for name in names:
        e = row.get(name, {})
        cells.append(f"{name}={e[unit]:.0f}" if unit in e else f"{name}=ERR")
    errors = {row[n]["error"] for n in names if "error" in row.get(n, {})}
    return head + "  " + " ".join(cells) + "".join(f"\n    error: {e}" for e in errors)


def markdown(result) -> str:
    """The run as Markdown: a prefill table and a decode table, each only where the run
    has rows of that kind."""
    algos = result["algorithms"]
    lines = [f"Device: {result['device']}; torch {result['torch']}, triton {result['triton']}; "
             f"copy bandwidth {result['copy_gbs']:.0f} GB/s (read + write); overflow check "
             f"{result.get('overflow_check', 'on')}."]
    prefill = [row for row in result["rows"] if row["kind"] == "prefill"]
    decode = [row for row in result["rows"] if row["kind"] == "decode"]
    if prefill:
        lines += ["", "Prefill, fp16, TFLOP/s (ratio to SDPA-flash / SDPA-cuDNN):", "",
                  "| d | S | mask | " + " | ".join(algos) + " | sdpa-flash | sdpa-cudnn |",
                  "|" + "---|" * (len(algos) + 5)]
    for row in prefill:
        cells = []
        for name in algos:
            e = row.get(name, {})
            if "tflops" not in e:
                cells.append("error")
                continue
            rf, rc = _ratio(row, name, "sdpa-flash"), _ratio(row, name, "sdpa-cudnn")
            cells.append(f"{e['tflops']:.0f} ({rf:.2f} / {rc:.2f})" if rf and rc else
                         f"{e['tflops']:.0f}")
        peers = [f"{row[n]['tflops']:.0f}" if "tflops" in row.get(n, {}) else "error"
                 for n in ("sdpa-flash", "sdpa-cudnn")]
        lines.append(f"| {row['d']} | {row['s']} | {mask_text(row)} | "
                     + " | ".join(cells + peers) + " |")
    if decode:
        lines += ["", "Decode (query length 1), fp16, d=128, 32 query heads, batch 8: GB/s of "
                  "K+V read (share of copy bandwidth), replayed from a CUDA graph; in brackets "
                  "after it, called eagerly (host time included):", "",
                  "| S2 | GQA | " + " | ".join(result["decode_algorithms"])
                  + " | sdpa-flash | sdpa-cudnn |",
                  "|" + "---|" * (len(result["decode_algorithms"]) + 4)]
    for row in decode:
        cells = []
        for name in list(result["decode_algorithms"]) + ["sdpa-flash", "sdpa-cudnn"]:
            e = row.get(name, {})
            bw = result["copy_gbs"]
            eager = (f" [{e['eager_gbs']:.0f} ({e['eager_gbs'] / bw:.0%})]" if "eager_gbs" in e
                     else "")
            cells.append(f"{e['gbs']:.0f} ({e['gbs'] / bw:.0%}){eager}" if "gbs" in e
                         else "error" + eager)
        lines.append(f"| {row['s']} | {row['ratio']}:1 | " + " | ".join(cells) + " |")
    lines += _decode_against_cudnn(result, decode)
    lines += _host_markdown(result)
    lines += bench_paged.markdown(result)
    return "\n".join(lines) + "\n"


def _decode_against_cudnn(result, rows) -> list:
    """The decode rows' graph-replay GB/s of each of our candidates, contiguous and paged,
    as a ratio to SDPA cuDNN's contiguous figure in the same run, to three decimals;
    "error" where either side has no graph figure."""
    rows = [row for row in rows if "sdpa-cudnn" in row]
    if not rows:
        return []
    names = list(result["decode_algorithms"])
    names += [f"{n} paged" for n in result["decode_algorithms"]
              if any(f"{n} paged" in row for row in rows)]
    lines = ["", "Decode replayed from a CUDA graph, GB/s as a ratio to SDPA cuDNN's in the "
             "same run (paged: to cuDNN's contiguous figure):", "",
             "| S2 | GQA | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for row in rows:
        ratios = [_ratio(row, name, "sdpa-cudnn", key="gbs") for name in names]
        lines.append(f"| {row['s']} | {row['ratio']}:1 | "
                     + " | ".join("error" if r is None else f"{r:.3f}" for r in ratios) + " |")
    return lines


def _host_markdown(result) -> list:
    """The host time table: µs per call with the GPU kept busy (:func:`host_us`), ratio to
    SDPA-flash's; for decode, after a slash, eager minus graph-replay time."""
    rows = [row for row in result["rows"]
            if any("host_us" in v for v in row.values() if isinstance(v, dict))]
    if not rows:
        return []
    names = list(dict.fromkeys(list(result["algorithms"]) + list(result.get(
        "decode_algorithms", [])))) + ["sdpa-flash", "sdpa-cudnn"]
    lines = ["", "Host time per call, µs, with the GPU kept busy (ratio to SDPA-flash's); "
             "after ·, each call on inputs at addresses that none of the candidate's earlier "
             "calls used (paged: the query), and the ratio to SDPA-flash's there; decode: / "
             "eager minus graph replay, µs:",
             "",
             "| case | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for row in rows:
        flash = row.get("sdpa-flash", {}).get("host_us")
        flash_new = row.get("sdpa-flash", {}).get("host_us_new")
        cells = []
        for name in names:
            e = row.get(name, {})
            if "host_us" not in e:
                cells.append("-")
                continue
            text = f"{e['host_us']:.0f}"
            if flash:
                text += f" ({e['host_us'] / flash:.1f})"
            if "host_us_new" in e:
                text += f" · {e['host_us_new']:.0f}"
                if flash_new:
                    text += f" ({e['host_us_new'] / flash_new:.1f})"
            if "graph_ms" in e:
                text += f" / {(e['ms'] - e['graph_ms']) * 1e3:.0f}"
            cells.append(text)
        lines.append(f"| {case_text(row)} | " + " | ".join(cells) + " |")
    return lines + _launches_markdown(result, rows, names)


def _launches_markdown(result, rows, names) -> list:
    """The Triton launches each of our calls makes, per kind of case, and the host time of
    one empty kernel's launch made the same way: the floor each launch adds."""
    parts = []
    graphs = set()
    for kind in ("prefill", "decode"):
        counts = {}
        for row in rows:
            for name in names:
                if row["kind"] == kind and "launches" in row.get(name, {}):
                    counts.setdefault(name, set()).add(row[name]["launches"])
                    graphs.add(row[name].get("graph", False))
        if counts:
            parts.append(f"{kind}: " + ", ".join(
                f"{name} {'-'.join(str(n) for n in sorted({min(c), max(c)}))}"
                for name, c in counts.items()))
    if not parts:
        return []
    floor = result.get("empty_launch_us")
    text = "Triton kernels per call: " + "; ".join(parts) + "."
    if graphs == {True}:
        text += (" From a plan's second call on, a call at new addresses replays its kernels as "
                 "one CUDA graph, their address arguments rewritten for its tensors.")
    elif True in graphs:
        text += " Some calls at new addresses replay their kernels as a graph."
    if floor is not None:
        text += (f" One launch of an empty kernel, made as a recorded call makes its launches, "
                 f"takes {floor:.1f} µs of host time here.")
    return ["", text]


def case_text(row) -> str:
    if row["kind"] == "prefill":
        return f"d={row['d']} S={row['s']} {mask_text(row)}"
    return f"decode d={row['d']} S2={row['s']} GQA {row['ratio']}:1"


def plot(result, path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("pasa-bench: matplotlib is not installed; no plot written (use --plot FILE.json "
              "where it is)", file=sys.stderr)
        return False
    rows = [r for r in result["rows"] if r["kind"] == "prefill"]
    decode = [r for r in result["rows"] if r["kind"] == "decode"]
    combos = sorted({(r["d"], r["causal"]) for r in rows})
    if not combos and not decode:
        print("pasa-bench: no prefill or decode rows; no plot written", file=sys.stderr)
        return False
    panels = len(combos) + bool(decode)
    # one panel alone still leaves the title its width
    fig, axes = plt.subplots(1, panels, figsize=(max(6.0, 4.2 * panels), 3.8), squeeze=False)
    axes = list(axes[0])
    names = list(result["algorithms"]) + ["sdpa-flash", "sdpa-cudnn"]
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    for i, (ax, (d, causal)) in enumerate(zip(axes, combos)):
        sub = sorted((r for r in rows if r["d"] == d and r["causal"] == causal),
                     key=lambda r: r["s"])
        xs = [r["s"] for r in sub]
        for name in names:
            ys = [r.get(name, {}).get("tflops", math.nan) for r in sub]
            style = "--" if name.startswith("sdpa") else "-"
            ax.plot(xs, ys, style, marker="o", label=name, color=colors[name])
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d}, {'causal' if causal else 'no mask'}")
        ax.set_xlabel("sequence length")
        ax.grid(alpha=0.3)
        if i:
            ax.tick_params(labelleft=False)
    if combos:  # one TFLOP/s scale for the prefill panels
        low = min(ax.get_ylim()[0] for ax in axes[:len(combos)])
        high = max(ax.get_ylim()[1] for ax in axes[:len(combos)])
        for ax in axes[:len(combos)]:
            ax.set_ylim(low, high)
        axes[0].set_ylabel("TFLOP/s (fp16 forward)")
        axes[len(combos) - 1].legend(fontsize=7, loc="lower right")
    if decode:
        _decode_panel(axes[-1], decode, list(result["decode_algorithms"])
                      + ["sdpa-flash", "sdpa-cudnn"], result["copy_gbs"], colors)
    fig.suptitle(f"pasa-npu Triton vs torch SDPA on {result['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _decode_panel(ax, rows, names, copy_gbs, colors) -> None:
    """Grouped bars: each decode case's share of copy bandwidth per candidate, replayed
    from a CUDA graph (missing where a candidate failed)."""
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        shares = [100 * r.get(name, {}).get("gbs", math.nan) / copy_gbs for r in rows]
        ax.bar([i + (j - (len(names) - 1) / 2) * width for i in range(len(rows))], shares,
               width, label=name, color=colors.get(name), hatch="//" if name.startswith("sdpa")
               else None, edgecolor="white" if name.startswith("sdpa") else None)
    ax.set_xticks(range(len(rows)), [f"{r['s'] // 1024}k, {r['ratio']}:1" for r in rows])
    ax.set_title(f"decode, d={rows[0]['d']}, batch {rows[0]['b']} (graph replay)")
    ax.set_xlabel("keys, GQA")
    ax.set_ylabel("K+V read, % of copy bandwidth")
    ax.set_ylim(0, 135)  # room above the bars for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=6, loc="upper center", ncol=3)
