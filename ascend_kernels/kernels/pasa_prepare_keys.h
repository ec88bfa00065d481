// Preprocessing of the keys, once per kv block, before the attention (docs/design.md,
// "Shifting the keys on the matrix engine").
//
// pasa_shift_keys (MIX 1:2, tiling key PASA):  K'_j = M^T K_j, M = scale (I - beta/n J) stored in
//   fp16 as the host built it. One Mmad per block (per piece of tiling.prepCols columns of K_j
//   where the head dim is wider): A = M^T (resident in L0A), B = K_j, fp32 accumulation, Fixpipe
//   rounds K' to fp16. Where M^T does not fit L0A (kvBlock 256), one Mmad per piece of
//   tiling.shiftRows of its rows, each piece loaded from L1 in turn: the same sums, row by row
//   (two pieces fill L0A; the row of ones takes a piece's buffer for the column sums); where M^T
//   does not fit L1 (kvBlock 512 and more), L1 holds a band of shiftRows rows from which each
//   piece is a window (tiling.shiftWindow: the rows of M^T differ only in where the diagonal is). For every
//   block the cube also drains the column sums 1^T K_j (a second Mmad with a row of ones, fp32, in
//   key order), and the vector cores store the block's key mean fp16(colsum fl32(r / v)) over its v
//   keys (r: M's row sum, tiling.shiftRowSum), the column mean of its unrounded K', from which the
//   attention's row constants give the block means of S' (docs/design.md, "The block mean from
//   the keys"). A part-filled last block (v < n keys, zero-padded) is shifted as if its missing
//   rows were the mean of its keys: the cube drains M^T K_j in fp32 too, and the vector cores form
//   K'_i = fp16(M^T K_j - c colsum) for i < v, with c = off (n - v) / v (off: M's stored
//   off-diagonal magnitude), and K'_i = 0 for i >= v.
//
// pasa_center_keys (MIX 1:2, tiling key PASA_EXACT):  mean16 = fp16(colsum(K_j) / v) over the
//   block's v keys, K'_j = fp16((K_j - mean16) * scale), zero past v.  The column sums run on the
//   cube (ones^T K_j, fp32 accumulation in key order); the subtraction runs on the vector cores. It
//   cannot be folded into one cube GEMM: pasa-exact subtracts the *rounded* mean16 and scales in
//   fp32, and a GEMM would need scale*mean16 as an fp16 operand, a second rounding the allocation
//   does not have.
//
// Both stage each key block into L1 one block ahead of the cube (StagedKeyBlocks) and hand its
// column sums to the vector cores through a ring of PASA_SUM_SLOTS slots (SumSlot).
// A ragged last block (kv_len not a multiple of the block) is zero-filled in L1. With paged KV
// each physical block is preprocessed once, by the table entry that owns it (KeyBlockIter).
// None of it runs where the attention kernel shifts the scores instead (tiling.shiftScores).
// The attention launch runs it first (tiling.prepInAttention; it takes as many AI Cores), its
// cores then meeting at SyncAll; forced (the host's prepLaunch), a launch of its own
// (pasa_prepare_keys.cpp) runs it before the attention launch.
// Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_PREPARE_KEYS_H
#define PASA_PREPARE_KEYS_H

#include "pasa_workspace.h"

namespace pasa {

using namespace AscendC;

// Whether a key block lies in L1 as Zz pieces (below) rather than NZ: where the DMA's stride between
// 16-row blocks reaches the keys' row stride.
__aicore__ inline bool KeysZz(const PasaTilingData& t) { return ZzCopyReaches(RowStride(t.kvLayout, t.numKvHeads, t.headDim)); }

// Load a block of keys (validRows x D, rest zero) into L1, one copy per run of rows inside one
// physical block (paged: one run, kvBlock divides blockSize): KeysZz, for each piece of
// tiling.prepCols columns a Zz tile of kvBlock rows, the pieces one after the other (each piece is
// then one load into L0B); else NZ with C0 stride kvBlock.
__aicore__ inline void LoadKeyBlock(const LocalTensor<half>& l1, const GlobalTensor<half>& key, const PasaTilingData& t,
                                    const KvPages& pages, const KeyBlockTask& task)
{
    const uint32_t n = t.kvBlock, d = t.headDim, stride = RowStride(t.kvLayout, t.numKvHeads, d);
    const bool zz = KeysZz(t);
    if (!zz) ZeroRowsNz(l1, task.validRows, n, d, n);
    for (uint32_t d0 = 0; zz && d0 < d; d0 += t.prepCols) ZeroRowsZz(l1[d0 * n], task.validRows, n, Min(t.prepCols, d - d0));
    for (uint32_t r = 0; r < task.validRows;) {
        const int64_t pos = static_cast<int64_t>(task.block) * n + r;
        const uint32_t run = RunLength(t, pos, task.validRows - r);
        const uint64_t src = KvRowOffset(t, pages, task.b, task.kvHead, task.kvStart, pos, d);
        if (zz) {  // r is a multiple of 16
            for (uint32_t d0 = 0; d0 < d; d0 += t.prepCols) {
                const uint32_t cols = Min(t.prepCols, d - d0);
                CopyZz(l1[d0 * n + (r / kC0) * (cols / kC0) * kFractal], key, src + d0, run, cols, stride);
            }
        } else {
            DataCopy(l1[r * kC0], key[src], Nd2NzParams(1, static_cast<uint16_t>(run), static_cast<uint16_t>(d), 0,
                                                       static_cast<uint16_t>(stride), static_cast<uint16_t>(n), 1, 0));
        }
        r += run;
    }
}

// Columns [d0, d0 + cols) of a key block in L1 (LoadKeyBlock) -> L0B (Zn, the K_j operand of a
// k = kvBlock GEMM): transpose each fractal; Zz, in one load where the fractals fit one repeat count.
__aicore__ inline void KeyBlockToL0b(const LocalTensor<half>& l0b, const LocalTensor<half>& l1, const PasaTilingData& t,
                                     uint32_t d0, uint32_t cols)
{
    const uint32_t kBlocks = t.kvBlock / kC0, nBlocks = cols / kC0;
    const bool zz = KeysZz(t);
    if (zz && kBlocks * nBlocks <= 255) {
        LoadData(l0b, l1[d0 * t.kvBlock], LoadData2DParams(0, static_cast<uint8_t>(kBlocks * nBlocks), 1, 0, 0, true, 0));
        return;
    }
    for (uint32_t kb = 0; kb < kBlocks; ++kb) {
        const uint32_t at = zz ? d0 * t.kvBlock + kb * nBlocks * kFractal : kb * kFractal + d0 * t.kvBlock;
        LoadData(l0b[kb * nBlocks * kFractal], l1[at],
                 LoadData2DParams(0, static_cast<uint8_t>(nBlocks), static_cast<uint16_t>(zz ? 1 : kBlocks), 0, 0, true, 0));
    }
}

// This core's key blocks (KeyBlockIter), each staged GM -> L1 (LoadKeyBlock) one block ahead: the
// next block's keys land while this one's Mmads run (the L1 queue holds two; KeyColumns frees a
// block's buffer with its last piece). With one buffer (tiling.prepKeyBuffers: blocks L1 does not
// hold two of) the next block is staged once the cube has taken this one's last piece (Refill).
using KeyBlockL1 = TQue<TPosition::B1, 2>;
class StagedKeyBlocks {
public:
    __aicore__ inline StagedKeyBlocks(KeyBlockL1& l1, const GlobalTensor<half>& key, const PasaTilingData& t,
                                      const KvPages& pages, KeyBlockIter& it)
        : l1_(l1), key_(key), t_(t), pages_(pages), it_(it)
    {
        has_ = it_.Next(next_);
        if (has_) Stage();
    }

    // The next block and its keys in L1, ready for KeyColumns; false past the last.
    __aicore__ inline bool Next(KeyBlockTask& task, LocalTensor<half>& k1)
    {
        if (!has_) return false;
        task = next_;
        k1 = l1_.DeQue<half>();
        has_ = it_.Next(next_);
        if (has_ && t_.prepKeyBuffers > 1) Stage();
        return true;
    }

    // One buffer: the next block staged, once KeyColumns freed the buffer (a block's last piece).
    __aicore__ inline void Refill()
    {
        if (has_ && t_.prepKeyBuffers == 1) Stage();
    }

private:
    __aicore__ inline void Stage()
    {
        LocalTensor<half> k1 = l1_.AllocTensor<half>();
        LoadKeyBlock(k1, key_, t_, pages_, next_);
        l1_.EnQue(k1);
    }

    KeyBlockL1& l1_;
    const GlobalTensor<half>& key_;
    const PasaTilingData& t_;
    const KvPages& pages_;
    KeyBlockIter& it_;
    KeyBlockTask next_;
    bool has_ = false;
};

// Columns [d0, d0 + cols) of a staged key block -> L0B, ready for the cube; the last piece frees the
// block's L1 buffer. The caller frees the result.
template <typename L1Queue, typename L0bQueue>
__aicore__ inline LocalTensor<half> KeyColumns(L1Queue& l1, L0bQueue& l0b, LocalTensor<half>& k1,
                                               const PasaTilingData& t, uint32_t d0, uint32_t cols)
{
    LocalTensor<half> k2 = l0b.template AllocTensor<half>();
    KeyBlockToL0b(k2, k1, t, d0, cols);
    l0b.EnQue(k2);
    if (d0 + cols == t.headDim) l1.FreeTensor(k1);
    return l0b.template DeQue<half>();
}

// A = 16 x n with row 0 all ones, rows 1..15 zero (NZ: one 16-row block per column block) into L1,
// once per launch: the column sums of a key block are the first row of A K.
__aicore__ inline void FillOnesRow(const LocalTensor<half>& o1, uint32_t n)
{
    Fill(o1, InitConstValueParams<half>(static_cast<uint16_t>(n / kC0), 1, 15, half(1.0f)));
    Fill(o1[kC0], InitConstValueParams<half>(static_cast<uint16_t>(n / kC0), 15, 1, half(0.0f)));
    OrderPipes<HardEvent::MTE2_MTE1>();
}

// The row of ones (FillOnesRow) L1 -> L0A.
__aicore__ inline void LoadOnesRow(const LocalTensor<half>& o1, const LocalTensor<half>& l0a, uint32_t n)
{
    LoadData(l0a, o1, LoadData2DParams(0, static_cast<uint8_t>(n / kC0), 1, 0, 0, false, 0));
}

// The row of ones filled into L1 (o1) and loaded into L0A to stay (l0a), ready for the cube.
__aicore__ inline void OnesRowToStay(const LocalTensor<half>& o1, const LocalTensor<half>& l0a, uint32_t n)
{
    FillOnesRow(o1, n);
    LoadOnesRow(o1, l0a, n);
    OrderPipes<HardEvent::MTE1_M>();
}

// The slots the vector cores must have read before the cube writes the column sums of the
// `handed`-th block (a ring of PASA_SUM_SLOTS): every block but the last PASA_SUM_SLOTS - 1.
__aicore__ inline uint32_t SumSlotsRead(uint32_t handed)
{
    return handed + 1 > PASA_SUM_SLOTS ? handed + 1 - PASA_SUM_SLOTS : 0;
}

// One preprocessing core's exchange slots: the column sums of its block `index` (headDim fp32, a
// ring of PASA_SUM_SLOTS), and after them (pasa) the one slot of a part-filled block's M^T K
// (kvBlock x headDim fp32, row-major).
__aicore__ inline GM_ADDR SumSlot(GM_ADDR workspace, const PasaTilingData& t, uint32_t core, uint32_t index)
{
    return workspace + t.coreAreaOffset + static_cast<uint64_t>(core) * t.coreAreaBytes + (index % PASA_SUM_SLOTS) * t.colSumSlotBytes;
}
__aicore__ inline GM_ADDR RowsSlot(GM_ADDR workspace, const PasaTilingData& t, uint32_t core)
{
    return workspace + t.coreAreaOffset + static_cast<uint64_t>(core) * t.coreAreaBytes + PASA_SUM_SLOTS * t.colSumSlotBytes;
}

// ----------------------------------------------------------------------------- pasa
class ShiftKeysCube {
public:
    __aicore__ inline void Run(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR workspace, GM_ADDR tiling,
                               const PasaTilingData& t)
    {
        const uint32_t n = t.kvBlock, d = t.headDim, dc = t.prepCols, mr = t.shiftRows;
        const bool whole = mr == n;  // M^T stays in L0A; else its rows go there in pieces, in turn
        key_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(key));
        shift_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.shiftMatrixOffset), n * n);
        keyPrime_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.keyPrimeOffset));
        batches_.Init(tiling, t);
        pages_.Init(blockTable, keySlots, t);

        pipe_.InitBuffer(shiftL1_, (t.shiftWindow ? mr * (2 * n - mr) : n * n) * sizeof(half));
        pipe_.InitBuffer(onesL1_, kC0 * n * sizeof(half));
        if (whole) {
            pipe_.InitBuffer(shiftL0a_, n * n * sizeof(half));
            pipe_.InitBuffer(onesL0a_, kC0 * n * sizeof(half));
        } else {
            pipe_.InitBuffer(shiftPieces_, 2, mr * n * sizeof(half));
        }
        pipe_.InitBuffer(keyL1_, t.prepKeyBuffers, n * d * sizeof(half));
        pipe_.InitBuffer(keyL0b_, 2, n * dc * sizeof(half));
        outL0c_.Init(pipe_, mr * dc * sizeof(float), t.prepL0cBuffers);

        LocalTensor<half> m1 = shiftL1_.Get<half>(), m2;
        if (t.shiftWindow) {
            StageShiftWindow(m1, n, mr);
        } else {
            StageShiftMatrix(m1, shift_, n);
        }
        if (whole) {
            m2 = shiftL0a_.Get<half>();
            ShiftRowsToL0a(m2, m1, n, 0, n);
            OnesRowToStay(onesL1_.Get<half>(), onesL0a_.Get<half>(), n);
        } else {
            FillOnesRow(onesL1_.Get<half>(), n);
        }

        const uint32_t core = static_cast<uint32_t>(GetBlockIdx());
        KeyBlockIter it(t, batches_, pages_, core);
        StagedKeyBlocks blocks(keyL1_, key_, t, pages_, it);
        KeyBlockTask task;
        LocalTensor<half> k1;
        uint32_t handed = 0, freed = 0;  // blocks handed to the vector cores, and read by them
        GlobalTensor<float> rows;
        rows.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(RowsSlot(workspace, t, core)), n * d);
        while (blocks.Next(task, k1)) {
            const bool tail = task.validRows < n;  // part-filled: M^T K in fp32 to the rows slot; the vector cores finish K'
            // the vector cores have read the ring's slot, and for a part-filled block every block before it (the rows slot)
            const uint32_t read = tail ? handed : SumSlotsRead(handed);
            for (; freed < read; ++freed) CrossCoreWaitFlag(PASA_FLAG_SUM_FREE);
            GlobalTensor<float> sums;
            sums.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(SumSlot(workspace, t, core, handed)), d);
            for (uint32_t d0 = 0; d0 < d; d0 += dc) {  // K'_j's pieces of columns
                const uint32_t cols = Min(dc, d - d0);
                LocalTensor<half> k2 = KeyColumns(keyL1_, keyL0b_, k1, t, d0, cols);
                if (d0 + cols == d) blocks.Refill();  // one key buffer: the next block lands during these Mmads
                for (uint32_t r0 = 0; r0 < n; r0 += mr) {  // and of rows, where M^T is in pieces
                    LocalTensor<half> a = whole ? m2 : ShiftPiece(m1, t, r0);
                    LocalTensor<float> c = outL0c_.Next();
                    Mmad(c, a, k2, MmadParams(static_cast<uint16_t>(mr), static_cast<uint16_t>(cols), static_cast<uint16_t>(n),
                                              PASA_UNIT_FLAG_LAST, false, true));
                    if (!whole) shiftPieces_.FreeTensor(a);
                    const FixpipeParamsV220 out(static_cast<uint16_t>(cols), static_cast<uint16_t>(mr),
                                                 static_cast<uint16_t>(mr), d, false,
                                                 tail ? QuantMode_t::NoQuant : QuantMode_t::F322F16, 0, 1, 0, 0,
                                                 PASA_UNIT_FLAG_LAST);
                    if (tail) {
                        Fixpipe<float, float, CFG_ROW_MAJOR>(rows[static_cast<uint64_t>(r0) * d + d0], c, out);
                    } else {
                        Fixpipe<half, float, CFG_ROW_MAJOR>(
                            keyPrime_[KeyPrimeOffset(t, task.slot) + static_cast<uint64_t>(r0) * d + d0], c, out);
                    }
                }
                LocalTensor<half> ones = whole ? onesL0a_.Get<half>() : OnesInPiece(n);
                LocalTensor<float> sum = outL0c_.Next();
                Mmad(sum, ones, k2, MmadParams(1, static_cast<uint16_t>(cols), static_cast<uint16_t>(n), PASA_UNIT_FLAG_LAST,
                                               false, true));
                if (!whole) shiftPieces_.FreeTensor(ones);
                keyL0b_.FreeTensor(k2);
                Fixpipe<float, float, CFG_ROW_MAJOR>(sums[d0], sum,
                    FixpipeParamsV220(static_cast<uint16_t>(cols), 1, kC0, d, false, QuantMode_t::NoQuant, 0, 1, 0, 0,
                                      PASA_UNIT_FLAG_LAST));
            }
            CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_SUM_READY);
            ++handed;
        }
        for (; freed < handed; ++freed) CrossCoreWaitFlag(PASA_FLAG_SUM_FREE);
    }

private:
    // The row of ones (LoadOnesRow) in a piece's L0A buffer, ready for the cube; the caller frees it.
    __aicore__ inline LocalTensor<half> OnesInPiece(uint32_t n)
    {
        LocalTensor<half> a = shiftPieces_.AllocTensor<half>();
        LoadOnesRow(onesL1_.Get<half>(), a, n);
        shiftPieces_.EnQue(a);
        return shiftPieces_.DeQue<half>();
    }

    // Rows [r0, r0 + shiftRows) of M^T from L1 (M^T whole, or the band of tiling.shiftWindow) into a
    // piece of L0A, ready for the cube; the caller frees it.
    __aicore__ inline LocalTensor<half> ShiftPiece(const LocalTensor<half>& m1, const PasaTilingData& t, uint32_t r0)
    {
        const uint32_t n = t.kvBlock, mr = t.shiftRows;
        LocalTensor<half> a = shiftPieces_.AllocTensor<half>();
        if (t.shiftWindow) {  // each 16-row block's n columns from the band's column n - mr - r0 on
            const uint32_t rowBlock = ((2 * n - mr) / kC0) * kFractal, at = ((n - mr - r0) / kC0) * kFractal;
            for (uint32_t mb = 0; mb < mr / kC0; ++mb) {
                LoadData(a[mb * (n / kC0) * kFractal], m1[mb * rowBlock + at],
                         LoadData2DParams(0, static_cast<uint8_t>(n / kC0), 1, 0, 0, false, 0));
            }
        } else {
            ShiftRowsToL0a(a, m1, n, r0, mr);
        }
        shiftPieces_.EnQue(a);
        return shiftPieces_.DeQue<half>();
    }

    // The band W of tiling.shiftWindow (mr x (2n - mr), Zz) from M^T in GM: its columns [0, n) are
    // M^T's rows [n - mr, n), its columns [n, 2n - mr) M^T's rows [0, mr) past their first mr columns.
    __aicore__ inline void StageShiftWindow(const LocalTensor<half>& m1, uint32_t n, uint32_t mr)
    {
        const uint16_t rowBlock = static_cast<uint16_t>(((2 * n - mr) / kC0) * kFractal);
        DataCopy(m1, shift_[(n - mr) * n], Nd2NzParams(static_cast<uint16_t>(mr / kC0), kC0, static_cast<uint16_t>(n),
                                                        static_cast<uint16_t>(kC0 * n), static_cast<uint16_t>(n), kC0, 1, rowBlock));
        DataCopy(m1[(n / kC0) * kFractal], shift_[mr],
                 Nd2NzParams(static_cast<uint16_t>(mr / kC0), kC0, static_cast<uint16_t>(n - mr), static_cast<uint16_t>(kC0 * n),
                             static_cast<uint16_t>(n), kC0, 1, rowBlock));
        OrderPipes<HardEvent::MTE2_MTE1>();
    }

    TPipe pipe_;
    TBuf<TPosition::A1> onesL1_, shiftL1_;
    TBuf<TPosition::A2> shiftL0a_, onesL0a_;
    TQue<TPosition::A2, 2> shiftPieces_;
    KeyBlockL1 keyL1_;
    TQue<TPosition::B2, 2> keyL0b_;
    L0cRing outL0c_;
    GlobalTensor<half> key_, shift_, keyPrime_;
    BatchTable batches_;
    KvPages pages_;
};

// `count` elements of K' rows, cast into `kout` of the vector's output queue, -> `dst` in GM; the
// queue's flags order the copy after the cast and the next cast after the copy.
template <typename OutQueue>
__aicore__ inline void StoreKeyRows(OutQueue& queue, LocalTensor<half> kout, const GlobalTensor<half>& dst, uint32_t count)
{
    queue.EnQue(kout);
    kout = queue.template DeQue<half>();
    DataCopy(dst, kout, count);
    queue.FreeTensor(kout);
}

// Every block of this AI Core's tasks: the first AIV stores its key mean fl16(colsum fl32(r / v))
// (fp32 colsum from the cube, r = tiling.shiftRowSum; one rounded fp32 division, exact for a full
// block); a part-filled block's K', half the rows each AIV: K'_i = fp16(R_i - c colsum) for the
// block's v keys (R = M^T K from the cube, fp32; c = off (n - v) / v in fp32: an exact product, one
// rounded division), zero past v; whole-tile instructions, each row minus the same row (src1
// repeat stride 0).
class ShiftKeysVector {
public:
    __aicore__ inline void Run(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR workspace, GM_ADDR tiling,
                               const PasaTilingData& t)
    {
        const uint32_t n = t.kvBlock, d = t.headDim, half_n = n / 2;
        const uint32_t core = static_cast<uint32_t>(GetBlockIdx()) / 2, sub = static_cast<uint32_t>(GetSubBlockIdx());
        keyPrime_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.keyPrimeOffset));
        keyMean_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.keyMeanOffset));
        batches_.Init(tiling, t);
        pages_.Init(blockTable, keySlots, t);

        pipe_.InitBuffer(sumIn_, 1, d * sizeof(float));
        const uint32_t pr = t.prepVecRows;  // a part-filled block's rows of this AIV's half at once
        pipe_.InitBuffer(rowsIn_, 1, pr * d * sizeof(float));
        pipe_.InitBuffer(keyOut_, 1, pr * d * sizeof(half));
        pipe_.InitBuffer(meanOut_, 1, d * sizeof(half));
        pipe_.InitBuffer(calc_, d * sizeof(float));
        LocalTensor<float> shift = calc_.Get<float>();
        const float off = t.shiftOff;

        const uint32_t r0 = sub * half_n;  // this AIV's rows of the block
        KeyBlockIter it(t, batches_, pages_, core);
        KeyBlockTask task;
        uint32_t handed = 0;
        GlobalTensor<float> rowsSlot;
        rowsSlot.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(RowsSlot(workspace, t, core)), n * d);
        while (it.Next(task)) {
            const bool tail = task.validRows < n;
            GlobalTensor<float> sums;
            sums.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(SumSlot(workspace, t, core, handed++)), d);
            CrossCoreWaitFlag(PASA_FLAG_SUM_READY);
            if (sub != 0 && !tail) {  // a whole block: the first AIV stores its mean
                CrossCoreSetFlag<2, PIPE_MTE2>(PASA_FLAG_SUM_FREE);
                continue;
            }
            LocalTensor<float> sum = sumIn_.AllocTensor<float>(), rows;
            DataCopy(sum, sums, d);
            if (tail) rows = CopyRows(rowsSlot, r0, pr, d);
            sumIn_.EnQue(sum);
            sum = sumIn_.DeQue<float>();
            // the slots read (a part-filled block's rows in pieces: once its last piece is)
            if (!tail || pr == half_n) CrossCoreSetFlag<2, PIPE_MTE2>(PASA_FLAG_SUM_FREE);
            if (sub == 0) {
                const float rho = tail ? t.shiftRowSum / static_cast<float>(task.validRows) : t.shiftRowSum * t.invKvBlock;
                Muls(shift, sum, rho, static_cast<int32_t>(d));
                LocalTensor<half> m = meanOut_.AllocTensor<half>();
                Cast(m, shift, RoundMode::CAST_RINT, d);
                meanOut_.EnQue(m);
                m = meanOut_.DeQue<half>();
                DataCopy(keyMean_[KeyMeanOffset(t, task.slot)], m, d);
                meanOut_.FreeTensor(m);
            }
            if (!tail) {
                sumIn_.FreeTensor(sum);
                continue;
            }
            const float c = off * static_cast<float>(n - task.validRows) / static_cast<float>(task.validRows);
            Muls(shift, sum, c, static_cast<int32_t>(d));
            sumIn_.FreeTensor(sum);
            for (uint32_t p0 = r0; p0 < r0 + half_n; p0 += pr) {  // the pieces of this AIV's rows
                if (p0 > r0) rows = CopyRows(rowsSlot, p0, pr, d);
                SubtractFromEachRow(rows, shift, pr, d);
                const uint32_t valid = task.validRows > p0 ? Min(task.validRows - p0, pr) : 0;
                if (valid < pr) Duplicate(rows[valid * d], 0.0f, static_cast<int32_t>((pr - valid) * d));
                LocalTensor<half> kout = keyOut_.AllocTensor<half>();
                Cast(kout, rows, RoundMode::CAST_RINT, pr * d);
                rowsIn_.FreeTensor(rows);
                StoreKeyRows(keyOut_, kout, keyPrime_[KeyPrimeOffset(t, task.slot) + static_cast<uint64_t>(p0) * d], pr * d);
            }
            if (pr < half_n) CrossCoreSetFlag<2, PIPE_MTE2>(PASA_FLAG_SUM_FREE);
        }
    }

private:
    // Rows [p0, p0 + rows) of a part-filled block's M^T K (fp32, its slot) -> UB, ready for the vector.
    __aicore__ inline LocalTensor<float> CopyRows(const GlobalTensor<float>& slot, uint32_t p0, uint32_t rows, uint32_t d)
    {
        LocalTensor<float> r = rowsIn_.AllocTensor<float>();
        DataCopy(r, slot[p0 * d], rows * d);
        rowsIn_.EnQue(r);
        return rowsIn_.DeQue<float>();
    }

    TPipe pipe_;
    TQue<TPosition::VECIN, 1> sumIn_, rowsIn_;
    TQue<TPosition::VECOUT, 1> keyOut_, meanOut_;
    TBuf<TPosition::VECCALC> calc_;
    GlobalTensor<half> keyPrime_, keyMean_;
    BatchTable batches_;
    KvPages pages_;
};

// ----------------------------------------------------------------------------- pasa-exact
class CenterKeysCube {
public:
    __aicore__ inline void Run(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR workspace, GM_ADDR tiling,
                               const PasaTilingData& t)
    {
        const uint32_t n = t.kvBlock, d = t.headDim, dc = t.prepCols;
        const uint32_t core = static_cast<uint32_t>(GetBlockIdx());
        key_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(key));
        batches_.Init(tiling, t);
        pages_.Init(blockTable, keySlots, t);

        pipe_.InitBuffer(onesL1_, kC0 * n * sizeof(half));
        pipe_.InitBuffer(onesL0a_, kC0 * n * sizeof(half));
        pipe_.InitBuffer(keyL1_, t.prepKeyBuffers, n * d * sizeof(half));
        pipe_.InitBuffer(keyL0b_, 2, n * dc * sizeof(half));
        sumL0c_.Init(pipe_, kC0 * dc * sizeof(float));

        LocalTensor<half> o2 = onesL0a_.Get<half>();
        OnesRowToStay(onesL1_.Get<half>(), o2, n);

        KeyBlockIter it(t, batches_, pages_, core);
        StagedKeyBlocks blocks(keyL1_, key_, t, pages_, it);
        KeyBlockTask task;
        LocalTensor<half> k1;
        uint32_t handed = 0, freed = 0;  // blocks handed to the vector cores, and read by them
        while (blocks.Next(task, k1)) {
            GlobalTensor<float> sums;
            sums.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(SumSlot(workspace, t, core, handed)), d);
            for (uint32_t d0 = 0; d0 < d; d0 += dc) {  // the column sums' pieces
                const uint32_t cols = Min(dc, d - d0);
                LocalTensor<half> k2 = KeyColumns(keyL1_, keyL0b_, k1, t, d0, cols);
                if (d0 + cols == d) blocks.Refill();  // one key buffer: the next block lands during these Mmads
                LocalTensor<float> c = sumL0c_.Next();
                Mmad(c, o2, k2, MmadParams(1, static_cast<uint16_t>(cols), static_cast<uint16_t>(n), PASA_UNIT_FLAG_LAST,
                                           false, true));
                keyL0b_.FreeTensor(k2);
                for (; freed < SumSlotsRead(handed); ++freed) CrossCoreWaitFlag(PASA_FLAG_SUM_FREE);  // the ring's slot
                Fixpipe<float, float, CFG_ROW_MAJOR>(sums[d0], c,
                    FixpipeParamsV220(static_cast<uint16_t>(cols), 1, kC0, d, false, QuantMode_t::NoQuant, 0, 1, 0, 0,
                                      PASA_UNIT_FLAG_LAST));
            }
            CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_SUM_READY);
            ++handed;
        }
        for (; freed < handed; ++freed) CrossCoreWaitFlag(PASA_FLAG_SUM_FREE);
    }

private:
    TPipe pipe_;
    TBuf<TPosition::A1> onesL1_;
    TBuf<TPosition::A2> onesL0a_;
    KeyBlockL1 keyL1_;
    TQue<TPosition::B2, 2> keyL0b_;
    L0cRing sumL0c_;
    GlobalTensor<half> key_;
    BatchTable batches_;
    KvPages pages_;
};

class CenterKeysVector {
public:
    __aicore__ inline void Run(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR workspace, GM_ADDR tiling,
                               const PasaTilingData& t)
    {
        const uint32_t n = t.kvBlock, d = t.headDim, half_n = n / 2;
        const uint32_t core = static_cast<uint32_t>(GetBlockIdx()) / 2, sub = static_cast<uint32_t>(GetSubBlockIdx());
        key_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(key));
        keyPrime_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.keyPrimeOffset));
        keyMean_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(workspace + t.keyMeanOffset));
        batches_.Init(tiling, t);
        pages_.Init(blockTable, keySlots, t);

        const uint32_t pr = t.prepVecRows;  // rows of this AIV's half at once
        pipe_.InitBuffer(sumIn_, 1, d * sizeof(float));
        pipe_.InitBuffer(keyIn_, 1, pr * d * sizeof(half));
        pipe_.InitBuffer(keyOut_, 1, pr * d * sizeof(half));
        pipe_.InitBuffer(meanOut_, 1, d * sizeof(half));
        pipe_.InitBuffer(calc_, 2 * d * sizeof(float) + pr * d * sizeof(float));
        LocalTensor<float> mean32 = calc_.Get<float>();
        LocalTensor<half> mean16 = mean32[d].ReinterpretCast<half>();
        LocalTensor<float> rows32 = mean32[2 * d];  // this AIV's rows of the block, fp32

        const uint32_t r0 = sub * half_n, r1 = r0 + half_n;  // this AIV's rows of the block
        const uint32_t keyStride = RowStride(t.kvLayout, t.numKvHeads, d);
        KeyBlockIter it(t, batches_, pages_, core);
        KeyBlockTask task;
        uint32_t handed = 0;
        while (it.Next(task)) {
            GlobalTensor<float> sums;
            sums.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(SumSlot(workspace, t, core, handed++)), d);
            CrossCoreWaitFlag(PASA_FLAG_SUM_READY);
            LocalTensor<float> sum = sumIn_.AllocTensor<float>();
            DataCopy(sum, sums, d);
            sumIn_.EnQue(sum);
            CrossCoreSetFlag<2, PIPE_MTE2>(PASA_FLAG_SUM_FREE);
            sum = sumIn_.DeQue<float>();
            // mean16 = fp16(colsum / v) over the block's v keys: for a full block the fp32 multiply
            // by 1/n is exact (n is a power of two); a part-filled one divides by v
            if (task.validRows < n) {
                Duplicate(rows32, static_cast<float>(task.validRows), static_cast<int32_t>(d));
                Div(mean32, sum, rows32, static_cast<int32_t>(d));
            } else {
                Muls(mean32, sum, t.invKvBlock, static_cast<int32_t>(d));
            }
            sumIn_.FreeTensor(sum);
            Cast(mean16, mean32, RoundMode::CAST_RINT, d);
            Cast(mean32, mean16, RoundMode::CAST_NONE, d);
            if (sub == 0) {
                LocalTensor<half> m = meanOut_.AllocTensor<half>();
                Muls(m, mean16, half(1.0f), static_cast<int32_t>(d));
                meanOut_.EnQue(m);
                m = meanOut_.DeQue<half>();
                DataCopy(keyMean_[KeyMeanOffset(t, task.slot)], m, d);
                meanOut_.FreeTensor(m);
            }

            // this AIV's rows, a piece of pr at a time: K (zero past kv_len) -> fp16((K - mean16) * scale)
            for (uint32_t p0 = r0; p0 < r1; p0 += pr) {
                const uint32_t valid = task.validRows > p0 ? Min(task.validRows, p0 + pr) - p0 : 0;
                LocalTensor<half> kin = keyIn_.AllocTensor<half>();
                if (valid > 0) {
                    const uint64_t src = KvRowOffset(t, pages_, task.b, task.kvHead, task.kvStart,
                                                     static_cast<int64_t>(task.block) * n + p0, d);
                    DataCopy(kin, key_[src], DataCopyParams(static_cast<uint16_t>(valid), static_cast<uint16_t>(d * sizeof(half) / 32),
                                                            static_cast<uint16_t>((keyStride - d) * sizeof(half) / 32), 0));
                }
                keyIn_.EnQue(kin);
                kin = keyIn_.DeQue<half>();
                // whole tile: rows past kv_len are zeros, each row minus the same mean16 row (src1
                // repeat stride 0), scaled in fp32, rounded once
                LocalTensor<half> kout = keyOut_.AllocTensor<half>();
                if (valid > 0) Cast(rows32, kin, RoundMode::CAST_NONE, valid * d);
                if (valid < pr) Duplicate(rows32[valid * d], 0.0f, static_cast<int32_t>((pr - valid) * d));
                SubtractFromEachRow(rows32, mean32, pr, d);
                Muls(rows32, rows32, t.scale, static_cast<int32_t>(pr * d));
                if (valid < pr) Duplicate(rows32[valid * d], 0.0f, static_cast<int32_t>((pr - valid) * d));  // K' = 0 past v
                Cast(kout, rows32, RoundMode::CAST_RINT, pr * d);
                keyIn_.FreeTensor(kin);
                StoreKeyRows(keyOut_, kout, keyPrime_[KeyPrimeOffset(t, task.slot) + static_cast<uint64_t>(p0) * d], pr * d);
            }
        }
    }

private:
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> sumIn_, keyIn_;
    TQue<TPosition::VECOUT, 1> keyOut_, meanOut_;
    TBuf<TPosition::VECCALC> calc_;
    GlobalTensor<half> key_, keyPrime_, keyMean_;
    BatchTable batches_;
    KvPages pages_;
};


// This core's share of the key preprocessing of the call (t.tilingKey: pasa shifts, pasa-exact
// centres), run by the preprocessing launch or at the start of the attention launch
// (t.prepInAttention); cores from t.prepDim on have no key block.
__aicore__ inline void PrepareKeys(GM_ADDR key, GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR workspace, GM_ADDR tiling,
                                   const PasaTilingData& t)
{
    if ASCEND_IS_AIC {
        if (t.tilingKey == PASA_KEY_PASA) {
            ShiftKeysCube op;
            op.Run(key, blockTable, keySlots, workspace, tiling, t);
        } else {
            CenterKeysCube op;
            op.Run(key, blockTable, keySlots, workspace, tiling, t);
        }
    }
    if ASCEND_IS_AIV {
        if (t.tilingKey == PASA_KEY_PASA) {
            ShiftKeysVector op;
            op.Run(key, blockTable, keySlots, workspace, tiling, t);
        } else {
            CenterKeysVector op;
            op.Run(key, blockTable, keySlots, workspace, tiling, t);
        }
    }
}

}  // namespace pasa

#endif  // PASA_PREPARE_KEYS_H
