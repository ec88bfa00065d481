// The torch_npu binding of the PASA kernels: the operator
//
//   torch.ops.pasa_npu.npu_attention(query, key, value, out, lse, atten_mask, block_table, key_slots,
//                                    learnable_sink, row_flags, q_lens, kv_lens, next_tokens, pre_tokens,
//                                    q_starts, kv_starts, tiling_key, mask_mode, scale, beta, q_block, kv_block,
//                                    resolution_limit) -> ()
//
// Paged KV (block_table given): key and value are (num_blocks, N_kv, block_size, D) views of the
// caches, block_table and key_slots int32 (B, max_blocks) (pasa_npu/kernel_inputs.py).
// learnable_sink (float32 (Nq,), contiguous, optional): one logit per query head, joined to every
// row's softmax by the kernels (docs/design.md, "Learnable sinks"). row_flags
// (uint8 (B, Nq, Sq), contiguous, optional): the kernels flag the rows whose output or LSE is not
// finite and recompute them by fa-fp32 in a repair launch (docs/design.md, "Overflow detection
// and repair"), queued like the rest; with row_flags, pasa and pasa-exact also flag the rows whose
// shifted scores (or pasa's block offsets) reach resolution_limit in magnitude
// (pasa_npu.numerics.RESOLUTION_LIMIT; 0: off).
//
// with one kernel, for PrivateUse1 (NPU tensors), registered with TORCH_LIBRARY_IMPL. It is the
// compute step of backend "npu" (pasa_npu/npu.py), which the Python API layer reaches after it
// has validated and normalised the call; this file checks what the kernels rely on (device,
// dtype, layout, contiguity, shapes) and runs the shared host launcher with the ACL runtime:
//  * the parameter buffer and the workspace are device tensors from torch_npu's caching
//    allocator; uploads are staged in its page-locked host memory and copied asynchronously;
//  * the copies and launches go on c10_npu::getCurrentNPUStream() through torch_npu's task
//    queue (OpCommand::RunOpApi), after the operators queued before them;
//  * nothing synchronises the stream or the host, so the call can be captured in an NPU graph;
//  * blockDim comes from the device's AI Core count (aclrtGetDeviceInfo), not a constant.
// Built by setup.py with torch_npu's NpuExtension when a CANN toolkit and torch_npu are present;
// tests/ascend_kernels/test_npu_host.py compiles it against the headers of the torch_npu wheel.
#include <Python.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "torch_npu/csrc/core/npu/CachingHostAllocator.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

#include "../host/pasa_acl_runtime.h"

namespace {

constexpr uintptr_t kDeviceAlign = 512;

// Device buffers from torch_npu's caching allocator (stream-ordered: a block freed after this call
// is reused only by work queued after it) and page-locked staging from its host caching allocator.
class TorchNpuMemory final : public pasa::AclMemory {
public:
    explicit TorchNpuMemory(c10::Device device) : device_(device) {}

    void* DeviceBuffer(size_t bytes) override
    {
        buffers_.push_back(at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device_)));
        void* p = buffers_.back().data_ptr();
        TORCH_CHECK(reinterpret_cast<uintptr_t>(p) % kDeviceAlign == 0,
                    "pasa_npu: the caching allocator returned a device buffer that is not 512-byte aligned");
        return p;
    }

    void* PinnedHostBuffer(size_t bytes) override
    {
        staging_.push_back(at_npu::native::HostAlloc(bytes));
        return staging_.back().get();
    }

    // After the task holding the copies that read the staging memory is queued on `stream` (as
    // torch_npu's own non-blocking copies do): the host allocator reuses it once the stream has
    // passed them (and never reuses a block used during a graph capture, whose replays read it).
    void ReleaseStagingAfter(const c10_npu::NPUStream& stream)
    {
        for (auto& p : staging_) at_npu::native::CachingHostAllocator_recordEvent(p.get(), p.get_context(), stream);
        staging_.clear();
    }

private:
    c10::Device device_;
    std::vector<at::Tensor> buffers_;
    std::vector<c10::DataPtr> staging_;
};

// What the queued task needs: the submission, and the device memory it uses kept alive until it
// has been issued.
struct QueuedCall {
    std::shared_ptr<TorchNpuMemory> memory;
    pasa::AclSubmission submission;
    at::Tensor lseScratch;
};

uint32_t AiCoreCount(c10::DeviceIndex device)
{
    static std::mutex mu;
    static std::unordered_map<c10::DeviceIndex, uint32_t> counts;
    std::lock_guard<std::mutex> lock(mu);
    auto it = counts.find(device);
    if (it == counts.end()) it = counts.emplace(device, pasa::AclAiCoreCount(device)).first;
    return it->second;
}

// PASA_LAYOUT_BNSD or PASA_LAYOUT_BSND: the memory order of a (B, N, S, D) view.
uint32_t LayoutOf(const at::Tensor& t, const char* name)
{
    if (t.is_contiguous()) return PASA_LAYOUT_BNSD;
    TORCH_CHECK_VALUE(t.permute({0, 2, 1, 3}).is_contiguous(), "pasa_npu: ", name,
                      " must be a (B, N, S, D) view of a tensor contiguous in BNSD or BSND order, got sizes ", t.sizes(),
                      " and strides ", t.strides());
    return PASA_LAYOUT_BSND;
}

void CheckDevice(const at::Tensor& t, const char* name, const at::Device& device)
{
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, "pasa_npu: ", name,
                      " must be on an NPU device, got ", t.device());
    TORCH_CHECK_VALUE(t.device() == device, "pasa_npu: ", name, " is on ", t.device(), " but query is on ", device);
}

void CheckTensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                  const std::optional<at::Tensor>& lse, bool paged)
{
    const at::Device device = q.device();
    const std::pair<const at::Tensor*, const char*> all[] = {{&q, "query"}, {&k, "key"}, {&v, "value"}, {&out, "out"}};
    for (const auto& [t, name] : all) {
        CheckDevice(*t, name, device);
        TORCH_CHECK_VALUE(t->dim() == 4, "pasa_npu: ", name, " must be 4-D (B, N, S, D), got sizes ", t->sizes());
        TORCH_CHECK_VALUE(t->scalar_type() == at::kHalf || t->scalar_type() == at::kBFloat16, "pasa_npu: ", name,
                          " must be float16 or bfloat16, got ", t->scalar_type());
    }
    TORCH_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                      "pasa_npu: key and value must have query's dtype ", q.scalar_type(), ", got ", k.scalar_type(),
                      " and ", v.scalar_type());
    TORCH_CHECK_VALUE((paged || k.size(0) == q.size(0)) && k.size(3) == q.size(3), "pasa_npu: key ", k.sizes(),
                      " must have query's batch (unless paged) and head dim, query is ", q.sizes());
    TORCH_CHECK_VALUE(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2), "pasa_npu: value ",
                      v.sizes(), " must have key's batch, heads and length, key is ", k.sizes());
    TORCH_CHECK_VALUE(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "pasa_npu: query heads (", q.size(1),
                      ") must be a multiple of key heads (", k.size(1), ")");
    TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2), v.size(3)}), "pasa_npu: out must be ",
                      at::IntArrayRef({q.size(0), q.size(1), q.size(2), v.size(3)}), ", got ", out.sizes());
    TORCH_CHECK_VALUE(LayoutOf(v, "value") == LayoutOf(k, "key"), "pasa_npu: key and value must share one memory order");
    if (lse.has_value()) {
        CheckDevice(*lse, "lse", device);
        TORCH_CHECK_VALUE(lse->scalar_type() == at::kFloat, "pasa_npu: lse must be float32, got ", lse->scalar_type());
        TORCH_CHECK_VALUE(lse->sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2)}) && lse->is_contiguous(),
                          "pasa_npu: lse must be a contiguous (B, Nq, Sq) tensor, got sizes ", lse->sizes(), " and strides ",
                          lse->strides());
    }
}

uint32_t Uint32(int64_t v, const char* name)
{
    TORCH_CHECK_VALUE(v >= 0 && v <= UINT32_MAX, "pasa_npu: ", name, " = ", v, " is out of range");
    return static_cast<uint32_t>(v);
}

// `batch` int32 entries, or none when `optional` and the list is empty.
std::vector<int32_t> Int32s(c10::IntArrayRef values, int64_t batch, const char* name, bool optional = false)
{
    if (optional && values.empty()) return {};
    TORCH_CHECK_VALUE(static_cast<int64_t>(values.size()) == batch, "pasa_npu: ", name, " must have batch = ", batch,
                      " entries, got ", values.size());
    std::vector<int32_t> out;
    for (int64_t v : values) {
        TORCH_CHECK_VALUE(v >= INT32_MIN && v <= INT32_MAX, "pasa_npu: ", name, " entry ", v, " does not fit int32");
        out.push_back(static_cast<int32_t>(v));
    }
    return out;
}

const int32_t* DataOrNull(const std::vector<int32_t>& v) { return v.empty() ? nullptr : v.data(); }

// Paged KV: the block table and the K' slot table, int32 (batch, max_blocks) contiguous, and the caches.
void SetPages(pasa::PasaProblem& p, const at::Tensor& table, const std::optional<at::Tensor>& slots,
              const at::Tensor& query, const at::Tensor& key)
{
    const std::pair<const at::Tensor*, const char*> all[] = {{&table, "block_table"}, {slots ? &*slots : &table, "key_slots"}};
    for (const auto& [t, name] : all) {
        CheckDevice(*t, name, query.device());
        TORCH_CHECK_VALUE(t->scalar_type() == at::kInt && t->dim() == 2 && t->size(0) == p.batch && t->is_contiguous() &&
                              t->sizes() == table.sizes(),
                          "pasa_npu: ", name, " must be a contiguous int32 (batch, max_blocks) tensor, got ", t->sizes(), " ",
                          t->scalar_type());
    }
    p.paged = true;
    p.blockSize = Uint32(key.size(2), "block_size (the caches' S axis)");
    p.tableStride = Uint32(table.size(1), "block_table width");
    p.numBlocks = Uint32(key.size(0), "cache blocks");
}

// Learnable sinks: float32 (Nq,), contiguous, one logit per query head.
void SetSink(pasa::PasaProblem& p, const at::Tensor& sink, const at::Tensor& query)
{
    CheckDevice(sink, "learnable_sink", query.device());
    TORCH_CHECK_VALUE(sink.scalar_type() == at::kFloat && sink.dim() == 1 && sink.size(0) == query.size(1) &&
                          sink.is_contiguous(),
                      "pasa_npu: learnable_sink must be a contiguous float32 (Nq,) tensor with Nq = ", query.size(1),
                      ", got ", sink.scalar_type(), " of sizes ", sink.sizes());
    p.hasSink = true;
}

// The explicit mask: uint8 or bool (B or 1, S1, S2), nonzero = masked, its last dim contiguous.
void SetMask(pasa::PasaProblem& p, const at::Tensor& mask, const at::Tensor& query, const at::Tensor& key)
{
    CheckDevice(mask, "atten_mask", query.device());
    TORCH_CHECK_VALUE(mask.scalar_type() == at::kByte || mask.scalar_type() == at::kBool,
                      "pasa_npu: atten_mask must be uint8 or bool, got ", mask.scalar_type());
    TORCH_CHECK_VALUE(mask.dim() == 3 && (mask.size(0) == 1 || mask.size(0) == p.batch) && mask.size(1) >= query.size(2) &&
                          mask.size(2) >= key.size(2) && mask.stride(2) == 1,
                      "pasa_npu: atten_mask must be (B or 1, S1, S2) with a contiguous last dim, got sizes ", mask.sizes(),
                      " and strides ", mask.strides());
    p.hasMask = true;
    p.maskRowStride = Uint32(mask.size(1) > 1 ? mask.stride(1) : mask.size(2), "atten_mask row stride");
    p.maskBatchStride = mask.size(0) > 1 ? static_cast<uint64_t>(mask.stride(0)) : 0;
}

void NpuAttention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& out,
                  const std::optional<at::Tensor>& lse, const std::optional<at::Tensor>& mask,
                  const std::optional<at::Tensor>& blockTable, const std::optional<at::Tensor>& keySlots,
                  const std::optional<at::Tensor>& sink, const std::optional<at::Tensor>& rowFlags, c10::IntArrayRef qLens,
                  c10::IntArrayRef kvLens, c10::IntArrayRef nextTokens, c10::IntArrayRef preTokens,
                  c10::IntArrayRef qStarts, c10::IntArrayRef kvStarts, int64_t tilingKey, int64_t maskMode, double scale,
                  double beta, int64_t qBlock, int64_t kvBlock, double resolutionLimit)
{
    CheckTensors(query, key, value, out, lse, blockTable.has_value());
    c10_npu::NPUGuard guard(query.device());
    pasa::PasaProblem p;
    p.tilingKey = Uint32(tilingKey, "tiling_key");
    p.batch = Uint32(static_cast<int64_t>(qLens.size()), "batch (entries of q_lens)");
    p.packed = !qStarts.empty();
    TORCH_CHECK_VALUE(p.packed ? query.size(0) == 1 : query.size(0) == static_cast<int64_t>(p.batch), "pasa_npu: query's batch ",
                      query.size(0), " must be ", p.packed ? "1 (packed)" : "the entries of q_lens");
    p.numHeads = Uint32(query.size(1), "query heads");
    p.numKvHeads = Uint32(key.size(1), "key heads");
    p.seqQ = Uint32(query.size(2), "query length");
    p.seqKv = Uint32(key.size(2), "key length");
    p.headDim = Uint32(query.size(3), "head dim");
    p.headDimV = Uint32(value.size(3), "value head dim");
    p.qLayout = LayoutOf(query, "query");
    p.kvLayout = LayoutOf(key, "key");
    p.outLayout = LayoutOf(out, "out");
    p.outDtype = out.scalar_type() == at::kHalf ? PASA_OUT_FP16 : PASA_OUT_BF16;
    p.inDtype = query.scalar_type() == at::kHalf ? PASA_IN_FP16 : PASA_IN_BF16;
    p.maskMode = Uint32(maskMode, "mask_mode");
    p.scale = scale;
    p.beta = beta;
    p.qBlock = Uint32(qBlock, "q_block");
    p.kvBlock = Uint32(kvBlock, "kv_block");
    p.coreNum = AiCoreCount(query.device().index());
    if (mask.has_value()) SetMask(p, *mask, query, key);
    if (blockTable.has_value()) SetPages(p, *blockTable, keySlots, query, key);
    if (sink.has_value()) SetSink(p, *sink, query);
    if (rowFlags.has_value()) {
        CheckDevice(*rowFlags, "row_flags", query.device());
        TORCH_CHECK_VALUE(rowFlags->scalar_type() == at::kByte && rowFlags->is_contiguous() &&
                              rowFlags->sizes() == at::IntArrayRef({query.size(0), query.size(1), query.size(2)}),
                          "pasa_npu: row_flags must be a contiguous uint8 (B, Nq, Sq) tensor, got ", rowFlags->scalar_type(),
                          " of sizes ", rowFlags->sizes(), " and strides ", rowFlags->strides());
        p.overflowCheck = true;
        p.resolutionLimit = resolutionLimit;
    }
    const int64_t batch = p.batch;
    const std::vector<int32_t> ql = Int32s(qLens, batch, "q_lens");
    const std::vector<int32_t> kl = Int32s(kvLens, batch, "kv_lens");
    const std::vector<int32_t> nx = Int32s(nextTokens, batch, "next_tokens", true);
    const std::vector<int32_t> pr = Int32s(preTokens, batch, "pre_tokens", true);
    const std::vector<int32_t> qs = Int32s(qStarts, batch, "q_starts", true);
    const std::vector<int32_t> ks = Int32s(kvStarts, batch, "kv_starts", true);

    auto call = std::make_shared<QueuedCall>();
    call->memory = std::make_shared<TorchNpuMemory>(query.device());
    if (!lse.has_value()) {  // the kernel writes the LSE either way
        call->lseScratch = at::empty({query.size(0), query.size(1), query.size(2)}, query.options().dtype(at::kFloat));
    }
    pasa::AttentionTensors tensors;
    tensors.query = query.data_ptr();
    tensors.key = key.data_ptr();
    tensors.value = value.data_ptr();
    tensors.out = out.data_ptr();
    tensors.lse = lse.has_value() ? lse->data_ptr() : call->lseScratch.data_ptr();
    tensors.mask = mask.has_value() ? mask->data_ptr() : nullptr;
    tensors.blockTable = blockTable.has_value() ? blockTable->data_ptr() : nullptr;
    tensors.keySlots = keySlots.has_value() ? keySlots->data_ptr() : nullptr;
    tensors.sink = sink.has_value() ? sink->data_ptr() : nullptr;
    tensors.rowFlags = rowFlags.has_value() ? rowFlags->data_ptr() : nullptr;
    pasa::BatchLengths lengths;
    lengths.qLens = ql.data();
    lengths.kvLens = kl.data();
    lengths.nextTokens = DataOrNull(nx);
    lengths.preTokens = DataOrNull(pr);
    lengths.qStarts = DataOrNull(qs);
    lengths.kvStarts = DataOrNull(ks);
    pasa::AclLaunchRuntime runtime(*call->memory);
    try {
        pasa::LaunchAttention(p, tensors, lengths, runtime);
    } catch (const std::invalid_argument& e) {  // before any device work: a configuration the kernels cannot run
        TORCH_CHECK_NOT_IMPLEMENTED(false, "npu: ", e.what());
    }
    call->submission = runtime.TakeSubmission();

    const c10_npu::NPUStream stream = c10_npu::getCurrentNPUStream(query.device().index());
    const aclrtStream raw = stream.stream(false);
    at_npu::native::OpCommand::RunOpApi("pasa_attention", [call, raw]() -> int {
        std::string failure;
        const aclError rc = call->submission.Issue(raw, &failure);
        if (rc != ACL_SUCCESS) TORCH_WARN("pasa_npu: ", failure);
        return static_cast<int>(rc);
    });
    call->memory->ReleaseStagingAfter(stream);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pasa_npu, m)
{
    m.def("npu_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) out, Tensor(b!)? lse, Tensor? atten_mask, "
          "Tensor? block_table, Tensor? key_slots, Tensor? learnable_sink, Tensor(c!)? row_flags, int[] q_lens, int[] kv_lens, int[] next_tokens, int[] pre_tokens, int[] q_starts, int[] kv_starts, "
          "int tiling_key, int mask_mode, float scale, float beta, int q_block, int kv_block, float resolution_limit) -> ()");
}

TORCH_LIBRARY_IMPL(pasa_npu, PrivateUse1, m)
{
    m.impl("npu_attention", &NpuAttention);
}

// `import pasa_npu._npu` loads this library, which registers the operator above.
extern "C" PyMODINIT_FUNC PyInit__npu(void)
{
    static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_npu", "PASA AscendC kernels on NPU tensors (torch_npu)",
                                 -1, nullptr, nullptr, nullptr, nullptr, nullptr};
    return PyModule_Create(&module);
}
