// Helpers shared by the PASA kernels: tiling load, layouts, visibility, task enumeration,
// the workspace slots of an AI Core.
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

// Copy the tiling struct from GM word by word (scalar loads through a GlobalTensor).
__aicore__ inline void LoadTiling(GM_ADDR tiling, PasaTilingData& out)
{
    AscendC::GlobalTensor<uint32_t> words;
    words.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(tiling), sizeof(PasaTilingData) / sizeof(uint32_t));
    uint32_t* dst = reinterpret_cast<uint32_t*>(&out);
    for (uint32_t i = 0; i < sizeof(PasaTilingData) / sizeof(uint32_t); ++i) dst[i] = words.GetValue(i);
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

// Per-batch lengths and the causal offset, read from GM.
struct BatchInfo {
    int64_t qLen = 0;
    int64_t kvLen = 0;
    int64_t next = 0;  // causal: key j visible to row i iff j <= i + next
};

class BatchTable {
public:
    __aicore__ inline void Init(GM_ADDR qLens, GM_ADDR kvLens, GM_ADDR nextTokens, uint32_t batch)
    {
        qLens_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(qLens), batch);
        kvLens_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(kvLens), batch);
        next_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(nextTokens), batch);
    }
    __aicore__ inline BatchInfo Get(uint32_t b) const
    {
        BatchInfo info;
        info.qLen = qLens_.GetValue(b);
        info.kvLen = kvLens_.GetValue(b);
        info.next = next_.GetValue(b);
        return info;
    }
    __aicore__ inline int64_t KvLen(uint32_t b) const { return kvLens_.GetValue(b); }

private:
    AscendC::GlobalTensor<int32_t> qLens_, kvLens_, next_;
};

// End (exclusive) of the keys query row `row` may see.
__aicore__ inline int64_t VisibleEnd(const BatchInfo& info, uint32_t maskMode, int64_t row)
{
    if (maskMode == PASA_MASK_NONE) return info.kvLen;
    return Max64(0, Min64(info.kvLen, row + info.next + 1));
}

// Visible keys of row `row` inside the block starting at key `blockStart`.
__aicore__ inline uint32_t VisibleInBlock(const BatchInfo& info, uint32_t maskMode, int64_t row, int64_t blockStart,
                                          uint32_t blockLen)
{
    const int64_t n = VisibleEnd(info, maskMode, row) - blockStart;
    return n <= 0 ? 0 : static_cast<uint32_t>(Min64(n, blockLen));
}

// One attention task: a tile of `heads` query heads of kv head `kvHead` (heads head0 ..
// head0 + heads - 1) times `positions` query rows each, positions q0 .. q0 + positions - 1. Row
// r of the tile is head head0 + r / tilePositions at position q0 + r % tilePositions. Blocks
// [0, fullBlocks) are visible to every row in full; blocks [fullBlocks, numBlocks) need masking.
struct AttentionTask {
    uint32_t b = 0, kvHead = 0, head0 = 0, heads = 1, q0 = 0, positions = 0, rows = 0;
    uint32_t numBlocks = 0, fullBlocks = 0;
    BatchInfo info;
};

// Walks the attention tasks assigned to AI Core `core`. Tasks go in the order query tile (the
// last first), batch, kv head, head chunk, and are dealt to the AI Cores in snake order (0 .. n-1,
// then n-1 .. 0, ...): with a causal mask the later query tiles see more blocks, so every core
// gets long and short tasks alike.
class AttentionTaskIter {
public:
    __aicore__ inline AttentionTaskIter(const PasaTilingData& t, const BatchTable& batches, uint32_t core)
        : t_(t), batches_(batches), core_(core), qt_(t.numQTiles) {}

    __aicore__ inline bool Next(AttentionTask& task)
    {
        while (qt_ > 0) {
            const uint32_t qt = qt_ - 1, b = b_, kvh = kvh_, chunk = chunk_;
            if (++chunk_ >= t_.headChunks) {
                chunk_ = 0;
                if (++kvh_ >= t_.numKvHeads) {
                    kvh_ = 0;
                    if (++b_ >= t_.batch) {
                        b_ = 0;
                        --qt_;
                    }
                }
            }
            if (b != infoBatch_) {
                info_ = batches_.Get(b);
                infoBatch_ = b;
            }
            const uint32_t tiles = info_.qLen > 0 ? CeilDiv(static_cast<uint32_t>(info_.qLen), t_.tilePositions) : 0;
            if (qt >= tiles) continue;
            const uint32_t round = counter_ / t_.blockDim, pos = counter_ % t_.blockDim;
            ++counter_;
            if ((round % 2 == 0 ? pos : t_.blockDim - 1 - pos) != core_) continue;
            task.b = b;
            Fill(task, kvh, chunk, qt);
            return true;
        }
        return false;
    }

private:
    __aicore__ inline void Fill(AttentionTask& task, uint32_t kvh, uint32_t chunk, uint32_t qt) const
    {
        task.kvHead = kvh;
        task.head0 = kvh * t_.groupSize + chunk * t_.tileHeads;
        task.heads = Min(t_.tileHeads, t_.groupSize - chunk * t_.tileHeads);
        task.q0 = qt * t_.tilePositions;
        task.positions = Min(t_.tilePositions, static_cast<uint32_t>(info_.qLen) - task.q0);
        // stacked heads keep tilePositions rows each (rows past qLen are computed, never stored)
        task.rows = task.heads == 1 ? task.positions : task.heads * t_.tilePositions;
        task.info = info_;
        const int64_t end = VisibleEnd(info_, t_.maskMode, static_cast<int64_t>(task.q0) + task.positions - 1);
        task.numBlocks = end > 0 ? CeilDiv(static_cast<uint32_t>(end), t_.kvBlock) : 0;
        const int64_t firstEnd = VisibleEnd(info_, t_.maskMode, static_cast<int64_t>(task.q0));
        task.fullBlocks = firstEnd > 0 ? Min(task.numBlocks, static_cast<uint32_t>(firstEnd) / t_.kvBlock) : 0;
    }

    const PasaTilingData& t_;
    const BatchTable& batches_;
    uint32_t core_;
    uint32_t qt_;  // one past the query tile being dealt
    uint32_t b_ = 0, kvh_ = 0, chunk_ = 0, counter_ = 0, infoBatch_ = 0xFFFFFFFFu;
    BatchInfo info_;
};

// The tasks of one AI Core as a stream of kv blocks: cursors walk (task, block) pairs in
// order, the cube's and the vector cores' leading and lagging cursors a few blocks apart, so
// that the blocks of the next task enter the pipeline while the last ones of a task leave it.
// The window holds the tasks from the slowest cursor on; callers keep their cursors within
// kTaskWindow tasks of each other.
constexpr uint32_t kTaskWindow = 8;

struct BlockCursor {
    uint32_t task = 0;
    uint32_t block = 0;
};

class TaskWindow {
public:
    __aicore__ inline TaskWindow(const PasaTilingData& t, const BatchTable& batches, uint32_t core)
        : it_(t, batches, core) {}
    // Whether the stream has a task with index i (fetching tasks up to it).
    __aicore__ inline bool Has(uint32_t i)
    {
        while (loaded_ <= i && !done_) {
            if (it_.Next(ring_[loaded_ % kTaskWindow])) {
                ++loaded_;
            } else {
                done_ = true;
            }
        }
        return i < loaded_;
    }
    __aicore__ inline const AttentionTask& Get(uint32_t i) const { return ring_[i % kTaskWindow]; }
    // Moves c to the next block, into the next task after a task's last block.
    __aicore__ inline void Advance(BlockCursor& c) const
    {
        if (++c.block >= Get(c.task).numBlocks) {
            c.block = 0;
            ++c.task;
        }
    }

private:
    AttentionTaskIter it_;
    AttentionTask ring_[kTaskWindow];
    uint32_t loaded_ = 0;
    bool done_ = false;
};

// One preprocessing task: a kv block of one kv head.
struct KeyBlockTask {
    uint32_t b = 0, kvHead = 0, block = 0, validRows = 0;
};

class KeyBlockIter {
public:
    __aicore__ inline KeyBlockIter(const PasaTilingData& t, const BatchTable& batches, uint32_t core)
        : t_(t), batches_(batches), core_(core) {}

    __aicore__ inline bool Next(KeyBlockTask& task)
    {
        while (b_ < t_.batch) {
            if (kvLen_ < 0) kvLen_ = batches_.KvLen(b_);
            const uint32_t blocks = kvLen_ > 0 ? CeilDiv(static_cast<uint32_t>(kvLen_), t_.kvBlock) : 0;
            if (h_ >= t_.numKvHeads || blocks == 0) {
                h_ = 0;
                j_ = 0;
                ++b_;
                kvLen_ = -1;
                continue;
            }
            const uint32_t j = j_, h = h_;
            if (++j_ >= blocks) {
                j_ = 0;
                ++h_;
            }
            if ((counter_++) % t_.blockDim != core_) continue;
            task.b = b_;
            task.kvHead = h;
            task.block = j;
            task.validRows = Min(t_.kvBlock, static_cast<uint32_t>(kvLen_) - j * t_.kvBlock);
            return true;
        }
        return false;
    }

private:
    const PasaTilingData& t_;
    const BatchTable& batches_;
    uint32_t core_;
    uint32_t b_ = 0, h_ = 0, j_ = 0, counter_ = 0;
    int64_t kvLen_ = -1;
};

// Element offset of block `block` of kv head `kvHead` of batch `b` in the K' workspace.
__aicore__ inline uint64_t KeyPrimeOffset(const PasaTilingData& t, uint32_t b, uint32_t kvHead, uint32_t block)
{
    return ((static_cast<uint64_t>(b) * t.numKvHeads + kvHead) * t.numKvBlocks + block) * t.kvBlock * t.headDim;
}
__aicore__ inline uint64_t KeyMeanOffset(const PasaTilingData& t, uint32_t b, uint32_t kvHead, uint32_t block)
{
    return ((static_cast<uint64_t>(b) * t.numKvHeads + kvHead) * t.numKvBlocks + block) * t.headDim;
}

// Byte offsets of one AI Core's exchange slots in the workspace.
struct CoreSlots {
    GM_ADDR score = nullptr;
    GM_ADDR prob = nullptr;
    GM_ADDR pv = nullptr;
    GM_ADDR rowConst = nullptr;
    __aicore__ inline void Init(GM_ADDR workspace, const PasaTilingData& t, uint32_t core)
    {
        score = workspace + t.coreAreaOffset + static_cast<uint64_t>(core) * t.coreAreaBytes;
        prob = score + PASA_SCORE_SLOTS * t.scoreSlotBytes;
        pv = prob + PASA_PROB_SLOTS * t.probSlotBytes;
        rowConst = pv + PASA_PV_SLOTS * t.pvSlotBytes;
    }
};

}  // namespace pasa

#endif  // PASA_KERNEL_COMMON_H
