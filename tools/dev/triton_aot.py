"""Compile the Triton kernels ahead of time for a CUDA target, without a GPU.

``python -m pasa_npu.tools.dev.triton_aot`` compiles every prefill and decode variant (and
the warp-specialised Gluon prefill) for sm_90 (H100) with Triton's bundled ptxas and
prints, per variant, shared memory, registers, spill stores and local memory (from the
bundled cuobjdump). It catches compile errors and shared-memory overflows on machines
with no GPU, and shows the register pressure of a change before any device time is
spent. ``--sass`` also prints the instruction count of every loop that issues matrix
instructions (the kv loops, from the bundled nvdisasm), its most frequent opcodes and
its spill stores and reloads (STL, LDL) where it has any;
``--check-loops`` compiles each variant with the overflow check unchecked too and says,
per kv loop, how much of its schedule the check left in place (registers aside);
``--only TEXT`` compiles only the variants whose label contains TEXT (or any of several).
Arguments are specialised as Triton's JIT specialises contiguous inputs (unit strides and
a GQA group of 1 as constants, 16-divisible pointers and strides): without that the loads
compile to scalar accesses and the report says nothing about the real pipelining and its
shared memory.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pasa_npu.fallback.gluon import prefill as gp
from pasa_npu.fallback.triton import decode as triton_decode, launch as triton_launch
from pasa_npu.fallback.triton import prefill as triton_prefill, repair as triton_repair
from pasa_npu.fallback.kernel_common import allocation_flags
from pasa_npu.fallback.triton.tuning import DEFAULT_TUNING
from pasa_npu.numerics import ALLOCATIONS

KERNELS = {"prefill_kernel": triton_prefill.prefill_kernel,
           "decode_split_kernel": triton_decode.decode_split_kernel,
           "repair_kernel": triton_repair.repair_kernel}
SHARED_LIMIT = 232448  # bytes per block on sm_90
SM_SHARED = 233472  # bytes per SM on sm_90, of which the driver reserves 1 KiB per block
SM_REGISTERS = 65536
SM_WARPS = 64
POINTERS = {
    "prefill_kernel": dict(Q="*fp16", K="*fp16", V="*fp16", O="*fp16", LSE="*fp32", C="*fp32",
                           MEANS="*fp16", MASK="*u8", SHIFT="*fp32", FLAGS="*u8",
                           OVERFLOW_WORD="*i32",
                           K_PAGES="*i32", V_PAGES="*i32", SINK="*fp32", q_starts="*i32", q_lens="*i32",
                           kv_starts="*i32", kv_lens="*i32", band_pre="*i32", band_next="*i32"),
    "decode_split_kernel": dict(Q="*fp16", K="*fp16", V="*fp16", MASK="*u8", SHIFT="*fp32",
                          PART_O="*fp32", PART_LSE="*fp32", PAGES="*i32", q_starts="*i32",
                          kv_starts="*i32", kv_lens="*i32", ARRIVALS="*i32", O="*fp16",
                          LSE="*fp32", FLAGS="*u8", SINK="*fp32", q_lens="*i32"),
    "repair_kernel": dict(Q="*fp16", K="*fp16", V="*fp16", O="*fp16", LSE="*fp32", FLAGS="*u8",
                    OVERFLOW_WORD="*i32", MASK="*u8", PAGES="*i32", SINK="*fp32",
                    q_starts="*i32",
                    q_lens="*i32", kv_starts="*i32", kv_lens="*i32", band_pre="*i32",
                    band_next="*i32"),
}
FLOATS = ("scale", "gamma")
DIVISIBLE = ("n_heads", "head_dim", "head_dim_v")
DESCRIPTORS = ("K_DESC", "V_DESC")
#: the allocations whose paged variants are compiled (the ones pasa-bench times paged)
PAGED_ALGORITHMS = ("pasa-exact", "pasa", "fa-fp32")


def compile_variant(kernel: str, consts: dict, num_warps: int, num_stages: int,
                    fp_fusion: bool = True, arch: int = 90):
    fn = KERNELS[kernel]
    consts = dict(consts)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name in POINTERS[kernel]:
            sig[name] = POINTERS[kernel][name]
        elif name in DESCRIPTORS:  # tensor descriptors of (1, 1, BLOCK_N, HEAD_DIM) tiles
            sig[name] = (f"tensordesc<fp16[1,1,{consts['BLOCK_N']},"
                         f"{consts['HEAD_DIM' if name == 'K_DESC' else 'HEAD_DIM_V']}]>")
            continue
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
        # what the JIT specialises for contiguous fp16 BNSD tensors with MHA: unit strides
        # and a group of 1 become constants, pointers and the other strides and head
        # counts/dims carry divisibility by 16
        if name.startswith("stride_") and name.endswith("d") or name == "group":
            sig[name] = "constexpr"
            consts[name] = 1
        elif sig[name] != "fp32" and (name in POINTERS[kernel] or name.startswith("stride_")
                                      or name in DIVISIBLE):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       enable_fp_fusion=fp_fusion))


def compile_gluon(consts: dict, fp_fusion: bool = True, arch: int = 90):
    """The warp-specialised Gluon prefill (fallback/gluon/prefill.py) with ``consts``,
    specialised as the JIT specialises contiguous fp16 inputs (16-divisible pointers and
    strides)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    fn, d = gp.prefill_ws_kernel, consts["HEAD_DIM"]

    def descriptor(block):
        layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16)
        return f"tensordesc<fp16[{','.join(map(str, block))}],{layout!r}>"

    rows = {"q_desc": [1, 1, gp.GROUP_ROWS, d], "k_desc": [1, 1, consts["BLOCK_N"], d],
            "v_desc": [1, 1, consts["BLOCK_N"], d], "m_desc": [gp.MEAN_ROWS, d]}
    pointers = dict(O="*fp16", LSE="*fp32", FLAGS="*u8", OVERFLOW_WORD="*i32",
                    next_tile="*i32",
                    band_pre="*i32", band_next="*i32", K_PAGES="*i32", V_PAGES="*i32",
                    K="*fp16", KS="*fp16", MEAN="*fp16", SHIFT="*fp32")
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in rows:
            sig[name] = descriptor(rows[name])
        elif name in pointers:
            sig[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name in ("scale", "gamma", "tail_factor") else "i32"
            if name.startswith("stride_"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn, sig, attrs=attrs,
                         constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=4, enable_fp_fusion=fp_fusion))


def compile_any(kernel: str, consts: dict, num_warps: int, num_stages: int,
                fp_fusion: bool = True):
    """One variant as :func:`variants` yields it: the Gluon prefill (``kernel`` "gluon")
    or a Triton kernel."""
    if kernel == "gluon":
        return compile_gluon(consts, fp_fusion)
    return compile_variant(kernel, consts, num_warps, num_stages, fp_fusion)


def resource_usage(compiled) -> dict:
    """REG, STACK, LOCAL from cuobjdump on the cubin (empty dict if cuobjdump is missing)."""
    text = _run_on_cubin(compiled, "cuobjdump", "--dump-resource-usage")
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", text or "")}


def resident_per_sm(shared: int, registers: int, num_warps: int) -> int:
    """Blocks of a kernel that one sm_90 SM holds at once, as its shared memory (plus the
    1 KiB reserved per block), its registers (allocated per warp in units of 256, each
    thread's count rounded up to a multiple of 8) and its warps allow."""
    warp_registers = -(-registers // 8) * 8 * 32
    return min(SM_SHARED // (shared + 1024), SM_REGISTERS // (warp_registers * num_warps),
               SM_WARPS // num_warps)


def _run_on_cubin(compiled, tool: str, *options: str):
    """stdout of one of Triton's bundled CUDA tools run on the compiled cubin, or None
    where the tool is missing."""
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    if not os.path.exists(path):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([path, *options, f.name], capture_output=True, text=True).stdout


def sass(compiled):
    """The cubin's SASS from the bundled nvdisasm, or None where it is missing."""
    return _run_on_cubin(compiled, "nvdisasm", "-c")


def sass_loops(compiled, text=None) -> list:
    """(first address, last address, instruction count, Counter of opcodes) for every
    loop of the kernel's SASS that contains a tensor-core instruction: the address range
    from a backward branch's target to the branch (the kv loops; pasa-exact's row
    constants are a loop too). ``text``: the SASS where the caller has it already.
    Empty if nvdisasm is missing."""
    return [(first, last, len(body), collections.Counter(op.split(".")[0] for op, _ in body))
            for first, last, body in _loop_bodies(compiled, text)]


def kv_loop_schedules(compiled, text=None) -> list:
    """Each innermost loop of :func:`sass_loops` (one that holds no other: the kv loops)
    as its instructions in order, register numbers and branch targets replaced by
    placeholders: two compiles of a loop give equal lists where ptxas scheduled it
    alike, whatever registers it assigned."""
    return [[re.sub(r"\.L_x_\d+", "L", re.sub(r"\bU?R\d+\b", "R", whole))
             for _, whole in body]
            for _, _, body in innermost(_loop_bodies(compiled, text))]


def innermost(loops: list) -> list:
    """The loops of ``loops`` (tuples that start with a loop's first and last address, as
    :func:`sass_loops` gives them) that hold no other of them: the kv loops."""
    return [loop for loop in loops
            if not any(loop[0] <= other[0] and other[1] <= loop[1]
                       and other[:2] != loop[:2] for other in loops)]


def _loop_bodies(compiled, text=None) -> list:
    """(first address, last address, [(opcode, instruction)]) of :func:`sass_loops`'
    loops."""
    text = sass(compiled) if text is None else text
    if text is None:
        return []
    instructions, labels, pending = [], {}, []
    for line in text.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        ins = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if ins:
            address = int(ins.group(1), 16)
            labels.update((name, address) for name in pending)
            pending = []
            words = ins.group(2).split()
            opcode = words[1] if words[0].startswith("@") else words[0]  # skip a predicate
            instructions.append((address, opcode, ins.group(2)))
    loops = []
    for address, opcode, whole in instructions:
        target = re.search(r"(\.L_x_\d+)", whole) if opcode.startswith("BRA") else None
        if target and labels.get(target.group(1), address + 1) <= address:
            first = labels[target.group(1)]
            body = [(op, w) for a, op, w in instructions if first <= a <= address]
            # a retry branch of a barrier wait, placed after the kernel's exit, jumps back
            # into a loop too: ranges that contain an EXIT are not loops of the kernel
            if (any(op.startswith(("HGMMA", "HMMA")) for op, _ in body)
                    and not any(op.startswith("EXIT") for op, _ in body)):
                loops.append((first, address, body))
    return loops


def partition_registers(compiled, text=None) -> list:
    """The register counts a warp-specialised kernel's partitions ask for (its
    ``setmaxnreg`` instructions, USETMAXREG in SASS), distinct and sorted: the default
    partition gets what the workers leave, so a worker given more takes them from it.
    Empty for a kernel without partitions, or where nvdisasm is missing."""
    text = sass(compiled) if text is None else text
    counts = re.findall(r"USETMAXREG\.\S+\s+(?:U?P\w+,\s*)?(0x[0-9a-f]+|\d+)\s*;", text or "")
    return sorted({int(n, 0) for n in counts})


def compare_loops(checked: list, unchecked: list) -> list:
    """Per kv loop of a checked compile (:func:`kv_loop_schedules`) against the same loop
    unchecked: (instructions checked, unchecked, the share of instructions the two
    schedules have in the same order: 1.0 where ptxas scheduled it alike)."""
    return [(len(a), len(b), difflib.SequenceMatcher(None, a, b, autojunk=False).ratio())
            for a, b in zip(checked, unchecked)]


def variants(head_dim: int = 128):
    """Every prefill variant the defaults can launch (pasa-exact's row constant both ways;
    without a mask, causal, and with an explicit mask) plus the fused key shift of Tuning,
    the decode kernel for each number of query heads per program, per allocation, and
    the Gluon prefill; at head dim 128, the paged variants ("paged" in the label:
    causal prefill, decode at GQA 4:1 with kv blocks inside one cache block and, for
    fa-fp32, straddling them, the Gluon prefill causal) of pasa-exact, pasa and fa-fp32;
    the overflow repair's launch after prefill."""
    for alg, allocation in ALLOCATIONS.items():
        yield from _prefill_variants(alg, allocation, head_dim)
        yield from _decode_variants(alg, allocation, head_dim)
    yield from _repair_variants(head_dim)
    yield from _gluon_variants(head_dim)


def _prefill_variants(alg: str, allocation, head_dim: int):
    """prefill_kernel's variants of one allocation (:func:`variants`)."""
    pasa = allocation.shifts_keys
    paged = head_dim == 128 and alg in PAGED_ALGORITHMS
    fp_fusion = triton_launch.fp_options(allocation) == {}
    forms = [("", False, False)]
    if alg == "pasa-exact":
        forms.append((" (c in kernel)", True, False))
    if pasa:
        forms.append((" (fused shift)", False, True))
    # no mask (interior loop), causal (interior + diagonal), an explicit mask (every
    # block through the masked loop, the mask tile staged with K and V; above d = 128
    # the launch has one stage, mask or not, and it is left out to save compile time)
    modes = [("full", 2), ("causal", 6)] + ([("mask", 1)] if head_dim <= 128 else [])
    for mode, loops in modes:
        for tag, c_per_block, fused in forms:
            consts = dict(**allocation_flags(allocation), HAS_MASK=mode == "mask",
                          HAS_BAND=mode == "causal", HAS_LSE=False, GUARD=False,
                          K_PADDED=pasa and not fused, FUSED_SHIFT=fused, USE_TMA=DEFAULT_TUNING.loads == "tma",
                          C_PER_BLOCK=c_per_block, LOOPS=loops, GRID_1D=False, PAGED=False,
                          CHECK=pasa, PART_FILLED=False, HAS_SINK=False,
                          BLOCK_N=128, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim)
            block_m, warps, stages = triton_launch.launch_config(
                head_dim, alg, False, c_per_block or fused, loops, mode == "mask")
            label = f"{alg}{tag} {mode} d={head_dim}"
            yield ("prefill_kernel", label, dict(consts, BLOCK_M=block_m), warps, stages,
                   fp_fusion)
            if paged and mode == "causal" and not tag:
                yield ("prefill_kernel", f"{alg} paged causal d={head_dim}",
                       dict(consts, BLOCK_M=block_m, PAGED=True), warps,
                       triton_launch.paged_stages(stages), fp_fusion)


def _decode_variants(alg: str, allocation, head_dim: int):
    """decode_split_kernel's variants of one allocation (:func:`variants`)."""
    paged = head_dim == 128 and alg in PAGED_ALGORITHMS
    fp_fusion = triton_launch.fp_options(allocation) == {}
    # every number of query heads per program the launch can pick (GQA 2:1 up to MQA)
    shift_site = triton_launch.decode_shift_site(allocation, DEFAULT_TUNING)
    stages = triton_launch.decode_stages(shift_site, head_dim)
    for block_g in sorted({triton_launch.decode_block_g(g, head_dim)
                           for g in (1, 32, 64, 1024)}):
        # checked as a PASA call is by default: the merge with its row repair compiled in
        consts = dict(**allocation_flags(allocation), HAS_MASK=False, GUARD=False,
                      PAGED=False, WHOLE_PAGE=True, BLOCK_G=block_g,
                      SHIFT_SCORES=shift_site == "scores", CHECK=allocation.shifts_keys,
                      HAS_LSE=False, HAS_SINK=False,
                      REPAIR_KEYS=triton_launch.DECODE_REPAIR_KEYS, REPAIR_WHOLE_PAGE=True,
                      USE_TMA=DEFAULT_TUNING.loads == "tma",
                      BLOCK_N=128, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim)
        yield ("decode_split_kernel", f"{alg} decode g={block_g} d={head_dim}", consts, 4,
               stages, fp_fusion)
    block_g = triton_launch.decode_block_g(4, head_dim)
    for whole, tag in ((True, ""), (False, " per key")) if paged else ():
        if whole or alg == "fa-fp32":
            tma = whole and DEFAULT_TUNING.loads == "tma"
            stages = triton_launch.decode_stages(shift_site, head_dim, table_in_pipeline=not tma)
            consts = dict(consts, PAGED=True, WHOLE_PAGE=whole, BLOCK_G=block_g, USE_TMA=tma)
            yield ("decode_split_kernel", f"{alg} paged{tag} decode g={block_g} d={head_dim}",
                   consts, 4, stages, fp_fusion)


def _repair_variants(head_dim: int):
    """repair_kernel's variants (:func:`variants`)."""
    # the overflow repair after a checked PASA prefill
    for paged in (False, True):
        consts = dict(HAS_MASK=False, HAS_BAND=True, HAS_LSE=True, HAS_SINK=False, GUARD=False,
                      PAGED=paged,
                      WHOLE_PAGE=True, BLOCK_M=64, BLOCK_N=128, HEAD_DIM=head_dim,
                      HEAD_DIM_V=head_dim)
        yield ("repair_kernel", f"repair {'paged ' * paged}prefill d={head_dim}", consts, 4,
               triton_repair.repair_stages(head_dim), True)


def _gluon_variants(head_dim: int):
    """The Gluon prefill's variants (:func:`variants`)."""
    # the warp-specialised Gluon prefill that replaces prefill_kernel where it applies
    for alg in gp.ALGORITHMS if gp.AVAILABLE and head_dim in gp.HEAD_DIMS else ():
        allocation = ALLOCATIONS[alg]
        # (causal, paged, the keys shifted in the launch: Tuning.shift "in-launch")
        forms = [(False, False, False), (True, False, False)] + [(True, True, False)] * (
            head_dim == 128) + [(False, False, True)] * allocation.shifts_keys
        for causal, paged, in_launch in forms:
            consts = dict(PSEUDO_AVERAGE_SHIFT=allocation.pseudo_average_shift,
                          EXACT_SHIFT=allocation.exact_shift, HAS_BAND=causal, HAS_LSE=False,
                          PAGED=paged, CHECK=allocation.shifts_keys, PART_FILLED=False,
                          SHIFT_KEYS=in_launch,
                          BLOCK_M=gp.GROUP_ROWS * gp.consumer_groups(head_dim),
                          BLOCK_N=gp.BLOCK_N, HEAD_DIM=head_dim, STAGES=gp._stages(head_dim))
            mode = (("paged " if paged else "") + ("causal" if causal else "full")
                    + (" in-launch shift" if in_launch else ""))
            yield ("gluon", f"{alg} {mode} d={head_dim} (gluon)",
                   consts, 4, 1, triton_launch.fp_options(allocation) == {})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="triton_aot", description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--only", nargs="+", default=[""], metavar="TEXT",
                        help="compile only the variants whose label contains one TEXT")
    parser.add_argument("--sass", action="store_true",
                        help="also count the instructions of the loops with matrix instructions")
    parser.add_argument("--check-loops", action="store_true",
                        help="for each variant with the overflow check, compile it unchecked "
                             "too and compare the schedules of its kv loops")
    args = parser.parse_args(argv)
    failed = compiled_any = 0
    for d in args.dims:
        for kernel, label, consts, warps, stages, fusion in variants(d):
            if not any(text in label for text in args.only):
                continue
            compiled_any = 1
            try:
                compiled = compile_any(kernel, consts, warps, stages, fusion)
            except Exception as err:  # report every variant, then fail
                failed += 1
                print(f"{label:44s} ERROR {str(err).splitlines()[0][:200]}")
                continue
            use = resource_usage(compiled)
            smem = compiled.metadata.shared
            flag = "  OVER SHARED LIMIT" if smem > SHARED_LIMIT else ""
            resident = ""
            if kernel == "decode_split_kernel" and "REG" in use:
                # the decode launch sizes its splits to one wave of resident programs
                n = resident_per_sm(smem, use["REG"], warps)
                allocation = ALLOCATIONS[label.split()[0]]
                site = triton_launch.decode_shift_site(allocation, DEFAULT_TUNING)
                assumed = triton_launch.decode_resident(site, d, consts["BLOCK_G"])
                resident = f"  resident {n}"
                if n != assumed:
                    flag += f"  LAUNCH ASSUMES {assumed} RESIDENT"
            print(f"{label:44s} smem {smem:7d}  regs {use.get('REG', '?'):>4}  "
                  f"stack {use.get('STACK', '?'):>4}  local {use.get('LOCAL', '?'):>4}"
                  f"{resident}{flag}")
            failed += bool(flag)
            check_loops = args.check_loops and consts.get("CHECK")
            text = sass(compiled) if args.sass or check_loops else None
            for first, last, count, opcodes in sass_loops(compiled, text) if args.sass else []:
                top = ", ".join(f"{op} {n}" for op, n in opcodes.most_common(8))
                # register spills: stores to and loads from local memory inside the loop
                spills = opcodes["STL"] + opcodes["LDL"]
                spilled = f", {opcodes['STL']} STL + {opcodes['LDL']} LDL" if spills else ""
                print(f"    loop {first:#06x}-{last:#06x}: {count} instructions ({top}){spilled}")
            if check_loops:
                unchecked = compile_any(kernel, dict(consts, CHECK=False), warps, stages,
                                        fusion)
                unchecked_text = sass(unchecked)
                checked_loops = kv_loop_schedules(compiled, text)
                unchecked_loops = kv_loop_schedules(unchecked, unchecked_text)
                registers = partition_registers(compiled, text)
                if registers:  # a checked worker's registers come out of the default partition
                    registers_off = partition_registers(unchecked, unchecked_text)
                    print(f"    warp partitions' registers: {', '.join(map(str, registers))}; "
                          + ("the same unchecked" if registers_off == registers else
                             f"unchecked {', '.join(map(str, registers_off))}: "
                             "the check moves registers"))
                if len(checked_loops) != len(unchecked_loops):
                    print(f"    {len(checked_loops)} kv loops checked, {len(unchecked_loops)} "
                          f"unchecked: compared in order, the extra ones not")
                for n, (on, off, same) in enumerate(compare_loops(checked_loops,
                                                                  unchecked_loops)):
                    print(f"    kv loop {n}: {on} instructions checked, {off} unchecked; "
                          f"{same:.0%} in the same order")
    if not compiled_any:
        print(f"triton_aot: error: no variant label contains any of {args.only}",
              file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
