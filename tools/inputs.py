"""Generated attention inputs: the paper's benchmark distributions and a resonance case.

Shapes are BNSD. Every generator takes a ``torch.Generator`` seed so a case is
reproducible, and returns fp16 tensors (the paper's inputs) unless told otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PAPER_SHAPE = (1, 16, 1280, 128)  # (B, N, S, D) of the paper's random benchmarks


def uniform(shape, x0: float, amplitude: float, seed: int = 0, dtype=torch.float16):
    """Q, K, V ~ U(x0 - Am, x0 + Am) (paper eq. 17)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * amplitude
                  + x0).to(dtype) for _ in range(3))


def hybrid(shape, x0: float, amplitude: float, seed: int = 0, p: float = 0.001,
           dtype=torch.float16):
    """Q, K, V ~ N(x0, 1) + N(0, Am^2) * Bernoulli(p) (paper eq. 18)."""
    gen = torch.Generator().manual_seed(seed)

    def one():
        base = torch.randn(shape, generator=gen, dtype=torch.float64) + x0
        outliers = torch.randn(shape, generator=gen, dtype=torch.float64) * amplitude
        hits = torch.rand(shape, generator=gen, dtype=torch.float64) < p
        return (base + outliers * hits).to(dtype)

    return one(), one(), one()


def resonance(shape, score_magnitude: float = 3e4, seed: int = 0, phase: float = 0.0,
              dtype=torch.float16):
    """Q and K sharing a large pattern along the head dimension (docs/design.md,
    "pasa-exact: carrying the shift exactly").

    Every key carries the same pattern ``A * w`` (w a sinusoid over the head
    dim) with a slow per-token drift, every query carries ``A * c_t * w``
    shifted by ``phase`` (0: scores large positive; pi: large negative), plus
    unit noise, with A chosen so that scale * |Q.K| reaches ``score_magnitude``
    (scale = 1/sqrt(D)). The bias differs from block to block, so an online
    algorithm has to re-base blocks accurately.
    """
    b, n, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    dims = torch.arange(d, dtype=f64)
    wave = torch.sin(2 * math.pi * 3 * dims / d + 0.3)
    wave_q = torch.sin(2 * math.pi * 3 * dims / d + 0.3 + phase)
    amplitude = math.sqrt(score_magnitude * math.sqrt(d) / float(wave @ wave))
    tokens = torch.arange(s, dtype=f64)
    drift_k = 1.0 + 0.05 * torch.sin(2 * math.pi * tokens / s)[:, None]
    drift_q = 0.5 + torch.rand(b, n, s, 1, generator=gen, dtype=f64)
    k = torch.randn(shape, generator=gen, dtype=f64) + amplitude * drift_k * wave
    q = torch.randn(shape, generator=gen, dtype=f64) + amplitude * drift_q * wave_q
    v = torch.randn(shape, generator=gen, dtype=f64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def spread(shape, score_std: float = 1e5, seed: int = 0, dtype=torch.float16):
    """Scores whose spread exceeds fp16 in some query tiles only: the first quarter of the
    query rows (at least one row) has scaled scores N(0, score_std^2) (scale = 1/sqrt(D)),
    the other rows N(0, 1). Keys are N(0, 10^2) so that the large queries, N(0,
    (score_std/10)^2), stay inside fp16's range; values N(0, 1). The shift removes a
    block's mean, not this spread: PASA's fp16 scores overflow on those rows."""
    b, n, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    q = torch.randn(shape, generator=gen, dtype=f64) * 0.1
    q[:, :, :max(1, s // 4)] *= score_std
    k = torch.randn(shape, generator=gen, dtype=f64) * 10.0
    v = torch.randn(shape, generator=gen, dtype=f64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@dataclass(frozen=True)
class Case:
    """One generated input: ``kind`` in {uniform, hybrid, resonance, spread, amplitude} with its
    parameters (for amplitude: the softmax scale)."""

    kind: str
    x0: float
    amplitude: float
    sweep: str = ""

    @property
    def label(self) -> str:
        if self.kind == "amplitude":
            return f"large amplitude N(0,1) scale={self.amplitude:g}"
        if self.kind == "resonance":
            return f"resonance |S|~{self.amplitude:g}"
        if self.kind == "spread":
            return f"score spread beyond fp16 std(S)~{self.amplitude:g}"
        return f"{self.kind} x0={self.x0:g} Am={self.amplitude:g}"

    def make(self, shape=PAPER_SHAPE, seed: int = 0, dtype=torch.float16):
        if self.kind == "uniform":
            return uniform(shape, self.x0, self.amplitude, seed, dtype=dtype)
        if self.kind == "hybrid":
            return hybrid(shape, self.x0, self.amplitude, seed, dtype=dtype)
        if self.kind == "resonance":
            return resonance(shape, self.amplitude, seed, dtype=dtype)
        if self.kind == "spread":
            return spread(shape, self.amplitude, seed, dtype=dtype)
        if self.kind == "amplitude":
            gen = torch.Generator().manual_seed(seed)
            return tuple(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))
        raise ValueError(f"unknown case kind {self.kind!r}")

    def scale(self, head_dim: int) -> float:
        """The softmax scale the case runs at: 1/sqrt(d), or the large-amplitude case's own (its
        scores reach thousands without overflowing fp16: a sharp softmax fp16 cannot resolve)."""
        return float(self.amplitude) if self.kind == "amplitude" else head_dim ** -0.5


def paper_cases(unique: bool = False) -> list[Case]:
    """The paper's sweeps (docs/design.md, "How we measure"; paper Figures 9-10); ``unique`` drops the point
    the hybrid mean and amplitude sweeps share."""
    cases = [Case("uniform", x0, 0.5, "uniform-mean") for x0 in (0, 5, 10, 20, 30)]
    cases += [Case("uniform", 20, am, "uniform-amplitude") for am in (5, 10, 15, 20)]
    cases += [Case("hybrid", x0, 10, "hybrid-mean") for x0 in (0, 5, 10, 20, 30)]
    cases += [Case("hybrid", 20, am, "hybrid-amplitude") for am in (10, 20, 50, 100)]
    if unique:
        cases = list({c.label: c for c in reversed(cases)}.values())[::-1]
    return cases
