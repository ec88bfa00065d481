// The per-block steps of AttentionVector (pasa_attention_vector.h): masks, P'_j and the block's
// statistics for each allocation, the delayed O update, and the end of a task. Every step
// mirrors fallback/torch_blockwise.py (the reference of docs/design.md, "Precision
// allocations"); a comment names each rounding where it is not the obvious one.
#ifndef PASA_VECTOR_STEPS_H
#define PASA_VECTOR_STEPS_H

namespace pasa {

// Once per kernel: the column index row c = 0 .. n-1 and rel(r), the query position of the AIV's
// row r within its tile for a causal mask and 0 otherwise, broadcast one block a row; REL8 = rel
// repeated 8 times (row bits for 8 statistics at once); ONEZERO = [1 | 0].
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::BuildMaskRows()
{
    const PasaTilingData& t = *t_;
    const uint32_t n = t.kvBlock;
    LocalTensor<half> col = ColumnRow(), rel8 = Stat16(REL8);
    for (uint32_t c = 0; c < n; ++c) col.SetValue(c, half(static_cast<float>(c)));
    for (uint32_t r = 0; r < R_; ++r) {
        const uint32_t rel = t.maskMode == PASA_MASK_CAUSAL ? (rowBase_ + r) % t.tilePositions : 0;
        rel8.SetValue(r, half(static_cast<float>(rel)));
    }
    LocalTensor<half> zero = Stat16(T0);
    Duplicate(zero, half(0.0f), static_cast<int32_t>(R_));
    const uint8_t step = static_cast<uint8_t>(R_ / kC0);
    Add(rel8[R_], rel8, zero, R_, 7, BinaryRepeatParams(1, 1, 1, step, 0, 0));
    BroadcastRows(RelBroadcast(), rel8, R_);
    Duplicate(Stat16(ONEZERO), half(1.0f), static_cast<int32_t>(R_));
    Duplicate(Stat16(ONEZERO)[R_], half(0.0f), static_cast<int32_t>(R_));
}

template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::InitState()
{
    const int32_t r = static_cast<int32_t>(R_);
    if (key_ == PASA_KEY_PASA) {
        Duplicate(PasaSet(0, 0), half(0.0f), static_cast<int32_t>(P_COUNT) * r);  // l, F, n = 0
        Duplicate(PasaSet(0, P_M), half(kFp16Lowest), r);
    } else {
        Duplicate(M(0), kInitialMax, r);
        Duplicate(L(0), 0.0f, r);
    }
}

// Bits(0) = the visible keys of block j (bit set: visible), when the block is not visible in full
// to every row: the causal bound c - rel <= q0 + next - j n and the kv length c <= kvLen - 1 - j n,
// each one Compares of a tile built in the reduction scratch (c - rel, or c). rowsWithoutKeys:
// some rows see no key of the block (causal, q0 + next - j n < 0).
template <typename OutT, typename InT>
__aicore__ inline bool AttentionVector<OutT, InT>::MaskBlock(uint32_t j, bool& rowsWithoutKeys, int64_t& delta)
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    rowsWithoutKeys = false;
    if (j >= task.numBlocks || j < task.fullBlocks) return false;
    const uint32_t n = t.kvBlock, cells = R_ * n;
    const int64_t start = static_cast<int64_t>(j) * n;
    const bool causal = t.maskMode == PASA_MASK_CAUSAL;
    const bool ragged = task.info.kvLen < start + n;
    delta = Max64(-1024, Min64(1024, static_cast<int64_t>(task.q0) + task.info.next - start));
    LocalTensor<half> tile = tree_.Get<half>();
    if (causal) {
        RowBroadcast<VecOp::SUB>(tile, ColumnRow(), RelBroadcast(), R_, n, 0, 0, false);  // c - rel
        Compares(Bits(0), tile, half(static_cast<float>(delta)), CMPMODE::LE, cells);
    }
    if (ragged) {
        const half kappa(static_cast<float>(task.info.kvLen - 1 - start));
        const LocalTensor<half> zeros = Stat16(ONEZERO)[R_];  // a block of zeros, read by every repeat
        for (uint32_t c = 0; c < n; c += 128) {                                                // c
            Add(tile[c], ColumnRow()[c], zeros, n - c < 128 ? n - c : 128, static_cast<uint8_t>(R_),
                BinaryRepeatParams(1, 1, 0, static_cast<uint8_t>(n / kC0), 0, 0));
        }
        Compares(Bits(causal ? 1 : 0), tile, kappa, CMPMODE::LE, cells);
        if (causal) {
            And(Bits(0).template ReinterpretCast<uint16_t>(), Bits(0).template ReinterpretCast<uint16_t>(),
                Bits(1).template ReinterpretCast<uint16_t>(), static_cast<int32_t>(cells / 16));
        }
    }
    rowsWithoutKeys = causal && delta < 0;
    return true;
}

template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Step(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>& c,
                                                        LocalTensor<half>& p)
{
    if (key_ == PASA_KEY_PASA) {
        StepPasa(j, s.template ReinterpretCast<half>(), p);
    } else if (key_ == PASA_KEY_PASA_EXACT) {
        StepExact(j, s.template ReinterpretCast<half>(), c, p);
    } else {
        StepFa(j, s, p);
    }
}

template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Step(uint32_t j, const LocalTensor<float>& s, const LocalTensor<float>&,
                                                        LocalTensor<bfloat16_t>& p)
{
    StepFa(j, s, p);  // bf16 inputs run fa-fp32 only
}

// fa-fp32: s = S scale; m' = max(m, rowmax s); a = exp(m - m'); p = exp(s - m'); l' = a l + sum p
// (fp32); P' leaves in the input type (rounded once).
template <typename OutT, typename InT>
template <typename P>
__aicore__ inline void AttentionVector<OutT, InT>::StepFa(uint32_t j, const LocalTensor<float>& s, LocalTensor<P>& p)
{
    const uint32_t n = t_->kvBlock, cells = R_ * n, cur = j % 2, nxt = (j + 1) % 2;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> tree = tree_.Get<float>(), a = Stat(RING + j % (PASA_PV_DELAY + 1));
    LocalTensor<float> mOld = M(cur), mNew = M(nxt), lOld = L(cur), lNew = L(nxt);
    Muls(s, s, t_->scale, static_cast<int32_t>(cells));
    bool noKeys = false;
    int64_t delta = 0;
    if (MaskBlock(j, noKeys, delta)) Select(s, Bits(0), s, kMaskedScore, SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(Stat(ROWMAX), s, tree, R_, n);
    Max(mNew, mOld, Stat(ROWMAX), r);
    Sub(Stat(T0), mOld, mNew, r);
    Exp(a, Stat(T0), r);
    BroadcastRows(tree, mNew, R_);
    RowBroadcast<VecOp::SUB>(s, s, tree, R_, n);
    Exp(s, s, static_cast<int32_t>(cells));
    p = probOut_.template AllocTensor<P>();
    Cast(p, s, RoundMode::CAST_RINT, cells);
    RowReduce<ReduceType::SUM>(Stat(ROWSUM), s, tree, R_, n);
    Mul(lNew, a, lOld, r);
    Add(lNew, lNew, Stat(ROWSUM), r);
}

// pasa (fp16 statistics, Algorithm 1 re-based with the pseudo-average F): each line below is
// one rounding of fallback/torch_blockwise.py's _step_pseudo_average.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StepPasa(uint32_t j, const LocalTensor<half>& s, LocalTensor<half>& p)
{
    const PasaTilingData& t = *t_;
    const uint32_t n = t.kvBlock, cells = R_ * n;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> x = work_.Get<float>(), tree = tree_.Get<float>();
    LocalTensor<half> tree16 = tree_.Get<half>(), t2 = Stat16(T2), t3 = Stat16(T3);
    LocalTensor<half> cur = PasaSet(j % 2, 0), nxt = PasaSet((j + 1) % 2, 0);
    LocalTensor<half> ab = Stat16(RING + j % (PASA_PV_DELAY + 1));
    // the mean runs over all n columns the shifting matrix averaged, masked or not
    Cast(x, s, RoundMode::CAST_NONE, cells);
    RowReduce<ReduceType::SUM>(Stat(ROWSUM), x, tree, R_, n);
    bool noKeys = false;
    int64_t delta = 0;
    const bool masked = MaskBlock(j, noKeys, delta);
    if (masked) Select(s, Bits(0), s, half(kFp16Lowest), SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(cur[P_MLOC * R_], s, tree16, R_, n);           // m' (local maximum)
    BroadcastRows(tree16, cur[P_MLOC * R_], R_);
    RowBroadcast<VecOp::SUB>(s, s, tree16, R_, n);                            // fp16(s - m')
    p = probOut_.template AllocTensor<half>();
    Exp(p, s, static_cast<int32_t>(cells));                                   // fp16(exp(.))
    if (masked) Select(p, Bits(0), p, half(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    Cast(x, p, RoundMode::CAST_NONE, cells);
    RowReduce<ReduceType::SUM>(Stat(T1), x, tree, R_, n);
    Cast(cur[P_LLOC * R_], Stat(T1), RoundMode::CAST_RINT, R_);              // l' = fp16(sum p)
    Muls(Stat(ROWSUM), Stat(ROWSUM), t.invKvBlock, r);                        // sum / n, exact
    Cast(cur[P_MEAN * R_], Stat(ROWSUM), RoundMode::CAST_RINT, R_);          // fp16 block mean
    Adds(nxt[P_N * R_], cur[P_N * R_], half(1.0f), r);                        // n + 1
    Mul(t2, cur[P_N * R_], cur[P_F * R_], r);                                 // (n - 1) F
    Add(t2, t2, cur[P_MEAN * R_], r);
    Div(nxt[P_F * R_], t2, nxt[P_N * R_], r);                                 // F_j
    PairOp<VecOp::SUB>(t2, cur[P_F * R_], nxt[P_F * R_], R_);                 // [F - F_j | mean - F_j]
    Muls(t2, t2, half(t.gamma), 2 * r);
    Add(t3, cur[P_M * R_], t2, 2 * r);                                        // [x | y]
    Max(nxt[P_M * R_], t3, t3[R_], r);                                        // m_j = max(x, y)
    PairOp<VecOp::SUB>(t2, t3, nxt[P_M * R_], R_);
    Exp(ab, t2, 2 * r);                                                       // [a | b]
    Mul(t2, ab, cur[P_L * R_], 2 * r);                                        // [a l | b l']
    Add(nxt[P_L * R_], t2, t2[R_], r);
    if (noKeys) {  // rows that see no key of block j keep m, l, F, n; their O keeps too (a = 1, b = 0)
        Compares(RowBits(), Stat16(REL8), half(static_cast<float>(-delta)), CMPMODE::GE, P_COUNT * R_);
        Select(nxt, RowBits(), nxt, cur, SELMODE::VSEL_TENSOR_TENSOR_MODE, P_COUNT * R_);
        Select(ab, RowBits(), ab, Stat16(ONEZERO), SELMODE::VSEL_TENSOR_TENSOR_MODE, 2 * R_);
    }
}

// pasa-exact: m' = max(m, rowmax S' + c); a = exp(m - m'); p = fp16(exp(S' - (m' - c))) with an
// fp32 argument; l' = a l + sum p (fp32, of the rounded p).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StepExact(uint32_t j, const LocalTensor<half>& s,
                                                             const LocalTensor<float>& c, LocalTensor<half>& p)
{
    const uint32_t n = t_->kvBlock, cells = R_ * n, cur = j % 2, nxt = (j + 1) % 2;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> x = work_.Get<float>(), tree = tree_.Get<float>(), a = Stat(RING + j % (PASA_PV_DELAY + 1));
    LocalTensor<float> mOld = M(cur), mNew = M(nxt), lOld = L(cur), lNew = L(nxt);
    Cast(x, s, RoundMode::CAST_NONE, cells);
    bool noKeys = false;
    int64_t delta = 0;
    if (MaskBlock(j, noKeys, delta)) Select(x, Bits(0), x, kMaskedScore, SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(Stat(ROWMAX), x, tree, R_, n);
    Muls(Stat(CONST), c, t_->scale, r);                                       // c = scale (Q . mean16)
    Add(Stat(T0), Stat(ROWMAX), Stat(CONST), r);
    Max(mNew, mOld, Stat(T0), r);
    Sub(Stat(T0), mOld, mNew, r);
    Exp(a, Stat(T0), r);
    Sub(Stat(SHIFT), mNew, Stat(CONST), r);                                   // m' - c
    BroadcastRows(tree, Stat(SHIFT), R_);
    RowBroadcast<VecOp::SUB>(x, x, tree, R_, n);
    Exp(x, x, static_cast<int32_t>(cells));                                   // fp32 argument
    p = probOut_.template AllocTensor<half>();
    Cast(p, x, RoundMode::CAST_RINT, cells);                                  // fp16 P'
    Cast(x, p, RoundMode::CAST_NONE, cells);
    RowReduce<ReduceType::SUM>(Stat(ROWSUM), x, tree, R_, n);
    Mul(lNew, a, lOld, r);
    Add(lNew, lNew, Stat(ROWSUM), r);
}

// O = a O + P'V (fa-fp32: fp32; pasa-exact: the fp16 tile widened) or, pasa, fp16(fp16(a O) +
// fp16(b P'V)), with the factors block j left in the ring. The first block's fold writes O:
// a O + x = x when O = 0 (and pasa's fp16(0 + fp16(b P'V)) = fp16(b P'V)), so O needs no zeroing.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Fold(uint32_t j, const LocalTensor<float>& pv)
{
    const uint32_t dv = t_->headDimV, cells = R_ * dv, ring = RING + j % (PASA_PV_DELAY + 1);
    if (key_ == PASA_KEY_PASA) {
        LocalTensor<half> brc = tree_.Get<half>(), o = acc_.Get<half>(), x = pv.template ReinterpretCast<half>();
        BroadcastRows(brc, Stat16(ring), 2 * R_);
        if (j == 0) {
            RowBroadcast<VecOp::MUL>(o, x, brc[R_ * kC0], R_, dv);
            return;
        }
        RowBroadcast<VecOp::MUL>(o, o, brc, R_, dv);
        RowBroadcast<VecOp::MUL>(x, x, brc[R_ * kC0], R_, dv);
        Add(o, o, x, static_cast<int32_t>(cells));
        return;
    }
    LocalTensor<float> brc = tree_.Get<float>(), o = acc_.Get<float>();
    if (key_ == PASA_KEY_PASA_EXACT) {
        Cast(j == 0 ? o : work_.Get<float>(), pv.template ReinterpretCast<half>(), RoundMode::CAST_NONE, cells);
        if (j == 0) return;
    } else if (j == 0) {
        Adds(o, pv, 0.0f, static_cast<int32_t>(cells));
        return;
    }
    BroadcastRows(brc, Stat(ring), R_);
    RowBroadcast<VecOp::MUL>(o, o, brc, R_, dv);
    Add(o, o, key_ == PASA_KEY_PASA_EXACT ? work_.Get<float>() : pv, static_cast<int32_t>(cells));
}

// End of a task: O / l and LSE = m (+ gamma F) + log l in fp32; rows that saw no key get 0 and
// -inf. Then out and LSE rows to GM (each stacked head's rows are contiguous there).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Finish()
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    if (rows_ == 0) return;
    const uint32_t dv = t.headDimV, cells = R_ * dv, last = task.numBlocks % 2;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<OutT> o = tree_.Get<OutT>()[R_ * 32 / sizeof(OutT)];
    if (task.numBlocks == 0) {  // no row of the tile sees a key
        Duplicate(o.template ReinterpretCast<half>(), half(0.0f), static_cast<int32_t>(cells));
        Duplicate(Stat(LSE), -__builtin_inff(), r);
        StoreRows(o, Stat(LSE));
        return;
    }
    LocalTensor<float> l = L(last), m = M(last), lse = Stat(LSE), x = acc_.Get<float>();
    if (key_ == PASA_KEY_PASA) {
        l = Stat(FIN0);
        m = Stat(FIN1);
        Cast(l, PasaSet(last, P_L), RoundMode::CAST_NONE, R_);
        Cast(m, PasaSet(last, P_M), RoundMode::CAST_NONE, R_);
        Cast(Stat(T0), PasaSet(last, P_F), RoundMode::CAST_NONE, R_);
        Muls(Stat(T0), Stat(T0), t.gamma, r);
        Add(m, m, Stat(T0), r);                                               // true maximum m + gamma F
        x = work_.Get<float>();
        Cast(x, acc_.Get<half>(), RoundMode::CAST_NONE, cells);
    }
    // seen: the row's visible keys start before its end (causal: position + next >= 0)
    int64_t from = -30000;
    if (t.maskMode == PASA_MASK_CAUSAL) {
        from = Max64(-30000, Min64(30000, -(static_cast<int64_t>(task.q0) + task.info.next)));
    }
    Compares(RowBits(), Stat16(REL8), half(static_cast<float>(from)), CMPMODE::GE, P_COUNT * R_);
    Select(Stat(T1), RowBits(), l, 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    Ln(Stat(T2), Stat(T1), r);
    Add(lse, m, Stat(T2), r);
    Select(lse, RowBits(), lse, -__builtin_inff(), SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    LocalTensor<float> brc = tree_.Get<float>();
    BroadcastRows(brc, Stat(T1), R_);
    RowBroadcast<VecOp::DIV>(x, x, brc, R_, dv);
    Cast(o, x, RoundMode::CAST_RINT, cells);
    StoreRows(o, lse);
}

// The AIV's rows to GM, one run per stacked head, positions past the batch's query length left out.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StoreRows(const LocalTensor<OutT>& o, const LocalTensor<float>& lse)
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    const uint32_t dv = t.headDimV, stride = RowStride(t.outLayout, t.numHeads, dv), p = t.tilePositions;
    const uint32_t validPositions = static_cast<uint32_t>(task.info.qLen) - task.q0;
    SetFlag<HardEvent::V_MTE3>(EVENT_ID0);
    WaitFlag<HardEvent::V_MTE3>(EVENT_ID0);
    LocalTensor<float> aligned = Stat(FIN0);
    for (uint32_t row = rowBase_; row < rowBase_ + rows_;) {
        const uint32_t head = row / p, pos = row % p;
        const uint32_t end = Min(Min(rowBase_ + rows_, (head + 1) * p), head * p + Min(validPositions, p));
        if (end <= row) {
            row = (head + 1) * p;
            continue;
        }
        const uint32_t k = end - row, local = row - rowBase_;
        DataCopy(out_[RowOffset(t.outLayout, task.b, task.head0 + head, task.q0 + pos, t.numHeads, t.seqQ, dv)],
                 o[local * dv], DataCopyParams(static_cast<uint16_t>(k), static_cast<uint16_t>(dv * sizeof(OutT) / 32), 0,
                                               static_cast<uint16_t>((stride - dv) * sizeof(OutT) / 32)));
        LocalTensor<float> src = lse[local];
        if (local % 8 != 0) {  // an unaligned run (stacked heads): move it to an aligned place first
            SetFlag<HardEvent::MTE3_S>(EVENT_ID0);
            WaitFlag<HardEvent::MTE3_S>(EVENT_ID0);
            for (uint32_t i = 0; i < k; ++i) aligned.SetValue(i, lse.GetValue(local + i));
            src = aligned;
        }
        const uint64_t at = (static_cast<uint64_t>(task.b) * t.numHeads + task.head0 + head) * t.seqQ + task.q0 + pos;
        DataCopyPad(lse_[at], src, DataCopyExtParams(1, k * sizeof(float), 0, 0, 0));
        row = end;
    }
    SetFlag<HardEvent::MTE3_V>(EVENT_ID0);
    WaitFlag<HardEvent::MTE3_V>(EVENT_ID0);
}

}  // namespace pasa

#endif  // PASA_VECTOR_STEPS_H
