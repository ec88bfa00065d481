// A PasaProblem from named parameters, under the names the Python side uses (pasa_npu/ascendc_emu.py):
// one mapping for every runner that receives them by name (the emulation's module, the simulator's
// driver). `Params` supplies `need<T>(name)` for a required parameter and `get<T>(name, fallback)`
// for an optional one, each as the field's type T.
#ifndef PASA_PROBLEM_PARAMS_H
#define PASA_PROBLEM_PARAMS_H

#include <cstdint>

#include "pasa_tiling.h"

namespace pasa {

template <typename Params>
PasaProblem ProblemFromParams(const Params& p)
{
    PasaProblem d;
    d.tilingKey = p.template need<uint32_t>("tiling_key");
    d.batch = p.template need<uint32_t>("batch");
    d.numHeads = p.template need<uint32_t>("num_heads");
    d.numKvHeads = p.template need<uint32_t>("num_kv_heads");
    d.seqQ = p.template need<uint32_t>("seq_q");
    d.seqKv = p.template need<uint32_t>("seq_kv");
    d.headDim = p.template need<uint32_t>("head_dim");
    d.headDimV = p.template need<uint32_t>("head_dim_v");
    d.qLayout = p.template need<uint32_t>("q_layout");
    d.kvLayout = p.template need<uint32_t>("kv_layout");
    d.outLayout = p.template need<uint32_t>("out_layout");
    d.outDtype = p.template need<uint32_t>("out_dtype");
    d.inDtype = p.template get<uint32_t>("in_dtype", PASA_IN_FP16);
    d.maskMode = p.template need<uint32_t>("mask_mode");
    d.packed = p.template get<uint64_t>("packed", 0) != 0;
    d.hasMask = p.template get<uint64_t>("has_mask", 0) != 0;
    d.overflowCheck = p.template get<uint64_t>("overflow_check", 0) != 0;
    d.hasSink = p.template get<uint64_t>("has_sink", 0) != 0;
    d.resolutionLimit = p.template get<double>("resolution_limit", 0.0);
    d.maskRowStride = static_cast<uint32_t>(p.template get<uint64_t>("mask_row_stride", 0));
    d.maskBatchStride = p.template get<uint64_t>("mask_batch_stride", 0);
    d.paged = p.template get<uint64_t>("paged", 0) != 0;
    d.blockSize = static_cast<uint32_t>(p.template get<uint64_t>("block_size", 0));
    d.tableStride = static_cast<uint32_t>(p.template get<uint64_t>("table_stride", 0));
    d.numBlocks = static_cast<uint32_t>(p.template get<uint64_t>("num_blocks", 0));
    d.kvSplits = static_cast<uint32_t>(p.template get<uint64_t>("kv_splits", 0));
    d.tailPieces = static_cast<uint32_t>(p.template get<uint64_t>("tail_pieces", 0));
    d.cubeKeys = static_cast<uint32_t>(p.template get<uint64_t>("cube_keys", 0));
    d.keyBufferKeys = static_cast<uint32_t>(p.template get<uint64_t>("key_buffer_keys", 0));
    d.probBufferKeys = static_cast<uint32_t>(p.template get<uint64_t>("prob_buffer_keys", 0));
    d.vecChunkRows = static_cast<uint32_t>(p.template get<uint64_t>("vec_chunk_rows", 0));
    d.prepLaunch = p.template get<uint64_t>("prep_launch", 0) != 0;
    d.mergeLaunch = p.template get<uint64_t>("merge_launch", 0) != 0;
    d.vectorProbSums = p.template get<uint64_t>("vector_prob_sums", 0) != 0;
    d.scale = p.template need<double>("scale");
    d.beta = p.template need<double>("beta");
    d.qBlock = p.template need<uint32_t>("q_block");
    d.kvBlock = p.template need<uint32_t>("kv_block");
    d.coreNum = p.template need<uint32_t>("core_num");
    return d;
}

}  // namespace pasa

#endif  // PASA_PROBLEM_PARAMS_H
