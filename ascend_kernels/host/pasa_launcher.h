// The host side of one PASA call, shared by the NPU build and the CPU emulation: tiling, the
// per-call device buffers and their layout, the uploads, the preprocessing launch and the
// attention launch. Everything that touches a device goes through LaunchRuntime, which has two
// implementations: AclLaunchRuntime (pasa_acl_runtime.h: ACL on the stream torch_npu gives) and
// the emulation's (../emu/emu_launch_runtime.h). Plain C++17, no device headers.
#ifndef PASA_HOST_LAUNCHER_H
#define PASA_HOST_LAUNCHER_H

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pasa_tiling.h"

namespace pasa {

// The kernels of ../kernels/, in the order a call may launch them.
enum class PasaKernel : uint32_t {
    kShiftKeys = 0,   // pasa_shift_keys (pasa): K' = M^T K per kv block, cube only
    kCenterKeys = 1,  // pasa_center_keys (pasa-exact): block means and K - mean16, MIX
    kAttention = 2,   // pasa_attention: the MIX attention kernel
    kMerge = 3,       // pasa_merge_splits: the LSE merge of split kv (vector only)
};
const char* KernelName(PasaKernel kernel);

// What a per-call device buffer holds. Parameters are only read by the kernels; the workspace
// is read and written.
enum class BufferRole : uint32_t { kParameters = 0, kWorkspace = 1 };
const char* BufferName(BufferRole role);

// Device addresses of one launch, named as the kernels name their GM_ADDR parameters. Each
// kernel takes the subset its signature lists, in this order. The per-batch parameters follow
// the tiling struct in the parameter buffer (PasaTilingData::batchParamsOffset).
struct KernelArgs {
    void* query = nullptr;
    void* key = nullptr;
    void* value = nullptr;
    void* mask = nullptr;
    void* blockTable = nullptr;
    void* keySlots = nullptr;
    void* sink = nullptr;
    void* out = nullptr;
    void* lse = nullptr;
    void* rowFlags = nullptr;
    void* workspace = nullptr;
    void* tiling = nullptr;
};

// The device operations a call needs, in the order the launcher issues them. Every operation
// is ordered on one stream (the runtime's); none waits for the device.
class LaunchRuntime {
public:
    virtual ~LaunchRuntime() = default;
    // `bytes` of device memory, 512-byte aligned, contents undefined, valid for everything this
    // call queues on the stream.
    virtual void* Allocate(size_t bytes, BufferRole role) = 0;
    // Copy `bytes` host bytes to device address `dst`, ordered before the launches that follow.
    // `src` need only stay valid until Upload returns.
    virtual void Upload(void* dst, const void* src, size_t bytes) = 0;
    // Launch `kernel` on `blockDim` AI Cores.
    virtual void Launch(PasaKernel kernel, uint32_t blockDim, const KernelArgs& args) = 0;
};

// Device addresses of the caller's tensors, in the layouts and dtypes `PasaProblem` names:
// query, key, value, out and lse (float32, batch x numHeads x seqQ; packed 1 x numHeads x seqQ);
// the mask (bool, when PasaProblem::hasMask), the block table (int32 batch x tableStride, when
// paged), the K' slot table (int32, the same shape: when paged with pasa or pasa-exact), the
// learnable sinks (float32, numHeads: when PasaProblem::hasSink) and the row flags (uint8, laid
// out as lse: when PasaProblem::overflowCheck).
struct AttentionTensors {
    void* query = nullptr;
    void* key = nullptr;
    void* value = nullptr;
    void* out = nullptr;
    void* lse = nullptr;
    void* mask = nullptr;
    void* blockTable = nullptr;
    void* keySlots = nullptr;
    void* sink = nullptr;
    void* rowFlags = nullptr;
};

// Byte offsets within the parameter buffer: the tiling struct, then the per-batch records
// (PASA_BATCH_FIELDS int32 each), 64-byte aligned (a GM scalar read fetches 64-byte lines).
struct ParameterLayout {
    size_t tiling = 0, batches = 0, bytes = 0;
};
ParameterLayout ParameterLayoutFor(uint32_t batch);

// A checked call's repair pass (pasa, pasa-exact with overflowCheck): the fa-fp32 tiling of
// `problem` without split kv, in its kv blocks or the largest half, quarter, ... of them (at
// least 128 keys) that fa-fp32's buffers hold. Throws std::invalid_argument naming the pass
// where none does.
PasaTilingData RepairTiling(const PasaProblem& problem, const BatchLengths* lengths);

// The parameter buffer's bytes for tiling `t` of `problem` with `lengths` (checked by the caller).
std::vector<uint8_t> ParameterBytes(const PasaProblem& problem, const PasaTilingData& t, const BatchLengths& lengths);

// Tile `problem`, then through `runtime`: allocate the parameter buffer and the workspace,
// upload the parameters (and, for pasa, the shifting matrix or, with shiftScores, its score map into the
// workspace), launch the preprocessing kernel (pasa and pasa-exact unless the attention kernel shifts
// the scores: PasaTilingData::shiftScores), the attention kernel and, with split kv, the merge.
// Returns the tiling.
// Throws std::invalid_argument for a problem or lengths the kernels cannot run (naming the
// parameter) before any runtime call; runtime failures propagate as the runtime throws them.
PasaTilingData LaunchAttention(const PasaProblem& problem, const AttentionTensors& tensors,
                               const BatchLengths& lengths, LaunchRuntime& runtime);

}  // namespace pasa

#endif  // PASA_HOST_LAUNCHER_H
