// The merge of split kv (kernel pasa_merge_splits, vector cores only): each attention task's
// kvSplits partial results (O / l and LSE per row, fp32, pasa_attention_vector.h) combine by their
// log-sum-exp in fp32, LSE = m + log sum_s exp(LSE_s - m) with m = max_s LSE_s, O = sum_s
// exp(LSE_s - LSE) O_s, and go to the output and LSE as the attention kernel writes them. A unit
// of work is one half of a task's rows (the rows an AIV of the attention kernel owns); units go
// round robin over the vector cores.
//
// Learnable sinks (tiling.hasSink): the splits' partials leave the sink out; it joins here, once
// per row, as one more term with LSE_sink = sink[head] and a zero output: m = max(max_s LSE_s,
// sink), LSE = m + log(sum_s exp(LSE_s - m) + exp(sink - m)). A row that no split saw ignores it.
//
// Row flags (tiling.overflowCheck): a merged row whose output or LSE is not finite is flagged. This also
// carries the attention kernel's resolution check: a split in which a row lost resolution wrote
// that row's partial LSE as NaN (AttentionVector::Finish), which makes the merged LSE and O NaN.
#ifndef PASA_MERGE_H
#define PASA_MERGE_H

#include "pasa_store.h"
#include "pasa_vector_ops.h"

namespace pasa {

template <typename OutT>
class MergeSplits {
public:
    __aicore__ inline void Run(GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags, GM_ADDR workspace,
                               GM_ADDR tiling, const PasaTilingData& t)
    {
        t_ = &t;
        R_ = t.vecRowsPad;
        workspace_ = workspace;
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ OutT*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse));
        if (t.hasSink) sink_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(sink), t.numHeads);
        batches_.Init(tiling, t);
        const uint32_t dv = t.headDimV;
        pipe_.InitBuffer(partIn_, 2, R_ * dv * sizeof(float));
        pipe_.InitBuffer(lseIn_, 1, t.kvSplits * R_ * sizeof(float));
        pipe_.InitBuffer(acc_, R_ * dv * sizeof(float));
        pipe_.InitBuffer(tree_, 32 * R_ + R_ * dv * sizeof(OutT));
        pipe_.InitBuffer(stat_, kSlots * R_ * sizeof(float));
        Duplicate(Stat(ZERO), 0.0f, static_cast<int32_t>(R_));
        flags_.on = t.overflowCheck != 0;
        if (flags_.on) {
            flags_.out.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(rowFlags));
            flags_.tasks.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(workspace + t.taskFlagsOffset));
            flags_.task = Stat(TASK).template ReinterpretCast<uint8_t>();
            flags_.bytes = Stat(BYTES).template ReinterpretCast<uint8_t>();
            flags_.aligned = Stat(ABYTES).template ReinterpretCast<uint8_t>();
            Duplicate(Stat(ONES).template ReinterpretCast<half>(), half(1.0f), static_cast<int32_t>(R_));
        }

        const uint32_t core = static_cast<uint32_t>(GetBlockIdx());
        AttentionTaskIter it(t, batches_, 0, 1, 1);  // every task, in the attention kernel's order
        AttentionTask task;
        uint32_t unit = 0;
        while (it.Next(task)) {
            for (uint32_t half = 0; half < 2; ++half, ++unit) {
                if (unit % t.mergeDim != core) continue;
                uint32_t rowBase = 0;
                const uint32_t rows = AivRows(t, task.rows, half, rowBase);
                if (rows > 0) Merge(task, rowBase, rows);
            }
        }
    }

private:
    enum Slot : uint32_t { MAX = 0, TOTAL, WEIGHT, T0, LSE, FIN, ZERO, CHECK, LCHECK, BITS, FLAG16, ONES, BYTES, ABYTES,
                           TASK, MAXTMP, SINK, JOINED, kSlots };
    static_assert(kSlots <= PASA_MERGE_STAT_UNITS, "the host sizes the merge's statistics");
    __aicore__ inline LocalTensor<float> Stat(uint32_t slot) { return stat_.Get<float>()[slot * R_]; }

    __aicore__ inline void Merge(const AttentionTask& task, uint32_t rowBase, uint32_t rows)
    {
        const PasaTilingData& t = *t_;
        const uint32_t dv = t.headDimV, cells = R_ * dv, splits = t.kvSplits;
        const int32_t r = static_cast<int32_t>(R_);
        const uint64_t first = static_cast<uint64_t>(task.index) * splits;
        LocalTensor<float> parts = lseIn_.AllocTensor<float>();
        for (uint32_t s = 0; s < splits; ++s) {
            GlobalTensor<float> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(PartialLse(workspace_, t, first + s)));
            DataCopyPad(parts[s * R_], g[PartialLseRow(t, rowBase)], DataCopyExtParams(1, rows * sizeof(float), 0, 0, 0),
                        DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
        }
        lseIn_.EnQue(parts);
        parts = lseIn_.DeQue<float>();
        Adds(Stat(MAX), parts, 0.0f, r);
        for (uint32_t s = 1; s < splits; ++s) Max(Stat(MAX), Stat(MAX), parts[s * R_], r);
        LocalTensor<float> ref = Stat(MAX);  // the reference of the weights: max_s LSE_s, with a sink max(that, sink)
        if (t.hasSink) {
            RowSinks(sink_, task, rowBase, R_, Stat(SINK));
            Max(Stat(JOINED), Stat(MAX), Stat(SINK), r);
            ref = Stat(JOINED);
        }
        LocalTensor<float> o = acc_.Get<float>(), brc = tree_.Get<float>();
        for (uint32_t s = 0; s < splits; ++s) {
            LocalTensor<float> part = partIn_.AllocTensor<float>();
            GlobalTensor<float> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(PartialOut(workspace_, t, first + s)));
            DataCopy(part, g[static_cast<uint64_t>(rowBase) * dv], rows * dv);
            partIn_.EnQue(part);
            Sub(Stat(WEIGHT), parts[s * R_], ref, r);
            Exp(Stat(WEIGHT), Stat(WEIGHT), r);                                      // exp(LSE_s - m)
            if (s == 0) {
                Adds(Stat(TOTAL), Stat(WEIGHT), 0.0f, r);
            } else {
                Add(Stat(TOTAL), Stat(TOTAL), Stat(WEIGHT), r);
            }
            BroadcastRows(brc, Stat(WEIGHT), R_);
            part = partIn_.DeQue<float>();
            RowBroadcast<VecOp::MUL>(s == 0 ? o : part, part, brc, R_, dv);
            if (s > 0) Add(o, o, part, static_cast<int32_t>(cells));
            partIn_.FreeTensor(part);
        }
        lseIn_.FreeTensor(parts);
        if (t.hasSink) {  // the sink's term: exp(sink - m), its output 0
            Sub(Stat(SINK), Stat(SINK), ref, r);
            Exp(Stat(SINK), Stat(SINK), r);
            Add(Stat(TOTAL), Stat(TOTAL), Stat(SINK), r);
        }
        // rows no split saw (every LSE_s the -3e38 sentinel): 0 and -inf, the sink ignored
        Replicate8(brc, Stat(MAX), Stat(ZERO), R_);
        LocalTensor<uint8_t> seen = tree_.Get<uint8_t>()[32 * R_];
        Compares(seen, brc, -1.0e38f, CMPMODE::GT, 8 * R_);
        Ln(Stat(T0), Stat(TOTAL), r);
        Add(Stat(LSE), ref, Stat(T0), r);
        if (flags_.on) Sub(Stat(LCHECK), Stat(LSE), Stat(LSE), r);  // NaN where the LSE is not finite
        Select(Stat(LSE), seen, Stat(LSE), -__builtin_inff(), SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
        BroadcastRows(brc, Stat(TOTAL), R_);
        RowBroadcast<VecOp::DIV>(o, o, brc, R_, dv);
        LocalTensor<OutT> out = tree_.Get<OutT>()[32 * R_ / sizeof(OutT)];
        Cast(out, o, RoundMode::CAST_RINT, cells);
        if (flags_.on) FlagRows(o, rows);
        StoreRows(t, task, rowBase, rows, out_, lse_, out, Stat(LSE), Stat(FIN), flags_);
        StoreTaskFlag(t, task, rowBase, flags_);
    }

    // flags_.bytes = 1 for the rows whose merged output o (fp32, overwritten) or LSE is not finite,
    // else 0, flags_.task their maximum over the `rows` stored (as AttentionVector::FlagRows).
    __aicore__ inline void FlagRows(const LocalTensor<float>& o, uint32_t rows)
    {
        const int32_t r = static_cast<int32_t>(R_);
        RowNonFinite(Stat(CHECK), o, R_, t_->headDimV);
        Add(Stat(CHECK), Stat(CHECK), Stat(LCHECK), r);
        LocalTensor<float> copies = tree_.Get<float>();  // the broadcast blocks' 32 bytes a row
        Replicate8(copies, Stat(CHECK), Stat(ZERO), R_);
        LocalTensor<uint8_t> bits = Stat(BITS).template ReinterpretCast<uint8_t>();
        Compares(bits, copies, 0.0f, CMPMODE::NE, 8 * R_);
        LocalTensor<half> flag16 = Stat(FLAG16).template ReinterpretCast<half>();
        Select(flag16, bits, Stat(ONES).template ReinterpretCast<half>(), half(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
        LocalTensor<half> max16 = Stat(CHECK).template ReinterpretCast<half>();
        Duplicate(max16, half(0.0f), 32);
        ReduceMax(max16, flag16, Stat(MAXTMP).template ReinterpretCast<half>(), static_cast<int32_t>(rows));
        Cast(flags_.task, max16, RoundMode::CAST_NONE, 32);
        Cast(flags_.bytes, flag16, RoundMode::CAST_NONE, R_);
    }

    const PasaTilingData* t_ = nullptr;
    uint32_t R_ = 16;
    GM_ADDR workspace_ = nullptr;
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> partIn_, lseIn_;
    TBuf<TPosition::VECCALC> acc_, tree_, stat_;
    GlobalTensor<OutT> out_;
    GlobalTensor<float> lse_;
    GlobalTensor<float> sink_;
    BatchTable batches_;
    RowFlags flags_;
};

}  // namespace pasa

#endif  // PASA_MERGE_H
