"""The suite's derived bounds: a Triton (or Gluon) result against the CPU backend's same
allocation, in ulps at each row's scale, bounded by what may round differently between the
two (the comment below); the ulp metrics they are stated in. The same bounds hold the
AscendC kernels' emulation to the CPU backend, and the CPU backend to itself over another
query tiling (torch's matmuls over another number of rows sum in another order on some
CPUs): :func:`assert_same_allocation`."""
from __future__ import annotations

import contextlib
import math

import torch

import pasa_npu
from _support import dtype_name, record
from pasa_npu.arguments import OWN_KEYWORDS
from pasa_npu.beta import default_beta, ideal_invariance


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at |x| (float64)."""
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]
    tiny = 2.0 ** -14 if dtype == torch.float16 else 2.0 ** -126   # the smallest normal
    return torch.exp2(torch.floor(torch.log2(x.double().abs().clamp_min(tiny))) - mant)


def row_scale_ulps(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference, in units in the last place (of ``ref``'s dtype) of the
    largest magnitude of its row (the last axis): a row is rescaled as a whole, so a
    difference in one statistic moves all of its elements by a share of that scale."""
    scale = ref.double().abs().amax(-1, keepdim=True)
    diff = (actual.double() - ref.double()).abs() / ulp(scale, ref.dtype)
    return float(diff[torch.isfinite(diff)].max()) if diff.numel() else 0.0


# --------------------------------------------------------------------------- derived bounds
#
# Triton (the interpreter or a GPU) against the torch backend, the same allocation. Both take
# the same roundings in the same order (pasa_npu/numerics.py); what may differ is
#  (a) fp32 sums in another order (QK^T, PV, K's block means, the row sums: numpy, tensor
#      cores, torch's CPU kernels), exp and log by an ulp (numpy's, the GPU's ex2.approx,
#      SLEEF, glibc) and decode's fp32 merge of splits: fp32 values a few fp32 ulps apart;
#  (b) so any rounding of such a value to the compute dtype (fp16/bf16) can go the other way
#      ("flip"): by one ulp of the rounded value, as the two values straddle one midpoint.
# Which CPU runs them decides which roundings flip, so a bound must allow every rounding
# that can flip its own ulp. N is the number of kv blocks a row walks (max over the case).
#
# Output, in ulps of the output dtype at each row's largest magnitude (row_scale_ulps):
#   E + rho * (2 T + 3 sqrt(N) R)
#   E: the final rounding to the output dtype: 1 (a few fp32 ulps apart: one ulp of the
#      element at most, at most one of its row's scale); 2 for bf16 under Triton's
#      interpreter, whose conversion to bf16 truncates (numpy has no bf16) where torch rounds
#      to nearest;
#   T: the kinds of tile the allocation rounds to the compute dtype (scores S or S', P or P',
#      PASA's shifted keys K', pasa-exact's P'V tile). A flip moves one key's (one block's)
#      weight by an ulp; the weights are normalised by l, so the flips of one kind across a
#      row move its output by at most one ulp of |v - o| <= 2 max|v|: 2 ulps of the row's
#      scale per kind, for V of the row's scale (the suite's inputs);
#   R: 1 where the running output and l are fp16 (fa-fp16, pasa): per block their 3
#      roundings (a O, the new tile, their sum) can flip, one ulp each, and persist. Worst
#      case 3 N; the roundings of different blocks are independent and unbiased, so they add
#      like sqrt(N) (Higham and Mary's probabilistic bound, lambda sqrt(N) u): 3 sqrt(N);
#   rho: the compute dtype's ulp in the output dtype's (1/8 for PASA with bf16 inputs, which
#      computes in fp16 and rounds to bf16 once at the end; else 1).
# LSE, in ulps of its scale L = max(1, largest finite |LSE| of the case) (log l's errors are
# absolute, hence at least 1):
#   fa-fp32 (fp32 scores and statistics): 4 fp32 ulps: QK^T summed in another order (an ulp
#     of the scores, each way) and exp, the row sums and log (an ulp each way);
#   else ulps of the compute dtype, A + B / 2^floor(log2 L), counting the roundings that feed
#     the LSE, the tiles once per kind as for the outputs. A: roundings of a score-sized value
#     (a score, a shifted key, the final m, PASA's final F with gamma F within L), each moving
#     the LSE by at most an ulp of L (a score by its share of the row's weight times its ulp);
#     B: relative roundings of a weight (P, P', exp's argument, l), each moving log l by at
#     most 2 u = 2^-floor(log2 L) ulps of L. fa-fp16s: S (1, 0); pasa-mixed: K', S' (2, 0);
#     pasa-exact: S', P' (1, 1) (its K block means flip the shift, which the exact fp32 row
#     constant undoes); fa-fp16: S (m is one of them), exp's argument, P, l (1, 3); pasa: K',
#     S', m, F, P', l (4, 2). An earlier block's flip of m, F or l moves the next block's
#     re-basing factors a, b with it, so it reaches the LSE through the final values only:
#     the LSE bound does not grow with N.
#   pasa, pasa-mixed also recover the shift: LSE = m + gamma F + log l, F the mean of the
#     blocks' shifted-score means. A flip of one shifted score s'_j (or of a K' entry under
#     it) by its ulp moves its block's mean by 1/n of that, n the keys the block holds, and
#     the LSE by gamma / n times it: in a part-filled block (few keys) that outweighs the
#     rest. Those two kinds add 2 gamma / n ulps of the block's shifted scores, the largest
#     over the case's block sizes n. Those scores are centred on the block's keys:
#     s'_j = s_j - mean s + (1 - beta) mean s, so |s'_j| <= 2 S (n - 1) / n + (1 - beta) S,
#     S the largest |score| of the case, taken as max(|LSE(Q)|, |LSE(-Q)|) of the fp64
#     golden (max s <= LSE <= max s + log keys).
# "Share" metrics (the fraction of outputs, of LSE values, that differ at all) have no bound:
# one flipped statistic (a row's m, a block's l) moves a whole row, one flipped K' every row
# that reads the key, and a log an ulp apart every LSE. They are recorded as information. So
# a rounding dropped from a kernel, which moves values by no more than a flip of it does, is
# not caught by these bounds: tests/fallback/triton/test_triton_exact_inputs.py catches such a drop on inputs
# where nothing can flip, and the kernels must equal the torch backend bit for bit.
#
# tests/measured.json keeps what the tests measured (triton-out-ulps, triton-lse) and the
# bounds they were held to (triton-out-bound, triton-lse-bound, with its shift term
# triton-lse-shift-gain). test_golden.py checks that one flip attains the shift term, and
# that no derived bound less that term exceeds 10 x the largest measured in its family
# (kernel, path, dtype, allocation), or 10 x a floor where nothing flipped: 1 ulp for outputs (the final rounding), 1/4 unit for LSEs in
# compute-dtype ulps (a flip of a value with a quarter of its row's weight), 1 fp32 ulp for
# fa-fp32's LSE.

OUT_TILE_KINDS = {"fa-fp32": 0, "fa-fp16s": 2, "fa-fp16": 2, "pasa": 3, "pasa-mixed": 3,
                  "pasa-exact": 3}
LSE_ROUNDINGS = {"fa-fp32": (4, 0), "fa-fp16s": (1, 0), "fa-fp16": (1, 3), "pasa": (4, 2),
                 "pasa-mixed": (2, 0), "pasa-exact": (1, 1)}  # (A, B)
FLOORS = {"triton-out-ulps": 1.0, "triton-lse": 0.25, "triton-lse/fa-fp32": 1.0}


def lse_unit(algorithm: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype in whose ulps an allocation's LSE is bounded: fp32 where scores and
    statistics are fp32 (fa-fp32), else the compute dtype."""
    if algorithm == "fa-fp32":
        return torch.float32
    return pasa_npu.numerics.compute_dtype(pasa_npu.ALLOCATIONS[algorithm], dtype)


def out_bound(algorithm: str, dtype: torch.dtype, kv_blocks: int,
              interpreter: bool = False) -> float:
    """Derived bound on row_scale_ulps(triton, torch) for ``algorithm`` (comment above);
    ``interpreter``: Triton ran under its CPU interpreter."""
    alloc = pasa_npu.ALLOCATIONS[algorithm]
    rho = float(ulp(torch.tensor(1.0), pasa_npu.numerics.compute_dtype(alloc, dtype))
                / ulp(torch.tensor(1.0), dtype))
    running = 3 * math.sqrt(kv_blocks) if alloc.low_accumulator else 0.0
    final = 2 if interpreter and dtype == torch.bfloat16 else 1
    return final + rho * (2 * OUT_TILE_KINDS[algorithm] + running)


def lse_bound(algorithm: str, scale: float, shift_gain: float = 0.0) -> float:
    """Derived bound on lse_scale_ulps(triton, torch) at LSE scale ``scale`` (lse_scale), in
    lse_unit's ulps (comment above); ``shift_gain``: the pseudo-average shift's term
    (shift_gain), 0 for the other allocations."""
    a, b = LSE_ROUNDINGS[algorithm]
    return a + b / 2.0 ** math.floor(math.log2(scale)) + shift_gain


def block_key_counts(kv_lens, kv_block: int) -> set:
    """How many keys the kv blocks of rows of ``kv_lens`` keys hold (a part-filled last
    block holds the remainder)."""
    counts = {n % kv_block or kv_block for n in kv_lens if n > 0}
    return counts | ({kv_block} if any(n > kv_block for n in kv_lens) else set())


def score_scale(q, k, v, keywords: dict) -> float:
    """S = max(|LSE(Q)|, |LSE(-Q)|) of the fp64 golden for a fused_attention call: at least
    the largest |score| of the case (and at most it plus log keys)."""
    torch_npu_keywords = {name: value for name, value in keywords.items()
                          if name not in OWN_KEYWORDS}
    torch_npu_keywords["softmax_lse_flag"] = True
    largest = 1.0
    for sign in (1, -1):
        lse = pasa_npu.reference_attention(sign * q.cpu(), k.cpu(), v.cpu(),
                                           **{n: (t.cpu() if torch.is_tensor(t) else t)
                                              for n, t in torch_npu_keywords.items()})[1]
        rows = _lse_rows(lse)
        if rows.any():
            largest = max(largest, float(lse[rows].abs().max()))
    return largest


def v1_keywords(v2: dict) -> dict:
    """The v1 keywords of a packed (TND) fused_attention_v2 call's problem without its sink,
    for :func:`score_scale`. A sink bounds what the comparisons allow no further: it joins
    in fp32, and its weight only dilutes each row's error of the LSE."""
    own = ("sparse_mode", "atten_mask", "pre_tokens", "next_tokens", "kv_block", "beta")
    return dict(num_heads=v2["num_query_heads"], num_key_value_heads=v2["num_key_value_heads"],
                input_layout="TND", scale=v2["softmax_scale"],
                actual_seq_lengths=v2["actual_seq_qlen"],
                actual_seq_lengths_kv=v2["actual_seq_kvlen"], softmax_lse_flag=True,
                **{n: v2[n] for n in own if n in v2})


def shift_gain(algorithm: str, dtype: torch.dtype, lse_scale_: float, scores: float,
               block_keys: set, beta: float) -> float:
    """The pseudo-average shift's LSE term (comment above), in lse_unit's ulps at the LSE
    scale: the largest over the block sizes n of 2 gamma / n ulps of the block's shifted
    scores; 0 for allocations without that shift."""
    if not pasa_npu.ALLOCATIONS[algorithm].pseudo_average_shift:
        return 0.0
    unit = lse_unit(algorithm, dtype)
    gamma = ideal_invariance(beta)
    unit_at_l = ulp(torch.tensor(lse_scale_), unit)

    def gain(n):
        shifted = 2 * scores * (n - 1) / n + (1 - beta) * scores
        return 2 * gamma / n * float(ulp(torch.tensor(shifted), unit) / unit_at_l)
    return max(gain(n) for n in block_keys)


def call_shift_gain(algorithm: str, dtype: torch.dtype, lse_scale_: float, call: tuple,
                    kv_lens, kv_block: int) -> float:
    """:func:`shift_gain` of a fused_attention ``call`` (q, k, v, keywords) whose rows hold
    ``kv_lens`` keys in kv blocks of ``kv_block``; 0 for allocations without the
    pseudo-average shift."""
    if not pasa_npu.ALLOCATIONS[algorithm].pseudo_average_shift:
        return 0.0
    q, k, v, keywords = call
    beta = keywords.get("beta") or default_beta(kv_block, keywords.get("scale", 1.0))
    return shift_gain(algorithm, dtype, lse_scale_, score_scale(q, k, v, keywords),
                      block_key_counts([int(n) for n in kv_lens], kv_block), beta)


def assert_same_allocation(out, lse, ref, ref_lse, algorithm: str, what: str, *, call: tuple,
                           kv_lens, kv_block: int = 128) -> None:
    """Two results of one allocation whose fp32 sums may run in another order (another
    implementation, or torch's CPU matmuls over another number of rows, which on some CPUs
    sum in another order): the same NaN and -inf patterns, the output and the LSE within the
    derived bounds of the comment above, which hold on any CPU."""
    _assert_within(_derived_errors(out, lse, ref, ref_lse, algorithm, what, call=call,
                                   kv_lens=kv_lens, kv_block=kv_block), what)


def _derived_errors(out, lse, ref, ref_lse, algorithm: str, what: str, *, call: tuple, kv_lens,
                    kv_block: int, interpreter: bool = False) -> dict:
    """The same NaN and -inf patterns checked; the output's and the LSE's differences
    (row_scale_ulps, lse_scale_ulps) and their derived bounds, for rows of ``kv_lens`` keys
    in kv blocks of ``kv_block``."""
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), f"{what}: NaN pattern differs"
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse)), f"{what}: LSE -inf pattern"
    kv_lens = [int(n) for n in kv_lens]
    unit = lse_unit(algorithm, ref.dtype)
    scale = lse_scale(ref_lse)
    gain = call_shift_gain(algorithm, ref.dtype, scale, call, kv_lens, kv_block)
    return dict(out_ulps=row_scale_ulps(out, ref), lse=lse_scale_ulps(lse, ref_lse, unit),
                unit=unit, scale=scale, shift_gain=gain, lse_bound=lse_bound(algorithm, scale, gain),
                out_bound=out_bound(algorithm, ref.dtype, -(-max(kv_lens) // kv_block),
                                    interpreter=interpreter))


def _assert_within(errors: dict, what: str) -> None:
    """The differences of :func:`_derived_errors` within their bounds."""
    assert errors["out_ulps"] <= errors["out_bound"], (
        f"{what}: output {errors['out_ulps']:.4g} ulps of its row's scale exceed the derived "
        f"{errors['out_bound']:.3g}")
    assert errors["lse"] <= errors["lse_bound"], (
        f"{what}: LSE {errors['lse']:.4g} {dtype_name(errors['unit'])} ulps of its scale "
        f"exceed the derived {errors['lse_bound']:.3g}")


def _lse_rows(ref_lse: torch.Tensor) -> torch.Tensor:
    """The LSE entries that are values (rows past a length may hold fp32's largest)."""
    return torch.isfinite(ref_lse) & (ref_lse.abs() < torch.finfo(torch.float32).max)


def lse_scale(ref_lse: torch.Tensor) -> float:
    """L = max(1, the largest |LSE| of a case)."""
    rows = _lse_rows(ref_lse)
    return max(1.0, float(ref_lse[rows].double().abs().max())) if rows.any() else 1.0


def lse_scale_ulps(lse: torch.Tensor, ref_lse: torch.Tensor, unit: torch.dtype) -> float:
    """The largest LSE difference in ulps of ``unit`` at L = lse_scale(ref_lse)."""
    rows = _lse_rows(ref_lse)
    if not rows.any():
        return 0.0
    diff = (lse - ref_lse)[rows].double().abs().max()
    return float(diff / ulp(torch.tensor(lse_scale(ref_lse)), unit))


def triton_numerics(path: str):
    """The context in which the CPU backend computes what a Triton result of ``path``
    ("prefill", "decode") is held against: decode shifting PASA's scores, as the Triton
    decode kernel does under the active ``Tuning.decode_shift`` "scores" (the default),
    shifts them in the CPU backend too
    (:func:`pasa_npu.fallback.torch.blockwise.shifting_scores`)."""
    from pasa_npu.fallback.torch import blockwise as torch_blockwise
    from pasa_npu.fallback.triton import tuning as triton_tuning
    if path == "decode" and triton_tuning.active().decode_shift == "scores":
        return torch_blockwise.shifting_scores()
    return contextlib.nullcontext()


def ascendc_numerics(tiling: dict):
    """The context in which the CPU backend computes what an AscendC kernel result is held
    against, from the host's ``tiling`` of that call (``last_run_stats()["tiling"]``): where it
    shifts the scores (``shift_scores``: pasa and pasa-exact in decode, where every query length
    is 1 and every kv block is read by one task), the CPU backend shifts them too
    (:func:`pasa_npu.fallback.torch.blockwise.shifting_scores`); where it forms K'
    (``row_constants``), pasa's block means come from the keys in both
    (:func:`pasa_npu.fallback.torch.blockwise.block_means_from_keys`)."""
    from pasa_npu.fallback.torch import blockwise as torch_blockwise
    if tiling.get("shift_scores"):
        return torch_blockwise.shifting_scores()
    if tiling.get("row_constants"):
        return torch_blockwise.block_means_from_keys()
    return contextlib.nullcontext()


def assert_triton_matches_cpu(out, lse, ref, ref_lse, algorithm: str, case: str,
                              path: str = "prefill", kernel: str = "triton", what: str = "",
                              *, call: tuple, kv_lens, kv_block: int = 128) -> None:
    """A Triton result against the CPU backend's same allocation: the same NaN and -inf
    patterns, the output and the LSE within their derived bounds (comment above) for rows
    of ``kv_lens`` keys in kv blocks of ``kv_block``; ``call``: (q, k, v, keywords) of the
    fused_attention call, for the case's score scale. Each value measured and each bound is
    recorded under ``case`` (a name for the inputs and the call), ``path`` ("prefill",
    "decode") and ``kernel`` ("triton", "gluon")."""
    kind = "interpreter" if out.device.type == "cpu" else "cuda"
    key = f"{kind}/{kernel}/{path}/{dtype_name(ref.dtype)}/{algorithm}/{case}"
    out, lse = out.cpu(), lse.cpu()
    errors = _derived_errors(out, lse, ref, ref_lse, algorithm, what, call=call,
                             kv_lens=kv_lens, kv_block=kv_block,
                             interpreter=kind == "interpreter")
    finite = torch.isfinite(ref_lse)
    record("triton-out-share", key, ((out != ref) & ~torch.isnan(ref)).double().mean().item())
    record("triton-lse-share", key, float(((lse != ref_lse) & finite).sum()
                                          / finite.sum().clamp_min(1)))
    for field, metric in (("out_ulps", "triton-out-ulps"), ("lse", "triton-lse"),
                          ("scale", "triton-lse-scale"), ("out_bound", "triton-out-bound"),
                          ("shift_gain", "triton-lse-shift-gain"),
                          ("lse_bound", "triton-lse-bound")):
        record(metric, key, errors[field])
    _assert_within(errors, f"{what} {key}")
