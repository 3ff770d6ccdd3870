// The Mooncake Transfer Engine adapter: TeCore (mooncake_te_core.hpp) instantiated
// with Mooncake's own types (transfer_engine.h; C++20), behind the Adapter class.
#include "mooncake_weight_store/mooncake_te.hpp"

#include <cstring>
#include <exception>

#include "transfer_engine.h"

namespace mws {
namespace mooncake_te {

namespace {

/// Mooncake's types for TeCore.
struct MooncakeApi {
    using Engine = ::mooncake::TransferEngine;
    using Request = ::mooncake::TransferRequest;
    using BatchID = ::mooncake::BatchID;
    using SegmentHandle = ::mooncake::SegmentHandle;
    using TransferStatus = ::mooncake::TransferStatus;
    using Status = ::mooncake::Status;
    using NotifyDesc = ::mooncake::TransferMetadata::NotifyDesc;
    static constexpr BatchID kInvalidBatch = ::mooncake::INVALID_BATCH_ID;
    static constexpr Request::OpCode kRead = Request::READ;
    static constexpr Request::OpCode kWrite = Request::WRITE;
    static bool completed(const TransferStatus &s) { return s.s == ::mooncake::TransferStatusEnum::COMPLETED; }
    // TIMEOUT is reported while slices may still be in flight: not terminal.
    static bool failed(const TransferStatus &s) { return s.s == ::mooncake::TransferStatusEnum::FAILED; }
    static bool invalid_segment(SegmentHandle h) { return static_cast<long long>(h) < 0; }
    static std::int32_t status_code(const Status &s) {
        return kErrStatusBase - static_cast<std::int32_t>(s.code());
    }
    static std::string status_text(const Status &s) { return s.ToString(); }
};

using Core = TeCore<MooncakeApi>;

}  // namespace

struct Adapter::Impl {
    Impl(::mooncake::TransferEngine &te, Options o) : core(te, std::move(o)) {}
    Core core;
};

Adapter::Adapter(::mooncake::TransferEngine &te, Options options)
    : impl_(std::make_unique<Impl>(te, std::move(options))) {}
Adapter::~Adapter() = default;

mws_transfer_engine_vtable Adapter::vtable() const { return impl_->core.vtable(); }
void *Adapter::ctx() noexcept { return impl_->core.ctx(); }
mws::TransferEngine Adapter::engine() { return impl_->core.engine(); }
Counters Adapter::counters() const { return impl_->core.counters(); }
std::size_t Adapter::registered_regions() const { return impl_->core.registered_regions(); }
std::size_t Adapter::batches_in_flight() { return impl_->core.batches_in_flight(); }
std::size_t Adapter::open_tickets() const { return impl_->core.open_tickets(); }
std::string Adapter::last_error() const { return impl_->core.last_error(); }
::mooncake::TransferEngine &Adapter::native() noexcept { return impl_->core.native(); }

std::string Adapter::segment_name() const {
    try {
        return impl_->core.native().getLocalIpAndPort();
    } catch (...) {
        return std::string();
    }
}

std::int32_t Adapter::self_check() {
    try {
        const std::size_t n = 64u << 10;
        std::vector<unsigned char> a(n), b(n, 0);
        for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned char>(i * 131 + 7);
        void *ctx = impl_->core.ctx();
        auto addr = [](const void *p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); };
        std::int32_t rc = Core::register_memory(ctx, addr(a.data()), n, -1);
        if (rc != 0) return rc;
        rc = Core::register_memory(ctx, addr(b.data()), n, -1);
        if (rc != 0) {
            Core::unregister_memory(ctx, addr(a.data()));
            return rc;
        }
        const std::string seg = segment_name();
        std::uint64_t local = addr(a.data()), remote = addr(b.data()), size = n;
        rc = Core::sync_write(ctx, mws_bytes{seg.data(), seg.size()}, &local, &remote, &size, 1);
        std::int32_t u1 = Core::unregister_memory(ctx, addr(b.data()));
        std::int32_t u2 = Core::unregister_memory(ctx, addr(a.data()));
        if (rc != 0) return rc;
        if (u1 != 0) return u1;
        if (u2 != 0) return u2;
        return std::memcmp(a.data(), b.data(), n) == 0 ? kOk : kFailed;
    } catch (...) {
        return kErrException;
    }
}

std::string Adapter::describe(std::int32_t code) {
    switch (code) {
        case kOk: return "ok";
        case kFailed: return "a batch failed (ERR_INVALID_ARGUMENT -1 from Mooncake int calls)";
        case kUnknown: return "still running (ERR_TOO_MANY_REQUESTS -2 from Mooncake int calls)";
        case -3: return "ERR_ADDRESS_NOT_REGISTERED";
        case -4: return "ERR_BATCH_BUSY";
        case -6: return "ERR_DEVICE_NOT_FOUND";
        case -7: return "ERR_ADDRESS_OVERLAPPED (the range overlaps a registered region)";
        case -101: return "ERR_DNS";
        case -102: return "ERR_SOCKET (peer unreachable)";
        case -103: return "ERR_MALFORMED_JSON";
        case -104: return "ERR_REJECT_HANDSHAKE";
        case -200: return "ERR_METADATA (unknown segment or peer refused)";
        case -201: return "ERR_ENDPOINT";
        case -202: return "ERR_CONTEXT";
        case -300: return "ERR_NUMA";
        case -301: return "ERR_CLOCK";
        case -302: return "ERR_MEMORY";
        case -303: return "ERR_NOT_IMPLEMENTED";
        case kErrNotOurs: return "adapter: the region was not registered through this adapter (not unregistered)";
        case kErrUnknownTicket: return "adapter: unknown or released ticket";
        case kErrBadArgument: return "adapter: invalid argument";
        case kErrSegment: return "adapter: openSegment failed (unknown or unreachable peer)";
        case kErrAllocate: return "adapter: allocateBatchID failed";
        case kErrException: return "adapter: the engine threw an exception";
        case kErrTimeout: return "adapter: batch did not finish within batch_timeout (completion unknown)";
        default: break;
    }
    if (code <= kErrStatusBase && code > kErrStatusBase - 1000) {
        const int c = kErrStatusBase - code;
        const char *name = "Status";
        switch (c) {
            case 1: name = "InvalidArgument"; break;
            case 2: name = "TooManyRequests"; break;
            case 3: name = "AddressNotRegistered"; break;
            case 4: name = "BatchBusy"; break;
            case 6: name = "DeviceNotFound"; break;
            case 7: name = "AddressOverlapped"; break;
            case 8: name = "NotSupportedTransport"; break;
            case 101: name = "Dns"; break;
            case 102: name = "Socket"; break;
            case 103: name = "MalformedJson"; break;
            case 104: name = "RejectHandshake"; break;
            case 200: name = "Metadata"; break;
            case 201: name = "Endpoint"; break;
            case 202: name = "Context"; break;
            case 300: name = "Numa"; break;
            case 301: name = "Clock"; break;
            case 302: name = "Memory"; break;
            case 999: name = "NotImplemented"; break;
            default: break;
        }
        return std::string("Mooncake Status ") + name + " (code " + std::to_string(c) + ")";
    }
    return "engine code " + std::to_string(code);
}

std::vector<Notification> poll_notifies(::mooncake::TransferEngine &te,
                                        const std::function<void(std::string_view)> &on_weight_store_message) {
    std::vector<::mooncake::TransferMetadata::NotifyDesc> got;
    te.getNotifies(got);
    std::vector<Notification> others;
    const std::string_view ours = mws::notify_name();
    std::exception_ptr first;
    for (auto &n : got) {
        if (n.name == ours) {
            try {
                on_weight_store_message(n.notify_msg);
            } catch (...) {
                if (!first) first = std::current_exception();
            }
        } else {
            others.push_back(Notification{std::move(n.name), std::move(n.notify_msg)});
        }
    }
    if (first) std::rethrow_exception(first);
    return others;
}

}  // namespace mooncake_te
}  // namespace mws
