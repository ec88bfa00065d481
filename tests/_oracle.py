"""An independent rounding model of the six precision allocations, in numpy.

Written from the allocation table and the algorithm (docs/design.md, "Precision
allocations", "The algorithm", "pasa-exact: carrying the shift exactly", "The rounding
guard"), not from a backend: one query row at a time, every value held in a float32
array and rounded to the allocation's dtype exactly where the table says.

Conventions the table states and this model follows:

* A matmul takes its operands in the compute dtype, forms exact products and accumulates
  them in fp32 (one rounding per addition); its result is rounded once if the allocation
  keeps it in low precision.
* A low-precision step is computed in fp32 and rounded to the compute dtype once.
* Row reductions (max, sum, mean) over a kv block are taken in fp32 and rounded once
  where the allocation stores the result in low precision.
* exp and log are the correctly rounded fp32 functions (computed in fp64, rounded once).

The fp32 sums here run in index order. A backend may add in another order; the tests that
compare bit for bit use contractions and blocks of two terms, whose fp32 sum is the same
in every order, so that only the places of the roundings can differ.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64

#: docs/design.md, "The rounding guard": the reference moves to 2 rm (rm > 0) or 0 (rm < 0),
#: the offset clamped to [2^-5, 8]
GUARD_FACTOR = 2.0
GUARD_OFFSET_RANGE = (2.0 ** -5, 8.0)

#: docs/design.md, "Choosing β": the optimum is solved from 1 - 2^-6
BETA0 = 1.0 - 2.0 ** -6

#: (shift, scores, statistics, accumulation) of each allocation: the table's columns.
#: shift: None (FlashAttention-2), "pseudo" (PASA's shifting matrix) or "exact";
#: scores / stats / acc: "fp32" or "low" (the compute dtype).
TABLE = {
    "fa-fp32": (None, "fp32", "fp32", "fp32"),
    "fa-fp16s": (None, "low", "fp32", "fp32"),
    "fa-fp16": (None, "low", "low", "low"),
    "pasa": ("pseudo", "low", "low", "low"),
    "pasa-mixed": ("pseudo", "low", "fp32", "fp32"),
    "pasa-exact": ("exact", "low", "fp32", "fp32"),
}


# --------------------------------------------------------------------------- roundings


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (to nearest, ties to even), held in float32."""
    x = np.asarray(x, F32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = bits.astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, out).astype(F32)


def rounder(dtype: str):
    """The rounding to ``dtype`` ("fp16", "bf16" or "fp32") of float32 values."""
    if dtype == "fp16":
        return lambda x: np.asarray(x, F32).astype(np.float16).astype(F32)
    if dtype == "bf16":
        return _bf16
    return lambda x: np.asarray(x, F32)


def exp32(x) -> np.ndarray:
    return np.exp(np.asarray(x, F32).astype(F64)).astype(F32)


def log32(x) -> np.ndarray:
    return np.log(np.asarray(x, F32).astype(F64)).astype(F32)


def dot32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (m, k) @ b (k, n): exact products accumulated in fp32, in increasing k."""
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for t in range(a.shape[1]):
        acc = (acc + np.outer(a[:, t], b[t]).astype(F32)).astype(F32)
    return acc


def sum32(x: np.ndarray) -> F32:
    """Sum of a row in fp32, in index order."""
    acc = F32(0)
    for value in np.asarray(x, F32):
        acc = F32(acc + value)
    return acc


# --------------------------------------------------------------------------- β


def stored_shift_entries(beta: float, n: int, scale: float) -> tuple[float, float]:
    """The shifting matrix's diagonal scale (1 - β/n) and off-diagonal magnitude scale β/n,
    each rounded once to fp16 (docs/design.md, "Shifting the keys on the matrix engine")."""
    return float(np.float16(scale * (1.0 - beta / n))), float(np.float16(scale * beta / n))


def optimal_beta(beta0: float, n: int, scale: float) -> float:
    """The optimal accuracy condition of "Choosing β": β whose stored matrix applies the
    invariance β / (1 - β) the recovery multiplies by, by fixed-point iteration in fp64."""
    beta = beta0
    for _ in range(500):
        diag, off = stored_shift_entries(beta, n, scale)
        b = off / scale
        a = diag / scale + b
        applied = b * n / (a * (a - b * n)) + (1.0 - a) / a
        new = applied / (1.0 + applied)
        if abs(new - beta) <= 1e-13:
            return new
        beta = new
    raise RuntimeError(f"the optimal accuracy condition did not converge from {beta0}")


# --------------------------------------------------------------------------- one row


class _Row:
    """The online state of one query row (docs/design.md, "Recovering the bias online")."""

    def __init__(self, d_v: int, acc_round):
        self.m = F32(-np.inf)
        self.l = F32(0)
        self.o = np.zeros(d_v, F32)
        self.f = F32(0)        # PASA's pseudo-average of the shifted block means
        self.blocks = 0        # blocks this row has used
        self.acc_round = acc_round


def _block_max(s: np.ndarray, vis: np.ndarray, guard: bool, rnd) -> F32:
    """Maximum over the visible entries; with the guard, a repeated maximum moves the
    reference up (docs/design.md, "The rounding guard")."""
    rm = F32(s[vis].max())
    if not guard or not np.isfinite(rm) or np.count_nonzero(s[vis] == rm) < 2:
        return rm
    offset = (GUARD_FACTOR - 1.0) * rm if rm > 0 else -rm
    offset = F32(min(max(offset, GUARD_OFFSET_RANGE[0]), GUARD_OFFSET_RANGE[1]))
    return rnd(F32(rm + offset))[()]


def _fa_step(row, q, kb, vb, vis, scale, low, alloc, guard):
    _, scores, stats, _ = TABLE[alloc]
    r_low = rounder(low)
    s = dot32(q[None], kb.T)[0]
    if scores == "low":
        s = r_low(s)                       # unscaled scores leave the matmul in low precision
    if stats == "low":
        s = r_low(s * F32(scale))
        m_new = max(row.m, _block_max(s, vis, guard, r_low))
        a = r_low(exp32(r_low(row.m - m_new)))[()]
        p = np.where(vis, r_low(exp32(r_low(s - m_new))), F32(0))
        l_new = r_low(r_low(a * row.l) + r_low(sum32(p)))[()]
        pv = r_low(dot32(p[None], vb)[0])
        o_new = r_low(r_low(a * row.o) + pv)
    else:
        s = (s * F32(scale)).astype(F32)
        reference = _block_max(s, vis, guard, rounder("fp32"))
        m_new = max(row.m, reference)
        a = exp32(F32(row.m - m_new))[()]
        p = np.where(vis, exp32(s - m_new), F32(0))
        if reference != s[vis].max():   # a guarded row: l sums the weights P.V uses
            p = r_low(p)
        l_new = F32(F32(a * row.l) + sum32(p))
        pv = dot32(r_low(p)[None], vb)[0]       # P enters the matmul in the compute dtype
        o_new = (F32(a) * row.o + pv).astype(F32)
    row.m, row.l, row.o = F32(m_new), l_new, o_new


def _pseudo_step(row, q, kb, vb, vis, valid, gamma, alloc, guard, key_mean=None):
    stats = TABLE[alloc][2]
    r16 = rounder("fp16")
    r = r16 if stats == "low" else rounder("fp32")
    s = r16(dot32(q[None], kb.T)[0])        # S' = Q K'^T, fp16 out of the matmul
    if key_mean is None:
        mean = r(F32(sum32(s) / F32(valid)))    # rowsum(S') over the block's keys, masked or not
    else:  # the block mean from the keys: Q . mean16 of the unrounded K', an fp32 dot product
        mean = r(dot32(q[None], key_mean[:, None])[0, 0])
    m_loc = _block_max(s, vis, guard, r)
    p = np.where(vis, r(exp32(r(s - m_loc))), F32(0))
    l_loc = r(sum32(p))[()]
    n = F32(row.blocks + 1)
    f_new = r(r(r((n - F32(1)) * row.f) + mean) / n)[()]
    x = r(row.m + r(gamma * r(row.f - f_new)))[()]
    y = r(m_loc + r(gamma * r(mean - f_new)))[()]
    m_new = max(x, y)
    a = r(exp32(r(x - m_new)))[()]
    b = r(exp32(r(y - m_new)))[()]
    l_new = r(r(a * row.l) + r(b * l_loc))[()]
    pv = dot32(r16(p)[None], vb)[0]
    if stats == "low":
        o_new = r(r(a * row.o) + r(b * r(pv)))
    else:
        o_new = (F32(a) * row.o + (F32(b) * pv).astype(F32)).astype(F32)
    row.m, row.l, row.o, row.f = F32(m_new), F32(l_new), o_new, F32(f_new)


def _exact_step(row, q, kb, mean16, vb, vis, scale, guard):
    r16 = rounder("fp16")
    s = r16(dot32(q[None], kb.T)[0])                      # S' = Q K'^T, fp16
    c = F32(dot32(q[None], mean16[:, None])[0, 0] * F32(scale))  # thin fp32 column, scaled
    m_new = max(row.m, F32(_block_max(s, vis, guard, rounder("fp32")) + c))
    a = exp32(F32(row.m - m_new))[()]
    p = np.where(vis, r16(exp32(s - F32(m_new - c))), F32(0))  # fp32 argument, fp16 P'
    l_new = F32(F32(a * row.l) + sum32(p))
    pv = r16(dot32(p[None], vb)[0])                       # the P'V tile in fp16
    o_new = (F32(a) * row.o + pv).astype(F32)             # the running sum in fp32
    row.m, row.l, row.o = F32(m_new), l_new, o_new


# --------------------------------------------------------------------------- keys


def _blocks(x: np.ndarray, kv_len: int, n: int) -> np.ndarray:
    """(S2, D) -> (blocks, n, D), rows from kv_len on zero: the padded last block."""
    count = max(1, -(-x.shape[0] // n))
    padded = np.zeros((count * n, x.shape[1]), F32)
    padded[:kv_len] = x[:kv_len]
    return padded.reshape(count, n, x.shape[1])


def _valid_keys(kv_len: int, count: int, n: int) -> list[int]:
    """How many keys each of ``count`` blocks of ``n`` rows holds (v < n: part-filled)."""
    return [min(max(kv_len - j * n, 0), n) for j in range(count)]


def _pseudo_shift(block: np.ndarray, v: int, beta: float, scale: float) -> np.ndarray:
    """K' of one block holding ``v`` keys (docs/design.md, "Shifting the keys on the matrix
    engine"). With the stored entries σa (diagonal plus off-diagonal magnitude) and σb (the
    off-diagonal magnitude): a full block is fp16(M_fl^T K) with the stored fp16 matrix
    M_fl = σ(aI − bJ); a part-filled one is shifted by the v×v matrix σ(aI − (bn/v)J),
    entries in fp32, applied in fp32 to its v keys and rounded to fp16 once, as if its
    n − v missing rows were the mean of its keys; its padded rows are 0."""
    n = block.shape[0]
    diag, off = stored_shift_entries(beta, n, scale)
    shifted = np.zeros_like(block)
    if v == 0:
        return shifted
    if v == n:
        m = np.full((n, n), -off, F32)
        np.fill_diagonal(m, diag)
    else:
        sigma_a, sigma_bn_v = diag + off, off * n / v
        m = np.full((v, v), -sigma_bn_v, F32)
        np.fill_diagonal(m, F32(sigma_a - sigma_bn_v))
    shifted[:v] = rounder("fp16")(dot32(m.T, block[:v]))
    return shifted


def _exact_shift(block: np.ndarray, v: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """K' = fp16(σ(K − k̃)) on the block's ``v`` keys, 0 on its padded rows, and
    k̃ = fp16(Σ keys / v), the column sum in fp32 over its keys only (docs/design.md,
    "pasa-exact: carrying the shift exactly", "A part-filled last block")."""
    r16 = rounder("fp16")
    mean = r16(np.array([sum32(col[:v]) for col in block.T], F32) / F32(max(v, 1)))
    shifted = r16(((block - mean[None, :]).astype(F32) * F32(scale)).astype(F32))
    shifted[v:] = 0
    return shifted, mean


def _pseudo_key_mean(block: np.ndarray, v: int, beta: float, scale: float) -> np.ndarray:
    """The block mean from the keys (docs/design.md, "The block mean from the keys"): the
    column mean of the unrounded K' over the block's ``v`` keys, r·colsum(K)/v with
    r = diag − (n − 1)·off the row sum of the stored matrix (the v×v matrix of a part-filled
    block has the same), rounded to fp16: fp16(fp32(colsum) · fp32(r / v)), the column sum in
    fp32."""
    n = block.shape[0]
    diag, off = stored_shift_entries(beta, n, scale)
    r = F32(F64(diag) - (n - 1) * F64(off))
    colsum = np.array([sum32(col[:v]) for col in block.T], F32)
    return rounder("fp16")(colsum * F32(r / F32(max(v, 1))))


def _shift_keys(kb: np.ndarray, valid: list[int], shift: str, beta: float, scale: float,
                key_means: bool = False):
    """Per block: K' (pseudo-average or exact shift) and the rounded column means: k̃ of K
    for the exact shift; with ``key_means`` the mean of the unrounded K' for the
    pseudo-average one (else None)."""
    if shift == "pseudo":
        means = np.stack([_pseudo_key_mean(b, v, beta, scale) for b, v in zip(kb, valid)]) if key_means else None
        return np.stack([_pseudo_shift(b, v, beta, scale) for b, v in zip(kb, valid)]), means
    pairs = [_exact_shift(b, v, scale) for b, v in zip(kb, valid)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


# --------------------------------------------------------------------------- attention


def attention(q, k, v, *, algorithm: str, scale: float, kv_block: int, visible, kv_lens,
              beta: float | None = None, guard: bool = False, input_dtype: str = "fp16",
              key_means: bool = False):
    """Attention of (B, Nq, S1, D) queries over (B, Nkv, S2, D) keys and values, given as
    float32 arrays holding ``input_dtype`` values, with the allocation ``algorithm``.

    ``visible`` (B, S1, S2) bool: which keys each row attends to; ``kv_lens`` the valid key
    count per batch (keys from there on are the zero padding of the last block). Returns
    the output (B, Nq, S1, Dv) rounded to ``input_dtype`` and the fp32 LSE (B, Nq, S1); a
    row that sees no key gives 0 and -inf. ``key_means``: the pseudo-average shift takes its
    block means from the keys (the AscendC kernels' numerics where they form K').
    """
    shift, _, stats, acc = TABLE[algorithm]
    low = "fp16" if shift else input_dtype     # PASA computes in fp16, whatever the input
    r_low = rounder(low)
    q, k, v = (r_low(np.asarray(t, F32)) for t in (q, k, v))
    batch, n_q, s1, _ = q.shape
    group = n_q // k.shape[1]
    if shift == "exact":
        beta = 1.0
    elif shift == "pseudo":
        beta = optimal_beta(BETA0, kv_block, scale) if beta is None else beta
    gamma = beta / (1.0 - beta) if shift == "pseudo" else 0.0
    gamma = F32(float(np.float16(gamma)) if stats == "low" else gamma)
    out = np.zeros((batch, n_q, s1, v.shape[3]), F32)
    lse = np.full((batch, n_q, s1), -np.inf, F32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            for h in range(n_q):
                kb = _blocks(k[b, h // group], int(kv_lens[b]), kv_block)
                vb = _blocks(v[b, h // group], int(kv_lens[b]), kv_block)
                valid = _valid_keys(int(kv_lens[b]), kb.shape[0], kv_block)
                means = None
                if shift:
                    kb, means = _shift_keys(kb, valid, shift, beta, scale, key_means)
                for i in range(s1):
                    vis = _blocks(np.asarray(visible[b, i], F32)[:, None], visible.shape[2],
                                  kv_block)[..., 0] > 0
                    row = _Row(v.shape[3], rounder(low if acc == "low" else "fp32"))
                    for j in range(kb.shape[0]):
                        if not vis[j].any():
                            continue      # a row that sees no key of a block keeps its state
                        if shift is None:
                            _fa_step(row, q[b, h, i], kb[j], vb[j], vis[j], scale, low,
                                     algorithm, guard)
                        elif shift == "pseudo":
                            _pseudo_step(row, q[b, h, i], kb[j], vb[j], vis[j], valid[j],
                                         gamma, algorithm, guard,
                                         None if means is None else means[j])
                        else:
                            _exact_step(row, q[b, h, i], kb[j], means[j], vb[j], vis[j],
                                        scale, guard)
                        row.blocks += 1
                    if row.blocks:
                        out[b, h, i] = rounder(input_dtype)((row.o / row.l).astype(F32))
                        true_max = F32(row.m + F32(gamma * row.f))
                        lse[b, h, i] = F32(true_max + log32(row.l))
    return out, lse
