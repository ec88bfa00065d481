// Paged KV: the block table, and the element offset of a key or value row in the dense tensor
// or in its physical block.
// Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_KV_PAGES_H
#define PASA_KV_PAGES_H

#include "pasa_tasks.h"

namespace pasa {

// Paged KV: the block table (B x tableStride physical block ids) and, for the K' of the PASA
// allocations, the slot table (the owner entry of each entry's physical block, see
// pasa_npu/kernel_inputs.py). Key position `pos` of batch b is row pos % blockSize of physical
// block table[b][pos / blockSize].
class KvPages {
public:
    __aicore__ inline void Init(GM_ADDR blockTable, GM_ADDR keySlots, const PasaTilingData& t)
    {
        t_ = &t;
        if (!t.paged) return;
        const uint64_t entries = static_cast<uint64_t>(t.batch) * t.tableStride;
        table_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(blockTable), entries);
        if (keySlots != nullptr) slots_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(keySlots), entries);
    }
    __aicore__ inline uint32_t Physical(uint32_t b, int64_t pos) const
    {
        return static_cast<uint32_t>(table_.GetValue(static_cast<uint64_t>(b) * t_->tableStride + pos / t_->blockSize));
    }
    // The K' slot of kv block j of batch b: the owner entry's block for a full block, the batch's
    // own entry for its ragged last block (see KeyBlockIter).
    __aicore__ inline uint64_t KeySlot(uint32_t b, uint32_t j, int64_t kvLen) const
    {
        const uint64_t n = t_->kvBlock, pos = j * n, entry = static_cast<uint64_t>(b) * t_->tableStride + pos / t_->blockSize;
        const uint64_t sub = (pos % t_->blockSize) / n;
        const bool tail = static_cast<int64_t>(pos + n) > kvLen;
        const uint64_t region = tail ? entry : static_cast<uint64_t>(slots_.GetValue(entry));
        return region * t_->subBlocks + sub;
    }
    __aicore__ inline int64_t Owner(uint64_t entry) const { return slots_.GetValue(entry); }

private:
    const PasaTilingData* t_ = nullptr;
    AscendC::GlobalTensor<int32_t> table_, slots_;
};

// Element offset of key (or value) row `pos` of kv head `kvHead` of batch b: in the dense tensor
// (at the batch's kvStart when packed) or in its physical block. Rows pos .. pos + count - 1 are
// contiguous in steps of the row stride while they stay in one physical block (RunLength).
__aicore__ inline uint64_t KvRowOffset(const PasaTilingData& t, const KvPages& pages, uint32_t b, uint32_t kvHead,
                                       int64_t kvStart, int64_t pos, uint32_t dim)
{
    if (t.paged) {
        return RowOffset(t.kvLayout, pages.Physical(b, pos), kvHead, static_cast<uint32_t>(pos % t.blockSize), t.numKvHeads,
                         t.blockSize, dim);
    }
    return RowOffset(t.kvLayout, TensorBatch(t, b), kvHead, static_cast<uint32_t>(kvStart + pos), t.numKvHeads, t.seqKv, dim);
}
__aicore__ inline uint32_t RunLength(const PasaTilingData& t, int64_t pos, uint32_t count)
{
    if (!t.paged) return count;
    return Min(count, t.blockSize - static_cast<uint32_t>(pos % t.blockSize));
}

}  // namespace pasa

#endif  // PASA_KV_PAGES_H
