// The workspace: the K' (and mean) block slots and the preprocessing tasks that fill them, an
// AI Core's exchange slots, and split kv's partial results.
// Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_WORKSPACE_H
#define PASA_WORKSPACE_H

#include "pasa_kv_pages.h"

namespace pasa {

// The K' (and pasa-exact mean16) workspace holds kv blocks of one kv head, kvBlock x headDim
// fp16 each (mean16: headDim), at a block slot: (b, kv head, block) in order, or with paged KV
// the K' slot of the block's table entry (KvPages::KeySlot) times the kv heads plus the head.
__aicore__ inline uint64_t KeyPrimeSlot(const PasaTilingData& t, const KvPages& pages, uint32_t b, uint32_t kvHead,
                                        uint32_t block, int64_t kvLen)
{
    if (t.paged) return pages.KeySlot(b, block, kvLen) * t.numKvHeads + kvHead;
    return (static_cast<uint64_t>(b) * t.numKvHeads + kvHead) * t.numKvBlocks + block;
}
__aicore__ inline uint64_t KeyPrimeOffset(const PasaTilingData& t, uint64_t slot) { return slot * t.kvBlock * t.headDim; }
__aicore__ inline uint64_t KeyMeanOffset(const PasaTilingData& t, uint64_t slot) { return slot * t.headDim; }

// One preprocessing task: kv block `block` (validRows keys from key row `row`) of kv head
// `kvHead` of batch b, into K' block slot `slot`.
struct KeyBlockTask {
    uint32_t b = 0, kvHead = 0, block = 0, validRows = 0;
    uint64_t slot = 0;
    int64_t kvStart = 0;  // packed: the batch's first key on the key's S axis
};

// Walks the preprocessing tasks of AI Core `core`, round robin. Dense K: every kv block of every
// kv head. Paged K: each physical block once, by the table entry that owns it (the entry whose
// sequence has the most full kv blocks in it), its full kv blocks; and each batch's ragged last
// kv block, zero-padded past the batch's length, into the batch's own entry.
class KeyBlockIter {
public:
    __aicore__ inline KeyBlockIter(const PasaTilingData& t, const BatchTable& batches, const KvPages& pages, uint32_t core)
        : t_(t), batches_(batches), pages_(pages), core_(core) {}

    __aicore__ inline bool Next(KeyBlockTask& task)
    {
        while (b_ < t_.batch) {
            if (kvLen_ < 0) Begin();
            if (u_ >= units_) {
                if (!NextEntry()) {
                    ++b_;
                    kvLen_ = -1;
                }
                continue;
            }
            const uint32_t u = u_++;
            if ((counter_++) % t_.prepDim != core_) continue;
            Fill(task, u);
            return true;
        }
        return false;
    }

private:
    // A new batch: its length, then its first entry (paged) or all its blocks (dense).
    __aicore__ inline void Begin()
    {
        const BatchInfo info = batches_.Get(b_);
        kvLen_ = info.kvLen;
        kvStart_ = info.kvStart;
        entry_ = 0;
        u_ = 0;
        units_ = 0;
        const uint32_t n = t_.kvBlock;
        blocks_ = kvLen_ > 0 ? CeilDiv(static_cast<uint32_t>(kvLen_), n) : 0;
        if (!t_.paged) {
            units_ = blocks_ * t_.numKvHeads;
            return;
        }
        entries_ = kvLen_ > 0 ? CeilDiv(static_cast<uint32_t>(kvLen_), t_.blockSize) : 0;
        entry_ = 0xFFFFFFFFu;
        NextEntry();
    }

    // Paged: the next table entry of batch b_ with work (false when none is left).
    __aicore__ inline bool NextEntry()
    {
        if (!t_.paged) return false;
        const uint32_t n = t_.kvBlock, subs = t_.subBlocks;
        while (++entry_ < entries_) {
            const uint64_t flat = static_cast<uint64_t>(b_) * t_.tableStride + entry_;
            const int64_t rows = kvLen_ - static_cast<int64_t>(entry_) * t_.blockSize;
            const uint32_t full = static_cast<uint32_t>(Min64(rows / n, subs));
            full_ = pages_.Owner(flat) == static_cast<int64_t>(flat) ? full : 0;
            tailSub_ = full;
            tail_ = rows % n != 0 && rows < static_cast<int64_t>(t_.blockSize);
            units_ = (full_ + (tail_ ? 1 : 0)) * t_.numKvHeads;
            u_ = 0;
            if (units_ > 0) return true;
        }
        units_ = 0;
        return false;
    }

    __aicore__ inline void Fill(KeyBlockTask& task, uint32_t u) const
    {
        const uint32_t n = t_.kvBlock;
        task.b = b_;
        task.kvHead = u % t_.numKvHeads;
        if (!t_.paged) {
            task.block = u / t_.numKvHeads;
            task.slot = (static_cast<uint64_t>(b_) * t_.numKvHeads + task.kvHead) * t_.numKvBlocks + task.block;
        } else {
            const uint32_t k = u / t_.numKvHeads, sub = k < full_ ? k : tailSub_;  // the owner's full ones, then the tail
            task.block = (entry_ * t_.blockSize) / n + sub;
            const uint64_t flat = static_cast<uint64_t>(b_) * t_.tableStride + entry_;
            task.slot = (flat * t_.subBlocks + sub) * t_.numKvHeads + task.kvHead;
        }
        task.validRows = Min(n, static_cast<uint32_t>(kvLen_) - task.block * n);
        task.kvStart = kvStart_;
    }

    const PasaTilingData& t_;
    const BatchTable& batches_;
    const KvPages& pages_;
    uint32_t core_;
    uint32_t b_ = 0, counter_ = 0, u_ = 0, units_ = 0, blocks_ = 0, entry_ = 0, entries_ = 0, full_ = 0, tailSub_ = 0;
    bool tail_ = false;
    int64_t kvLen_ = -1, kvStart_ = 0;
};

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

// Split kv: the partial results of (task, split) `unit`: O / l (qTilePad x headDimV fp32), then
// the rows' LSE (2 vecRowsPad fp32, PartialLseRow).
__aicore__ inline GM_ADDR PartialOut(GM_ADDR workspace, const PasaTilingData& t, uint64_t unit)
{
    return workspace + t.partialOffset + unit * t.partialSlotBytes;
}
__aicore__ inline GM_ADDR PartialLse(GM_ADDR workspace, const PasaTilingData& t, uint64_t unit)
{
    return PartialOut(workspace, t, unit) + static_cast<uint64_t>(t.qTilePad) * t.headDimV * sizeof(float);
}
// The LSE element of the first row of the vector core whose rows start at tile row `rowBase`.
__aicore__ inline uint32_t PartialLseRow(const PasaTilingData& t, uint32_t rowBase) { return rowBase == 0 ? 0 : t.vecRowsPad; }

}  // namespace pasa

#endif  // PASA_WORKSPACE_H
