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

// M^T (n x n, row-major in GM) -> L1 (NZ) -> L0A (Zz), where it stays for every kv block;
// returns once the cube may read it.
template <typename T>
__aicore__ inline void LoadShiftMatrix(TPipe& pipe, TQue<TPosition::A1, 1>& l1, const LocalTensor<T>& l0a,
                                       const GlobalTensor<T>& shift, uint32_t n)
{
    LocalTensor<T> m1 = l1.template AllocTensor<T>();
    DataCopy(m1, shift, Nd2NzParams(1, static_cast<uint16_t>(n), static_cast<uint16_t>(n), 0, static_cast<uint16_t>(n),
                                    static_cast<uint16_t>(n), 1, 0));
    l1.EnQue(m1);
    m1 = l1.template DeQue<T>();
    for (uint32_t mb = 0; mb < n / kC0; ++mb) {
        LoadData(l0a[mb * (n / kC0) * kFractal], m1[mb * kFractal],
                 LoadData2DParams(0, static_cast<uint8_t>(n / kC0), static_cast<uint16_t>(n / kC0), 0, 0, false, 0));
    }
    l1.FreeTensor(m1);
    const TEventID loaded = pipe.AllocEventID<HardEvent::MTE1_M>();
    SetFlag<HardEvent::MTE1_M>(loaded);
    WaitFlag<HardEvent::MTE1_M>(loaded);
    pipe.ReleaseEventID<HardEvent::MTE1_M>(loaded);
}

// Each of `count` rows of `d` floats minus the same d-vector `vec`: whole-tile Sub, 64 columns a
// repeat, one repeat per row (src1 repeat stride 0).
__aicore__ inline void SubtractFromEachRow(const LocalTensor<float>& rows, const LocalTensor<float>& vec, uint32_t count,
                                           uint32_t d)
{
    const uint8_t rowBlocks = static_cast<uint8_t>(d * sizeof(float) / 32);
    for (uint32_t c = 0; c < d; c += 64) {
        Sub(rows[c], rows[c], vec[c], d - c < 64 ? d - c : 64, static_cast<uint8_t>(count),
            BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, 0));
    }
    ResetMask();  // leave the full mask: Compares reads the register
}

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

// One batch's parameters (PASA_BATCH_* records of the parameter buffer).
struct BatchInfo {
    int64_t qLen = 0;
    int64_t kvLen = 0;
    int64_t next = 0;     // band: key j visible to row i iff j <= i + next
    int64_t pre = 0;      // PASA_MASK_BAND: and j >= i - pre
    int64_t qStart = 0;   // packed: first row of the batch on the query's (and output's) S axis
    int64_t kvStart = 0;  // packed: first key of the batch on the key's S axis
};

class BatchTable {
public:
    // The records follow the tiling struct at byte offset t.batchParamsOffset.
    __aicore__ inline void Init(GM_ADDR tiling, const PasaTilingData& t)
    {
        records_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(tiling + t.batchParamsOffset),
                                 static_cast<uint64_t>(t.batch) * PASA_BATCH_FIELDS);
    }
    __aicore__ inline BatchInfo Get(uint32_t b) const
    {
        const uint64_t at = static_cast<uint64_t>(b) * PASA_BATCH_FIELDS;
        BatchInfo info;
        info.qLen = records_.GetValue(at + PASA_BATCH_Q_LEN);
        info.kvLen = records_.GetValue(at + PASA_BATCH_KV_LEN);
        info.next = records_.GetValue(at + PASA_BATCH_NEXT);
        info.pre = records_.GetValue(at + PASA_BATCH_PRE);
        info.qStart = records_.GetValue(at + PASA_BATCH_Q_START);
        info.kvStart = records_.GetValue(at + PASA_BATCH_KV_START);
        return info;
    }
    __aicore__ inline int64_t KvLen(uint32_t b) const
    {
        return records_.GetValue(static_cast<uint64_t>(b) * PASA_BATCH_FIELDS + PASA_BATCH_KV_LEN);
    }

private:
    AscendC::GlobalTensor<int32_t> records_;
};

// The keys query row `row` (local position) may see: [VisibleBegin, VisibleEnd).
__aicore__ inline int64_t VisibleEnd(const BatchInfo& info, uint32_t maskMode, int64_t row)
{
    if (maskMode == PASA_MASK_NONE) return info.kvLen;
    return Max64(0, Min64(info.kvLen, row + info.next + 1));
}
__aicore__ inline int64_t VisibleBegin(const BatchInfo& info, uint32_t maskMode, int64_t row)
{
    if (maskMode != PASA_MASK_BAND) return 0;
    return Max64(0, Min64(info.kvLen, row - info.pre));
}

// Where the query rows of a batch live: the tensor batch index and the row offset on the S axis.
__aicore__ inline uint32_t TensorBatch(const PasaTilingData& t, uint32_t b) { return t.packed ? 0 : b; }

// One attention task: a tile of `heads` query heads of kv head `kvHead` (heads head0 ..
// head0 + heads - 1) times `positions` valid query rows each, positions q0 .. q0 + positions - 1;
// each head's rows are `pitch` apart (rows past `positions` are computed, never stored). Row r of
// the tile is head head0 + r / pitch at position q0 + r % pitch. The task walks kv blocks
// blockBegin .. blockBegin + numBlocks - 1; blocks in [fullFrom, fullTo) are visible in full to
// every row. With split kv it is one of the task's `kvSplits` ranges: `split`, and `index` is the
// task's ordinal (its partial results go to slot index * kvSplits + split).
struct AttentionTask {
    uint32_t b = 0, kvHead = 0, head0 = 0, heads = 1, q0 = 0, positions = 0, pitch = 1, rows = 0;
    uint32_t blockBegin = 0, numBlocks = 0, fullFrom = 0, fullTo = 0;
    uint32_t index = 0, split = 0;
    BatchInfo info;
};

// The tile shape of a batch with `qLen` query rows: `pitch` positions per head, `heads` heads.
__aicore__ inline void TileShape(const PasaTilingData& t, int64_t qLen, uint32_t& pitch, uint32_t& heads)
{
    pitch = Min(t.qBlock, qLen > 0 ? static_cast<uint32_t>(qLen) : 1u);
    heads = Min(t.groupSize, t.qBlock / pitch > 0 ? t.qBlock / pitch : 1u);
}

// Walks the attention tasks (with split kv: the (task, split) units) of AI Core `core` of
// `cores`. Tasks go in the order query tile (the last first), batch, kv head, head chunk, split,
// and are dealt in snake order (0 .. n-1, then n-1 .. 0, ...): with a causal mask the later query
// tiles see more blocks, so every core gets long and short tasks alike.
class AttentionTaskIter {
public:
    __aicore__ inline AttentionTaskIter(const PasaTilingData& t, const BatchTable& batches, uint32_t core,
                                        uint32_t cores, uint32_t splits)
        : t_(t), batches_(batches), core_(core), cores_(cores), splits_(splits), qt_(t.numQTiles) {}

    // The repair launch: skip the tasks whose flag bytes (workspace + taskFlagsOffset) are 0.
    __aicore__ inline void OnlyFlagged(GM_ADDR workspace)
    {
        taskFlags_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(workspace + t_.taskFlagsOffset));
        onlyFlagged_ = true;
    }

    __aicore__ inline bool Next(AttentionTask& task)
    {
        while (qt_ > 0) {
            const uint32_t qt = qt_ - 1, b = b_, kvh = kvh_, chunk = chunk_, split = split_;
            if (b != infoBatch_) {
                info_ = batches_.Get(b);
                infoBatch_ = b;
                TileShape(t_, info_.qLen, pitch_, heads_);
            }
            const uint32_t chunks = CeilDiv(t_.groupSize, heads_);
            const uint32_t tiles = info_.qLen > 0 ? CeilDiv(static_cast<uint32_t>(info_.qLen), pitch_) : 0;
            Step(chunks);
            if (qt >= tiles || chunk >= chunks) continue;
            if (split == 0) ++tasks_;
            const uint32_t round = counter_ / cores_, pos = counter_ % cores_;
            ++counter_;
            if ((round % 2 == 0 ? pos : cores_ - 1 - pos) != core_) continue;
            task.b = b;
            task.index = tasks_ - 1;
            task.split = split;
            Fill(task, kvh, chunk, qt);
            if (onlyFlagged_ && !Flagged(task)) continue;
            return true;
        }
        return false;
    }

private:
    // A task's flag bytes, one per vector core half that holds rows (a GM scalar read each).
    __aicore__ inline bool Flagged(const AttentionTask& task) const
    {
        const uint64_t slot = static_cast<uint64_t>(task.index) * 2 * PASA_TASK_FLAG_BYTES;
        if (taskFlags_.GetValue(slot) != 0) return true;
        return task.rows > t_.vecRows && taskFlags_.GetValue(slot + PASA_TASK_FLAG_BYTES) != 0;
    }

    // Advance (split, chunk, kv head, batch, query tile) after the unit just read.
    __aicore__ inline void Step(uint32_t chunks)
    {
        if (++split_ < splits_) return;
        split_ = 0;
        if (++chunk_ < chunks) return;
        chunk_ = 0;
        if (++kvh_ < t_.numKvHeads) return;
        kvh_ = 0;
        if (++b_ < t_.batch) return;
        b_ = 0;
        --qt_;
    }

    __aicore__ inline void Fill(AttentionTask& task, uint32_t kvh, uint32_t chunk, uint32_t qt) const
    {
        const uint32_t n = t_.kvBlock;
        task.kvHead = kvh;
        task.head0 = kvh * t_.groupSize + chunk * heads_;
        task.heads = Min(heads_, t_.groupSize - chunk * heads_);
        task.pitch = pitch_;
        task.q0 = qt * pitch_;
        task.positions = Min(pitch_, static_cast<uint32_t>(info_.qLen) - task.q0);
        task.rows = task.heads == 1 ? task.positions : task.heads * pitch_;
        task.info = info_;
        const int64_t first = task.q0, last = static_cast<int64_t>(task.q0) + task.positions - 1;
        const int64_t begin = VisibleBegin(info_, t_.maskMode, first), end = VisibleEnd(info_, t_.maskMode, last);
        uint32_t from = static_cast<uint32_t>(begin) / n;
        uint32_t to = end > begin ? CeilDiv(static_cast<uint32_t>(end), n) : from;
        if (splits_ > 1) {  // this split's share of the task's blocks
            const uint32_t per = CeilDiv(to - from, splits_);
            const uint32_t lo = Min(to, from + task.split * per);
            to = Min(to, lo + per);
            from = lo;
        }
        task.blockBegin = from;
        task.numBlocks = to - from;
        const int64_t fullBegin = VisibleBegin(info_, t_.maskMode, last), fullEnd = VisibleEnd(info_, t_.maskMode, first);
        task.fullFrom = CeilDiv(static_cast<uint32_t>(fullBegin), n);
        task.fullTo = t_.hasMask ? 0 : static_cast<uint32_t>(fullEnd) / n;
    }

    const PasaTilingData& t_;
    const BatchTable& batches_;
    uint32_t core_, cores_, splits_;
    uint32_t qt_;  // one past the query tile being dealt
    uint32_t b_ = 0, kvh_ = 0, chunk_ = 0, split_ = 0, counter_ = 0, tasks_ = 0, infoBatch_ = 0xFFFFFFFFu;
    uint32_t pitch_ = 1, heads_ = 1;
    BatchInfo info_;
    GlobalTensor<uint8_t> taskFlags_;
    bool onlyFlagged_ = false;
};

// Whether kv block j of a task is visible in full to every row of it (no mask to apply).
__aicore__ inline bool FullyVisible(const AttentionTask& task, uint32_t j) { return j >= task.fullFrom && j < task.fullTo; }

// The tasks of one AI Core as a stream of kv blocks: cursors walk (task, block) pairs in
// order, the cube's and the vector cores' leading and lagging cursors a few blocks apart, so
// that the blocks of the next task enter the pipeline while the last ones of a task leave it.
// The window holds the tasks from the slowest cursor on; callers keep their cursors within
// kTaskWindow tasks of each other. A cursor's block is the offset within its task's blocks.
constexpr uint32_t kTaskWindow = 8;

struct BlockCursor {
    uint32_t task = 0;
    uint32_t block = 0;
};

class TaskWindow {
public:
    // The repair launch (t.repair) deals only the flagged tasks (AttentionTaskIter::OnlyFlagged).
    __aicore__ inline TaskWindow(const PasaTilingData& t, const BatchTable& batches, uint32_t core, GM_ADDR workspace)
        : it_(t, batches, core, t.blockDim, t.kvSplits)
    {
        if (t.repair) it_.OnlyFlagged(workspace);
    }
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

// The K' (and pasa-exact mean16) workspace holds kv blocks of one kv head, kvBlock x headDim
// fp16 each (mean16: headDim), at a block slot: (b, kv head, block) in order, or with paged KV
// the K' slot of the block's table entry (KvPages::KeySlot) times the kv heads plus the head. With
// fuseShift only part-filled last blocks are there, one per (b, kv head).
__aicore__ inline uint64_t KeyPrimeSlot(const PasaTilingData& t, const KvPages& pages, uint32_t b, uint32_t kvHead,
                                        uint32_t block, int64_t kvLen)
{
    if (t.fuseShift) return static_cast<uint64_t>(b) * t.numKvHeads + kvHead;
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
// kv block, zero-padded past the batch's length, into the batch's own entry. With fuseShift (the
// attention kernel shifts the full blocks) only each batch's part-filled last block.
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
        if (t_.fuseShift) {
            units_ = kvLen_ % n != 0 ? t_.numKvHeads : 0;
            return;
        }
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
        if (!t_.paged || t_.fuseShift) return false;
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
        if (t_.fuseShift) {
            task.block = blocks_ - 1;
            task.slot = static_cast<uint64_t>(b_) * t_.numKvHeads + task.kvHead;
        } else if (!t_.paged) {
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

#endif  // PASA_KERNEL_COMMON_H
