"""The Ascend operator precision standards (docs/design.md, "How we measure"), as verdicts.

Single benchmark (against the fp64 golden alone): an output passes when
MERE < t_mean and MARE < t_max, with (t_mean, t_max) = (2^-10, 10 * 2^-10) for
fp16 outputs and (2^-7, 10 * 2^-7) for bf16. MERE/MARE are the mean/max of
|actual - golden| / (|golden| + 1e-7) (:mod:`pasa_npu.tools.metrics`).

Dual benchmark (against a third-party implementation on the same input): the
candidate's MARE, MERE and RMSE, each divided by the third party's, must be at
most (10, 2, 2) for level L0, (5, 1.5, 1.5) for L1 and (2, 1.2, 1.2) for L2.
The verdict is the strictest level met, or FAIL.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SINGLE_THRESHOLDS = {
    torch.float16: (2.0 ** -10, 10 * 2.0 ** -10),
    torch.bfloat16: (2.0 ** -7, 10 * 2.0 ** -7),
}

#: level -> maximum ratio of (MARE, MERE, RMSE), strictest first.
DUAL_LEVELS = (("L2", (2.0, 1.2, 1.2)), ("L1", (5.0, 1.5, 1.5)), ("L0", (10.0, 2.0, 2.0)))


@dataclass(frozen=True)
class SingleVerdict:
    passed: bool
    mere: float
    mare: float
    mere_limit: float
    mare_limit: float
    reason: str

    @property
    def label(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class DualVerdict:
    level: str              # "L2", "L1", "L0", "FAIL" or "n/a"
    ratios: tuple[float, float, float]   # (MARE, MERE, RMSE) candidate / third party
    reason: str

    @property
    def label(self) -> str:
        return self.level


def single_benchmark(mere: float, mare: float, dtype: torch.dtype) -> SingleVerdict:
    """Threshold verdict for an output of ``dtype`` (fp16 or bf16) with the given
    MERE and MARE; a NaN metric (non-finite output) fails."""
    if dtype not in SINGLE_THRESHOLDS:
        raise ValueError(f"the single-benchmark standard covers float16 and bfloat16 outputs, "
                         f"got {dtype}")
    t_mean, t_max = SINGLE_THRESHOLDS[dtype]
    if math.isnan(mere) or math.isnan(mare):
        return SingleVerdict(False, mere, mare, t_mean, t_max, "non-finite output")
    failed = []
    if not mere < t_mean:
        failed.append(f"MERE {mere:.3g} >= {t_mean:.3g}")
    if not mare < t_max:
        failed.append(f"MARE {mare:.3g} >= {t_max:.3g}")
    reason = "; ".join(failed) or "within limits"
    return SingleVerdict(not failed, mere, mare, t_mean, t_max, reason)


def _ratio(candidate: float, third_party: float) -> float:
    if candidate == third_party:
        return 1.0  # both exact (0/0) counts as equal
    if third_party == 0.0:
        return math.inf
    return candidate / third_party


def dual_benchmark(candidate: tuple[float, float, float],
                   third_party: tuple[float, float, float]) -> DualVerdict:
    """Ratio verdict for (MARE, MERE, RMSE) of a candidate against a third party's.
    A NaN in the third party's metrics gives "n/a"; a NaN in the candidate's, FAIL."""
    if any(math.isnan(x) for x in third_party):
        return DualVerdict("n/a", (math.nan,) * 3, "third-party output is not finite")
    if any(math.isnan(x) for x in candidate):
        return DualVerdict("FAIL", (math.nan,) * 3, "non-finite output")
    ratios = tuple(_ratio(c, t) for c, t in zip(candidate, third_party))
    for level, limits in DUAL_LEVELS:
        if all(r <= lim for r, lim in zip(ratios, limits)):
            return DualVerdict(level, ratios, f"ratios within {level} limits {limits}")
    limits = DUAL_LEVELS[-1][1]
    over = [f"{name} ratio {r:.3g} > {lim:g}" for name, r, lim
            in zip(("MARE", "MERE", "RMSE"), ratios, limits) if r > lim]
    return DualVerdict("FAIL", ratios, "; ".join(over))
