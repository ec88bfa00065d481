"""Accuracy metrics against an fp64 golden (DESIGN.md §4).

Every metric is computed in fp64 over the finite part where noted, and reports
non-finite outputs separately so that an overflow is never averaged away.
"""
from __future__ import annotations

import torch


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


def summary(actual: torch.Tensor, golden: torch.Tensor) -> dict[str, float]:
    return {
        "rel_rmse": relative_rmse(actual, golden),
        "max_abs": max_abs_error(actual, golden),
        "cosine": cosine_similarity(actual, golden),
        "rel_l1": relative_l1(actual, golden),
        "bias": mean_error(actual, golden),
        "nonfinite_pct": nonfinite_percent(actual),
    }
