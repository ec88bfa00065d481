// The schedule of the attention kernels: each batch's parameters and visible keys, the
// attention tasks of an AI Core (with split kv, their ranges) and the stream of their kv blocks.
// Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_TASKS_H
#define PASA_TASKS_H

#include "pasa_kernel_common.h"

namespace pasa {

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

// Rows of a tile of `rows` rows the first AIV takes (the second takes the rest): vecRows of a
// full tile; of a smaller one (a query's last tile, a piece) half, rounded up to 16, so that
// both AIVs share its rows.
__aicore__ inline uint32_t FirstAivRows(const PasaTilingData& t, uint32_t rows)
{
    return rows >= t.qTile ? t.vecRows : Min(t.vecRows, Align16(CeilDiv(rows, 2)));
}

// The rows [base, base + count) of a tile of `rows` rows that AIV `sub` (0 or 1) takes; returns count.
__aicore__ inline uint32_t AivRows(const PasaTilingData& t, uint32_t rows, uint32_t sub, uint32_t& base)
{
    const uint32_t first = FirstAivRows(t, rows);
    base = sub == 0 ? 0 : first;
    return sub == 0 ? Min(first, rows) : (rows > first ? rows - first : 0);
}

// The tile shape of a batch with `qLen` query rows: `pitch` positions per head, `heads` heads.
__aicore__ inline void TileShape(const PasaTilingData& t, int64_t qLen, uint32_t& pitch, uint32_t& heads)
{
    pitch = Min(t.qBlock, qLen > 0 ? static_cast<uint32_t>(qLen) : 1u);
    heads = Min(t.groupSize, t.qBlock / pitch > 0 ? t.qBlock / pitch : 1u);
}

// Rows [piece * rows, ...) of a tile's `positions` positions are piece `piece` of `pieces`:
// `rows` = the positions split evenly, rounded up to 16, at least PASA_MIN_PIECE_ROWS.
__aicore__ inline uint32_t PieceRows(uint32_t positions, uint32_t pieces)
{
    const uint32_t even = Align16(CeilDiv(positions, pieces));
    return even > PASA_MIN_PIECE_ROWS ? even : PASA_MIN_PIECE_ROWS;
}

// Walks the attention tasks (with split kv: the (task, split) units) of AI Core `core` of
// `cores`. Tasks go in the order query tile (the last first), batch, kv head, head chunk, split,
// and are dealt in snake order (0 .. n-1, then n-1 .. 0, ...): with a causal mask the later query
// tiles see more blocks, so every core gets long and short tasks alike. A task from ordinal
// t.tailFrom on is dealt as t.tailPieces pieces of its query positions (a tile of one head;
// a tile of stacked heads is its first piece whole), each a task of its own.
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
            const uint32_t qt = qt_ - 1, b = b_, kvh = kvh_, chunk = chunk_, split = split_, piece = piece_;
            if (b != infoBatch_) {
                info_ = batches_.Get(b);
                infoBatch_ = b;
                TileShape(t_, info_.qLen, pitch_, heads_);
            }
            const uint32_t chunks = CeilDiv(t_.groupSize, heads_);
            const uint32_t tiles = info_.qLen > 0 ? CeilDiv(static_cast<uint32_t>(info_.qLen), pitch_) : 0;
            if (qt >= tiles || chunk >= chunks) {
                Step(chunks, 1);
                continue;
            }
            if (split == 0 && piece == 0) ++tasks_;
            const uint32_t ordinal = tasks_ - 1, pieces = ordinal >= t_.tailFrom ? t_.tailPieces : 1;
            Step(chunks, pieces);
            const uint32_t positions = Min(pitch_, static_cast<uint32_t>(info_.qLen) - qt * pitch_);
            uint32_t lo = 0, count = positions;
            if (pieces > 1) {  // this piece's positions (a tile of stacked heads stays whole)
                const uint32_t rows = heads_ == 1 ? PieceRows(positions, pieces) : positions;
                lo = Min(positions, piece * rows);
                count = Min(rows, positions - lo);
                if (count == 0) continue;
            }
            const uint32_t round = counter_ / cores_, pos = counter_ % cores_;
            ++counter_;
            if ((round % 2 == 0 ? pos : cores_ - 1 - pos) != core_) continue;
            task.b = b;
            task.index = ordinal < t_.tailFrom ? ordinal : t_.tailFrom + (ordinal - t_.tailFrom) * t_.tailPieces + piece;
            task.split = split;
            Fill(task, kvh, chunk, qt * pitch_ + lo, count);
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
        return task.rows > FirstAivRows(t_, task.rows) && taskFlags_.GetValue(slot + PASA_TASK_FLAG_BYTES) != 0;
    }

    // Advance (piece, split, chunk, kv head, batch, query tile) after the unit just read.
    __aicore__ inline void Step(uint32_t chunks, uint32_t pieces)
    {
        if (++piece_ < pieces) return;
        piece_ = 0;
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

    // The task of positions q0 .. q0 + positions - 1 of head chunk `chunk` of kv head kvh.
    __aicore__ inline void Fill(AttentionTask& task, uint32_t kvh, uint32_t chunk, uint32_t q0, uint32_t positions) const
    {
        const uint32_t n = t_.kvBlock;
        task.kvHead = kvh;
        task.head0 = kvh * t_.groupSize + chunk * heads_;
        task.heads = Min(heads_, t_.groupSize - chunk * heads_);
        task.pitch = pitch_;
        task.q0 = q0;
        task.positions = positions;
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
    uint32_t b_ = 0, kvh_ = 0, chunk_ = 0, split_ = 0, piece_ = 0, counter_ = 0, tasks_ = 0, infoBatch_ = 0xFFFFFFFFu;
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

// The slot of AI Core `core`'s byte from vector core half `sub` (PASA_TASK_FLAG_BYTES each, after the tasks'
// slots): 1 if a row of any of that half's tasks is flagged (the attention launch without split kv).
__aicore__ inline uint64_t CoreFlagSlot(const PasaTilingData& t, uint32_t core, uint32_t sub)
{
    return ((static_cast<uint64_t>(t.numTasks) + core) * 2 + sub) * PASA_TASK_FLAG_BYTES;
}

// The flag area (taskFlagsOffset) for the scalar unit's reads once the bytes are stored: they (and
// the row flags) were written through MTE3, so the scalar data cache drops what it holds first.
__aicore__ inline GlobalTensor<uint8_t> StoredFlags(const PasaTilingData& t, GM_ADDR workspace)
{
    GlobalTensor<uint8_t> flags;
    flags.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(workspace + t.taskFlagsOffset));
    DataCacheCleanAndInvalid<uint8_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(flags);
    return flags;
}

// Whether AI Core `core` has a task whose flag bytes are set (work for the repair pass), from its
// two core bytes (CoreFlagSlot; the attention launch without split kv, whose vector cores write
// them once their last task is stored): two GM scalar reads, where HasFlaggedTask walks the tasks.
__aicore__ inline bool CoreFlagged(const PasaTilingData& t, GM_ADDR workspace, uint32_t core)
{
    GlobalTensor<uint8_t> flags = StoredFlags(t, workspace);
    return flags.GetValue(CoreFlagSlot(t, core, 0)) != 0 || flags.GetValue(CoreFlagSlot(t, core, 1)) != 0;
}

// Whether AI Core `core` has a task whose flag bytes are set (work for the repair pass), of the
// tasks `t` deals it (the repair pass's tiling deals the same ones): with split kv, where the
// merge wrote the bytes; the pass's iterator then reads them (StoredFlags).
__aicore__ inline bool HasFlaggedTask(GM_ADDR tiling, const PasaTilingData& t, GM_ADDR workspace, uint32_t core)
{
    StoredFlags(t, workspace);
    BatchTable batches;
    batches.Init(tiling, t);
    AttentionTaskIter it(t, batches, core, t.blockDim, t.kvSplits);
    it.OnlyFlagged(workspace);
    AttentionTask task;
    return it.Next(task);
}

}  // namespace pasa

#endif  // PASA_TASKS_H
