"""PASA's shifting matrix and the optimal accuracy condition for beta (paper §2.3, App. A-C).

The kernel stores ``M = scale * (I - (beta/n) J)`` in the compute dtype, with the
softmax scale folded in, so one GEMM does the shift and the scaling. Rounding its
two distinct entries changes the beta actually applied: with the stored matrix
written ``M_fl = scale * (a I - b J)``, the shifted block's row mean relates to
the subtracted constant by the *practical invariance*

    gamma_eff = b n / (a (a - b n)) + (1 - a) / a,

while the recovery multiplies the mean by ``gamma = beta / (1 - beta)``. The
optimal beta makes the two equal; it is the fixed point of
``beta <- f(beta) / (1 + f(beta))``, iterated in fp64.
"""
from __future__ import annotations

import functools
import math

import torch

from .numerics import DEFAULT_BETA0


def _round(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=torch.float64).to(dtype).double().item()


def shift_matrix_entries(beta: float, n: int, dtype: torch.dtype = torch.float16,
                         scale: float = 1.0) -> tuple[float, float]:
    """The stored diagonal ``scale*(1 - beta/n)`` and the magnitude of the stored
    off-diagonal ``scale*beta/n``, each rounded once to ``dtype``."""
    return _round(scale * (1.0 - beta / n), dtype), _round(scale * beta / n, dtype)


def shift_matrix(beta: float, n: int, dtype: torch.dtype = torch.float16, scale: float = 1.0,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """The n x n shifting matrix exactly as the kernels store it (symmetric, so M = M^T)."""
    diag, off = shift_matrix_entries(beta, n, dtype, scale)
    m = torch.full((n, n), -off, dtype=torch.float64, device=device)
    m.fill_diagonal_(diag)
    return m.to(dtype)


def practical_invariance(beta: float, n: int, dtype: torch.dtype = torch.float16,
                         scale: float = 1.0) -> float:
    """gamma_eff of the stored matrix (paper eq. 20, normalised by the folded scale)."""
    diag, off = shift_matrix_entries(beta, n, dtype, scale)
    b = off / scale
    a = diag / scale + b
    return b * n / (a * (a - b * n)) + (1.0 - a) / a


def ideal_invariance(beta: float) -> float:
    """gamma = beta / (1 - beta), the multiplier the online recovery applies."""
    return beta / (1.0 - beta)


def optimal_beta(beta0: float, n: int, dtype: torch.dtype = torch.float16, scale: float = 1.0,
                 tol: float = 1e-12, max_iter: int = 200) -> float:
    """Solve the optimal accuracy condition ``gamma_eff(beta) = beta/(1-beta)``.

    Fixed-point iteration in fp64 from ``beta0`` for an ``n x n`` shifting matrix
    stored in ``dtype`` with ``scale`` folded in. For n=128, fp16, scale=1 it gives
    0.937500, 0.968994, 0.984497 from 1-2**-4, 1-2**-5, 1-2**-6 (paper Table 3).
    """
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (the shifting matrix size), got {n!r}")
    if not 0.0 < beta0 < 1.0:
        raise ValueError(f"beta0 must lie in (0, 1), got {beta0!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    beta = float(beta0)
    for _ in range(max_iter):
        try:
            gamma = practical_invariance(beta, n, dtype, scale)
        except ZeroDivisionError:  # a stored entry rounded to 0: the matrix shifts nothing
            gamma = math.nan
        new = gamma / (1.0 + gamma)
        if not 0.0 < new < 1.0:
            raise ValueError(f"the optimal accuracy condition has no solution in (0, 1) from "
                             f"beta0={beta0} for n={n}, {dtype}, scale={scale}")
        if abs(new - beta) <= tol * abs(beta):
            return new
        beta = new
    raise RuntimeError(f"optimal_beta did not converge from beta0={beta0} (n={n}, {dtype}, "
                       f"scale={scale}) in {max_iter} iterations")


@functools.lru_cache(maxsize=256)
def default_beta(n: int, scale: float, dtype: torch.dtype = torch.float16) -> float:
    """The beta used when ``beta=None``: optimal from :data:`DEFAULT_BETA0`."""
    return optimal_beta(DEFAULT_BETA0, n, dtype, scale)


def partial_block_shift(beta: float, valid: int, n: int, dtype: torch.dtype = torch.float16,
                        scale: float = 1.0) -> tuple[float, float, float]:
    """How PASA shifts a kv block that holds ``valid`` keys of its ``n`` rows (the
    part-filled last block; docs/design.md, "Shifting the keys on the matrix engine").

    The block is shifted as the full block would be with its ``n - valid`` missing rows
    filled by the mean of its keys: row i of K' is ``(diag + off) * K_i - off_v * sum(K)``
    over the valid rows, with the full block's stored entries (``diag``, ``-off``;
    :func:`shift_matrix_entries`) and ``off_v = off * n / valid``. Its S' then relates to
    its scores exactly as a full block's does (the same residual ``a - b n`` of the bias,
    the same practical invariance, so the same beta and gamma), and its row mean is the
    mean over its valid columns. Returns ``(diag_v, off_v, mean_factor)``: the valid x valid
    matrix's diagonal ``diag + off - off_v`` and off-diagonal magnitude ``off_v`` (fp64,
    not rounded to ``dtype``: the kernels apply them in fp32), and ``1 / valid``, the
    factor that turns the block's sum of S' into its row mean. For ``valid == n`` these
    are the stored entries and 1/n."""
    if not 1 <= valid <= n:
        raise ValueError(f"valid must lie in [1, n={n}], got {valid}")
    diag, off = shift_matrix_entries(beta, n, dtype, scale)
    off_v = off * n / valid
    return diag + off - off_v, off_v, 1.0 / valid


def partial_block_correction(beta: float, valid: int, n: int, dtype: torch.dtype = torch.float16,
                             scale: float = 1.0) -> float:
    """The fp32 coefficient ``c`` with which the kernels complete a part-filled block's shift:
    K'_i = fl16(R_i - c * colsum) for its ``valid`` keys, R = M^T K the full block's product
    over the zero-padded block (fp32) and colsum the sum of its keys (fp32), which equals
    :func:`partial_block_shift`'s matrix applied to the keys. ``c = off * (n - valid) / valid``
    with ``off`` the stored off-diagonal magnitude: an exact fp32 product, one rounded fp32
    division."""
    if not 1 <= valid <= n:
        raise ValueError(f"valid must lie in [1, n={n}], got {valid}")
    off = shift_matrix_entries(beta, n, dtype, scale)[1]
    return float(torch.tensor(off * (n - valid), dtype=torch.float32) / torch.tensor(valid, dtype=torch.float32))
