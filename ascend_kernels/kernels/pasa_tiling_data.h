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

// The band of visible keys, in top-left coordinates per batch (positions local to the batch).
constexpr uint32_t PASA_MASK_NONE = 0;
constexpr uint32_t PASA_MASK_CAUSAL = 1;  // key j visible to row i iff j <= i + next[b]
constexpr uint32_t PASA_MASK_BAND = 2;    // iff i - pre[b] <= j <= i + next[b]

// Per-batch parameters: int32 records of PASA_BATCH_FIELDS entries in the parameter buffer,
// tiling.batchParamsOffset bytes after the tiling struct's address.
constexpr uint32_t PASA_BATCH_Q_LEN = 0;     // valid query rows
constexpr uint32_t PASA_BATCH_KV_LEN = 1;    // valid keys
constexpr uint32_t PASA_BATCH_NEXT = 2;      // the band's upper offset (PASA_MASK_CAUSAL, PASA_MASK_BAND)
constexpr uint32_t PASA_BATCH_PRE = 3;       // the band's lower offset (PASA_MASK_BAND)
constexpr uint32_t PASA_BATCH_Q_START = 4;   // packed: the batch's first row on the query's S axis
constexpr uint32_t PASA_BATCH_KV_START = 5;  // packed: the batch's first key on the key's S axis
constexpr uint32_t PASA_BATCH_FIELDS = 8;    // one 32-byte record per batch

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
constexpr uint16_t PASA_FLAG_FLAGS_READY = 6;  // AIV -> AIC: a vector core's task flags are in the workspace
constexpr uint16_t PASA_FLAG_FLAGS_SEEN = 7;   // AIC -> AIV: both vector cores' task flags are

// Row flags (overflowCheck): the byte of one (task, vector core half) in the workspace.
constexpr uint32_t PASA_TASK_FLAG_BYTES = 32;  // one task flag slot (PasaTilingData::taskFlagsOffset)

// Decode with split kv: each task's kv blocks are cut into kvSplits ranges of at least
// PASA_MIN_SPLIT_BLOCKS blocks, computed by separate AI Cores and merged by their LSE.
constexpr uint32_t PASA_MIN_SPLIT_BLOCKS = 8;
constexpr uint32_t PASA_MAX_SPLITS = 16;
// Prefill whose tasks do not fill the cores' last round: the tasks of that round are each dealt as
// up to tailPieces pieces of their query rows (at least PASA_MIN_PIECE_ROWS each), one task apiece.
constexpr uint32_t PASA_MIN_PIECE_ROWS = 32;
constexpr uint32_t PASA_MAX_PIECES = 8;

// The attention pipeline: the cube computes score tiles up to PASA_LOOKAHEAD blocks ahead of
// the P'V product it is waiting for, and the vector cores fold P'V into O PASA_PV_DELAY blocks
// after they produced P'. Workspace slots per AI Core follow from the two.
constexpr uint32_t PASA_LOOKAHEAD = 4;
constexpr uint32_t PASA_PV_DELAY = 3;
constexpr uint32_t PASA_SCORE_SLOTS = PASA_LOOKAHEAD + 1;
constexpr uint32_t PASA_PROB_SLOTS = PASA_PV_DELAY + 1;
constexpr uint32_t PASA_PV_SLOTS = PASA_PV_DELAY + 1;
// The key preprocessing hands each block's column sums to the vector cores through a ring of
// PASA_SUM_SLOTS slots, so that the cube runs that many blocks ahead of their flag round trips.
constexpr uint32_t PASA_SUM_SLOTS = 8;
constexpr uint32_t PASA_CONST_BLOCKS = 128;                  // rowConstants: blocks per cube pass
constexpr uint32_t PASA_CONST_SLOTS = PASA_LOOKAHEAD + 1;    // rowConstants: passes the vector cores may still read

// The cube's L1 queue buffers. TPipe hands out 8 event IDs per HardEvent, and a freed queue
// buffer keeps its MTE1_MTE2 ID until it is allocated again, so all of them together hold at most 8.
constexpr uint32_t PASA_EVENT_IDS = 8;
constexpr uint32_t PASA_QUERY_BUFFERS = 2;  // the next task's Q lands while this one is scored
constexpr uint32_t PASA_KEY_BUFFERS = 2;
constexpr uint32_t PASA_VALUE_BUFFERS = 2;  // V of the P'V after next lands while a P'V runs
constexpr uint32_t PASA_PROB_BUFFERS = 1;       // P' whole
constexpr uint32_t PASA_PROB_PART_BUFFERS = 2;  // P' in parts (tiling.probBufferKeys): the next part lands while one is multiplied
constexpr uint32_t PASA_MEAN_BUFFERS = 1;   // the row constants' means
static_assert(PASA_QUERY_BUFFERS + PASA_KEY_BUFFERS + PASA_VALUE_BUFFERS + PASA_PROB_BUFFERS + PASA_MEAN_BUFFERS <=
                  PASA_EVENT_IDS,
              "the cube's L1 queue buffers need more MTE1_MTE2 event IDs than TPipe has");
static_assert(1 + PASA_KEY_BUFFERS + PASA_VALUE_BUFFERS + PASA_PROB_PART_BUFFERS + PASA_MEAN_BUFFERS <= PASA_EVENT_IDS,
              "with P' in parts and one Q buffer, the cube's L1 queue buffers need more MTE1_MTE2 event IDs than TPipe has");

// The most rows one vector instruction of a chunk's row vectors covers: a packed pair of fp16
// statistics is one repeat of 128 halves (PairOp), and a row broadcast repeats once per row
// (RowBroadcast, a repeat count below 256). An AIV's chunk (vecChunkRows), the rows whose
// statistics update together (vecStatRows) and the merge's rows (vecRowsPad, with split kv) stay
// within it.
constexpr uint32_t PASA_MAX_CHUNK_ROWS = 128;

// Statistics one AIV keeps in UB (see pasa_attention_vector.h): kept slots in units of vecRowsPad
// elements of fp32, a statistics group's scratch in units of vecStatRows, then a step's scratch
// in units of vecChunkRows.
constexpr uint32_t PASA_VEC_KEPT_UNITS = 21;
constexpr uint32_t PASA_VEC_GROUP_UNITS = 3;
constexpr uint32_t PASA_VEC_SCRATCH_UNITS = 11;
// Statistics of the merge kernel, in the same units (see pasa_merge.h).
constexpr uint32_t PASA_MERGE_STAT_UNITS = 18;

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
    uint32_t maskMode;       // PASA_MASK_*: the band
    uint32_t packed;         // 1: the batches are segments of one S axis (TND), at their start rows
    uint32_t hasMask;        // 1: an explicit bool mask (B or 1, S1, S2), nonzero = masked
    uint32_t maskRowStride;  // elements (bytes) between mask rows
    uint64_t maskBatchStride;  // elements between the masks of two batches (0: one mask for all)
    uint32_t paged;          // 1: K and V are caches (blocks, Nkv, blockSize, D) read through the block table
    uint32_t blockSize;      // paged: keys per physical block
    uint32_t tableStride;    // paged: entries per row of the block table
    uint32_t subBlocks;      // paged, K' in the workspace: blockSize / kvBlock
    uint32_t shiftScores;    // pasa, pasa-exact in decode (query length 1, every kv block read by one task): the cube
                             // scores the raw keys in fp32 and the vector cores shift the scores (no preprocessing)
    uint32_t partFilled;     // some batch's kv length is not a multiple of kvBlock: its last block is part-filled
    uint32_t rowConstants;   // pasa, pasa-exact with K' (no shiftScores): the preprocessing stores each block's key
                             // mean, the cube makes the row constants Q . mean (pasa: the block means of S')
    uint32_t overflowCheck;  // 1: the kernels write a flag byte per output row, 1 where its output or LSE is not finite
    uint32_t repair;         // 1: the repair pass (fa-fp32): only the tasks whose flag bytes are set, only flagged rows
    uint32_t repairTilingOffset;  // overflowCheck without split kv: bytes from this tiling struct to the repair
                                  // pass's, which the attention launch runs after its own (0: none in this launch)
    uint32_t hasSink;        // 1: learnable sinks: the sink buffer holds one fp32 logit per query head, joined to
                             // each row's softmax at its end (the vector cores' end of a task, or the merge)
    uint32_t batchParamsOffset;  // bytes from the tiling struct to the per-batch records
    float scale;             // softmax scale as fp32 (the value the fp32 arithmetic uses)
    float gamma;             // pasa: gamma = beta/(1-beta) rounded to fp32 then to fp16, held exactly
    float invKvBlock;        // 1 / kvBlock (exact: kvBlock is a power of two)
    float shiftOff;          // pasa: the fp16 value of shiftOffBits, held exactly
    float shiftRowSum;       // pasa: r = diag - (kvBlock - 1) off, the row sum of the stored M (exact in fp32): the
                             // mean of a block's unrounded K' over its v keys is colsum(K) r / v
    float resolutionLimit;   // overflowCheck, pasa and pasa-exact: a row is also flagged when |its block row maximum
                             // of S'| (or pasa's block offset |gamma mean S'|) reaches this in some kv block it sees
                             // (pasa_npu.numerics.RESOLUTION_LIMIT, passed by the host); 0 or negative: no resolution check
    uint16_t shiftDiagBits;  // pasa: fp16 bits of scale * (1 - beta/n), the diagonal of M
    uint16_t shiftOffBits;   // pasa: fp16 bits of scale * beta/n; M's off-diagonal is its negative

    // ---- blocking: a tile of batch b is heads(b) query heads of one kv group x positions(b) query
    // rows each: positions(b) = min(qBlock, qLen[b]), heads(b) = min(groupSize, qBlock / positions(b))
    uint32_t qBlock;         // query rows a tile may hold (the requested q_block)
    uint32_t qTile;          // rows of the largest tile of this call (cube M dimension)
    uint32_t qTilePad;       // qTile rounded up to 16
    uint32_t cubeRows;       // rows of the cube's Mmads: a tile of more is multiplied in pieces of cubeRows
                             // (a multiple of 16; L0A and L0C hold a piece)
    uint32_t cubeCols;       // columns of a K or V block the cube holds in L0B at once (a multiple of 16): a head
                             // dim of more is cut into pieces of cubeCols, the score's contraction accumulating
                             // over them in L0C, P'V producing its columns piece by piece
    uint32_t cubeKeys;       // keys of a K or V block the cube holds in L0B at once: kvBlock, or (a block too large
                             // for L0B whole, cubeCols then the whole head dim) a piece of the keys: the score tile
                             // is produced piece by piece of its columns, P'V's contraction accumulates over the
                             // pieces in L0C in key order
    uint32_t keyBufferKeys;  // keys of a K block in one key buffer in L1 (NZ pieces of cubeKeys keys): kvBlock, or
                             // a part of the block, which then lands a buffer at a time, each in the buffer its
                             // multiplied predecessor left
    uint32_t probBufferKeys; // keys of a P' part in one P' buffer in L1: kvBlock (the whole P' tile, one buffer), or a
                             // part of the block's keys for one piece of cubeRows rows (Zz pieces of cubeKeys keys,
                             // PASA_PROB_PART_BUFFERS buffers): the parts, row piece by row piece, each in key order,
                             // land a buffer at a time, each in the buffer a multiplied part left
    uint32_t probBuffers;    // P' buffers in L1: PASA_PROB_BUFFERS, or PASA_PROB_PART_BUFFERS with P' in parts
    uint32_t valueBuffers;   // V buffers in L1: PASA_VALUE_BUFFERS, or 1 where those do not fit (the next V then
                             // loads once a P'V is done, during the score tile that follows)
    uint32_t pvCols;         // columns of a P'V tile in its slot and in the vector cores: headDimV, or (pasa: the row
                             // sums of P' on the cube) headDimV + 16, those 16 columns each holding the row's
                             // fp16(sum P'), which the fold then rescales as it rescales O; pasa with headDimV:
                             // the vector cores sum P' (PasaProblem::vectorProbSums)
    uint32_t prepCols;       // key preprocessing: columns of K_j in L0B at once (all kvBlock keys), as cubeCols
    uint32_t queryBuffers;   // Q buffers in L1: PASA_QUERY_BUFFERS, or 1 where those do not fit L1 or TPipe's
                             // MTE1_MTE2 event IDs (PASA_EVENT_IDS) beside the other buffers (the next
                             // task's Q then loads once this one's is scored, not while)
    uint32_t shiftRows;      // pasa preprocessing: rows of M^T in L0A at once: kvBlock where M^T and the row of
                             // ones fit it, else pieces of shiftRows rows (two of them), each multiplied in turn
    uint32_t shiftWindow;    // pasa preprocessing: 1 where M^T does not fit L1 beside two key blocks: L1 then holds a
                             // band of shiftRows rows, W = [M^T rows [n - shiftRows, n) | M^T rows [0, shiftRows),
                             // columns [shiftRows, n)], whose columns [n - shiftRows - r0, 2n - shiftRows - r0) are
                             // M^T's rows [r0, r0 + shiftRows) (every row of M^T is the same row shifted)
    uint32_t prepKeyBuffers; // key preprocessing: key blocks in L1 (2: the next lands while one is multiplied; 1 where
                             // two do not fit)
    uint32_t prepVecRows;    // key preprocessing: rows of its half of a block an AIV works on at once (n / 2, or pieces
                             // of them where those do not fit its UB): pasa, of a part-filled block's K'; pasa-exact,
                             // of every block's
    uint32_t prepL0cBuffers; // pasa preprocessing: L0C buffers of shiftRows x prepCols fp32 taken in turn by a block's
                             // Mmads (its pieces of rows, then its column sums): 3 where they fit, so that no Mmad
                             // waits for the drain of the one before it, else 2
    uint32_t kvBlock;        // keys per block; the size of the shifting matrix
    uint32_t numKvBlocks;    // ceil(seqKv / kvBlock)
    uint32_t vecRows;        // rows of a tile the first AIV takes (the second takes the rest)
    uint32_t vecRowsPad;     // vecRows rounded up to 16
    uint32_t vecChunkRows;   // rows an AIV works on at once: a multiple of 16 that divides vecRowsPad, at most
                             // PASA_MAX_CHUNK_ROWS (its tiles
                             // hold a chunk; its statistics and accumulator hold all its rows)
    uint32_t vecStatRows;    // rows whose per-row statistics update as one after their chunks' tiles: the
                             // most whole chunks that divide vecRowsPad, at most PASA_MAX_CHUNK_ROWS rows
    uint32_t vecSumRows;     // pasa: rows of a chunk whose S' or P' the fp32 row sums widen at once (a multiple of 16
                             // dividing vecChunkRows; the others: vecChunkRows)

    // ---- core split
    uint32_t blockDim;       // AI Cores of the attention launch (with prepInAttention at least prepDim)
    uint32_t prepDim;        // AI Cores of the key preprocessing (0: none runs)
    uint32_t prepInAttention;  // 1: the preprocessing runs at the start of the attention launch (blockDim >=
                               // prepDim), its cores meeting the others at SyncAll; 0: a launch of its own
    uint32_t numQTiles;      // query tiles of the batch with the most
    uint32_t numTasks;       // attention tasks of the call, each piece of a tail task one (before kv splitting)
    uint32_t tailFrom;       // the tasks dealt from this ordinal on are dealt in pieces (numTasks when none is)
    uint32_t tailPieces;     // pieces of query rows per such task (1: no task is cut)
    uint32_t kvSplits;       // kv ranges per task (1: no split, no merge)
    uint32_t mergeDim;       // vector cores of the merge (with mergeInAttention at most 2 blockDim)
    uint32_t mergeInAttention;  // split kv: the merge runs at the end of the attention launch, after SyncAll, on its
                                // first mergeDim vector cores; 0: a launch of its own

    // ---- buffer plan (bytes per buffer and buffer counts)
    uint32_t l1QueryBytes, l1KeyBytes, l1ValueBytes, l1ProbBytes, l1MeanBytes;
    uint32_t l0aBytes, l0bBytes, l0cBytes;
    uint32_t ubScoreBytes, ubProbBytes, ubPvBytes, ubAccBytes, ubWorkBytes, ubTreeBytes, ubMaskBytes, ubStatBytes;
    uint32_t ubMaskTileBytes;  // hasMask: the mask bytes of a block's rows
    uint32_t ubScoreBuffers, ubProbBuffers, ubPvBuffers;

    // ---- GM workspace (byte offsets from the workspace base)
    uint64_t keyPrimeOffset;   // K' blocks: [b][hkv][block][kvBlock][headDim] fp16; paged: [slot][hkv][kvBlock][headDim]
    uint64_t keyMeanOffset;    // with K': a block's fp16 key mean (pasa: of its unrounded K'; pasa-exact: mean16 of
                               // K): [b][hkv][block][headDim]; paged: [slot][hkv][headDim]
    uint64_t partialOffset;    // split kv: per (task, split) the rows' O / l (fp32) and LSE
    uint64_t partialSlotBytes; // bytes of one (task, split): qTilePad x headDimV fp32, then 2 vecRowsPad fp32
    uint64_t coreAreaOffset;   // per-AI-Core exchange areas start here
    uint64_t coreAreaBytes;    // bytes of one AI Core's exchange area
    uint64_t scoreSlotBytes;   // S' tile slot (PASA_SCORE_SLOTS of them)
    uint64_t probSlotBytes;    // P' tile slot (PASA_PROB_SLOTS)
    uint64_t pvSlotBytes;      // P'V tile slot (PASA_PV_SLOTS)
    uint64_t constSlotBytes;   // with K': row constants Q . mean of a tile, PASA_CONST_BLOCKS x qTilePad fp32 (PASA_CONST_SLOTS)
    uint64_t colSumSlotBytes;  // preprocessing: column sums of one block, headDim fp32 (PASA_SUM_SLOTS slots)
    uint64_t tailSlotBytes;    // pasa preprocessing: a part-filled block's M^T K (kvBlock x headDim fp32), after the
                               // column sums' slots (one slot)
    uint64_t shiftMatrixOffset;  // pasa: M^T, kvBlock x kvBlock fp16; with shiftScores the score map instead: for
                                 // v = 0 .. kvBlock keys, fp32 [a_v, off_v] (pasa::FillScoreMap)
    uint64_t taskFlagsOffset;  // overflowCheck: a 32-byte slot per (task, vector core half): its byte is 1 if a row is
                               // flagged; then, without split kv, one per (AI Core of the launch, vector core half): 1 if
                               // any of its tasks' bytes is (pasa::CoreFlagSlot)
    uint64_t workspaceBytes;   // total
};

#endif  // PASA_TILING_DATA_H
