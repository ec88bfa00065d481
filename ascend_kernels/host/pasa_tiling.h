// Host tiling of the PASA kernels: from the problem description to PasaTilingData, with the
// per-core buffer budgets of an Atlas A2 AI Core checked. Shared by the CPU emulation binding
// and the CANN launcher. Plain C++17, no device headers.
#ifndef PASA_HOST_TILING_H
#define PASA_HOST_TILING_H

#include <cstdint>
#include <string>

#include "../kernels/pasa_tiling_data.h"

namespace pasa {

// Atlas A2 (910B) per-core memories.
// L1 that TPipe hands out: asc-devkit keeps 128 bytes of the 512 KiB for itself on Atlas A2
// (TOTAL_L1_SIZE = 512 KiB - KFC_L1_RESERVER_SIZE, impl/basic_api/utils/kernel_utils_constants.h).
constexpr uint32_t kL1Bytes = 512 * 1024 - 128;
constexpr uint32_t kL0ABytes = 64 * 1024;
constexpr uint32_t kL0BBytes = 64 * 1024;
constexpr uint32_t kL0CBytes = 128 * 1024;
constexpr uint32_t kUbBytes = 192 * 1024;
// UB the attention kernel's buffers may use: on Atlas A2 some APIs (Select) keep temporaries from
// TMP_UB_OFFSET = 184 KiB up (impl/basic_api/utils/kernel_utils_constants.h).
constexpr uint32_t kUbUserBytes = 184 * 1024;
constexpr uint32_t kDefaultCoreNum = 24;  // AI Cores (AIC + 2 AIV each) of an Atlas A2

// One call. Tensors are (B, N, S, D) in the memory order their layout names: query, out (B x
// numHeads x seqQ), key and value (B x numKvHeads x seqKv); packed (TND): B = 1 on the tensors,
// `batch` segments of their S axes. Paged: key and value are caches of `numBlocks` physical blocks
// (numBlocks x numKvHeads x blockSize rows, seqKv = blockSize) read through a block table of
// `batch` x `tableStride` entries.
struct PasaProblem {
    uint32_t tilingKey = PASA_KEY_PASA_EXACT;
    uint32_t batch = 0, numHeads = 0, numKvHeads = 0;
    uint32_t seqQ = 0, seqKv = 0, headDim = 0, headDimV = 0;
    uint32_t qLayout = PASA_LAYOUT_BNSD, kvLayout = PASA_LAYOUT_BNSD, outLayout = PASA_LAYOUT_BNSD;
    uint32_t outDtype = PASA_OUT_FP16;
    uint32_t inDtype = PASA_IN_FP16;
    uint32_t maskMode = PASA_MASK_NONE;
    bool packed = false;
    bool hasMask = false;            // an explicit bool mask (B or 1, S1, S2) of the masked keys
    uint32_t maskRowStride = 0;      // elements between its rows (S2 or more)
    uint64_t maskBatchStride = 0;    // elements between its batches; 0: one mask for every batch
    bool paged = false;
    uint32_t blockSize = 0, tableStride = 0, numBlocks = 0;
    bool overflowCheck = false;          // write the row flags (docs/design.md, "Overflow detection and repair")
    bool repair = false;             // the repair launch of a checked call (fa-fp32, kvSplits 1, overflowCheck)
    bool hasSink = false;            // learnable sinks: one fp32 logit per query head (AttentionTensors::sink)
    double resolutionLimit = 0.0;    // overflowCheck: also flag the rows of pasa / pasa-exact whose shifted scores (or
                                     // pasa's block offsets) reach this magnitude (PasaTilingData::resolutionLimit);
                                     // 0: overflow check only
    double scale = 1.0;
    double beta = -1.0;      // pasa only; negative: the optimal beta from kDefaultBeta0
    uint32_t qBlock = 128;   // q_block: rows a tile may hold
    uint32_t kvBlock = 128;
    uint32_t kvSplits = 0;   // kv ranges per decode task; 0: chosen for the core count
    uint32_t tailPieces = 0; // pieces per task of a prefill's last, part-filled round; 0: chosen for the core count
    uint32_t cubeKeys = 0;       // keys of a K or V block in L0B at once (with the whole head dim); 0: the host's
    uint32_t keyBufferKeys = 0;  // keys of a K block in each key buffer in L1 (a multiple of the cube's key
                                 // piece dividing kvBlock); 0: the whole block
    uint32_t probBufferKeys = 0; // keys of a P' part in each P' buffer in L1 (a multiple of the cube's key piece
                                 // dividing kvBlock; a part holds one piece of rows); 0: the whole P' tile
    uint32_t vecChunkRows = 0;  // rows a vector core works on at once; 0: the most that fit its UB
    bool prepLaunch = false;    // the key preprocessing in a launch of its own rather than at the attention launch's start
    bool mergeLaunch = false;   // split kv's merge (and a checked call's repair) in launches of their own rather than at
                                // the attention launch's end
    bool vectorProbSums = false;  // pasa: the row sums of P' on the vector cores rather than on the cube
    uint32_t coreNum = kDefaultCoreNum;
};

// Host arrays of `batch` int32 entries: each batch's valid query and key lengths, the band's
// offsets (key j is visible to row i iff i - preTokens[b] <= j <= i + nextTokens[b]: next read with
// PASA_MASK_CAUSAL and PASA_MASK_BAND, pre with PASA_MASK_BAND only) and, packed, the first row of
// each batch on the query's and the key's S axis (may be null otherwise).
struct BatchLengths {
    const int32_t* qLens = nullptr;
    const int32_t* kvLens = nullptr;
    const int32_t* nextTokens = nullptr;
    const int32_t* preTokens = nullptr;
    const int32_t* qStarts = nullptr;
    const int32_t* kvStarts = nullptr;
};

// Memory a configuration needs, per core, in bytes (for the budget report).
struct PasaBudget {
    uint64_t l1 = 0, l0a = 0, l0b = 0, l0c = 0, ub = 0;            // attention kernel
    uint64_t prepL1 = 0, prepL0a = 0, prepL0b = 0, prepL0c = 0, prepUb = 0;  // preprocessing
};

// The paper's starting point for the optimal accuracy condition (pasa_npu.numerics.DEFAULT_BETA0).
constexpr double kDefaultBeta0 = 1.0 - 1.0 / 64.0;

// Optimal beta for the n x n shifting matrix stored in fp16 with `scale` folded in: the fixed
// point of beta <- gamma_eff(beta) / (1 + gamma_eff(beta)) (pasa_npu.beta.optimal_beta).
double OptimalBeta(double beta0, uint32_t n, double scale);

// Fill the tiling for the lengths of `lengths` (null: every batch at seqQ x seqKv); throws
// std::invalid_argument naming the parameter or the budget that fails.
PasaTilingData ComputeTiling(const PasaProblem& problem, const BatchLengths* lengths = nullptr,
                             PasaBudget* budget = nullptr);

// Write M^T (= M, symmetric) for pasa, kvBlock x kvBlock fp16 bits, as the preprocessing kernel
// reads it from workspace + shiftMatrixOffset: scale (1 - beta/n) on the diagonal, -scale beta/n off it.
void FillShiftMatrix(const PasaTilingData& t, uint16_t* dst);

// With shiftScores, pasa's score map in place of M^T (at workspace + shiftMatrixOffset, ScoreMapBytes): for a
// block of v = 1 .. kvBlock keys the fp32 pair [a_v, off_v] at dst[2 v], with which the vector cores shift its
// fp32 scores T: S' = a_v T - off_v rowsum(T), the map M^T makes of the keys (pasa_npu.beta.partial_block_shift).
uint64_t ScoreMapBytes(const PasaTilingData& t);
void FillScoreMap(const PasaTilingData& t, float* dst);

// overflowCheck: the bytes at taskFlagsOffset, PASA_TASK_FLAG_BYTES a slot: one per (task, vector core half),
// then one per (AI Core of the launch, vector core half) (pasa::CoreFlagSlot).
uint64_t FlagAreaBytes(const PasaTilingData& t);

// fp16 bits of a double, rounded once to nearest even (no intermediate fp32 rounding).
uint16_t DoubleToHalfBits(double value);
// fp16 bits of a float, rounded to nearest even.
uint16_t FloatToHalfBits(float value);
double HalfBitsToDouble(uint16_t bits);

}  // namespace pasa

#endif  // PASA_HOST_TILING_H
