"""Backend npu's Python side on CPU: pasa_npu/npu.py through the API layer, with stand-ins for
torch_npu and the binding, and torch.ops.pasa_npu.npu_attention defined from the schema string
of ascend_kernels/binding/pasa_torch_npu.cpp with a CPU kernel that runs the AscendC kernels
under emulation as the binding's NPU kernel runs them on the device. What this checks: the
backend calls the operator with the arguments its C++ schema declares, in order, and the
result equals backend ascendc-emu's; it says nothing about the device code path."""
from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import pasa_npu
from pasa_npu import backends, npu_params, plans

emu = pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
from _npu_host import BINDING  # noqa: E402
from test_overflow import spread_inputs  # noqa: E402

SCHEMA = re.search(r'm\.def\("((?:[^"]|"\s*")*)"\)', BINDING.read_text()).group(1)
SCHEMA = re.sub(r'"\s*"', "", SCHEMA)


def _layout(t):
    return 0 if t.is_contiguous() else 1


def _memory(t):
    return (t if _layout(t) == 0 else t.permute(0, 2, 1, 3)).view(torch.int16).numpy()


def _npu_attention_on_cpu(query, key, value, out, lse, mask, block_table, key_slots, learnable_sink, row_flags, q_lens,
                          kv_lens, next_tokens, pre_tokens, q_starts, kv_starts, tiling_key, mask_mode, scale, beta, q_block,
                          kv_block, resolution_limit):
    """What the binding's kernel does with its arguments, with the emulated runtime."""
    b, n, s, d = query.shape
    lse_mem = lse if lse is not None else torch.empty(b, n, s)
    params = dict(tiling_key=tiling_key, batch=len(q_lens), num_heads=n, num_kv_heads=key.shape[1], seq_q=s,
                  seq_kv=key.shape[2], head_dim=d, head_dim_v=value.shape[3], q_layout=_layout(query),
                  kv_layout=_layout(key), out_layout=_layout(out),
                  out_dtype=int(out.dtype != torch.float16), in_dtype=int(query.dtype != torch.float16),
                  mask_mode=mask_mode, packed=int(len(q_starts) > 0), scale=scale, beta=beta, q_block=q_block,
                  kv_block=kv_block, core_num=24, overflow_check=int(row_flags is not None),
                  has_sink=int(learnable_sink is not None), resolution_limit=resolution_limit,
                  timing=npu_params.timing_only(npu_params.values()))
    mask_bytes = None
    if mask is not None:
        params.update(has_mask=1, mask_row_stride=mask.stride(1) if mask.shape[1] > 1 else mask.shape[2],
                      mask_batch_stride=mask.stride(0) if mask.shape[0] > 1 else 0)
        mask_bytes = mask.as_strided((mask.untyped_storage().nbytes() - mask.storage_offset(),), (1,),
                                     mask.storage_offset()).numpy()
    if block_table is not None:
        params.update(paged=1, block_size=key.shape[2], table_stride=block_table.shape[1], num_blocks=key.shape[0])
    lists = dict(q_lens=q_lens, kv_lens=kv_lens, next_tokens=next_tokens, pre_tokens=pre_tokens,
                 q_starts=q_starts, kv_starts=kv_starts)
    lengths = {name: np.asarray(x, np.int32) for name, x in lists.items() if len(x)}
    emu.run_attention(_memory(query), _memory(key), _memory(value), _memory(out), lse_mem.numpy(), lengths,
                      params, mask=mask_bytes, block_table=None if block_table is None else block_table.numpy(),
                      key_slots=None if key_slots is None else key_slots.numpy(),
                      row_flags=None if row_flags is None else row_flags.numpy(),
                      sink=None if learnable_sink is None else learnable_sink.numpy())


@pytest.fixture
def npu_backend_on_cpu(monkeypatch):
    """pasa_npu.npu imported with stand-in torch_npu and pasa_npu._npu modules, the operator
    defined for CPU, and backend "npu" allowed on CPU tensors."""
    if hasattr(torch.ops.pasa_npu, "npu_attention"):
        pytest.skip("torch.ops.pasa_npu.npu_attention is the real binding here")
    lib = torch.library.Library("pasa_npu", "FRAGMENT")
    lib.define(SCHEMA)
    lib.impl("npu_attention", _npu_attention_on_cpu, "CPU")
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setitem(sys.modules, "pasa_npu._npu", types.ModuleType("pasa_npu._npu"))
    monkeypatch.delitem(sys.modules, "pasa_npu.npu", raising=False)
    importlib.import_module("pasa_npu.npu")
    monkeypatch.setitem(backends.BACKENDS, "npu", dataclasses.replace(backends.BACKENDS["npu"],
                                                                       devices=("cpu",)))
    monkeypatch.setattr(plans, "PLANS", {})  # no plan made here outlives the test
    yield
    lib._destroy()
    sys.modules.pop("pasa_npu.npu", None)


def _inputs(layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = {"BNSD": (2, 4, 70, 32), "BSND": (2, 70, 4, 32)}[layout]
    kv = {"BNSD": (2, 2, 90, 32), "BSND": (2, 90, 2, 32)}[layout]
    return (torch.randn(shape, generator=g).half(), torch.randn(kv, generator=g).half(),
            torch.randn(kv, generator=g).half())


@pytest.mark.parametrize("algorithm,layout,extra", [
    ("pasa", "BNSD", dict(sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask())),
    ("pasa-exact", "BSND", dict(actual_seq_lengths=[70, 33], actual_seq_lengths_kv=[90, 41])),
    ("fa-fp32", "BNSD", dict(q_block=64, kv_block=32)),
    ("pasa", "BSND", dict(atten_mask=torch.rand(2, 70, 90, generator=torch.Generator().manual_seed(1)) < 0.3,
                          actual_seq_lengths=[70, 41])),
    ("pasa-exact", "BNSD", dict(sparse_mode=4, pre_tokens=20, next_tokens=3,
                                atten_mask=pasa_npu.compressed_causal_mask())),
])
def test_npu_backend_calls_its_operator_as_declared(npu_backend_on_cpu, algorithm, layout, extra):
    q, k, v = _inputs(layout)
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout=layout, scale=32 ** -0.5,
              softmax_lse_flag=True, algorithm=algorithm, **extra)
    out, lse = pasa_npu.fused_attention(q, k, v, backend="npu", **kw)
    want_out, want_lse = pasa_npu.fused_attention(q, k, v, backend="ascendc-emu", **kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_npu_backend_repairs_overflow_in_its_kernels(npu_backend_on_cpu):
    """Scores whose spread exceeds fp16 (tests/api/test_overflow.py's generator): the operator
    gets the row flags, and the kernels' flags and repair give what backend ascendc-emu
    gives, with no check after the call."""
    q, k, v, scale = spread_inputs("first-tile")
    kw = dict(num_heads=q.shape[1], input_layout="BNSD", scale=scale, softmax_lse_flag=True, algorithm="pasa")
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        for backend in ("npu", "ascendc-emu"):
            out, lse = pasa_npu.fused_attention(q, k, v, backend=backend, **kw)
            results.append((out, lse, pasa_npu.overflow_report().rows))
    (out, lse, rows), (want_out, want_lse, want_rows) = results
    assert rows == want_rows > 0 and torch.isfinite(out).all()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_npu_backend_passes_the_learnable_sink(npu_backend_on_cpu):
    """fused_attention_v2 with learnable sinks (packed decode and prefill rows, GQA): the
    operator gets the sinks and computes what backend ascendc-emu computes, which differs
    from the call without them."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(42, 4, 32, generator=g).half()
    k, v = (torch.randn(330, 2, 32, generator=g).half() for _ in range(2))
    kw = dict(num_query_heads=4, num_key_value_heads=2, softmax_scale=32 ** -0.5, input_layout="TND",
              actual_seq_qlen=[1, 41, 42], actual_seq_kvlen=[90, 250, 330], return_softmax_lse=True,
              sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask(), algorithm="pasa")
    sink = torch.tensor([-1.0, 0.5, 2.0, 4.0])
    out, lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, backend="npu", **kw)
    want_out, want_lse = pasa_npu.fused_attention_v2(q, k, v, learnable_sink=sink, backend="ascendc-emu", **kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    plain_out, _ = pasa_npu.fused_attention_v2(q, k, v, backend="npu", **kw)
    assert not torch.equal(out, plain_out)


def test_npu_backend_refuses_what_the_kernels_lack(npu_backend_on_cpu):
    q, k, v = _inputs("BNSD")
    with pytest.raises(NotImplementedError, match="explicit atten_mask needs kv_block >= 32 in the npu kernels"):
        pasa_npu.fused_attention(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                                 backend="npu", atten_mask=torch.zeros(70, 90, dtype=torch.bool), kv_block=16)


def test_npu_backend_passes_the_block_table(npu_backend_on_cpu):
    """Paged KV (a problem built to the paged contract, tests/_paged.py): the operator gets
    the block table and the K' slot table, and computes what backend ascendc-emu computes."""
    from _paged_problems import dense_problem, fresh_outputs, paged_problem
    q, k, v = _inputs("BNSD")
    dense = dense_problem(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                          scale=32 ** -0.5, softmax_lse_flag=True, algorithm="pasa-exact",
                          actual_seq_lengths_kv=[90, 41], q_block=64, kv_block=32)
    paged, _ = paged_problem(dense, 32, "BSH", shared_prefix=1)
    emulated = dataclasses.replace(paged, **fresh_outputs(paged))
    sys.modules["pasa_npu.npu"].run(paged)
    from pasa_npu import ascendc_emu
    ascendc_emu.run(emulated)
    assert torch.equal(paged.out, emulated.out) and torch.equal(paged.lse, emulated.lse)
