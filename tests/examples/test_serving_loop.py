"""examples/serving_loop.py: a paged cache driven through prefill, chunked prefill and
decode of several requests in mixed TND calls, each step checked against dense fp64
attention by the example itself (it raises past its tolerance)."""
from __future__ import annotations

import pytest

from test_overflow_demo import _example


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact"])
def test_serving_loop_matches_dense_attention(algorithm):
    loop = _example("serving_loop")
    records = loop.serve("cpu", algorithm, "torch", log=lambda line: None)
    steps = {}
    for t, rid, queries, kv_len, err in records:
        steps.setdefault(t, []).append((queries, kv_len))
        assert err <= loop.TOLERANCE[algorithm]
    # the loop exercised what it claims: steps mixing decode and prefill, chunked prefill
    # (a chunk after tokens already cached), every request to its end
    assert any({q == 1 for q, _ in s} == {True, False} for s in steps.values())
    assert any(1 < q < kv for s in steps.values() for q, kv in s)
    finals = {rid: kv for _, rid, _, kv, _ in records}
    assert finals == {rid: p + n for rid, (p, n, _) in enumerate(loop.REQUESTS)}
