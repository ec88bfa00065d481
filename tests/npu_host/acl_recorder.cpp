// Recording stand-ins for the ACL functions the ACL runtime of the shared host launcher calls
// (ascend_kernels/host/pasa_acl_runtime.cpp: aclrtMemcpyAsync, aclrtGetDeviceInfo and the
// aclrtlaunch_* stubs CANN generates), and a driver that runs one call through
// pasa::LaunchAttention with pasa::AclLaunchRuntime, then prints what reached ACL, one line a
// call, for tests/ascend_kernels/test_npu_host.py to compare with the emulated runtime's calls:
//   allocate <bytes>
//   upload <buffer> <offset> <bytes as hex>
//   launch <kernel> <blockDim> <buffer>:<offset> ...   (the kernel's arguments in order)
//   error <what>                                       (a call ACL would not accept as made)
// Device memory is never touched: its addresses are invented, 512-byte aligned and far apart.
// Input on stdin: "name value" lines (the PasaProblem fields as ascendc_emu names them, and
// core_num, which aclrtGetDeviceInfo reports), and "q_lens"/"kv_lens"/"next_tokens" lines (and
// optionally "pre_tokens"/"q_starts"/"kv_starts") with one integer per batch.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclrtlaunch_pasa_attention.h"
#include "aclrtlaunch_pasa_center_keys.h"
#include "aclrtlaunch_pasa_merge_splits.h"
#include "aclrtlaunch_pasa_shift_keys.h"
#include "pasa_acl_runtime.h"

namespace {

struct Range {
    std::string name;
    uintptr_t base;
    size_t bytes;
};

struct Recorder {
    std::vector<Range> device;   // the caller's tensors and the runtime's allocations
    std::vector<Range> pinned;   // page-locked staging handed out
    std::vector<std::string> lines;
    aclrtStream stream = nullptr;
    int64_t cores = 0;
    uintptr_t next = uintptr_t{1} << 44;

    uintptr_t Reserve(const std::string& name, size_t bytes)
    {
        const uintptr_t base = next;
        next += (uintptr_t{1} << 32);  // far apart: an address names one buffer
        device.push_back({name, base, bytes});
        return base;
    }
    std::string Where(const void* p) const
    {
        const auto a = reinterpret_cast<uintptr_t>(p);
        if (a == 0) return "null:0";  // an argument the kernel does not read in this call
        for (const Range& r : device) {
            if (a >= r.base && a < r.base + r.bytes) return r.name + ":" + std::to_string(a - r.base);
        }
        return "unknown:" + std::to_string(a);
    }
    bool IsPinned(const void* p, size_t bytes) const
    {
        const auto a = reinterpret_cast<uintptr_t>(p);
        for (const Range& r : pinned) {
            if (a >= r.base && a + bytes <= r.base + r.bytes) return true;
        }
        return false;
    }
    void CheckStream(aclrtStream s, const char* who)
    {
        if (s != stream) lines.push_back(std::string("error ") + who + " on another stream than the caller's");
    }
    void Launch(const char* kernel, uint32_t blockDim, aclrtStream s, std::initializer_list<void*> args)
    {
        CheckStream(s, kernel);
        std::string line = std::string("launch ") + kernel + " " + std::to_string(blockDim);
        for (void* a : args) line += " " + Where(a);
        lines.push_back(line);
    }
};

Recorder g_rec;

class RecordingMemory final : public pasa::AclMemory {
public:
    void* DeviceBuffer(size_t bytes) override
    {
        const std::string name = "alloc" + std::to_string(allocations_++);
        g_rec.lines.push_back("allocate " + std::to_string(bytes));
        return reinterpret_cast<void*>(g_rec.Reserve(name, bytes));
    }
    void* PinnedHostBuffer(size_t bytes) override
    {
        void* p = std::malloc(bytes);
        g_rec.pinned.push_back({"pinned", reinterpret_cast<uintptr_t>(p), bytes});
        return p;
    }

private:
    int allocations_ = 0;
};

std::string Hex(const void* data, size_t bytes)
{
    std::string out;
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i) {
        char pair[3];
        std::snprintf(pair, sizeof(pair), "%02x", p[i]);
        out += pair;
    }
    return out;
}

}  // namespace

extern "C" aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                                     aclrtStream stream)
{
    g_rec.CheckStream(stream, "aclrtMemcpyAsync");
    if (kind != ACL_MEMCPY_HOST_TO_DEVICE) g_rec.lines.push_back("error aclrtMemcpyAsync of another kind than host to device");
    if (destMax < count) g_rec.lines.push_back("error aclrtMemcpyAsync with destMax below count");
    if (!g_rec.IsPinned(src, count)) g_rec.lines.push_back("error aclrtMemcpyAsync from memory that is not page-locked");
    const std::string where = g_rec.Where(dst);
    const size_t colon = where.find(':');
    g_rec.lines.push_back("upload " + where.substr(0, colon) + " " + where.substr(colon + 1) + " " + Hex(src, count));
    return ACL_SUCCESS;
}

extern "C" aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t* value)
{
    if (attr != ACL_DEV_ATTR_AICORE_CORE_NUM || deviceId != 0) return ACL_ERROR_INVALID_PARAM;
    *value = g_rec.cores;
    return ACL_SUCCESS;
}

extern "C" uint32_t aclrtlaunch_pasa_shift_keys(uint32_t blockDim, aclrtStream stream, void* key, void* blockTable,
                                                void* keySlots, void* workspace, void* tiling)
{
    g_rec.Launch("pasa_shift_keys", blockDim, stream, {key, blockTable, keySlots, workspace, tiling});
    return 0;
}

extern "C" uint32_t aclrtlaunch_pasa_center_keys(uint32_t blockDim, aclrtStream stream, void* key, void* blockTable,
                                                 void* keySlots, void* workspace, void* tiling)
{
    g_rec.Launch("pasa_center_keys", blockDim, stream, {key, blockTable, keySlots, workspace, tiling});
    return 0;
}

extern "C" uint32_t aclrtlaunch_pasa_attention(uint32_t blockDim, aclrtStream stream, void* query, void* key,
                                               void* value, void* mask, void* blockTable, void* keySlots, void* sink,
                                               void* out, void* lse, void* rowFlags, void* workspace, void* tiling)
{
    g_rec.Launch("pasa_attention", blockDim, stream,
                 {query, key, value, mask, blockTable, keySlots, sink, out, lse, rowFlags, workspace, tiling});
    return 0;
}

extern "C" uint32_t aclrtlaunch_pasa_merge_splits(uint32_t blockDim, aclrtStream stream, void* sink, void* out,
                                                  void* lse, void* rowFlags, void* workspace, void* tiling)
{
    g_rec.Launch("pasa_merge_splits", blockDim, stream, {sink, out, lse, rowFlags, workspace, tiling});
    return 0;
}

int main()
{
    std::map<std::string, double> in;
    std::map<std::string, std::vector<int32_t>> lens;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream words(line);
        std::string name;
        if (!(words >> name)) continue;
        if (name == "q_lens" || name == "kv_lens" || name == "next_tokens" || name == "pre_tokens" ||
            name == "q_starts" || name == "kv_starts") {
            int64_t v;
            while (words >> v) lens[name].push_back(static_cast<int32_t>(v));
        } else {
            words >> in[name];
        }
    }
    g_rec.cores = static_cast<int64_t>(in["core_num"]);
    pasa::PasaProblem p;
    p.tilingKey = in["tiling_key"], p.batch = in["batch"], p.numHeads = in["num_heads"];
    p.numKvHeads = in["num_kv_heads"], p.seqQ = in["seq_q"], p.seqKv = in["seq_kv"];
    p.headDim = in["head_dim"], p.headDimV = in["head_dim_v"], p.qLayout = in["q_layout"];
    p.kvLayout = in["kv_layout"], p.outLayout = in["out_layout"], p.outDtype = in["out_dtype"];
    p.inDtype = in["in_dtype"], p.maskMode = in["mask_mode"], p.scale = in["scale"], p.beta = in["beta"];
    p.qBlock = in["q_block"], p.kvBlock = in["kv_block"];
    p.packed = in["packed"] != 0, p.kvSplits = in["kv_splits"];
    p.paged = in["paged"] != 0, p.blockSize = in["block_size"], p.tableStride = in["table_stride"];
    p.numBlocks = in["num_blocks"];
    p.hasMask = in["has_mask"] != 0, p.maskRowStride = in["mask_row_stride"], p.maskBatchStride = in["mask_batch_stride"];
    p.hasSink = in["has_sink"] != 0, p.prepLaunch = in["prep_launch"] != 0, p.mergeLaunch = in["merge_launch"] != 0;
    p.overflowCheck = in["overflow_check"] != 0, p.resolutionLimit = in["resolution_limit"];
    p.coreNum = pasa::AclAiCoreCount(0);

    const size_t b = p.batch, hq = p.numHeads, hk = p.numKvHeads;
    pasa::AttentionTensors t;
    t.query = reinterpret_cast<void*>(g_rec.Reserve("query", b * hq * p.seqQ * p.headDim * 2));
    const size_t kb = p.paged ? p.numBlocks : b;
    t.key = reinterpret_cast<void*>(g_rec.Reserve("key", kb * hk * p.seqKv * p.headDim * 2));
    t.value = reinterpret_cast<void*>(g_rec.Reserve("value", kb * hk * p.seqKv * p.headDimV * 2));
    if (p.paged) {
        t.blockTable = reinterpret_cast<void*>(g_rec.Reserve("block_table", b * p.tableStride * 4));
        t.keySlots = reinterpret_cast<void*>(g_rec.Reserve("key_slots", b * p.tableStride * 4));
    }
    t.out = reinterpret_cast<void*>(g_rec.Reserve("out", b * hq * p.seqQ * p.headDimV * 2));
    t.lse = reinterpret_cast<void*>(g_rec.Reserve("lse", b * hq * p.seqQ * 4));
    if (p.hasMask) t.mask = reinterpret_cast<void*>(g_rec.Reserve("mask", (p.maskBatchStride ? b : 1) * p.seqQ * p.maskRowStride));
    if (p.hasSink) t.sink = reinterpret_cast<void*>(g_rec.Reserve("sink", hq * 4));
    if (p.overflowCheck) t.rowFlags = reinterpret_cast<void*>(g_rec.Reserve("row_flags", b * hq * p.seqQ));
    pasa::BatchLengths l;
    l.qLens = lens["q_lens"].data();
    l.kvLens = lens["kv_lens"].data();
    l.nextTokens = lens["next_tokens"].data();
    if (lens.count("pre_tokens")) l.preTokens = lens["pre_tokens"].data();
    if (lens.count("q_starts")) l.qStarts = lens["q_starts"].data();
    if (lens.count("kv_starts")) l.kvStarts = lens["kv_starts"].data();

    RecordingMemory memory;
    pasa::AclLaunchRuntime runtime(memory);
    pasa::LaunchAttention(p, t, l, runtime);
    g_rec.lines.push_back("issue");  // nothing reaches ACL's stream before the submission is issued
    g_rec.stream = reinterpret_cast<aclrtStream>(uintptr_t{0x5000});
    std::string failure;
    const aclError rc = runtime.TakeSubmission().Issue(g_rec.stream, &failure);
    if (rc != ACL_SUCCESS) g_rec.lines.push_back("error " + failure);
    for (const std::string& s : g_rec.lines) std::cout << s << "\n";
    return 0;
}
