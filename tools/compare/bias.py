"""The rounding-bias experiment (docs/design.md, "The rounding guard").

Mechanism: when a score row has several equal maxima, those entries of
P = exp(S - rowmax) are exactly 1, so P V adds same-signed V values that carry
only the low-precision significand. Their exact sum has one or two bits more
than the format holds and is often a tie; the many tiny remaining terms
(exp(S - max) << 1, still representable in the fp32 accumulator) break the
tie always away from zero when V is same-signed, and rounding the P V tile to
fp16/bf16 then errs in one direction. The dynamic maximum (``rounding_guard``)
shifts such rows so that no entry of P is exactly 1.

Inputs (one trial): per head a unit direction u; ``ties`` keys are exact
copies of one key along u, the others small noise; every query leans on u, so
each score row has ``ties`` exactly equal maxima about ``gap`` above the rest;
V ~ U(1, 2) (same-signed). A trial's signed mean error is the mean of
(output - fp64 golden) over all its outputs; the report gives the mean over
trials with a 95% confidence interval (normal approximation, mean +- 1.96 s/sqrt(T)).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

import pasa_npu

from .errors import CompareError

ULP_AT_ONE = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
Z95 = 1.959964


@dataclass(frozen=True)
class BiasSetup:
    heads: int = 8
    queries: int = 128
    keys: int = 128
    dim: int = 64
    ties: int = 2
    gap: float = 12.0
    trials: int = 50
    seed: int = 0

    def check(self) -> None:
        for name in ("heads", "queries", "keys", "dim", "ties"):
            if getattr(self, name) < 1:
                raise CompareError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.ties < 2:
            raise CompareError(f"--ties must be >= 2 (repeated maxima), got {self.ties}")
        if self.ties > self.keys:
            raise CompareError(f"--ties {self.ties} exceeds --keys {self.keys}")
        if self.trials < 2:
            raise CompareError(f"--trials must be >= 2 for a confidence interval, got "
                               f"{self.trials}")
        if not self.gap > 0:
            raise CompareError(f"--gap must be > 0, got {self.gap}")


def tied_maxima_inputs(setup: BiasSetup, seed: int, dtype: torch.dtype):
    """(q, k, v) BNSD in ``dtype`` and the scale, for one trial (see the module doc)."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    h, s1, s2, d = setup.heads, setup.queries, setup.keys, setup.dim
    scale = d ** -0.5
    u = torch.randn(h, 1, d, generator=gen, dtype=f64)
    u = u / u.norm(dim=-1, keepdim=True)
    # q.k* * scale = (a/2)(2a) * scale = gap, with a = sqrt(gap / scale)
    a = math.sqrt(setup.gap / scale)
    k = torch.randn(h, s2, d, generator=gen, dtype=f64) * 0.3
    for head in range(h):
        pos = torch.randperm(s2, generator=gen)[:setup.ties]
        k[head, pos] = 2 * a * u[head]
    q = a / 2 * u + torch.randn(h, s1, d, generator=gen, dtype=f64) * 0.3
    v = 1 + torch.rand(h, s2, d, generator=gen, dtype=f64)
    return tuple(t.unsqueeze(0).to(dtype) for t in (q, k, v)), scale


@dataclass
class BiasRow:
    allocation: str
    dtype: str
    guard: bool
    trials: int
    bias: float          # mean over trials of the signed mean error
    ci95: float          # half-width of the 95% confidence interval
    bias_ulp: float      # bias / ulp(1) of the output dtype
    rms: float           # root-mean-square error over all outputs of all trials
    tied_rows_pct: float  # share of score rows (as the operator saw them) with a repeated max

    @property
    def significant(self) -> bool:
        return abs(self.bias) > self.ci95


def run_bias(allocations: list[str], dtypes: list[torch.dtype], setup: BiasSetup,
             progress=None) -> list[BiasRow]:
    """Each (allocation, dtype) with and without the guard on the same trials."""
    setup.check()
    for name in allocations:
        if name not in pasa_npu.ALGORITHM_NAMES:
            raise CompareError(f"unknown allocation {name!r}; expected one of "
                               f"{', '.join(pasa_npu.ALGORITHM_NAMES)}")
    configs = [(a, dt) for dt in dtypes for a in allocations]
    sums = {(a, dt, g): [] for a, dt in configs for g in (False, True)}
    sq = {key: 0.0 for key in sums}
    count = {key: 0 for key in sums}
    tied = {dt: [0, 0] for dt in dtypes}
    for t in range(setup.trials):
        for dt in dtypes:
            (q, k, v), scale = tied_maxima_inputs(setup, setup.seed + t, dt)
            kw = dict(num_heads=setup.heads, input_layout="BNSD", scale=scale)
            gold, _ = pasa_npu.reference_attention(q, k, v, **kw)
            s = q.double() @ k.double().transpose(-1, -2)
            top = s.amax(-1, keepdim=True)
            tied[dt][0] += int(((s == top).sum(-1) > 1).sum())
            tied[dt][1] += s.shape[0] * s.shape[1] * s.shape[2]
            for a in allocations:
                for g in (False, True):
                    out, _ = pasa_npu.fused_attention(q, k, v, algorithm=a, rounding_guard=g, **kw)
                    err = out.double() - gold
                    sums[(a, dt, g)].append(float(err.mean()))
                    sq[(a, dt, g)] += float(err.pow(2).sum())
                    count[(a, dt, g)] += err.numel()
        if progress:
            progress(t + 1, setup.trials, f"trial {t + 1}")
    rows = []
    for (a, dt, g), means in sums.items():
        m = torch.tensor(means, dtype=torch.float64)
        half = Z95 * float(m.std()) / math.sqrt(len(means))
        rows.append(BiasRow(a, str(dt).replace("torch.", ""), g, len(means), float(m.mean()), half,
                            float(m.mean()) / ULP_AT_ONE[dt], math.sqrt(sq[(a, dt, g)] /
                            count[(a, dt, g)]), 100.0 * tied[dt][0] / tied[dt][1]))
    return rows


def finding(off: BiasRow, on: BiasRow) -> str:
    """One sentence on what the guard did to the bias of one configuration; "significant"
    means the 95% confidence interval excludes 0."""
    def fmt(r):
        return f"{r.bias:+.3g} ± {r.ci95:.2g}"
    if not off.significant and not on.significant:
        return f"no significant bias with or without the guard ({fmt(off)}; {fmt(on)})"
    if not off.significant:
        return (f"no significant bias without the guard ({fmt(off)}), but the guard introduces "
                f"one ({fmt(on)})")
    if not on.significant:
        return f"bias {fmt(off)} without the guard, removed by it ({fmt(on)}: CI contains 0)"
    ratio = abs(off.bias / on.bias)
    if ratio >= 1:
        return (f"bias {fmt(off)} without the guard, {ratio:.2g}x smaller with it but NOT "
                f"removed ({fmt(on)})")
    return f"bias {fmt(off)} without the guard, {1 / ratio:.2g}x LARGER with it ({fmt(on)})"


def pairs(rows: list[BiasRow]) -> list[tuple[BiasRow, BiasRow]]:
    by = {(r.allocation, r.dtype, r.guard): r for r in rows}
    return [(by[(a, d, False)], by[(a, d, True)]) for (a, d, g) in by if not g]


def console(rows: list[BiasRow], setup: BiasSetup) -> str:
    from .report import grid
    header = ["allocation", "dtype", "guard", "bias (mean err)", "95% CI", "bias/ulp(1)", "rms err"]
    body = [[r.allocation, r.dtype, "on" if r.guard else "off", f"{r.bias:+.3e}",
             f"±{r.ci95:.1e}", f"{r.bias_ulp:+.3f}", f"{r.rms:.2e}"] for r in rows]
    lines = [f"rounding-bias experiment: {setup.trials} trials of (1, {setup.heads}, "
             f"{setup.queries}, {setup.dim}) queries on {setup.keys} keys, {setup.ties} tied "
             f"maxima "
             f"per row about {setup.gap:g} above the rest, V ~ U(1, 2)",
             "score rows with a repeated maximum: "
             + ", ".join(f"{r.dtype} {r.tied_rows_pct:.1f}%" for r in
                         {r.dtype: r for r in rows}.values()),
             "pasa, pasa-mixed and pasa-exact compute in fp16 (bf16 inputs are converted); every "
             "output is rounded to the input dtype", "", grid(header, body), ""]
    lines += [f"{off.allocation} {off.dtype}: {finding(off, on)}" for off, on in pairs(rows)]
    return "\n".join(lines)


def write(rows: list[BiasRow], setup: BiasSetup, folder: str, plot: bool = True) -> list[str]:
    import csv
    import json
    import os
    paths = []
    path = os.path.join(folder, "bias.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        fields = list(asdict(rows[0]))
        w.writerow(fields + ["significant"])
        for r in rows:
            w.writerow([getattr(r, k) for k in fields] + [r.significant])
    paths.append(path)
    path = os.path.join(folder, "bias.json")
    with open(path, "w") as f:
        json.dump({"setup": asdict(setup), "confidence": "95%, normal approximation",
                   "rows": [dict(asdict(r), significant=r.significant) for r in rows],
                   "findings": [dict(allocation=off.allocation, dtype=off.dtype,
                                     finding=finding(off, on)) for off, on in pairs(rows)]},
                  f, indent=1)
    paths.append(path)
    if plot:
        paths.append(_plot(rows, setup, os.path.join(folder, "bias.png")))
    md = os.path.join(folder, "bias.md")
    from .report import markdown_table
    header = ["allocation", "dtype", "guard", "bias", "95% CI", "bias / ulp(1)", "rms error"]
    body = [[r.allocation, r.dtype, "on" if r.guard else "off", f"{r.bias:+.3e}",
             f"±{r.ci95:.1e}", f"{r.bias_ulp:+.3f}", f"{r.rms:.2e}"] for r in rows]
    with open(md, "w") as f:
        f.write("# Rounding-bias experiment\n\n" + console(rows, setup).split("\n\n")[0]
                + "\n\n" + markdown_table(header, body) + "\n\n"
                + "\n".join(f"- {off.allocation} {off.dtype}: {finding(off, on)}"
                            for off, on in pairs(rows))
                + ("\n\n![bias](bias.png)\n" if plot else "\n"))
    paths.append(md)
    return paths


def _plot(rows, setup, path) -> str:
    from .plots import pyplot_module
    plt = pyplot_module()
    cfgs = pairs(rows)
    dtypes = list(dict.fromkeys(off.dtype for off, _ in cfgs))
    allocs = list(dict.fromkeys(off.allocation for off, _ in cfgs))
    fig, axes = plt.subplots(len(dtypes), len(allocs), figsize=(3.3 * len(allocs) + 0.8,
                             2.9 * len(dtypes) + 0.6), squeeze=False)
    for off, on in cfgs:
        ax = axes[dtypes.index(off.dtype)][allocs.index(off.allocation)]
        ax.bar([0, 1], [off.bias, on.bias], yerr=[off.ci95, on.ci95], capsize=6, width=0.6,
               color=["#c0504d", "#4f81bd"])
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([0, 1], ["guard off", "guard on"])
        ax.set_title(f"{off.allocation}, {off.dtype} inputs", fontsize=10)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        ax.grid(True, axis="y", alpha=0.3)
    for row in axes:
        row[0].set_ylabel("signed mean error")
    fig.suptitle(f"rounding bias: {setup.ties} tied maxima per row, gap {setup.gap:g}, "
                 "V ~ U(1, 2); "
                 f"mean of {setup.trials} trials with 95% CI", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
