"""Every Triton kernel variant compiles for the H100 (sm_90) and fits its shared memory,
checked without a GPU through Triton's own compiler and ptxas (tools/dev/triton_aot.py).
Runs in a subprocess: the tests' Triton interpreter would replace the compiler here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is not installed")

# One worker runs the module (pytest's ``--dist loadgroup``): each report's compile runs once,
# and the loop counts below, which compile variants those reports compiled, find them in
# Triton's cache
pytestmark = pytest.mark.xdist_group("triton_aot")

from pasa_npu.fallback.gluon import prefill as gluon_prefill  # noqa: E402


def _triton_aot(*args: str) -> str:
    """stdout of ``python -m pasa_npu.tools.dev.triton_aot ARGS``, which must exit 0 (it fails
    a variant over the shared-memory limit, or whose decode launch assumes another count
    of resident programs than the compiled kernel allows)."""
    run = subprocess.run([sys.executable, "-m", "pasa_npu.tools.dev.triton_aot", *args],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"),
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    return run.stdout


def _compiled_loops(labels: list) -> dict:
    """For each of triton_aot's variant ``labels`` (d = 64 and 128), compiled alone in a
    subprocess: its loops that issue matrix instructions, each [instruction count,
    {opcode: count}] (:func:`triton_aot.sass_loops`; none where nvdisasm is missing), those
    of them that hold no other such loop (``innermost``: the kv loops),
    and its HGMMA instructions, all of them and those that wait for their group (gsb0)."""
    script = (
        "import json, sys\n"
        "from pasa_npu.tools.dev import triton_aot as aot\n"
        "out = {}\n"
        "for d in (64, 128):\n"
        "    for kernel, label, consts, warps, stages, fusion in aot.variants(d):\n"
        "        if label not in sys.argv[1:]:\n"
        "            continue\n"
        "        compiled = aot.compile_any(kernel, consts, warps, stages, fusion)\n"
        "        sass = aot.sass(compiled)\n"
        "        hgmma = [line for line in (sass or '').splitlines() if 'HGMMA' in line]\n"
        "        loops = aot.sass_loops(compiled, sass)\n"
        "        inner = [[n, ops] for _, _, n, ops in aot.innermost(loops)]\n"
        "        out[label] = dict(\n"
        "            loops=[[n, ops] for _, _, n, ops in loops], innermost=inner,\n"
        "            hgmma=len(hgmma), hgmma_waited=sum('gsb0' in line for line in hgmma))\n"
        "print(json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", script, *labels], capture_output=True,
                         text=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert sorted(out) == sorted(labels)
    return out


@pytest.fixture(scope="module")
def aot_report() -> str:
    """triton_aot's report of every variant at d = 128 and 256 (one compile run)."""
    return _triton_aot("--dims", "128", "256")


def test_every_kernel_variant_compiles_for_sm90(aot_report):
    stdout = aot_report
    for d, decode_tiles in ((128, 2), (256, 1)):
        report = "\n".join(line for line in stdout.splitlines() if f"d={d}" in line)
        # 6 allocations x (full, causal, and at d = 128 an explicit mask); pasa-exact's
        # in-kernel row constant and the fused key shift of the 3 PASA allocations, each in
        # those mask modes; decode per
        # allocation and query heads per program (16 and 32 at d = 128, 16 at d = 256),
        # each with the resident programs its launch assumes; the Gluon prefill for
        # pasa-exact, pasa and fa-fp32, full and causal, at d = 128 (not 256)
        # at d = 128 the paged variants of pasa-exact, pasa and fa-fp32: causal prefill,
        # decode (fa-fp32 also with kv blocks straddling cache blocks), the Gluon prefill; the
        # overflow repair's launch after prefill, contiguous and paged; the Gluon prefill of
        # pasa-exact and pasa with the key shift in its launch
        gluon = 11 if d == 128 and gluon_prefill.AVAILABLE else 0
        modes = 3 if d == 128 else 2
        paged_decode = 4 if d == 128 else 0
        paged = 3 + paged_decode if d == 128 else 0
        assert report.count("smem") == ((6 + 1 + 3) * modes + 6 * decode_tiles + gluon
                                        + paged + 2), report
        assert report.count("repair ") == 2, report
        assert report.count("(gluon)") == gluon, report
        assert report.count(" resident ") == 6 * decode_tiles + paged_decode, report
        assert report.count(" paged ") == paged + (3 if gluon and d == 128 else 0) + 1, report


def test_paged_kv_loops_keep_the_pipeline_depth(aot_report):
    """A paged kv loop loads the block table's entry, then K and V from the block it names.
    Where Triton's pipeliner stages that load (prefill, and decode's per-key loads), it gives
    it a stage of its own and splits the others with it, so 2s - 1 stages keep K and V as
    many blocks ahead as s stages without a table (``launch.paged_stages``); decode's TMA loop
    loads the next entry itself, a block ahead, and keeps s stages. Either way: the same
    shared memory as the contiguous kernel (the table's entries add bytes, not tiles) and,
    for decode, the same resident programs (triton_aot flags any other count)."""
    smem = {}
    for line in aot_report.splitlines():
        if " smem " in line:
            label, rest = line.split("  smem")[0].strip(), line.split(" smem ")[1]
            smem[label] = int(rest.split()[0])
    pairs = [(f"{alg} causal d=128", f"{alg} paged causal d=128")
             for alg in ("pasa-exact", "pasa", "fa-fp32")]
    pairs += [(f"{alg} decode g=16 d=128", f"{alg} paged decode g=16 d=128")
              for alg in ("pasa-exact", "pasa", "fa-fp32")]
    pairs += [("fa-fp32 decode g=16 d=128", "fa-fp32 paged per key decode g=16 d=128")]
    for contiguous, paged in pairs:
        assert 0 <= smem[paged] - smem[contiguous] <= 1024, (contiguous, paged, smem)


@pytest.fixture(scope="module")
def aot_d64() -> str:
    """triton_aot's report of the d = 64 variants the first test leaves out: decode and the
    Gluon prefill, with the instruction counts of their loops (one compile run for the
    tests below)."""
    return _triton_aot("--dims", "64", "--only", "decode", "(gluon)", "--sass")


def test_decode_launch_assumes_the_resident_programs_the_kernels_allow(aot_d64):
    """Decode sizes its kv splits to one wave of programs on the GPU; how many programs an
    SM holds at once follows from each compiled variant's shared memory and registers.
    triton_aot fails a variant whose count differs from the launch's table. d = 128 and 256
    are checked with every variant above; here d = 64."""
    # 6 allocations x 3 choices of query heads per program (16, 32, 64)
    assert aot_d64.count(" resident ") == 6 * 3, aot_d64


def test_gluon_prefill_compiles_at_d64(aot_d64):
    """The Gluon prefill at d = 64, where it runs three consumer groups (192-row tiles, 168
    registers a thread) for every allocation, with and without a mask: each variant
    compiles and fits its shared memory (the test above compiles d = 128 and 256), and
    pasa-exact's and pasa's with the key shift in the launch."""
    if not gluon_prefill.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    from pasa_npu.tools.dev import triton_aot

    tiles = {consts["BLOCK_M"] for kernel, _, consts, *_ in triton_aot.variants(64)
             if kernel == "gluon"}
    assert tiles == {192}, tiles  # the three-group kernel
    gluon = [line for line in aot_d64.splitlines() if "(gluon)" in line]
    assert len(gluon) == 8 and all(" smem " in line for line in gluon), aot_d64


def test_gluon_causal_diagonal_blocks_test_each_key_in_two_instructions(aot_d64):
    """Under a causal mask a consumer group's last kv block, the diagonal, is masked key by
    key. Its loop (trailing masked blocks) compares each key's column with the row's last
    visible one: a compare with an immediate and a select per score element in the sm_90
    SASS. The test of a key's full visible range packed the predicates into bit fields
    instead, about six instructions per element: 390 to 510 more than the interior loop
    at d = 64, for each allocation. Each thread holds 64 of a block's scores; the bound
    below leaves room for pasa's per-row selects of its state."""
    if not gluon_prefill.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    loops, label = {}, None
    for line in aot_d64.splitlines():
        if not line.startswith(" "):
            label = line.split("  smem")[0].strip()
        elif label is not None and line.lstrip().startswith("loop "):
            loops.setdefault(label, []).append(int(line.split(": ")[1].split()[0]))
    labels = [f"{alg} causal d=64 (gluon)" for alg in gluon_prefill.ALGORITHMS]
    if not any(loops.get(label) for label in labels):
        pytest.skip("Triton's bundled nvdisasm is missing: no SASS to count")
    groups = gluon_prefill.consumer_groups(64)
    for label in labels:
        # each consumer group (a partition of its own) has the kv loops: the smallest are
        # the interior ones, then the trailing masked ones, then the leading ones (a band's
        # lower edge, which a causal mask never enters); the outer loops hold them
        counts = sorted(loops[label])
        interior, trailing = max(counts[:groups]), max(counts[groups:2 * groups])
        assert trailing - interior <= 5 * 64, (label, counts)


def test_pasa_kv_loops_use_the_cheap_exp_and_paired_conversions():
    """The kv loops of the PASA allocations, in the sm_90 SASS: e^x through the
    flush-to-zero ex2 (``tl.exp`` adds a compare, FSETP, and two multiplies per element
    for its subnormal fix-up) and the fp16 roundings of S' and P'V two elements per F2FP
    (one element each when the compiler converts a tile that stays in registers). Both
    halved pasa's loop; they are counted against the loop's exps (MUFU). In the Gluon
    prefill, pasa's block mean and block sum run on the tensor cores: its loop then has
    no per-element adds (FADD) left, which took 2 of its 12 instructions per element.
    And ptxas keeps its matmuls asynchronous: where it cannot prove a matmul's register
    operands safe, it waits after every HGMMA of the kernel. The Gluon kernel is checked
    at d = 64 too, where it runs three consumer groups without a mask. pasa-exact's interior blocks take the row max of S' on
    packed fp16 pairs (four halvings), not one fp32 max per score (64 a thread and block),
    and load nothing themselves: the loader brings the block means for the row constants
    with K and V (a consumer group that fetches them itself waits for them). In the Gluon
    kernel's interior blocks the only shuffles are the row max's: the row sums from the
    tensor cores and pasa-exact's row constant are read without a reduction across lanes
    (a reduction would add shuffles to pasa's loop and pasa-exact's)."""
    labels = ["pasa full d=128", "pasa-mixed full d=128", "pasa-exact full d=128"]
    if gluon_prefill.AVAILABLE:
        # at d = 64 without a mask, three consumer groups (168 registers a thread)
        labels += [f"{alg} {mode} d={d} (gluon)" for alg in ("pasa", "pasa-exact")
                   for mode in ("full", "causal") for d in (64, 128)]
    compiled = _compiled_loops(labels)
    if not any(c["loops"] for c in compiled.values()):
        pytest.skip("Triton's bundled nvdisasm is missing: no SASS to count")
    for label, c in compiled.items():
        ops = max(c["loops"], key=lambda loop: loop[0])[1]  # the largest loop: the kv loop
        exps = ops["MUFU"]
        assert ops["HGMMA"] > 0 and exps >= 64, (label, ops)
        assert ops.get("FSETP", 0) < exps / 4, f"{label}: tl.exp's subnormal fix-up: {ops}"
        assert ops.get("F2FP", 0) < 2 * exps, f"{label}: fp16 roundings one by one: {ops}"
        if label.endswith("(gluon)"):
            assert c["hgmma_waited"] < c["hgmma"] / 4, f"{label}: serialised: {c}"
            # the smallest kv loop: the interior blocks of a consumer group. The row max
            # takes 2 shuffles a row (2 rows a thread), pasa-exact's column pick 1 more
            interior = min(c["loops"], key=lambda loop: loop[0])[1]
            assert interior.get("SHFL", 0) <= 6, \
                f"{label}: row sums or row constants reduced across lanes: {interior}"
        if label.startswith("pasa ") and label.endswith("(gluon)"):
            # each kv loop (a tile's epilogue, outside them, sums its output rows for the
            # overflow check)
            for _, kv in c["innermost"]:
                assert kv.get("FADD", 0) < kv.get("MUFU", 0) / 2, \
                    f"{label}: row sums in registers: {kv}"
        if label.startswith("pasa-exact ") and label.endswith("(gluon)"):
            assert interior.get("FMNMX", 0) < interior["MUFU"] / 4, \
                f"{label}: the interior row max one fp32 max per score: {interior}"
            assert interior.get("UTMALDG", 0) == 0, f"{label}: a load in the kv loop: {interior}"


def test_triton_causal_diagonal_blocks_test_each_key_against_the_rows_last_column():
    """The Triton prefill's trailing masked blocks (the causal diagonal, a block past
    kv_len) lie past every row's lower edge, so a key is visible where its column is at
    most the row's last visible one: one compare per score. The full test (lower edge,
    upper edge, kv_len, row in range) cost 850 instructions over the interior loop for
    fa-fp32 at d = 128 causal, 629 for pasa-exact (BLOCK_M x BLOCK_N = 128 x 128 over 8
    warps: 64 scores a thread); the bound leaves room for the per-row selects of the
    masked update."""
    # these two variants only (triton_aot --only would compile their Gluon namesakes too)
    labels = ["fa-fp32 causal d=128", "pasa-exact causal d=128"]
    loops = {label: [n for n, _ in c["loops"]] for label, c in _compiled_loops(labels).items()}
    if not any(loops.values()):
        pytest.skip("Triton's bundled nvdisasm is missing: no SASS to count")
    for label in labels:
        # the two largest loops: the masked one, then the interior one (pasa-exact also
        # has its row constants' loop, smaller)
        masked, interior = sorted(loops[label])[-1], sorted(loops[label])[-2]
        assert masked - interior <= 8 * 64, (label, loops[label])


def test_kv_loop_schedules_compare_order_not_registers():
    """``triton_aot --check-loops`` reads kv loops out of SASS text: only the innermost
    loop that issues a matrix instruction, with registers and branch labels abstracted,
    so that the same schedule on other registers compares equal and a reordering does
    not."""
    from pasa_npu.tools.dev import triton_aot as aot

    def sass(first, second, reg):
        return "\n".join([
            "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
            ".L_x_1:",
            "        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;",
            ".L_x_2:",
            f"        /*0020*/                   {first} ;",
            f"        /*0030*/                   {second} ;",
            f"        /*0040*/                   HGMMA.64x128x16.F32 R{reg}, gdesc[UR4], RZ ;",
            "        /*0050*/               @P0 BRA `(.L_x_2) ;",
            "        /*0060*/               @P1 BRA `(.L_x_1) ;",
            "        /*0070*/                   EXIT ;"])
    fadd, fmul = "FADD R5, R6, R7", "FMUL R8, R9, R10"
    base = aot.kv_loop_schedules(None, sass(fadd, fmul, 24))
    assert len(base) == 1 and len(base[0]) == 4  # the inner loop only, its branch included
    renamed = aot.kv_loop_schedules(None, sass(fadd.replace("R5", "R50"), fmul, 88))
    swapped = aot.kv_loop_schedules(None, sass(fmul, fadd, 24))
    assert aot.compare_loops(renamed, base) == [(4, 4, 1.0)]
    (checked, unchecked, same), = aot.compare_loops(swapped, base)
    assert (checked, unchecked) == (4, 4) and 0.5 <= same < 1.0


def test_partition_registers_read_every_setmaxnreg():
    """``triton_aot --check-loops`` reports the register counts a warp-specialised kernel's
    partitions ask for, so that a checked worker taking registers from the default
    partition shows: the distinct counts of every USETMAXREG, whichever its form."""
    from pasa_npu.tools.dev import triton_aot as aot

    def sass(loader: int) -> str:
        return "\n".join([
            "        /*0200*/                   USETMAXREG.DEALLOC.CTAPOOL 0x78 ;",
            "        /*0300*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ;",
            f"        /*0400*/                   USETMAXREG.DEALLOC.CTAPOOL {loader:#x} ;",
            f"        /*0500*/                   USETMAXREG.DEALLOC.CTAPOOL {264 - loader:#x} ;",
            "        /*0600*/                   EXIT ;"])
    assert aot.partition_registers(None, sass(24)) == [24, 120, 240]
    assert aot.partition_registers(None, sass(32)) == [32, 120, 232, 240]
    assert aot.partition_registers(None, "        /*0000*/                   EXIT ;") == []
