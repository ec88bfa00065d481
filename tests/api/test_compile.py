"""fused_attention under torch.compile: one opaque operator (``pasa_npu::fused_attention``)
whose outputs equal the eager call's bit for bit, on every backend of the machine."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import pasa_npu
from pasa_npu import arguments, compiled
from _support import BACKEND_DEVICES, on_device, op_defaults, skip_unsupported

OP = torch.ops.pasa_npu.fused_attention.default


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _case(name: str, seq: int = 40):
    """(q, k, v, kwargs): small shapes, lengths not a multiple of the block."""
    gen = torch.Generator().manual_seed(7)
    rand = lambda *shape: (2 * torch.randn(*shape, generator=gen)).half()  # noqa: E731
    if name == "BSH GQA, LSE":
        q, k, v = rand(2, seq, 4 * 32), rand(2, seq, 2 * 32), rand(2, seq, 2 * 32)
        kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BSH",
                  softmax_lse_flag=True, scale=32 ** -0.5)
    elif name == "BNSD causal, ragged kv list":
        q, k, v = rand(2, 2, seq, 32), rand(2, 2, seq + 8, 32), rand(2, 2, seq + 8, 32)
        kw = dict(num_heads=2, input_layout="BNSD", sparse_mode=3,
                  atten_mask=pasa_npu.compressed_causal_mask(),
                  actual_seq_lengths_kv=[seq + 8, seq - 3], algorithm="pasa")
    elif name == "TND cumulative lengths":
        q, k, v = rand(seq, 2, 32), rand(seq, 2, 32), rand(seq, 2, 32)
        kw = dict(num_heads=2, input_layout="TND", actual_seq_lengths=[seq // 2, seq],
                  actual_seq_lengths_kv=[seq // 2, seq], softmax_lse_flag=True,
                  algorithm="pasa-exact")
    elif name == "TND paged, 3-D cache":
        q, k, v = rand(seq, 2, 32), rand(4, 128, 2 * 32), rand(4, 128, 2 * 32)
        kw = dict(num_heads=2, input_layout="TND", actual_seq_lengths=[seq // 2, seq],
                  actual_seq_lengths_kv=[150, 60], sparse_mode=3,
                  atten_mask=pasa_npu.compressed_causal_mask(), softmax_lse_flag=True,
                  block_table=torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
                  block_size=128, algorithm="pasa")
    elif name == "v2 TND, sinks, bf16 out":
        q, k, v = rand(seq, 2, 32), rand(seq, 2, 32), rand(seq, 2, 32)
        kw = dict(num_query_heads=2, input_layout="TND", actual_seq_qlen=[seq // 2, seq],
                  actual_seq_kvlen=[seq // 2, seq], return_softmax_lse=True,
                  learnable_sink=torch.tensor([-1.0, 2.0]), out_dtype=torch.bfloat16,
                  algorithm="pasa-exact")
    else:  # lengths as a tensor, output in another layout
        q, k, v = rand(2, seq, 2, 32), rand(2, seq, 2, 32), rand(2, seq, 2, 32)
        kw = dict(num_heads=2, input_layout="BSND_NBSD",
                  actual_seq_lengths=torch.tensor([seq, seq - 5]), softmax_lse_flag=True)
    return q, k, v, kw


CASES = ("BSH GQA, LSE", "BNSD causal, ragged kv list", "TND cumulative lengths",
         "TND paged, 3-D cache", "BSND_NBSD, tensor lengths", "v2 TND, sinks, bf16 out")


def _entry(kw):
    """The entry point a case's keywords are for: v2's where it has v2's names."""
    return pasa_npu.fused_attention_v2 if "num_query_heads" in kw else pasa_npu.fused_attention


def _on(backend, q, k, v, kw):
    q, k, v = on_device(backend, q, k, v)
    for name in ("atten_mask", "block_table", "learnable_sink"):
        if isinstance(kw.get(name), torch.Tensor):
            kw = dict(kw, **{name: on_device(backend, kw[name])[0]})
    return q, k, v, dict(kw, backend=backend)


def _graph_ops(fn, *args):
    """The call_function targets of the graph(s) torch.compile captures for ``fn``."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return targets, out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", [b for b, _ in BACKEND_DEVICES])
def test_compiled_call_is_one_operator_with_the_eager_outputs(backend, case):
    q, k, v, kw = _on(backend, *_case(case))
    entry = _entry(kw)
    with skip_unsupported(backend):
        want = entry(q, k, v, **kw)
    fn = lambda q, k, v: entry(q, k, v, **kw)  # noqa: E731
    targets, got = _graph_ops(fn, q, k, v)
    assert targets.count(OP) == 1, targets
    assert all(t is OP or "getitem" in str(t) for t in targets), targets
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
        assert torch.equal(g, w)


@pytest.mark.parametrize("algorithm", ["pasa", "pasa-exact", "fa-fp16"])
def test_inductor_keeps_the_allocation_roundings(algorithm):
    """Traced into, the torch backend's fp16 steps would be fused by inductor and this
    case's outputs would differ from the eager ones. As one operator the compiled call is
    the eager call."""
    q, k, v, kw = _case("BSH GQA, LSE", seq=256)
    kw = dict(kw, algorithm=algorithm, backend="torch")
    fn = lambda q, k, v: pasa_npu.fused_attention(q, k, v, **kw)  # noqa: E731
    want = fn(q, k, v)
    got = torch.compile(fn)(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_dynamic_shapes_compile_once():
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    fn = torch.compile(lambda q, k, v: pasa_npu.fused_attention(
        q, k, v, num_heads=2, input_layout="BNSD", backend="torch"), backend=backend,
        dynamic=True)
    for seq in (24, 40, 72):
        q, k, v = (torch.randn(1, 2, seq, 32).half() for _ in range(3))
        want = pasa_npu.fused_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                        backend="torch")
        got = fn(q, k, v)
        assert torch.equal(got[0], want[0])
    assert len(compiles) == 1


def test_dynamic_compile_takes_scalars_held_outside_the_function():
    """``dynamic=True`` makes a float (and an int) held by the module a symbolic input:
    the call takes the value it holds, and a changed value gives the eager result (the
    compiled code guards on it)."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale, self.heads, self.kv_block = 0.125, 2, 128

        def forward(self, q, k, v):
            return pasa_npu.fused_attention(q, k, v, num_heads=self.heads, input_layout="BNSD",
                                            scale=self.scale, kv_block=self.kv_block,
                                            backend="torch", algorithm="pasa")

    module = Attention()
    compiled_module = torch.compile(module, fullgraph=True, dynamic=True)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=torch.Generator().manual_seed(i)).half()
               for i in range(3))
    for scale, kv_block in ((0.125, 128), (0.5, 128), (0.5, 32)):
        module.scale, module.kv_block = scale, kv_block
        want = Attention.forward(module, q, k, v)
        assert torch.equal(compiled_module(q, k, v)[0], want[0])


def test_export_keeps_the_operator():
    """torch.export records the same operator, and the exported program runs it."""
    q, k, v, kw = _case("BSH GQA, LSE")
    kw = dict(kw, backend="torch")

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return pasa_npu.fused_attention(q, k, v, **kw)

    program = torch.export.export(Attention(), (q, k, v))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(OP) == 1
    got, want = program.module()(q, k, v), Attention()(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

@pytest.mark.parametrize("case", CASES)
def test_operator_registration(case):
    """Schema, fake (meta) implementation against the real one, and AOT dispatch."""
    q, k, v, kw = _case(case)
    kw = {arguments.V2_RENAMES.get(name, name): value for name, value in kw.items()}
    kw = dict(kw, backend="torch")
    if kw.get("out_dtype") is not None:  # the schema takes its ScalarType code
        kw["out_dtype"] = {torch.float16: 5, torch.bfloat16: 15}[kw["out_dtype"]]
    lengths = {}
    for name in ("actual_seq_lengths", "actual_seq_lengths_kv"):
        value = kw.pop(name, None)
        lengths[name] = value if isinstance(value, list) else None
        lengths[name + "_tensor"] = value if isinstance(value, torch.Tensor) else None
    defaults = op_defaults()
    tensors = [kw.pop(name, None) for name in ("atten_mask", "block_table", "learnable_sink")]
    torch.library.opcheck(OP, (q, k, v, *tensors), dict(lengths, **dict(defaults, **kw)))


@pytest.mark.parametrize("bad, error, message", [
    (dict(pse_shift=torch.zeros(1)), NotImplementedError, "pse_shift=.* is not implemented"),
    (dict(num_heads="2"), TypeError, "num_heads must be an int, got '2'"),
    (dict(actual_seq_lengths=[2.5]), TypeError, "actual_seq_lengths must be a list of ints"),
    (dict(scale=-1.0), ValueError, "scale must be finite and positive"),
    (dict(atten_mask=[[0]]), TypeError, "atten_mask must be a tensor or None, got"),
])
def test_compiled_call_raises_the_eager_errors(bad, error, message):
    q, k, v = (torch.randn(1, 2, 8, 32).half() for _ in range(3))
    kw = dict(dict(num_heads=2, input_layout="BNSD", backend="torch"), **bad)
    with pytest.raises(error, match=message):
        torch.compile(lambda q, k, v: pasa_npu.fused_attention(q, k, v, **kw))(q, k, v)


@pytest.mark.parametrize("layout", ["BNSD", "TND"])
def test_compiled_call_reports_its_overflow_repair(layout):
    """Scores past fp16 on some rows: the compiled call repairs them as the eager call
    does, and overflow_report() describes it from the compiled graph's outputs (the row
    flags the operator returns), call after call; an unchecked compiled call says so."""
    from pasa_npu.tools.inputs import spread

    q, k, v = spread((2, 2, 40, 32))
    kw = dict(num_heads=2, input_layout="BNSD", backend="torch", algorithm="pasa")
    if layout == "TND":
        q, k, v = (t.transpose(1, 2).reshape(80, 2, 32) for t in (q, k, v))
        kw = dict(kw, input_layout="TND", actual_seq_lengths=[40, 80],
                  actual_seq_lengths_kv=[40, 80])
    fn = lambda q, k, v: pasa_npu.fused_attention(q, k, v, **kw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        want = fn(q, k, v)
        eager = pasa_npu.overflow_report()
        counts = (eager.rows, eager.tiles, eager.nonfinite_rows)
        assert eager.rows > 0
        compiled_fn = torch.compile(fn, fullgraph=True)
        for _ in range(2):
            pasa_npu.fused_attention(q, k, v, **dict(kw, algorithm="fa-fp32"))  # unchecked
            got = compiled_fn(q, k, v)
            report = pasa_npu.overflow_report()
            assert torch.equal(got[0], want[0])
            assert (report.checked, report.algorithm, report.backend) == (True, "pasa", "torch")
            assert (report.rows, report.tiles, report.nonfinite_rows) == counts
        unchecked = torch.compile(lambda q, k, v: pasa_npu.fused_attention(
            q, k, v, **dict(kw, repair_overflow=False)), fullgraph=True)
        unchecked(q, k, v)
        assert not pasa_npu.overflow_report().checked


def test_operator_keeps_none_of_its_tensors_alive():
    """A CUDA graph's memory pool (mode="reduce-overhead") requires every tensor the
    operator allocates and keeps to be an output: its row flags are returned, and once
    the caller drops its outputs nothing holds them (the report takes them from the
    compiled code, not from the operator)."""
    import gc
    import weakref

    from pasa_npu.tools.inputs import spread

    q, k, v = spread((1, 2, 40, 32))
    defaults = op_defaults()
    kw = dict(defaults, num_heads=2, input_layout="BNSD", backend="torch", algorithm="pasa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pasa_npu.OverflowRepairWarning)
        outputs = OP(q, k, v, None, None, None, None, None, None, None, **kw)
    flags = outputs[2]
    assert flags.shape == (1, 2, 40) and flags.dtype == torch.uint8 and flags.any()
    refs = [weakref.ref(t) for t in outputs]
    del outputs, flags
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_operator_gives_its_backend_no_plan_state(monkeypatch):
    """The operator's call hands its backend no plan state, where a backend records what
    it would keep for the plan's later calls (the Triton launches and their workspaces);
    the eager call of the same plan hands it one."""
    from pasa_npu.fallback.torch import blockwise

    seen = []
    run = blockwise.run
    monkeypatch.setattr(blockwise, "run", lambda problem: seen.append(problem.plan_state)
                        or run(problem))
    pasa_npu.plans.clear()  # a cached plan holds the backend's run it resolved
    q, k, v, kw = _case("BSH GQA, LSE")
    kw = dict(kw, backend="torch")
    defaults = op_defaults()
    OP(q, k, v, None, None, None, None, None, None, None, **dict(defaults, **kw))
    pasa_npu.fused_attention(q, k, v, **kw)
    assert seen[0] is None and isinstance(seen[1], dict)


_REDUCE_OVERHEAD = """
import sys, torch, pasa_npu
s_q, algorithm = int(sys.argv[1]), sys.argv[2]
gen = torch.Generator(device="cuda").manual_seed(3)
q = torch.randn(2, 8, s_q, 128, device="cuda", generator=gen).half()
k, v = (torch.randn(2, 2, 1000, 128, device="cuda", generator=gen).half() for _ in range(2))
kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BNSD", scale=128 ** -0.5,
          softmax_lse_flag=True, algorithm=algorithm)
fn = torch.compile(lambda q, k, v: pasa_npu.fused_attention(q, k, v, **kw),
                   mode="reduce-overhead", fullgraph=True)
got = [[t.clone() for t in fn(q, k, v)] for _ in range(4)]  # warm-up, capture, replays
want = pasa_npu.fused_attention(q, k, v, **kw)
assert all(torch.equal(g[0], want[0]) and torch.equal(g[1], want[1]) for g in got)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("algorithm", ["pasa-exact", "pasa", "fa-fp32"])
@pytest.mark.parametrize("s_q", [1, 300])
def test_reduce_overhead_replays_cuda_graphs_on_gpu(s_q, algorithm, tmp_path):
    """mode="reduce-overhead": the operator is captured into a CUDA graph and replayed, the
    same as the eager call, in a fresh process whose first call is the compiled one (what
    the package caches, made during the graph's warm-up, would sit in its memory pool)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _REDUCE_OVERHEAD, str(s_q),
                           algorithm], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_operator_schema_derives_from_the_argument_table():
    """The operator takes every implemented argument of the table once (each length
    argument as a list and as a tensor) and nothing unimplemented; the public signature is
    the table's, torch_npu's keywords first."""
    schema = OP._schema
    names = [a.name for a in schema.arguments]
    table = (*arguments.KEYWORD_ARGUMENTS, *arguments.V2_EXTENSIONS)
    implemented = [a.name for a in table if a.kind != "unimplemented"]
    lengths = [a.name for a in table if a.kind == "lengths"]
    assert sorted(names) == sorted(["query", "key", "value", *implemented,
                                    *(n + "_tensor" for n in lengths)])
    assert not set(names) & set(arguments.UNIMPLEMENTED_KEYWORDS)
    assert set(compiled.OP_SCALARS) == {a.name for a in table if a.kind == "scalar"}
    types = {a.name: str(a.type) for a in schema.arguments}
    assert types["algorithm"] == "Optional[str]" and types["softmax_lse_flag"] == "bool"
    assert types["scale"] == "float" and types["atten_mask"] == "Optional[Tensor]"
    assert types["learnable_sink"] == "Optional[Tensor]" and types["out_dtype"] == "Optional[int]"
    params = list(inspect.signature(pasa_npu.fused_attention).parameters)
    assert params == ["query", "key", "value", *(a.name for a in arguments.KEYWORD_ARGUMENTS)]


def test_unknown_keyword_is_refused_eager_and_compiled():
    q, k, v = (torch.randn(1, 2, 8, 32).half() for _ in range(3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_head'"):
        pasa_npu.fused_attention(q, k, v, num_head=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_head'"):
        torch.compile(lambda q, k, v: pasa_npu.fused_attention(q, k, v, num_head=2))(q, k, v)
