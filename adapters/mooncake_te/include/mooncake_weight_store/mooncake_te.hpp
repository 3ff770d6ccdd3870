// mooncake_te.hpp: the Mooncake Transfer Engine adapter (CMake target
// mooncake_weight_store::mooncake_te, library mws_mooncake_te). A C++ serving engine
// that already owns a `mooncake::TransferEngine` (and registered its weight buffers
// with it at start-up) turns it into the library's engine:
//
//     mooncake::TransferEngine &te = ...;                 // the serving engine's own
//     mws::mooncake_te::Adapter adapter(te);              // borrows te, owns nothing of it
//     mws::TransferEngine engine = adapter.engine();      // mws_transfer_engine over the vtable
//     mws::Loader loader(engine);  mws::Sink sink(engine);
//
// Ownership: the adapter borrows `te` (it must outlive the adapter) and never
// unregisters memory it did not register itself (the library registers a call's
// buffers through it only when the caller did not pre-register them); keep the
// adapter alive as long as every mws::TransferEngine, Loader and Sink made from it.
// Thread safety: every member and every vtable callback may run on several threads.
// Errors: vtable callbacks never throw; Mooncake's int codes pass through, Status
// failures and adapter errors use the codes of mooncake_te_core.hpp (describe()).
// What the mapping does, call by call: mooncake_te_core.hpp. This header does not
// include Mooncake's headers (C++17); the library is compiled against them (C++20).
#ifndef MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_HPP
#define MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_te_core.hpp"

namespace mooncake {
class TransferEngine;
}

namespace mws {
namespace mooncake_te {

/// The adapter over a caller-owned mooncake::TransferEngine.
class Adapter {
public:
    /// Borrows `te` (initialised, a transport installed). Never throws for a valid
    /// engine; `options.queue_limit` 0 is taken as 1.
    explicit Adapter(::mooncake::TransferEngine &te, Options options = {});
    ~Adapter();
    Adapter(const Adapter &) = delete;
    Adapter &operator=(const Adapter &) = delete;

    /// The vtable and its ctx (for mws_transfer_engine_from_vtable from C).
    mws_transfer_engine_vtable vtable() const;
    void *ctx() noexcept;
    /// A library engine over this adapter. Throws mws::Error (MWS_INVALID_ARGUMENT /
    /// MWS_UNSUPPORTED: a library older than this header).
    mws::TransferEngine engine();

    /// Start-up check that the headers match the engine library (a header/wheel
    /// mismatch corrupts TransferRequest): registers two 64 KiB buffers of its own,
    /// writes one into the other through this engine's own segment with one native
    /// batch, compares, unregisters. Returns 0 or the failing code (describe()).
    std::int32_t self_check();

    Counters counters() const;
    /// Regions registered through the adapter (by the library) and not yet unregistered.
    std::size_t registered_regions() const;
    /// Native batches not freed yet.
    std::size_t batches_in_flight();
    /// Tickets issued and not released.
    std::size_t open_tickets() const;
    /// The last Mooncake Status message seen (empty when none).
    std::string last_error() const;
    /// This engine's segment name (TransferEngine::getLocalIpAndPort()).
    std::string segment_name() const;
    /// The native engine.
    ::mooncake::TransferEngine &native() noexcept;

    /// The name of a code returned through the vtable (adapter, Mooncake int or Status code).
    static std::string describe(std::int32_t code);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// One notification received by the engine (TransferMetadata::NotifyDesc).
struct Notification {
    std::string name;
    std::string message;
};

/// The notify poll of a serving engine: drains `te.getNotifies()` once, hands every
/// message of this library (name == mws::notify_name()) to `on_weight_store_message`,
/// and returns the others (getNotifies drains everything: the caller processes its
/// own). The callback should not throw: if it does, the remaining messages are still
/// handed to it and the first exception is rethrown after the poll (the foreign
/// notifications of that poll are then lost). Thread safety: as te.getNotifies.
std::vector<Notification> poll_notifies(::mooncake::TransferEngine &te,
                                        const std::function<void(std::string_view message)> &on_weight_store_message);

}  // namespace mooncake_te
}  // namespace mws

#endif  // MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_HPP
