// PASA attention forward: one MIX kernel (1 AIC : 2 AIV per AI Core); the tiling key selects
// the precision allocation (docs/design.md, "Precision allocations"):
//
//   PASA_KEY_FA_FP32     S fp32 out of the cube, fp32 softmax/statistics, P cast to the input
//                        type for P·V, P·V and the running O in fp32.
//   PASA_KEY_PASA        S' = Q K'^T rounded to fp16 by the Fixpipe; every statistic and the
//                        running O in fp16 vector arithmetic (paper Algorithm 1).
//   PASA_KEY_PASA_EXACT  S' fp16 (K' fully centred), per-row constant c = scale Q.mean16 from a
//                        cube pass per task, fp32 statistics, P' and P'V in fp16, O in fp32.
//
// Work split. A task is a tile of query rows (one head, or the heads of a kv group stacked when
// the batch's query is shorter than a tile) against the visible kv blocks of its kv head; tasks go
// round robin over the AI Cores. Decode tasks with long contexts are split into kv ranges. The cube (pasa_attention_cube.h) computes score tiles a few blocks
// ahead of the P'V products; each vector core (pasa_attention_vector.h) owns half of a tile's
// rows and works on them as whole tiles. They meet through per-core workspace slots and the
// cross-core flags S_READY, P_READY and PV_READY.
//
// pasa_merge_splits (vector cores only): with split kv, the LSE merge of each task's splits
// (pasa_merge.h), at the attention launch's end (tiling.mergeInAttention) or launched after it.
//
// Learnable sinks (tiling.hasSink): `sink` holds one fp32 logit per query head, joined to every
// row's softmax once, in fp32, where the row is normalised: the vector cores' end of a task
// (AttentionVector::Finish), or with split kv the merge (the splits' partials leave it out).
//
// Row flags (tiling.overflowCheck): whichever kernel writes a row's output also writes its byte in
// rowFlags (uint8, laid out as the LSE): 1 where the output or the LSE is NaN or +inf, else 0
// (docs/design.md, "Overflow detection and repair").
#include "pasa_attention_cube.h"
#include "pasa_attention_vector.h"
#include "pasa_merge.h"
#include "pasa_prepare_keys.h"

using namespace AscendC;

namespace {

__aicore__ inline void CubePass(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR blockTable, GM_ADDR keySlots,
                                GM_ADDR workspace, GM_ADDR tiling, const PasaTilingData& t)
{
    if (t.inDtype == PASA_IN_BF16) {
        pasa::AttentionCube<bfloat16_t> op;
        op.Run(query, key, value, blockTable, keySlots, workspace, tiling, t);
    } else {
        pasa::AttentionCube<half> op;
        op.Run(query, key, value, blockTable, keySlots, workspace, tiling, t);
    }
}

__aicore__ inline void VectorPass(GM_ADDR mask, GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags,
                                  GM_ADDR workspace, GM_ADDR tiling, const PasaTilingData& t)
{
    if (t.inDtype == PASA_IN_BF16) {
        pasa::AttentionVector<bfloat16_t, bfloat16_t> op;
        op.Run(mask, sink, out, lse, rowFlags, workspace, tiling, t);
    } else if (t.outDtype == PASA_OUT_BF16) {
        pasa::AttentionVector<bfloat16_t, half> op;
        op.Run(mask, sink, out, lse, rowFlags, workspace, tiling, t);
    } else {
        pasa::AttentionVector<half, half> op;
        op.Run(mask, sink, out, lse, rowFlags, workspace, tiling, t);
    }
}

template <typename OutT>
__aicore__ inline void MergeWith(GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags, GM_ADDR workspace,
                                 GM_ADDR tiling, const PasaTilingData& t)
{
    pasa::MergeSplits<OutT> op;
    op.Run(sink, out, lse, rowFlags, workspace, tiling, t);
}

__aicore__ inline void MergePass(GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags, GM_ADDR workspace,
                                 GM_ADDR tiling, const PasaTilingData& t)
{
    if (t.outDtype == PASA_OUT_BF16) {
        MergeWith<bfloat16_t>(sink, out, lse, rowFlags, workspace, tiling, t);
    } else {
        MergeWith<half>(sink, out, lse, rowFlags, workspace, tiling, t);
    }
}

}  // namespace

// With tiling.prepInAttention the launch first does the key preprocessing (pasa_prepare_keys.h) on
// its first prepDim AI Cores (those past the attention's tasks do only that), and all cores meet
// at SyncAll before the attention reads K'.
//
// A checked call without split kv repairs in the same launch (tiling.repairTilingOffset): once
// both vector cores of an AI Core have stored their task flags and core bytes, that core's cube
// and vector cores run the repair pass (fa-fp32, the raw K) over its own flagged tasks, if its
// core bytes say it has any (pasa::CoreFlagged); the
// pass's exchange slots lie past the first pass's workspace, so that a core still in its first
// pass keeps its own.
//
// With split kv and tiling.mergeInAttention every core meets the others at SyncAll once its
// splits' partial results are stored; the first mergeDim vector cores then merge them
// (pasa_merge.h), and a checked call meets at SyncAll again, once the merge has written the task
// flags, before every core repairs its flagged tasks (the repair pass deals them without split).
extern "C" __global__ __aicore__ void pasa_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR mask,
                                                     GM_ADDR blockTable, GM_ADDR keySlots, GM_ADDR sink, GM_ADDR out,
                                                     GM_ADDR lse, GM_ADDR rowFlags, GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    PasaTilingData t;
    pasa::LoadTiling(tiling, t);
    GM_ADDR repairTiling = t.repairTilingOffset != 0 ? tiling + t.repairTilingOffset : nullptr;
    uint32_t core = static_cast<uint32_t>(GetBlockIdx());  // this AI Core's index
    if ASCEND_IS_AIV {
        core /= 2;
    }
    if (t.prepInAttention) {  // every core's K' blocks written before any core reads them
        if (core < t.prepDim) pasa::PrepareKeys(key, blockTable, keySlots, workspace, tiling, t);
        SyncAll<false>();
    }
    if (t.kvSplits > 1) {
        if ASCEND_IS_AIC {
            CubePass(query, key, value, blockTable, keySlots, workspace, tiling, t);
        }
        if ASCEND_IS_AIV {
            VectorPass(mask, sink, out, lse, rowFlags, workspace, tiling, t);
        }
        if (!t.mergeInAttention) return;
        SyncAll<false>();  // every split's partial results stored
        if ASCEND_IS_AIV {
            if (static_cast<uint32_t>(GetBlockIdx()) < t.mergeDim) MergePass(sink, out, lse, rowFlags, workspace, tiling, t);
        }
        if (repairTiling == nullptr) return;
        SyncAll<false>();  // every task's flag bytes written by the merge
        PasaTilingData r;
        pasa::LoadTiling(repairTiling, r);
        if (!pasa::HasFlaggedTask(repairTiling, r, workspace, core)) return;
        if ASCEND_IS_AIC {
            CubePass(query, key, value, blockTable, nullptr, workspace, repairTiling, r);
        }
        if ASCEND_IS_AIV {
            VectorPass(mask, sink, out, lse, rowFlags, workspace, repairTiling, r);
        }
        return;
    }
    if ASCEND_IS_AIC {
        CubePass(query, key, value, blockTable, keySlots, workspace, tiling, t);
        if (repairTiling != nullptr) {
            CrossCoreWaitFlag(PASA_FLAG_FLAGS_READY);
            CrossCoreSetFlag<2, PIPE_FIX>(PASA_FLAG_FLAGS_SEEN);
            if (pasa::CoreFlagged(t, workspace, core)) {
                PasaTilingData r;
                pasa::LoadTiling(repairTiling, r);
                CubePass(query, key, value, blockTable, nullptr, workspace, repairTiling, r);
            }
        }
    }
    if ASCEND_IS_AIV {
        VectorPass(mask, sink, out, lse, rowFlags, workspace, tiling, t);
        if (repairTiling != nullptr) {
            PipeBarrier<PIPE_ALL>();  // this core's task and row flags stored
            CrossCoreSetFlag<2, PIPE_MTE3>(PASA_FLAG_FLAGS_READY);
            CrossCoreWaitFlag(PASA_FLAG_FLAGS_SEEN);
            if (pasa::CoreFlagged(t, workspace, core)) {
                PasaTilingData r;
                pasa::LoadTiling(repairTiling, r);
                VectorPass(mask, sink, out, lse, rowFlags, workspace, repairTiling, r);
            }
        }
    }
}

extern "C" __global__ __aicore__ void pasa_merge_splits(GM_ADDR sink, GM_ADDR out, GM_ADDR lse, GM_ADDR rowFlags,
                                                         GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    PasaTilingData t;
    pasa::LoadTiling(tiling, t);
    if ASCEND_IS_AIV {
        MergePass(sink, out, lse, rowFlags, workspace, tiling, t);
    }
}
