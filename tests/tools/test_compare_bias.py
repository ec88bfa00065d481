"""``pasa-compare bias``: the biased rounding of seeds 002/003 and the rounding guard."""
from __future__ import annotations

import json

import pytest
import torch

from pasa_npu.tools.compare.bias import BiasSetup, tied_maxima_inputs
from pasa_npu.tools.compare.cli import main


def test_inputs_have_the_tied_maxima_they_claim():
    setup = BiasSetup(heads=2, queries=32, keys=64, ties=3, gap=12.0)
    (q, k, v), scale = tied_maxima_inputs(setup, seed=0, dtype=torch.bfloat16)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    top = s.topk(4, dim=-1).values
    assert torch.equal(top[..., 0], top[..., 2])                 # three exact ties per row
    assert float((top[..., 0] - top[..., 3]).min()) > 6          # well above the rest
    assert bool((v > 0).all())


@pytest.fixture(scope="module")
def bias_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bias")
    rc = main(["bias", "--allocations", "fa-fp16", "--trials", "24", "--heads", "4", "--queries",
               "64", "--quiet", "--out", str(out)])
    return rc, out, json.loads((out / "bias.json").read_text())


def _row(doc, dtype, guard):
    return next(r for r in doc["rows"] if r["dtype"] == dtype and r["guard"] is guard)


def test_unguarded_bf16_bias_matches_the_hand_derivation(bias_run):
    """Two tied V values in [1, 2) sum to [2, 4), one bit more than bf16 holds: half the sums
    are ties, which the tiny same-signed remainder breaks upward by half an ulp of [2, 4),
    2^-7. The output divides by the row sum 2: expected bias 2^-7 / 2 / 2 = 2^-9."""
    rc, _, doc = bias_run
    assert rc == 0
    off = _row(doc, "bfloat16", False)
    assert off["significant"]
    assert abs(off["bias"] - 2 ** -9) < max(3 * off["ci95"], 5e-5), off


def test_guard_removes_the_fp16_bias(bias_run):
    _, _, doc = bias_run
    off, on = _row(doc, "float16", False), _row(doc, "float16", True)
    assert off["significant"] and off["bias"] > 0
    assert abs(on["bias"]) < off["bias"] / 10 and abs(on["bias"]) < 3 * on["ci95"], (off, on)


def test_bias_report_files(bias_run):
    _, out, doc = bias_run
    assert len(doc["rows"]) == 4 and len(doc["findings"]) == 2
    md = (out / "bias.md").read_text()
    off = _row(doc, "float16", False)
    assert f"{off['bias']:+.3e}" in md                      # the numbers are in the report
    assert (out / "bias.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "bias.csv").read_text().count("\n") == 5
