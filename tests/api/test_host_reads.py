"""No host synchronisation on the paths with device tensors (docs/design.md, "No host
synchronisation"), checked on the CPU: the checker of tests/_host_reads.py marks every
tensor argument of a call as the device's memory and fails on any host read of one or of
what is computed from it. The problem's host memory is the CPU, so the package is told that
no memory is the host's (``problem.host_memory``) and takes its device paths throughout.

Every argument form of the golden matrix (tests/test_golden.py), the paged cases
(tests/_paged.py) and v2 with learnable sinks run through backend ``npu`` (its operator a CPU
stand-in, tests/ascend_kernels/test_npu_backend.py) and, under Triton's interpreter, ``triton`` (its kernel
launches are the device's side). Each call runs once to make its plan (a block table and an
optimized mask are checked once, with a read, when first seen), then under the checker.
Lengths go as Python lists, and as tensors: ``npu`` refuses lengths on the device, as
torch_npu's operator, which takes host lists; the other backends read them once."""
from __future__ import annotations

import sys

import pytest
import torch

import pasa_npu
from _host_reads import HostRead, HostReadChecker
from _paged import PAGED_CASES, paged_case
from _support import BACKENDS, interpreted
from pasa_npu import problem as problem_module
from test_golden import CASES, make_case, shrink

#: host reads the contract documents (docs/design.md, "No host synchronisation"): lengths
#: given on the device are read once per call where a backend takes them (not npu); bf16
#: inputs of a PASA allocation have their range checked
DOCUMENTED = ("pasa_npu.lengths.read_device_lengths", "pasa_npu.numerics.to_fp16_checked")
LENGTHS = ("actual_seq_lengths", "actual_seq_lengths_kv")


@pytest.fixture
def no_host_memory(monkeypatch):
    """Every device is a device: the package's host-memory test answers False everywhere."""
    original = problem_module.host_memory
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "").startswith("pasa_npu")
                and getattr(module, "host_memory", None) is original):
            monkeypatch.setattr(module, "host_memory", lambda device: False)
    yield


def _forms():
    """name -> (v2, query, key, value, keywords) of every argument form, fp16."""
    forms = {}
    for name, case in CASES.items():
        q, k, v, kw = make_case(case, torch.float16)
        forms[name] = (False, q, k, v, kw)
    q, k, v, kw = make_case(CASES["bnsd"], torch.bfloat16)
    forms["bnsd bf16"] = (False, q, k, v, kw)
    for name, case in PAGED_CASES.items():
        q, k, v, kw, _ = paged_case(case, torch.float16)
        forms[f"paged {name}"] = (False, q, k, v, kw)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(42, 4, 32, generator=g).half()
    k, v = (torch.randn(330, 2, 32, generator=g).half() for _ in range(2))
    forms["v2 tnd sinks"] = (True, q, k, v, dict(
        num_query_heads=4, num_key_value_heads=2, softmax_scale=32 ** -0.5,
        input_layout="TND", actual_seq_qlen=[1, 41, 42], actual_seq_kvlen=[90, 250, 330],
        return_softmax_lse=True, sparse_mode=3, atten_mask=pasa_npu.compressed_causal_mask(),
        learnable_sink=torch.tensor([-1.0, 0.5, 2.0, 4.0])))
    with torch.inference_mode():  # as a serving loop may make it: an inference tensor
        inference_mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    v2, q, k, v, kw = forms["v2 tnd sinks"]
    forms["v2 tnd sinks, inference-mode mask"] = (v2, q, k, v, dict(kw, atten_mask=inference_mask))
    return forms


FORMS = _forms()
_V2_LENGTHS = {"actual_seq_qlen": "actual_seq_lengths", "actual_seq_kvlen": "actual_seq_lengths_kv"}


def _length_forms(names) -> list[tuple[str, str]]:
    """(form, lengths) pairs: every form with host lists, and as tensors where it has lengths."""
    pairs = []
    for name in names:
        pairs.append((name, "host lists"))
        if any(FORMS[name][4].get(k) is not None for k in (*LENGTHS, *_V2_LENGTHS)):
            pairs.append((name, "tensors"))
    return pairs


def _with_tensor_lengths(keywords: dict) -> tuple[dict, list]:
    """``keywords`` with their lengths as int64 tensors, and those lengths' names."""
    keywords, names = dict(keywords), []
    for name in (*LENGTHS, *_V2_LENGTHS):
        if keywords.get(name) is not None:
            keywords[name] = torch.tensor(keywords[name], dtype=torch.int64)
            names.append(name)
    return keywords, names


def _run_checked(v2: bool, q, k, v, keywords: dict):
    """The call once to plan it, then under the checker, its tensors marked, as a call and
    as a plan's run; the checker. A checked call's row flags are the device's: the report,
    which reads them when asked, is a host read the checker sees."""
    call, plan = ((pasa_npu.fused_attention_v2, pasa_npu.plan_v2) if v2
                  else (pasa_npu.fused_attention, pasa_npu.plan))
    call(q, k, v, **keywords)
    checker = HostReadChecker(DOCUMENTED)
    with checker:
        checker.mark(q, k, v, [t for t in keywords.values() if isinstance(t, torch.Tensor)])
        call(q, k, v, **keywords)
        plan(q, k, v, **keywords).run(q, k, v)
        if keywords["algorithm"] != "fa-fp32":
            with pytest.raises(HostRead, match="overflow.py"):
                pasa_npu.overflow_report().rows
    return checker


def test_the_checker_catches_host_reads():
    """Each kind of read of a marked tensor, or of one computed from it, raises naming the
    read (and the package line, where a package function reads); the same reads of
    unmarked tensors, and the device's own, pass."""
    from pasa_npu import lengths

    reads = {"tolist": lambda t: t.tolist(), "item": lambda t: t.sum().item(),
             "__bool__": lambda t: bool((t > 1).any()), "__int__": lambda t: int(t.max()),
             "__index__": lambda t: [0, 1, 2, 3][t[0]], "cpu": lambda t: t.cpu(),
             "numpy": lambda t: t.numpy(), "to": lambda t: t.to("cpu"),
             "__format__": lambda t: f"{t[0]}", "nonzero": lambda t: t.nonzero(),
             "unique": lambda t: t.unique(), "equal": lambda t: torch.equal(t, t + 0),
             "__getitem__": lambda t: t[t > 1],
             "repeat_interleave": lambda t: torch.arange(3).repeat_interleave(t)}
    for name, read in reads.items():
        checker = HostReadChecker()
        with checker:
            marked, free = torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3])
            checker.mark(marked)
            derived = (marked * 2)[1:]
            written = torch.zeros(3, dtype=torch.int64)
            written.copy_(marked)
            read(free)
            with checker.device_side():
                read(marked)
            for t in (marked, derived, written):
                with pytest.raises(HostRead, match=name):
                    read(t)
    checker = HostReadChecker()
    with checker, pytest.raises(HostRead, match=r"tolist at .*lengths\.py:\d+ in int_list"):
        marked = torch.tensor([4, 5])
        checker.mark(marked)
        lengths.int_list(marked, "actual_seq_lengths")


from test_npu_backend import npu_backend_on_cpu  # noqa: E402,F401  (the fixture)


@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
@pytest.mark.parametrize("form,lengths", _length_forms(FORMS))
def test_npu_reads_no_device_tensor(npu_backend_on_cpu, no_host_memory, form, algorithm, lengths):
    pytest.importorskip("pasa_npu._ascendc_emu", reason="the ascendc-emu extension is not built")
    v2, q, k, v, keywords = FORMS[form]
    keywords = dict(keywords, algorithm=algorithm, backend="npu")
    if lengths == "tensors":
        keywords, names = _with_tensor_lengths(keywords)
        call = pasa_npu.fused_attention_v2 if v2 else pasa_npu.fused_attention
        with pytest.raises(ValueError, match=f"{names[0]} is a tensor on .*backend 'npu'"):
            call(q, k, v, **keywords)
        return
    try:
        checker = _run_checked(v2, q, k, v, keywords)
    except NotImplementedError as exc:
        pytest.skip(f"npu does not support this form: {exc}")
    assert not checker.allowed_hits or form == "bnsd bf16", checker.allowed_hits


#: one form of each kind for the interpreter (slow): dense, packed, decode, masks, band,
#: paged, v2 sinks
TRITON_FORMS = ("bsh-gqa2", "tnd", "decode-ragged", "decode-mask", "mask4d-mean-rows",
                "right-down-ragged", "tnd-mixed-band", "paged decode-bsh-3d",
                "paged tnd-mixed-3d-causal", "v2 tnd sinks")


@pytest.mark.skipif("triton" not in BACKENDS or not interpreted("triton"),
                    reason="needs Triton's interpreter on the CPU")
@pytest.mark.parametrize("algorithm", ["pasa", "fa-fp32"])
@pytest.mark.parametrize("form,lengths", _length_forms(TRITON_FORMS))
def test_triton_reads_no_device_tensor(no_host_memory, monkeypatch, form, algorithm, lengths):
    from pasa_npu.fallback import kernel_common

    v2, q, k, v, keywords = FORMS[form]
    if not form.startswith(("paged", "v2")):
        q, k, v, keywords = make_case(shrink(CASES[form]), torch.float16)
    keywords = dict(keywords, algorithm=algorithm, backend="triton")
    if lengths == "tensors":
        keywords, _ = _with_tensor_lengths(keywords)
    checkers = []
    launch = kernel_common._launch

    def launch_on_device(kernel, grid, args, kwargs):
        mode = checkers[-1] if checkers else None
        if mode is None:
            return launch(kernel, grid, args, kwargs)
        with mode.device_side(args, kwargs):
            return launch(kernel, grid, args, kwargs)

    monkeypatch.setattr(kernel_common, "_launch", launch_on_device)
    original_init = HostReadChecker.__init__

    def remembered(self, *a, **kw):
        original_init(self, *a, **kw)
        checkers.append(self)

    monkeypatch.setattr(HostReadChecker, "__init__", remembered)
    checker = _run_checked(v2, q, k, v, keywords)
    # lengths given on the device stay there on this backend (every form here: none is
    # bf16 with an explicit mask, or paged with one)
    assert not [hit for hit in checker.allowed_hits if "read_device_lengths" in hit], \
        checker.allowed_hits
