"""Accuracy metrics against an fp64 golden (docs/design.md, "How we measure").

Every metric is computed in fp64. A NaN/Inf in ``actual`` makes the error
metrics NaN (an overflow is never averaged away) and is counted separately by
:func:`nonfinite_percent`.

``per_head`` and ``summary`` take (B, N, S, D) outputs; the per-head metrics
reduce over B, S and D for each head N.
"""
from __future__ import annotations

import torch

#: The Ascend relative error's denominator guard: |actual - golden| / (|golden| + 1e-7).
RELATIVE_ERROR_EPS = 1e-7


def relative_rmse(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """||O - G||_2 / ||G||_2 (the paper's metric); NaN if ``actual`` has NaN/Inf."""
    a, g = actual.double(), golden.double()
    return float((a - g).norm() / g.norm())


def nonfinite_percent(actual: torch.Tensor) -> float:
    return float((~torch.isfinite(actual)).double().mean() * 100)


def max_abs_error(actual: torch.Tensor, golden: torch.Tensor) -> float:
    return float((actual.double() - golden.double()).abs().max())


def cosine_similarity(actual: torch.Tensor, golden: torch.Tensor) -> float:
    a, g = actual.double().flatten(), golden.double().flatten()
    return float(a @ g / (a.norm() * g.norm()))


def relative_l1(actual: torch.Tensor, golden: torch.Tensor) -> float:
    a, g = actual.double(), golden.double()
    return float((a - g).abs().sum() / g.abs().sum())


def mean_error(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """Signed mean error (bias) of ``actual`` relative to ``golden``."""
    return float((actual.double() - golden.double()).mean())


def rmse(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """Absolute root-mean-square error sqrt(mean((O - G)^2))."""
    return float((actual.double() - golden.double()).pow(2).mean().sqrt())


def relative_errors(actual: torch.Tensor, golden: torch.Tensor) -> torch.Tensor:
    """Elementwise |O - G| / (|G| + 1e-7), the Ascend precision standard's relative error."""
    a, g = actual.double(), golden.double()
    return (a - g).abs() / (g.abs() + RELATIVE_ERROR_EPS)


def mere(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """Mean relative error (Ascend MERE)."""
    return float(relative_errors(actual, golden).mean())


def mare(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """Maximum relative error (Ascend MARE)."""
    return float(relative_errors(actual, golden).max())


def summary(actual: torch.Tensor, golden: torch.Tensor) -> dict[str, float]:
    """Every metric of docs/design.md, "How we measure", over the whole output."""
    return {
        "rel_rmse": relative_rmse(actual, golden),
        "max_abs": max_abs_error(actual, golden),
        "cosine": cosine_similarity(actual, golden),
        "rel_l1": relative_l1(actual, golden),
        "bias": mean_error(actual, golden),
        "nonfinite_pct": nonfinite_percent(actual),
        "rmse": rmse(actual, golden),
        "mere": mere(actual, golden),
        "mare": mare(actual, golden),
    }


def per_head(actual: torch.Tensor, golden: torch.Tensor) -> dict[str, list[float]]:
    """The metrics of :func:`summary` for each head of (B, N, S, D) outputs."""
    if actual.shape != golden.shape or actual.dim() != 4:
        raise ValueError(f"per_head takes two (B, N, S, D) tensors of one shape, got "
                         f"{tuple(actual.shape)} and {tuple(golden.shape)}")
    a = actual.double().transpose(0, 1).flatten(1)  # (N, B*S*D)
    g = golden.double().transpose(0, 1).flatten(1)
    d = a - g
    rel = d.abs() / (g.abs() + RELATIVE_ERROR_EPS)
    heads = {
        "rel_rmse": d.norm(dim=1) / g.norm(dim=1),
        "max_abs": d.abs().amax(1),
        "cosine": (a * g).sum(1) / (a.norm(dim=1) * g.norm(dim=1)),
        "rel_l1": d.abs().sum(1) / g.abs().sum(1),
        "bias": d.mean(1),
        "nonfinite_pct": (~torch.isfinite(a)).double().mean(1) * 100,
        "rmse": d.pow(2).mean(1).sqrt(),
        "mere": rel.mean(1),
        "mare": rel.amax(1),
    }
    return {name: [float(x) for x in values] for name, values in heads.items()}


def score_range(query: torch.Tensor, key: torch.Tensor, scale: float,
                row_chunk: int = 1024) -> dict[str, object]:
    """Largest |Q K^T| per head, unscaled (what an fp16 matmul output holds in
    ``fa-fp16s``) and scaled, in fp64, over every (query, key) pair of each
    batch; (B, Nq, S1, D) query and (B, Nkv, S2, D) key, GQA by head groups.
    ``exceeds_fp16`` says whether the unscaled maximum is above 65504."""
    b, n_q, s_q, _ = query.shape
    group = n_q // key.shape[1]
    k = key.double().repeat_interleave(group, dim=1)
    peak = torch.zeros(n_q, dtype=torch.float64)
    for r0 in range(0, s_q, row_chunk):
        s = torch.matmul(query[:, :, r0:r0 + row_chunk].double(), k.transpose(-1, -2))
        peak = torch.maximum(peak, s.abs().amax(dim=(0, 2, 3)))
    heads = [float(x) for x in peak]
    top = max(heads) if heads else 0.0
    return {"max_abs_qk": top, "max_abs_scaled": top * abs(scale),
            "exceeds_fp16": top > 65504.0, "max_abs_qk_per_head": heads}
