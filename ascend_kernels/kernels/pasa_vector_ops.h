// Whole-tile vector helpers of the PASA attention kernel: row reductions, per-row broadcasts
// and element-wise operations on tiles of `rows` rows (a multiple of 8) by `cols` columns
// (a power of two), row-major in UB. Each helper is a fixed handful of instructions with repeats
// and strides, whatever the number of rows; none reads UB from the scalar unit. Each leaves the
// vector mask full (ResetMask): a level-0 call leaves its mask in the register, and the
// count-mode Compares runs under whatever mask the register holds.
#ifndef PASA_VECTOR_OPS_H
#define PASA_VECTOR_OPS_H

#include "pasa_kernel_common.h"

namespace pasa {

enum class VecOp { ADD, SUB, MUL, MAX, DIV };

template <VecOp op, typename T>
__aicore__ inline void Level0(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& a,
                              const AscendC::LocalTensor<T>& b, uint64_t mask, uint8_t repeat,
                              const AscendC::BinaryRepeatParams& p)
{
    if constexpr (op == VecOp::ADD) {
        AscendC::Add(dst, a, b, mask, repeat, p);
    } else if constexpr (op == VecOp::SUB) {
        AscendC::Sub(dst, a, b, mask, repeat, p);
    } else if constexpr (op == VecOp::MUL) {
        AscendC::Mul(dst, a, b, mask, repeat, p);
    } else if constexpr (op == VecOp::MAX) {
        AscendC::Max(dst, a, b, mask, repeat, p);
    } else {
        AscendC::Div(dst, a, b, mask, repeat, p);
    }
}

// dst block i = op(src block 2i, src block 2i + 1) for i < outBlocks: one level of a row
// reduction that keeps every lane busy (a pair never straddles two rows: rows hold an even
// number of blocks).
template <VecOp op, typename T>
__aicore__ inline void PairBlocks(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src, uint32_t outBlocks)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    const AscendC::BinaryRepeatParams p(1, 2, 2, 8, 16, 16);
    const uint32_t full = outBlocks / 8, rest = outBlocks % 8;
    if (full > 0) Level0<op>(dst, src, src[perBlock], 8 * perBlock, static_cast<uint8_t>(full), p);
    if (rest > 0) {
        Level0<op>(dst[full * 8 * perBlock], src[full * 16 * perBlock], src[full * 16 * perBlock + perBlock],
                   rest * perBlock, 1, p);
    }
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
}

// dst[r] = sum or max of row r of src (rows x cols). Pairs of blocks are combined until a row is
// one block (fp16) or one repeat of 8 blocks (fp32), then ReduceDataBlock finishes: 4
// instructions for a 128-column fp16 row, 3 for a 128-column fp32 row. Each level's output goes to
// `tree` after the one before (the host sizes it: pasa_tiling.cpp's RowReduceTreeBytes); `src` is
// left intact.
template <AscendC::ReduceType rt, typename T>
__aicore__ inline void RowReduce(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                                 const AscendC::LocalTensor<T>& tree, uint32_t rows, uint32_t cols)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    constexpr VecOp op = rt == AscendC::ReduceType::SUM ? VecOp::ADD : VecOp::MAX;
    uint32_t blocks = cols / perBlock;  // per row
    const uint32_t stop = (sizeof(T) == 4 && blocks >= 8) ? 8 : 1;
    AscendC::LocalTensor<T> cur = src;
    uint32_t at = 0;  // elements of `tree` used so far
    while (blocks > stop) {
        AscendC::LocalTensor<T> out = tree[at];
        PairBlocks<op>(out, cur, rows * blocks / 2);
        at += rows * blocks / 2 * perBlock;
        cur = out;
        blocks /= 2;
    }
    if (blocks == 8) {  // fp32: 8 blocks a row -> one block a row
        AscendC::LocalTensor<T> out = tree[at];
        AscendC::ReduceDataBlock<rt>(out, cur, 8 * perBlock, static_cast<int32_t>(rows), 1, 1, 8);
        cur = out;
    }
    AscendC::ReduceDataBlock<rt>(dst, cur, 8 * perBlock, static_cast<int32_t>(rows / 8), 1, 1, 8);
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
}

// brc: one 32-byte block per row, filled with vec[r] (Brcb, 8 rows a repeat).
template <typename T>
__aicore__ inline void BroadcastRows(const AscendC::LocalTensor<T>& brc, const AscendC::LocalTensor<T>& vec, uint32_t rows)
{
    AscendC::Brcb(brc, vec, static_cast<uint8_t>(rows / 8), AscendC::BrcbRepeatParams(1, 8));
}

// dst[r][c] = op(src[r][c], brc block r): one instruction per 256 bytes of a row, repeated over
// the rows (src1 block stride 0: each repeat reads its row's broadcast block). `srcStride` and
// `dstStride`: row pitch in elements (default cols). srcRowStep 0 reuses row 0 of src.
template <VecOp op, typename T>
__aicore__ inline void RowBroadcast(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                                    const AscendC::LocalTensor<T>& brc, uint32_t rows, uint32_t cols,
                                    uint32_t dstStride = 0, uint32_t srcStride = 0, bool srcRowStep = true)
{
    constexpr uint32_t lanes = 256 / sizeof(T), perBlock = 32 / sizeof(T);
    dstStride = dstStride == 0 ? cols : dstStride;
    srcStride = srcStride == 0 ? cols : srcStride;
    const AscendC::BinaryRepeatParams p(1, 1, 0, static_cast<uint8_t>(dstStride / perBlock),
                                        static_cast<uint8_t>(srcRowStep ? srcStride / perBlock : 0), 1);
    for (uint32_t c = 0; c < cols; c += lanes) {
        const uint32_t mask = cols - c < lanes ? cols - c : lanes;
        Level0<op>(dst[c], src[c], brc, mask, static_cast<uint8_t>(rows), p);
    }
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
}

// dst[i] = op(a[i], b[i mod n]) for i < 2n: the two halves of a packed pair of statistics
// against one vector (two repeats, src1 repeat stride 0). n: a multiple of 16, at most 128.
template <VecOp op, typename T>
__aicore__ inline void PairOp(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& a,
                              const AscendC::LocalTensor<T>& b, uint32_t n)
{
    constexpr uint32_t perBlock = 32 / sizeof(T);
    const uint8_t step = static_cast<uint8_t>(n / perBlock);
    Level0<op>(dst, a, b, n, 2, AscendC::BinaryRepeatParams(1, 1, 1, step, step, 0));
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
}

// dst[k n + i] = src[i] for k < 8, i < n: eight copies of a vector of n elements (a multiple of
// 32 bytes), one strided Add of a zero block per 256 bytes of the vector. `zero`: 32 zero bytes.
// Compares then gives one bit per element of the 8n copies: whole 256-byte repeats for any n.
template <typename T>
__aicore__ inline void Replicate8(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                                  const AscendC::LocalTensor<T>& zero, uint32_t n)
{
    constexpr uint32_t lanes = 256 / sizeof(T), perBlock = 32 / sizeof(T);
    const AscendC::BinaryRepeatParams p(1, 1, 0, static_cast<uint8_t>(n / perBlock), 0, 0);
    for (uint32_t c = 0; c < n; c += lanes) {
        Level0<VecOp::ADD>(dst[c], src[c], zero, n - c < lanes ? n - c : lanes, 8, p);
    }
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
}

// dst[r] = 0 where row r of x (rows x cols fp32, rows a multiple of 8, cols a multiple of 8 up to
// 2040) is finite, NaN where it holds a NaN or an infinity; x is overwritten. Its finite entries
// must lie below 1e35 in magnitude (an output of fp16 values does), so that a row of them sums to
// a finite value: each row's sum (the last half of its blocks added onto its first ones until a
// row is one block, then one ReduceDataBlock), then sum - sum, which is NaN where the sum is not
// finite: about log2(cols / 8) + 2 instructions per 248 rows (and per 64 columns of a fold) and one.
__aicore__ inline void RowNonFinite(const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<float>& x,
                                    uint32_t rows, uint32_t cols)
{
    constexpr uint32_t lanes = 64, chunk = 248;  // fp32 lanes of a repeat; rows a repeat count may cover
    const uint8_t rowBlocks = static_cast<uint8_t>(cols / 8);
    const AscendC::BinaryRepeatParams p(1, 1, 1, rowBlocks, rowBlocks, rowBlocks);
    for (uint32_t r0 = 0; r0 < rows; r0 += chunk) {
        const uint32_t n = rows - r0 < chunk ? rows - r0 : chunk;
        const AscendC::LocalTensor<float> band = x[r0 * cols];
        for (uint32_t blocks = rowBlocks; blocks > 1;) {
            const uint32_t half = blocks / 2, w = half * 8, from = (blocks - half) * 8;
            for (uint32_t c = 0; c < w; c += lanes) {
                Level0<VecOp::ADD>(band[c], band[c], band[from + c], w - c < lanes ? w - c : lanes, static_cast<uint8_t>(n), p);
            }
            blocks -= half;
        }
        AscendC::ReduceDataBlock<AscendC::ReduceType::SUM>(dst[r0], band, 64, static_cast<int32_t>(n / 8), 1,
                                                           static_cast<int32_t>(rowBlocks), 8 * rowBlocks);
    }
    AscendC::ResetMask();  // leave the full mask: Compares reads the register
    AscendC::Sub(dst, dst, dst, static_cast<int32_t>(rows));
}

}  // namespace pasa

#endif  // PASA_VECTOR_OPS_H
