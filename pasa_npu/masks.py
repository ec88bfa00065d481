"""torch_npu's masks and sparse modes as what the backends take: an explicit boolean mask
(B or 1, S1, S2) and/or a per-batch band of visible keys (sparse modes 2-4 never build an
S1 x S2 mask)."""
from __future__ import annotations

import warnings

import torch

from .arguments import INT_MAX, describe
from .tensor_memo import TensorMemo
from .problem import device_cached

OPTIMIZED_MASK_SIZE = 2048

# optimized masks already checked: no device sync. Inference tensors too (a serving loop
# may make its mask under inference mode): sparse modes 2-4 compute from the band, so a
# later write to such a mask, which no version counter sees, changes no output.
_VALIDATED_MASKS = TensorMemo(inference_tensors=True)


def compressed_causal_mask(device: torch.device | str | None = None) -> torch.Tensor:
    """The 2048 x 2048 "optimized" mask torch_npu expects with ``sparse_mode`` 2, 3 and 4;
    a normal tensor also under ``torch.inference_mode``, so that calls remember it checked."""
    with torch.inference_mode(False):
        ones = torch.ones(OPTIMIZED_MASK_SIZE, OPTIMIZED_MASK_SIZE, dtype=torch.bool,
                          device=device)
        return torch.triu(ones, diagonal=1)


@device_cached(maxsize=None)
def _reference_mask(device: torch.device) -> torch.Tensor:
    """:func:`compressed_causal_mask` on ``device``, what an optimized mask is checked against."""
    return compressed_causal_mask(device)


def mask_and_band(mask, sparse_mode: int, pre: int, nxt: int, batch, s_q, s_kv, packed, q_lens,
                  kv_lens, device):
    """(mask (Bm, S1, S2) bool or None, band (pre, next) per batch in top-left
    coordinates or None) for torch_npu's sparse_mode semantics: ``mask`` the call's
    ``atten_mask``, ``sparse_mode``, ``pre`` and ``nxt`` its checked ints
    (:class:`~pasa_npu.options.Options`)."""
    tokens_given = (pre, nxt) != (INT_MAX, INT_MAX)
    check_mask(mask, device)

    if sparse_mode in (2, 3, 4):
        check_optimized_mask(mask, sparse_mode)
        if s_q == 1:
            if sparse_mode != 3:
                warnings.warn(f"sparse_mode={sparse_mode} has no effect when the query length is "
                              f"1 (torch_npu ignores it in decode); every valid key is attended")
            return None, None
        if sparse_mode == 4:
            _check_tokens(pre, nxt)
            _check_token_lengths(4, pre, nxt, q_lens, kv_lens)
        return None, band_of_lengths(sparse_mode, pre, nxt, q_lens, kv_lens)

    if mask is None:
        if sparse_mode == 1:
            raise ValueError("sparse_mode=1 (allMask) needs the full atten_mask, got None")
        if tokens_given:
            warnings.warn("pre_tokens/next_tokens have no effect with sparse_mode=0 and no "
                          "atten_mask (torch_npu ignores them too)")
        return None, None
    if packed:
        raise ValueError(f"packed layouts (TND) take sparse_mode 0 without atten_mask or 2-4 "
                         f"with the optimized mask, as torch_npu; got sparse_mode={sparse_mode} "
                         f"with an atten_mask")
    dense = _dense_mask(mask, batch, s_q, s_kv)
    if not s_kv:  # no key for the mask to hide: every row is empty
        return None, None
    if sparse_mode == 1 or not tokens_given:
        if sparse_mode == 1 and tokens_given:
            warnings.warn("pre_tokens/next_tokens have no effect with sparse_mode=1")
        return dense, None
    if s_q == 1:
        warnings.warn("pre_tokens/next_tokens have no effect when the query length is 1 "
                      "(torch_npu ignores them in decode)")
        return dense, None
    _check_tokens(pre, nxt)
    _check_token_lengths(0, pre, nxt, q_lens, kv_lens)
    return dense, band_of_lengths(0, pre, nxt, q_lens, kv_lens)


def band_of_lengths(sparse_mode: int, pre: int, nxt: int, q_lens: torch.Tensor,
                    kv_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The band (pre, next) per batch in top-left coordinates, on the lengths' device, of
    ``sparse_mode`` 0 with tokens (a band beside the mask), 2 (top-left causal), 3
    (bottom-right causal) or 4 (``pre``/``nxt`` tokens about the bottom-right diagonal)."""
    if sparse_mode == 0:
        return torch.full_like(q_lens, pre), torch.full_like(q_lens, nxt)
    if sparse_mode == 2:
        return torch.full_like(q_lens, INT_MAX), torch.zeros_like(q_lens)
    if sparse_mode == 3:
        return torch.full_like(q_lens, INT_MAX), kv_lens - q_lens
    return pre - kv_lens + q_lens, nxt + kv_lens - q_lens


def token_lengths_refused(sparse_mode: int, pre: int, nxt: int, q_lens: torch.Tensor,
                          kv_lens: torch.Tensor) -> torch.Tensor:
    """Bool per batch: FIA's prompt tiling refuses the batch's lengths with these tokens
    (ops-transformer prompt_flash_attention_tiling.cpp): a negative token count whose
    magnitude reaches a length; sparse_mode=0 with a mask bounds next_tokens by the query
    length and pre_tokens by the kv length, sparse_mode=4, whose band sits at the bottom
    right, the other way round (other modes: none refused)."""
    limits = {0: (nxt, q_lens, pre, kv_lens), 4: (nxt, kv_lens, pre, q_lens)}.get(sparse_mode)
    if limits is None:
        return torch.zeros_like(q_lens, dtype=torch.bool)
    next_limit, next_len, pre_limit, pre_len = limits
    return (((next_limit < 0) & (-next_limit >= next_len))
            | ((pre_limit < 0) & (-pre_limit >= pre_len)))


def check_mask(mask, device) -> None:
    """atten_mask's type, dtype and device (metadata only: fake tensors pass through)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"atten_mask must be a tensor or None, got {describe(mask)}")
    if mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        raise TypeError(f"atten_mask must be bool, int8 or uint8, got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"atten_mask is on {mask.device} but query is on {device}")


def _check_tokens(pre: int, nxt: int) -> None:
    if pre < 0 and nxt < 0:
        raise ValueError(f"pre_tokens ({pre}) and next_tokens ({nxt}) cannot both be negative")
    if -nxt > pre:
        raise ValueError(f"the band is empty: -next_tokens ({-nxt}) exceeds pre_tokens ({pre})")


def _check_token_lengths(sparse_mode: int, pre: int, nxt: int, q_lens, kv_lens) -> None:
    """Raise for the first batch whose host lengths :func:`token_lengths_refused` refuses."""
    refused = token_lengths_refused(sparse_mode, pre, nxt, q_lens, kv_lens).nonzero()
    if not refused.numel():
        return
    b = int(refused[0, 0])
    q, kv = int(q_lens[b]), int(kv_lens[b])
    limits = {0: (("next_tokens", nxt, q, "query"), ("pre_tokens", pre, kv, "kv")),
              4: (("next_tokens", nxt, kv, "kv"), ("pre_tokens", pre, q, "query"))}
    for name, value, length, what in limits[sparse_mode]:
        if value < 0 and -value >= length:
            raise ValueError(f"{name} ({value}) must be > -{length} with sparse_mode="
                             f"{sparse_mode}: its magnitude must stay below the {what} "
                             f"length of batch {b} ({length}), as torch_npu requires")


def check_optimized_mask(mask, sparse_mode: int) -> None:
    """``mask`` (sparse modes 2-4) is torch_npu's optimized mask: its shape, and its contents
    once per version of the tensor (:class:`~pasa_npu.tensor_memo.TensorMemo`)."""
    n = OPTIMIZED_MASK_SIZE
    if mask is None:
        raise ValueError(f"sparse_mode={sparse_mode} needs torch_npu's optimized {n}x{n} "
                         f"atten_mask (pasa_npu.compressed_causal_mask()), got None")
    if mask.shape not in ((n, n), (1, n, n), (1, 1, n, n)):
        raise ValueError(f"sparse_mode={sparse_mode} needs the optimized mask of shape ({n}, {n}), "
                         f"(1, {n}, {n}) or (1, 1, {n}, {n}); got {tuple(mask.shape)}")
    if not _VALIDATED_MASKS.get(mask):
        if not torch.equal(mask.reshape(n, n).bool(), _reference_mask(mask.device)):
            raise ValueError(f"sparse_mode={sparse_mode} needs the optimized mask to be the "
                             f"strict upper triangle (True above the diagonal), as torch_npu "
                             f"documents")
        _VALIDATED_MASKS.put(mask, True)


def _dense_mask(mask: torch.Tensor, batch: int, s_q: int, s_kv: int) -> torch.Tensor:
    shape = tuple(mask.shape)
    if mask.dim() == 2:
        m = mask.unsqueeze(1) if s_q == 1 else mask.unsqueeze(0)
    elif mask.dim() == 3:
        m = mask
    elif mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"atten_mask of 4 dims must be (B or 1, 1, S1, S2); got {shape}")
        m = mask[:, 0]
    else:
        raise ValueError(f"atten_mask must have 2, 3 or 4 dims, got shape {shape}")
    if m.shape[0] not in (1, batch) or m.shape[1] < s_q or m.shape[2] < s_kv:
        expected = ("(B, S2), (B, 1, S2) or (B, 1, 1, S2)" if s_q == 1 else
                    "(S1, S2), (B|1, S1, S2) or (B|1, 1, S1, S2)")
        raise ValueError(f"atten_mask shape {shape} does not fit batch={batch}, S1={s_q}, "
                         f"S2={s_kv}: expected {expected} with S1, S2 at least the query and key "
                         f"lengths")
    return m[:, :s_q, :s_kv].bool()


def row_facts(q_lens: torch.Tensor, kv_lens: torch.Tensor, mask, band, packed: bool,
              s_q: int) -> dict:
    """The plan's facts about rows, from the lengths, mask and band (as Python ints: a
    decode step's worth of tensor operations would cost more than the rest of the
    lengths): ``covered`` (every output row is a backend's), ``lse_rows_past`` (some LSE row
    lies past its query length), ``may_have_empty`` (some row inside its query length may
    see no key)."""
    lens = q_lens.tolist()
    return dict(covered=not packed and all(n == s_q for n in lens),
                lse_rows_past=not packed and any(n < s_q for n in lens),
                may_have_empty=mask is not None or may_have_empty_rows(lens, kv_lens.tolist(),
                                                                        band))


def may_have_empty_rows(q_lens: list, kv_lens: list, band) -> bool:
    """Can a row inside its query length see no key (band and lengths only)? O(B) in
    Python ints: a few per batch, cheaper than tensor operations on a decode step. Row i
    sees [max(0, i - pre), min(kv_len - 1, i + next)]."""
    pres, nxts = (t.tolist() for t in band) if band is not None else ((), ())
    for b, (q, kv) in enumerate(zip(q_lens, kv_lens)):
        if q > 0 and (kv == 0 or (band is not None and (nxts[b] < 0 or q - 1 - pres[b] > kv - 1))):
            return True
    return False
