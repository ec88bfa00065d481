// PASA attention forward: one MIX kernel (1 AIC : 2 AIV per AI Core), tiling key selects
// the precision allocation (DESIGN.md §2.3):
//
//   PASA_KEY_FA_FP32     S fp32 out of the cube, fp32 softmax/statistics, P cast to fp16 for
//                        P·V, P·V and the running O in fp32.
//   PASA_KEY_PASA        S' = Q K'^T rounded to fp16 by the Fixpipe; every statistic and the
//                        running O in fp16 vector arithmetic (paper Algorithm 1).
//   PASA_KEY_PASA_EXACT  S' fp16 (K' fully centred), per-row constant c = scale Q.mean16 as a
//                        thin fp32 GEMM column, fp32 per-row statistics, P' and P'V in fp16, the
//                        running O in fp32 on UB.
//
// Work split. A task is a tile of qTile query rows of one head; tasks go round robin over the
// AI Cores. Per task the AIC computes, for each visible kv block j, S'_j = Q K'_j^T (pasa-exact
// also c_j), writes it to the GM workspace and raises PASA_FLAG_S_READY; each AIV takes half of
// the rows, forms P'_j and its statistics, writes P'_j and raises PASA_FLAG_P_READY; the AIC
// computes P'_j V_j and raises PASA_FLAG_PV_READY; the AIVs fold it into O. The workspace has
// two slots of each tile and the AIC runs one block ahead (S_{j+1} before P_j V_j), so the cube
// computes the next score tile while the vector cores do the softmax of the current one.
//
// Numerics mirror fallback/torch_blockwise.py step by step; a row that sees no key of a block
// keeps its state (its statistics are restored, its O row is not touched).
#include "pasa_kernel_common.h"

using namespace AscendC;

namespace pasa {

// ============================================================================= cube side
// T: the type of Q, K, V and P' (half; bfloat16_t for fa-fp32 with bf16 inputs).
template <typename T>
class AttentionCube {
public:
    __aicore__ inline void Run(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR qLens, GM_ADDR kvLens, GM_ADDR next,
                               GM_ADDR workspace, const PasaTilingData& t)
    {
        t_ = &t;
        key_ = t.tilingKey;
        query_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        value_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        if (key_ == PASA_KEY_FA_FP32) {
            keys_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key));
        } else {
            keys_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + t.keyPrimeOffset));
        }
        keyMean_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + t.keyMeanOffset));
        const uint64_t area = t.coreAreaOffset + static_cast<uint64_t>(GetBlockIdx()) * t.coreAreaBytes;
        GM_ADDR base = workspace + area;
        scoreGm_ = base;
        probGm_ = base + 2 * t.scoreSlotBytes;
        pvGm_ = probGm_ + 2 * t.probSlotBytes;
        constGm_ = pvGm_ + 2 * t.pvSlotBytes;
        batches_.Init(qLens, kvLens, next, t.batch);

        pipe_.InitBuffer(queryL1_, 1, t.l1QueryBytes);
        pipe_.InitBuffer(keyL1_, t.l1Buffers, t.l1KeyBytes);
        pipe_.InitBuffer(probL1_, t.l1Buffers, t.l1ProbBytes);
        pipe_.InitBuffer(valueL1_, t.l1Buffers, t.l1ValueBytes);
        pipe_.InitBuffer(queryL0a_, t.l0aQueryBytes);
        pipe_.InitBuffer(probL0a_, 1, t.l0aProbBytes);
        pipe_.InitBuffer(l0b_, t.l0bBuffers, t.l0bBytes);
        pipe_.InitBuffer(l0c_, t.l0cBuffers, t.l0cBytes);
        queryFree_ = pipe_.AllocEventID<HardEvent::M_MTE1>();
        queryReady_ = pipe_.AllocEventID<HardEvent::MTE1_M>();

        AttentionTaskIter it(t, batches_, static_cast<uint32_t>(GetBlockIdx()));
        AttentionTask task;
        bool first = true;
        uint32_t slot = 0;  // ping-pong position of the next score tile
        while (it.Next(task)) {
            if (task.numBlocks == 0) continue;  // nothing visible: the vector cores write zeros
            if (!first) WaitFlag<HardEvent::M_MTE1>(queryFree_);  // the last Mmad of the previous task read Q
            first = false;
            LoadQuery(task);
            uint32_t sSlot = slot, pSlot = slot;
            ComputeScores(task, 0, sSlot);
            sSlot ^= 1;
            if (task.numBlocks > 1) {
                ComputeScores(task, 1, sSlot);
                sSlot ^= 1;
            }
            for (uint32_t j = 0; j < task.numBlocks; ++j) {
                ComputePv(task, j, pSlot);
                pSlot ^= 1;
                if (j + 2 < task.numBlocks) {
                    ComputeScores(task, j + 2, sSlot);
                    sSlot ^= 1;
                }
            }
            slot = pSlot;
            SetFlag<HardEvent::M_MTE1>(queryFree_);
        }
        if (!first) WaitFlag<HardEvent::M_MTE1>(queryFree_);
        pipe_.ReleaseEventID<HardEvent::M_MTE1>(queryFree_);
        pipe_.ReleaseEventID<HardEvent::MTE1_M>(queryReady_);
    }

private:
    __aicore__ inline uint32_t RowsPad(const AttentionTask& task) const { return Align16(task.rows); }
    __aicore__ inline uint32_t ScoreCols() const
    {
        return key_ == PASA_KEY_PASA_EXACT ? t_->kvBlock + kC0 : t_->kvBlock;  // + the mean16 column block
    }

    // Q tile (rows x D) -> L1 (NZ) -> L0A (Zz), resident for the whole task.
    __aicore__ inline void LoadQuery(const AttentionTask& task)
    {
        const PasaTilingData& t = *t_;
        const uint32_t d = t.headDim, mp = RowsPad(task);
        LocalTensor<T> q1 = queryL1_.AllocTensor<T>();
        DataCopy(q1, query_[RowOffset(t.qLayout, task.b, task.head, task.q0, t.numHeads, t.seqQ, d)],
                 Nd2NzParams(1, static_cast<uint16_t>(task.rows), static_cast<uint16_t>(d), 0,
                             static_cast<uint16_t>(RowStride(t.qLayout, t.numHeads, d)), static_cast<uint16_t>(mp), 1, 0));
        queryL1_.EnQue(q1);
        q1 = queryL1_.DeQue<T>();
        LocalTensor<T> q2 = queryL0a_.Get<T>();
        for (uint32_t mb = 0; mb < mp / kC0; ++mb) {
            LoadData(q2[mb * (d / kC0) * kFractal], q1[mb * kFractal],
                     LoadData2DParams(0, static_cast<uint8_t>(d / kC0), static_cast<uint16_t>(mp / kC0), 0, 0, false, 0));
        }
        queryL1_.FreeTensor(q1);
        SetFlag<HardEvent::MTE1_M>(queryReady_);
        WaitFlag<HardEvent::MTE1_M>(queryReady_);
    }

    // An L0C result tile (rows x cols, rows padded to mp) to a GM exchange slot, row-major:
    // fp32 as accumulated for fa-fp32, rounded to fp16 by the Fixpipe otherwise.
    __aicore__ inline void WriteTile(GM_ADDR dst, uint32_t slotBytes, const LocalTensor<float>& c, uint32_t cols,
                                     uint32_t rows, uint32_t mp)
    {
        const FixpipeParamsV220 params(static_cast<uint16_t>(cols), static_cast<uint16_t>(rows),
            static_cast<uint16_t>(mp), cols, false,
            key_ == PASA_KEY_FA_FP32 ? QuantMode_t::NoQuant : QuantMode_t::F322F16, 0, 1, 0, 0, 0);
        if (key_ == PASA_KEY_FA_FP32) {
            GlobalTensor<float> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dst), slotBytes / sizeof(float));
            Fixpipe<float, float, CFG_ROW_MAJOR>(g, c, params);
        } else {
            GlobalTensor<T> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dst), slotBytes / sizeof(T));
            Fixpipe<T, float, CFG_ROW_MAJOR>(g, c, params);
        }
    }

    // S'_j = Q K'_j^T (fa-fp32: Q K_j^T) to the score slot; pasa-exact also c_j = Q . mean16_j.
    __aicore__ inline void ComputeScores(const AttentionTask& task, uint32_t j, uint32_t slot)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, d = t.headDim, cols = ScoreCols(), mp = RowsPad(task);
        LocalTensor<T> k1 = keyL1_.AllocTensor<T>();
        if (key_ == PASA_KEY_FA_FP32) {
            // Raw keys; rows past kv_len stay stale: their scores are never read (masked).
            const uint32_t valid = Min(n, static_cast<uint32_t>(task.info.kvLen) - j * n);
            DataCopy(k1, keys_[RowOffset(t.kvLayout, task.b, task.kvHead, j * n, t.numKvHeads, t.seqKv, d)],
                     Nd2NzParams(1, static_cast<uint16_t>(valid), static_cast<uint16_t>(d), 0,
                                 static_cast<uint16_t>(RowStride(t.kvLayout, t.numKvHeads, d)), static_cast<uint16_t>(cols), 1, 0));
        } else {
            DataCopy(k1, keys_[KeyPrimeOffset(t, task.b, task.kvHead, j)],
                     Nd2NzParams(1, static_cast<uint16_t>(n), static_cast<uint16_t>(d), 0, static_cast<uint16_t>(d),
                                 static_cast<uint16_t>(cols), 1, 0));
        }
        if (key_ == PASA_KEY_PASA_EXACT) {
            // Row n holds mean16_j, rows n+1..n+15 zero: column n of the product is Q . mean16_j.
            DataCopy(k1[n * kC0], keyMean_[KeyMeanOffset(t, task.b, task.kvHead, j)],
                     Nd2NzParams(1, 1, static_cast<uint16_t>(d), 0, static_cast<uint16_t>(d), static_cast<uint16_t>(cols), 1, 0));
            Fill(k1[(n + 1) * kC0], InitConstValueParams<T>(static_cast<uint16_t>(d / kC0), kC0 - 1,
                                                              static_cast<uint16_t>(n + 1), T(0.0f)));
        }
        keyL1_.EnQue(k1);
        k1 = keyL1_.DeQue<T>();
        // K'^T as the Zn right operand: the NZ fractals of K' are already in Zn order.
        LocalTensor<T> k2 = l0b_.AllocTensor<T>();
        LoadData(k2, k1, LoadData2DParams(0, static_cast<uint8_t>((d / kC0) * (cols / kC0)), 1, 0, 0, false, 0));
        l0b_.EnQue(k2);
        keyL1_.FreeTensor(k1);
        k2 = l0b_.DeQue<T>();

        LocalTensor<float> c = l0c_.AllocTensor<float>();
        Mmad(c, queryL0a_.Get<T>(), k2,
             MmadParams(static_cast<uint16_t>(task.rows), static_cast<uint16_t>(cols), static_cast<uint16_t>(d), 0, false, true));
        l0b_.FreeTensor(k2);
        l0c_.EnQue(c);
        c = l0c_.DeQue<float>();
        WriteTile(scoreGm_ + slot * t.scoreSlotBytes, t.scoreSlotBytes, c, n, task.rows, mp);
        if (key_ == PASA_KEY_PASA_EXACT) {
            GlobalTensor<float> cst;
            cst.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(constGm_ + slot * t.constSlotBytes), t.constSlotBytes / sizeof(float));
            Fixpipe<float, float, CFG_ROW_MAJOR>(cst, c[(n / kC0) * mp * kC0], FixpipeParamsV220(kC0,
                static_cast<uint16_t>(task.rows), static_cast<uint16_t>(mp), kC0, false, QuantMode_t::NoQuant, 0, 1, 0, 0, 0));
        }
        l0c_.FreeTensor(c);
        CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_S_READY);
    }

    // P'_j V_j to the P·V slot, once both AIVs wrote P'_j.
    __aicore__ inline void ComputePv(const AttentionTask& task, uint32_t j, uint32_t slot)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, dv = t.headDimV, mp = RowsPad(task);
        const uint32_t valid = Min(n, static_cast<uint32_t>(task.info.kvLen) - j * n);

        // V_j -> L1 (NZ), rows past kv_len zeroed (their P' entries are 0, but 0 * stale could be NaN).
        LocalTensor<T> v1 = valueL1_.AllocTensor<T>();
        if (valid < n) {
            Fill(v1[valid * kC0], InitConstValueParams<T>(static_cast<uint16_t>(dv / kC0), static_cast<uint16_t>(n - valid),
                                                            static_cast<uint16_t>(valid), T(0.0f)));
        }
        DataCopy(v1, value_[RowOffset(t.kvLayout, task.b, task.kvHead, j * n, t.numKvHeads, t.seqKv, dv)],
                 Nd2NzParams(1, static_cast<uint16_t>(valid), static_cast<uint16_t>(dv), 0,
                             static_cast<uint16_t>(RowStride(t.kvLayout, t.numKvHeads, dv)), static_cast<uint16_t>(n), 1, 0));
        valueL1_.EnQue(v1);

        CrossCoreWaitFlag(PASA_FLAG_P_READY);
        LocalTensor<T> p1 = probL1_.AllocTensor<T>();
        GlobalTensor<T> prob;
        prob.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(probGm_ + slot * t.probSlotBytes), t.probSlotBytes / sizeof(T));
        DataCopy(p1, prob, Nd2NzParams(1, static_cast<uint16_t>(task.rows), static_cast<uint16_t>(n), 0,
                                       static_cast<uint16_t>(n), static_cast<uint16_t>(mp), 1, 0));
        probL1_.EnQue(p1);
        p1 = probL1_.DeQue<T>();
        LocalTensor<T> p2 = probL0a_.AllocTensor<T>();
        for (uint32_t mb = 0; mb < mp / kC0; ++mb) {
            LoadData(p2[mb * (n / kC0) * kFractal], p1[mb * kFractal],
                     LoadData2DParams(0, static_cast<uint8_t>(n / kC0), static_cast<uint16_t>(mp / kC0), 0, 0, false, 0));
        }
        probL0a_.EnQue(p2);
        probL1_.FreeTensor(p1);

        v1 = valueL1_.DeQue<T>();
        LocalTensor<T> v2 = l0b_.AllocTensor<T>();
        for (uint32_t kb = 0; kb < n / kC0; ++kb) {
            LoadData(v2[kb * (dv / kC0) * kFractal], v1[kb * kFractal],
                     LoadData2DParams(0, static_cast<uint8_t>(dv / kC0), static_cast<uint16_t>(n / kC0), 0, 0, true, 0));
        }
        l0b_.EnQue(v2);
        valueL1_.FreeTensor(v1);
        p2 = probL0a_.DeQue<T>();
        v2 = l0b_.DeQue<T>();

        LocalTensor<float> c = l0c_.AllocTensor<float>();
        Mmad(c, p2, v2, MmadParams(static_cast<uint16_t>(task.rows), static_cast<uint16_t>(dv), static_cast<uint16_t>(n), 0, false, true));
        probL0a_.FreeTensor(p2);
        l0b_.FreeTensor(v2);
        l0c_.EnQue(c);
        c = l0c_.DeQue<float>();
        WriteTile(pvGm_ + slot * t.pvSlotBytes, t.pvSlotBytes, c, dv, task.rows, mp);
        l0c_.FreeTensor(c);
        CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_PV_READY);
    }

    const PasaTilingData* t_ = nullptr;
    uint32_t key_ = 0;
    TPipe pipe_;
    TQue<TPosition::A1, 1> queryL1_;
    TQue<TPosition::B1, 2> keyL1_;
    TQue<TPosition::A1, 2> probL1_;
    TQue<TPosition::B1, 2> valueL1_;
    TBuf<TPosition::A2> queryL0a_;
    TQue<TPosition::A2, 1> probL0a_;
    TQue<TPosition::B2, 2> l0b_;
    TQue<TPosition::CO1, 2> l0c_;
    TEventID queryFree_ = 0, queryReady_ = 0;
    GlobalTensor<T> query_, keys_, value_, keyMean_;
    GM_ADDR scoreGm_ = nullptr;
    GM_ADDR probGm_ = nullptr;
    GM_ADDR pvGm_ = nullptr;
    GM_ADDR constGm_ = nullptr;
    BatchTable batches_;
};

// ============================================================================= vector side
// Per-row statistics live in UB as dense vectors (one element per row of this AIV) so that the
// online update runs as vector instructions over all rows. Statistics are double-buffered by
// block parity: block j reads set j%2 and writes set (j+1)%2; rows that see no key of block j
// copy their old values across. OutT: output type; InT: type of P' for fa-fp32 (the input type).
template <typename OutT, typename InT>
class AttentionVector {
public:
    __aicore__ inline void Run(GM_ADDR qLens, GM_ADDR kvLens, GM_ADDR next, GM_ADDR out, GM_ADDR lse, GM_ADDR workspace,
                               const PasaTilingData& t)
    {
        t_ = &t;
        key_ = t.tilingKey;
        core_ = static_cast<uint32_t>(GetBlockIdx()) / 2;
        sub_ = static_cast<uint32_t>(GetSubBlockIdx());
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ OutT*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse));
        const uint64_t area = t.coreAreaOffset + static_cast<uint64_t>(core_) * t.coreAreaBytes;
        scoreGm_ = workspace + area;
        probGm_ = scoreGm_ + 2 * t.scoreSlotBytes;
        pvGm_ = probGm_ + 2 * t.probSlotBytes;
        constGm_ = pvGm_ + 2 * t.pvSlotBytes;
        batches_.Init(qLens, kvLens, next, t.batch);

        pipe_.InitBuffer(scoreIn_, 1, t.ubScoreBytes);
        pipe_.InitBuffer(pvIn_, 1, t.ubPvBytes);
        pipe_.InitBuffer(constIn_, 1, t.vecRowsPad * kC0 * sizeof(float));
        pipe_.InitBuffer(probOut_, 1, t.ubProbBytes);
        pipe_.InitBuffer(outOut_, 1, t.ubOutBytes);
        pipe_.InitBuffer(lseOut_, 1, t.vecRowsPad * sizeof(float));
        pipe_.InitBuffer(acc_, t.ubAccBytes);
        pipe_.InitBuffer(rowBuf_, t.ubRowBytes);
        pipe_.InitBuffer(statBuf_, t.ubStatBytes);
        CarveScratch();

        AttentionTaskIter it(t, batches_, core_);
        AttentionTask task;
        uint32_t slot = 0;
        while (it.Next(task)) {
            rows_ = sub_ == 0 ? CeilDiv(task.rows, 2) : task.rows / 2;
            rowBase_ = sub_ == 0 ? 0 : CeilDiv(task.rows, 2);
            task_ = &task;
            InitState();
            uint32_t sSlot = slot, pvSlot = slot;
            for (uint32_t j = 0; j < task.numBlocks; ++j) {
                if (key_ == PASA_KEY_FA_FP32) {
                    Softmax<InT>(j, sSlot);
                } else {
                    Softmax<half>(j, sSlot);
                }
                sSlot ^= 1;
                if (j > 0) {
                    UpdateOutput(j - 1, pvSlot);
                    pvSlot ^= 1;
                }
            }
            if (task.numBlocks > 0) {
                UpdateOutput(task.numBlocks - 1, pvSlot);
                pvSlot ^= 1;
            }
            slot = pvSlot;
            Finish();
        }
    }

private:
    // ---------------------------------------------------------------- layout of the scratch UB
    __aicore__ inline LocalTensor<float> Stat(uint32_t i) { return statBuf_.Get<float>()[i * t_->vecRowsPad]; }
    __aicore__ inline LocalTensor<half> Stat16(uint32_t i) { return Stat(i).template ReinterpretCast<half>(); }

    enum StatId : uint32_t {
        M0, M1, L0, L1, F0, F1, N0, N1,  // running state, two sets (m, l, f, n)
        A0, A1, B0, B1,                  // rescale factors of O per block parity
        LOCAL_MAX, LOCAL_SUM, MEAN_SUM, MEAN16, CONST, TMP0, TMP1, TMP2, TMP3, STAT_COUNT
    };

    static_assert(STAT_COUNT <= PASA_VEC_STAT_VECTORS, "the host sizes the statistics buffer");

    __aicore__ inline void CarveScratch()
    {
        const uint32_t n = t_->kvBlock, dv = t_->headDimV;
        LocalTensor<float> r = rowBuf_.Get<float>();
        rowA32_ = r;                                   // n floats
        rowB32_ = r[n];                                // n floats
        row16_ = r[2 * n].template ReinterpretCast<half>();  // n halves (n/2 floats of room)
        rowDv32_ = r[2 * n + n / 2];                   // dv floats
        reduceTmp_ = r[2 * n + n / 2 + dv];            // 64 floats
        reduceDst_ = r[2 * n + n / 2 + dv + 64];       // 8 floats
    }

    __aicore__ inline uint32_t Visible(uint32_t r, uint32_t j) const
    {
        const int64_t row = static_cast<int64_t>(task_->q0) + rowBase_ + r;
        return VisibleInBlock(task_->info, t_->maskMode, row, static_cast<int64_t>(j) * t_->kvBlock, t_->kvBlock);
    }
    __aicore__ inline bool Seen(uint32_t r) const
    {
        return VisibleEnd(task_->info, t_->maskMode, static_cast<int64_t>(task_->q0) + rowBase_ + r) > 0;
    }

    __aicore__ inline void InitState()
    {
        const int32_t rows = static_cast<int32_t>(rows_);
        if (rows == 0) return;
        const float negInf = -__builtin_inff();
        if (key_ == PASA_KEY_PASA) {
            Duplicate(Stat16(M0), half(negInf), rows);
            Duplicate(Stat16(L0), half(0.0f), rows);
            Duplicate(Stat16(F0), half(0.0f), rows);
            Duplicate(Stat16(N0), half(0.0f), rows);
            Duplicate(acc_.Get<half>(), half(0.0f), rows * static_cast<int32_t>(t_->headDimV));
        } else {
            Duplicate(Stat(M0), negInf, rows);
            Duplicate(Stat(L0), 0.0f, rows);
            Duplicate(acc_.Get<float>(), 0.0f, rows * static_cast<int32_t>(t_->headDimV));
        }
    }

    // ---------------------------------------------------------------- block j: P'_j and the statistics
    // P: the type of P' (fp16; the input type for fa-fp32).
    template <typename P>
    __aicore__ inline void Softmax(uint32_t j, uint32_t slot)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock;
        CrossCoreWaitFlag(PASA_FLAG_S_READY);
        LocalTensor<float> s = scoreIn_.AllocTensor<float>();
        LocalTensor<float> cst = constIn_.AllocTensor<float>();
        if (rows_ > 0) {
            GM_ADDR scores = scoreGm_ + slot * t.scoreSlotBytes;
            if (key_ == PASA_KEY_FA_FP32) {
                GlobalTensor<float> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(scores), t.scoreSlotBytes / sizeof(float));
                DataCopy(s, g[rowBase_ * n], rows_ * n);
            } else {
                GlobalTensor<half> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(scores), t.scoreSlotBytes / sizeof(half));
                DataCopy(s.template ReinterpretCast<half>(), g[rowBase_ * n], rows_ * n);
            }
            if (key_ == PASA_KEY_PASA_EXACT) {
                GlobalTensor<float> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(constGm_ + slot * t.constSlotBytes), t.constSlotBytes / sizeof(float));
                DataCopy(cst, g[rowBase_ * kC0], rows_ * kC0);
            }
        }
        scoreIn_.EnQue(s);
        constIn_.EnQue(cst);
        s = scoreIn_.DeQue<float>();
        cst = constIn_.DeQue<float>();
        LocalTensor<P> p = probOut_.AllocTensor<P>();
        if (rows_ > 0) Compute(j, s, cst, p);
        scoreIn_.FreeTensor(s);
        constIn_.FreeTensor(cst);
        probOut_.EnQue(p);
        p = probOut_.template DeQue<P>();
        if (rows_ > 0) {
            GlobalTensor<P> g;
            g.SetGlobalBuffer(reinterpret_cast<__gm__ P*>(probGm_ + slot * t.probSlotBytes), t.probSlotBytes / sizeof(P));
            DataCopy(g[rowBase_ * n], p, rows_ * n);
        }
        probOut_.FreeTensor(p);
        CrossCoreSetFlag<2, PIPE_MTE3>(PASA_FLAG_P_READY);
    }

    __aicore__ inline void Compute(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& cst,
                                   const LocalTensor<half>& p)
    {
        if (key_ == PASA_KEY_FA_FP32) {
            SoftmaxFa(j, s, p);
        } else if (key_ == PASA_KEY_PASA) {
            SoftmaxPasa(j, s.template ReinterpretCast<half>(), p);
        } else {
            SoftmaxExact(j, s.template ReinterpretCast<half>(), cst, p);
        }
    }
    __aicore__ inline void Compute(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>&,
                                   const LocalTensor<bfloat16_t>& p)
    {
        SoftmaxFa(j, s, p);  // bf16 inputs run fa-fp32 only
    }

    // Row maximum of the first `count` entries, as the scalar it is used as.
    template <typename T>
    __aicore__ inline float RowMax(const LocalTensor<T>& row, uint32_t count)
    {
        LocalTensor<T> dst = reduceDst_.template ReinterpretCast<T>();
        ReduceMax(dst, row, reduceTmp_.template ReinterpretCast<T>(), static_cast<int32_t>(count));
        return static_cast<float>(dst.GetValue(0));
    }
    __aicore__ inline float RowSum(const LocalTensor<float>& row, uint32_t count)
    {
        ReduceSum(reduceDst_, row, reduceTmp_, static_cast<int32_t>(count));
        return reduceDst_.GetValue(0);
    }

    // Rows that saw no key of block j keep their previous statistics: copy ids[0..count) from
    // set j%2 to set (j+1)%2 for those rows.
    template <typename T>
    __aicore__ inline void KeepInactive(uint32_t j, const uint32_t* ids, uint32_t count)
    {
        for (uint32_t r = 0; r < rows_; ++r) {
            if (Visible(r, j) != 0) continue;
            for (uint32_t i = 0; i < count; ++i) {
                LocalTensor<T> from = Stat(ids[i] + (j % 2)).template ReinterpretCast<T>();
                LocalTensor<T> to = Stat(ids[i] + ((j + 1) % 2)).template ReinterpretCast<T>();
                to.SetValue(r, from.GetValue(r));
            }
        }
    }

    // fa-fp32: s = S * scale; m' = max(m, rowmax); a = exp(m - m'); p = exp(s - m'); l' = a l + sum p;
    // P' leaves as the input type.
    template <typename P>
    __aicore__ inline void SoftmaxFa(uint32_t j, const LocalTensor<float>& s, const LocalTensor<P>& p)
    {
        const uint32_t n = t_->kvBlock, cur = j % 2, nxt = (j + 1) % 2;
        const int32_t rows = static_cast<int32_t>(rows_);
        LocalTensor<float> localMax = Stat(LOCAL_MAX), localSum = Stat(LOCAL_SUM);
        for (uint32_t r = 0; r < rows_; ++r) {
            const uint32_t vis = Visible(r, j);
            Muls(s[r * n], s[r * n], t_->scale, static_cast<int32_t>(n));
            localMax.SetValue(r, vis > 0 ? RowMax(s[r * n], vis) : -__builtin_inff());
        }
        LocalTensor<float> mOld = Stat(M0 + cur), mNew = Stat(M0 + nxt), a = Stat(A0 + cur);
        Max(mNew, mOld, localMax, rows);
        Sub(Stat(TMP0), mOld, mNew, rows);
        Exp(a, Stat(TMP0), rows);
        for (uint32_t r = 0; r < rows_; ++r) {
            const uint32_t vis = Visible(r, j);
            Duplicate(rowA32_, 0.0f, static_cast<int32_t>(n));
            if (vis > 0) {
                Adds(rowA32_, s[r * n], -mNew.GetValue(r), static_cast<int32_t>(vis));
                Exp(rowA32_, rowA32_, static_cast<int32_t>(vis));
                localSum.SetValue(r, RowSum(rowA32_, n));
            }
            Cast(p[r * n], rowA32_, RoundMode::CAST_RINT, n);
        }
        Mul(Stat(L0 + nxt), a, Stat(L0 + cur), rows);
        Add(Stat(L0 + nxt), Stat(L0 + nxt), localSum, rows);
        const uint32_t ids[] = {M0, L0};
        KeepInactive<float>(j, ids, 2);
    }

    // pasa (fp16 statistics, Algorithm 1 re-based with the pseudo-average F).
    __aicore__ inline void SoftmaxPasa(uint32_t j, const LocalTensor<half>& s, const LocalTensor<half>& p)
    {
        const uint32_t n = t_->kvBlock, cur = j % 2, nxt = (j + 1) % 2;
        const int32_t rows = static_cast<int32_t>(rows_);
        LocalTensor<half> localMax = Stat16(LOCAL_MAX), localSum16 = Stat16(LOCAL_SUM);
        LocalTensor<float> meanSum = Stat(MEAN_SUM), localSum = Stat(CONST);
        for (uint32_t r = 0; r < rows_; ++r) {
            // the mean runs over all n columns the shifting matrix averaged, masked or not
            Cast(rowA32_, s[r * n], RoundMode::CAST_NONE, n);
            meanSum.SetValue(r, RowSum(rowA32_, n));
            const uint32_t vis = Visible(r, j);
            Duplicate(p[r * n], half(0.0f), static_cast<int32_t>(n));
            if (vis == 0) continue;
            const half m = static_cast<half>(RowMax(s[r * n], vis));
            localMax.SetValue(r, m);
            Adds(row16_, s[r * n], static_cast<half>(-static_cast<float>(m)), static_cast<int32_t>(vis));
            Exp(p[r * n], row16_, static_cast<int32_t>(vis));
            Cast(rowA32_, p[r * n], RoundMode::CAST_NONE, n);
            localSum.SetValue(r, RowSum(rowA32_, n));
        }
        const half gamma = static_cast<half>(t_->gamma);
        LocalTensor<half> mean = Stat16(MEAN16), t0 = Stat16(TMP0), t1 = Stat16(TMP1), x = Stat16(TMP2), y = Stat16(TMP3);
        LocalTensor<half> mOld = Stat16(M0 + cur), mNew = Stat16(M0 + nxt), lOld = Stat16(L0 + cur), lNew = Stat16(L0 + nxt);
        LocalTensor<half> fOld = Stat16(F0 + cur), fNew = Stat16(F0 + nxt), nOld = Stat16(N0 + cur), nNew = Stat16(N0 + nxt);
        LocalTensor<half> a = Stat16(A0 + cur), b = Stat16(B0 + cur);
        Muls(meanSum, meanSum, t_->invKvBlock, rows);                 // mean = sum / n (exact scaling)
        Cast(mean, meanSum, RoundMode::CAST_RINT, rows);              // fp16 block mean (in place of meanSum)
        Cast(localSum16, localSum, RoundMode::CAST_RINT, rows);       // l' = fp16(sum p)
        Adds(nNew, nOld, half(1.0f), rows);                           // blocks used
        Mul(t0, nOld, fOld, rows);                                    // (n - 1) F
        Add(t0, t0, mean, rows);
        Div(fNew, t0, nNew, rows);                                    // F_j
        Sub(t0, fOld, fNew, rows);
        Muls(t0, t0, gamma, rows);
        Add(x, mOld, t0, rows);                                       // m + gamma (F_{j-1} - F_j)
        Sub(t1, mean, fNew, rows);
        Muls(t1, t1, gamma, rows);
        Add(y, localMax, t1, rows);                                   // m' + gamma (mean - F_j)
        Max(mNew, x, y, rows);
        Sub(t0, x, mNew, rows);
        Exp(a, t0, rows);
        Sub(t1, y, mNew, rows);
        Exp(b, t1, rows);
        Mul(t0, a, lOld, rows);
        Mul(t1, b, localSum16, rows);
        Add(lNew, t0, t1, rows);
        const uint32_t ids[] = {M0, L0, F0, N0};
        KeepInactive<half>(j, ids, 4);
    }

    // pasa-exact: m' = max(m, rowmax S' + c); a = exp(m - m'); p = fp16(exp(S' - (m' - c))), argument fp32.
    __aicore__ inline void SoftmaxExact(uint32_t j, const LocalTensor<half>& s, const LocalTensor<float>& cst,
                                        const LocalTensor<half>& p)
    {
        const uint32_t n = t_->kvBlock, cur = j % 2, nxt = (j + 1) % 2;
        const int32_t rows = static_cast<int32_t>(rows_);
        LocalTensor<float> localMax = Stat(LOCAL_MAX), localSum = Stat(LOCAL_SUM), c = Stat(CONST);
        for (uint32_t r = 0; r < rows_; ++r) {
            c.SetValue(r, cst.GetValue(r * kC0));
            const uint32_t vis = Visible(r, j);
            localMax.SetValue(r, vis > 0 ? RowMax(s[r * n], vis) : -__builtin_inff());
        }
        Muls(c, c, t_->scale, rows);                                  // c = scale * (Q . mean16)
        LocalTensor<float> mOld = Stat(M0 + cur), mNew = Stat(M0 + nxt), a = Stat(A0 + cur), shift = Stat(TMP1);
        Add(Stat(TMP0), localMax, c, rows);
        Max(mNew, mOld, Stat(TMP0), rows);
        Sub(Stat(TMP0), mOld, mNew, rows);
        Exp(a, Stat(TMP0), rows);
        Sub(shift, mNew, c, rows);                                    // m' - c
        for (uint32_t r = 0; r < rows_; ++r) {
            const uint32_t vis = Visible(r, j);
            Duplicate(p[r * n], half(0.0f), static_cast<int32_t>(n));
            if (vis == 0) continue;
            Cast(rowA32_, s[r * n], RoundMode::CAST_NONE, vis);
            Adds(rowA32_, rowA32_, -shift.GetValue(r), static_cast<int32_t>(vis));
            Exp(rowA32_, rowA32_, static_cast<int32_t>(vis));                // fp32 argument
            Cast(p[r * n], rowA32_, RoundMode::CAST_RINT, vis);              // fp16 P
            Cast(rowB32_, p[r * n], RoundMode::CAST_NONE, n);
            localSum.SetValue(r, RowSum(rowB32_, n));
        }
        Mul(Stat(L0 + nxt), a, Stat(L0 + cur), rows);
        Add(Stat(L0 + nxt), Stat(L0 + nxt), localSum, rows);
        const uint32_t ids[] = {M0, L0};
        KeepInactive<float>(j, ids, 2);
    }

    // ---------------------------------------------------------------- O = a O + b (P'V), rows active in block j
    __aicore__ inline void UpdateOutput(uint32_t j, uint32_t slot)
    {
        const PasaTilingData& t = *t_;
        const uint32_t dv = t.headDimV, par = j % 2;
        CrossCoreWaitFlag(PASA_FLAG_PV_READY);
        LocalTensor<float> pv = pvIn_.AllocTensor<float>();
        if (rows_ > 0) {
            GM_ADDR src = pvGm_ + slot * t.pvSlotBytes;
            if (key_ == PASA_KEY_FA_FP32) {
                GlobalTensor<float> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(src), t.pvSlotBytes / sizeof(float));
                DataCopy(pv, g[rowBase_ * dv], rows_ * dv);
            } else {
                GlobalTensor<half> g;
                g.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(src), t.pvSlotBytes / sizeof(half));
                DataCopy(pv.template ReinterpretCast<half>(), g[rowBase_ * dv], rows_ * dv);
            }
        }
        pvIn_.EnQue(pv);
        pv = pvIn_.DeQue<float>();
        for (uint32_t r = 0; r < rows_; ++r) {
            if (Visible(r, j) == 0) continue;
            if (key_ == PASA_KEY_PASA) {
                LocalTensor<half> o = acc_.Get<half>()[r * dv];
                LocalTensor<half> x = pv.template ReinterpretCast<half>()[r * dv];
                Muls(o, o, Stat16(A0 + par).GetValue(r), static_cast<int32_t>(dv));
                Muls(x, x, Stat16(B0 + par).GetValue(r), static_cast<int32_t>(dv));
                Add(o, o, x, static_cast<int32_t>(dv));
            } else {
                LocalTensor<float> o = acc_.Get<float>()[r * dv];
                LocalTensor<float> x = pv[r * dv];
                if (key_ == PASA_KEY_PASA_EXACT) {
                    Cast(rowDv32_, pv.template ReinterpretCast<half>()[r * dv], RoundMode::CAST_NONE, dv);
                    x = rowDv32_;
                }
                Muls(o, o, Stat(A0 + par).GetValue(r), static_cast<int32_t>(dv));
                Add(o, o, x, static_cast<int32_t>(dv));
            }
        }
        pvIn_.FreeTensor(pv);
    }

    // ---------------------------------------------------------------- O / l and LSE to GM
    __aicore__ inline void Finish()
    {
        const PasaTilingData& t = *t_;
        const uint32_t dv = t.headDimV, st = (task_->numBlocks) % 2;  // the set holding the final state
        const int32_t rows = static_cast<int32_t>(rows_);
        if (rows == 0) return;
        LocalTensor<float> m = Stat(TMP0), l = Stat(TMP1), lse = lseOut_.AllocTensor<float>();
        if (key_ == PASA_KEY_PASA) {
            // true running maximum = m + gamma F, in fp32
            Cast(m, Stat16(M0 + st), RoundMode::CAST_NONE, rows_);
            Cast(Stat(TMP2), Stat16(F0 + st), RoundMode::CAST_NONE, rows_);
            Muls(Stat(TMP2), Stat(TMP2), t.gamma, rows);
            Add(m, m, Stat(TMP2), rows);
            Cast(l, Stat16(L0 + st), RoundMode::CAST_NONE, rows_);
        } else {
            Muls(m, Stat(M0 + st), 1.0f, rows);
            Muls(l, Stat(L0 + st), 1.0f, rows);
        }
        Ln(Stat(TMP3), l, rows);
        Add(lse, m, Stat(TMP3), rows);
        LocalTensor<OutT> o = outOut_.AllocTensor<OutT>();
        for (uint32_t r = 0; r < rows_; ++r) {
            if (!Seen(r)) {
                Duplicate(rowDv32_, 0.0f, static_cast<int32_t>(dv));
                lse.SetValue(r, -__builtin_inff());
            } else {
                if (key_ == PASA_KEY_PASA) {
                    Cast(rowDv32_, acc_.Get<half>()[r * dv], RoundMode::CAST_NONE, dv);
                } else {
                    Muls(rowDv32_, acc_.Get<float>()[r * dv], 1.0f, static_cast<int32_t>(dv));
                }
                Duplicate(rowA32_, l.GetValue(r), static_cast<int32_t>(dv));
                Div(rowDv32_, rowDv32_, rowA32_, static_cast<int32_t>(dv));
            }
            Cast(o[r * dv], rowDv32_, RoundMode::CAST_RINT, dv);
        }
        outOut_.EnQue(o);
        lseOut_.EnQue(lse);
        o = outOut_.DeQue<OutT>();
        lse = lseOut_.DeQue<float>();
        const uint32_t row0 = task_->q0 + rowBase_;
        const uint32_t stride = RowStride(t.outLayout, t.numHeads, dv);
        DataCopy(out_[RowOffset(t.outLayout, task_->b, task_->head, row0, t.numHeads, t.seqQ, dv)], o,
                 DataCopyParams(static_cast<uint16_t>(rows_), static_cast<uint16_t>(dv * sizeof(OutT) / 32), 0,
                                static_cast<uint16_t>((stride - dv) * sizeof(OutT) / 32)));
        const uint64_t lseRow = (static_cast<uint64_t>(task_->b) * t.numHeads + task_->head) * t.seqQ + row0;
        DataCopyPad(lse_[lseRow], lse, DataCopyExtParams(1, rows_ * sizeof(float), 0, 0, 0));
        outOut_.FreeTensor(o);
        lseOut_.FreeTensor(lse);
    }

    const PasaTilingData* t_ = nullptr;
    uint32_t key_ = 0, core_ = 0, sub_ = 0, rows_ = 0, rowBase_ = 0;
    const AttentionTask* task_ = nullptr;
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> scoreIn_, pvIn_, constIn_;
    TQue<TPosition::VECOUT, 1> probOut_, outOut_, lseOut_;
    TBuf<TPosition::VECCALC> acc_, rowBuf_, statBuf_;
    LocalTensor<float> rowA32_, rowB32_, rowDv32_, reduceTmp_, reduceDst_;
    LocalTensor<half> row16_;
    GlobalTensor<OutT> out_;
    GlobalTensor<float> lse_;
    GM_ADDR scoreGm_ = nullptr;
    GM_ADDR probGm_ = nullptr;
    GM_ADDR pvGm_ = nullptr;
    GM_ADDR constGm_ = nullptr;
    BatchTable batches_;
};

}  // namespace pasa

extern "C" __global__ __aicore__ void pasa_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR qLens,
                                                     GM_ADDR kvLens, GM_ADDR next, GM_ADDR out, GM_ADDR lse,
                                                     GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    PasaTilingData t;
    pasa::LoadTiling(tiling, t);
    if ASCEND_IS_AIC {
        if (t.inDtype == PASA_IN_BF16) {
            pasa::AttentionCube<bfloat16_t> op;
            op.Run(query, key, value, qLens, kvLens, next, workspace, t);
        } else {
            pasa::AttentionCube<half> op;
            op.Run(query, key, value, qLens, kvLens, next, workspace, t);
        }
    }
    if ASCEND_IS_AIV {
        if (t.inDtype == PASA_IN_BF16) {
            pasa::AttentionVector<bfloat16_t, bfloat16_t> op;
            op.Run(qLens, kvLens, next, out, lse, workspace, t);
        } else if (t.outDtype == PASA_OUT_BF16) {
            pasa::AttentionVector<bfloat16_t, half> op;
            op.Run(qLens, kvLens, next, out, lse, workspace, t);
        } else {
            pasa::AttentionVector<half, half> op;
            op.Run(qLens, kvLens, next, out, lse, workspace, t);
        }
    }
}
