"""One call of the AscendC kernels of ``ascend_kernels/`` on CPU tensors, whatever runs it.

The two CPU backends of the kernels, ``ascendc-emu`` (:mod:`pasa_npu.ascendc_emu`: the
project's emulation of the AscendC API) and ``ascendc-sim`` (:mod:`pasa_npu.ascendc_sim`:
Huawei's implementation on an instruction-level simulator), differ only in the engine that runs
the host launcher (``ascend_kernels/host/pasa_launcher.h``) and its launches. This module lays a
problem out as that launcher reads it (memory orders, parameters, lengths, mask bytes, the
paged table) and hands it to an engine; it also keeps the NPU model parameters the host tiles
for (``core_num``) and the emulation times with.

An engine has ``tiling(params, lengths) -> dict`` (the host's tiling; ValueError for a
configuration the kernels cannot tile) and ``run_attention(query, key, value, out, lse,
lengths, params, mask=, block_table=, key_slots=, row_flags=, sink=)``, the arguments of
``pasa_npu._ascendc_emu.run_attention``: int16 numpy views of the tensors in their memory
order, written in place (out, lse, row_flags).
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Iterator, Optional

import torch

from . import npu_params
from .kernel_inputs import BNSD, kernel_call
from .kernel_inputs import unsupported_reason as _kernel_unsupported_reason
from .numerics import RESOLUTION_LIMIT
from .problem import AttentionProblem

#: seconds a cross-core wait may block before the engine reports a hang
WAIT_TIMEOUT_S = 60.0

_model = npu_params.values()


def model_parameters() -> dict:
    """The NPU model parameters the next call uses (core_num included: the host tiles for it)."""
    return dict(_model)


@contextlib.contextmanager
def using_model_parameters(params: dict) -> Iterator[None]:
    """Run the calls inside with ``params`` (a full table, e.g. ``npu_params.corner("slow")``)."""
    missing = sorted(set(npu_params.values()) - set(params))
    if missing:
        raise ValueError(f"NPU model parameters missing: {missing}")
    with _holding("_model", dict(params)):
        yield


#: host tiling choices a caller may force (the host picks each where it is 0): ``vec_chunk_rows``,
#: the rows a vector core works on at once (a multiple of 16 dividing its rows, at most 128);
#: ``cube_keys``, the keys of a K or V block in L0B at once (a multiple of 16 dividing ``kv_block``
#: that fits with the whole head dim); ``key_buffer_keys``, the keys of a K block in one L1 buffer
#: (a multiple of the cube's key piece dividing ``kv_block``; the whole block where 0);
#: ``prob_buffer_keys``, the keys of a P' part in one L1 buffer (the same; a part holds one piece
#: of the cube's rows; the whole P' tile where 0); ``prep_launch``
#: (1), the key preprocessing in a launch of its own rather than at the attention launch's start;
#: ``merge_launch`` (1), split kv's merge and a checked call's repair in launches of their own rather
#: than at the attention launch's end; ``tail_pieces``, the pieces of query rows each task of a
#: prefill's part-filled last round is dealt as (1: none cut); ``vector_prob_sums`` (1, pasa
#: only), the row sums of P' on the vector cores rather than on the cube
TILING_CHOICES = ("vec_chunk_rows", "cube_keys", "key_buffer_keys", "prob_buffer_keys", "prep_launch", "merge_launch",
                  "tail_pieces", "vector_prob_sums")
_forced: dict = {}


@contextlib.contextmanager
def forcing_tiling(**choices: int) -> Iterator[None]:
    """Run the calls inside with the host's tiling choices forced (:data:`TILING_CHOICES`),
    e.g. ``forcing_tiling(vec_chunk_rows=16)``; the host rejects a choice that does not fit."""
    unknown = sorted(set(choices) - set(TILING_CHOICES))
    if unknown:
        raise ValueError(f"unknown tiling choice(s) {unknown}; known: {list(TILING_CHOICES)}")
    for name, value in choices.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"tiling choice {name!r} must be an int >= 0, got {value!r}")
    with _holding("_forced", dict(choices)):
        yield


@contextlib.contextmanager
def _holding(name: str, value) -> Iterator[None]:
    """This module's setting ``name`` set to ``value`` for the block, then restored."""
    saved = globals()[name]
    globals()[name] = value
    try:
        yield
    finally:
        globals()[name] = saved


def unsupported_reason(problem: AttentionProblem, backend: str) -> Optional[str]:
    """None when the kernels compute ``problem`` exactly as specified on CPU tensors, else the
    feature they lack, in a sentence naming ``backend``."""
    reason = _kernel_unsupported_reason(problem, backend)
    if reason is None and problem.query.device.type != "cpu":
        return f"the {backend} backend runs on CPU tensors"
    return reason


def _memory(t: torch.Tensor, layout: int):
    """The int16 numpy array of a (B, N, S, D) view in its memory order (no copy)."""
    return (t if layout == BNSD else t.permute(0, 2, 1, 3)).view(torch.int16).numpy()


def mask_params(mask: Optional[torch.Tensor]) -> dict:
    """The tiling's mask fields for the uint8 (B|1, S1, S2) mask bytes (or None)."""
    if mask is None:
        return dict(has_mask=0)
    row = mask.stride(1) if mask.shape[1] > 1 else mask.shape[2]
    return dict(has_mask=1, mask_row_stride=row, mask_batch_stride=mask.stride(0) if mask.shape[0] > 1 else 0)


def paged_params(call) -> dict:
    """The tiling's paged fields: the caches' blocks, the table's width, the block size."""
    if call.block_table is None:
        return dict(paged=0)
    return dict(paged=1, block_size=call.key.shape[2], table_stride=call.block_table.shape[1],
                num_blocks=call.key.shape[0])


#: the host tiling's names of what the user sets, and the keywords that set them
_TILING_KEYWORDS = {"kvBlock": "kv_block", "qBlock": "q_block", "blockSize": "block_size"}


def _keyword_names(message: str) -> str:
    """The host tiling's ``message`` with the keywords' names for the fields they set."""
    return re.sub(r"\b(" + "|".join(_TILING_KEYWORDS) + r")\b",
                  lambda m: _TILING_KEYWORDS[m.group(1)], message)


def run(problem: AttentionProblem, engine, backend: str) -> tuple[object, dict]:
    """Compute ``problem`` with the kernels on ``engine``; writes out (and lse, and the row
    flags of a checked call). Returns what the engine's ``run_attention`` returned and the
    host's tiling. NotImplementedError naming ``backend`` for what the kernels lack or cannot
    tile."""
    reason = unsupported_reason(problem, backend)
    if reason is not None:
        raise NotImplementedError(reason)
    call = kernel_call(problem)
    batch, n_q, s_q, d = call.query.shape
    n_kv, s_kv, d_v = call.key.shape[1], call.key.shape[2], call.value.shape[3]
    lse = call.lse if call.lse is not None else torch.full((batch, n_q, s_q), -math.inf)
    flags = None
    if problem.overflow is not None:  # the kernels flag the rows they write; rows outside read 0
        flags = problem.overflow.row_flags
        flags.zero_()
    params = dict(
        tiling_key=call.tiling_key, batch=problem.batch, num_heads=n_q, num_kv_heads=n_kv,
        seq_q=s_q, seq_kv=s_kv, head_dim=d, head_dim_v=d_v, q_layout=call.q_layout,
        kv_layout=call.kv_layout, out_layout=call.out_layout,
        out_dtype=0 if call.out.dtype == torch.float16 else 1,
        in_dtype=0 if call.query.dtype == torch.float16 else 1, mask_mode=call.mask_mode,
        packed=int(problem.packed), overflow_check=int(flags is not None), has_sink=int(call.sink is not None),
        resolution_limit=RESOLUTION_LIMIT,  # checked pasa / pasa-exact rows: the resolution check too
        **mask_params(call.mask),
        **paged_params(call),
        scale=float(problem.scale), beta=float(problem.beta), q_block=problem.tiling.q_block,
        kv_block=problem.tiling.kv_block, core_num=int(_model["core_num"]), timeout_s=WAIT_TIMEOUT_S,
        timing=npu_params.timing_only(_model), **_forced)
    lengths = {name: t.numpy() for name, t in call.lengths.items()}
    try:
        tiling = engine.tiling({k: v for k, v in params.items() if k != "timing"}, lengths)
    except ValueError as exc:  # a configuration the kernels cannot tile
        raise NotImplementedError(f"{backend}: {_keyword_names(str(exc))}") from None
    mask = None
    if call.mask is not None:  # the bytes from the mask's first element on
        flat = call.mask.as_strided((call.mask.untyped_storage().nbytes() - call.mask.storage_offset(),),
                                    (1,), call.mask.storage_offset())
        mask = flat.numpy()
    result = engine.run_attention(
        _memory(call.query, call.q_layout), _memory(call.key, call.kv_layout),
        _memory(call.value, call.kv_layout), _memory(call.out, call.out_layout), lse.numpy(),
        lengths, params, mask=mask,
        block_table=None if call.block_table is None else call.block_table.numpy(),
        key_slots=None if call.key_slots is None else call.key_slots.numpy(),
        row_flags=None if flags is None else flags.numpy(),
        sink=None if call.sink is None else call.sink.numpy())
    call.finish(problem)
    return result, tiling
