// The emulation's implementation of the shared host launcher's runtime (../host/pasa_launcher.h):
// device memory is host memory registered with the emulated GM, an upload is a copy, a launch
// runs the kernel through AscendC::emu::Launch. It records every call, as the ACL runtime's
// calls are recorded in tests/ascend_kernels/test_npu_host.py, so that the two can be compared.
// Include after the kernel sources: it calls pasa_shift_keys, pasa_center_keys, pasa_attention,
// pasa_merge_splits.
#ifndef PASA_EMU_LAUNCH_RUNTIME_H
#define PASA_EMU_LAUNCH_RUNTIME_H

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../host/pasa_launcher.h"
#include "kernel_operator.h"

namespace pasa_emu {

// A device address as the call log names it: the buffer it lies in and the offset.
struct BufferRef {
    std::string buffer;
    uint64_t offset = 0;
};

// One runtime call. kind: "allocate" (buffer, bytes), "upload" (target, data), "launch"
// (kernel, blockDim, args in the kernel's parameter order).
struct RuntimeCall {
    std::string kind;
    std::string buffer;
    uint64_t bytes = 0;
    BufferRef target;
    std::vector<uint8_t> data;
    std::string kernel;
    uint32_t blockDim = 0;
    std::vector<BufferRef> args;
};

class EmuLaunchRuntime final : public pasa::LaunchRuntime {
public:
    // Freshly allocated device memory holds AscendC::emu::kUnwrittenByte, never zeros: the kernels
    // must not rely on the contents of memory they did not write (torch_npu's caching allocator
    // reuses blocks).
    static constexpr size_t kDeviceAlign = 512;

    EmuLaunchRuntime(AscendC::emu::GmRegistry& gm, double timeoutSeconds, const AscendC::emu::TimingParams& timing)
        : gm_(gm), timeout_(timeoutSeconds), timing_(timing) {}

    // A caller tensor the kernels read (or write, `writable`): registered with the emulated GM.
    void AddTensor(const char* name, void* base, size_t bytes, bool writable)
    {
        gm_.Add(name, base, bytes, writable, false);
        ranges_.push_back({name, static_cast<uint8_t*>(base), bytes});
    }

    void* Allocate(size_t bytes, pasa::BufferRole role) override
    {
        const size_t rounded = (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
        void* raw = std::aligned_alloc(kDeviceAlign, rounded == 0 ? kDeviceAlign : rounded);
        if (raw == nullptr) throw std::bad_alloc();
        owned_.emplace_back(static_cast<uint8_t*>(raw), &std::free);
        std::memset(raw, AscendC::emu::kUnwrittenByte, rounded);
        const bool workspace = role == pasa::BufferRole::kWorkspace;
        std::string name = pasa::BufferName(role);  // "parameters", then "parameters 2", ...
        const size_t seen = ++allocated_[static_cast<size_t>(role)];
        if (seen > 1) name += " " + std::to_string(seen);
        gm_.Add(name, raw, bytes, workspace, workspace);
        ranges_.push_back({name, static_cast<uint8_t*>(raw), bytes});
        RuntimeCall call;
        call.kind = "allocate";
        call.buffer = name;
        call.bytes = bytes;
        calls_.push_back(std::move(call));
        return raw;
    }

    void Upload(void* dst, const void* src, size_t bytes) override
    {
        RuntimeCall call;
        call.kind = "upload";
        call.target = Where(dst);
        call.data.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + bytes);
        calls_.push_back(std::move(call));
        std::memcpy(dst, src, bytes);
    }

    void Launch(pasa::PasaKernel kernel, uint32_t blockDim, const pasa::KernelArgs& a) override
    {
        switch (kernel) {
            case pasa::PasaKernel::kShiftKeys:
                Run(kernel, blockDim, KERNEL_TYPE_MIX_AIC_1_2, &pasa_shift_keys, Gm(a.key), Gm(a.blockTable), Gm(a.keySlots),
                    Gm(a.workspace), Gm(a.tiling));
                return;
            case pasa::PasaKernel::kCenterKeys:
                Run(kernel, blockDim, KERNEL_TYPE_MIX_AIC_1_2, &pasa_center_keys, Gm(a.key), Gm(a.blockTable),
                    Gm(a.keySlots), Gm(a.workspace), Gm(a.tiling));
                return;
            case pasa::PasaKernel::kAttention:
                Run(kernel, blockDim, KERNEL_TYPE_MIX_AIC_1_2, &pasa_attention, Gm(a.query), Gm(a.key), Gm(a.value),
                    Gm(a.mask), Gm(a.blockTable), Gm(a.keySlots), Gm(a.sink), Gm(a.out), Gm(a.lse), Gm(a.rowFlags),
                    Gm(a.workspace), Gm(a.tiling));
                return;
            case pasa::PasaKernel::kMerge:
                Run(kernel, blockDim, KERNEL_TYPE_AIV_ONLY, &pasa_merge_splits, Gm(a.sink), Gm(a.out), Gm(a.lse),
                    Gm(a.rowFlags), Gm(a.workspace), Gm(a.tiling));
                return;
        }
        throw AscendC::emu::EmuError("launch: unknown kernel");
    }

    const std::vector<RuntimeCall>& Calls() const { return calls_; }
    // Statistics of each launch, in launch order.
    const std::vector<std::pair<pasa::PasaKernel, AscendC::emu::Stats>>& LaunchStats() const { return stats_; }

private:
    struct Range {
        std::string name;
        uint8_t* base;
        size_t bytes;
    };

    static GM_ADDR Gm(void* p) { return static_cast<GM_ADDR>(p); }

    BufferRef Where(const void* p) const
    {
        const auto* a = static_cast<const uint8_t*>(p);
        if (p == nullptr) return {"null", 0};
        for (const Range& r : ranges_) {
            if (a >= r.base && a < r.base + r.bytes) return {r.name, static_cast<uint64_t>(a - r.base)};
        }
        return {"unregistered", reinterpret_cast<uintptr_t>(p)};
    }

    // Records the arguments exactly as the kernel receives them, then runs it.
    template <typename... Args>
    void Run(pasa::PasaKernel kernel, uint32_t blockDim, KernelMetaType type, void (*fn)(Args...), Args... args)
    {
        RuntimeCall call;
        call.kind = "launch";
        call.kernel = pasa::KernelName(kernel);
        call.blockDim = blockDim;
        call.args = {Where(args)...};
        calls_.push_back(std::move(call));
        AscendC::emu::LaunchOptions opt{static_cast<int>(blockDim), type, timeout_, timing_};
        stats_.emplace_back(kernel, AscendC::emu::Launch(opt, gm_, [&]() { fn(args...); }));
    }

    AscendC::emu::GmRegistry& gm_;
    double timeout_;
    AscendC::emu::TimingParams timing_;
    std::vector<Range> ranges_;
    size_t allocated_[2] = {0, 0};  // allocations per BufferRole
    std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> owned_;
    std::vector<RuntimeCall> calls_;
    std::vector<std::pair<pasa::PasaKernel, AscendC::emu::Stats>> stats_;
};

}  // namespace pasa_emu

#endif  // PASA_EMU_LAUNCH_RUNTIME_H
