"""The Triton and Gluon kernels on a CUDA GPU at shapes people run, reaching the schedules the
small cases of the matrix never do: more programs than SMs, many kv blocks, decode split into
several kv ranges, a part-filled last kv block at several positions, ragged packed batches and
paged KV. Each against the fp64 golden: relative RMSE and largest LSE error within
GPU_MARGIN times the torch backend's (on the CPU, same inputs, same allocation)."""
from __future__ import annotations

import pytest
import torch

import pasa_npu
from _real_shapes import PREFILL_SHAPES
from _bounds import triton_numerics
from _support import triton_tuning
from test_golden import make_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: these shapes are too large for the interpreter")

#: the GPU's tensor cores accumulate fp32 sums without round-to-nearest and its exp is the
#: approximate ex2 (tests/_support.py, GPU_STAND_IN): against the golden its error may exceed
#: the CPU backend's by this factor
GPU_MARGIN = 1.5

SHAPES = {
    **PREFILL_SHAPES,
    "qwen2-gqa28:4-causal": dict(PREFILL_SHAPES["qwen2-gqa28:4-causal"], S1=2048, S2=2048),
    "decode-split-ragged": dict(layout="BSH", B=4, Nq=32, Nkv=8, S1=1, S2=32768, D=128,
                                kv_lens=[32768, 20001, 129, 8191]),
    "decode-one-request": dict(layout="BSH", B=1, Nq=32, Nkv=8, S1=1, S2=65537, D=128),
}
# a part-filled last kv block at several positions (keys past a multiple of 128)
SHAPES.update({f"partial-last-block+{r}": dict(layout="BNSD", B=2, Nq=8, Nkv=2, S1=777, S2=1280 + r,
                                               D=128, sparse_mode=3, mask="optimized")
               for r in (1, 63, 127)})


def on_gpu(kw: dict) -> dict:
    return {n: a.cuda() if isinstance(a, torch.Tensor) else a for n, a in kw.items()}


def assert_close_to_golden_as_cpu(q, k, v, kw, algorithm, out, lse, path="prefill"):
    """``path``: the Triton kernel's ("decode" shifts PASA's scores: the CPU backend too)."""
    gold, gold_lse = pasa_npu.reference_attention(q, k, v, softmax_lse_flag=True, **kw)
    with triton_numerics(path):
        ref, ref_lse = pasa_npu.fused_attention(q, k, v, algorithm=algorithm, backend="torch",
                                                softmax_lse_flag=True, **kw)
    out, lse = out.cpu(), lse.cpu()
    assert torch.isfinite(out).all()
    rmse = lambda x: float((x.double() - gold).norm() / gold.norm())  # noqa: E731
    assert rmse(out) <= GPU_MARGIN * rmse(ref) + 1e-7, (rmse(out), rmse(ref))
    finite = torch.isfinite(gold_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    lse_err = float((lse.double() - gold_lse)[finite].abs().max())
    ref_lse_err = float((ref_lse.double() - gold_lse)[finite].abs().max())
    assert lse_err <= GPU_MARGIN * ref_lse_err + 1e-6, (lse_err, ref_lse_err)


@pytest.mark.parametrize("prefill", ["triton", "warp-specialised"])
@pytest.mark.parametrize("algorithm", ["fa-fp32", "pasa", "pasa-exact"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_gpu_real_shape_matches_golden_as_cpu_backend(name, algorithm, prefill):
    if prefill == "warp-specialised" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon prefill needs an sm_90 (Hopper) GPU")
    q, k, v, kw = make_case(SHAPES[name], torch.float16)
    kw.pop("softmax_lse_flag", None)
    with triton_tuning(prefill=prefill):
        out, lse = pasa_npu.fused_attention(q.cuda(), k.cuda(), v.cuda(), algorithm=algorithm,
                                            backend="triton", softmax_lse_flag=True, **on_gpu(kw))
    assert_close_to_golden_as_cpu(q, k, v, kw, algorithm, out, lse,
                                  "decode" if SHAPES[name].get("S1") == 1 else "prefill")


@pytest.mark.parametrize("algorithm", ["fa-fp32", "pasa", "pasa-exact"])
def test_gpu_paged_batch_at_real_shape(algorithm):
    """A paged prefill-and-decode TND batch through a shuffled block table of 128-key blocks."""
    from _paged import paged_case
    case = dict(layout="TND", cache="4d", Nq=32, Nkv=8, D=128, block_size=128,
                q_lens=[1, 300, 1, 77], kv_lens=[5000, 1300, 9000, 77], share=[1], sparse_mode=3)
    q, k_cache, v_cache, kw, (k, v, dense_kw) = paged_case(case, torch.float16)
    kw.pop("softmax_lse_flag", None)
    dense_kw.pop("softmax_lse_flag", None)
    out, lse = pasa_npu.fused_attention(q.cuda(), k_cache.cuda(), v_cache.cuda(), algorithm=algorithm,
                                        backend="triton", softmax_lse_flag=True, **on_gpu(kw))
    assert_close_to_golden_as_cpu(q, k, v, dense_kw, algorithm, out, lse)
