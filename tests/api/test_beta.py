"""The optimal accuracy condition (paper §2.3, Table 3) and the stored shifting matrix."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pasa_npu import optimal_beta, shift_matrix
from pasa_npu.beta import ideal_invariance, practical_invariance


@pytest.mark.parametrize("beta0,expected,gamma", [
    (1 - 2 ** -4, 0.937500, 15.0), (1 - 2 ** -5, 0.968994, 31.25), (1 - 2 ** -6, 0.984497, 63.5)])
def test_paper_values(beta0, expected, gamma):
    beta = optimal_beta(beta0, 128, torch.float16)
    assert round(beta, 6) == expected
    # the optimum makes the invariance the matrix applies equal the one recovery uses
    assert practical_invariance(beta, 128) == pytest.approx(ideal_invariance(beta), rel=1e-10)
    # and that invariance is the fp16-exact value the paper reports
    assert torch.tensor(ideal_invariance(beta)).half().item() == gamma


def test_paper_table3_invariances_before_optimisation():
    # Inva_r of the un-optimised betas, paper Table 3: 8.971, 15.00, 31.25, 63.50, 102.2, 1031
    for beta0, inva_r in ((0.9, 8.971), (1 - 2 ** -4, 15.0), (1 - 2 ** -5, 31.25),
                          (1 - 2 ** -6, 63.5), (0.99, 102.2), (0.999, 1031)):
        assert practical_invariance(beta0, 128) == pytest.approx(inva_r, rel=2e-3)


def test_folded_scale_changes_the_solution():
    scaled = optimal_beta(1 - 2 ** -6, 128, torch.float16, scale=128 ** -0.5)
    assert abs(scaled - 0.984497) > 1e-4
    assert practical_invariance(scaled, 128, scale=128 ** -0.5) == pytest.approx(
        ideal_invariance(scaled), rel=1e-10)


def test_shift_matrix_is_stored_as_modelled():
    m = shift_matrix(0.984497, 128, torch.float16, scale=0.125)
    assert m.dtype == torch.float16 and m.shape == (128, 128)
    diag = torch.tensor(0.125 * (1 - 0.984497 / 128), dtype=torch.float64).half()
    off = torch.tensor(-0.125 * 0.984497 / 128, dtype=torch.float64).half()
    assert (m.diagonal() == diag).all()
    assert (m[~torch.eye(128, dtype=torch.bool)] == off).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="beta0 must lie in"):
        optimal_beta(1.0, 128)
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        optimal_beta(0.9, 1)
    with pytest.raises(ValueError, match="scale must be a finite positive"):
        optimal_beta(0.9, 128, scale=-1.0)


def test_cli_prints_the_paper_table():
    out = subprocess.run([sys.executable, "-m", "pasa_npu.tools.beta"], capture_output=True,
                         text=True, check=True).stdout
    for value in ("0.937500", "0.968994", "0.984497", "0.899708", "0.990311", "0.999031"):
        assert value in out
    bad = subprocess.run([sys.executable, "-m", "pasa_npu.tools.beta", "--n", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "n must be an int >= 2" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-mixed"])
@pytest.mark.parametrize("kv_block,scale", [(32, 32 ** -0.5), (64, 0.3)])
def test_default_beta_is_the_optimum_for_the_calls_scale_and_tiling(algorithm, kv_block, scale):
    """beta=None runs PASA with the β of the optimal accuracy condition for the matrix the
    kernels store: the call's scale folded in, n = kv_block, solved from 1 - 2^-6 (by the
    independent solver of tests/_oracle.py). A β solved without the scale, for another n,
    or not solved at all (β0) gives other outputs wherever it changes what the kernels
    use: the stored matrix or γ = β / (1 - β) in the allocation's precision (fp16 for
    pasa, fp32 for pasa-mixed)."""
    import numpy as np

    import _oracle
    import pasa_npu

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, s, 32, generator=gen).half() + 3
               for s in (24, 4 * kv_block, 4 * kv_block))
    kw = dict(num_heads=2, input_layout="BNSD", scale=scale, algorithm=algorithm,
              kv_block=kv_block, softmax_lse_flag=True)
    default = pasa_npu.fused_attention(q, k, v, **kw)
    gamma_dtype = np.float16 if algorithm == "pasa" else np.float32

    def used(beta):
        return (_oracle.stored_shift_entries(beta, kv_block, scale),
                gamma_dtype(beta / (1 - beta)))

    optimum = _oracle.optimal_beta(_oracle.BETA0, kv_block, scale)
    candidates = [optimum, _oracle.optimal_beta(_oracle.BETA0, kv_block, 1.0),
                  _oracle.optimal_beta(_oracle.BETA0, 2 * kv_block, scale), _oracle.BETA0]
    outcomes = []
    for beta in candidates:
        out, lse = pasa_npu.fused_attention(q, k, v, beta=beta, **kw)
        same = torch.equal(out, default[0]) and torch.equal(lse, default[1])
        assert same == (used(beta) == used(optimum)), beta
        outcomes.append(same)
    assert outcomes[0] and not all(outcomes[1:])  # the check can fail
