// The vector side (AIV) of the PASA attention kernel. Each AIV owns a band of rows of every
// tile (the first FirstAivRows rows, or the rest) and works on them in chunks of
// tiling.vecChunkRows rows (all of them, up to PASA_MAX_CHUNK_ROWS, where its UB holds their tiles; the host's choice,
// pasa_tiling.cpp's PlanVector): every instruction covers
// a whole chunk (padding rows computed and never stored), no loop runs over rows and the scalar
// unit reads no UB in the per-block steps. The kept statistics and the accumulator hold every row
// of the band, each chunk its own part of them; the results do not depend on the chunk. The
// per-row statistics of a block (pasa's whole pseudo-average update, the fp32 allocations'
// rescale factor and row sum) wait for the last chunk of a group of tiling.vecStatRows rows and
// then update once for the group: a row vector costs one instruction whatever its length, so
// the instructions per block do not grow with the number of chunks.
//
// Per kv block j: wait S'_j, copy it in (ping-pong; with shiftScores the raw fp32 scores, shifted
// here into S': ShiftScores in pasa_vector_steps.h), mask it if the block is not fully visible,
// form P'_j and the block's statistics (pasa_vector_steps.h), copy P'_j out and raise P_READY;
// PASA_PV_DELAY blocks later fold P'_j V_j into the accumulator with the rescale factors kept
// for block j. Like the cube, the AIV walks its tasks as one stream of blocks: the first blocks
// of a task are processed while the last P'V products of the previous one are still on their
// way, so the statistics come in two sets (by task parity) and a task's first fold writes O. The
// numerics are fallback/torch_blockwise.py's step by step (docs/design.md, "Precision
// allocations"); only the order of the fp32 row sums differs (a tree).
//
// Masks. A block that is not visible in full to every row gets a bit tile of its visible keys,
// built from whole-tile compares: the band's bounds against c - rel (c the column, rel the row's
// position in its head's run), the kv length against c, and an explicit mask's bytes (copied in
// with the scores) against 0. A row that sees no key of a block keeps its state: the fp32
// allocations by their finite sentinels, pasa by a select on its local maximum (the masked
// fp16 lowest).
//
// Finite sentinels stand where the reference has -inf: masked fp32 scores read -3e38 and a row
// starts from a maximum of -1e38 (so exp(masked - max) is exactly 0 and a row without visible
// keys keeps its state exactly); pasa's fp16 statistics start from -65504 and masked S' entries
// read -65504 for the row maximum, their P' entries are set to 0. Only the LSE of a row that
// never saw a key (its l is 0) is written as -inf.
//
// Split kv: a task's split writes its rows' O / l and LSE (finite, -3e38 for a row that saw
// nothing) to its partial slot; the merge kernel (pasa_merge.h) combines the splits.
//
// The resolution check (overflowCheck, pasa and pasa-exact, tiling.resolutionLimit > 0; docs/design.md,
// "Overflow detection and repair"): fp16 S' of large magnitude cannot resolve the softmax even when
// nothing overflows, so a row is also flagged when, in some kv block it sees, |its block row maximum
// of S'| (the shifted frame's maximum over its visible keys, before pasa-exact's c or pasa's
// recovery gamma F is added) reaches the limit, or (pasa) the block offset |gamma mean_j S'| that
// pasa recovers from the fp16 block mean, as coarse as an fp16 number of its size. Each row keeps
// its peak in UB: pasa in its fp16 statistics set (P_PEAK, carried and kept for rows without keys
// like the others; one Abs and one Max on a row vector per block for m', a Muls, an Abs and a Max
// for the offset), pasa-exact in PEAK32 (fp32, per task parity; an Abs and a Max). Finish
// flags the rows whose peak reaches the limit with those that are not finite; with split kv a
// split writes such a row's partial LSE as NaN, so that the merge's non-finite check flags it.
//
// Learnable sinks (tiling.hasSink): at the end of a task, after the shift is recovered and
// before O / l, each row that saw a key joins its head's sink logit as one more column with a
// zero value, in fp32 (docs/design.md, "Learnable sinks"); with split kv the merge joins it
// instead, so that it enters each row once.
#ifndef PASA_ATTENTION_VECTOR_H
#define PASA_ATTENTION_VECTOR_H

#include "pasa_store.h"
#include "pasa_vector_ops.h"

namespace pasa {

constexpr float kMaskedScore = -3.0e38f;   // fp32 masked score; a split's LSE of a row that saw nothing
constexpr float kInitialMax = -1.0e38f;    // fp32 running maximum before the first key
constexpr float kFp16Lowest = -65504.0f;   // fp16 masked S' (row maximum only) and pasa's initial m

// Slots of the statistics buffer. The kept slots, in units of vecRowsPad fp32, come first: the
// running statistics (per task parity and per block parity: block i of a task reads set i % 2 and
// writes set (i + 1) % 2), the ring of rescale factors and the rows' positions; each chunk's rows
// sit at the chunk's share of a slot (Kept, PasaSet). The scratch slots follow: a statistics
// group's, in units of vecStatRows fp32, then a chunk's step's, in units of vecChunkRows fp32.
enum StatSlot : uint32_t {
    SETS = 0,                       // pasa: P_COUNT fp16 vectors per set, [m | mloc | F | mean | n | peak | l | l']
                                    // for each statistics group in turn, set (task parity, block parity) at
                                    // 4 (2 tp + bp) (l, l' only with P''s row sums on the vector cores: from
                                    // the cube, l rides in the accumulator's last columns);
    M32 = 0, L32 = 4,               // fa-fp32, pasa-exact: m at 2 tp + bp, l at 4 + 2 tp + bp
    PEAK32 = 8,                     // pasa-exact, the resolution check: the rows' peak |rowmax S'| at 8 + tp
    RING = 16,                      // rescale factors of the last PASA_PV_DELAY + 1 blocks of the
                                    // stream (by stream position: a task's last folds run after the
                                    // next task's first softmaxes)
    REL = 20,                       // fp16 rel(r): the row's position within its head's run, every row;
                                    // the unit's second half holds the core flag (CoreFlag)
    KEPT_SLOTS = 21,
    // a statistics group's: ROWSUM gathers a block's row sums over the group's chunks (each at its
    // rows in the group) until the group's statistics update reads them; T1 is scratch
    ROWSUM = KEPT_SLOTS, T1,
    ONEZERO,                        // fp16 [1 | 0], G_ each
    GROUP_END,
    // a chunk's step's, free at the end of a task: the sink join (Finish) takes three of them
    T0 = GROUP_END, T2, T3, CONST, SHIFT, ROWMAX,
    TASK_BYTES,                     // the task's flag byte on its way to GM
    LSE, FIN0, FIN1,
    TASK_FLAG,                      // fp16: the maximum of the task's row flags over the chunks so far
    STAT_SLOTS,
    SINK = CONST, JOINED_M = SHIFT, JOINED_L = ROWSUM
};
static_assert(KEPT_SLOTS == PASA_VEC_KEPT_UNITS && GROUP_END - KEPT_SLOTS == PASA_VEC_GROUP_UNITS &&
                  STAT_SLOTS - GROUP_END <= PASA_VEC_SCRATCH_UNITS,
              "the host sizes the statistics buffer");
static_assert(PASA_PV_DELAY + 1 <= REL - RING, "one ring slot per block in flight");
static_assert(PASA_PV_DELAY + 2 <= kTaskWindow, "the vector cores' cursors stay within the task window");

// Index of the pasa statistics inside a set (fp16 vectors of vecRowsPad).
// P_PEAK: the resolution check's peak of |m'| and |gamma mean| over the task's blocks so far (0 at the start).
// P_L, P_LLOC: l and l' = fp16(sum P') where the vector cores sum P' (tiling.pvCols == headDimV).
// Where the cube sums it, it appends l' to each P'V row (pvCols = headDimV + 16) and the fold's
// fp16(fp16(a O) + fp16(b P'V)) is pasa's l update too, so l sits after O in the accumulator.
enum PasaStat : uint32_t { P_M = 0, P_MLOC, P_F, P_MEAN, P_N, P_PEAK, P_L, P_LLOC, P_COUNT = 8 };
static_assert(P_LLOC < P_COUNT && P_COUNT <= 8, "the peak and l are carried with the set; a set fits 4 fp32 units");
static_assert(P_LLOC == P_L + 1, "[l | l'] is one pair, as [a | b] is");

// OutT: output type; InT: type of P' for fa-fp32 (the input type; half otherwise). The per-block
// steps and the end of a task are defined in pasa_vector_steps.h.
template <typename OutT, typename InT>
class AttentionVector {
public:
    __aicore__ inline void Run(GM_ADDR mask, GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags, GM_ADDR workspace,
                               GM_ADDR tiling, const PasaTilingData& t)
    {
        t_ = &t;
        key_ = t.tilingKey;
        sub_ = static_cast<uint32_t>(GetSubBlockIdx());
        R_ = t.vecChunkRows;
        G_ = t.vecStatRows;
        all_ = t.vecRowsPad;
        workspace_ = workspace;
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ OutT*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse));
        if (t.hasMask) mask_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(mask));
        if (t.hasSink) sink_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(sink), t.numHeads);
        flags_.on = t.overflowCheck != 0 && t.kvSplits == 1;  // with split kv the merge writes the flags
        flags_.repair = t.repair != 0;
        // the resolution check: checked rows of the shifted allocations (the host sets the limit only then)
        resolution_ = t.overflowCheck != 0 && t.resolutionLimit > 0.0f && (key_ == PASA_KEY_PASA || key_ == PASA_KEY_PASA_EXACT);
        if (flags_.on) {
            flags_.out.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(rowFlags));
            flags_.tasks.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(workspace + t.taskFlagsOffset));
        }
        slots_.Init(workspace, t, static_cast<uint32_t>(GetBlockIdx()) / 2);
        batches_.Init(tiling, t);
        TaskWindow win(t, batches_, static_cast<uint32_t>(GetBlockIdx()) / 2, workspace);
        if (t.repair && !win.Has(0)) return;  // the repair launch: no flagged task on this core
        if (t.shiftScores && key_ == PASA_KEY_PASA) {  // the score map; a whole block's entries kept
            scoreMap_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + t.shiftMatrixOffset), 2 * (t.kvBlock + 1));
            mapA_ = scoreMap_.GetValue(2 * t.kvBlock);
            mapOff_ = scoreMap_.GetValue(2 * t.kvBlock + 1);
        }
        pipe_.InitBuffer(scoreIn_, t.ubScoreBuffers, t.ubScoreBytes);
        pipe_.InitBuffer(probOut_, t.ubProbBuffers, t.ubProbBytes);
        pipe_.InitBuffer(pvIn_, t.ubPvBuffers, t.ubPvBytes);
        pipe_.InitBuffer(constIn_, 2, R_ * sizeof(float));
        if (t.hasMask) pipe_.InitBuffer(maskIn_, 1, t.ubMaskTileBytes);
        pipe_.InitBuffer(acc_, t.ubAccBytes);
        pipe_.InitBuffer(work_, t.ubWorkBytes);
        pipe_.InitBuffer(tree_, t.ubTreeBytes);
        pipe_.InitBuffer(masks_, t.ubMaskBytes);
        pipe_.InitBuffer(stat_, t.ubStatBytes);
        BuildConstants();
        flags_.bytes = Stat(T0).template ReinterpretCast<uint8_t>();
        flags_.aligned = Stat(FIN1).template ReinterpretCast<uint8_t>();
        flags_.task = Stat(TASK_BYTES).template ReinterpretCast<uint8_t>();

        if (flags_.on && !flags_.repair) Duplicate(CoreFlag(), half(0.0f), 16);
        Stream(win);
        if (flags_.on && !flags_.repair) StoreCoreFlag();
    }

private:
    // Softmax of block g of the stream, then the fold of block g - PASA_PV_DELAY and, after a
    // task's last fold, its output. At most two tasks are in flight (the statistics' two sets);
    // a task that sees no key waits until the stream is empty and writes its zeros.
    __aicore__ inline void Stream(TaskWindow& win)
    {
        BlockCursor soft, fold;
        uint32_t behind = 0;  // softmaxes whose fold is not done
        while (true) {
            if (win.Has(soft.task) && soft.task <= fold.task + 1) {
                const AttentionTask& task = win.Get(soft.task);
                if (task.numBlocks == 0) {
                    if (behind > 0) {
                        FoldNext(win, fold, behind);
                        continue;
                    }
                    Use(task, soft.task);
                    Finish();
                    fold.task = ++soft.task;
                    continue;
                }
                Use(task, soft.task);
                Softmax(soft.block);
                win.Advance(soft);
                if (++behind <= PASA_PV_DELAY) continue;
            } else if (behind == 0) {
                break;
            }
            FoldNext(win, fold, behind);
        }
    }

    __aicore__ inline void FoldNext(TaskWindow& win, BlockCursor& fold, uint32_t& behind)
    {
        const AttentionTask& task = win.Get(fold.task);
        Use(task, fold.task);
        UpdateOutput(fold.block);
        if (fold.block + 1 == task.numBlocks) Finish();
        win.Advance(fold);
        --behind;
    }

    // The task the next step works on: its rows of this AIV and its statistics' set.
    __aicore__ inline void Use(const AttentionTask& task, uint32_t index)
    {
        task_ = &task;
        tp_ = index % 2;
        rows_ = AivRows(*t_, task.rows, sub_, rowBase_);
    }

    // Chunk k of the AIV's rows: false where it holds none of the task's rows.
    __aicore__ inline bool UseChunk(uint32_t k)
    {
        c0_ = k * R_;
        crows_ = rows_ > c0_ ? Min(rows_ - c0_, R_) : 0;
        return crows_ > 0;
    }
    __aicore__ inline uint32_t Chunks() const { return all_ / R_; }

    // pasa_vector_steps.h
    __aicore__ inline void BuildConstants();
    __aicore__ inline void BuildRel(uint32_t pitch);
    __aicore__ inline void LoadMaskTile(uint32_t j);
    __aicore__ inline void InitState();
    __aicore__ inline bool MaskBlock(uint32_t j, const LocalTensor<uint8_t>& maskTile, bool& rowsWithoutKeys);
    __aicore__ inline void ShiftScores(uint32_t j, const LocalTensor<float>& s);
    // The steps take P' from probOut_ just before they write it (its previous copy out may still run).
    __aicore__ inline void Step(uint32_t i, uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& c,
                                const LocalTensor<uint8_t>& maskTile, LocalTensor<half>& p);
    __aicore__ inline void Step(uint32_t i, uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& c,
                                const LocalTensor<uint8_t>& maskTile, LocalTensor<bfloat16_t>& p);
    template <typename P>
    __aicore__ inline void StepFa(uint32_t i, uint32_t j, const LocalTensor<float>& s, const LocalTensor<uint8_t>& maskTile,
                                  LocalTensor<P>& p);
    __aicore__ inline void StepPasa(uint32_t i, uint32_t j, const LocalTensor<half>& s, const LocalTensor<float>& c,
                                    const LocalTensor<uint8_t>& maskTile, LocalTensor<half>& p);
    __aicore__ inline void ChunkRowSums(uint32_t slot, const LocalTensor<half>& tile);
    __aicore__ inline void StepExact(uint32_t i, uint32_t j, const LocalTensor<half>& s, const LocalTensor<float>& c,
                                     const LocalTensor<uint8_t>& maskTile, LocalTensor<half>& p);
    __aicore__ inline void Statistics(uint32_t i, uint32_t j);
    __aicore__ inline void StatisticsPasa(uint32_t i, uint32_t j);
    __aicore__ inline void BroadcastFactors(uint32_t i);
    __aicore__ inline void Fold(uint32_t i, const LocalTensor<float>& pv);
    __aicore__ inline void Finish();
    __aicore__ inline void FinishChunk();
    __aicore__ inline void JoinSink(LocalTensor<float>& m, LocalTensor<float>& l, const LocalTensor<float>& x);
    __aicore__ inline void AccumulatorSums(const LocalTensor<float>& l);
    __aicore__ inline void SeenRows(const LocalTensor<float>& l);
    __aicore__ inline void FlagRows(const LocalTensor<float>& x, const LocalTensor<float>& lseCheck);
    __aicore__ inline void ExactPeak(bool noKeys);
    __aicore__ inline void ResolvedRows();
    __aicore__ inline void StoreCoreFlag();

    // ---------------------------------------------------------------- layout of the scratch
    __aicore__ inline LocalTensor<float> Stat(uint32_t slot)
    {
        const uint32_t groups = KEPT_SLOTS * all_;  // the first statistics group slot
        if (slot < KEPT_SLOTS) return stat_.Get<float>()[slot * all_];
        if (slot < GROUP_END) return stat_.Get<float>()[groups + (slot - KEPT_SLOTS) * G_];
        return stat_.Get<float>()[groups + (GROUP_END - KEPT_SLOTS) * G_ + (slot - GROUP_END) * R_];
    }
    __aicore__ inline LocalTensor<half> Stat16(uint32_t slot) { return Stat(slot).template ReinterpretCast<half>(); }
    // a kept one-unit slot: the rows from c0_ on (fp32), or at a statistics group's first row its G_ fp32
    // of room (pasa's [a | b] of the group in fp16)
    __aicore__ inline LocalTensor<float> Kept(uint32_t slot) { return Stat(slot)[c0_]; }
    __aicore__ inline LocalTensor<half> Kept16(uint32_t slot) { return Kept(slot).template ReinterpretCast<half>(); }
    // statistic `stat` of a pasa set from the row c0_ on (each group holds its P_COUNT vectors in turn)
    __aicore__ inline LocalTensor<half> PasaSet(uint32_t parity, uint32_t stat)
    {
        const uint32_t g0 = c0_ - GroupRow();
        return Stat16(SETS + 4 * (2 * tp_ + parity))[P_COUNT * g0 + stat * G_ + GroupRow()];
    }
    // pasa: the vector cores sum P' (the cube's P'V tile has no sums' columns), and the statistics of a
    // set it keeps: l and l' then, else the ones before them
    __aicore__ inline bool VectorProbSums() const { return t_->pvCols == t_->headDimV; }
    __aicore__ inline uint32_t PasaStats() const { return VectorProbSums() ? P_COUNT : P_L; }
    // the row c0_'s place within its statistics group
    __aicore__ inline uint32_t GroupRow() const { return c0_ % G_; }
    __aicore__ inline LocalTensor<float> M(uint32_t parity) { return Kept(M32 + 2 * tp_ + parity); }
    __aicore__ inline LocalTensor<float> L(uint32_t parity) { return Kept(L32 + 2 * tp_ + parity); }
    // fp16 x 16, entry 0: the maximum of the AIV's task flags so far (flags on, outside the repair launch)
    __aicore__ inline LocalTensor<half> CoreFlag() { return Stat16(REL)[all_]; }
    __aicore__ inline LocalTensor<half> Zeros16() { return Stat16(ONEZERO)[G_]; }  // G_ >= 16 zeros
    // masks_: the column index row (c = 0 .. n-1), rel broadcast one block a row, two bit tiles, row bits
    __aicore__ inline LocalTensor<half> ColumnRow() { return masks_.Get<half>(); }
    __aicore__ inline LocalTensor<half> RelBroadcast() { return ColumnRow()[Align16(t_->kvBlock)]; }
    __aicore__ inline LocalTensor<uint8_t> Bits(uint32_t i)
    {
        const uint32_t bytes = Align32(R_ * t_->kvBlock / 8);
        return RelBroadcast()[all_ * kC0].template ReinterpretCast<uint8_t>()[i * bytes];
    }
    __aicore__ inline LocalTensor<uint8_t> RowBits() { return Bits(2); }
    __aicore__ inline static uint32_t Align32(uint32_t v) { return (v + 31) / 32 * 32; }

    // ---------------------------------------------------------------- block i of a task (kv block j): S'_j in, P'_j out
    __aicore__ inline void Softmax(uint32_t i)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, j = task_->blockBegin + i;
        const bool maskTile = t.hasMask;
        if (maskTile && UseChunk(0)) LoadMaskTile(j);  // independent of the cube: issued before the wait
        CrossCoreWaitFlag(PASA_FLAG_S_READY);
        const uint32_t slot = scoreCount_++ % PASA_SCORE_SLOTS;
        const uint32_t probSlot = probCount_++ % PASA_PROB_SLOTS;
        ringSlot_ = RingSlot(softmaxCount_++);
        // the cube drains one row-constant slot per chunk of every task: count it on both AIVs,
        // rows or none, so that the ring stays in step with the cube's
        if (t.rowConstants && i % PASA_CONST_BLOCKS == 0) ++constCount_;
        for (uint32_t k = 0; k < Chunks(); ++k) {
            if (!UseChunk(k)) break;
            if (GroupRow() == 0) {
                if (i == 0) InitState();
                groupNoKeys_ = false;
            }
            if (maskTile && k > 0) LoadMaskTile(j);
            // both copies before either is queued: one wait covers their GM reads
            LocalTensor<float> s = scoreIn_.AllocTensor<float>();
            LoadSlotRows(s, slots_.score + slot * t.scoreSlotBytes, n, t.shiftScores != 0);
            LocalTensor<float> c = constIn_.AllocTensor<float>();
            if (t.rowConstants) LoadRowConstants(c, i);
            scoreIn_.EnQue(s);
            constIn_.EnQue(c);
            s = scoreIn_.DeQue<float>();
            c = constIn_.DeQue<float>();
            LocalTensor<uint8_t> m;
            if (maskTile) m = maskIn_.DeQue<uint8_t>();
            LocalTensor<InT> p;
            if (t.shiftScores) ShiftScores(j, s);  // pasa-exact: Stat(T2) then takes the place of Q . mean16
            Step(i, j, s, t.shiftScores ? Stat(T2) : c, m, p);
            scoreIn_.FreeTensor(s);
            constIn_.FreeTensor(c);
            if (maskTile) maskIn_.FreeTensor(m);
            probOut_.EnQue(p);
            p = probOut_.template DeQue<InT>();
            GlobalTensor<InT> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ InT*>(slots_.prob + probSlot * t.probSlotBytes));
            DataCopy(g[(rowBase_ + c0_) * n], p, crows_ * n);
            probOut_.FreeTensor(p);
            if ((c0_ + R_) % G_ == 0 && c0_ + R_ < rows_) Statistics(i, j);  // a group's last chunk, not the last group's
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(PASA_FLAG_P_READY);
        if (rows_ > 0) {  // the last group's statistics after the flag: the cube does not wait for them
            UseChunk((rows_ - 1) / R_);
            Statistics(i, j);
        }
    }

    // The chunk's row constants of block i of the task (fp32, one a row) from the cube's slot into c.
    __aicore__ inline void LoadRowConstants(const LocalTensor<float>& c, uint32_t i)
    {
        const PasaTilingData& t = *t_;
        GlobalTensor<float> g;
        g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slots_.rowConst + ((constCount_ - 1) % PASA_CONST_SLOTS) * t.constSlotBytes));
        DataCopyPad(c, g[(i % PASA_CONST_BLOCKS) * t.qTilePad + rowBase_ + c0_], DataCopyExtParams(1, crows_ * 4, 0, 0, 0),
                    DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
    }

    // This vector core's rows of a cube->vector slot (``width`` elements each) into ``dst``'s
    // bytes: fp32 for fa-fp32 and where ``fp32`` says so (shiftScores' raw scores), fp16 for the
    // allocations whose cube output is fp16.
    __aicore__ inline void LoadSlotRows(const LocalTensor<float>& dst, GM_ADDR slot, uint32_t width, bool fp32 = false)
    {
        const uint32_t first = (rowBase_ + c0_) * width;
        if (fp32 || key_ == PASA_KEY_FA_FP32) {
            GlobalTensor<float> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slot));
            DataCopy(dst, g[first], crows_ * width);
        } else {
            GlobalTensor<half> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(slot));
            DataCopy(dst.template ReinterpretCast<half>(), g[first], crows_ * width);
        }
    }

    // ---------------------------------------------------------------- O update with P'V of block i of the task
    __aicore__ inline void UpdateOutput(uint32_t i)
    {
        const PasaTilingData& t = *t_;
        CrossCoreWaitFlag(PASA_FLAG_PV_READY);
        const uint32_t slot = pvCount_++ % PASA_PV_SLOTS;
        ringSlot_ = RingSlot(foldCount_++);
        for (uint32_t k = 0; k < Chunks(); ++k) {
            if (!UseChunk(k)) break;
            if (GroupRow() == 0) BroadcastFactors(i);
            LocalTensor<float> pv = pvIn_.AllocTensor<float>();
            LoadSlotRows(pv, slots_.pv + slot * t.pvSlotBytes, t.pvCols);
            pvIn_.EnQue(pv);
            pv = pvIn_.DeQue<float>();
            Fold(i, pv);
            pvIn_.FreeTensor(pv);
        }
    }

    const PasaTilingData* t_ = nullptr;
    const AttentionTask* task_ = nullptr;
    uint32_t key_ = 0, sub_ = 0, rowBase_ = 0, rows_ = 0, tp_ = 0, relPitch_ = 0, relBase_ = 0;
    uint32_t R_ = 16, all_ = 16;   // rows of a chunk, of the AIV's band (padded)
    uint32_t G_ = 16;              // rows of a statistics group (a whole number of chunks)
    bool groupNoKeys_ = false;     // the block may have rows that see no key of it in the group's chunks
    uint32_t c0_ = 0, crows_ = 0;  // the chunk's first row in the band, the task's rows in it
    uint32_t scoreCount_ = 0, probCount_ = 0, pvCount_ = 0, constCount_ = 0;  // slot rings, continued across tasks
    uint32_t softmaxCount_ = 0, foldCount_ = 0, ringSlot_ = RING;  // blocks of the stream; the step's RING slot
    bool resolution_ = false;  // the resolution check runs (see the top of this file)
    float mapA_ = 0.0f, mapOff_ = 0.0f;  // shiftScores, pasa: the score map's [a, off] of a whole block
    __aicore__ inline static uint32_t RingSlot(uint32_t block) { return RING + block % (PASA_PV_DELAY + 1); }
    GM_ADDR workspace_ = nullptr;
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> scoreIn_, pvIn_, constIn_, maskIn_;
    TQue<TPosition::VECOUT, 1> probOut_;
    TBuf<TPosition::VECCALC> acc_, work_, tree_, masks_, stat_;
    GlobalTensor<OutT> out_;
    GlobalTensor<float> lse_;
    GlobalTensor<uint8_t> mask_;
    GlobalTensor<float> sink_;
    GlobalTensor<float> scoreMap_;
    CoreSlots slots_;
    BatchTable batches_;
    RowFlags flags_;
};

}  // namespace pasa

#include "pasa_vector_steps.h"

#endif  // PASA_ATTENTION_VECTOR_H
