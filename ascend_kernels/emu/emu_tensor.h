// GlobalTensor, LocalTensor, TPipe, TQue, TBuf and the system queries of the AscendC
// CPU emulation. Signatures follow include/basic_api/kernel_tensor.h, kernel_tpipe.h and
// kernel_operator_sys_var_intf.h of asc-devkit; the bodies add the checks the hardware
// implies (capacity, alignment, queue discipline).
#pragma once

#include "emu_runtime.h"

namespace AscendC {

template <typename T>
class LocalTensor;

namespace emu {
// One buffer handed out by a TQue or TBuf: its place and the queue-ordering snapshots.
struct BufferSlot {
    Hardware hw = Hardware::MAX;
    uint32_t offset = 0;
    uint32_t bytes = 0;
    enum State { FREE, ALLOCATED, ENQUEUED, DEQUEUED } state = FREE;
    bool everUsed = false;
    int8_t heldEvent = -1;  // the TPipe event ID it holds (EnQue..DeQue, FreeTensor..AllocTensor)
    Clock freed{};     // snapshot of the consumer pipe at FreeTensor
    Clock enqueued{};  // snapshot of the producer pipe at EnQue
    double freedAt = 0, enqueuedAt = 0;  // the same events in the timing model
};

// (producer pipe, consumer pipe) of the hardware event behind a queue position.
inline void QueuePipes(TPosition pos, int& producer, int& consumer)
{
    switch (pos) {
        case TPosition::VECIN: producer = P_MTE2; consumer = P_V; return;
        case TPosition::VECOUT: producer = P_V; consumer = P_MTE3; return;
        case TPosition::VECCALC: producer = P_V; consumer = P_V; return;
        case TPosition::A1: case TPosition::B1: producer = P_MTE2; consumer = P_MTE1; return;
        case TPosition::A2: case TPosition::B2: producer = P_MTE1; consumer = P_M; return;
        case TPosition::CO1: producer = P_M; consumer = P_FIX; return;
        default: producer = consumer = -1; return;
    }
}

// The hardware event from pipe `src` to pipe `dst` (EventPipes's inverse; MAX where none).
inline HardEvent EventBetween(int src, int dst)
{
    for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
        int s, d;
        EventPipes(static_cast<HardEvent>(e), s, d);
        if (s == src && d == dst) return static_cast<HardEvent>(e);
    }
    return HardEvent::MAX;
}

// The hardware events of a queue position (between its QueuePipes): forward (EnQue -> DeQue)
// and backward (FreeTensor -> the next AllocTensor), as GetQueEvt of kernel_event.h names them;
// MAX where the producer is the consumer.
inline void QueueEvents(TPosition pos, HardEvent& forward, HardEvent& backward)
{
    int producer, consumer;
    QueuePipes(pos, producer, consumer);
    const bool none = producer < 0 || producer == consumer;
    forward = none ? HardEvent::MAX : EventBetween(producer, consumer);
    backward = none ? HardEvent::MAX : EventBetween(consumer, producer);
}

// "MTE1_MTE2" for HardEvent::MTE1_MTE2, as the flag errors name events.
inline std::string EventName(HardEvent evt)
{
    int src, dst;
    EventPipes(evt, src, dst);
    return std::string(PipeShort(src)) + "_" + PipeShort(dst);
}

// TPipe's event-ID pool: 8 IDs per HardEvent on this core (QUE_MAX_EVENT), shared by
// TPipe::AllocEventID and the queues, which hold one per buffer between EnQue and DeQue and
// between FreeTensor and the buffer's next AllocTensor (kernel_tquebind_impl.h).
// byQueue: a queue takes the ID and sets its flag (kept in CoreCtx::queueFlag, which explicit
// SetFlag/WaitFlag on that ID refuse).
inline int8_t TakeEventId(HardEvent evt, const char* what, bool byQueue = false)
{
    CoreCtx& c = Core();
    bool* used = c.eventIdUsed[static_cast<int>(evt)];
    for (int id = 0; id < kEventIds; ++id) {
        if (!used[id]) {
            used[id] = true;
            c.queueFlag[static_cast<int>(evt)][id] = byQueue;
            return static_cast<int8_t>(id);
        }
    }
    Fail("%s: all 8 event IDs of HardEvent::%s are held (TPipe allows 8 per HardEvent; each queue buffer holds one "
         "from EnQue to DeQue and from FreeTensor to its next AllocTensor)", what, EventName(evt).c_str());
}
inline void GiveEventId(HardEvent evt, int8_t id, const char* what)
{
    CoreCtx& c = Core();
    bool* used = c.eventIdUsed[static_cast<int>(evt)];
    if (id < 0 || id >= kEventIds || !used[id]) Fail("%s: event ID %d of HardEvent::%s is not held", what, id, EventName(evt).c_str());
    used[id] = false;
    c.queueFlag[static_cast<int>(evt)][id] = false;
}

struct PipeState {
    uint32_t next[static_cast<int>(Hardware::MAX)] = {};
};
inline thread_local PipeState* tls_pipe = nullptr;

inline uint32_t AllocateLocal(TPosition pos, uint32_t bytes, const char* what)
{
    CoreCtx& c = Core();
    if (tls_pipe == nullptr) Fail("%s: no TPipe exists on this core; construct a TPipe first", what);
    const Hardware hw = PositionHardware(pos);
    if (hw == Hardware::MAX) Fail("%s: TPosition %d has no local memory in this emulation", what, static_cast<int>(pos));
    if (!c.Has(hw)) {
        Fail("%s: TPosition %s lives in %s, which an %s core does not have", what, PositionName(pos), HardwareName(hw),
             c.type == AIC ? "AIC" : "AIV");
    }
    const uint32_t aligned = (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
    uint32_t& next = tls_pipe->next[static_cast<int>(hw)];
    const uint64_t end = static_cast<uint64_t>(next) + aligned;
    if (end > HardwareCapacity(hw)) {
        Fail("%s: %s over capacity: %u bytes requested with %u already allocated, capacity %u bytes", what,
             HardwareName(hw), aligned, next, HardwareCapacity(hw));
    }
    const uint32_t off = next;
    next = static_cast<uint32_t>(end);
    return off;
}
}  // namespace emu

// ------------------------------------------------------------------ GlobalTensor
template <typename T>
class GlobalTensor {
public:
    using PrimType = T;
    GlobalTensor() {}
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize)
    {
        address_ = buffer;
        bufferSize_ = bufferSize;
    }
    void SetGlobalBuffer(__gm__ T* buffer)
    {
        address_ = buffer;
        bufferSize_ = 0;
    }
    const __gm__ T* GetPhyAddr() const { return address_; }
    __gm__ T* GetPhyAddr(const uint64_t offset) const { return address_ + offset; }
    T GetValue(const uint64_t offset) const
    {
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::Dispatch(emu::P_S, emu::Timing().scalar_gm_access_cycles);
        emu::TouchGm(emu::P_S, seq, address_ + offset, sizeof(T), false, "GlobalTensor::GetValue");
        return address_[offset];
    }
    void SetValue(const uint64_t offset, T value)
    {
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::Dispatch(emu::P_S, emu::Timing().scalar_gm_access_cycles);
        emu::TouchGm(emu::P_S, seq, address_ + offset, sizeof(T), true, "GlobalTensor::SetValue");
        address_[offset] = value;
    }
    uint64_t GetSize() const { return bufferSize_; }
    GlobalTensor operator[](const uint64_t offset) const
    {
        GlobalTensor r;
        r.address_ = address_ + offset;
        r.bufferSize_ = bufferSize_ > offset ? bufferSize_ - offset : 0;
        return r;
    }

    T* address_ = nullptr;
    uint64_t bufferSize_ = 0;
};

// ------------------------------------------------------------------ LocalTensor
template <typename T>
class LocalTensor {
public:
    using PrimType = T;
    LocalTensor() {}

    TPosition GetPosition() const { return pos_; }
    uint32_t GetSize() const { return size_; }
    void SetSize(const uint32_t size)
    {
        if (size > capacity_) emu::Fail("LocalTensor::SetSize(%u) exceeds the %u elements of its buffer", size, capacity_);
        size_ = size;
    }

    LocalTensor operator[](const uint32_t offset) const
    {
        if (offset > size_) emu::Fail("LocalTensor::operator[](%u) beyond the tensor's %u elements", offset, size_);
        LocalTensor r = *this;
        r.byteOffset_ += offset * sizeof(T);
        r.size_ = size_ - offset;
        r.capacity_ = capacity_ - offset;
        return r;
    }

    template <typename U>
    LocalTensor<U> ReinterpretCast() const
    {
        LocalTensor<U> r;
        r.core_ = core_;
        r.pos_ = pos_;
        r.hw_ = hw_;
        r.byteOffset_ = byteOffset_;
        r.size_ = static_cast<uint32_t>(static_cast<uint64_t>(size_) * sizeof(T) / sizeof(U));
        r.capacity_ = static_cast<uint32_t>(static_cast<uint64_t>(capacity_) * sizeof(T) / sizeof(U));
        r.slot_ = slot_;
        return r;
    }

    T GetValue(const uint32_t index) const
    {
        CheckScalar(index, "LocalTensor::GetValue");
        emu::ScalarUbAccess(emu::PipesTouching(hw_, byteOffset_ + index * sizeof(T), sizeof(T), false));
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::TouchLocal(emu::P_S, seq, hw_, byteOffset_ + index * sizeof(T), sizeof(T), false, "LocalTensor::GetValue");
        emu::Core().stats.scalar_ub_accesses++;
        T v;
        std::memcpy(&v, Raw() + index * sizeof(T), sizeof(T));
        return v;
    }
    template <typename S>
    void SetValue(const uint32_t index, const S value) const
    {
        CheckScalar(index, "LocalTensor::SetValue");
        emu::ScalarUbAccess(emu::PipesTouching(hw_, byteOffset_ + index * sizeof(T), sizeof(T), true));
        const uint32_t seq = emu::Issue(emu::P_S);
        emu::TouchLocal(emu::P_S, seq, hw_, byteOffset_ + index * sizeof(T), sizeof(T), true, "LocalTensor::SetValue");
        emu::Core().stats.scalar_ub_accesses++;
        const T v = static_cast<T>(value);
        std::memcpy(Raw() + index * sizeof(T), &v, sizeof(T));
    }

    // ---- emulation internals
    uint8_t* Raw() const
    {
        if (core_ == nullptr) emu::Fail("use of a LocalTensor that was never allocated from a TQue or TBuf");
        if (core_ != emu::tls_core) emu::Fail("a LocalTensor of another core is used here");
        return core_->mem[static_cast<int>(hw_)].data() + byteOffset_;
    }
    T* Data() const { return reinterpret_cast<T*>(Raw()); }
    uint32_t ByteOffset() const { return byteOffset_; }
    Hardware HardwareKind() const { return hw_; }

    void CheckScalar(uint32_t index, const char* op) const
    {
        if (hw_ != Hardware::UB) emu::Fail("%s: scalar access is only emulated for UB tensors", op);
        if (index >= size_) emu::Fail("%s(%u): index beyond the tensor's %u elements", op, index, size_);
    }

    emu::CoreCtx* core_ = nullptr;
    TPosition pos_ = TPosition::MAX;
    Hardware hw_ = Hardware::MAX;
    uint32_t byteOffset_ = 0;
    uint32_t size_ = 0;      // elements visible through this tensor
    uint32_t capacity_ = 0;  // elements up to the end of its buffer
    emu::BufferSlot* slot_ = nullptr;
};

namespace emu {
template <typename T>
LocalTensor<T> MakeTensor(TPosition pos, BufferSlot* slot, uint32_t byteOffset, uint32_t bytes)
{
    LocalTensor<T> t;
    t.core_ = &Core();
    t.pos_ = pos;
    t.hw_ = PositionHardware(pos);
    t.byteOffset_ = byteOffset;
    t.size_ = bytes / sizeof(T);
    t.capacity_ = t.size_;
    t.slot_ = slot;
    return t;
}
}  // namespace emu

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
    ~TPipe()
    {
        if (emu::tls_core != nullptr) emu::tls_core->pipeAlive = false;
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
