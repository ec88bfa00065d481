// The cube side (AIC) of the PASA attention kernel: per task, Q once into L1, then for every
// visible kv block j the score tile S'_j = Q K'_j^T and, PASA_LOOKAHEAD blocks later, P'_j V_j.
//
// Pipeline. The AI Core's tasks form one stream of kv blocks; the cube computes the score tile
// of block g and then, once L = PASA_LOOKAHEAD score tiles are ahead, P'V of block g - L: it
// runs L score tiles ahead of the P' it waits for, across task boundaries, so the vector cores
// always have tiles queued. Each task's Q is loaded into L1 while the previous task is being
// scored (with one Q buffer, tiling.queryBuffers, once its last score tile is made, during the P'V
// that follows); a tile of one head holds Q as Zz, so that each piece of its rows is one load into
// L0A. After each score tile the cube copies the operands of the steps to come into L1 and then
// queues them, so that one wait on the MTE2 pipe covers all their GM reads: the next score tile's
// keys, and, when a P'V follows, its P' and the values of the P'V after it (two value buffers),
// which land while that P'V runs. The L1 buffer counts (PASA_*_BUFFERS) stay within TPipe's 8
// MTE1_MTE2 event IDs. L0A, L0B and L0C are ping-pong pairs: the next operand loads while the
// current Mmad runs, and a Fixpipe drains one L0C tile while the next Mmad fills the other (L0C
// handed over by unitFlag, L0cRing).
//
// A tile of more rows than tiling.cubeRows is multiplied in pieces of that many rows (L0A and L0C
// hold a piece): the key or value block stays in L0B for all of them, the row constants' Mmad takes
// the pieces' Q rows one after the other. A block of more keys than tiling.cubeKeys is held a piece
// of cubeKeys keys (every head dim column) at a time: K lies in L1 as NZ pieces of cubeKeys keys, each
// with C0 stride cubeKeys, so that a piece is one load into L0B (a key buffer holds
// tiling.keyBufferKeys keys of the block: where that is a part of it, the first parts, one per key
// buffer, come with the operands queued ahead of the score tile, each later one lands in the
// buffer a multiplied part left); each key piece stays in L0B for every piece of rows, the score
// tile is produced a piece of its columns at a time, and P'V accumulates over the key pieces of
// its contraction in L0C, in key order. P' lies in L1 whole, or (tiling.probBufferKeys) in parts of
// one piece of rows and some of the keys, taken row piece by row piece: the first parts, one per P'
// buffer, come with the operands queued ahead of the P'V, each later one lands in the buffer a
// multiplied part left. A head dim of more columns than tiling.cubeCols (L0B holds
// that many of a K or V block) is cut into pieces of cubeCols: the score and row-constant Mmads
// accumulate over the pieces of their contraction in L0C, in the order of the whole one; P'V
// produces its columns piece by piece.
//
// Keys and values come from the dense tensors (at the batch's start when packed) or, paged,
// through the block table: a kv block is copied in runs that each stay inside one physical block.
//
// shiftScores (pasa and pasa-exact in decode: query length 1, every kv block read by one task):
// the score tile is Q K_j^T of the raw keys, drained in fp32 as fa-fp32's is, and the vector cores
// apply the shift to it (docs/design.md, "Shifting the scores in decode"): no K', no block means,
// no row constants. The rows of a part-filled block past its keys are zero in L1, so that the
// block's score row sums run over its keys.
//
// With K' (tiling.rowConstants): the row constants c_j = Q . mean_j of up to PASA_CONST_BLOCKS
// blocks, mean_j the block's fp16 key mean from the preprocessing (pasa: of its unrounded K', so
// that c_j is the row mean of its unrounded S'; pasa-exact: mean16 of K), come from one Mmad per
// chunk (C^T = Means Q^T, rows = blocks) into a per-core slot (a ring of PASA_CONST_SLOTS: the cube
// may score that many chunks ahead), before the chunk's first score tile; the vector cores read
// row j of it.
//
// pasa: once a row piece's P'V is drained, the pieces of P' still in L0A are multiplied by a block of
// ones (filled in L0B), and the row sums l' = fp16(sum P') (fp32 in L0C, rounded by the Fixpipe) fill
// 16 more columns of the P'V tile (tiling.pvCols): the vector cores fold them into l as they fold
// P'V into O. A block of more key pieces than L0A's two buffers keep multiplies each piece of P' by
// the ones right after its P'V Mmad, the ones beside the piece's values in L0B, the sums accumulating
// in an L0C buffer of their own, in key order.
#ifndef PASA_ATTENTION_CUBE_H
#define PASA_ATTENTION_CUBE_H

#include "pasa_workspace.h"

namespace pasa {

// T: the type of Q, K, V and P' (half; bfloat16_t for fa-fp32 with bf16 inputs).
template <typename T>
class AttentionCube {
public:
    __aicore__ inline void Run(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR blockTable, GM_ADDR keySlots,
                               GM_ADDR workspace, GM_ADDR tiling, const PasaTilingData& t)
    {
        t_ = &t;
        key_ = t.tilingKey;
        rawKeys_ = key_ == PASA_KEY_FA_FP32 || t.shiftScores;
        constants_ = t.rowConstants != 0;
        query_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        value_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        keys_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(rawKeys_ ? key : workspace + t.keyPrimeOffset));
        primes_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + t.keyPrimeOffset));
        keyMean_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(workspace + t.keyMeanOffset));
        slots_.Init(workspace, t, static_cast<uint32_t>(GetBlockIdx()));
        batches_.Init(tiling, t);
        pages_.Init(blockTable, keySlots, t);
        TaskWindow win(t, batches_, static_cast<uint32_t>(GetBlockIdx()), workspace);
        if (t.repair && !win.Has(0)) return;  // the repair launch: no flagged task on this core

        pipe_.InitBuffer(queryL1_, t.queryBuffers, t.l1QueryBytes);
        pipe_.InitBuffer(keyL1_, PASA_KEY_BUFFERS, t.l1KeyBytes);
        pipe_.InitBuffer(valueL1_, t.valueBuffers, t.l1ValueBytes);
        pipe_.InitBuffer(probL1_, t.probBuffers, t.l1ProbBytes);
        if (constants_) pipe_.InitBuffer(meanL1_, PASA_MEAN_BUFFERS, t.l1MeanBytes);
        pipe_.InitBuffer(l0a_, 2, t.l0aBytes);
        pipe_.InitBuffer(l0b_, 2, t.l0bBytes);
        l0c_.Init(pipe_, t.l0cBytes);
        valueZz_ = ZzCopyReaches(RowStride(t.kvLayout, t.numKvHeads, t.headDimV));
        queryZz_ = ZzCopyReaches(RowStride(t.qLayout, t.numHeads, t.headDim));

        Stream(win);
    }

private:
    // Tasks that see no key are skipped (the vector cores write their zeros), up to task `limit`:
    // the window's ring holds kTaskWindow tasks from the P'V cursor's on, so a cursor must not
    // fetch a task that would take the slot of one still in flight.
    __aicore__ inline bool NextBlock(TaskWindow& win, BlockCursor& c, uint32_t limit) const
    {
        while (c.task < limit && win.Has(c.task) && win.Get(c.task).numBlocks == 0) ++c.task;
        return c.task < limit && win.Has(c.task);
    }

    __aicore__ inline void Stream(TaskWindow& win)
    {
        BlockCursor score, pv;
        uint32_t ahead = 0;  // score tiles computed whose P'V is not
        uint32_t valuesQueued = 0;  // V blocks in L1 from the P'V cursor's on
        bool queryQueued = false, keysQueued = false;
        LocalTensor<T> q1;
        while (true) {
            bool probQueued = false;  // a score tile came first and queued the P' of this P'V
            if (ahead == 0) pv = score;  // nothing in flight: P'V resumes where scoring does
            // the score cursor stays one task short of the window's end: its Q preload takes the next
            if (NextBlock(win, score, pv.task + kTaskWindow - 1)) {
                const AttentionTask& task = win.Get(score.task);
                if (score.block == 0) {
                    if (!queryQueued) LoadQuery(task, true);
                    q1 = queryL1_.DeQue<T>();
                }
                if (!keysQueued) QueueKeys(task, task.blockBegin + score.block);
                LocalTensor<T> k1 = keyL1_.DeQue<T>();
                if (constants_ && score.block % PASA_CONST_BLOCKS == 0) RowConstants(task, q1, score.block);
                // the next task's Q loads while this one is scored (copied after the row constants' means,
                // which RowConstants waits for)
                if (score.block == 0 && t_->queryBuffers > 1) queryQueued = QueueNextQuery(win, score, pv);
                Scores(task, task.blockBegin + score.block, q1, k1);
                if (score.block + 1 == task.numBlocks) {
                    queryL1_.FreeTensor(q1);
                    // one Q buffer: the next task's Q loads during the P'V that follows
                    if (t_->queryBuffers == 1) queryQueued = QueueNextQuery(win, score, pv);
                }
                win.Advance(score);
                probQueued = ++ahead > PASA_LOOKAHEAD;  // a P'V follows: its P' comes with the operands
                keysQueued = QueueOperands(win, score, pv, probQueued, valuesQueued);
                if (ahead <= PASA_LOOKAHEAD) continue;
            } else if (ahead == 0) {
                if (!win.Has(score.task)) break;  // the stream's end
                continue;  // tasks without keys up to the window's end: it moves on with the cursors
            }
            NextBlock(win, pv, pv.task + kTaskWindow);
            const AttentionTask& task = win.Get(pv.task);
            if (valuesQueued == 0) {
                valueL1_.EnQue(CopyValue(task, task.blockBegin + pv.block));
                ++valuesQueued;
            }
            LocalTensor<T> v1 = valueL1_.DeQue<T>();
            --valuesQueued;
            if (!probQueued) QueueProb(task);
            LocalTensor<T> p1 = probL1_.DeQue<T>();
            Pv(task, v1, p1);
            win.Advance(pv);
            --ahead;
            // one V buffer: the next P'V's values land during the score tile that follows
            if (t_->valueBuffers == 1 && ahead > 0) valuesQueued = QueueNextValues(win, pv);
        }
    }

    // After a score tile, the operands of the steps to come, all copied before any is queued so that
    // one wait covers their GM reads: the keys of the score cursor's next tile, or its first parts
    // (CopyFirstKeyParts; returns whether it has one), and, when a P'V follows (`pvNext`), its P'
    // and, where a value buffer is free, the values of the first block from the P'V cursor's on
    // whose V is not in L1 yet (one the cube has scored: the V of the P'V after next is on its way
    // while that P'V runs).
    __aicore__ inline bool QueueOperands(TaskWindow& win, const BlockCursor& score, const BlockCursor& pv, bool pvNext,
                                         uint32_t& valuesQueued)
    {
        BlockCursor keys = score, values = pv;
        const bool keysNext = NextBlock(win, keys, pv.task + kTaskWindow - 1);
        bool valuesNext = pvNext && NextBlock(win, values, pv.task + kTaskWindow);
        const AttentionTask* pvTask = valuesNext ? &win.Get(values.task) : nullptr;  // the P'V that follows
        valuesNext = valuesNext && valuesQueued < t_->valueBuffers;
        for (uint32_t i = 0; valuesNext && i < valuesQueued; ++i) {
            win.Advance(values);
            valuesNext = NextBlock(win, values, pv.task + kTaskWindow);
        }
        valuesNext = valuesNext && (values.task < score.task || (values.task == score.task && values.block < score.block));
        LocalTensor<T> k1[PASA_KEY_BUFFERS], v1, p1[PASA_PROB_PART_BUFFERS];
        const uint32_t keyParts =
            keysNext ? CopyFirstKeyParts(win.Get(keys.task), win.Get(keys.task).blockBegin + keys.block, k1) : 0;
        if (valuesNext) v1 = CopyValue(win.Get(values.task), win.Get(values.task).blockBegin + values.block);
        const uint32_t probParts = pvNext ? CopyFirstProbParts(*pvTask, p1) : 0;
        for (uint32_t p = 0; p < keyParts; ++p) keyL1_.EnQue(k1[p]);
        if (valuesNext) {
            valueL1_.EnQue(v1);
            ++valuesQueued;
        }
        for (uint32_t p = 0; p < probParts; ++p) probL1_.EnQue(p1[p]);
        return keysNext;
    }

    // The values of the P'V cursor's block (one the cube has scored), queued; returns how many are.
    __aicore__ inline uint32_t QueueNextValues(TaskWindow& win, const BlockCursor& pv)
    {
        BlockCursor values = pv;
        if (!NextBlock(win, values, pv.task + kTaskWindow)) return 0;
        valueL1_.EnQue(CopyValue(win.Get(values.task), win.Get(values.task).blockBegin + values.block));
        return 1;
    }

    // Loads the Q of the next task with keys after the score cursor's, when the window holds it.
    __aicore__ inline bool QueueNextQuery(TaskWindow& win, const BlockCursor& score, const BlockCursor& pv)
    {
        BlockCursor next{score.task + 1, 0};
        if (!NextBlock(win, next, pv.task + kTaskWindow)) return false;
        LoadQuery(win.Get(next.task), false);
        return true;
    }

    __aicore__ inline uint32_t Rows16(const AttentionTask& task) const { return Align16(task.rows); }
    __aicore__ inline uint32_t ValidKeys(const AttentionTask& task, uint32_t j) const
    {
        return Min(t_->kvBlock, static_cast<uint32_t>(task.info.kvLen) - j * t_->kvBlock);
    }

    // Whether the task's Q is laid out Zz in L1 (16-row blocks, each block's column fractals
    // together: a piece of rows is then one load into L0A) or NZ with C0 stride qTilePad (tiles of
    // stacked heads, and row strides past the DMA's 16-bit stride between 16-row blocks).
    __aicore__ inline bool QueryZz(const AttentionTask& task) const { return queryZz_ && task.heads == 1; }

    // The tile's Q rows (each stacked head's positions) -> L1, Zz or NZ (QueryZz), queued; with
    // `withMeans` (a Q not preloaded, and row constants) also the means of its first PASA_CONST_BLOCKS
    // blocks, copied before either is queued so that one wait covers both reads (RowConstants takes
    // them; a preload leaves the means buffer to the task being scored).
    __aicore__ inline void LoadQuery(const AttentionTask& task, bool withMeans)
    {
        const PasaTilingData& t = *t_;
        const uint32_t d = t.headDim, row = static_cast<uint32_t>(task.info.qStart) + task.q0;
        const uint32_t stride = RowStride(t.qLayout, t.numHeads, d);
        LocalTensor<T> q1 = queryL1_.AllocTensor<T>();
        if (QueryZz(task)) {
            CopyZz(q1, query_, RowOffset(t.qLayout, TensorBatch(t, task.b), task.head0, row, t.numHeads, t.seqQ, d),
                   task.positions, d, stride);
        } else {
            for (uint32_t h = 0; h < task.heads; ++h) {
                DataCopy(q1[h * task.pitch * kC0],
                         query_[RowOffset(t.qLayout, TensorBatch(t, task.b), task.head0 + h, row, t.numHeads, t.seqQ, d)],
                         Nd2NzParams(1, static_cast<uint16_t>(task.positions), static_cast<uint16_t>(d), 0,
                                     static_cast<uint16_t>(stride), static_cast<uint16_t>(t.qTilePad), 1, 0));
            }
        }
        LocalTensor<T> m1;
        if (withMeans && constants_) m1 = CopyMeans(task, 0);
        queryL1_.EnQue(q1);
        if (withMeans && constants_) {
            meanL1_.EnQue(m1);
            meansQueued_ = true;
        }
    }

    // Rows [m0, m0 + rowsPad) and columns [k0, k0 + cols) of the task's Q in L1 -> the Zz A operand
    // in L0A, ready for the cube: Zz, one load when the piece is every column.
    __aicore__ inline LocalTensor<T> QueryToL0a(const AttentionTask& task, const LocalTensor<T>& q1, uint32_t m0,
                                                uint32_t rowsPad, uint32_t k0, uint32_t cols)
    {
        const uint32_t d = t_->headDim;
        if (!QueryZz(task)) return ToL0a(q1[m0 * kC0 + k0 * t_->qTilePad], rowsPad / kC0, cols / kC0, t_->qTilePad);
        LocalTensor<T> a2 = l0a_.AllocTensor<T>();
        if (cols == d) {
            LoadData(a2, q1[m0 * d], LoadData2DParams(0, static_cast<uint8_t>((rowsPad / kC0) * (d / kC0)), 1, 0, 0, false, 0));
        } else {
            for (uint32_t mb = 0; mb < rowsPad / kC0; ++mb) {
                LoadData(a2[mb * (cols / kC0) * kFractal], q1[(m0 + mb * kC0) * d + k0 * kC0],
                         LoadData2DParams(0, static_cast<uint8_t>(cols / kC0), 1, 0, 0, false, 0));
            }
        }
        l0a_.EnQue(a2);
        return l0a_.DeQue<T>();
    }

    // The first `rowBlocks` 16-row blocks and `colBlocks` column blocks of an NZ tile (C0 stride c0Rows)
    // -> an A operand (Zz) in L0A, ready for the cube.
    __aicore__ inline LocalTensor<T> ToL0a(const LocalTensor<T>& l1, uint32_t rowBlocks, uint32_t colBlocks, uint32_t c0Rows)
    {
        LocalTensor<T> a2 = l0a_.AllocTensor<T>();
        for (uint32_t mb = 0; mb < rowBlocks; ++mb) {
            LoadData(a2[mb * colBlocks * kFractal], l1[mb * kFractal],
                     LoadData2DParams(0, static_cast<uint8_t>(colBlocks), static_cast<uint16_t>(c0Rows / kC0), 0, 0, false, 0));
        }
        l0a_.EnQue(a2);
        return l0a_.DeQue<T>();
    }

    // Keys [k0, k0 + keys) of `colBlocks` column blocks of a key block in L1 (NZ pieces of cubeKeys keys,
    // one after the other, each with C0 stride cubeKeys) -> the Zn B operand in L0B (k = those
    // columns), ready for the cube: one load when the piece is every column.
    __aicore__ inline LocalTensor<T> KeysToL0b(const LocalTensor<T>& l1, uint32_t colBlocks, uint32_t k0, uint32_t keys)
    {
        LocalTensor<T> b2 = l0b_.AllocTensor<T>();
        LoadData(b2, l1[k0 * t_->headDim], LoadData2DParams(0, static_cast<uint8_t>(colBlocks * (keys / kC0)), 1, 0, 0, false, 0));
        l0b_.EnQue(b2);
        return l0b_.DeQue<T>();
    }

    // Rows [m0, m0 + rowsPad) and keys [k0, k0 + keys) of P' in a P' buffer (Zz within each piece of
    // cubeKeys keys, the pieces one after the other, ProbPitch rows apart) -> the Zz A operand in
    // L0A, ready for the cube: one load.
    __aicore__ inline LocalTensor<T> ProbToL0a(const LocalTensor<T>& p1, uint32_t m0, uint32_t rowsPad, uint32_t k0,
                                               uint32_t keys)
    {
        LocalTensor<T> a2 = l0a_.AllocTensor<T>();
        LoadData(a2, p1[k0 * ProbPitch() + (m0 / kC0) * (keys / kC0) * kFractal],
                 LoadData2DParams(0, static_cast<uint8_t>((rowsPad / kC0) * (keys / kC0)), 1, 0, 0, false, 0));
        l0a_.EnQue(a2);
        return l0a_.DeQue<T>();
    }

    // Keys [k0, k0 + keys) and columns [v0, v0 + cols) of a value block in L1 (Zz or NZ, LoadValue) ->
    // the B operand of P'V in L0B (each fractal transposed), ready for the cube; with `ones`, a
    // block of keys x 16 ones after it (the B operand of P''s row sums).
    __aicore__ inline LocalTensor<T> ValuesToL0b(const LocalTensor<T>& v1, uint32_t v0, uint32_t cols, uint32_t k0,
                                                 uint32_t keys, bool ones = false)
    {
        const uint32_t n = t_->kvBlock, dv = t_->headDimV, colBlocks = cols / kC0;
        LocalTensor<T> b2 = l0b_.AllocTensor<T>();
        if (valueZz_ && cols == dv) {  // the piece's 16-row blocks are together
            LoadData(b2, v1[k0 * dv], LoadData2DParams(0, static_cast<uint8_t>((keys / kC0) * colBlocks), 1, 0, 0, true, 0));
        } else {
            for (uint32_t kb = k0 / kC0; kb < (k0 + keys) / kC0; ++kb) {  // Zz: a row block's column fractals together; NZ: C0 stride n
                const uint32_t at = valueZz_ ? (kb * (dv / kC0) + v0 / kC0) * kFractal : kb * kFractal + v0 * n;
                LoadData(b2[(kb - k0 / kC0) * colBlocks * kFractal], v1[at],
                         LoadData2DParams(0, static_cast<uint8_t>(colBlocks), static_cast<uint16_t>(valueZz_ ? 1 : n / kC0),
                                          0, 0, true, 0));
            }
        }
        if (ones) Fill(b2[keys * cols], InitConstValueParams<T>(1, static_cast<uint16_t>(keys / kC0), 0, T(1.0f)));
        l0b_.EnQue(b2);
        return l0b_.DeQue<T>();
    }

    // An L0C tile (rows x cols, rows padded to mp) to a GM slot, row-major: fp32 for fa-fp32, the
    // row constants and (shiftScores) the raw score tiles, rounded to fp16 by the Fixpipe otherwise.
    // `pitch`: elements between the destination's rows (0: cols).
    template <typename Out>
    __aicore__ inline void Drain(GM_ADDR dst, const LocalTensor<float>& c, uint32_t cols, uint32_t rows, uint32_t mp,
                                 QuantMode_t quant, uint32_t pitch = 0)
    {
        GlobalTensor<Out> g;
        g.SetGlobalBuffer(reinterpret_cast<__gm__ Out*>(dst));
        Fixpipe<Out, float, CFG_ROW_MAJOR>(g, c, FixpipeParamsV220(static_cast<uint16_t>(cols), static_cast<uint16_t>(rows),
            static_cast<uint16_t>(mp), pitch == 0 ? cols : pitch, false, quant, 0, 1, 0, 0, PASA_UNIT_FLAG_LAST));
    }
    // Rows [m0, m0 + rows) and columns [c0, c0 + cols) of a score tile, or (pv) of a P'V tile, to their
    // slot (row-major, `pitch` elements a row).
    __aicore__ inline void DrainTile(GM_ADDR slot, uint32_t m0, uint32_t c0, const LocalTensor<float>& c, uint32_t cols,
                                     uint32_t pitch, uint32_t rows, uint32_t mp, bool pv = false)
    {
        const uint64_t at = static_cast<uint64_t>(m0) * pitch + c0;
        if (key_ == PASA_KEY_FA_FP32 || (t_->shiftScores && !pv)) {
            Drain<float>(slot + at * sizeof(float), c, cols, rows, mp, QuantMode_t::NoQuant, pitch);
        } else {
            Drain<half>(slot + at * sizeof(half), c, cols, rows, mp, QuantMode_t::F322F16, pitch);
        }
    }

    // The fp16 means of the task's blocks [i0, i0 + PASA_CONST_BLOCKS) -> L1 (NZ, a row per block), not queued.
    __aicore__ inline LocalTensor<T> CopyMeans(const AttentionTask& task, uint32_t i0)
    {
        const PasaTilingData& t = *t_;
        const uint32_t d = t.headDim, j0 = task.blockBegin + i0;
        const uint32_t blocks = Min(PASA_CONST_BLOCKS, task.numBlocks - i0), mb = Align16(blocks);
        LocalTensor<T> m1 = meanL1_.AllocTensor<T>();
        if (!t.paged) {  // the blocks' means are consecutive rows
            DataCopy(m1, keyMean_[KeyMeanOffset(t, KeyPrimeSlot(t, pages_, task.b, task.kvHead, j0, task.info.kvLen))],
                     Nd2NzParams(1, static_cast<uint16_t>(blocks), static_cast<uint16_t>(d), 0, static_cast<uint16_t>(d),
                                 static_cast<uint16_t>(mb), 1, 0));
        } else {
            for (uint32_t i = 0; i < blocks; ++i) {
                DataCopy(m1[i * kC0], keyMean_[KeyMeanOffset(t, KeyPrimeSlot(t, pages_, task.b, task.kvHead, j0 + i, task.info.kvLen))],
                         Nd2NzParams(1, 1, static_cast<uint16_t>(d), 0, static_cast<uint16_t>(d), static_cast<uint16_t>(mb), 1, 0));
            }
        }
        return m1;
    }

    // C^T (blocks x rows) = Means_chunk Q^T for the task's blocks [i0, i0 + PASA_CONST_BLOCKS),
    // one Mmad per piece of cubeRows query rows (the means stay in L0A).
    __aicore__ inline void RowConstants(const AttentionTask& task, const LocalTensor<T>& q1, uint32_t i0)
    {
        const PasaTilingData& t = *t_;
        const uint32_t d = t.headDim;
        const uint32_t blocks = Min(PASA_CONST_BLOCKS, task.numBlocks - i0), mb = Align16(blocks);
        const bool zz = QueryZz(task);
        if (i0 == 0 && meansQueued_) {
            meansQueued_ = false;  // LoadQuery copied them
        } else {
            meanL1_.EnQue(CopyMeans(task, i0));
        }
        LocalTensor<T> m1 = meanL1_.DeQue<T>();
        GM_ADDR slot = slots_.rowConst + (constCount_++ % PASA_CONST_SLOTS) * t.constSlotBytes;
        const uint32_t dc = Min(d, t.cubeCols);
        const bool whole = dc == d;  // the means stay in L0A for every piece of Q rows
        LocalTensor<T> a2;
        if (whole) {
            a2 = ToL0a(m1, mb / kC0, d / kC0, mb);
            meanL1_.FreeTensor(m1);
        }
        for (uint32_t m0 = 0; m0 < t.qTilePad; m0 += t.cubeRows) {
            const uint32_t cols = Min(t.cubeRows, t.qTilePad - m0);
            LocalTensor<float> c;
            for (uint32_t k0 = 0; k0 < d; k0 += dc) {  // the contraction's pieces, in order
                const uint32_t kc = Min(dc, d - k0);
                if (!whole) a2 = ToL0a(m1[k0 * mb], mb / kC0, kc / kC0, mb);
                LocalTensor<T> b2 = l0b_.AllocTensor<T>();
                for (uint32_t kb = 0; kb < kc / kC0; ++kb) {  // the piece's rows of each column block of Q
                    const uint32_t at = zz ? m0 * d + (k0 / kC0 + kb) * kFractal : (k0 / kC0 + kb) * t.qTilePad * kC0 + m0 * kC0;
                    LoadData(b2[kb * (cols / kC0) * kFractal], q1[at],
                             LoadData2DParams(0, static_cast<uint8_t>(cols / kC0), static_cast<uint16_t>(zz ? d / kC0 : 1),
                                              0, 0, false, 0));
                }
                l0b_.EnQue(b2);
                b2 = l0b_.DeQue<T>();
                Accumulate(c, a2, b2, blocks, cols, k0, kc, d);
                l0b_.FreeTensor(b2);
                if (!whole) l0a_.FreeTensor(a2);
            }
            Drain<float>(slot + m0 * sizeof(float), c, cols, blocks, mb, QuantMode_t::NoQuant, t.qTilePad);
        }
        if (whole) {
            l0a_.FreeTensor(a2);
        } else {
            meanL1_.FreeTensor(m1);
        }
    }

    // c (+)= a2 b2 on the cube, the piece [k0, k0 + k) of a contraction of `depth`: the first piece takes the
    // next L0C buffer and starts it at zero, later ones accumulate onto it; Drain's Fixpipe takes the
    // buffer from the last one by unitFlag (L0cRing).
    __aicore__ inline void Accumulate(LocalTensor<float>& c, const LocalTensor<T>& a2, const LocalTensor<T>& b2,
                                      uint32_t m, uint32_t n, uint32_t k0, uint32_t k, uint32_t depth)
    {
        if (k0 == 0) c = l0c_.Next();
        Mmad(c, a2, b2, MmadParams(static_cast<uint16_t>(m), static_cast<uint16_t>(n), static_cast<uint16_t>(k),
                                   k0 + k == depth ? PASA_UNIT_FLAG_LAST : PASA_UNIT_FLAG_MORE, false, k0 == 0));
    }

    // Rows [r0, r1) of kv block j of `src` (K or V, row length dim; r0 a multiple of pieceRows) -> L1
    // from its start, NZ in pieces of `pieceRows` rows one after the other, each with C0 stride
    // pieceRows (or, zz, 16-row blocks with their column fractals together), one copy per run of rows
    // inside one physical block and one piece. Rows past r1 are left as they are.
    __aicore__ inline void CopyRows(const LocalTensor<T>& l1, const GlobalTensor<T>& src, const AttentionTask& task,
                                    uint32_t j, uint32_t r0, uint32_t r1, uint32_t dim, bool zz, uint32_t pieceRows)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, stride = RowStride(t.kvLayout, t.numKvHeads, dim);
        for (uint32_t r = r0; r < r1;) {
            const int64_t pos = static_cast<int64_t>(j) * n + r;
            const uint64_t at = KvRowOffset(t, pages_, task.b, task.kvHead, task.info.kvStart, pos, dim);
            const uint32_t rr = r - r0;  // the row's place in l1
            if (!zz) {
                const uint32_t in = rr % pieceRows, run = RunLength(t, pos, r1 - r);
                // whole pieces in one copy where the DMA's 16-bit stride between them reaches
                const uint32_t pieces = in == 0 && pieceRows * stride <= 65535 ? run / pieceRows : 0;
                const uint32_t rows = pieces > 1 ? pieceRows : Min(run, pieceRows - in);
                DataCopy(l1[(rr - in) * dim + in * kC0], src[at],
                         Nd2NzParams(static_cast<uint16_t>(pieces > 1 ? pieces : 1), static_cast<uint16_t>(rows),
                                     static_cast<uint16_t>(dim), static_cast<uint16_t>(pieces > 1 ? pieceRows * stride : 0),
                                     static_cast<uint16_t>(stride), static_cast<uint16_t>(pieceRows), 1,
                                     static_cast<uint16_t>(pieces > 1 ? pieceRows * dim : 0)));
                r += pieces > 1 ? pieces * pieceRows : rows;
            } else {  // r is a multiple of 16
                const uint32_t run = RunLength(t, pos, r1 - r);
                CopyZz(l1[(rr / kC0) * (dim / kC0) * kFractal], src, at, run, dim, stride);
                r += run;
            }
        }
    }

    // The parts of keyBufferKeys keys of K'_j queued ahead of its score tile (one per key buffer, at
    // most the block's) -> k1, not queued; returns how many.
    __aicore__ inline uint32_t CopyFirstKeyParts(const AttentionTask& task, uint32_t j, LocalTensor<T>* k1)
    {
        const uint32_t parts = Min(PASA_KEY_BUFFERS, t_->kvBlock / t_->keyBufferKeys);
        for (uint32_t p = 0; p < parts; ++p) k1[p] = CopyKeys(task, j, p);
        return parts;
    }

    // The first parts of K'_j, copied before any is queued.
    __aicore__ inline void QueueKeys(const AttentionTask& task, uint32_t j)
    {
        LocalTensor<T> k1[PASA_KEY_BUFFERS];
        const uint32_t parts = CopyFirstKeyParts(task, j, k1);
        for (uint32_t p = 0; p < parts; ++p) keyL1_.EnQue(k1[p]);
    }

    // Part p of K'_j (fa-fp32 and shiftScores: of K_j), its keys [p keyBufferKeys, (p + 1) keyBufferKeys)
    // -> a key buffer, NZ pieces of cubeKeys keys (the caller queues it).
    __aicore__ inline LocalTensor<T> CopyKeys(const AttentionTask& task, uint32_t j, uint32_t p)
    {
        const PasaTilingData& t = *t_;
        const uint32_t kb = t.keyBufferKeys, nk = t.cubeKeys, d = t.headDim, r0 = p * kb, valid = ValidKeys(task, j);
        LocalTensor<T> k1 = keyL1_.AllocTensor<T>();
        if (rawKeys_) {
            // fa-fp32: rows past kv_len stay stale (their scores are masked); shiftScores: zero (the row sums)
            const uint32_t rows = valid > r0 ? Min(kb, valid - r0) : 0;
            if (t.shiftScores) ZeroRowsNz(k1, rows, kb, d, nk);
            CopyRows(k1, keys_, task, j, r0, r0 + rows, d, false, nk);
        } else {  // the pieces in one copy; K' is zero past the block's keys
            const uint32_t pieceElems = nk < kb ? nk * d : 0;  // below 2^16 when nk < kvBlock (PlanCube)
            DataCopy(k1, primes_[KeyPrimeOffset(t, KeyPrimeSlot(t, pages_, task.b, task.kvHead, j, task.info.kvLen)) + r0 * d],
                     Nd2NzParams(static_cast<uint16_t>(kb / nk), static_cast<uint16_t>(nk), static_cast<uint16_t>(d),
                                 static_cast<uint16_t>(pieceElems), static_cast<uint16_t>(d), static_cast<uint16_t>(nk), 1,
                                 static_cast<uint16_t>(pieceElems)));
        }
        return k1;
    }

    // S'_j = Q K'_j^T to the next score slot (fa-fp32 and shiftScores: Q K_j^T of the raw keys, fp32),
    // a piece of cubeKeys keys at a time: k1 holds the block's first part of keyBufferKeys keys, the
    // caller queued its first parts (CopyFirstKeyParts), and each part past those lands in the
    // buffer a multiplied part left.
    __aicore__ inline void Scores(const AttentionTask& task, uint32_t j, const LocalTensor<T>& q1, LocalTensor<T>& k1)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, d = t.headDim, mp = Rows16(task);
        const uint32_t dc = Min(d, t.cubeCols), nk = t.cubeKeys, kb = t.keyBufferKeys;
        const bool held = dc == d;  // each piece of keys stays in L0B for every piece of rows
        GM_ADDR slot = slots_.score + (scoreCount_++ % PASA_SCORE_SLOTS) * t.scoreSlotBytes;
        for (uint32_t n0 = 0; n0 < n; n0 += nk) {  // the tile's pieces of columns (keys)
            const uint32_t in = n0 % kb;  // the piece's place in its part
            if (n0 > 0 && in == 0) k1 = keyL1_.DeQue<T>();
            LocalTensor<T> b2;
            if (held) {
                b2 = KeysToL0b(k1, d / kC0, in, nk);
                if (in + nk == kb) {  // the part's last piece
                    keyL1_.FreeTensor(k1);
                    const uint32_t next = n0 / kb + PASA_KEY_BUFFERS;
                    if (next < n / kb) keyL1_.EnQue(CopyKeys(task, j, next));
                }
            }
            for (uint32_t m0 = 0; m0 < mp; m0 += t.cubeRows) {
                const uint32_t rows = Min(t.cubeRows, task.rows - m0), rowsPad = Align16(rows);
                LocalTensor<float> c;
                for (uint32_t k0 = 0; k0 < d; k0 += dc) {  // the contraction's pieces, in order
                    const uint32_t kc = Min(dc, d - k0);
                    LocalTensor<T> a2 = QueryToL0a(task, q1, m0, rowsPad, k0, kc);
                    if (!held) b2 = KeysToL0b(k1[k0 * n], kc / kC0, 0, n);
                    Accumulate(c, a2, b2, rows, nk, k0, kc, d);
                    l0a_.FreeTensor(a2);
                    if (!held) l0b_.FreeTensor(b2);
                }
                DrainTile(slot, m0, n0, c, nk, n, rows, rowsPad);
            }
            if (held) l0b_.FreeTensor(b2);
        }
        if (!held) keyL1_.FreeTensor(k1);
        CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_S_READY);
    }

    // V_j (valid rows; the rest zero: their P' entries are 0, but 0 * stale could be NaN) -> a value
    // buffer (the caller queues it), laid out Zz (16-row blocks, each block's column fractals
    // together) when the source row stride allows one copy per run, NZ otherwise.
    __aicore__ inline LocalTensor<T> CopyValue(const AttentionTask& task, uint32_t j)
    {
        const uint32_t n = t_->kvBlock, dv = t_->headDimV, valid = ValidKeys(task, j);
        LocalTensor<T> v1 = valueL1_.AllocTensor<T>();
        if (valueZz_) {
            ZeroRowsZz(v1, valid, n, dv);
        } else {
            ZeroRowsNz(v1, valid, n, dv, n);
        }
        CopyRows(v1, value_, task, j, 0, valid, dv, valueZz_, n);
        return v1;
    }

    // The next P', once both AIVs wrote it, -> P' buffers, not queued: the whole tile, or its first
    // parts (one per P' buffer, at most the tile's); returns how many.
    __aicore__ inline uint32_t CopyFirstProbParts(const AttentionTask& task, LocalTensor<T>* p1)
    {
        CrossCoreWaitFlag(PASA_FLAG_P_READY);
        prob_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(slots_.prob + (probCount_++ % PASA_PROB_SLOTS) * t_->probSlotBytes));
        const uint32_t parts = Min(t_->probBuffers, ProbParts(task));
        for (uint32_t p = 0; p < parts; ++p) p1[p] = CopyProb(task, p);
        return parts;
    }

    // The next P''s first parts, copied before any is queued.
    __aicore__ inline void QueueProb(const AttentionTask& task)
    {
        LocalTensor<T> p1[PASA_PROB_PART_BUFFERS];
        const uint32_t parts = CopyFirstProbParts(task, p1);
        for (uint32_t p = 0; p < parts; ++p) probL1_.EnQue(p1[p]);
    }

    // The parts of the task's P' tile: 1 (whole), or each piece of cubeRows rows in kvBlock / probBufferKeys parts.
    __aicore__ inline uint32_t ProbParts(const AttentionTask& task) const
    {
        const uint32_t n = t_->kvBlock, pk = t_->probBufferKeys;
        return pk == n ? 1 : CeilDiv(Rows16(task), t_->cubeRows) * (n / pk);
    }

    // Part p of P' (ProbParts; row-major in its slot) -> a P' buffer (the caller queues it), a piece of
    // cubeKeys keys at a time, each in Zz order (one 16-row block after the other) and the pieces
    // ProbPitch rows apart, so that every piece of P' the cube multiplies is one load.
    __aicore__ inline LocalTensor<T> CopyProb(const AttentionTask& task, uint32_t p)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, nk = t.cubeKeys, pk = t.probBufferKeys, perRows = n / pk;
        const uint32_t m0 = pk == n ? 0 : (p / perRows) * t.cubeRows, k0 = (p % perRows) * pk;
        const uint32_t rowsPad = pk == n ? Rows16(task) : Align16(Min(t.cubeRows, task.rows - m0)), pitch = ProbPitch();
        LocalTensor<T> p1 = probL1_.AllocTensor<T>();
        for (uint32_t kk = 0; kk < pk; kk += nk) {
            DataCopy(p1[kk * pitch], prob_[static_cast<uint64_t>(m0) * n + k0 + kk],
                     Nd2NzParams(static_cast<uint16_t>(rowsPad / kC0), kC0, static_cast<uint16_t>(nk), static_cast<uint16_t>(kC0 * n),
                                 static_cast<uint16_t>(n), kC0, 1, static_cast<uint16_t>((nk / kC0) * kFractal)));
        }
        return p1;
    }

    // Rows between two pieces of cubeKeys keys in a P' buffer: the tile's, or a part's piece of rows.
    __aicore__ inline uint32_t ProbPitch() const
    {
        return t_->probBufferKeys == t_->kvBlock ? t_->qTilePad : t_->cubeRows;
    }

    // P'_j V_j (V_j in v1, CopyValue; P'_j in p1, CopyProb) to the next P'V slot.
    __aicore__ inline void Pv(const AttentionTask& task, LocalTensor<T>& v1, LocalTensor<T>& p1)
    {
        const PasaTilingData& t = *t_;
        const uint32_t n = t.kvBlock, dv = t.headDimV, mp = Rows16(task);
        const uint32_t dvc = Min(dv, t.cubeCols), nk = t.cubeKeys;
        const bool whole = dvc == dv && nk == n;  // the value block stays in L0B for every piece of rows
        const bool sums = t.pvCols > dv;          // pasa: P''s row sums too, from the pieces of P' in L0A
        // more key pieces than L0A's two buffers keep: each piece's row sums accumulate with its P'V, by
        // a block of ones beside its values in L0B (nk < n: every column of V in one piece)
        const bool sumsBeside = sums && n / nk > 2;
        // P' in parts (nk < n: every column of V in one piece), each a piece of rows: the first came
        // queued in p1, each later one lands in the buffer a multiplied part left
        const uint32_t pk = t.probBufferKeys, parts = ProbParts(task);
        LocalTensor<T> b2, a2, kept[2];
        if (whole) {
            b2 = ValuesToL0b(v1, 0, dv, 0, n);
            valueL1_.FreeTensor(v1);
        }
        GM_ADDR slot = slots_.pv + (pvCount_++ % PASA_PV_SLOTS) * t.pvSlotBytes;
        for (uint32_t m0 = 0; m0 < mp; m0 += t.cubeRows) {
            const uint32_t rows = Min(t.cubeRows, task.rows - m0), rowsPad = Align16(rows);
            if (nk == n) a2 = ProbToL0a(p1, m0, rowsPad, 0, n);  // for every piece of columns
            for (uint32_t v0 = 0; v0 < dv; v0 += dvc) {  // the output's pieces of columns
                const uint32_t vc = Min(dvc, dv - v0);
                const bool lastCols = v0 + vc == dv;
                LocalTensor<float> c, s;
                for (uint32_t k0 = 0; k0 < n; k0 += nk) {  // the contraction's pieces (keys), in order
                    if (pk < n) {
                        const uint32_t part = (m0 / t.cubeRows) * (n / pk) + k0 / pk, in = k0 % pk;
                        if (part > 0 && in == 0) p1 = probL1_.DeQue<T>();
                        a2 = ProbToL0a(p1, 0, rowsPad, in, nk);
                        if (in + nk == pk) {
                            probL1_.FreeTensor(p1);
                            if (part + PASA_PROB_PART_BUFFERS < parts) probL1_.EnQue(CopyProb(task, part + PASA_PROB_PART_BUFFERS));
                        }
                    } else if (nk < n) {
                        a2 = ProbToL0a(p1, m0, rowsPad, k0, nk);
                    }
                    if (!whole) b2 = ValuesToL0b(v1, v0, vc, k0, nk, sumsBeside);
                    Accumulate(c, a2, b2, rows, vc, k0, nk, n);
                    if (sumsBeside) Accumulate(s, a2, b2[nk * vc], rows, kC0, k0, nk, n);
                    if (sums && lastCols && !sumsBeside) {
                        kept[k0 / nk] = a2;
                    } else if (nk < n || lastCols) {
                        l0a_.FreeTensor(a2);
                    }
                    if (!whole) l0b_.FreeTensor(b2);
                }
                DrainTile(slot, m0, v0, c, vc, t.pvCols, rows, rowsPad, true);
                if (sumsBeside) DrainTile(slot, m0, dv, s, kC0, t.pvCols, rows, rowsPad, true);
            }
            if (sums && !sumsBeside) RowSums(slot, m0, kept, rows, rowsPad);
        }
        if (pk == n) probL1_.FreeTensor(p1);
        if (whole) {
            l0b_.FreeTensor(b2);
        } else {
            valueL1_.FreeTensor(v1);
        }
        CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_PV_READY);
    }

    // pasa: rows [m0, m0 + rows) of l' = fp16(sum P'), in fp32 on the cube: the row piece's P' pieces
    // still in L0A (`kept`, one per piece of cubeKeys keys, freed here) times a block of ones, in key
    // order, drained into columns [headDimV, headDimV + 16) of the P'V slot (each column the sum).
    __aicore__ inline void RowSums(GM_ADDR slot, uint32_t m0, LocalTensor<T>* kept, uint32_t rows, uint32_t rowsPad)
    {
        const uint32_t n = t_->kvBlock, nk = t_->cubeKeys;
        LocalTensor<T> ones = l0b_.AllocTensor<T>();
        Fill(ones, InitConstValueParams<T>(1, static_cast<uint16_t>(nk / kC0), 0, T(1.0f)));
        l0b_.EnQue(ones);
        ones = l0b_.DeQue<T>();
        LocalTensor<float> c;
        for (uint32_t k0 = 0; k0 < n; k0 += nk) {
            Accumulate(c, kept[k0 / nk], ones, rows, kC0, k0, nk, n);
            l0a_.FreeTensor(kept[k0 / nk]);
        }
        l0b_.FreeTensor(ones);
        DrainTile(slot, m0, t_->headDimV, c, kC0, t_->pvCols, rows, rowsPad, true);
    }

    const PasaTilingData* t_ = nullptr;
    uint32_t key_ = 0;
    bool valueZz_ = true, queryZz_ = true, rawKeys_ = false, constants_ = false;
    bool meansQueued_ = false;  // LoadQuery queued the means of the next RowConstants
    uint32_t scoreCount_ = 0, probCount_ = 0, pvCount_ = 0, constCount_ = 0;  // rings, across tasks
    GlobalTensor<T> prob_;  // the slot of the P' being copied into L1
    TPipe pipe_;
    TQue<TPosition::A1, 1> queryL1_, meanL1_;
    TQue<TPosition::A1, PASA_PROB_PART_BUFFERS> probL1_;
    TQue<TPosition::B1, PASA_KEY_BUFFERS> keyL1_;
    TQue<TPosition::B1, PASA_VALUE_BUFFERS> valueL1_;
    TQue<TPosition::A2, 1> l0a_;
    TQue<TPosition::B2, 1> l0b_;
    L0cRing l0c_;
    GlobalTensor<T> query_, keys_, primes_, value_, keyMean_;
    CoreSlots slots_;
    BatchTable batches_;
    KvPages pages_;
};

}  // namespace pasa

#endif  // PASA_ATTENTION_CUBE_H
