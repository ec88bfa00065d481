"""fp64 golden attention (:func:`pasa_npu.reference_attention`): dense softmax(scale * Q K^T) V
on the canonical problem.

No blocking, no shifting, no low-precision step: the reference every backend and
allocation is measured against. Learnable sinks join each row's softmax as one more
column (a zero value). Query rows are processed in chunks so that the
score matrix of a long sequence never has to exist whole.
"""
from __future__ import annotations

import torch

from pasa_npu.problem import AttentionProblem

F64 = torch.float64
ROW_CHUNK = 1024


def run(problem: AttentionProblem) -> None:
    """Write fp64 attention into ``problem.out`` (and LSE into ``problem.lse``)."""
    q, k, v = problem.dense_inputs()
    batch, n_q, s_q, _ = q.shape
    n_kv, s_kv, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = n_q // n_kv
    k64 = k.to(F64)
    cols = torch.arange(s_kv, device=q.device)
    # values past a batch's kv length are never read: a NaN there must not reach 0 * NaN
    in_length = cols[None, :] < problem.kv_lens.to(q.device)[:, None]
    v64 = torch.where(in_length[:, None, :, None], v.to(F64), 0.0)
    # learnable sinks: one more logit per query head, a column with a zero value
    sink = (None if problem.sink is None
            else problem.sink.to(F64).view(1, n_kv, group, 1, 1).to(q.device))
    out = torch.zeros(batch, n_q, s_q, d_v, dtype=F64, device=q.device)
    lse = torch.full((batch, n_q, s_q), float("-inf"), dtype=F64, device=q.device)
    # without keys every row stays 0 and its LSE -inf (amax has nothing to reduce)
    for r0 in range(0, s_q if s_kv else 0, ROW_CHUNK):
        rows = torch.arange(r0, min(r0 + ROW_CHUNK, s_q), device=q.device)
        s1 = rows.numel()
        q64 = q[:, :, r0:r0 + s1].to(F64).reshape(batch, n_kv, group * s1, -1)
        s = torch.matmul(q64, k64.transpose(-1, -2)).view(batch, n_kv, group, s1, s_kv)
        s = s * problem.scale
        vis = problem.visible(rows, cols)[:, None, None]
        s = s.masked_fill(~vis, float("-inf"))
        m = s.amax(-1, keepdim=True)
        seen = vis.any(-1, keepdim=True)
        if sink is not None:
            m = torch.maximum(m, sink)
        m = torch.where(seen, m, 0.0)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        if sink is not None:
            l = l + torch.exp(sink - m)
        o = torch.matmul(p.reshape(batch, n_kv, group * s1, s_kv), v64)
        o = o.view(batch, n_kv, group, s1, d_v) / torch.where(seen, l, 1.0)
        o = torch.where(seen, o, 0.0)
        row_lse = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), float("-inf"))
        out[:, :, r0:r0 + s1] = o.reshape(batch, n_q, s1, d_v)
        lse[:, :, r0:r0 + s1] = row_lse.reshape(batch, n_q, s1)
    problem.write(out.to(problem.out.dtype), lse)
