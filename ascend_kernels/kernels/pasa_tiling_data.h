// The tiling of one PASA call: a plain struct the host fills (ascend_kernels/host/pasa_tiling.cpp)
// and copies to GM; both kernels read it. No pointers, fixed-width fields only.
#ifndef PASA_TILING_DATA_H
#define PASA_TILING_DATA_H

#include <cstdint>

// Tiling keys: the precision allocation the attention kernel runs (docs/design.md, "Precision allocations").
constexpr uint32_t PASA_KEY_FA_FP32 = 0;     // fp32 scores and statistics, P fp16 into P·V
constexpr uint32_t PASA_KEY_PASA = 1;        // Algorithm 1: every step fp16
constexpr uint32_t PASA_KEY_PASA_EXACT = 2;  // full shift, per-row constant in fp32

constexpr uint32_t PASA_LAYOUT_BNSD = 0;  // (B, N, S, D) contiguous
constexpr uint32_t PASA_LAYOUT_BSND = 1;  // (B, S, N, D) contiguous, i.e. BSH

constexpr uint32_t PASA_MASK_NONE = 0;
constexpr uint32_t PASA_MASK_CAUSAL = 1;  // key j visible to row i iff j <= i + nextTokens[b]

constexpr uint32_t PASA_OUT_FP16 = 0;
constexpr uint32_t PASA_OUT_BF16 = 1;

constexpr uint32_t PASA_IN_FP16 = 0;  // query/key/value and P' in fp16
constexpr uint32_t PASA_IN_BF16 = 1;  // bf16 (fa-fp32 only; PASA computes in fp16)

// Cross-core flag ids (mode 2, AIC <-> both AIVs of one AI Core).
constexpr uint16_t PASA_FLAG_S_READY = 1;    // AIC -> AIV: a score tile S' is in the workspace
constexpr uint16_t PASA_FLAG_P_READY = 2;    // AIV -> AIC: both halves of P' are in the workspace
constexpr uint16_t PASA_FLAG_PV_READY = 3;   // AIC -> AIV: the P'V tile is in the workspace
constexpr uint16_t PASA_FLAG_SUM_READY = 4;  // preprocessing, AIC -> AIV: a block's column sums
constexpr uint16_t PASA_FLAG_SUM_FREE = 5;   // preprocessing, AIV -> AIC: the column-sum slot may be reused

// The attention pipeline: the cube computes score tiles up to PASA_LOOKAHEAD blocks ahead of
// the P'V product it is waiting for, and the vector cores fold P'V into O PASA_PV_DELAY blocks
// after they produced P'. Workspace slots per AI Core follow from the two.
constexpr uint32_t PASA_LOOKAHEAD = 4;
constexpr uint32_t PASA_PV_DELAY = 3;
constexpr uint32_t PASA_SCORE_SLOTS = PASA_LOOKAHEAD + 1;
constexpr uint32_t PASA_PROB_SLOTS = PASA_PV_DELAY + 1;
constexpr uint32_t PASA_PV_SLOTS = PASA_PV_DELAY + 1;
constexpr uint32_t PASA_VALUE_BUFFERS = PASA_LOOKAHEAD + 1;  // V_j is loaded with K'_j, used L blocks later
constexpr uint32_t PASA_CONST_BLOCKS = 128;                  // pasa-exact: row constants per cube pass
constexpr uint32_t PASA_CONST_SLOTS = PASA_LOOKAHEAD + 1;    // pasa-exact: passes the vector cores may still read

// Statistics one AIV keeps in UB, in units of vecRowsPad elements of fp32 (see pasa_attention_vector.h).
constexpr uint32_t PASA_VEC_STAT_UNITS = 36;

struct PasaTilingData {
    // ---- problem
    uint32_t tilingKey;      // PASA_KEY_*
    uint32_t batch;
    uint32_t numHeads;       // query heads
    uint32_t numKvHeads;
    uint32_t groupSize;      // numHeads / numKvHeads
    uint32_t seqQ;           // query length of the tensors (max over batches)
    uint32_t seqKv;          // key length of the tensors
    uint32_t headDim;        // D of Q and K
    uint32_t headDimV;       // D of V
    uint32_t qLayout;        // PASA_LAYOUT_* of query
    uint32_t kvLayout;       // PASA_LAYOUT_* of key and value
    uint32_t outLayout;      // PASA_LAYOUT_* of the output
    uint32_t outDtype;       // PASA_OUT_*
    uint32_t inDtype;        // PASA_IN_*
    uint32_t maskMode;       // PASA_MASK_*
    float scale;             // softmax scale as fp32 (the value the fp32 arithmetic uses)
    float gamma;             // pasa: gamma = beta/(1-beta) rounded to fp32 then to fp16, held exactly
    float invKvBlock;        // 1 / kvBlock (exact: kvBlock is a power of two)
    uint16_t shiftDiagBits;  // pasa: fp16 bits of scale * (1 - beta/n), the diagonal of M
    uint16_t shiftOffBits;   // pasa: fp16 bits of scale * beta/n; M's off-diagonal is its negative

    // ---- blocking: a tile is tileHeads query heads of one kv group x tilePositions query rows each
    uint32_t qTile;          // rows of a tile at most (cube M dimension)
    uint32_t qTilePad;       // qTile rounded up to 16
    uint32_t tilePositions;  // query positions per tile (qTile, or seqQ when shorter)
    uint32_t tileHeads;      // query heads stacked in a tile (1 unless seqQ < qTile)
    uint32_t headChunks;     // ceil(groupSize / tileHeads)
    uint32_t kvBlock;        // keys per block; the size of the shifting matrix
    uint32_t numKvBlocks;    // ceil(seqKv / kvBlock)
    uint32_t vecRows;        // rows of a tile the first AIV takes (the second takes the rest)
    uint32_t vecRowsPad;     // vecRows rounded up to 16

    // ---- core split
    uint32_t blockDim;       // AI Cores launched (attention and preprocessing)
    uint32_t numQTiles;      // ceil(seqQ / tilePositions)

    // ---- buffer plan (bytes per buffer and buffer counts)
    uint32_t l1QueryBytes, l1KeyBytes, l1ValueBytes, l1ProbBytes, l1MeanBytes;
    uint32_t l0aBytes, l0bBytes, l0cBytes;
    uint32_t ubScoreBytes, ubProbBytes, ubPvBytes, ubAccBytes, ubWorkBytes, ubTreeBytes, ubMaskBytes, ubStatBytes;
    uint32_t ubScoreBuffers, ubProbBuffers, ubPvBuffers;

    // ---- GM workspace (byte offsets from the workspace base)
    uint64_t keyPrimeOffset;   // K' blocks: [b][hkv][block][kvBlock][headDim] fp16
    uint64_t keyMeanOffset;    // pasa-exact: mean16 per block: [b][hkv][block][headDim] fp16
    uint64_t coreAreaOffset;   // per-AI-Core exchange areas start here
    uint64_t coreAreaBytes;    // bytes of one AI Core's exchange area
    uint64_t scoreSlotBytes;   // S' tile slot (PASA_SCORE_SLOTS of them)
    uint64_t probSlotBytes;    // P' tile slot (PASA_PROB_SLOTS)
    uint64_t pvSlotBytes;      // P'V tile slot (PASA_PV_SLOTS)
    uint64_t constSlotBytes;   // pasa-exact: row constants of a tile, PASA_CONST_BLOCKS x qTilePad fp32 (PASA_CONST_SLOTS)
    uint64_t colSumSlotBytes;  // preprocessing: column sums of one block (2 slots), headDim fp32
    uint64_t shiftMatrixOffset;  // pasa: M^T, kvBlock x kvBlock fp16
    uint64_t workspaceBytes;   // total
};

#endif  // PASA_TILING_DATA_H
