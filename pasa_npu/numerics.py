"""The one definition of the precision allocations, the tiling and the rounding guard.

Every backend (PyTorch CPU, Triton, AscendC) and every tool reads these; none of
them keeps a private copy. It encodes docs/design.md, "Precision allocations".

Conventions used by all backends:

* A matmul takes operands in the low-precision compute dtype and accumulates in
  fp32 (cube unit L0C / tensor cores); its result is rounded once if the
  allocation keeps it in low precision.
* A "low-precision step" is computed exactly (fp32 arithmetic) and rounded to the
  compute dtype once; for + - * / that is fp32 arithmetic followed by a cast.
* Row reductions (max, sum, mean) over one kv block are taken in fp32 and rounded
  once where the allocation stores the result in low precision.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP16_MAX = 65504.0


@dataclass(frozen=True)
class Allocation:
    """A precision allocation of the attention forward pass (docs/design.md, "Precision
    allocations"): what each step computes in, as the named properties a kernel branches on.

    ``pseudo_average_shift``: PASA's shift, K' = M^T K per kv block, the bias recovered
    online from the pseudo-average of the shifted block means (docs/design.md, "Recovering
    the bias online"). ``exact_shift``: the full shift, K' = (K - mean16) * scale, with the
    row constant c = scale * Q . mean16 carried exactly in fp32 (docs/design.md, "pasa-exact:
    carrying the shift exactly"). Neither: plain FlashAttention-2.
    ``low_scores``: the score tile leaves the matmul rounded to the low-precision dtype.
    ``low_statistics``: the softmax statistics (m, l, P, the block means) are low-precision
    steps; otherwise fp32.
    ``low_accumulator``: the output accumulator is kept in the low-precision dtype.
    """

    name: str
    pseudo_average_shift: bool
    exact_shift: bool
    low_scores: bool
    low_statistics: bool
    low_accumulator: bool
    summary: str

    def __post_init__(self):
        if self.pseudo_average_shift and self.exact_shift:
            raise ValueError(f"allocation {self.name!r}: one shift at most")

    @property
    def shifts_keys(self) -> bool:
        """K is replaced by a shifted K' before the scores: the PASA allocations."""
        return self.pseudo_average_shift or self.exact_shift

    @property
    def shift(self) -> str:
        """The shift's name for reports: "none", "pseudo_average" or "exact"."""
        if self.pseudo_average_shift:
            return "pseudo_average"
        return "exact" if self.exact_shift else "none"


def _allocation(name: str, shift: str, low_scores: bool, low_statistics: bool,
                low_accumulator: bool, summary: str) -> Allocation:
    return Allocation(name, shift == "pseudo_average", shift == "exact", low_scores,
                      low_statistics, low_accumulator, summary)


ALLOCATIONS: dict[str, Allocation] = {
    a.name: a
    for a in (
        _allocation("fa-fp32", "none", False, False, False,
                    "FlashAttention-2, fp32 scores and statistics (torch_npu inner_precise=0)"),
        _allocation("fa-fp16s", "none", True, False, False,
                    "fp16 unscaled scores out of the matmul, fp32 softmax (paper Fig. 2)"),
        _allocation("fa-fp16", "none", True, True, True,
                    "fully low precision (paper Fig. 3; inner_precise=1)"),
        _allocation("pasa", "pseudo_average", True, True, True,
                    "PASA, Algorithm 1 of the paper: every step in fp16"),
        _allocation("pasa-mixed", "pseudo_average", True, False, False,
                    "PASA's shift with fp32 statistics and accumulation"),
        _allocation("pasa-exact", "exact", True, False, False,
                    "full shift, per-row constant carried exactly in fp32; S', P' and the "
                    "P'V tile in fp16, running output in fp32 local memory"),
    )
}

ALGORITHM_NAMES: tuple[str, ...] = tuple(ALLOCATIONS)

#: ``algorithm=None`` picks by torch_npu's ``inner_precise`` bit 0: 0 (high precision) runs
#: fa-fp32, which meets FIA's high-precision criterion wherever fp32 softmax does; fp16 scores,
#: shifted or not, cannot resolve a sharp softmax over large scores (docs/design.md, "High
#: precision"). 1 (high performance) runs PASA.
DEFAULT_ALGORITHM_BY_PRECISE_BIT = {0: "fa-fp32", 1: "pasa"}


def compute_dtype(allocation: Allocation, input_dtype: torch.dtype) -> torch.dtype:
    """The low-precision dtype an allocation computes in.

    PASA allocations always compute in fp16 (bf16 inputs are converted, the
    paper's rule); the FlashAttention allocations keep the input dtype.
    """
    return torch.float16 if allocation.shifts_keys else input_dtype


@dataclass(frozen=True)
class Tiling:
    """Block sizes: ``q_block`` query rows (s1) by ``kv_block`` keys (s2).

    ``kv_block`` is also the size n of PASA's shifting matrix and enters the
    optimal beta; ``q_block`` never changes numerics (every statistic is per row).
    """

    q_block: int = 128
    kv_block: int = 128


DEFAULT_TILING = Tiling()

# Optimal-accuracy starting point for beta (paper §2.3; the paper adopts the solution
# from 1 - 2**-6; docs/design.md, "Choosing β"). A start at 1 - 2**-4 is more accurate on
# most random inputs (`pasa-compare sweep --paper-shape --beta0 0.9375`) but lets pasa
# overflow on the resonance case (scores ~1e5, tools/inputs.py), which 1 - 2**-6 keeps
# finite: overflow-freedom comes first.
DEFAULT_BETA0 = 1.0 - 2.0 ** -6

# Rounding guard (docs/design.md, "The rounding guard"): for a row whose block maximum rm is
# repeated, shift the exponent's reference to m = GUARD_FACTOR * rm (rm > 0) or
# 0 (rm < 0), so that no entry of P is exactly 1. The offset m - rm is clamped
# to [GUARD_MIN_OFFSET, GUARD_MAX_OFFSET]: below, exp(-offset) would round back
# to 1 in bf16; above, a whole fp16 row of P would underflow to zero. rm == 0
# takes the minimum offset.
GUARD_FACTOR = 2.0
GUARD_MIN_OFFSET = 2.0 ** -5
GUARD_MAX_OFFSET = 8.0


#: The resolution check of the PASA allocations (docs/design.md, "Overflow detection and
#: repair"): a query row is recomputed by fa-fp32 when, in some kv block it sees, the
#: largest shifted score |max_j S'_ij| reaches this magnitude, or (the pseudo-average shift)
#: the block's recovered offset |gamma * mean_j S'_ij|. fp16's spacing there is 0.5, so
#: rounding alone moves a score by up to 0.25 and a softmax weight by up to e^0.25 - 1 = 28%;
#: the offset is gamma times a block mean of fp16 scores (in pasa rounded to fp16, so as coarse
#: as an fp16 number of the offset's size), and its error moves the weights of the block's
#: keys together.
RESOLUTION_LIMIT = 512.0


def to_fp16_checked(tensors, names, rows_in_use=None) -> tuple:
    """bf16 -> fp16 for PASA, refusing finite values fp16 cannot hold instead of making inf
    (NaN and inf convert exactly: the overflow check reports their rows as fa-fp32 gives
    them). The tensors' peak magnitudes come to the host together: one wait for the device,
    not one per tensor (each peak from one read of its tensor, without an |x| temporary).
    ``rows_in_use(index, tensor)``: the elements of the rows a kernel reads (None: all, as
    where the lengths stay on the device); only a tensor past fp16's range, or holding NaN
    or inf, is read again, through it: one more wait."""
    filled = [(i, t, name) for i, (t, name) in enumerate(zip(tensors, names)) if t.numel()]
    if filled:
        ranges = torch.stack([torch.stack(torch.aminmax(t)) for _, t, _ in filled]).float()
        for (i, t, name), (low, high) in zip(filled, ranges.tolist()):
            peak = max(-low, high)
            if peak <= FP16_MAX:
                continue
            used = t if rows_in_use is None else rows_in_use(i, t)
            peak = float(torch.where(torch.isfinite(used), used.abs(), 0).max())
            if peak > FP16_MAX:
                raise ValueError(
                    f"{name} holds values up to {peak:.6g} in magnitude, beyond fp16's "
                    f"{FP16_MAX:.0f}; PASA computes bf16 inputs in fp16. Use "
                    f"algorithm='fa-fp32' for this input.")
    return tuple(t.to(torch.float16) for t in tensors)
