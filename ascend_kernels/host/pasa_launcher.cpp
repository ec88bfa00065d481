// The host side of one PASA call (see pasa_launcher.h).
#include "pasa_launcher.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace pasa {

PasaTilingData RepairTiling(const PasaProblem& problem, const BatchLengths* lengths)
{
    PasaProblem p = problem;
    p.tilingKey = PASA_KEY_FA_FP32;
    p.kvSplits = 1;
    p.repair = true;
    p.vectorProbSums = false;  // pasa's choice
    // the call's kv blocks, or the largest half, quarter, ... of them (down to 128 keys) whose buffers
    // fa-fp32 holds: its fp32 scores do not fit the UB in blocks the PASA allocations take
    std::string refused;
    for (;; p.kvBlock /= 2) {
        try {
            return ComputeTiling(p, lengths);
        } catch (const std::invalid_argument& e) {
            if (refused.empty()) refused = e.what();
            if (p.kvBlock > 128) continue;
            throw std::invalid_argument("the overflow check's fa-fp32 repair pass: " + refused + " (or repair_overflow=False)");
        }
    }
}

namespace {

constexpr size_t kParameterAlign = 64;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

[[noreturn]] void Refuse(const std::string& msg) { throw std::invalid_argument(msg); }

std::string Entry(const char* name, uint32_t b, int32_t v)
{
    return std::string(name) + "[" + std::to_string(b) + "] = " + std::to_string(v);
}

void CheckLengths(const PasaProblem& p, const BatchLengths& l)
{
    const bool band = p.maskMode != PASA_MASK_NONE, pre = p.maskMode == PASA_MASK_BAND;
    if (l.qLens == nullptr || l.kvLens == nullptr || (band && l.nextTokens == nullptr) || (pre && l.preTokens == nullptr) ||
        (p.packed && (l.qStarts == nullptr || l.kvStarts == nullptr))) {
        Refuse("qLens and kvLens (and nextTokens with a band, preTokens with a lower bound, qStarts and kvStarts when "
               "packed) must each point to batch int32 entries");
    }
    const int64_t kvCap = p.paged ? static_cast<int64_t>(p.tableStride) * p.blockSize : p.seqKv;
    for (uint32_t b = 0; b < p.batch; ++b) {
        const int64_t q0 = p.packed ? l.qStarts[b] : 0, k0 = p.packed ? l.kvStarts[b] : 0;
        if (l.qLens[b] < 0 || q0 < 0 || q0 + l.qLens[b] > p.seqQ) {
            Refuse(Entry("qLens", b, l.qLens[b]) + (p.packed ? " from " + Entry("qStarts", b, l.qStarts[b]) : "") +
                   " lies outside [0, seqQ = " + std::to_string(p.seqQ) + "]");
        }
        if (l.kvLens[b] < 0 || k0 < 0 || k0 + l.kvLens[b] > kvCap) {
            Refuse(Entry("kvLens", b, l.kvLens[b]) + (p.packed ? " from " + Entry("kvStarts", b, l.kvStarts[b]) : "") +
                   " lies outside [0, " + (p.paged ? "tableStride x blockSize = " : "seqKv = ") + std::to_string(kvCap) + "]");
        }
    }
}

// A checked call's repair pass on the same tasks as `t` (RepairTiling); both tilings' task
// flags at one workspace offset, after either's own workspace.
void ShareTaskFlags(const PasaProblem& problem, const BatchLengths& lengths, PasaTilingData& t, PasaTilingData& repair)
{
    repair = RepairTiling(problem, &lengths);
    if (repair.numTasks != t.numTasks || repair.qTile != t.qTile || repair.vecRows != t.vecRows) {
        Refuse("the repair launch's tiling does not deal the call's tasks");
    }
    // an attention launch widened for the key preprocessing deals its tasks over its cores: so does the pass
    if (t.prepInAttention && t.kvSplits == 1) repair.blockDim = t.blockDim;
    const uint64_t offset = AlignUp(std::max(t.taskFlagsOffset, repair.taskFlagsOffset), 512);
    t.taskFlagsOffset = repair.taskFlagsOffset = offset;
    t.workspaceBytes = repair.workspaceBytes = offset + FlagAreaBytes(t);
}

}  // namespace

std::vector<uint8_t> ParameterBytes(const PasaProblem& p, const PasaTilingData& t, const BatchLengths& l)
{
    const ParameterLayout at = ParameterLayoutFor(t.batch);
    std::vector<uint8_t> host(at.bytes, 0);
    std::memcpy(host.data() + at.tiling, &t, sizeof(t));
    std::vector<int32_t> records(static_cast<size_t>(t.batch) * PASA_BATCH_FIELDS, 0);
    for (uint32_t b = 0; b < t.batch; ++b) {
        int32_t* r = records.data() + static_cast<size_t>(b) * PASA_BATCH_FIELDS;
        r[PASA_BATCH_Q_LEN] = l.qLens[b];
        r[PASA_BATCH_KV_LEN] = l.kvLens[b];
        r[PASA_BATCH_NEXT] = p.maskMode != PASA_MASK_NONE ? l.nextTokens[b] : 0;
        r[PASA_BATCH_PRE] = p.maskMode == PASA_MASK_BAND ? l.preTokens[b] : 0;
        r[PASA_BATCH_Q_START] = p.packed ? l.qStarts[b] : 0;
        r[PASA_BATCH_KV_START] = p.packed ? l.kvStarts[b] : 0;
    }
    std::memcpy(host.data() + at.batches, records.data(), records.size() * sizeof(int32_t));
    return host;
}

const char* KernelName(PasaKernel kernel)
{
    switch (kernel) {
        case PasaKernel::kShiftKeys: return "pasa_shift_keys";
        case PasaKernel::kCenterKeys: return "pasa_center_keys";
        case PasaKernel::kAttention: return "pasa_attention";
        case PasaKernel::kMerge: return "pasa_merge_splits";
    }
    return "unknown kernel";
}

const char* BufferName(BufferRole role)
{
    return role == BufferRole::kParameters ? "parameters" : "workspace";
}

ParameterLayout ParameterLayoutFor(uint32_t batch)
{
    ParameterLayout at;
    at.tiling = 0;
    at.batches = AlignUp(sizeof(PasaTilingData), kParameterAlign);
    at.bytes = at.batches + AlignUp(sizeof(int32_t) * PASA_BATCH_FIELDS * batch, kParameterAlign);
    return at;
}

PasaTilingData LaunchAttention(const PasaProblem& problem, const AttentionTensors& tensors,
                               const BatchLengths& lengths, LaunchRuntime& runtime)
{
    CheckLengths(problem, lengths);
    if (problem.hasMask && tensors.mask == nullptr) Refuse("hasMask needs the mask tensor");
    if (problem.paged && tensors.blockTable == nullptr) Refuse("paged KV needs the block table");
    if (problem.overflowCheck && tensors.rowFlags == nullptr) Refuse("overflowCheck needs the row flags tensor");
    if (problem.hasSink && tensors.sink == nullptr) Refuse("hasSink needs the sink tensor");
    PasaTilingData t = ComputeTiling(problem, &lengths);
    PasaTilingData repair{};
    if (problem.overflowCheck) ShareTaskFlags(problem, lengths, t, repair);
    const ParameterLayout at = ParameterLayoutFor(t.batch);
    // the attention launch repairs the row flags it writes: without split kv each core its own tasks', beside
    // the first pass (whose exchange slots the repair's must not share); with split kv after its merge, once
    // every core has met at SyncAll
    const bool repairInLaunch = problem.overflowCheck && ((t.kvSplits == 1 && repair.blockDim == t.blockDim) ||
                                                          (t.mergeInAttention && repair.blockDim <= t.blockDim));
    if (repairInLaunch) {
        if (t.kvSplits == 1) {
            repair.coreAreaOffset = AlignUp(t.workspaceBytes, 512);
            t.workspaceBytes = repair.workspaceBytes = repair.coreAreaOffset + repair.coreAreaBytes * repair.blockDim;
        }
        t.repairTilingOffset = static_cast<uint32_t>(at.bytes);
    }
    const bool prepare = t.prepDim != 0;  // the key preprocessing (not fa-fp32, not shiftScores)
    if (problem.paged && prepare && tensors.keySlots == nullptr) {
        Refuse("paged KV with pasa or pasa-exact needs the K' slot table (the owner entry of each table entry)");
    }
    if (at.batches != t.batchParamsOffset) Refuse("the parameter layout disagrees with the tiling");
    std::vector<uint8_t> parameters = ParameterBytes(problem, t, lengths);
    std::vector<uint8_t> repairParameters;
    if (problem.overflowCheck) repairParameters = ParameterBytes(problem, repair, lengths);
    if (repairInLaunch) {  // the repair pass's tiling and batch records follow the call's
        parameters.insert(parameters.end(), repairParameters.begin(), repairParameters.end());
    }
    std::vector<uint16_t> shiftMatrix;
    std::vector<float> scoreMap;
    if (t.tilingKey == PASA_KEY_PASA && t.shiftScores) {
        scoreMap.resize(ScoreMapBytes(t) / sizeof(float));
        FillScoreMap(t, scoreMap.data());
    } else if (t.tilingKey == PASA_KEY_PASA) {
        shiftMatrix.resize(static_cast<size_t>(t.kvBlock) * t.kvBlock);
        FillShiftMatrix(t, shiftMatrix.data());
    }

    auto* params = static_cast<uint8_t*>(runtime.Allocate(parameters.size(), BufferRole::kParameters));
    const bool repairLaunch = problem.overflowCheck && !repairInLaunch;
    uint8_t* repairParams = nullptr;
    if (repairLaunch) repairParams = static_cast<uint8_t*>(runtime.Allocate(at.bytes, BufferRole::kParameters));
    auto* workspace = static_cast<uint8_t*>(runtime.Allocate(t.workspaceBytes, BufferRole::kWorkspace));
    runtime.Upload(params, parameters.data(), parameters.size());
    if (repairLaunch) runtime.Upload(repairParams, repairParameters.data(), repairParameters.size());
    if (!shiftMatrix.empty()) {
        runtime.Upload(workspace + t.shiftMatrixOffset, shiftMatrix.data(), shiftMatrix.size() * sizeof(uint16_t));
    }
    if (!scoreMap.empty()) runtime.Upload(workspace + t.shiftMatrixOffset, scoreMap.data(), scoreMap.size() * sizeof(float));

    KernelArgs args;
    args.query = tensors.query;
    args.key = tensors.key;
    args.value = tensors.value;
    args.mask = problem.hasMask ? tensors.mask : nullptr;
    args.blockTable = problem.paged ? tensors.blockTable : nullptr;
    args.keySlots = problem.paged && prepare ? tensors.keySlots : nullptr;
    args.sink = problem.hasSink ? tensors.sink : nullptr;
    args.out = tensors.out;
    args.lse = tensors.lse;
    args.rowFlags = problem.overflowCheck ? tensors.rowFlags : nullptr;
    args.workspace = workspace;
    args.tiling = params + at.tiling;
    if (prepare && !t.prepInAttention) {
        runtime.Launch(t.tilingKey == PASA_KEY_PASA ? PasaKernel::kShiftKeys : PasaKernel::kCenterKeys, t.prepDim, args);
    }
    runtime.Launch(PasaKernel::kAttention, t.blockDim, args);
    if (t.kvSplits > 1 && !t.mergeInAttention) runtime.Launch(PasaKernel::kMerge, t.mergeDim, args);
    if (repairLaunch) {  // split kv, the merge forced into a launch of its own: after it, as it writes the flags; its
                         // cores return at once where no task byte is set
        args.keySlots = nullptr;
        args.tiling = repairParams + at.tiling;
        runtime.Launch(PasaKernel::kAttention, repair.blockDim, args);
    }
    return t;
}

}  // namespace pasa
