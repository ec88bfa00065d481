"""The mutations tools/dev/mutation_check.py applies (a development list; not installed).

Each is a small bug of the kind the suite claims to catch: a rounding of an allocation
dropped, added or moved, in the CPU backend (the reference) and in the Triton kernels; β's
solution; a mask edge and a length edge; GQA; the LSE; the rounding guard; the decode
split merge; the AscendC kernels' learnable sinks; the resolution check; each emulated
AscendC vector instruction's rounding or order; ring_attention's agreement between ranks;
and the calibration cache's fingerprint. ``tests`` are the pytest arguments that
must catch it, chosen to keep each run short.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    snippet: str
    replacement: str
    tests: tuple[str, ...]


TORCH = "fallback/torch/blockwise.py"
TRITON_SOFTMAX = "fallback/triton/softmax.py"  # the block update both Triton kernels share
TRITON_PREFILL = "fallback/triton/prefill.py"
TRITON_DECODE = "fallback/triton/decode.py"
TRITON_REPAIR = "fallback/triton/repair.py"
OPTIONS = "pasa_npu/options.py"
EMU = "ascend_kernels/emu/emu_ops_vector.h"
EMU_CUBE = "ascend_kernels/emu/emu_ops_cube.h"
EMU_STRIDED = "ascend_kernels/emu/emu_vec_strided.h"  # the level-0 forms of whole tiles
KERNEL_VECTOR = "ascend_kernels/kernels/pasa_attention_vector.h"
KERNEL_CUBE = "ascend_kernels/kernels/pasa_attention_cube.h"
KERNEL_ATTENTION = "ascend_kernels/kernels/pasa_attention.cpp"
KERNEL_TASKS = "ascend_kernels/kernels/pasa_tasks.h"
KERNEL_WORKSPACE = "ascend_kernels/kernels/pasa_workspace.h"
KERNEL_STORE = "ascend_kernels/kernels/pasa_store.h"
KERNEL_STEPS = "ascend_kernels/kernels/pasa_vector_steps.h"
KERNEL_MERGE = "ascend_kernels/kernels/pasa_merge.h"
KERNEL_PREP = "ascend_kernels/kernels/pasa_prepare_keys.h"
DISTRIBUTED = "pasa_npu/distributed.py"
NPU_MODEL = "tools/npu_model.py"
ORACLE = ("tests/fallback/torch/test_oracle.py",)
# the golden matrix of the kernels on 2 or 3 emulated AI Cores (several tasks a core)
FEW_CORES = ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "test_matches_torch_backend and few and fp16")
EMU_VECTOR = ("tests/ascend_kernels/test_ascendc_vector.py",)


def _golden_triton(algorithm: str, *cases: str) -> tuple[str, ...]:
    """The golden test of the Triton kernels (interpreted) on ``cases``, fp16."""
    return tuple(f"tests/test_golden.py::test_matches_golden[{case}-{algorithm}-fp16-triton]"
                 for case in cases)


MUTATIONS = [
    # ---- the seven
    Mutation("fa-fp16: P.V tile not rounded before the accumulate (CPU backend)", TORCH,
             "o_new = _round(_round(a * state.o, low) + _round(_pv(p, v_blk), low), low)",
             "o_new = _round(_round(a * state.o, low) + _pv(p, v_blk), low)", ORACLE),
    Mutation("pasa-mixed: P not rounded to fp16 before P.V (CPU backend)", TORCH,
             "o_new = a * state.o + b * _pv(_round(p, torch.float16), v_blk)",
             "o_new = a * state.o + b * _pv(p, v_blk)", ORACLE),
    Mutation("fa-fp16: the running row sum's inner fp16 roundings dropped (Triton)", TRITON_SOFTMAX,
             "l_new = round_low(round_low(alpha * l, low) + round_low(tl.sum(p, 1), low), low)",
             "l_new = round_low(alpha * l + tl.sum(p, 1), low)",
             ("tests/fallback/triton/test_triton_exact_inputs.py", "-k", "fa_fp16")),
    Mutation("beta solved without the folded scale", OPTIONS,
             "return default_beta(tiling.kv_block, scale)",
             "return default_beta(tiling.kv_block, 1.0)",
             ("tests/api/test_beta.py", "-k", "default_beta")),
    Mutation("actual_seq_lengths with more than B entries: the last B taken", "pasa_npu/lengths.py",
             "else lens[:batch]", "else lens[-batch:]",
             ("tests/api/test_argument_forms.py::test_length_forms[torch]",)),
    Mutation("beta0 instead of the optimal beta", "pasa_npu/beta.py",
             "return optimal_beta(DEFAULT_BETA0, n, dtype, scale)", "return DEFAULT_BETA0",
             ("tests/api/test_beta.py", "-k", "default_beta")),
    Mutation("emulated ReduceSum adds in index order", EMU,
             "        for (int32_t width = perRepeat / 2; width >= 1; width /= 2) {\n"
             "            for (int32_t i = 0; i < width; ++i) lanes[i] = emu::RoundTo<T>"
             "(lanes[2 * i] + lanes[2 * i + 1]);\n        }",
             "        for (int32_t i = 1; i < perRepeat; ++i) lanes[0] = emu::RoundTo<T>"
             "(lanes[0] + lanes[i]);", EMU_VECTOR),
    # ---- each allocation: a rounding dropped, added or moved (CPU backend)
    Mutation("fa-fp32: P enters P.V in fp32", TORCH,
             "o_new = a * state.o + _pv(_round(p, low), v_blk)",
             "o_new = a * state.o + _pv(p, v_blk)", ORACLE),
    Mutation("fa-fp16s: the scores' fp16 rounding moved after the scale", TORCH,
             "        s = _round(s, low)  # unscaled fp16 scores: this is where fa-fp16s "
             "overflows\n    if alloc.low_statistics:",
             "        s = _round(s * problem.scale, low) / problem.scale\n"
             "    if alloc.low_statistics:", ORACLE),
    Mutation("fa-fp16: the exp argument not rounded", TORCH,
             "p = torch.where(vis, r(_exp_visible(r(s - m_new), vis)), 0.0)",
             "p = torch.where(vis, r(_exp_visible(s - m_new, vis)), 0.0)", ORACLE),
    Mutation("pasa: the block mean not rounded to fp16", TORCH,
             "    s_mean = r(s_mean)\n", "", ORACLE),
    Mutation("pasa: gamma not rounded to fp16", TORCH,
             "gamma = _round(torch.tensor(gamma), torch.float16).item() if fp16_stats else gamma",
             "gamma = gamma", ORACLE),
    Mutation("pasa-mixed: the pseudo-average rounded to fp16", TORCH,
             "f_new = r(r(r((n - 1.0) * state.f) + s_mean) / n)",
             "f_new = _round(r(r((n - 1.0) * state.f) + s_mean) / n, torch.float16)", ORACLE),
    Mutation("pasa-exact: the P'V tile not rounded to fp16", TORCH,
             "o_new = a * state.o + r16(_pv(p, v_blk))", "o_new = a * state.o + _pv(p, v_blk)",
             ORACLE),
    Mutation("pasa-exact: the key block mean not rounded to fp16", TORCH,
             "mean16 = _round(kb.sum(-2) / count, torch.float16)",
             "mean16 = kb.sum(-2) / count", ORACLE),
    # ---- a part-filled last kv block: shifted by its own keys' mean
    Mutation("pasa: a part-filled block's mean over all its rows (CPU backend)", TORCH,
             "s_mean = torch.where(torch.isfinite(factor), s.sum(-1, keepdim=True) * factor, "
             "s_mean)", "s_mean = s_mean", ORACLE),
    Mutation("pasa: a part-filled block's correction divided by n, not by its valid keys",
             "pasa_npu/beta.py",
             "/ torch.tensor(valid, dtype=torch.float32))",
             "/ torch.tensor(n, dtype=torch.float32))", ORACLE),
    Mutation("pasa: a part-filled block's padded rows of K' kept (CPU backend)", TORCH,
             "            shifted[b, :, j] = 0.0\n", "", ORACLE),
    Mutation("pasa-exact: a part-filled block's key mean over all its rows (CPU backend)", TORCH,
             "count = valid.clamp(min=1).to(F32)[:, None, :, None]",
             "count = torch.full_like(valid, block).to(F32)[:, None, :, None]", ORACLE),
    # ---- the same in the Triton kernels
    Mutation("pasa-exact: the P'V tile not rounded to fp16 (Triton)", TRITON_SOFTMAX,
             "acc_new = acc * alpha[:, None] + to_fp16_paired(tl.dot(p16, v)).to(tl.float32)",
             "acc_new = acc * alpha[:, None] + tl.dot(p16, v)",
             ("tests/fallback/triton/test_triton_exact_inputs.py", "-k", "pasa_exact")),
    Mutation("pasa: the block mean not rounded to fp16 (Triton)", TRITON_SOFTMAX,
             "    if LOW_STATISTICS:\n        s_mean = round_low(s_mean, low)\n", "",
             ("tests/fallback/triton/test_triton_exact_inputs.py", "-k", "pasa_equals")),
    Mutation("pasa: decode's part-filled last block takes a whole block's mean factor (Triton)",
             TRITON_DECODE, "part_mean_factor = tl.load(SHIFT + keys_in_part * 4 + 2)",
             "part_mean_factor = 1.0 / BLOCK_N", _golden_triton("pasa", "decode-ragged")),
    Mutation("pasa: prefill's part-filled last block takes a whole block's mean factor (Triton)",
             TRITON_PREFILL, "mean_factor = tl.where(blk == tail_blk, tail_factor, 1.0 / BLOCK_N)",
             "mean_factor = 1.0 / BLOCK_N",
             ("tests/fallback/triton/test_triton_exact_inputs.py", "-k", "part_filled and triton")),
    Mutation("kernel: pasa decode's part-filled last block takes a whole block's mean factor",
             KERNEL_STEPS, "const float inv = keys < n ? 1.0f / static_cast<float>(keys) : t.invKvBlock;",
             "const float inv = t.invKvBlock;",
             ("tests/test_golden.py::test_matches_golden[decode-ragged-pasa-fp16-ascendc-emu]",)),
    Mutation("decode: whole kv blocks taken to show every key under an explicit mask too (Triton)",
             TRITON_DECODE, "keys_hidden = part == 1 or HAS_MASK",
             "keys_hidden = part == 1", _golden_triton("fa-fp32", "decode-mask")),
    Mutation("decode: the shifted scores' block maximum taken over hidden keys too (Triton)",
             "fallback/triton/shift.py",
             'seen = tl.where(key_seen[None, :], qk, float("-inf"))', "seen = qk",
             ("tests/fallback/triton/test_triton_shift_scores.py",)),
    Mutation("pasa: decode's block mean summed from P, not S' (Triton)", TRITON_SOFTMAX,
             "tl.reduce((key_scores, p16.to(tl.float32)), 1, _add_pairs)",
             "tl.reduce((p16.to(tl.float32), p16.to(tl.float32)), 1, _add_pairs)",
             _golden_triton("pasa", "decode-gqa4", "decode-ragged")),
    Mutation("decode: the part-filled last block skipped (Triton)", TRITON_DECODE,
             "lo = tl.maximum(first, n_whole)", "lo = last",
             _golden_triton("fa-fp32", "decode-ragged")),
    Mutation("overflow repair (prefill, decode): paged keys and values addressed as "
             "contiguous ones (Triton)", TRITON_REPAIR, "stride_vs, PAGED, WHOLE_PAGE)",
             "stride_vs, False, WHOLE_PAGE)", ("tests/api/test_overflow.py", "-k", "paged and triton")),
    Mutation("the overflow check ignores the output, tests the LSE only (CPU backend)", TORCH,
             "bad = ~torch.isfinite(out).all(-1)",
             "bad = torch.zeros_like(out[..., 0], dtype=torch.bool)",
             ("tests/api/test_overflow.py", "-k", "output_overflow and torch")),
    Mutation("the overflow check ignores the output, tests the LSE only (Triton)",
             TRITON_SOFTMAX, "~(tl.abs(tl.sum(o, 1) + tl.where(lse", "~(tl.abs(tl.where(lse",
             ("tests/api/test_overflow.py", "-k", "output_overflow and triton")),
    Mutation("the overflow check ignores the output, tests the LSE only (AscendC vector)",
             "ascend_kernels/kernels/pasa_vector_steps.h",
             "    RowNonFinite(Stat(T2), x, R_, t_->headDimV);\n    Add(Stat(T2), Stat(T2), lseCheck, r);",
             "    Adds(Stat(T2), lseCheck, 0.0f, r);",
             ("tests/api/test_overflow.py", "-k", "output_overflow and ascendc")),
    Mutation("decode's overflow repair not run: the row flagged, left as it is (Triton)",
             TRITON_DECODE, "if tl.max(flag, 0) != 0:", "if tl.max(flag, 0) == 9:",
             ("tests/api/test_overflow.py", "-k", "decode_overflow and triton")),
    # ---- semantics: mask and length edges, GQA, LSE, the guard, decode's merge
    Mutation("band's upper edge off by one (the problem's visibility)", "pasa_npu/problem.py",
             "vis = vis & (j >= i - pre) & (j <= i + nxt)",
             "vis = vis & (j >= i - pre) & (j < i + nxt)",
             ("tests/api/test_semantics.py", "-k", "sparse_modes")),
    Mutation("causal diagonal edge off by one (Triton)", TRITON_PREFILL,
             "vis = cols[None, :] <= last[:, None]", "vis = cols[None, :] < last[:, None]",
             _golden_triton("pasa-exact", "left-up-causal", "right-down-causal")),
    Mutation("a ragged last block keeps one key past the length (CPU backend)", TORCH,
             "[None, :] < lens.to(x.device)[:, None]", "[None, :] <= lens.to(x.device)[:, None]",
             ORACLE),
    Mutation("GQA: query head h reads kv head h mod Nkv (Triton)", TRITON_PREFILL,
             "    hk = h // group\n", "    hk = h % (n_heads // group)\n",
             _golden_triton("pasa", "bsh-gqa2", "bsnd-mqa")),
    Mutation("PASA's LSE without the recovered bias (CPU backend)", TORCH,
             "true_max = state.m + gamma * state.f", "true_max = state.m", ORACLE),
    Mutation("rounding guard: the offset's lower clamp dropped (CPU backend)", TORCH,
             "offset = offset.clamp(numerics.GUARD_MIN_OFFSET, numerics.GUARD_MAX_OFFSET)",
             "offset = offset.clamp(max=numerics.GUARD_MAX_OFFSET)", ORACLE),
    Mutation("sinks: the sink's value row taken as 1, not 0 (Triton)", TRITON_SOFTMAX,
             "acc = acc * rebase[:, None]", "acc = acc * rebase[:, None] + tl.exp(sink - joined)[:, None]",
             ("tests/fallback/triton/test_triton_sinks.py", "-k", "cpu_backend and prefill and pasa-exact")),
    Mutation("sinks: a prefill row reads the sink of query head 0 (Triton)", TRITON_PREFILL,
             "sink = tl.load(SINK + h)", "sink = tl.load(SINK)",
             ("tests/fallback/triton/test_triton_sinks.py", "-k", "cpu_backend and prefill and fa-fp32")),
    Mutation("sinks: the decode merge leaves the sink out (Triton)", TRITON_DECODE,
             "total = rebase * total + tl.where(seen, tl.exp(sink - joined), 0.0)",
             "total = rebase * total",
             ("tests/fallback/triton/test_triton_sinks.py", "-k", "cpu_backend and decode and pasa")),
    Mutation("sinks: the repair leaves the sink out (Triton)", TRITON_REPAIR,
             "return finish_rows(m, l, acc, f, cnt, 0.0, sink, False, HAS_SINK)",
             "return finish_rows(m, l, acc, f, cnt, 0.0, sink, False, False)",
             ("tests/fallback/triton/test_triton_sinks.py", "-k", "repaired and pasa-exact")),
    Mutation("decode merge: every split's partial result read from the first (Triton)",
             TRITON_DECODE, "rows = part_rows + s * group_rows", "rows = part_rows",
             ("tests/fallback/triton/test_triton_launch.py", "-k", "decode_split_counts and block")),
    # ---- each emulated vector instruction: its rounding or its order
    Mutation("emulated ReduceSum on half: additions not rounded to half", EMU,
             "lanes[i] = emu::RoundTo<T>(lanes[2 * i] + lanes[2 * i + 1]);",
             "lanes[i] = lanes[2 * i] + lanes[2 * i + 1];", EMU_VECTOR),
    Mutation("emulated arithmetic (Add, Mul, Adds, ...): rounds toward zero", EMU,
             "inline T RoundTo(float v) { return static_cast<T>(v); }",
             "inline T RoundTo(float v) { return static_cast<T>(std::nextafter(v, 0.0f)); }",
             EMU_VECTOR),
    Mutation("emulated Sub: operands swapped", EMU,
             "\"Sub\", [](float x, float y) { return x - y; }",
             "\"Sub\", [](float x, float y) { return y - x; }", EMU_VECTOR),
    Mutation("emulated Div: a reciprocal, then a product", EMU,
             "\"Div\", [](float x, float y) { return x / y; }",
             "\"Div\", [](float x, float y) { return x * (1.0f / y); }", EMU_VECTOR),
    Mutation("emulated Max: NaN not propagated", EMU,
             "emu::Binary(dst, src0, src1, count, \"Max\", emu::MaxProp);",
             "emu::Binary(dst, src0, src1, count, \"Max\", [](float x, float y) "
             "{ return x > y ? x : y; });", EMU_VECTOR),
    Mutation("emulated Muls: the scalar rounded to half", EMU,
             "emu::Unary(dst, src, count, \"Muls\", [s](float x) { return x * s; });",
             "emu::Unary(dst, src, count, \"Muls\", [s](float x) "
             "{ return x * static_cast<float>(half(s)); });", EMU_VECTOR),
    Mutation("emulated Exp: through exp2 in fp32", EMU,
             "return static_cast<float>(std::exp(static_cast<long double>(x)));",
             "return std::exp2(x * static_cast<float>(M_LOG2E));", EMU_VECTOR),
    Mutation("emulated Ln: through log2 in fp32", EMU,
             "return static_cast<float>(std::log(static_cast<long double>(x)));",
             "return std::log2(x) * static_cast<float>(M_LN2);", EMU_VECTOR),
    Mutation("emulated Duplicate: the last element left out", EMU,
             "for (int32_t i = 0; i < count; ++i) z[i] = scalarValue;",
             "for (int32_t i = 0; i + 1 < count; ++i) z[i] = scalarValue;", EMU_VECTOR),
    Mutation("emulated Cast: rounds toward zero", EMU,
             "z[i] = static_cast<T>(v);",
             "z[i] = static_cast<T>(std::nextafter(v, 0.0f));",
             EMU_VECTOR),
    Mutation("emulated ReduceMax: starts from 0", EMU,
             "float m = static_cast<float>(x[0]);", "float m = 0.0f;", EMU_VECTOR),
    Mutation("emulated ReduceDataBlock adds a block in index order", EMU_STRIDED,
             "            for (int32_t width = perBlock / 2; width >= 1; width /= 2) {\n"
             "                for (int32_t e = 0; e < width; ++e) {\n"
             "                    lane[e] = reduceType == ReduceType::SUM ? static_cast<float>"
             "(emu::RoundTo<T>(lane[2 * e] + lane[2 * e + 1]))\n"
             + " " * 60 + ": emu::MaxProp(lane[2 * e], lane[2 * e + 1]);\n"
             "                }\n            }\n",
             "            for (int32_t e = 1; e < perBlock; ++e) {\n"
             "                lane[0] = reduceType == ReduceType::SUM ? static_cast<float>"
             "(emu::RoundTo<T>(lane[0] + lane[e]))\n"
             "                                                        : emu::MaxProp(lane[0], "
             "lane[e]);\n            }\n", EMU_VECTOR),
    Mutation("emulated level-0 binary: src0's block stride ignored", EMU_STRIDED,
             "s0.Raw() + BlockAt(r, k, p.src0BlkStride, p.src0RepStride))[e]",
             "s0.Raw() + BlockAt(r, k, 1, p.src0RepStride))[e]", EMU_VECTOR),
    Mutation("emulated Compares: LE without the ties", EMU_STRIDED,
             "case CMPMODE::LE: v = x <= s; break;", "case CMPMODE::LE: v = x < s; break;",
             EMU_VECTOR),
    Mutation("emulated Select: the mask bit's sense inverted", EMU_STRIDED,
             "const bool take0 = (bits[i / 8] >> (i % 8)) & 1u;",
             "const bool take0 = !((bits[i / 8] >> (i % 8)) & 1u);", EMU_VECTOR),
    Mutation("emulated Brcb: every block of a repeat takes its first element", EMU_STRIDED,
             "out[e] = src.Data()[r * 8 + j];", "out[e] = src.Data()[r * 8];", EMU_VECTOR),
    # the multi-task schedule: a core's stream of several tasks of several kv blocks
    Mutation("kernel: the rescale-factor ring indexed by the block within its task", KERNEL_VECTOR,
             "ringSlot_ = RingSlot(softmaxCount_++);", "ringSlot_ = RingSlot(i + 0 * softmaxCount_++);",
             FEW_CORES),
    Mutation("kernel: an AIV without rows skips the row-constant slot", KERNEL_VECTOR,
             "if (t.rowConstants && i % PASA_CONST_BLOCKS == 0) ++constCount_;",
             "if (t.rowConstants && rows_ > 0 && i % PASA_CONST_BLOCKS == 0) ++constCount_;",
             FEW_CORES),
    Mutation("kernel: a task's last kv block dropped", KERNEL_TASKS,
             "task.numBlocks = to - from;", "task.numBlocks = to - from > 1 ? to - from - 1 : to - from;",
             FEW_CORES),
    Mutation("kernel: two AI Cores share one exchange area", KERNEL_WORKSPACE,
             "score = workspace + t.coreAreaOffset + static_cast<uint64_t>(core) * t.coreAreaBytes;",
             "score = workspace + t.coreAreaOffset + static_cast<uint64_t>(core % 2) * t.coreAreaBytes;",
             FEW_CORES),
    Mutation("kernel: a split's partial slot ignores its task", KERNEL_STORE,
             "const uint64_t unit = static_cast<uint64_t>(task.index) * t.kvSplits + task.split;",
             "const uint64_t unit = task.split;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "several_units_per_core")),
    Mutation("kernel: the cube's score slots restart with each task", KERNEL_CUBE,
             "GM_ADDR slot = slots_.score + (scoreCount_++ % PASA_SCORE_SLOTS) * t.scoreSlotBytes;",
             "GM_ADDR slot = slots_.score + ((scoreCount_++, j - task.blockBegin) % PASA_SCORE_SLOTS) * t.scoreSlotBytes;",
             FEW_CORES),
    # a key buffer holding a part of its block (key_buffer_keys)
    Mutation("kernel: each part of K' is copied from its block's first keys", KERNEL_CUBE,
             "task.info.kvLen)) + r0 * d],", "task.info.kvLen))],",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "a_part_at_a_time and pasa-exact")),
    Mutation("kernel: each part of the raw keys is copied from its block's first keys", KERNEL_CUBE,
             "CopyRows(k1, keys_, task, j, r0, r0 + rows, d, false, nk);",
             "CopyRows(k1, keys_, task, j, 0, rows, d, false, nk);",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "a_part_at_a_time and fa-fp32")),
    Mutation("kernel: a key part copied during the score tile repeats the part before it", KERNEL_CUBE,
             "if (next < n / kb) keyL1_.EnQue(CopyKeys(task, j, next));",
             "if (next < n / kb) keyL1_.EnQue(CopyKeys(task, j, next - 1));",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "a_part_at_a_time and fa-fp32")),
    # P' in parts (prob_buffer_keys)
    Mutation("kernel: each part of P' is copied from the tile's first rows", KERNEL_CUBE,
             "const uint32_t m0 = pk == n ? 0 : (p / perRows) * t.cubeRows, k0 = (p % perRows) * pk;",
             "const uint32_t m0 = 0, k0 = (p % perRows) * pk;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "prob_lands and fa-fp32")),
    Mutation("kernel: each part of P' is copied from its row piece's first keys", KERNEL_CUBE,
             "const uint32_t m0 = pk == n ? 0 : (p / perRows) * t.cubeRows, k0 = (p % perRows) * pk;",
             "const uint32_t m0 = pk == n ? 0 : (p / perRows) * t.cubeRows, k0 = 0 * pk;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "prob_lands and pasa-exact")),
    Mutation("kernel: a P' part copied during the P'V repeats the part before it", KERNEL_CUBE,
             "probL1_.EnQue(CopyProb(task, part + PASA_PROB_PART_BUFFERS));",
             "probL1_.EnQue(CopyProb(task, part + PASA_PROB_PART_BUFFERS - 1));",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "prob_lands and pasa-300-64")),
    Mutation("kernel: with one V buffer, the next P'V's values come from the block after it", KERNEL_CUBE,
             "valueL1_.EnQue(CopyValue(win.Get(values.task), win.Get(values.task).blockBegin + values.block));",
             "valueL1_.EnQue(CopyValue(win.Get(values.task), win.Get(values.task).blockBegin + values.block + 1));",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "larger_than_l1_holds_whole and emu")),
    # pasa's key preprocessing of blocks L1 does not hold M^T of (kv_block 512 and more)
    Mutation("kernel: every piece of M^T's rows is the band's first window", KERNEL_PREP,
             "at = ((n - mr - r0) / kC0) * kFractal;", "at = ((n - mr - 0 * r0) / kC0) * kFractal;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "larger_than_l1_holds_whole and pasa-300 and emu")),
    Mutation("kernel: the band's second half starts at M^T's diagonal", KERNEL_PREP,
             "DataCopy(m1[(n / kC0) * kFractal], shift_[mr],", "DataCopy(m1[(n / kC0) * kFractal], shift_[0],",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "larger_than_l1_holds_whole and pasa-300 and emu")),
    Mutation("kernel: each piece of a part-filled block's K' lands on the AIV's first rows", KERNEL_PREP,
             "static_cast<uint64_t>(p0) * d], pr * d);\n            }\n"
             "            if (pr < half_n)",
             "static_cast<uint64_t>(r0) * d], pr * d);\n            }\n"
             "            if (pr < half_n)",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "larger_than_l1_holds_whole and pasa-300 and emu")),
    Mutation("kernel: each piece of pasa-exact's K' centres the AIV's first keys", KERNEL_PREP,
             "static_cast<int64_t>(task.block) * n + p0, d);", "static_cast<int64_t>(task.block) * n + r0, d);",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "larger_than_l1_holds_whole and pasa-exact-300 and emu")),
    # pasa's row sums of P' in more key pieces than L0A keeps: each piece with its P'V
    Mutation("kernel: each key piece's row sums of P' restart the sums", KERNEL_CUBE,
             "if (sumsBeside) Accumulate(s, a2, b2[nk * vc], rows, kC0, k0, nk, n);",
             "if (sumsBeside) Accumulate(s, a2, b2[nk * vc], rows, kC0, 0, nk, k0 + nk == n ? nk : n);",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "a_part_at_a_time and pasa-300")),
    Mutation("kernel: the row sums of P' drain over the P'V's first columns", KERNEL_CUBE,
             "if (sumsBeside) DrainTile(slot, m0, dv, s, kC0, t.pvCols, rows, rowsPad, true);",
             "if (sumsBeside) DrainTile(slot, m0, dv - kC0, s, kC0, t.pvCols, rows, rowsPad, true);",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "a_part_at_a_time and pasa-300")),
    # pasa's row sums of P' on the vector cores (vector_prob_sums)
    Mutation("kernel: the vector cores' row sums skip the rows after the first widened part", KERNEL_STEPS,
             "RowReduce<ReduceType::SUM>(Stat(slot)[GroupRow() + r0], x, tree, w, n);",
             "if (r0 == 0) RowReduce<ReduceType::SUM>(Stat(slot)[GroupRow() + r0], x, tree, w, n);",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "prob_sums_on_the_vector_cores_at_large and emu")),
    Mutation("kernel: the vector cores' row sums of P' are taken of the shifted scores", KERNEL_STEPS,
             "if (VectorProbSums()) ChunkRowSums(T1, p);",
             "if (VectorProbSums()) ChunkRowSums(T1, s);",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "prob_sums_on_the_vector_cores_match and bnsd")),
    Mutation("kernel: l takes b l' without a l", KERNEL_STEPS,
             "Add(nxt[P_L * G], t2, t2[G], g);",
             "Adds(nxt[P_L * G], t2[G], half(0.0f), g);",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "prob_sums_on_the_vector_cores_match and bnsd")),
    # tiles of more rows than L0 holds: the cube's pieces, the vector cores' chunks
    Mutation("kernel: every piece of a tile drains to the slot's first rows", KERNEL_CUBE,
             "const uint64_t at = static_cast<uint64_t>(m0) * pitch + c0;",
             "const uint64_t at = c0;",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "cube_piece and emu")),
    # split kv merged (and repaired) at the attention launch's end
    Mutation("kernel: the merge in the attention launch does not wait for every split", KERNEL_ATTENTION,
             "        SyncAll<false>();  // every split's partial results stored\n", "",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "decode_split_with_several_units and emu")),
    Mutation("kernel: the repair in the attention launch does not wait for the merge's flags", KERNEL_ATTENTION,
             "        SyncAll<false>();  // every task's flag bytes written by the merge\n", "",
             ("tests/ascend_kernels/test_ascendc_emu_overflow.py", "-k", "inside_the_attention_launch")),
    # the attention launch's repair pass, started by the AI Core's core bytes
    Mutation("kernel: a task's flag does not join its vector core's core flag", KERNEL_STEPS,
             "        Max(CoreFlag(), CoreFlag(), Stat16(TASK_FLAG), 16);\n", "",
             ("tests/ascend_kernels/test_ascendc_emu_overflow.py", "-k", "flag_and_repair_the_nonfinite_rows")),
    Mutation("kernel: the vector cores never store their core bytes", KERNEL_VECTOR,
             "        if (flags_.on && !flags_.repair) StoreCoreFlag();\n", "",
             ("tests/ascend_kernels/test_ascendc_emu_overflow.py", "-k", "check_costs")),
    # head dims wider than L0B holds: the cube's pieces of columns
    Mutation("kernel: each piece of the score's contraction restarts its accumulation", KERNEL_CUBE,
             "PASA_UNIT_FLAG_MORE, false, k0 == 0));",
             "PASA_UNIT_FLAG_MORE, false, true));",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "wider_than_the_cube and emu")),
    # pasa's block means from the keys: the key preprocessing's key means, the cube's row constants
    Mutation("kernel: pasa's key mean of a full block left unscaled by 1 / n", KERNEL_PREP,
             "t.shiftRowSum / static_cast<float>(task.validRows) : t.shiftRowSum * t.invKvBlock;",
             "t.shiftRowSum / static_cast<float>(task.validRows) : t.shiftRowSum;",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "emu and pasa and not exact")),
    Mutation("kernel: pasa's key mean of a part-filled block divided by n", KERNEL_PREP,
             "t.shiftRowSum / static_cast<float>(task.validRows) : t.shiftRowSum * t.invKvBlock;",
             "t.shiftRowSum * t.invKvBlock : t.shiftRowSum * t.invKvBlock;",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "emu and pasa and not exact")),
    Mutation("kernel: the key preprocessing overruns its column-sum ring", KERNEL_PREP,
             "return handed + 1 > PASA_SUM_SLOTS ? handed + 1 - PASA_SUM_SLOTS : 0;",
             "return handed + 1 > PASA_SUM_SLOTS + 4 ? handed - 3 - PASA_SUM_SLOTS : 0;",
             ("tests/ascend_kernels/test_ascendc_emu_internals.py", "-k", "column_sum_ring")),
    Mutation("kernel: the key preprocessing pairs a block's keys with the next block", KERNEL_PREP,
             "        task = next_;\n        k1 = l1_.DeQue<half>();\n        has_ = it_.Next(next_);\n",
             "        k1 = l1_.DeQue<half>();\n        has_ = it_.Next(next_);\n        task = next_;\n",
             ("tests/ascend_kernels/test_ascendc_emu_internals.py", "-k", "column_sum_ring")),
    Mutation("kernel: pasa's second AIV leaves its rows of a part-filled block", KERNEL_PREP,
             "if (sub != 0 && !tail) {", "if (sub != 0) {",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "emu and pasa and not exact")),
    Mutation("CPU backend: the keys' block means summed in fp16", TORCH,
             "    return _round(colsum * factor.to(kb.device)[:, None, :, None], torch.float16)",
             "    return _round(_round(colsum, torch.float16) * factor.to(kb.device)[:, None, :, None], torch.float16)",
             ("tests/fallback/torch/test_oracle.py", "-k", "means")),
    # L0C handed between the cube's Mmads and its Fixpipe by unit flags
    Mutation("kernel: the cube's Fixpipe drains L0C without its unit flag", KERNEL_CUBE,
             "quant, 0, 1, 0, 0, PASA_UNIT_FLAG_LAST));",
             "quant, 0, 1, 0, 0, 0));",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "cube_piece and emu")),
    Mutation("emulation: an Mmad with unitFlag starts before the Fixpipe has read its L0C", EMU_CUBE,
             "ready = std::max(ready, u.clearedAt);",
             "ready = std::max(ready, 0.0);",
             ("tests/ascend_kernels/test_npu_timing.py", "-k", "unit_flag")),
    Mutation("kernel inputs: head dims padded to a multiple of 16 with ones", "pasa_npu/kernel_inputs.py",
             "return torch.nn.functional.pad(t, (0, -t.shape[3] % 16))",
             "return torch.nn.functional.pad(t, (0, -t.shape[3] % 16), value=1.0)",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "not_multiples_of_16 and emu")),
    Mutation("kernel: every piece of P'V takes V's first columns", KERNEL_CUBE,
             "kb * (dv / kC0) + v0 / kC0) * kFractal : kb * kFractal + v0 * n;",
             "kb * (dv / kC0)) * kFractal : kb * kFractal;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "wider_than_the_cube and emu")),
    Mutation("kernel: the vector cores' chunks share their statistics", KERNEL_VECTOR,
             "__aicore__ inline LocalTensor<float> Kept(uint32_t slot) { return Stat(slot)[c0_]; }",
             "__aicore__ inline LocalTensor<float> Kept(uint32_t slot) { return Stat(slot); }",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "chunks")),
    Mutation("kernel: the cube skips tasks without keys past its window", KERNEL_CUBE,
             "while (c.task < limit && win.Has(c.task) && win.Get(c.task).numBlocks == 0) ++c.task;",
             "while (win.Has(c.task) && win.Get(c.task).numBlocks == 0) ++c.task;",
             ("tests/ascend_kernels/test_ascendc_emu_shapes.py", "-k", "without_keys")),
    # learnable sinks in the kernels: joined once per row, at its end or in the merge
    Mutation("kernel: the vector cores' end of a task drops the learnable sink", KERNEL_STEPS,
             "    if (t.hasSink && !split) JoinSink(m, l, x);\n", "",
             ("tests/api/test_fia_v2_sinks.py", "-k", "ascendc_sinks_on_few_ai_cores and not split")),
    Mutation("kernel: the merge of split kv drops the learnable sink", KERNEL_MERGE,
             "            Add(Stat(TOTAL), Stat(TOTAL), Stat(SINK), r);\n", "",
             ("tests/api/test_fia_v2_sinks.py", "-k", "ascendc_sinks_on_few_ai_cores and split")),
    # the resolution check: rows whose shifted scores reach the limit are recomputed
    Mutation("torch: the resolution check dropped", TORCH,
             "bad = nonfinite_rows(out, lse) | (peak >= numerics.RESOLUTION_LIMIT)",
             "bad = nonfinite_rows(out, lse)",
             ("tests/api/test_resolution_check.py", "-k", "torch and prefill")),
    Mutation("torch: the resolution check takes the block offset without its absolute value", TORCH,
             "block = torch.maximum(block, offset.abs())", "block = torch.maximum(block, offset)",
             ("tests/api/test_resolution_check.py", "-k", "torch and negative")),
    Mutation("torch: the resolution check leaves out pasa's block offsets", TORCH,
             "peak=_peak(state, rm, offset=gamma * s_mean)", "peak=_peak(state, rm)",
             ("tests/api/test_resolution_check.py", "-k", "torch and shared_bias")),
    Mutation("triton: the resolution check dropped", TRITON_SOFTMAX,
             'l_new = tl.where(lost, float("nan"), l_new)', "l_new = l_new",
             ("tests/api/test_resolution_check.py", "-k", "triton and prefill")),
    Mutation("triton: the resolution check leaves out pasa's block offsets", TRITON_SOFTMAX,
             "return lost_resolution(rm) | lost_resolution(gamma * s_mean)", "return lost_resolution(rm)",
             ("tests/api/test_resolution_check.py", "-k", "triton and shared_bias")),
    Mutation("kernel: the resolution check leaves out pasa's block offsets", KERNEL_STEPS,
             "        Max(nxt[P_PEAK * G], nxt[P_PEAK * G], t2, g);\n", "\n",
             ("tests/api/test_resolution_check.py", "-k", "ascendc and shared_bias")),
    Mutation("triton: the resolution check compares the signed maximum", TRITON_SOFTMAX,
             "return tl.abs(rm) >= RESOLUTION_LIMIT", "return rm >= RESOLUTION_LIMIT",
             ("tests/api/test_resolution_check.py", "-k", "triton and negative")),
    Mutation("plan.run: tensors of another layout run on the planned layout", "pasa_npu/api.py",
             "if (self._converts_mask or layouts != self._layouts",
             "if (self._converts_mask",
             ("tests/api/test_plan_run.py", "-k", "another_layout")),
    Mutation("triton: the decode splits unchecked", TRITON_DECODE,
             "keys_hidden, GUARD, BLOCK_N, CHECK,", "keys_hidden, GUARD, BLOCK_N, False,",
             ("tests/api/test_resolution_check.py", "-k", "triton and decode")),
    Mutation("triton: the decode merge takes a split's NaN LSE as a split without keys",
             TRITON_DECODE, "    seen = total != 0\n", "    seen = (total != 0) & (total == total)\n",
             ("tests/api/test_resolution_check.py", "-k", "triton and decode")),
    Mutation("kernels: the ragged block's level-0 Add leaves its mask for Compares", KERNEL_STEPS,
             "        ResetMask();  // the Add's mask stays in the register, which Compares reads\n",
             "\n", ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "tiling-32x64")),
    Mutation("emulation: Compares ignores the mask a level-0 call left", EMU_STRIDED,
             "    if (emu::Core().partialMask != 0) {", "    if (false) {",
             ("tests/ascend_kernels/test_ascendc_vector.py", "-k", "stale_mask")),
    Mutation("emulated Fixpipe to half: through bfloat16", EMU_CUBE,
             "row[j] = static_cast<T>(c[(j / 16) * static_cast<uint64_t>(p.srcStride) * 16 "
             "+ i * 16 + j % 16]);",
             "row[j] = static_cast<T>(static_cast<float>(bfloat16_t(c[(j / 16) * "
             "static_cast<uint64_t>(p.srcStride) * 16 + i * 16 + j % 16])));",
             ("tests/ascend_kernels/test_ascendc_emu.py", "-k", "bit_identical or left-up-causal-pasa-fp16")),
    # ---- the ring's agreement, and the calibration cache's fingerprint
    Mutation("ring: the other ranks do not name a refusing rank", DISTRIBUTED,
             "refused = [r for r, theirs in enumerate(every) if theirs[0]]", "refused = []",
             ("tests/api/test_distributed.py", "-k", "refusal_of_one_rank")),
    Mutation("ring: the ranks' seq_lens are not compared", DISTRIBUTED,
             'for name, width in [*_FIELDS.items(), ("seq_lens", world)]:',
             "for name, width in _FIELDS.items():",
             ("tests/api/test_distributed.py", "-k", "disagree")),
    Mutation("ring: shards on a device the group's backend does not carry pass", DISTRIBUTED,
             "if query.device.type not in carried:", "if False:",
             ("tests/api/test_distributed.py", "-k", "does_not_carry")),
    Mutation("ring: a refusing rank without tensors does not gather on the CPU", DISTRIBUTED,
             'if "cpu" in carried:', "if False:",
             ("tests/api/test_distributed.py", "-k", "raises_alone")),
    Mutation("model: the calibration fingerprint reads docstrings", NPU_MODEL,
             "node.body = node.body[1:] or [ast.Pass()]", "pass",
             ("tests/tools/test_npu_model_cli.py", "-k", "fingerprint")),
]
