"""The one definition of the precision allocations, the tiling and the rounding guard.

Every backend (PyTorch CPU, Triton, AscendC) and every tool reads these; none of
them keeps a private copy. DESIGN.md §2.3 is the table this module encodes.

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
    """A precision allocation of the attention forward pass (DESIGN.md §2.3).

    ``shift``: ``"none"`` (plain FlashAttention-2), ``"pseudo_average"`` (PASA's
    shifting matrix M with the online recovery of §2.2) or ``"exact"`` (§2.4:
    beta = 1, the per-row constant carried in fp32).
    ``scores``/``stats``/``accumulate``: ``"fp32"`` or ``"low"`` for the score
    tile leaving the matmul, the softmax statistics (m, l, P, means) and the
    output accumulator.
    """

    name: str
    shift: str
    scores: str
    stats: str
    accumulate: str
    summary: str

    @property
    def is_pasa(self) -> bool:
        return self.shift != "none"


ALLOCATIONS: dict[str, Allocation] = {
    a.name: a
    for a in (
        Allocation("fa-fp32", "none", "fp32", "fp32", "fp32",
                   "FlashAttention-2, fp32 scores and statistics (torch_npu inner_precise=0)"),
        Allocation("fa-fp16s", "none", "low", "fp32", "fp32",
                   "fp16 unscaled scores out of the matmul, fp32 softmax (paper Fig. 2)"),
        Allocation("fa-fp16", "none", "low", "low", "low",
                   "fully low precision (paper Fig. 3; inner_precise=1)"),
        Allocation("pasa", "pseudo_average", "low", "low", "low",
                   "PASA, Algorithm 1 of the paper: every step in fp16"),
        Allocation("pasa-mixed", "pseudo_average", "low", "fp32", "fp32",
                   "PASA's shift with fp32 statistics and accumulation"),
        Allocation("pasa-exact", "exact", "low", "fp32", "fp32",
                   "full shift, per-row constant carried exactly in fp32; S', P' and the "
                   "P'V tile in fp16, running output in fp32 local memory"),
    )
}

ALGORITHM_NAMES: tuple[str, ...] = tuple(ALLOCATIONS)

#: ``algorithm=None`` picks by torch_npu's ``inner_precise`` bit 0:
#: 0 (high precision) and 1 (high performance).
DEFAULT_ALGORITHM_BY_PRECISE_BIT = {0: "pasa-exact", 1: "pasa"}


def compute_dtype(allocation: Allocation, input_dtype: torch.dtype) -> torch.dtype:
    """The low-precision dtype an allocation computes in.

    PASA allocations always compute in fp16 (bf16 inputs are converted, the
    paper's rule); the FlashAttention allocations keep the input dtype.
    """
    return torch.float16 if allocation.is_pasa else input_dtype


@dataclass(frozen=True)
class Tiling:
    """Block sizes: ``q_block`` query rows (s1) by ``kv_block`` keys (s2).

    ``kv_block`` is also the size n of PASA's shifting matrix and enters the
    optimal beta; ``q_block`` never changes numerics (every statistic is per row).
    """

    q_block: int = 128
    kv_block: int = 128


DEFAULT_TILING = Tiling()

# Optimal-accuracy starting point for beta (paper §2.3; the paper adopts the
# solution from 1 - 2**-6). Measured on the CPU backend (tools/inputs.py cases,
# scale 1/sqrt(128), `pasa-compare sweep --paper-shape --beta0 0.9375`): from 1 - 2**-4 most
# random sweep cases are more accurate (pasa up to 16%, pasa-mixed up to 2x), but
# pasa overflows (46% NaN) on the resonance case with scores
# ~1e5, which 1 - 2**-6 keeps finite. Overflow-freedom comes first.
DEFAULT_BETA0 = 1.0 - 2.0 ** -6

# Rounding guard (DESIGN.md §2.5, seed 002): for a row whose block maximum rm is
# repeated, shift the exponent's reference to m = GUARD_FACTOR * rm (rm > 0) or
# 0 (rm < 0), so that no entry of P is exactly 1. The offset m - rm is clamped
# to [GUARD_MIN_OFFSET, GUARD_MAX_OFFSET]: below, exp(-offset) would round back
# to 1 in bf16; above, a whole fp16 row of P would underflow to zero. rm == 0
# takes the minimum offset.
GUARD_FACTOR = 2.0
GUARD_MIN_OFFSET = 2.0 ** -5
GUARD_MAX_OFFSET = 8.0
