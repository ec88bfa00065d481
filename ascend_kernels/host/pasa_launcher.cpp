// The host side of one PASA call (see pasa_launcher.h).
#include "pasa_launcher.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace pasa {
namespace {

constexpr size_t kParameterAlign = 64;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

void CheckLengths(const PasaTilingData& t, const BatchLengths& lengths)
{
    if (lengths.qLens == nullptr || lengths.kvLens == nullptr || lengths.nextTokens == nullptr) {
        throw std::invalid_argument("qLens, kvLens and nextTokens must each point to batch int32 entries");
    }
    for (uint32_t b = 0; b < t.batch; ++b) {
        const int32_t q = lengths.qLens[b], kv = lengths.kvLens[b];
        if (q < 0 || static_cast<uint32_t>(q) > t.seqQ) {
            throw std::invalid_argument("qLens[" + std::to_string(b) + "] = " + std::to_string(q) +
                                        " lies outside [0, seqQ = " + std::to_string(t.seqQ) + "]");
        }
        if (kv < 0 || static_cast<uint32_t>(kv) > t.seqKv) {
            throw std::invalid_argument("kvLens[" + std::to_string(b) + "] = " + std::to_string(kv) +
                                        " lies outside [0, seqKv = " + std::to_string(t.seqKv) + "]");
        }
    }
}

std::vector<uint8_t> ParameterBytes(const PasaTilingData& t, const BatchLengths& lengths, const ParameterLayout& at)
{
    std::vector<uint8_t> host(at.bytes, 0);
    const size_t lensBytes = sizeof(int32_t) * t.batch;
    std::memcpy(host.data() + at.tiling, &t, sizeof(t));
    std::memcpy(host.data() + at.qLens, lengths.qLens, lensBytes);
    std::memcpy(host.data() + at.kvLens, lengths.kvLens, lensBytes);
    std::memcpy(host.data() + at.nextTokens, lengths.nextTokens, lensBytes);
    return host;
}

}  // namespace

const char* KernelName(PasaKernel kernel)
{
    switch (kernel) {
        case PasaKernel::kShiftKeys: return "pasa_shift_keys";
        case PasaKernel::kCenterKeys: return "pasa_center_keys";
        case PasaKernel::kAttention: return "pasa_attention";
    }
    return "unknown kernel";
}

const char* BufferName(BufferRole role)
{
    return role == BufferRole::kParameters ? "parameters" : "workspace";
}

ParameterLayout ParameterLayoutFor(uint32_t batch)
{
    const size_t lensBytes = AlignUp(sizeof(int32_t) * batch, kParameterAlign);
    ParameterLayout at;
    at.tiling = 0;
    at.qLens = AlignUp(sizeof(PasaTilingData), kParameterAlign);
    at.kvLens = at.qLens + lensBytes;
    at.nextTokens = at.kvLens + lensBytes;
    at.bytes = at.nextTokens + lensBytes;
    return at;
}

PasaTilingData LaunchAttention(const PasaProblem& problem, const AttentionTensors& tensors,
                               const BatchLengths& lengths, LaunchRuntime& runtime)
{
    const PasaTilingData t = ComputeTiling(problem);
    CheckLengths(t, lengths);
    const ParameterLayout at = ParameterLayoutFor(t.batch);
    const std::vector<uint8_t> parameters = ParameterBytes(t, lengths, at);
    std::vector<uint16_t> shiftMatrix;
    if (t.tilingKey == PASA_KEY_PASA) {
        shiftMatrix.resize(static_cast<size_t>(t.kvBlock) * t.kvBlock);
        FillShiftMatrix(t, shiftMatrix.data());
    }

    auto* params = static_cast<uint8_t*>(runtime.Allocate(at.bytes, BufferRole::kParameters));
    auto* workspace = static_cast<uint8_t*>(runtime.Allocate(t.workspaceBytes, BufferRole::kWorkspace));
    runtime.Upload(params, parameters.data(), parameters.size());
    if (!shiftMatrix.empty()) {
        runtime.Upload(workspace + t.shiftMatrixOffset, shiftMatrix.data(), shiftMatrix.size() * sizeof(uint16_t));
    }

    KernelArgs args;
    args.query = tensors.query;
    args.key = tensors.key;
    args.value = tensors.value;
    args.qLens = params + at.qLens;
    args.kvLens = params + at.kvLens;
    args.nextTokens = params + at.nextTokens;
    args.out = tensors.out;
    args.lse = tensors.lse;
    args.workspace = workspace;
    args.tiling = params + at.tiling;
    if (t.tilingKey == PASA_KEY_PASA) {
        runtime.Launch(PasaKernel::kShiftKeys, t.blockDim, args);
    } else if (t.tilingKey == PASA_KEY_PASA_EXACT) {
        runtime.Launch(PasaKernel::kCenterKeys, t.blockDim, args);
    }
    runtime.Launch(PasaKernel::kAttention, t.blockDim, args);
    return t;
}

}  // namespace pasa
