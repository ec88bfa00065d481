// Host tiling of the PASA kernels (see pasa_tiling.h).
#include "pasa_tiling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace pasa {
namespace {

[[noreturn]] void Reject(const std::string& msg) { throw std::invalid_argument(msg); }

uint32_t Align(uint32_t v, uint32_t a) { return (v + a - 1) / a * a; }
uint64_t Align64(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Kib(uint64_t b) { return std::to_string(b) + " B (" + std::to_string(b / 1024.0).substr(0, 6) + " KiB)"; }

}  // namespace

uint16_t DoubleToHalfBits(double v)
{
    const uint16_t sign = std::signbit(v) ? 0x8000u : 0;
    double a = std::fabs(v);
    if (std::isnan(v)) return 0x7e00u;
    if (a >= 65520.0) return sign | 0x7c00u;  // rounds to inf
    if (a < std::ldexp(1.0, -14)) {            // subnormal: multiples of 2^-24
        return sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
    }
    int e;
    std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
    const double q = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits, exact scaling
    double r = std::ldexp(q, e - 11);
    if (r >= 65520.0) return sign | 0x7c00u;
    int re;
    const double rf = std::frexp(r, &re);
    const uint32_t exp = static_cast<uint32_t>(re - 1 + 15);
    const uint32_t mant = static_cast<uint32_t>(std::ldexp(rf, 11)) & 0x3ffu;
    return sign | static_cast<uint16_t>((exp << 10) | mant);
}

uint16_t FloatToHalfBits(float f)
{
    // float -> double is exact, so rounding the double once gives the float's RNE rounding.
    return DoubleToHalfBits(static_cast<double>(f));
}

double HalfBitsToDouble(uint16_t h)
{
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int e = (h >> 10) & 0x1f;
    const int m = h & 0x3ff;
    if (e == 0) return sign * std::ldexp(m, -24);
    if (e == 31) return m ? NAN : sign * INFINITY;
    return sign * std::ldexp(1024 + m, e - 25);
}

double OptimalBeta(double beta0, uint32_t n, double scale)
{
    if (n < 2) Reject("the shifting matrix needs n >= 2");
    if (!(beta0 > 0.0 && beta0 < 1.0)) Reject("beta0 must lie in (0, 1)");
    double beta = beta0;
    for (int it = 0; it < 200; ++it) {
        // the stored entries: scale (1 - beta/n) and scale beta/n, each rounded once to fp16
        const double b = HalfBitsToDouble(DoubleToHalfBits(scale * beta / n)) / scale;
        const double a = HalfBitsToDouble(DoubleToHalfBits(scale * (1.0 - beta / n))) / scale + b;
        const double gamma = b * n / (a * (a - b * n)) + (1.0 - a) / a;
        const double next = gamma / (1.0 + gamma);
        if (!(next > 0.0 && next < 1.0)) Reject("the optimal accuracy condition has no solution in (0, 1)");
        if (std::fabs(next - beta) <= 1e-12 * std::fabs(beta)) return next;
        beta = next;
    }
    Reject("the optimal beta iteration did not converge");
}

void FillShiftMatrix(const PasaTilingData& t, uint16_t* dst)
{
    const uint16_t off = static_cast<uint16_t>(t.shiftOffBits ^ 0x8000u);  // negated
    for (uint32_t i = 0; i < t.kvBlock; ++i) {
        for (uint32_t j = 0; j < t.kvBlock; ++j) dst[i * t.kvBlock + j] = i == j ? t.shiftDiagBits : off;
    }
}

uint64_t FlagAreaBytes(const PasaTilingData& t)
{
    return (static_cast<uint64_t>(t.numTasks) + t.blockDim) * 2 * PASA_TASK_FLAG_BYTES;
}

uint64_t ScoreMapBytes(const PasaTilingData& t) { return (static_cast<uint64_t>(t.kvBlock) + 1) * 2 * sizeof(float); }

void FillScoreMap(const PasaTilingData& t, float* dst)
{
    // pasa_npu.beta.partial_block_shift: diag_v = diag + off - off_v and off_v = off n / v in double, each
    // rounded to fp32; a_v = diag_v + off_v in fp32 (the Triton table and the torch backend's score map)
    const double diag = HalfBitsToDouble(t.shiftDiagBits), off = HalfBitsToDouble(t.shiftOffBits);
    dst[0] = dst[1] = 0.0f;
    for (uint32_t v = 1; v <= t.kvBlock; ++v) {
        const double offV = off * t.kvBlock / v;
        const float diagV = static_cast<float>(diag + off - offV), offV32 = static_cast<float>(offV);
        dst[2 * v] = diagV + offV32;
        dst[2 * v + 1] = offV32;
    }
}

namespace {

void Validate(const PasaProblem& p)
{
    if (p.tilingKey > PASA_KEY_PASA_EXACT) Reject("tilingKey must be 0 (fa-fp32), 1 (pasa) or 2 (pasa-exact), got " + std::to_string(p.tilingKey));
    if (p.batch == 0 || p.numHeads == 0 || p.numKvHeads == 0) Reject("batch, numHeads and numKvHeads must be positive");
    if (p.numHeads % p.numKvHeads != 0) {
        Reject("numHeads (" + std::to_string(p.numHeads) + ") must be a multiple of numKvHeads (" + std::to_string(p.numKvHeads) + ")");
    }
    if (p.headDim == 0 || p.headDim % 16 != 0) Reject("headDim must be a positive multiple of 16 (cube fractals are 16 wide), got " + std::to_string(p.headDim));
    if (p.headDimV == 0 || p.headDimV % 16 != 0) Reject("headDimV must be a positive multiple of 16, got " + std::to_string(p.headDimV));
    if (!PowerOfTwo(p.kvBlock) || p.kvBlock < 16 || p.kvBlock > 1024) {
        Reject("kvBlock must be a power of two in [16, 1024] (every allocation shares the tiling, and pasa scales its block means by 1/kvBlock, exact only for a power of two), got " + std::to_string(p.kvBlock));
    }
    if (p.qBlock == 0 || p.qBlock > 4095) Reject("qBlock must lie in [1, 4095], got " + std::to_string(p.qBlock));
    if (p.qLayout > PASA_LAYOUT_BSND || p.kvLayout > PASA_LAYOUT_BSND || p.outLayout > PASA_LAYOUT_BSND) Reject("layouts must be BNSD (0) or BSND (1)");
    if (p.outDtype > PASA_OUT_BF16) Reject("outDtype must be 0 (fp16) or 1 (bf16)");
    if (p.inDtype > PASA_IN_BF16) Reject("inDtype must be 0 (fp16) or 1 (bf16)");
    if (p.inDtype == PASA_IN_BF16 && (p.tilingKey != PASA_KEY_FA_FP32 || p.outDtype != PASA_OUT_BF16)) {
        Reject("bf16 inputs run only with fa-fp32 and a bf16 output (PASA computes in fp16)");
    }
    if (p.maskMode > PASA_MASK_BAND) Reject("maskMode must be 0 (none), 1 (causal band) or 2 (band with both bounds)");
    if (p.hasMask && (p.maskRowStride < p.seqKv || p.kvBlock < 32)) {
        Reject("an explicit mask needs maskRowStride >= seqKv and kvBlock >= 32 (a mask row of a block fills 32 bytes)");
    }
    if (p.paged) {
        if (p.blockSize == 0 || p.blockSize % 16 != 0 || p.blockSize > 512) {
            Reject("blockSize must be a multiple of 16 in [16, 512], got " + std::to_string(p.blockSize));
        }
        if (p.tableStride == 0 || p.numBlocks == 0) Reject("paged KV needs a block table (tableStride, numBlocks > 0)");
        if (p.seqKv != p.blockSize) Reject("paged KV: seqKv (the cache's S axis) must equal blockSize");
    }
    if (p.kvSplits > PASA_MAX_SPLITS) Reject("kvSplits must be at most " + std::to_string(PASA_MAX_SPLITS));
    if (p.tailPieces > PASA_MAX_PIECES) Reject("tailPieces must be at most " + std::to_string(PASA_MAX_PIECES));
    if (!(p.scale > 0.0) || !std::isfinite(p.scale)) Reject("scale must be finite and positive");
    if (std::isnan(p.resolutionLimit)) Reject("resolutionLimit must be a number (0 or negative: no resolution check)");
    if (p.coreNum == 0) Reject("coreNum must be positive (the platform's AI Core count)");
    if (p.vectorProbSums && p.tilingKey != PASA_KEY_PASA) {
        Reject("vectorProbSums applies to pasa (tilingKey 1) only, got tilingKey " + std::to_string(p.tilingKey));
    }
    // 16-bit DMA parameters: row strides in elements.
    const uint64_t qStride = p.qLayout == PASA_LAYOUT_BNSD ? p.headDim : static_cast<uint64_t>(p.numHeads) * p.headDim;
    const uint64_t kvStride = p.kvLayout == PASA_LAYOUT_BNSD ? std::max(p.headDim, p.headDimV)
                                                             : static_cast<uint64_t>(p.numKvHeads) * std::max(p.headDim, p.headDimV);
    const uint64_t outStride = p.outLayout == PASA_LAYOUT_BNSD ? p.headDimV : static_cast<uint64_t>(p.numHeads) * p.headDimV;
    if (qStride > 65535 || kvStride > 65535 || (outStride - p.headDimV) * 2 / 32 > 65535) {
        Reject("a row stride exceeds the 16-bit DMA stride fields (heads x head dim too large)");
    }
}

void FillProblem(const PasaProblem& p, PasaTilingData& t)
{
    t.tilingKey = p.tilingKey;
    t.batch = p.batch;
    t.numHeads = p.numHeads;
    t.numKvHeads = p.numKvHeads;
    t.groupSize = p.numHeads / p.numKvHeads;
    t.seqQ = p.seqQ;
    t.seqKv = p.seqKv;
    t.headDim = p.headDim;
    t.headDimV = p.headDimV;
    t.qLayout = p.qLayout;
    t.kvLayout = p.kvLayout;
    t.outLayout = p.outLayout;
    t.outDtype = p.outDtype;
    t.inDtype = p.inDtype;
    t.maskMode = p.maskMode;
    t.packed = p.packed ? 1 : 0;
    t.hasMask = p.hasMask ? 1 : 0;
    t.overflowCheck = p.overflowCheck ? 1 : 0;
    t.repair = p.repair ? 1 : 0;
    t.hasSink = p.hasSink ? 1 : 0;
    t.maskRowStride = p.maskRowStride;
    t.maskBatchStride = p.maskBatchStride;
    t.paged = p.paged ? 1 : 0;
    t.blockSize = p.blockSize;
    t.tableStride = p.tableStride;
    t.batchParamsOffset = static_cast<uint32_t>(Align64(sizeof(PasaTilingData), 64));
    t.scale = static_cast<float>(p.scale);
    t.invKvBlock = 1.0f / static_cast<float>(p.kvBlock);
    // the resolution check runs only where rows are checked, and only in the shifted allocations
    const bool shifted = p.tilingKey == PASA_KEY_PASA || p.tilingKey == PASA_KEY_PASA_EXACT;
    t.resolutionLimit = p.overflowCheck && shifted && p.resolutionLimit > 0.0 ? static_cast<float>(p.resolutionLimit) : 0.0f;
    if (p.tilingKey == PASA_KEY_PASA) {
        const double beta = p.beta < 0.0 ? OptimalBeta(kDefaultBeta0, p.kvBlock, p.scale) : p.beta;
        if (!(beta >= 0.0 && beta < 1.0)) Reject("beta must lie in [0, 1) for pasa");
        const double n = p.kvBlock;
        t.shiftDiagBits = DoubleToHalfBits(p.scale * (1.0 - beta / n));
        t.shiftOffBits = DoubleToHalfBits(p.scale * beta / n);
        t.shiftOff = static_cast<float>(HalfBitsToDouble(t.shiftOffBits));
        // diag and off are fp16 and (n - 1) off spans at most 19 bits below diag's top: exact in fp32
        t.shiftRowSum = static_cast<float>(HalfBitsToDouble(t.shiftDiagBits) - (n - 1.0) * HalfBitsToDouble(t.shiftOffBits));
        // gamma = beta/(1-beta) held as fp32, then rounded to fp16 (the fp16 statistics use it)
        const float gamma32 = static_cast<float>(beta / (1.0 - beta));
        t.gamma = static_cast<float>(HalfBitsToDouble(FloatToHalfBits(gamma32)));
    }
}

// Kv ranges per task for `tasks` decode tasks of up to `blocks` kv blocks on `cores` AI Cores: only
// when some core would have no task (with a task per core, decode reads K and V at the chip's
// bandwidth already, and a split would add the merge launch); then the fewest ranges that fill
// the cores' rounds best, each at least PASA_MIN_SPLIT_BLOCKS blocks, if that beats one range
// per task by 10%.
uint32_t ChooseSplits(uint32_t tasks, uint32_t blocks, uint32_t cores)
{
    if (tasks >= cores) return 1;
    auto efficiency = [&](uint32_t s) {
        const uint64_t units = static_cast<uint64_t>(tasks) * s, rounds = (units + cores - 1) / cores;
        return static_cast<double>(units) / static_cast<double>(rounds * cores);
    };
    const uint32_t most = std::min<uint32_t>(PASA_MAX_SPLITS, std::max<uint32_t>(1, blocks / PASA_MIN_SPLIT_BLOCKS));
    uint32_t best = 1;
    for (uint32_t s = 2; s <= most; ++s) {
        if (efficiency(s) > efficiency(best) + 1e-9) best = s;
    }
    return efficiency(best) >= 1.1 * efficiency(1) ? best : 1;
}

// Prefill whose tasks leave cores idle in their last round: each task of that round is dealt as
// pieces of its query rows (AttentionTaskIter), as many as fill the round, each of at least
// PASA_MIN_PIECE_ROWS rows; p.tailPieces forces the count. Every piece is a task of its own.
void PlanTail(const PasaProblem& p, PasaTilingData& t)
{
    const uint32_t tasks = t.numTasks, last = tasks % p.coreNum;
    uint32_t pieces = 1;
    if (last > 0) {
        pieces = p.tailPieces > 0 ? p.tailPieces
                                  : std::min({PASA_MAX_PIECES, p.coreNum / last, std::max(1u, t.qTile / PASA_MIN_PIECE_ROWS)});
    }
    t.tailPieces = pieces;
    t.tailFrom = t.tailPieces > 1 ? tasks - last : tasks;
    t.numTasks = t.tailFrom + (tasks - t.tailFrom) * t.tailPieces;
}

// UB of the merge kernel (pasa_merge.h): two partial O tiles, the splits' LSE rows, the merged O,
// the broadcast blocks and the output staging, its statistics.
uint64_t MergeUbBytes(const PasaTilingData& t)
{
    const uint64_t r = t.vecRowsPad, dv = t.headDimV;
    return 2 * r * dv * 4 + t.kvSplits * r * 4 + r * dv * 4 + 32 * r + r * dv * 2 + PASA_MERGE_STAT_UNITS * r * 4;
}

uint32_t LengthOf(const int32_t* lens, uint32_t b, uint32_t full)
{
    return lens == nullptr ? full : static_cast<uint32_t>(std::max<int32_t>(0, lens[b]));
}

void SetPrepDim(const PasaProblem& p, PasaTilingData& t);

// Tiles: a batch whose query is shorter than q_block stacks the heads of a kv group into its tiles
// (TileShape in pasa_kernel_common.h). The buffers take the largest tile of the call.
void PlanBlocking(const PasaProblem& p, const BatchLengths* lengths, PasaTilingData& t)
{
    const uint32_t n = p.kvBlock;
    t.kvBlock = n;
    t.qBlock = p.qBlock;
    t.subBlocks = p.paged && p.blockSize % n == 0 ? p.blockSize / n : 0;
    const uint32_t fullKv = p.paged ? p.tableStride * p.blockSize : p.seqKv;
    uint32_t rows = 1, tiles = 1, maxKvBlocks = 1, partFilled = 0;
    uint64_t tasks = 0;
    bool oneTaskPerHead = true, decode = true;
    for (uint32_t b = 0; b < p.batch; ++b) {
        const uint32_t qLen = LengthOf(lengths ? lengths->qLens : nullptr, b, p.seqQ);
        const uint32_t kvLen = LengthOf(lengths ? lengths->kvLens : nullptr, b, fullKv);
        const uint32_t pitch = std::min(p.qBlock, std::max<uint32_t>(1, qLen));
        const uint32_t heads = std::min(t.groupSize, std::max<uint32_t>(1, p.qBlock / pitch));
        const uint32_t chunks = (t.groupSize + heads - 1) / heads, qTiles = (qLen + pitch - 1) / pitch;
        rows = std::max(rows, heads == 1 ? pitch : heads * pitch);
        tiles = std::max(tiles, qTiles);
        maxKvBlocks = std::max(maxKvBlocks, (kvLen + n - 1) / n);
        partFilled += kvLen % n != 0 ? 1 : 0;
        tasks += static_cast<uint64_t>(p.numKvHeads) * chunks * qTiles;
        oneTaskPerHead = oneTaskPerHead && chunks * qTiles <= 1;
        decode = decode && qLen <= 1;
    }
    t.qTile = rows;
    t.qTilePad = Align(t.qTile, 16);
    t.vecRows = (t.qTile + 1) / 2;
    t.vecRowsPad = Align(t.vecRows, 16);
    t.numQTiles = tiles;
    t.numTasks = static_cast<uint32_t>(std::max<uint64_t>(1, tasks));
    t.numKvBlocks = p.paged ? (fullKv + n - 1) / n : std::max<uint32_t>(1, (p.seqKv + n - 1) / n);
    // decode, every kv block read by one task: its scores are shifted where they are formed, with no
    // preprocessing launch (a tile of a few rows shifts its scores for less than a pass over K costs;
    // a tile of a longer query keeps K', whose scores cross in fp16)
    t.shiftScores = p.tilingKey != PASA_KEY_FA_FP32 && oneTaskPerHead && decode ? 1 : 0;
    t.partFilled = partFilled > 0 ? 1 : 0;
    t.kvSplits = 1;
    if (oneTaskPerHead) t.kvSplits = p.kvSplits > 0 ? p.kvSplits : ChooseSplits(t.numTasks, maxKvBlocks, p.coreNum);
    // the merge's tiles would not fit, or its rows exceed what its row instructions cover
    if (t.kvSplits > 1 && (MergeUbBytes(t) > kUbUserBytes || t.vecRowsPad > PASA_MAX_CHUNK_ROWS)) t.kvSplits = 1;
    t.tailPieces = 1;
    t.tailFrom = t.numTasks;
    if (!oneTaskPerHead) PlanTail(p, t);
    const uint64_t units = static_cast<uint64_t>(t.numTasks) * t.kvSplits;
    t.blockDim = static_cast<uint32_t>(std::min<uint64_t>(p.coreNum, units));
    t.mergeDim = static_cast<uint32_t>(std::min<uint64_t>(2ull * p.coreNum, 2ull * t.numTasks));
    t.mergeInAttention = t.kvSplits > 1 && !p.mergeLaunch ? 1 : 0;
    if (t.mergeInAttention) t.mergeDim = std::min(t.mergeDim, 2 * t.blockDim);
    SetPrepDim(p, t);
}

// The key preprocessing's cores: a task per key block; none where no preprocessing runs (fa-fp32,
// shiftScores). It runs at the start of the attention launch, which takes as many AI Cores as it
// does (those past the attention's tasks only preprocess), so that it costs no launch of its own
// (p.prepLaunch: a launch of its own all the same).
void SetPrepDim(const PasaProblem& p, PasaTilingData& t)
{
    const uint64_t keyBlocks = p.paged ? static_cast<uint64_t>(p.batch) * p.tableStride * std::max<uint32_t>(1, t.subBlocks)
                                       : static_cast<uint64_t>(p.batch) * t.numKvBlocks;
    const bool prepare = p.tilingKey != PASA_KEY_FA_FP32 && !t.shiftScores;
    t.prepDim = prepare ? static_cast<uint32_t>(std::min<uint64_t>(p.coreNum, std::max<uint64_t>(1, keyBlocks * p.numKvHeads))) : 0;
    t.prepInAttention = prepare && !p.prepLaunch ? 1 : 0;
    t.rowConstants = prepare ? 1 : 0;
    if (t.prepInAttention) t.blockDim = std::max(t.blockDim, t.prepDim);
}

// pasa sums P' on the cube (its P'V tile's last columns) unless the problem puts the sums on the
// vector cores: the cube's Mmads against the vector cores' widening and reductions
bool ProbSumsOnCube(const PasaProblem& p, const PasaTilingData& t) { return t.tilingKey == PASA_KEY_PASA && !p.vectorProbSums; }

// pasa widens fp16 rows to fp32 on the vector cores for row sums: of S' for its block means where it
// shifts the scores (else the cube's row constants are its block means), of P' where the cube does
// not sum it
bool WidensRows(const PasaTilingData& t)
{
    return t.tilingKey == PASA_KEY_PASA && (!t.rowConstants || t.pvCols == t.headDimV);
}

// AIC buffers: Q, keyBufferKeys keys of K' (or K; the whole block unless the problem sets fewer), V,
// P' (the whole tile, or parts of probBufferKeys keys of a piece of cubeRows rows where the problem
// sets fewer) and the means in L1 (PASA_*_BUFFERS each, one Q buffer where two do not fit L1 or
// TPipe's event IDs); two L0A, two L0B and two L0C buffers. An L0B buffer holds a K or V block whole where it fits; else, where a
// piece of at least 128 keys fits with the whole head dim, cubeKeys keys of it (the cube then loads
// each piece once per piece of rows, not the whole block once per piece of rows and columns; the
// problem may set fewer); else the most columns (a multiple of 16) of all its keys, cubeCols. L0A
// and L0C hold a piece of cubeRows rows: all of the tile's where they fit, else the most (a
// multiple of 16) that do. The key preprocessing holds all kvBlock keys of prepCols columns.
void PlanCube(const PasaProblem& p, PasaTilingData& t, PasaBudget& b)
{
    const bool constants = t.rowConstants != 0;  // the row constants' Mmad
    const uint32_t n = t.kvBlock, d = t.headDim, dv = t.headDimV, mp = t.qTilePad, wide = std::max(d, dv);
    const uint32_t meanRows = Align(std::min(t.numKvBlocks, PASA_CONST_BLOCKS), 16);
    const uint32_t l0bBuffer = kL0BBytes / 2, blockCols = l0bBuffer / (n * 2) / 16 * 16;  // of all n keys
    t.cubeKeys = n;
    while (t.cubeKeys > 128 && t.cubeKeys * wide * 2 > l0bBuffer) t.cubeKeys /= 2;
    if (t.cubeKeys * wide * 2 > l0bBuffer) t.cubeKeys = n;
    // pasa in more than two pieces: a piece of V with the ones of P''s row sums beside it
    while (ProbSumsOnCube(p, t) && n / t.cubeKeys > 2 && t.cubeKeys > 16 && t.cubeKeys * (dv + 16) * 2 > l0bBuffer) {
        t.cubeKeys /= 2;
    }
    if (p.cubeKeys != 0) {
        if (p.cubeKeys % 16 != 0 || n % p.cubeKeys != 0 || p.cubeKeys * wide * 2 > l0bBuffer) {
            Reject("cubeKeys must be a multiple of 16 dividing kvBlock (" + std::to_string(n) + ") whose keys fit an L0B buffer "
                   "with the whole head dim (" + std::to_string(wide) + "), got " + std::to_string(p.cubeKeys));
        }
        t.cubeKeys = p.cubeKeys;
    }
    const uint32_t nk = t.cubeKeys;
    for (const auto& [name, keys] : {std::pair<const char*, uint32_t>{"keyBufferKeys", p.keyBufferKeys}, {"probBufferKeys", p.probBufferKeys}}) {
        if (keys != 0 && (keys % nk != 0 || n % keys != 0)) {
            Reject(std::string(name) + " must be a multiple of the cube's key piece (" + std::to_string(nk) +
                   ") that divides kvBlock (" + std::to_string(n) + "), got " + std::to_string(keys));
        }
    }
    t.prepCols = std::max(16u, std::min(d, blockCols));
    // pasa: the row sums of P' from the cube, 16 more columns of the P'V tile. A row piece's P' pieces
    // stay in L0A (its two buffers) until a block of ones multiplies them; more pieces each meet the
    // ones beside their values in L0B (nk keys x (dv + 16) columns)
    t.pvCols = ProbSumsOnCube(p, t) ? dv + 16 : dv;
    const bool sumsBeside = ProbSumsOnCube(p, t) && n / nk > 2;
    if (sumsBeside && nk * (dv + 16) * 2 > l0bBuffer) {
        Reject("pasa multiplies each of a block's more than two key pieces by a block of ones beside its values in L0B: "
               "cubeKeys (" + std::to_string(nk) + ") keys of headDimV + 16 (" + std::to_string(dv + 16) +
               ") columns must fit an L0B buffer (" + std::to_string(l0bBuffer) + " bytes)");
    }
    t.cubeCols = nk < n ? wide : std::max(16u, std::min(wide, blockCols));
    const uint32_t dc = std::min(d, t.cubeCols), dvc = std::min(dv, t.cubeCols);
    for (uint32_t rows = mp; rows >= 16; rows -= 16) {
        t.cubeRows = rows;
        t.l0aBytes = Align(std::max({rows * dc, rows * nk, constants ? meanRows * dc : 0u}) * 2, 512);
        t.l0bBytes = Align(std::max({nk * dc, nk * (dvc + (sumsBeside ? 16 : 0)), constants ? rows * dc : 0u}) * 2, 512);
        t.l0cBytes = Align(std::max({rows * nk, rows * dvc, constants ? meanRows * rows : 0u}) * 4, 1024);
        b.l0a = 2ull * t.l0aBytes;
        b.l0b = 2ull * t.l0bBytes;
        b.l0c = 2ull * t.l0cBytes;
        if (b.l0a <= kL0ABytes && b.l0b <= kL0BBytes && b.l0c <= kL0CBytes) break;
    }
    t.l1QueryBytes = mp * d * 2;
    t.l1ValueBytes = n * dv * 2;
    t.l1MeanBytes = constants ? meanRows * d * 2 : 0;
    const uint32_t meanBuffers = constants ? PASA_MEAN_BUFFERS : 0;
    // K' and P' in buffers of keyKeys and probKeys keys, valueBuffers V buffers: whether they fit L1
    auto fitL1 = [&](uint32_t keyKeys, uint32_t probKeys, uint32_t valueBuffers) {
        t.keyBufferKeys = keyKeys;
        t.probBufferKeys = probKeys;
        t.probBuffers = probKeys < n ? PASA_PROB_PART_BUFFERS : PASA_PROB_BUFFERS;
        t.valueBuffers = valueBuffers;
        t.l1KeyBytes = keyKeys * d * 2;
        t.l1ProbBytes = (probKeys < n ? t.cubeRows * probKeys : mp * n) * 2;
        const uint32_t events = PASA_KEY_BUFFERS + valueBuffers + t.probBuffers + meanBuffers;
        const uint64_t others = static_cast<uint64_t>(PASA_KEY_BUFFERS) * t.l1KeyBytes + static_cast<uint64_t>(valueBuffers) * t.l1ValueBytes +
                                static_cast<uint64_t>(t.probBuffers) * t.l1ProbBytes + static_cast<uint64_t>(meanBuffers) * t.l1MeanBytes;
        const bool twoQueries = others + static_cast<uint64_t>(PASA_QUERY_BUFFERS) * t.l1QueryBytes <= kL1Bytes &&
                                PASA_QUERY_BUFFERS + events <= PASA_EVENT_IDS;
        t.queryBuffers = twoQueries ? PASA_QUERY_BUFFERS : 1;
        b.l1 = others + static_cast<uint64_t>(t.queryBuffers) * t.l1QueryBytes;
        return b.l1 <= kL1Bytes;
    };
    // whole blocks and two V buffers where they fit; else (blocks L1 does not hold whole) K' and P' in
    // parts of 128 keys (or the cube's piece, if larger), then V in one buffer
    const uint32_t part = std::min(n, std::max(nk, 128u));
    if (p.keyBufferKeys != 0 || p.probBufferKeys != 0) {
        fitL1(p.keyBufferKeys != 0 ? p.keyBufferKeys : n, p.probBufferKeys != 0 ? p.probBufferKeys : n, PASA_VALUE_BUFFERS);
    } else if (!fitL1(n, n, PASA_VALUE_BUFFERS) && !fitL1(part, part, PASA_VALUE_BUFFERS)) {
        fitL1(part, part, 1);
    }
}

// Bytes of `tree` that RowReduce (pasa_vector_ops.h) fills reducing rows x cols of elemBytes-byte
// elements: every level of block pairs, and for fp32 the rows' final 8-block sums.
uint32_t RowReduceTreeBytes(uint32_t rows, uint32_t cols, uint32_t elemBytes)
{
    const uint32_t perBlock = 32 / elemBytes;
    uint32_t blocks = cols / perBlock, elems = 0;
    const uint32_t stop = (elemBytes == 4 && blocks >= 8) ? 8 : 1;
    for (; blocks > stop; blocks /= 2) elems += rows * blocks / 2 * perBlock;
    if (blocks == 8) elems += rows * perBlock;
    return elems * elemBytes;
}

// AIV buffers (per vector core). A vector core works on its vecRowsPad rows in chunks of vecChunkRows:
// the score, P' and P'V tiles (double-buffered when they fit: P' gives way first, then P'V, then the
// scores), the fp32 work tile (pasa: vecSumRows rows of S' or P' widened for their row sums, where
// it makes them; else the output tile), the reduction tree (also the output staging), the mask bit tiles, the mask bytes and a step's
// scratch statistics hold a chunk; the row sums and constants of a statistics group hold vecStatRows
// rows (the chunks whose per-row statistics update together); the accumulator, the kept statistics
// and the rows' positions (rel, broadcast) hold all of them.
uint64_t PlanVectorChunk(PasaTilingData& t, uint32_t r, uint32_t sumRows)
{
    const uint32_t all = t.vecRowsPad, n = t.kvBlock, dv = t.headDimV;
    const bool fa = t.tilingKey == PASA_KEY_FA_FP32, pasa = t.tilingKey == PASA_KEY_PASA;
    t.vecChunkRows = r;
    t.vecSumRows = WidensRows(t) ? sumRows : r;
    t.vecStatRows = r;
    for (uint32_t g = 2 * r; g <= std::min(all, PASA_MAX_CHUNK_ROWS); g += r) {
        if (all % g == 0) t.vecStatRows = g;
    }
    const uint32_t g = t.vecStatRows, widened = pasa && !WidensRows(t) ? 0 : t.vecSumRows;  // rows of S' or P' widened to fp32
    t.ubScoreBytes = r * n * (fa || t.shiftScores ? 4 : 2);  // fp32 scores, shifted in place to fp16 S'
    t.ubProbBytes = r * n * 2;
    t.ubPvBytes = r * t.pvCols * (fa ? 4 : 2);
    t.ubAccBytes = all * t.pvCols * (pasa ? 2 : 4);
    t.ubWorkBytes = fa ? 32 : std::max(widened * n, r * dv) * 4;
    // the fp32 and fp16 row reductions over a score row; the output staging and a block a row; a
    // block for each of pasa's two rescale factors of a statistics group's rows (and its update's
    // scratch)
    t.ubTreeBytes = std::max({RowReduceTreeBytes(widened, n, 4), RowReduceTreeBytes(r, n, 2), r * std::max(n, dv) * 2 + 32 * r,
                              64 * g});
    // the column index row, the broadcast row positions (all rows), two bit tiles, row bits
    t.ubMaskBytes = Align(n * 2, 32) + 32 * all + 2 * Align(r * n / 8, 32) + Align(g, 32) + 32;
    t.ubStatBytes = (PASA_VEC_KEPT_UNITS * all + PASA_VEC_GROUP_UNITS * g + PASA_VEC_SCRATCH_UNITS * r) * 4;
    t.ubMaskTileBytes = t.hasMask ? r * n : 0;
    const uint64_t fixed = static_cast<uint64_t>(t.ubAccBytes) + t.ubWorkBytes + t.ubTreeBytes + t.ubMaskBytes +
                           t.ubStatBytes + 2ull * Align(r * 4, 32) + t.ubMaskTileBytes;
    uint32_t score = 2, prob = 2, pv = 2;
    auto need = [&]() { return fixed + static_cast<uint64_t>(score) * t.ubScoreBytes + static_cast<uint64_t>(prob) * t.ubProbBytes +
                               static_cast<uint64_t>(pv) * t.ubPvBytes; };
    if (need() > kUbUserBytes) prob = 1;
    if (need() > kUbUserBytes) pv = 1;
    if (need() > kUbUserBytes) score = 1;
    t.ubScoreBuffers = score;
    t.ubProbBuffers = prob;
    t.ubPvBuffers = pv;
    return need();
}

// A chunk of r rows that fits the UB (with two score buffers where doubleScores), pasa's S' widened
// in the most rows (a multiple of 16 dividing r) that allow it; false where none does (the plan of
// the last one tried stays in t and b).
bool FitVectorChunk(PasaTilingData& t, PasaBudget& b, uint32_t r, bool doubleScores)
{
    for (uint32_t sumRows = r; sumRows >= 16; sumRows -= 16) {
        if (r % sumRows != 0) continue;
        b.ub = PlanVectorChunk(t, r, sumRows);
        if (b.ub <= kUbUserBytes && (t.ubScoreBuffers == 2 || !doubleScores)) return true;
        if (!WidensRows(t)) break;
    }
    return false;
}

// The chunk: the problem's vecChunkRows; else all of the vector core's rows where they fit, even
// with one buffer of each tile (a block's tile instructions and its statistics update then run once,
// each instruction's start-up paid once); else the most rows (a multiple of 16 dividing them, at most
// PASA_MAX_CHUNK_ROWS) whose score tiles keep two buffers (the next block's scores land while this
// one's are worked on), else the most rows that fit at all.
void PlanVector(const PasaProblem& p, PasaTilingData& t, PasaBudget& b)
{
    const uint32_t all = t.vecRowsPad;
    if (p.vecChunkRows != 0) {
        if (p.vecChunkRows % 16 != 0 || all % std::min(p.vecChunkRows, all) != 0 || p.vecChunkRows > PASA_MAX_CHUNK_ROWS) {
            Reject("vecChunkRows must be a multiple of 16 of at most " + std::to_string(PASA_MAX_CHUNK_ROWS) +
                   " that divides the vector core's " + std::to_string(all) + " rows, got " + std::to_string(p.vecChunkRows));
        }
        FitVectorChunk(t, b, std::min(p.vecChunkRows, all), false);
        return;
    }
    if (all <= PASA_MAX_CHUNK_ROWS && FitVectorChunk(t, b, all, false)) return;
    for (const bool doubleScores : {true, false}) {
        for (uint32_t r = std::min(all, PASA_MAX_CHUNK_ROWS); r >= 16; r -= 16) {
            if (all % r == 0 && FitVectorChunk(t, b, r, doubleScores)) return;
        }
    }
}

void PlanPreprocessing(PasaTilingData& t, PasaBudget& b)
{
    const uint64_t n = t.kvBlock, d = t.headDim, dc = t.prepCols;  // dc: a piece of K's columns
    const uint64_t keyBlock = n * d * 2;  // a block of keys staged in L1
    if (t.prepDim == 0) return;  // no preprocessing launch
    if (t.tilingKey == PASA_KEY_PASA) {
        // M^T and the row of ones (every block's column sums); the vector cores make the key means and
        // correct the part-filled blocks. L0A holds M^T whole where it fits beside the ones, else two
        // pieces of its rows in turn (the ones then take a piece's buffer for the column sums)
        const uint64_t ones = 16 * n * 2;
        t.shiftRows = static_cast<uint32_t>(n);
        if (n * n * 2 + ones > kL0ABytes) {
            t.shiftRows /= 2;
            while (t.shiftRows > 16 && 2 * t.shiftRows * n * 2 > kL0ABytes) t.shiftRows /= 2;
        }
        // M^T whole in L1 where it fits beside the ones and two key blocks, else a band of shiftRows
        // rows; one key block where two do not fit beside the band
        t.shiftWindow = n * n * 2 + ones + 2 * keyBlock > kL1Bytes ? 1 : 0;
        const uint64_t shift = (t.shiftWindow ? t.shiftRows * (2 * n - t.shiftRows) : n * n) * 2;
        t.prepKeyBuffers = shift + ones + 2 * keyBlock <= kL1Bytes ? 2 : 1;
        b.prepL1 = shift + ones + t.prepKeyBuffers * keyBlock;
        b.prepL0a = t.shiftRows == n ? n * n * 2 + ones : 2ull * t.shiftRows * n * 2;
        b.prepL0b = 2 * n * dc * 2;
        const uint64_t out = t.shiftRows * dc * 4;
        t.prepL0cBuffers = 3 * out <= kL0CBytes ? 3 : 2;
        b.prepL0c = t.prepL0cBuffers * out;
        // a part-filled block's rows: fp32 in, fp16 out, a piece of an AIV's half at a time
        auto prepUb = [&](uint64_t rows) { return d * 4 + rows * d * 4 + rows * d * 2 + d * 4 + d * 2; };
        t.prepVecRows = static_cast<uint32_t>(n / 2);
        while (t.prepVecRows > 16 && prepUb(t.prepVecRows) > kUbBytes) t.prepVecRows /= 2;
        b.prepUb = prepUb(t.prepVecRows);
    } else if (t.tilingKey == PASA_KEY_PASA_EXACT) {
        t.prepKeyBuffers = 16 * n * 2 + 2 * keyBlock <= kL1Bytes ? 2 : 1;
        b.prepL1 = 16 * n * 2 + t.prepKeyBuffers * keyBlock;
        b.prepL0a = 16 * n * 2;
        b.prepL0b = 2 * n * dc * 2;
        b.prepL0c = 2 * 16 * dc * 4;
        // a piece of an AIV's half of the keys: fp16 in and out, fp32 between
        auto prepUb = [&](uint64_t rows) { return d * 4 + 2 * rows * d * 2 + d * 2 + 2 * d * 4 + rows * d * 4; };
        t.prepVecRows = static_cast<uint32_t>(n / 2);
        while (t.prepVecRows > 16 && prepUb(t.prepVecRows) > kUbBytes) t.prepVecRows /= 2;
        b.prepUb = prepUb(t.prepVecRows);
    }
}

void CheckBudgets(const PasaProblem& p, const PasaBudget& b)
{
    struct Check { const char* what; uint64_t need, cap; };
    const Check checks[] = {
        {"attention L1", b.l1, kL1Bytes}, {"attention L0A", b.l0a, kL0ABytes}, {"attention L0B", b.l0b, kL0BBytes},
        {"attention L0C", b.l0c, kL0CBytes}, {"attention UB (per AIV, below the API scratch)", b.ub, kUbUserBytes},
        {"preprocessing L1", b.prepL1, kL1Bytes}, {"preprocessing L0A", b.prepL0a, kL0ABytes},
        {"preprocessing L0B", b.prepL0b, kL0BBytes}, {"preprocessing L0C", b.prepL0c, kL0CBytes},
        {"preprocessing UB (per AIV)", b.prepUb, kUbBytes},
    };
    for (const Check& c : checks) {
        if (c.need > c.cap) {
            Reject(std::string(c.what) + " needs " + Kib(c.need) + ", the Atlas A2 AI Core has " + Kib(c.cap) +
                   " (qBlock=" + std::to_string(p.qBlock) + ", kvBlock=" + std::to_string(p.kvBlock) + ", headDim=" +
                   std::to_string(p.headDim) + ", headDimV=" + std::to_string(p.headDimV) + "); use a smaller q_block or kv_block");
        }
    }
}

void PlanWorkspace(const PasaProblem& p, PasaTilingData& t)
{
    const bool constants = t.rowConstants != 0;  // key means and row constants
    const bool keyPrime = t.prepDim != 0;  // the preprocessing launch writes K'
    const bool pasa = p.tilingKey == PASA_KEY_PASA;
    const uint64_t n = t.kvBlock, d = t.headDim, dv = t.headDimV, rows = t.qTilePad;
    // K' block slots: per (batch, kv head, block), or per (table entry, sub-block, kv head) paged
    const uint64_t kvBlocksTotal = p.paged ? static_cast<uint64_t>(p.batch) * p.tableStride * t.subBlocks * p.numKvHeads
                                           : static_cast<uint64_t>(p.batch) * p.numKvHeads * t.numKvBlocks;
    uint64_t off = 0;
    t.shiftMatrixOffset = off;
    off += Align64(!pasa ? 0 : t.shiftScores ? ScoreMapBytes(t) : n * n * 2, 512);
    t.keyPrimeOffset = off;
    off += Align64(keyPrime ? kvBlocksTotal * n * d * 2 : 0, 512);
    t.keyMeanOffset = off;
    off += Align64(constants ? kvBlocksTotal * d * 2 : 0, 512);
    const uint64_t elem = p.tilingKey == PASA_KEY_FA_FP32 ? 4 : 2;
    t.scoreSlotBytes = Align64(rows * n * (t.shiftScores ? 4 : elem), 512);
    t.probSlotBytes = Align64(rows * n * 2, 512);
    t.pvSlotBytes = Align64(rows * t.pvCols * elem, 512);
    t.constSlotBytes = constants ? Align64(static_cast<uint64_t>(PASA_CONST_BLOCKS) * rows * 4, 512) : 0;
    t.colSumSlotBytes = Align64(d * 4, 512);
    t.tailSlotBytes = keyPrime && pasa ? Align64(n * d * 4, 512) : 0;
    const uint64_t prepArea = keyPrime ? PASA_SUM_SLOTS * t.colSumSlotBytes + t.tailSlotBytes : 0;
    t.coreAreaOffset = off;
    t.coreAreaBytes = std::max<uint64_t>(PASA_SCORE_SLOTS * t.scoreSlotBytes + PASA_PROB_SLOTS * t.probSlotBytes +
                                         PASA_PV_SLOTS * t.pvSlotBytes + PASA_CONST_SLOTS * t.constSlotBytes,
                                         prepArea);
    off += t.coreAreaBytes * std::max(t.blockDim, t.prepDim);
    t.partialOffset = off;
    t.partialSlotBytes = t.kvSplits > 1 ? Align64(rows * dv * 4 + 2ull * t.vecRowsPad * 4, 512) : 0;
    off += static_cast<uint64_t>(t.numTasks) * t.kvSplits * t.partialSlotBytes;
    t.taskFlagsOffset = t.overflowCheck ? Align64(off, 512) : 0;
    if (t.overflowCheck) off = t.taskFlagsOffset + FlagAreaBytes(t);
    t.workspaceBytes = off;
}

}  // namespace

PasaTilingData ComputeTiling(const PasaProblem& p, const BatchLengths* lengths, PasaBudget* budget)
{
    Validate(p);
    PasaTilingData t;
    std::memset(&t, 0, sizeof(t));
    FillProblem(p, t);
    PlanBlocking(p, lengths, t);
    PasaBudget b;
    PlanCube(p, t, b);
    if (p.paged && t.prepDim != 0 && t.subBlocks == 0) {  // K' per physical block
        Reject("paged KV with " + std::string(p.tilingKey == PASA_KEY_PASA ? "pasa" : "pasa-exact") +
               " keeps K' per physical block: kvBlock (" + std::to_string(p.kvBlock) + ") must divide blockSize (" +
               std::to_string(p.blockSize) + ")");
    }
    PlanVector(p, t, b);
    PlanPreprocessing(t, b);
    CheckBudgets(p, b);
    if (budget != nullptr) *budget = b;
    PlanWorkspace(p, t);
    return t;
}

}  // namespace pasa
