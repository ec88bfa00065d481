"""The Triton backend's tuning: a frozen options object, chosen per call scope.

:class:`Tuning` names every switch the backend has; the defaults are the faster choices
on an H100 and H200 (``pasa-bench``). The backend entry reads the active options once per call
(:func:`active`) and passes them down; :func:`using` makes other options active for a
block of code (``pasa-bench --tuning``, ``tools/dev/ablate.py``, the tests), in the current
thread or task only.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

#: every switch's choices, the default first
CHOICES = {
    "prefill": ("auto", "warp-specialised", "triton"),
    "shift": ("separate", "fused", "in-launch"),
    "decode_shift": ("scores", "keys"),
    "loads": ("tma", "pointers"),
    "row_constant": ("auto", "precomputed", "in-kernel"),
}


@dataclass(frozen=True)
class Tuning:
    """How the Triton backend computes; never what (every choice computes the same
    allocation: its roundings, but for the differences each switch names).

    ``prefill``: the prefill kernel. "warp-specialised": the Gluon kernel
    (:mod:`gluon.prefill`: Hopper only, pasa-exact, pasa and fa-fp32 at d = 64 and 128
    without ragged lengths or an explicit mask; the same results bit for bit but for pasa's
    and pasa-exact's block sums, which it adds on the tensor cores); "triton": the Triton
    kernel (every problem); "auto": the Gluon kernel where it applies, unless a switch
    that only the Triton kernel has is set away from its default (the Gluon kernel loads
    through TMA and computes pasa-exact's row constants in its kv loop).
    ``shift``: how prefill shifts K for PASA: "separate" (a preprocessing pass over K, its
    own launch), "fused" (recomputed inside every query tile; the Triton kernel only) or
    "in-launch" (the Gluon kernel's consumer groups shift the contiguous K, each block
    once, at the start of its own launch, and its loaders wait for all of them: one launch
    less, but slower on the GPU where the shift is a larger share of the call,
    docs/triton-backend.md; the Triton kernel and paged K take the separate pass).
    ``decode_shift``: how decode shifts for PASA, inside its one pass over K (each K block
    is read by one program there): "scores" (the shift applied to the block's fp32 scores,
    :func:`shift.shift_scores`; K' is never formed, so K' is not rounded to fp16, and the
    scores carry fa-fp32's error, a few fp32 ulps of the unshifted score) or "keys" (K'
    formed from each loaded block, as the separate pass forms it: more accurate where the
    keys share a large bias, slower; docs/design.md, "Shifting the scores in decode").
    ``loads``: how the prefill kernel reads its interior kv blocks, and the decode kernel
    its whole ones: "tma" (tensor descriptors, Hopper and newer; pointers where a layout is
    not TMA-addressable, or where a decode kv block spans two cache blocks) or "pointers"
    (masked pointer loads).
    ``row_constant``: pasa-exact's c = scale * Q . mean16 per (row, block). "precomputed":
    each query tile computes its constants for every block it visits before its kv loop,
    16 blocks per thin matmul, into a workspace of B*N*S1*S2/kv_block fp32 values read back
    per block; "in-kernel": a thin matmul per block inside the loop, no workspace; "auto":
    precomputed while that workspace is no larger than Q, K and V together, in-kernel
    beyond, where it would grow as S1 * S2.
    ``launch``, ``loops``: for measurements only, a fixed (BLOCK_M, num_warps, num_stages)
    and a fixed set of kv-block loops (the bits of ``launch.block_loops``; 7 compiles
    all three in) for the Triton prefill kernel, in place of the heuristics; None: the
    heuristics'.
    """

    prefill: str = "auto"
    shift: str = "separate"
    decode_shift: str = "scores"
    loads: str = "tma"
    row_constant: str = "auto"
    launch: Optional[tuple[int, int, int]] = None
    loops: Optional[int] = None

    def __post_init__(self):
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"Tuning.{name} must be one of {choices}, got {value!r}")
        if self.loops is not None and not (isinstance(self.loops, int) and 1 <= self.loops <= 7):
            raise ValueError(f"Tuning.loops must be None or 1-7 (bits of the kv-block loops), "
                             f"got {self.loops!r}")

    def triton_kernel_only(self) -> bool:
        """Whether a switch that only the Triton prefill kernel has is set away from its
        default."""
        return self.shift == "fused" or any(
            getattr(self, name) != getattr(DEFAULT_TUNING, name)
            for name in ("loads", "row_constant", "launch", "loops"))

    def replace(self, **switches) -> "Tuning":
        """These options with ``switches`` changed (validated)."""
        return dataclasses.replace(self, **switches)


DEFAULT_TUNING = Tuning()
_ACTIVE: contextvars.ContextVar[Tuning] = contextvars.ContextVar("pasa_npu_triton_tuning",
                                                                  default=DEFAULT_TUNING)


def active() -> Tuning:
    """The options calls in the current scope run with."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(tuning: Tuning) -> Iterator[Tuning]:
    """Run the Triton backend with ``tuning`` inside the block; the previous options after."""
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a Tuning, got {type(tuning).__name__}")
    token = _ACTIVE.set(tuning)
    try:
        yield tuning
    finally:
        _ACTIVE.reset(token)
