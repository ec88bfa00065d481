// The per-block steps of AttentionVector (pasa_attention_vector.h): masks, P'_j and the block's
// statistics for each allocation, the delayed O update, and the end of a task. Every step
// mirrors fallback/torch_blockwise.py (the reference of docs/design.md, "Precision
// allocations"); a comment names each rounding where it is not the obvious one.
#ifndef PASA_VECTOR_STEPS_H
#define PASA_VECTOR_STEPS_H

namespace pasa {

// Once per kernel: the column index row c = 0 .. n-1 and ONEZERO = [1 | 0]. rel is built per tile
// shape when a band needs it (BuildRel).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::BuildConstants()
{
    const uint32_t n = t_->kvBlock;
    LocalTensor<half> col = ColumnRow();
    for (uint32_t c = 0; c < n; ++c) col.SetValue(c, half(static_cast<float>(c)));
    Duplicate(Stat16(ONEZERO), half(1.0f), static_cast<int32_t>(G_));
    Duplicate(Stat16(ONEZERO)[G_], half(0.0f), static_cast<int32_t>(G_));
}

// rel(r) = the position of the AIV's row r within its head's run of `pitch` rows, broadcast one
// block a row, for every row of the band (all_ scalar writes, once per change of the tile shape or
// of the AIV's first row).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::BuildRel(uint32_t pitch)
{
    LocalTensor<half> rel = Stat16(REL);
    for (uint32_t r = 0; r < all_; ++r) rel.SetValue(r, half(static_cast<float>((rowBase_ + r) % pitch)));
    BroadcastRows(RelBroadcast(), rel, all_);
    relPitch_ = pitch;
    relBase_ = rowBase_;
}

// The explicit mask's bytes of kv block j for the chunk's rows (one copy per stacked head's run of
// positions; rows past the query length and columns past the kv length are left unset: the
// length compares mask them), row r of the chunk at byte r * kvBlock.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::LoadMaskTile(uint32_t j)
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    const uint32_t n = t.kvBlock, p = task.pitch, start = j * n;
    const uint32_t cols = Min(n, static_cast<uint32_t>(task.info.kvLen) - start);
    const uint64_t base = static_cast<uint64_t>(task.b) * t.maskBatchStride + start;
    const uint32_t base0 = rowBase_ + c0_;
    LocalTensor<uint8_t> tile = maskIn_.AllocTensor<uint8_t>();
    for (uint32_t row = base0; row < base0 + crows_;) {
        const uint32_t head = row / p, pos = row % p;
        const uint32_t end = Min(Min(base0 + crows_, (head + 1) * p), head * p + task.positions);
        if (end <= row) {
            row = (head + 1) * p;
            continue;
        }
        DataCopyPad(tile[(row - base0) * n], mask_[base + static_cast<uint64_t>(task.q0 + pos) * t.maskRowStride],
                    DataCopyExtParams(static_cast<uint16_t>(end - row), cols, t.maskRowStride - cols, (n - Align32(cols)) / 32, 0),
                    DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
        row = end;
    }
    maskIn_.EnQue(tile);
}

// At the first chunk of a statistics group (c0_ its first row): the group's starting statistics.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::InitState()
{
    const int32_t r = static_cast<int32_t>(G_);
    if (key_ == PASA_KEY_PASA) {
        Duplicate(PasaSet(0, 0), half(0.0f), static_cast<int32_t>(PasaStats()) * r);  // F, n, peak (, l) = 0
        Duplicate(PasaSet(0, P_M), half(kFp16Lowest), r);
    } else {
        Duplicate(M(0), kInitialMax, r);
        Duplicate(L(0), 0.0f, r);
        if (resolution_) Duplicate(Kept(PEAK32 + tp_), 0.0f, r);  // pasa-exact's peak (pasa's: P_PEAK, zeroed above)
    }
}

// Bits(0) = the visible keys of kv block j (bit set: visible) when the block is not visible in full
// to every row, as the And of whole-tile compares: the band's upper bound c - rel <= q0 + next - jn
// and lower bound c - rel >= q0 - pre - jn (c - rel built in the reduction scratch), the kv length
// c <= kvLen - 1 - jn, the explicit mask's byte == 0. rowsWithoutKeys: some row may see no key of
// the block. Returns false when the block needs no mask.
template <typename OutT, typename InT>
__aicore__ inline bool AttentionVector<OutT, InT>::MaskBlock(uint32_t j, const LocalTensor<uint8_t>& maskTile,
                                                             bool& rowsWithoutKeys)
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    rowsWithoutKeys = false;
    if (FullyVisible(task, j)) return false;
    const uint32_t n = t.kvBlock, cells = R_ * n;
    const int64_t start = static_cast<int64_t>(j) * n, first = task.q0, last = first + task.positions - 1;
    const BatchInfo& info = task.info;
    const bool upper = t.maskMode != PASA_MASK_NONE && start + n - 1 > first + info.next;
    const bool lower = t.maskMode == PASA_MASK_BAND && start < last - info.pre;
    const bool ragged = info.kvLen < start + n;
    LocalTensor<half> tile = tree_.Get<half>();
    uint32_t have = 0;  // bit tiles combined into Bits(0) so far
    auto combine = [&]() {
        if (have++ > 0) {
            And(Bits(0).template ReinterpretCast<uint16_t>(), Bits(0).template ReinterpretCast<uint16_t>(),
                Bits(1).template ReinterpretCast<uint16_t>(), static_cast<int32_t>(cells / 16));
        }
    };
    auto clamp = [](int64_t v) { return half(static_cast<float>(Max64(-4096, Min64(4096, v)))); };
    if (upper || lower) {
        if (task.pitch != relPitch_ || rowBase_ != relBase_) BuildRel(task.pitch);
        RowBroadcast<VecOp::SUB>(tile, ColumnRow(), RelBroadcast()[c0_ * kC0], R_, n, 0, 0, false);  // c - rel
    }
    if (upper) {
        Compares(Bits(have > 0 ? 1 : 0), tile, clamp(first + info.next - start), CMPMODE::LE, cells);
        combine();
    }
    if (lower) {
        Compares(Bits(have > 0 ? 1 : 0), tile, clamp(first - info.pre - start), CMPMODE::GE, cells);
        combine();
    }
    if (ragged) {
        for (uint32_t c = 0; c < n; c += 128) {                                               // c
            Add(tile[c], ColumnRow()[c], Zeros16(), n - c < 128 ? n - c : 128, static_cast<uint8_t>(R_),
                BinaryRepeatParams(1, 1, 0, static_cast<uint8_t>(n / kC0), 0, 0));
        }
        ResetMask();  // the Add's mask stays in the register, which Compares reads
        Compares(Bits(have > 0 ? 1 : 0), tile, clamp(info.kvLen - 1 - start), CMPMODE::LE, cells);
        combine();
    }
    if (t.hasMask) {
        Cast(tile, maskTile, RoundMode::CAST_NONE, cells);
        Compares(Bits(have > 0 ? 1 : 0), tile, half(0.0f), CMPMODE::EQ, cells);
        combine();
    }
    rowsWithoutKeys = t.hasMask || (upper && first + info.next < start) ||
                      (lower && last - info.pre >= Min64(info.kvLen, start + n));
    return true;
}

// shiftScores: S' of kv block j from its raw fp32 scores s = Q K^T (docs/design.md, "Shifting the
// scores in decode"), in fp32, then rounded to fp16 into the first half of s's buffer, where the
// allocation's step reads S'. The cube zeroed the keys past the block's v keys, so each row sum
// runs over them and s is 0 past v. pasa: S' = a_v s - off_v rowsum(s) (the score map's entries
// for v keys); pasa-exact: S' = scale s - c, c = scale (rowsum(s) / v), and Stat(T2) =
// rowsum(s) / v, which the step scales into c as it scales Q . mean16. Both subtract over the v
// columns only, so S' stays 0 past v (pasa's block mean sums every column). As
// fallback/torch/blockwise.py's _shift_scores, rounding for rounding.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::ShiftScores(uint32_t j, const LocalTensor<float>& s)
{
    const PasaTilingData& t = *t_;
    const uint32_t n = t.kvBlock;
    const int32_t r = static_cast<int32_t>(R_), cells = static_cast<int32_t>(R_ * n);
    const int64_t keys = task_->info.kvLen - static_cast<int64_t>(j) * n;
    const bool part = keys < n;
    LocalTensor<float> x = work_.Get<float>(), tree = tree_.Get<float>(), sum = Stat(T2), sub = Stat(T3);
    RowReduce<ReduceType::SUM>(sum, s, tree, R_, n);
    if (key_ == PASA_KEY_PASA_EXACT) {
        if (part) {
            Duplicate(sub, static_cast<float>(keys), r);
            Div(sum, sum, sub, r);                                                // rowsum / v
        } else {
            Muls(sum, sum, t.invKvBlock, r);                                      // rowsum / n (exact)
        }
        Muls(sub, sum, t.scale, r);                                               // c
        Muls(x, s, t.scale, cells);
    } else {
        const float a = part ? scoreMap_.GetValue(2 * keys) : mapA_;
        const float off = part ? scoreMap_.GetValue(2 * keys + 1) : mapOff_;
        Muls(sub, sum, off, r);                                                   // off_v rowsum
        Muls(x, s, a, cells);
    }
    BroadcastRows(tree, sub, R_);
    RowBroadcast<VecOp::SUB>(x, x, tree, R_, part ? static_cast<uint32_t>(keys) : n, n, n);  // the v columns
    Cast(s.template ReinterpretCast<half>(), x, RoundMode::CAST_RINT, cells);    // fp16 S'
}

template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Step(uint32_t i, uint32_t j, const LocalTensor<float>& s,
                                                        const LocalTensor<float>& c, const LocalTensor<uint8_t>& maskTile,
                                                        LocalTensor<half>& p)
{
    if (key_ == PASA_KEY_PASA) {
        StepPasa(i, j, s.template ReinterpretCast<half>(), c, maskTile, p);
    } else if (key_ == PASA_KEY_PASA_EXACT) {
        StepExact(i, j, s.template ReinterpretCast<half>(), c, maskTile, p);
    } else {
        StepFa(i, j, s, maskTile, p);
    }
}

template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Step(uint32_t i, uint32_t j, const LocalTensor<float>& s,
                                                        const LocalTensor<float>&, const LocalTensor<uint8_t>& maskTile,
                                                        LocalTensor<bfloat16_t>& p)
{
    StepFa(i, j, s, maskTile, p);  // bf16 inputs run fa-fp32 only
}

// fa-fp32: s = S scale; m' = max(m, rowmax s); p = exp(s - m'); ROWSUM = sum p (fp32; the group's
// Statistics then gives a = exp(m - m') and l' = a l + sum p); P' leaves in the input type
// (rounded once).
template <typename OutT, typename InT>
template <typename P>
__aicore__ inline void AttentionVector<OutT, InT>::StepFa(uint32_t i, uint32_t j, const LocalTensor<float>& s,
                                                          const LocalTensor<uint8_t>& maskTile, LocalTensor<P>& p)
{
    const uint32_t n = t_->kvBlock, cells = R_ * n;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> tree = tree_.Get<float>();
    LocalTensor<float> mOld = M(i % 2), mNew = M((i + 1) % 2);
    Muls(s, s, t_->scale, static_cast<int32_t>(cells));
    bool noKeys = false;
    if (MaskBlock(j, maskTile, noKeys)) Select(s, Bits(0), s, kMaskedScore, SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(Stat(ROWMAX), s, tree, R_, n);
    Max(mNew, mOld, Stat(ROWMAX), r);
    BroadcastRows(tree, mNew, R_);
    RowBroadcast<VecOp::SUB>(s, s, tree, R_, n);
    Exp(s, s, static_cast<int32_t>(cells));
    p = probOut_.template AllocTensor<P>();
    Cast(p, s, RoundMode::CAST_RINT, cells);
    RowReduce<ReduceType::SUM>(Stat(ROWSUM)[GroupRow()], s, tree, R_, n);
}

// pasa (fp16 statistics, Algorithm 1 re-based with the pseudo-average F), the chunk's tile: the
// block's fp32 row means of S' (ROWSUM at the chunk's rows), m' and P'. With K' the row means are
// the cube's row constants c = Q . mean (the mean of the unrounded S'; docs/design.md, "The block
// mean from the keys"); shifting the scores, the fp32 row sums of the fp16 S', widened vecSumRows
// rows at a time, which StatisticsPasa scales by 1 / v. P''s fp32 row sums (T1 at the chunk's rows)
// are widened the same way where the vector cores make them, else they come from the cube with
// P'V (tiling.pvCols). Each line here, in StatisticsPasa and in the fold is one rounding of
// fallback/torch_blockwise.py's _step_pseudo_average.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StepPasa(uint32_t i, uint32_t j, const LocalTensor<half>& s,
                                                            const LocalTensor<float>& c, const LocalTensor<uint8_t>& maskTile,
                                                            LocalTensor<half>& p)
{
    const uint32_t n = t_->kvBlock, cells = R_ * n;
    LocalTensor<half> tree16 = tree_.Get<half>(), mloc = PasaSet(i % 2, P_MLOC);
    if (t_->rowConstants) {
        Adds(Stat(ROWSUM)[GroupRow()], c, 0.0f, static_cast<int32_t>(R_));
    } else {
        // the mean runs over the block's keys, masked or not: all n columns, or the v keys of a
        // part-filled last block (its S' is zero past v, so the sum over n columns is theirs)
        ChunkRowSums(ROWSUM, s);
    }
    bool noKeys = false;
    const bool masked = MaskBlock(j, maskTile, noKeys);
    groupNoKeys_ = groupNoKeys_ || noKeys;
    if (masked) Select(s, Bits(0), s, half(kFp16Lowest), SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(mloc, s, tree16, R_, n);                       // m' (local maximum)
    BroadcastRows(tree16, mloc, R_);
    RowBroadcast<VecOp::SUB>(s, s, tree16, R_, n);                            // fp16(s - m')
    p = probOut_.template AllocTensor<half>();
    Exp(p, s, static_cast<int32_t>(cells));                                   // fp16(exp(.))
    if (masked) Select(p, Bits(0), p, half(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    if (VectorProbSums()) ChunkRowSums(T1, p);
}

// The fp32 row sums of the chunk's R_ rows of an fp16 tile (kvBlock columns) into statistics slot
// `slot` at the chunk's rows, the tile widened vecSumRows rows at a time.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::ChunkRowSums(uint32_t slot, const LocalTensor<half>& tile)
{
    const uint32_t n = t_->kvBlock, w = t_->vecSumRows;
    LocalTensor<float> x = work_.Get<float>(), tree = tree_.Get<float>();
    for (uint32_t r0 = 0; r0 < R_; r0 += w) {
        Cast(x, tile[r0 * n], RoundMode::CAST_NONE, static_cast<int32_t>(w * n));
        RowReduce<ReduceType::SUM>(Stat(slot)[GroupRow() + r0], x, tree, w, n);
    }
}

// After the last chunk of a statistics group (c0_ moves to the group's first row): the per-row
// statistics of block i of the task (kv block j) for the group's rows.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Statistics(uint32_t i, uint32_t j)
{
    c0_ -= GroupRow();
    if (key_ == PASA_KEY_PASA) {
        StatisticsPasa(i, j);
        return;
    }
    // fa-fp32, pasa-exact: a = exp(m - m'), l' = a l + sum p (fp32)
    const int32_t g = static_cast<int32_t>(G_);
    const uint32_t cur = i % 2, nxt = (i + 1) % 2;
    LocalTensor<float> a = Kept(ringSlot_), lNew = L(nxt);
    Sub(a, M(cur), M(nxt), g);
    Exp(a, a, g);
    Mul(lNew, a, L(cur), g);
    Add(lNew, lNew, Stat(ROWSUM), g);
}

// pasa's statistics update for the group's rows from its tiles' m' and row sums of S' (its scratch
// in the tree: the row pairs, then eight copies of m'). l's update, fp16(fp16(a l) + fp16(b l')), is
// here where the vector cores sum P', else the fold's (l' arrives with P'V).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StatisticsPasa(uint32_t i, uint32_t j)
{
    const PasaTilingData& t = *t_;
    const uint32_t n = t.kvBlock, G = G_;
    const int32_t g = static_cast<int32_t>(G_);
    LocalTensor<half> t2 = tree_.Get<half>(), t3 = t2[2 * G], copies = t2[4 * G];
    LocalTensor<half> cur = PasaSet(i % 2, 0), nxt = PasaSet((i + 1) % 2, 0);
    LocalTensor<half> ab = Kept16(ringSlot_);
    if (resolution_) {  // the resolution check: peak = max(peak, |m'|), exact in fp16; a row without keys keeps
        Abs(t2, cur[P_MLOC * G], g);                                          // its peak by the select at the end
        Max(nxt[P_PEAK * G], cur[P_PEAK * G], t2, g);
    }
    if (!t.rowConstants) {
        const int64_t keys = task_->info.kvLen - static_cast<int64_t>(j) * n;
        const float inv = keys < n ? 1.0f / static_cast<float>(keys) : t.invKvBlock;  // fp32(1 / v)
        Muls(Stat(ROWSUM), Stat(ROWSUM), inv, g);                             // sum / n (exact) or sum * (1 / v)
    }
    Cast(cur[P_MEAN * G], Stat(ROWSUM), RoundMode::CAST_RINT, G);            // fp16 block mean
    if (resolution_) {  // and peak = max(peak, |gamma mean|), the block offset recovered from the mean (rounded to
                        // fp16: [511.75, 512) reaches the limit here, not where the other backends take the exact product)
        Muls(t2, cur[P_MEAN * G], half(t.gamma), g);
        Abs(t2, t2, g);
        Max(nxt[P_PEAK * G], nxt[P_PEAK * G], t2, g);
    }
    Adds(nxt[P_N * G], cur[P_N * G], half(1.0f), g);                          // n + 1
    Mul(t2, cur[P_N * G], cur[P_F * G], g);                                   // (n - 1) F
    Add(t2, t2, cur[P_MEAN * G], g);
    Div(nxt[P_F * G], t2, nxt[P_N * G], g);                                   // F_j
    PairOp<VecOp::SUB>(t2, cur[P_F * G], nxt[P_F * G], G);                    // [F - F_j | mean - F_j]
    Muls(t2, t2, half(t.gamma), 2 * g);
    Add(t3, cur[P_M * G], t2, 2 * g);                                         // [x | y]
    Max(nxt[P_M * G], t3, t3[G], g);                                          // m_j = max(x, y)
    PairOp<VecOp::SUB>(t2, t3, nxt[P_M * G], G);
    Exp(ab, t2, 2 * g);                                                       // [a | b]
    if (VectorProbSums()) {
        Cast(cur[P_LLOC * G], Stat(T1), RoundMode::CAST_RINT, G);            // l' = fp16(sum p)
        Mul(t2, ab, cur[P_L * G], 2 * g);                                     // [a l | b l']
        Add(nxt[P_L * G], t2, t2[G], g);
    }
    if (groupNoKeys_) {  // rows that see no key of block j (m' the masked lowest) keep m, F, n; their O and l keep too (a = 1, b = 0)
        Replicate8(copies, cur[P_MLOC * G], Zeros16(), G);
        Compares(RowBits(), copies, half(kFp16Lowest), CMPMODE::NE, 8 * G);
        Select(nxt, RowBits(), nxt, cur, SELMODE::VSEL_TENSOR_TENSOR_MODE, PasaStats() * G);
        Select(ab, RowBits(), ab, Stat16(ONEZERO), SELMODE::VSEL_TENSOR_TENSOR_MODE, 2 * G);
    }
}

// pasa-exact: m' = max(m, rowmax S' + c); p = fp16(exp(S' - (m' - c))) with an fp32 argument;
// ROWSUM = sum p (fp32, of the rounded p; the group's Statistics then gives a = exp(m - m') and
// l' = a l + sum p).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StepExact(uint32_t i, uint32_t j, const LocalTensor<half>& s,
                                                             const LocalTensor<float>& c, const LocalTensor<uint8_t>& maskTile,
                                                             LocalTensor<half>& p)
{
    const uint32_t n = t_->kvBlock, cells = R_ * n;
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> x = work_.Get<float>(), tree = tree_.Get<float>();
    LocalTensor<float> mOld = M(i % 2), mNew = M((i + 1) % 2);
    Cast(x, s, RoundMode::CAST_NONE, cells);
    bool noKeys = false;
    if (MaskBlock(j, maskTile, noKeys)) Select(x, Bits(0), x, kMaskedScore, SELMODE::VSEL_TENSOR_SCALAR_MODE, cells);
    RowReduce<ReduceType::MAX>(Stat(ROWMAX), x, tree, R_, n);
    if (resolution_) ExactPeak(noKeys);
    Muls(Stat(CONST), c, t_->scale, r);                                       // c = scale (Q . mean16)
    Add(Stat(T0), Stat(ROWMAX), Stat(CONST), r);
    Max(mNew, mOld, Stat(T0), r);
    Sub(Stat(SHIFT), mNew, Stat(CONST), r);                                   // m' - c
    BroadcastRows(tree, Stat(SHIFT), R_);
    RowBroadcast<VecOp::SUB>(x, x, tree, R_, n);
    Exp(x, x, static_cast<int32_t>(cells));                                   // fp32 argument
    p = probOut_.template AllocTensor<half>();
    Cast(p, x, RoundMode::CAST_RINT, cells);                                  // fp16 P'
    Cast(x, p, RoundMode::CAST_NONE, cells);
    RowReduce<ReduceType::SUM>(Stat(ROWSUM)[GroupRow()], x, tree, R_, n);
}

// At the first chunk of a statistics group (c0_ its first row), before block i's folds: the
// group's rescale factors of the block in the ring, one 32-byte block a row in the tree (pasa: a
// then b; the fp32 allocations: a, which the task's first fold does not use).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::BroadcastFactors(uint32_t i)
{
    if (key_ == PASA_KEY_PASA) {
        BroadcastRows(tree_.Get<half>(), Kept16(ringSlot_), 2 * G_);
    } else if (i > 0) {
        BroadcastRows(tree_.Get<float>(), Kept(ringSlot_), G_);
    }
}

// O = a O + P'V (fa-fp32: fp32; pasa-exact: the fp16 tile widened) or, pasa, fp16(fp16(a O) +
// fp16(b P'V)) over the tile's pvCols columns, which updates l from l' in its last ones, with the
// factors of block i of the task broadcast by BroadcastFactors. The task's first fold writes O: a O
// + x = x when O = 0 (and pasa's fp16(0 + fp16(b P'V)) = fp16(b P'V)), so O needs no zeroing.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Fold(uint32_t i, const LocalTensor<float>& pv)
{
    const uint32_t dv = t_->headDimV, cells = R_ * dv, row = GroupRow();
    if (key_ == PASA_KEY_PASA) {
        const uint32_t w = t_->pvCols;
        LocalTensor<half> brc = tree_.Get<half>(), o = acc_.Get<half>()[c0_ * w], x = pv.template ReinterpretCast<half>();
        LocalTensor<half> a = brc[row * kC0], b = brc[(G_ + row) * kC0];
        if (i == 0) {
            RowBroadcast<VecOp::MUL>(o, x, b, R_, w);
            return;
        }
        RowBroadcast<VecOp::MUL>(o, o, a, R_, w);
        RowBroadcast<VecOp::MUL>(x, x, b, R_, w);
        Add(o, o, x, static_cast<int32_t>(R_ * w));
        return;
    }
    LocalTensor<float> brc = tree_.Get<float>()[row * 32 / sizeof(float)], o = acc_.Get<float>()[c0_ * dv];
    if (key_ == PASA_KEY_PASA_EXACT) {
        Cast(i == 0 ? o : work_.Get<float>(), pv.template ReinterpretCast<half>(), RoundMode::CAST_NONE, cells);
        if (i == 0) return;
    } else if (i == 0) {
        Adds(o, pv, 0.0f, static_cast<int32_t>(cells));
        return;
    }
    RowBroadcast<VecOp::MUL>(o, o, brc, R_, dv);
    Add(o, o, key_ == PASA_KEY_PASA_EXACT ? work_.Get<float>() : pv, static_cast<int32_t>(cells));
}

// pasa: l (fp32, exact) of the chunk's rows from the accumulator's columns [headDimV, headDimV + 16),
// each of which holds it: one ReduceDataBlock (MAX of equal values) per 8 rows a repeat.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::AccumulatorSums(const LocalTensor<float>& l)
{
    const uint32_t w = t_->pvCols / kC0;  // blocks a row
    LocalTensor<half> sums = acc_.Get<half>()[c0_ * t_->pvCols + t_->headDimV], l16 = Stat16(T1);
    if (8 * w <= 255) {
        ReduceDataBlock<ReduceType::MAX>(l16, sums, 128, static_cast<int32_t>(R_ / 8), 1, static_cast<int32_t>(w),
                                         static_cast<int32_t>(8 * w));
    } else {  // the repeat stride is one byte: 8 rows a call
        for (uint32_t r8 = 0; r8 < R_; r8 += 8) {
            ReduceDataBlock<ReduceType::MAX>(l16[r8], sums[r8 * t_->pvCols], 128, 1, 1, static_cast<int32_t>(w), 0);
        }
    }
    ResetMask();
    Cast(l, l16, RoundMode::CAST_NONE, R_);
}

// RowBits() = the rows that saw a key (l != 0; a NaN from an overflow counts as seen, so that it
// reaches the output as the reference's does), one bit per row in each of eight copies.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::SeenRows(const LocalTensor<float>& l)
{
    LocalTensor<float> copies = tree_.Get<float>();  // 8 R_ fp32: the first 32 bytes a row of the tree
    Replicate8(copies, l, Zeros16().template ReinterpretCast<float>(), R_);
    Compares(RowBits(), copies, 0.0f, CMPMODE::NE, 8 * R_);
}

// The learnable sink of each row joins its statistics in the true frame (m the true maximum, l
// the sum relative to it, x the unnormalised O), in fp32, as fallback/torch_blockwise.py's
// _finish: M' = max(m, sink), a = exp(m - M'), l' = a l + exp(sink - M'), x = a x. m and l then
// name M' and l' (scratch slots; the task's statistics stay as they are).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::JoinSink(LocalTensor<float>& m, LocalTensor<float>& l,
                                                            const LocalTensor<float>& x)
{
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> sink = Stat(SINK), joinedM = Stat(JOINED_M), joinedL = Stat(JOINED_L), a = Stat(T0);
    RowSinks(sink_, *task_, rowBase_ + c0_, R_, sink);
    Max(joinedM, m, sink, r);                                                 // M' = max(m, sink)
    Sub(a, m, joinedM, r);
    Exp(a, a, r);                                                             // a = exp(m - M')
    Sub(sink, sink, joinedM, r);
    Exp(sink, sink, r);                                                       // exp(sink - M')
    Mul(joinedL, a, l, r);
    Add(joinedL, joinedL, sink, r);                                           // l' = a l + exp(sink - M')
    LocalTensor<float> brc = tree_.Get<float>();
    BroadcastRows(brc, a, R_);
    RowBroadcast<VecOp::MUL>(x, x, brc, R_, t_->headDimV);                    // a O
    m = joinedM;
    l = joinedL;
}

// End of a task, chunk by chunk (FinishChunk), then the task's flag byte.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::Finish()
{
    if (rows_ == 0) return;
    for (uint32_t k = 0; k < Chunks(); ++k) {
        if (!UseChunk(k)) break;
        FinishChunk();
    }
    if (flags_.on && !flags_.repair) {
        Cast(flags_.task, Stat16(TASK_FLAG), RoundMode::CAST_NONE, 32);
        StoreTaskFlag(*t_, *task_, rowBase_, flags_);
        Max(CoreFlag(), CoreFlag(), Stat16(TASK_FLAG), 16);
    }
}

// After the AIV's last task: its core byte (CoreFlagSlot), 1 if any of its tasks' bytes is, for
// the repair pass's CoreFlagged.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::StoreCoreFlag()
{
    OrderPipes<HardEvent::MTE3_V>();  // the last task's byte has left flags_.task
    Cast(flags_.task, CoreFlag(), RoundMode::CAST_NONE, 16);
    OrderPipes<HardEvent::V_MTE3>();
    DataCopyPad(flags_.tasks[CoreFlagSlot(*t_, static_cast<uint32_t>(GetBlockIdx()) / 2, sub_)], flags_.task,
                DataCopyExtParams(1, 1, 0, 0, 0));
}

// End of a task for the chunk's rows: O / l and LSE = m (+ gamma F) + log l in fp32, the sink
// joined first (with split kv the merge joins it instead); rows that saw no key get 0 and -inf.
// Then out and LSE rows to GM (each stacked head's rows are contiguous there), or, with split
// kv, O / l and LSE (-3e38 for a row that saw nothing) to the split's partial slot.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::FinishChunk()
{
    const PasaTilingData& t = *t_;
    const AttentionTask& task = *task_;
    const uint32_t dv = t.headDimV, cells = R_ * dv, last = task.numBlocks % 2, row0 = rowBase_ + c0_;
    const int32_t r = static_cast<int32_t>(R_);
    const bool split = t.kvSplits > 1;
    const float unseen = split ? kMaskedScore : -__builtin_inff();
    LocalTensor<OutT> o = tree_.Get<OutT>()[R_ * 32 / sizeof(OutT)];
    if (task.numBlocks == 0) {  // no row of the tile sees a key
        Duplicate(Stat(LSE), unseen, r);
        if (split) {  // fp32 zeros: pasa's accumulator holds fp16, its work tile fp32
            LocalTensor<float> zero = key_ == PASA_KEY_PASA ? work_.Get<float>() : acc_.Get<float>()[c0_ * dv];
            Duplicate(zero, 0.0f, static_cast<int32_t>(cells));
            StorePartial(workspace_, t, task, rowBase_, c0_, crows_, zero, Stat(LSE));
        } else {
            Duplicate(o.template ReinterpretCast<half>(), half(0.0f), static_cast<int32_t>(cells));
            if (flags_.on) {
                Duplicate(Stat16(T1), half(0.0f), 2 * r);
                Cast(flags_.bytes, Stat16(T1), RoundMode::CAST_NONE, R_);
                if (c0_ == 0) Duplicate(Stat16(TASK_FLAG), half(0.0f), 32);
            }
            StoreRows(t, task, row0, crows_, out_, lse_, o, Stat(LSE), Stat(FIN0), flags_);
        }
        return;
    }
    LocalTensor<float> l = L(last), m = M(last), lse = Stat(LSE), x = work_.Get<float>();
    if (key_ != PASA_KEY_PASA) x = acc_.Get<float>()[c0_ * dv];
    if (key_ == PASA_KEY_PASA) {
        l = Stat(FIN0);
        m = Stat(FIN1);
        if (VectorProbSums()) {
            Cast(l, PasaSet(last, P_L), RoundMode::CAST_NONE, R_);
        } else {
            AccumulatorSums(l);
        }
        Cast(m, PasaSet(last, P_M), RoundMode::CAST_NONE, R_);
        Cast(Stat(T0), PasaSet(last, P_F), RoundMode::CAST_NONE, R_);
        Muls(Stat(T0), Stat(T0), t.gamma, r);
        Add(m, m, Stat(T0), r);                                               // true maximum m + gamma F
        // O without l's columns (times 1, exact) into the output staging, then widened
        LocalTensor<half> packed = o.template ReinterpretCast<half>();
        for (uint32_t c = 0; c < dv; c += 128) {
            Level0<VecOp::MUL>(packed[c], acc_.Get<half>()[c0_ * t.pvCols + c], Stat16(ONEZERO), dv - c < 128 ? dv - c : 128,
                               static_cast<uint8_t>(R_),
                               BinaryRepeatParams(1, 1, 0, static_cast<uint8_t>(dv / kC0), static_cast<uint8_t>(t.pvCols / kC0), 0));
        }
        ResetMask();
        Cast(x, packed, RoundMode::CAST_NONE, cells);
    }
    SeenRows(l);  // before the sink: a row that saw no key ignores it
    if (t.hasSink && !split) JoinSink(m, l, x);
    Select(Stat(T1), RowBits(), l, 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    Ln(Stat(T2), Stat(T1), r);
    Add(lse, m, Stat(T2), r);
    if (flags_.on) Sub(Stat(T3), lse, lse, r);  // NaN where the LSE is NaN or infinite (unseen rows: finite here)
    Select(lse, RowBits(), lse, unseen, SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    LocalTensor<float> brc = tree_.Get<float>();
    BroadcastRows(brc, Stat(T1), R_);
    RowBroadcast<VecOp::DIV>(x, x, brc, R_, dv);
    if (split) {
        // the resolution check with split kv: the split sees some of the row's blocks only, and the
        // merge reads nothing but the partials. A row that lost resolution in this split gets a NaN
        // partial LSE: the merge's LSE and O of the row are then NaN (max, exp and sum propagate it),
        // its existing non-finite check flags the row, and the repair launch recomputes it whole.
        if (resolution_) {
            ResolvedRows();
            Select(lse, RowBits(), lse, __builtin_nanf(""), SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
        }
        StorePartial(workspace_, t, task, rowBase_, c0_, crows_, x, lse);
        return;
    }
    Cast(o, x, RoundMode::CAST_RINT, cells);
    if (flags_.on) FlagRows(x, Stat(T3));
    StoreRows(t, task, row0, crows_, out_, lse_, o, lse, Stat(FIN0), flags_);
}

// flags_.bytes = 1 for the chunk's rows whose output tile x (fp32, overwritten) or LSE check (lse -
// lse, NaN where the LSE is not finite) holds a NaN or an infinity, or (the resolution check) whose
// peak |max S'| reached the limit, else 0, and TASK_FLAG the maximum over the task's chunks so
// far: whole-tile instructions, once per task and chunk. The repair launch: 3 and 2 instead of 1 and 0 (ROW_NONFINITE,
// ROW_REPAIRED), no task byte.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::FlagRows(const LocalTensor<float>& x, const LocalTensor<float>& lseCheck)
{
    const int32_t r = static_cast<int32_t>(R_);
    RowNonFinite(Stat(T2), x, R_, t_->headDimV);
    Add(Stat(T2), Stat(T2), lseCheck, r);
    if (resolution_) {  // a row that lost resolution counts as not finite (any nonzero flags it below)
        ResolvedRows();
        Select(Stat(T2), RowBits(), Stat(T2), 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    }
    LocalTensor<float> copies = tree_.Get<float>();  // the first 32 bytes a row of the tree, as SeenRows
    Replicate8(copies, Stat(T2), Zeros16().template ReinterpretCast<float>(), R_);
    Compares(RowBits(), copies, 0.0f, CMPMODE::NE, 8 * R_);
    Select(Stat16(T1), RowBits(), Stat16(ONEZERO), half(0.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    if (flags_.repair) {
        Adds(Stat16(T1), Stat16(T1), half(2.0f), r);
    } else {
        // the first chunk starts the task's maximum, the others join it
        LocalTensor<half> chunkMax = c0_ == 0 ? Stat16(TASK_FLAG) : Stat16(T2);
        Duplicate(chunkMax, half(0.0f), 32);
        ReduceMax(chunkMax, Stat16(T1), Stat16(T3), static_cast<int32_t>(crows_));
        if (c0_ != 0) Max(Stat16(TASK_FLAG), Stat16(TASK_FLAG), chunkMax, 32);
    }
    Cast(flags_.bytes, Stat16(T1), RoundMode::CAST_NONE, R_);
}

// The resolution check of pasa-exact, block by block: PEAK32 = max(PEAK32, |ROWMAX|) (the block's
// row maximum of S', fp32, before c). A row that sees no key of the block (ROWMAX the masked
// sentinel) keeps its peak: |ROWMAX| is replaced by 0 for it (only in blocks where a row may see none).
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::ExactPeak(bool noKeys)
{
    const int32_t r = static_cast<int32_t>(R_);
    LocalTensor<float> a = Stat(T1), peak = Kept(PEAK32 + tp_);
    Abs(a, Stat(ROWMAX), r);
    if (noKeys) {
        LocalTensor<float> copies = tree_.Get<float>();  // free between the row maximum and the broadcast of m' - c
        Replicate8(copies, Stat(ROWMAX), Zeros16().template ReinterpretCast<float>(), R_);
        Compares(RowBits(), copies, kMaskedScore, CMPMODE::NE, 8 * R_);
        Select(a, RowBits(), a, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, R_);
    }
    Max(peak, peak, a, r);
}

// RowBits() = the rows of the task that kept resolution: peak |max S'| < tiling.resolutionLimit
// (a NaN peak fails), one bit per row in each of eight copies. End of a task only.
template <typename OutT, typename InT>
__aicore__ inline void AttentionVector<OutT, InT>::ResolvedRows()
{
    LocalTensor<float> peak = Kept(PEAK32 + tp_);
    if (key_ == PASA_KEY_PASA) {  // the fp16 peak of the task's last set, widened (exact) into a step's scratch
        peak = Stat(ROWMAX);
        Cast(peak, PasaSet(task_->numBlocks % 2, P_PEAK), RoundMode::CAST_NONE, R_);
    }
    LocalTensor<float> copies = tree_.Get<float>();  // the first 32 bytes a row of the tree, as SeenRows
    Replicate8(copies, peak, Zeros16().template ReinterpretCast<float>(), R_);
    Compares(RowBits(), copies, t_->resolutionLimit, CMPMODE::LT, 8 * R_);
}

}  // namespace pasa

#endif  // PASA_VECTOR_STEPS_H
