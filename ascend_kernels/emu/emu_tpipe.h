// TPipe, TQue, TBuf and the system queries of the AscendC CPU emulation. Signatures follow
// include/basic_api/kernel_tpipe.h and kernel_operator_sys_var_intf.h of asc-devkit; the
// bodies add the checks the hardware implies (capacity, queue discipline, the event IDs).
#pragma once

#include "emu_sync.h"
#include "emu_tensor.h"

#include <exception>

namespace AscendC {

// ------------------------------------------------------------------ TQue / TBuf / TPipe
class TPipe;

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue {
public:
    TQue() = default;

    // The buffers are taken round robin from a cursor that advances on every probe, as the real
    // TQueBind::AllocBuffer does (impl/basic_api/kernel_tquebind_impl.h).
    template <typename T>
    LocalTensor<T> AllocTensor()
    {
        for (size_t probe = 0; probe < slots_.size(); ++probe) {
            emu::BufferSlot& s = slots_[cursor_];
            cursor_ = (cursor_ + 1) % slots_.size();
            if (s.state != emu::BufferSlot::FREE) continue;
            int producer, consumer;
            emu::QueuePipes(pos, producer, consumer);
            HardEvent forward, backward;
            emu::QueueEvents(pos, forward, backward);
            if (s.heldEvent >= 0) {
                emu::GiveEventId(backward, s.heldEvent, "TQue::AllocTensor");
                s.heldEvent = -1;
            }
            // The framework waits for the consumer's FreeTensor before reusing a buffer.
            if (s.everUsed) {
                emu::Join(emu::Core().seen[producer], s.freed);
                if (producer != consumer) emu::FlagWait(producer, s.freedAt);
            }
            s.state = emu::BufferSlot::ALLOCATED;
            s.everUsed = true;
            return emu::MakeTensor<T>(pos, &s, s.offset, s.bytes);
        }
        emu::Fail("TQue<%s>::AllocTensor: all %zu buffers are in use (AllocTensor without FreeTensor); on hardware "
                  "this blocks forever", emu::PositionName(pos), slots_.size());
    }

    template <typename T>
    bool EnQue(const LocalTensor<T>& tensor)
    {
        emu::BufferSlot* s = Own(tensor, "EnQue");
        if (s->state != emu::BufferSlot::ALLOCATED) {
            emu::Fail("TQue<%s>::EnQue of a tensor that is %s (EnQue needs a tensor from AllocTensor)",
                      emu::PositionName(pos), StateName(s->state));
        }
        if (static_cast<int32_t>(fifo_.size()) >= depth) {
            emu::Fail("TQue<%s>::EnQue: queue of depth %d is full (DeQue first)", emu::PositionName(pos), depth);
        }
        int producer, consumer;
        emu::QueuePipes(pos, producer, consumer);
        HardEvent forward, backward;
        emu::QueueEvents(pos, forward, backward);
        if (forward != HardEvent::MAX) s->heldEvent = emu::TakeEventId(forward, "TQue::EnQue", true);
        s->enqueued = emu::PipeSnapshot(producer);
        if (producer != consumer) s->enqueuedAt = emu::FlagRaise(producer);
        s->state = emu::BufferSlot::ENQUEUED;
        fifo_.push_back(s);
        return true;
    }

    template <typename T>
    LocalTensor<T> DeQue()
    {
        if (fifo_.empty()) {
            emu::Fail("TQue<%s>::DeQue on an empty queue: nothing was EnQue'd (on hardware the consumer pipe waits "
                      "forever)", emu::PositionName(pos));
        }
        emu::BufferSlot* s = fifo_.front();
        fifo_.pop_front();
        int producer, consumer;
        emu::QueuePipes(pos, producer, consumer);
        HardEvent forward, backward;
        emu::QueueEvents(pos, forward, backward);
        if (s->heldEvent >= 0) {
            emu::GiveEventId(forward, s->heldEvent, "TQue::DeQue");
            s->heldEvent = -1;
        }
        emu::Join(emu::Core().seen[consumer], s->enqueued);
        if (producer != consumer) emu::FlagWait(consumer, s->enqueuedAt);
        s->state = emu::BufferSlot::DEQUEUED;
        return emu::MakeTensor<T>(pos, s, s->offset, s->bytes);
    }

    template <typename T>
    void FreeTensor(LocalTensor<T>& tensor)
    {
        emu::BufferSlot* s = Own(tensor, "FreeTensor");
        if (s->state != emu::BufferSlot::DEQUEUED && s->state != emu::BufferSlot::ALLOCATED) {
            emu::Fail("TQue<%s>::FreeTensor of a tensor that is %s", emu::PositionName(pos), StateName(s->state));
        }
        int producer, consumer;
        emu::QueuePipes(pos, producer, consumer);
        HardEvent forward, backward;
        emu::QueueEvents(pos, forward, backward);
        if (backward != HardEvent::MAX) s->heldEvent = emu::TakeEventId(backward, "TQue::FreeTensor", true);
        const int releasing = s->state == emu::BufferSlot::DEQUEUED ? consumer : producer;
        s->freed = emu::PipeSnapshot(releasing);
        if (producer != consumer) s->freedAt = emu::FlagRaise(releasing);
        s->state = emu::BufferSlot::FREE;
    }

    bool HasTensorInQue() { return !fifo_.empty(); }
    int32_t GetTensorCountInQue() { return static_cast<int32_t>(fifo_.size()); }
    bool HasIdleBuffer()
    {
        for (auto& s : slots_) if (s.state == emu::BufferSlot::FREE) return true;
        return false;
    }

    // emulation internals
    std::vector<emu::BufferSlot> slots_;
    std::deque<emu::BufferSlot*> fifo_;
    size_t cursor_ = 0;

private:
    static const char* StateName(emu::BufferSlot::State st)
    {
        switch (st) {
            case emu::BufferSlot::FREE: return "free";
            case emu::BufferSlot::ALLOCATED: return "allocated but not enqueued";
            case emu::BufferSlot::ENQUEUED: return "enqueued but not dequeued";
            default: return "dequeued";
        }
    }
    template <typename T>
    emu::BufferSlot* Own(const LocalTensor<T>& t, const char* op)
    {
        for (auto& s : slots_) {
            if (&s == t.slot_) return &s;
        }
        emu::Fail("TQue<%s>::%s of a tensor that was not allocated from this queue", emu::PositionName(pos), op);
    }
};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
public:
    TBuf() = default;
    template <typename T>
    LocalTensor<T> Get()
    {
        if (slot_.bytes == 0) emu::Fail("TBuf<%s>::Get before TPipe::InitBuffer", emu::PositionName(pos));
        return emu::MakeTensor<T>(pos, &slot_, slot_.offset, slot_.bytes);
    }
    template <typename T>
    LocalTensor<T> Get(uint32_t len)
    {
        if (static_cast<uint64_t>(len) * sizeof(T) > slot_.bytes) {
            emu::Fail("TBuf<%s>::Get(%u): %llu bytes exceed the buffer's %u", emu::PositionName(pos), len,
                      static_cast<unsigned long long>(len) * sizeof(T), slot_.bytes);
        }
        return emu::MakeTensor<T>(pos, &slot_, slot_.offset, len * sizeof(T));
    }
    emu::BufferSlot slot_;
};

class TPipe;
namespace emu {
inline thread_local TPipe* tls_tpipe = nullptr;
}

class TPipe {
public:
    TPipe()
    {
        emu::CoreCtx& c = emu::Core();
        if (c.pipeAlive) emu::Fail("a second TPipe on the same core; a kernel creates one TPipe");
        c.pipeAlive = true;
        emu::tls_pipe = &state_;
        emu::tls_tpipe = this;
    }
    // TPipe::Destroy (impl/basic_api/kernel_tpipe_impl.h): each free buffer's pending event is
    // waited for and its ID given back, then every pipe drains (PIPE_ALL), so that a later
    // TPipe of the kernel starts with every event ID free.
    ~TPipe()
    {
        if (emu::tls_core != nullptr) {
            emu::CoreCtx& c = *emu::tls_core;
            for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
                for (int id = 0; id < emu::kEventIds; ++id) {
                    if (c.queueFlag[e][id]) c.eventIdUsed[e][id] = c.queueFlag[e][id] = false;
                }
            }
            if (std::uncaught_exceptions() == 0) emu::BarrierAll();
            c.pipeAlive = false;
        }
        emu::tls_pipe = nullptr;
        emu::tls_tpipe = nullptr;
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;

    void Init() {}

    template <TPosition pos, int32_t depth, auto mask>
    bool InitBuffer(TQue<pos, depth, mask>& que, uint8_t num, uint32_t len)
    {
        if (num == 0 || len == 0) emu::Fail("TPipe::InitBuffer(TQue<%s>): num and len must be positive", emu::PositionName(pos));
        if (!que.slots_.empty()) emu::Fail("TPipe::InitBuffer called twice for the same TQue<%s>", emu::PositionName(pos));
        que.slots_.resize(num);
        for (auto& s : que.slots_) {
            s.hw = emu::PositionHardware(pos);
            s.offset = emu::AllocateLocal(pos, len, "TPipe::InitBuffer");
            s.bytes = (len + emu::kBlockBytes - 1) / emu::kBlockBytes * emu::kBlockBytes;
        }
        return true;
    }

    template <TPosition pos>
    bool InitBuffer(TBuf<pos>& buf, uint32_t len)
    {
        if (len == 0) emu::Fail("TPipe::InitBuffer(TBuf<%s>): len must be positive", emu::PositionName(pos));
        if (buf.slot_.bytes != 0) emu::Fail("TPipe::InitBuffer called twice for the same TBuf<%s>", emu::PositionName(pos));
        buf.slot_.hw = emu::PositionHardware(pos);
        buf.slot_.offset = emu::AllocateLocal(pos, len, "TPipe::InitBuffer");
        buf.slot_.bytes = (len + emu::kBlockBytes - 1) / emu::kBlockBytes * emu::kBlockBytes;
        return true;
    }

    template <HardEvent evt>
    TEventID AllocEventID()
    {
        return static_cast<TEventID>(emu::TakeEventId(evt, "TPipe::AllocEventID"));
    }
    template <HardEvent evt>
    void ReleaseEventID(TEventID id)
    {
        emu::GiveEventId(evt, static_cast<int8_t>(id), "TPipe::ReleaseEventID");
    }

    void Destroy() {}
    void Reset() {}

private:
    emu::PipeState state_;
};

// The core's TPipe (kernel_tpipe.h).
inline TPipe* GetTPipePtr()
{
    if (emu::tls_tpipe == nullptr) emu::Fail("GetTPipePtr: no TPipe exists on this core");
    return emu::tls_tpipe;
}

// ------------------------------------------------------------------ system queries
inline int64_t GetBlockNum() { return emu::Core().blockDim; }
// AIC: the AI Core index. AIV in a MIX kernel: AI Core index * 2 + sub-block index.
inline int64_t GetBlockIdx()
{
    const emu::CoreCtx& c = emu::Core();
    if (c.type == AIV && c.group->mix) return static_cast<int64_t>(c.blockIdx) * 2 + c.subIdx;
    return c.blockIdx;
}
inline int64_t GetSubBlockIdx() { return emu::Core().subIdx; }
inline int64_t GetSubBlockNum() { return emu::Core().group->mix ? 2 : 1; }
inline int64_t GetTaskRatio() { return emu::Core().group->mix ? 2 : 1; }

}  // namespace AscendC

// Which core type the current thread is (the real headers compare g_coreType).
#define ASCEND_IS_AIC (::AscendC::emu::Core().type == ::AscendC::AIC)
#define ASCEND_IS_AIV (::AscendC::emu::Core().type == ::AscendC::AIV)
#define ASCEND_IS_NOT_AIC (::AscendC::emu::Core().type != ::AscendC::AIC)
#define ASCEND_IS_NOT_AIV (::AscendC::emu::Core().type != ::AscendC::AIV)
#define KERNEL_TASK_TYPE_DEFAULT(value) ::AscendC::emu::CheckDeclaredKernelType(value)
