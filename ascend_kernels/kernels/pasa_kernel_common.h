// Helpers shared by the PASA kernels: the tiling load, layouts, the shift matrix's load and
// small arithmetic. The schedule is in pasa_tasks.h, paged KV in pasa_kv_pages.h, the workspace
// in pasa_workspace.h.
// Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_KERNEL_COMMON_H
#define PASA_KERNEL_COMMON_H

#include "kernel_operator.h"
#include "pasa_tiling_data.h"

namespace pasa {

using namespace AscendC;

constexpr uint32_t kC0 = 16;         // fp16 elements per 32-byte block / fractal side
constexpr uint32_t kFractal = 256;   // elements of one 16x16 fractal

__aicore__ inline uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
__aicore__ inline uint32_t Align16(uint32_t a) { return CeilDiv(a, 16) * 16; }
__aicore__ inline uint32_t Min(uint32_t a, uint32_t b) { return a < b ? a : b; }
__aicore__ inline int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }
__aicore__ inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Everything the source pipe of `evt` issued so far completes before the destination pipe's
// next instruction. The ID comes from the pipe's pool: a fixed one may be an ID a queue holds with
// its own flag set (from FreeTensor to the next AllocTensor), and the wait would take that flag.
template <HardEvent evt>
__aicore__ inline void OrderPipes()
{
    TPipe* pipe = GetTPipePtr();
    const TEventID id = pipe->AllocEventID<evt>();
    SetFlag<evt>(id);
    WaitFlag<evt>(id);
    pipe->ReleaseEventID<evt>(id);
}

// unitFlag of the Mmad that ends an L0C chain and of the Fixpipe that drains it (3), and of an Mmad
// the chain's later ones accumulate onto (2).
constexpr uint8_t PASA_UNIT_FLAG_LAST = 3, PASA_UNIT_FLAG_MORE = 2;

// `count` L0C buffers (two by default) of at least `bytes` each, taken in turn. A buffer passes from
// the Mmads that fill it to the Fixpipe that drains it and back by unitFlag, not by a queue's flags:
// the next Mmad into it waits for the Fixpipe to have read it, not for the Fixpipe's GM write to land.
class L0cRing {
public:
    __aicore__ inline void Init(TPipe& pipe, uint32_t bytes, uint32_t count = 2)
    {
        elems_ = CeilDiv(bytes, kFractal * sizeof(float)) * kFractal;  // whole fractals: Mmad's 1 KiB alignment
        count_ = count;
        pipe.InitBuffer(buf_, count * elems_ * sizeof(float));
    }
    __aicore__ inline LocalTensor<float> Next() { return buf_.Get<float>()[(next_++ % count_) * elems_]; }

private:
    TBuf<TPosition::CO1> buf_;
    uint32_t elems_ = 0, count_ = 2, next_ = 0;
};

// Whether CopyZz takes rows `stride` elements apart: the DMA's stride between 16-row blocks is 16 bits.
__aicore__ inline bool ZzCopyReaches(uint32_t stride) { return 16ull * stride <= 65535; }

// `rows` rows of `dim` columns from src[at] on, `stride` elements apart -> L1 as Zz (16-row
// blocks, each block's column fractals together): the whole blocks in one copy, then the tail.
template <typename T>
__aicore__ inline void CopyZz(const LocalTensor<T>& l1, const GlobalTensor<T>& src, uint64_t at, uint32_t rows,
                              uint32_t dim, uint32_t stride)
{
    const uint32_t full = rows / kC0, tail = rows % kC0, block = (dim / kC0) * kFractal;
    if (full > 0) {
        DataCopy(l1, src[at], Nd2NzParams(static_cast<uint16_t>(full), kC0, static_cast<uint16_t>(dim),
                                          static_cast<uint16_t>(kC0 * stride), static_cast<uint16_t>(stride), kC0, 1,
                                          static_cast<uint16_t>(block)));
    }
    if (tail > 0) {
        DataCopy(l1[full * block], src[at + static_cast<uint64_t>(full) * kC0 * stride],
                 Nd2NzParams(1, static_cast<uint16_t>(tail), static_cast<uint16_t>(dim), 0, static_cast<uint16_t>(stride),
                             kC0, 1, 0));
    }
}

// Zero rows [valid, n) of an n-row Zz tile of `dim` columns: the tail of one 16-row block, then
// whole blocks.
template <typename T>
__aicore__ inline void ZeroRowsZz(const LocalTensor<T>& l1, uint32_t valid, uint32_t n, uint32_t dim)
{
    if (valid >= n) return;
    const uint32_t full = valid / kC0, tail = valid % kC0, colBlocks = dim / kC0;
    if (tail > 0) {
        Fill(l1[full * colBlocks * kFractal + tail * kC0],
             InitConstValueParams<T>(static_cast<uint16_t>(colBlocks), static_cast<uint16_t>(kC0 - tail),
                                     static_cast<uint16_t>(tail), T(0.0f)));
    }
    const uint32_t zeroFrom = full + (tail > 0 ? 1 : 0);
    if (zeroFrom < n / kC0) {
        Fill(l1[zeroFrom * colBlocks * kFractal],
             InitConstValueParams<T>(1, static_cast<uint16_t>((n / kC0 - zeroFrom) * colBlocks * kC0), 0, T(0.0f)));
    }
}

// Zero rows [valid, n) of an n-row NZ tile of `dim` columns laid out in pieces of `pieceRows` rows, one
// after the other, each with C0 stride pieceRows (pieceRows = n: one NZ tile).
template <typename T>
__aicore__ inline void ZeroRowsNz(const LocalTensor<T>& l1, uint32_t valid, uint32_t n, uint32_t dim, uint32_t pieceRows)
{
    for (uint32_t p0 = valid / pieceRows * pieceRows; p0 < n; p0 += pieceRows) {
        const uint32_t from = valid > p0 ? valid - p0 : 0;
        Fill(l1[p0 * dim + from * kC0], InitConstValueParams<T>(static_cast<uint16_t>(dim / kC0),
                                                               static_cast<uint16_t>(pieceRows - from),
                                                               static_cast<uint16_t>(from), T(0.0f)));
    }
}

// M^T (n x n, row-major in GM) -> L1 (Zz: 16-row blocks, each with its column fractals together; a
// TBuf written once); returns once MTE1 may read it. A TBuf rather than a queue: a freed queue buffer
// would hold one of the 8 MTE1_MTE2 event IDs for the rest of the launch.
template <typename T>
__aicore__ inline void StageShiftMatrix(const LocalTensor<T>& m1, const GlobalTensor<T>& shift, uint32_t n)
{
    CopyZz(m1, shift, 0, n, n, n);
    OrderPipes<HardEvent::MTE2_MTE1>();
}

// Rows [r0, r0 + rows) of the staged M^T (L1, Zz) -> L0A (Zz): the A operand of their product with a
// k = n block of keys, in one load where its fractals fit one repeat count. r0 and rows: multiples of 16.
template <typename T>
__aicore__ inline void ShiftRowsToL0a(const LocalTensor<T>& l0a, const LocalTensor<T>& m1, uint32_t n, uint32_t r0,
                                      uint32_t rows)
{
    const uint32_t perLoad = (rows / kC0) * (n / kC0) <= 255 ? rows : kC0;
    for (uint32_t m0 = 0; m0 < rows; m0 += perLoad) {
        LoadData(l0a[m0 * n], m1[(r0 + m0) * n],
                 LoadData2DParams(0, static_cast<uint8_t>((perLoad / kC0) * (n / kC0)), 1, 0, 0, false, 0));
    }
}

// Each of `count` rows of `d` floats minus the same d-vector `vec`: whole-tile Sub, 64 columns a
// repeat, one repeat per row (src1 repeat stride 0), up to 128 rows an instruction (a repeat count
// is 8 bits).
__aicore__ inline void SubtractFromEachRow(const LocalTensor<float>& rows, const LocalTensor<float>& vec, uint32_t count,
                                           uint32_t d)
{
    const uint8_t rowBlocks = static_cast<uint8_t>(d * sizeof(float) / 32);
    for (uint32_t r = 0; r < count; r += 128) {
        const uint32_t repeats = count - r < 128 ? count - r : 128;
        for (uint32_t c = 0; c < d; c += 64) {
            Sub(rows[r * d + c], rows[r * d + c], vec[c], d - c < 64 ? d - c : 64, static_cast<uint8_t>(repeats),
                BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, 0));
        }
    }
    ResetMask();  // leave the full mask: Compares reads the register
}

// Bytes one DataCachePreload brings into the scalar unit's data cache (dc_preload).
constexpr int64_t kDataCachePreloadBytes = 256;

// Copy the tiling struct from GM 8 bytes a scalar load (through a GlobalTensor); the host
// places it 64-byte aligned. Its lines are requested first, so that their fills overlap
// rather than each line's first load waiting for its own.
__aicore__ inline void LoadTiling(GM_ADDR tiling, PasaTilingData& out)
{
    static_assert(sizeof(PasaTilingData) % sizeof(uint64_t) == 0, "the tiling is read in 8-byte words");
    constexpr uint32_t kWords = sizeof(PasaTilingData) / sizeof(uint64_t);
    AscendC::GlobalTensor<uint64_t> words;
    words.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(tiling), kWords);
    for (int64_t at = 0; at < static_cast<int64_t>(sizeof(PasaTilingData)); at += kDataCachePreloadBytes) {
        AscendC::DataCachePreload(words, at);
    }
    uint64_t* dst = reinterpret_cast<uint64_t*>(&out);
    for (uint32_t i = 0; i < kWords; ++i) dst[i] = words.GetValue(i);
}

// Element offset of row `s` of head `n` in batch `b`, and the distance between rows.
__aicore__ inline uint64_t RowOffset(uint32_t layout, uint32_t b, uint32_t n, uint32_t s, uint32_t heads,
                                     uint32_t seq, uint32_t dim)
{
    if (layout == PASA_LAYOUT_BNSD) return ((static_cast<uint64_t>(b) * heads + n) * seq + s) * dim;
    return ((static_cast<uint64_t>(b) * seq + s) * heads + n) * dim;
}
__aicore__ inline uint32_t RowStride(uint32_t layout, uint32_t heads, uint32_t dim)
{
    return layout == PASA_LAYOUT_BNSD ? dim : heads * dim;
}

}  // namespace pasa

#endif  // PASA_KERNEL_COMMON_H
