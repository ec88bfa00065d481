// The vector side (AIV) of the PASA attention kernel. Each AIV owns a fixed band of rows of
// every tile (the first vecRows rows, or the rest) and works on them as whole tiles: every
// instruction covers all of the AIV's rows (vecRowsPad, padding rows computed and never
// stored), no loop runs over rows and the scalar unit reads no UB in the per-block steps.
//
// Per kv block j: wait S'_j, copy it in (ping-pong), mask it if the block is not fully visible,
// form P'_j and the block's statistics (pasa_vector_steps.h), copy P'_j out and raise P_READY;
// PASA_PV_DELAY blocks later fold P'_j V_j into the accumulator with the rescale factors kept
// for block j. Like the cube, the AIV walks its tasks as one stream of blocks: the first blocks
// of a task are processed while the last P'V products of the previous one are still on their
// way, so the statistics come in two sets (by task parity) and a task's first fold writes O. The numerics are fallback/torch_blockwise.py's step by step (docs/
// design.md, "Precision allocations"); only the order of the fp32 row sums differs (a tree).
//
// Finite sentinels stand where the reference has -inf: masked fp32 scores read -3e38 and a row
// starts from a maximum of -1e38 (so exp(masked - max) is exactly 0 and a row without visible
// keys keeps its state exactly); pasa's fp16 statistics start from -65504 and masked S' entries
// read -65504 for the row maximum, their P' entries are set to 0. Only the LSE of a row that
// never saw a key is written as -inf.
#ifndef PASA_ATTENTION_VECTOR_H
#define PASA_ATTENTION_VECTOR_H

#include "pasa_vector_ops.h"

namespace pasa {

constexpr float kMaskedScore = -3.0e38f;   // fp32 masked score
constexpr float kInitialMax = -1.0e38f;    // fp32 running maximum before the first key
constexpr float kFp16Lowest = -65504.0f;   // fp16 masked S' (row maximum only) and pasa's initial m

// Slots of the statistics buffer, in units of vecRowsPad fp32 (see PASA_VEC_STAT_UNITS). The
// running statistics exist per task parity and per block parity (block j reads set j % 2 and
// writes set (j + 1) % 2).
enum StatSlot : uint32_t {
    SETS = 0,                       // pasa: 8 fp16 vectors per set, [m | mloc | F | mean | l | lloc | n | pad],
                                    // set (task parity, block parity) at 4 (2 tp + bp);
    M32 = 0, L32 = 4,               // fa-fp32, pasa-exact: m at 2 tp + bp, l at 4 + 2 tp + bp
    T0 = 16, T1 = 17, T2 = 18, T3 = 19,
    RING = 20,                      // rescale factors of the last PASA_PV_DELAY + 1 blocks
    CONST = 24, SHIFT = 25, ROWMAX = 26, ROWSUM = 27, ONEZERO = 28, REL8 = 29, LSE = 33, FIN0 = 34, FIN1 = 35,
    STAT_SLOTS = 36
};
static_assert(STAT_SLOTS <= PASA_VEC_STAT_UNITS, "the host sizes the statistics buffer");
static_assert(PASA_PV_DELAY + 1 <= CONST - RING, "one ring slot per block in flight");
static_assert(PASA_PV_DELAY + 2 <= kTaskWindow, "the vector cores' cursors stay within the task window");

// Index of the pasa statistics inside a set (fp16 vectors of vecRowsPad).
enum PasaStat : uint32_t { P_M = 0, P_MLOC, P_F, P_MEAN, P_L, P_LLOC, P_N, P_COUNT = 8 };

// OutT: output type; InT: type of P' for fa-fp32 (the input type; half otherwise). The per-block
// steps and the end of a task are defined in pasa_vector_steps.h.
template <typename OutT, typename InT>
class AttentionVector {
public:
    __aicore__ inline void Run(GM_ADDR qLens, GM_ADDR kvLens, GM_ADDR next, GM_ADDR out, GM_ADDR lse, GM_ADDR workspace,
                               const PasaTilingData& t)
    {
        t_ = &t;
        key_ = t.tilingKey;
        sub_ = static_cast<uint32_t>(GetSubBlockIdx());
        rowBase_ = sub_ == 0 ? 0 : t.vecRows;
        R_ = t.vecRowsPad;
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ OutT*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse));
        slots_.Init(workspace, t, static_cast<uint32_t>(GetBlockIdx()) / 2);
        batches_.Init(qLens, kvLens, next, t.batch);
        pipe_.InitBuffer(scoreIn_, t.ubScoreBuffers, t.ubScoreBytes);
        pipe_.InitBuffer(probOut_, t.ubProbBuffers, t.ubProbBytes);
        pipe_.InitBuffer(pvIn_, t.ubPvBuffers, t.ubPvBytes);
        pipe_.InitBuffer(constIn_, 2, R_ * sizeof(float));
        pipe_.InitBuffer(acc_, t.ubAccBytes);
        pipe_.InitBuffer(work_, t.ubWorkBytes);
        pipe_.InitBuffer(tree_, t.ubTreeBytes);
        pipe_.InitBuffer(mask_, t.ubMaskBytes);
        pipe_.InitBuffer(stat_, t.ubStatBytes);
        BuildMaskRows();

        TaskWindow win(t, batches_, static_cast<uint32_t>(GetBlockIdx()) / 2);
        Stream(win);
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
                if (soft.block == 0) InitState();
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
        const uint32_t mine = sub_ == 0 ? t_->vecRows : t_->qTile - t_->vecRows;
        rows_ = task.rows > rowBase_ ? Min(task.rows - rowBase_, mine) : 0;
    }

    // pasa_vector_steps.h
    __aicore__ inline void BuildMaskRows();
    __aicore__ inline void InitState();
    __aicore__ inline bool MaskBlock(uint32_t j, bool& rowsWithoutKeys, int64_t& delta);
    // The steps take P' from probOut_ just before they write it (its previous copy out may still run).
    __aicore__ inline void Step(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& c, LocalTensor<half>& p);
    __aicore__ inline void Step(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& c,
                                LocalTensor<bfloat16_t>& p);
    template <typename P>
    __aicore__ inline void StepFa(uint32_t j, const LocalTensor<float>& s, LocalTensor<P>& p);
    __aicore__ inline void StepPasa(uint32_t j, const LocalTensor<half>& s, LocalTensor<half>& p);
    __aicore__ inline void StepExact(uint32_t j, const LocalTensor<half>& s, const LocalTensor<float>& c,
                                     LocalTensor<half>& p);
    __aicore__ inline void Fold(uint32_t j, const LocalTensor<float>& pv);
    __aicore__ inline void Finish();
    __aicore__ inline void StoreRows(const LocalTensor<OutT>& o, const LocalTensor<float>& lse);

    // ---------------------------------------------------------------- layout of the scratch
    __aicore__ inline LocalTensor<float> Stat(uint32_t slot) { return stat_.Get<float>()[slot * R_]; }
    __aicore__ inline LocalTensor<half> Stat16(uint32_t slot) { return Stat(slot).template ReinterpretCast<half>(); }
    __aicore__ inline LocalTensor<half> PasaSet(uint32_t parity, uint32_t stat)
    {
        return Stat16(SETS + 4 * (2 * tp_ + parity))[stat * R_];
    }
    __aicore__ inline LocalTensor<float> M(uint32_t parity) { return Stat(M32 + 2 * tp_ + parity); }
    __aicore__ inline LocalTensor<float> L(uint32_t parity) { return Stat(L32 + 2 * tp_ + parity); }
    // mask_: the column index row (c = 0 .. n-1), rel broadcast one block a row, two bit tiles, row bits
    __aicore__ inline LocalTensor<half> ColumnRow() { return mask_.Get<half>(); }
    __aicore__ inline LocalTensor<half> RelBroadcast() { return ColumnRow()[Align16(t_->kvBlock)]; }
    __aicore__ inline LocalTensor<uint8_t> Bits(uint32_t i)
    {
        const uint32_t bytes = Align32(R_ * t_->kvBlock / 8);
        return RelBroadcast()[R_ * kC0].template ReinterpretCast<uint8_t>()[i * bytes];
    }
    __aicore__ inline LocalTensor<uint8_t> RowBits() { return Bits(2); }
    __aicore__ inline static uint32_t Align32(uint32_t v) { return (v + 31) / 32 * 32; }

    // ---------------------------------------------------------------- block j: S'_j in, P'_j out
    __aicore__ inline void Softmax(uint32_t j)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock;
        CrossCoreWaitFlag(PASA_FLAG_S_READY);
        const uint32_t slot = scoreCount_++ % PASA_SCORE_SLOTS;
        LocalTensor<float> s = scoreIn_.AllocTensor<float>();
        if (rows_ > 0) {
            if (key_ == PASA_KEY_FA_FP32) {
                GlobalTensor<float> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slots_.score + slot * t.scoreSlotBytes));
                DataCopy(s, g[rowBase_ * n], rows_ * n);
            } else {
                GlobalTensor<half> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(slots_.score + slot * t.scoreSlotBytes));
                DataCopy(s.template ReinterpretCast<half>(), g[rowBase_ * n], rows_ * n);
            }
        }
        scoreIn_.EnQue(s);
        LocalTensor<float> c = constIn_.AllocTensor<float>();
        if (key_ == PASA_KEY_PASA_EXACT && rows_ > 0) {
            GlobalTensor<float> g;
            if (j % PASA_CONST_BLOCKS == 0) ++constCount_;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slots_.rowConst + ((constCount_ - 1) % PASA_CONST_SLOTS) * t.constSlotBytes));
            DataCopyPad(c, g[(j % PASA_CONST_BLOCKS) * t.qTilePad + rowBase_], DataCopyExtParams(1, rows_ * 4, 0, 0, 0),
                        DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
        }
        constIn_.EnQue(c);
        s = scoreIn_.DeQue<float>();
        c = constIn_.DeQue<float>();
        LocalTensor<InT> p;
        Step(j, s, c, p);
        scoreIn_.FreeTensor(s);
        constIn_.FreeTensor(c);
        probOut_.EnQue(p);
        p = probOut_.template DeQue<InT>();
        if (rows_ > 0) {
            GlobalTensor<InT> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ InT*>(slots_.prob + (probCount_++ % PASA_PROB_SLOTS) * t.probSlotBytes));
            DataCopy(g[rowBase_ * n], p, rows_ * n);
        } else {
            ++probCount_;
        }
        probOut_.FreeTensor(p);
        CrossCoreSetFlag<2, PIPE_MTE3>(PASA_FLAG_P_READY);
    }

    // ---------------------------------------------------------------- O update with P'_j V_j
    __aicore__ inline void UpdateOutput(uint32_t j)
    {
        const PasaTilingData& t = *t_;
        const uint32_t dv = t.headDimV;
        CrossCoreWaitFlag(PASA_FLAG_PV_READY);
        const uint32_t slot = pvCount_++ % PASA_PV_SLOTS;
        LocalTensor<float> pv = pvIn_.AllocTensor<float>();
        if (rows_ > 0) {
            if (key_ == PASA_KEY_FA_FP32) {
                GlobalTensor<float> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slots_.pv + slot * t.pvSlotBytes));
                DataCopy(pv, g[rowBase_ * dv], rows_ * dv);
            } else {
                GlobalTensor<half> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(slots_.pv + slot * t.pvSlotBytes));
                DataCopy(pv.template ReinterpretCast<half>(), g[rowBase_ * dv], rows_ * dv);
            }
        }
        pvIn_.EnQue(pv);
        pv = pvIn_.DeQue<float>();
        Fold(j, pv);
        pvIn_.FreeTensor(pv);
    }

    const PasaTilingData* t_ = nullptr;
    const AttentionTask* task_ = nullptr;
    uint32_t key_ = 0, sub_ = 0, rowBase_ = 0, rows_ = 0, R_ = 16, tp_ = 0;
    uint32_t scoreCount_ = 0, probCount_ = 0, pvCount_ = 0, constCount_ = 0;  // slot rings, continued across tasks
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> scoreIn_, pvIn_, constIn_;
    TQue<TPosition::VECOUT, 1> probOut_;
    TBuf<TPosition::VECCALC> acc_, work_, tree_, mask_, stat_;
    GlobalTensor<OutT> out_;
    GlobalTensor<float> lse_;
    CoreSlots slots_;
    BatchTable batches_;
};

}  // namespace pasa

#include "pasa_vector_steps.h"

#endif  // PASA_ATTENTION_VECTOR_H
