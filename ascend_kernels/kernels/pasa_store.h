// Where a vector core's rows of a tile go: the output and LSE rows of its query positions (the
// attention kernel's end of a task, and the merge of split kv), or the partial results of one
// split. Device code: compiles against the real AscendC headers or the CPU emulation alike.
#ifndef PASA_STORE_H
#define PASA_STORE_H

#include "pasa_workspace.h"

namespace pasa {

// The vector core's rows [rowBase, rowBase + rows) of `task`'s tile to GM: `o` (rows x headDimV
// of OutT, row 0 = tile row rowBase) into `out`, `lse` (fp32) into `lseOut`, one run per stacked
// head, positions past the batch's query length left out. `aligned`: 32-byte aligned fp32 scratch
// of `rows` elements (an LSE run that does not start on a 32-byte boundary is moved there first).
// With `flags` (on): the rows' flag bytes to its (Bt, Nq, Sq) bytes, laid out as the LSE, in the
// same runs (the task's flag byte: StoreTaskFlag). In the repair launch (`repair`) only the rows
// whose stored flag is set are written (runs cut at the others, one GM scalar read a row).
struct RowFlags {
    GlobalTensor<uint8_t> out;
    GlobalTensor<uint8_t> tasks;   // workspace + taskFlagsOffset
    LocalTensor<uint8_t> bytes;    // one byte per row of the vector core's band, 32-byte aligned
    LocalTensor<uint8_t> aligned;  // 32-byte aligned scratch of `rows` bytes
    LocalTensor<uint8_t> task;     // the task's byte, 32-byte aligned
    bool on = false, repair = false;
};

// The slot of the task byte of `task`'s rows from rowBase on (PASA_TASK_FLAG_BYTES each).
__aicore__ inline uint64_t TaskFlagSlot(const PasaTilingData& t, const AttentionTask& task, uint32_t rowBase)
{
    return (static_cast<uint64_t>(task.index) * 2 + (rowBase == 0 ? 0 : 1)) * PASA_TASK_FLAG_BYTES;
}

// The repair launch: cut the run [row, row + k) of stored rows at the first whose stored flag is
// 0; returns the rows to skip before the run (0: `k` is now the flagged run's length).
__aicore__ inline uint32_t FlaggedRun(const GlobalTensor<uint8_t>& stored, uint64_t at, uint32_t& k)
{
    uint32_t skip = 0;
    while (skip < k && stored.GetValue(at + skip) == 0) ++skip;
    if (skip > 0) return skip;
    uint32_t n = 1;
    while (n < k && stored.GetValue(at + n) != 0) ++n;
    k = n;
    return 0;
}

template <typename OutT>
__aicore__ inline void StoreRows(const PasaTilingData& t, const AttentionTask& task, uint32_t rowBase, uint32_t rows,
                                 const GlobalTensor<OutT>& out, const GlobalTensor<float>& lseOut,
                                 const LocalTensor<OutT>& o, const LocalTensor<float>& lse, const LocalTensor<float>& aligned,
                                 const RowFlags& flags = RowFlags())
{
    const uint32_t dv = t.headDimV, stride = RowStride(t.outLayout, t.numHeads, dv), p = task.pitch;
    const uint32_t first = static_cast<uint32_t>(task.info.qStart) + task.q0, bt = TensorBatch(t, task.b);
    OrderPipes<HardEvent::V_MTE3>();
    for (uint32_t row = rowBase; row < rowBase + rows;) {
        const uint32_t head = row / p, pos = row % p;
        uint32_t end = Min(Min(rowBase + rows, (head + 1) * p), head * p + task.positions);
        if (end <= row) {
            row = (head + 1) * p;
            continue;
        }
        uint32_t k = end - row;
        const uint32_t local = row - rowBase;
        const uint64_t at = (static_cast<uint64_t>(bt) * t.numHeads + task.head0 + head) * t.seqQ + first + pos;
        if (flags.repair) {
            const uint32_t skip = FlaggedRun(flags.out, at, k);
            if (skip > 0) {
                row += skip;
                continue;
            }
            end = row + k;
        }
        DataCopy(out[RowOffset(t.outLayout, bt, task.head0 + head, first + pos, t.numHeads, t.seqQ, dv)],
                 o[local * dv], DataCopyParams(static_cast<uint16_t>(k), static_cast<uint16_t>(dv * sizeof(OutT) / 32), 0,
                                               static_cast<uint16_t>((stride - dv) * sizeof(OutT) / 32)));
        LocalTensor<float> src = lse[local];
        if (local % 8 != 0) {  // an unaligned run (stacked heads): move it to an aligned place first
            OrderPipes<HardEvent::MTE3_S>();
            for (uint32_t i = 0; i < k; ++i) aligned.SetValue(i, lse.GetValue(local + i));
            src = aligned;
        }
        DataCopyPad(lseOut[at], src, DataCopyExtParams(1, k * sizeof(float), 0, 0, 0));
        if (flags.on) {
            LocalTensor<uint8_t> bytes = flags.bytes[local];
            if (local % 32 != 0) {  // as the LSE run above
                OrderPipes<HardEvent::MTE3_S>();
                for (uint32_t i = 0; i < k; ++i) flags.aligned.SetValue(i, flags.bytes.GetValue(local + i));
                bytes = flags.aligned;
            }
            DataCopyPad(flags.out[at], bytes, DataCopyExtParams(1, k, 0, 0, 0));
        }
        row = end;
    }
    OrderPipes<HardEvent::MTE3_V>();
}

// With `flags` on, outside the repair launch: the task's flag byte (flags.task) of the vector core's
// band of rows from `rowBase` on (0 or FirstAivRows) to its slot, once its rows are stored. The vector
// pipe does not wait for the copy: the next task's StoreRows orders it before flags.task is written again.
__aicore__ inline void StoreTaskFlag(const PasaTilingData& t, const AttentionTask& task, uint32_t rowBase,
                                     const RowFlags& flags)
{
    if (!flags.on || flags.repair) return;
    OrderPipes<HardEvent::V_MTE3>();
    DataCopyPad(flags.tasks[TaskFlagSlot(t, task, rowBase)], flags.task, DataCopyExtParams(1, 1, 0, 0, 0));
}

// Learnable sinks (tiling.hasSink): `dst[r]` (fp32, `count` elements) = the sink logit of row
// rowBase + r of `task`'s tile, whose query head is head0 + row / pitch (padding rows past the
// task's heads take its last head's). One GM scalar read per head and `count` scalar UB writes:
// once per task, at its end.
__aicore__ inline void RowSinks(const GlobalTensor<float>& sink, const AttentionTask& task, uint32_t rowBase, uint32_t count,
                                const LocalTensor<float>& dst)
{
    uint32_t head = 0xFFFFFFFFu;
    float value = 0.0f;
    for (uint32_t r = 0; r < count; ++r) {
        const uint32_t h = Min((rowBase + r) / task.pitch, task.heads - 1);
        if (h != head) {
            head = h;
            value = sink.GetValue(task.head0 + h);
        }
        dst.SetValue(r, value);
    }
}

// Split kv: rows [rowBase + first, rowBase + first + rows) of one split's O / l (fp32, rows x
// headDimV) and LSE to the (task, split)'s partial slot, rowBase the vector core's band (0 or
// FirstAivRows): O at the same rows, the LSE of each vector core's rows in a 32-byte aligned run of its
// own (PartialLseRow: the two cores' runs never share a 32-byte block).
__aicore__ inline void StorePartial(GM_ADDR workspace, const PasaTilingData& t, const AttentionTask& task, uint32_t rowBase,
                                    uint32_t first, uint32_t rows, const LocalTensor<float>& o, const LocalTensor<float>& lse)
{
    const uint64_t unit = static_cast<uint64_t>(task.index) * t.kvSplits + task.split;
    GlobalTensor<float> po, pl;
    po.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(PartialOut(workspace, t, unit)));
    pl.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(PartialLse(workspace, t, unit)));
    OrderPipes<HardEvent::V_MTE3>();
    DataCopy(po[static_cast<uint64_t>(rowBase + first) * t.headDimV], o, rows * t.headDimV);
    DataCopyPad(pl[PartialLseRow(t, rowBase) + first], lse, DataCopyExtParams(1, rows * sizeof(float), 0, 0, 0));
    OrderPipes<HardEvent::MTE3_V>();
}

}  // namespace pasa

#endif  // PASA_STORE_H
