// mooncake_store.hpp: the Mooncake Store adapter (CMake target
// mooncake_weight_store::mooncake_store, library mws_mooncake_store). A C++ engine that
// already owns a `std::shared_ptr<mooncake::RealClient>` (made with
// `mooncake::RealClient::create()` + `setup_real(...)`) turns it into the library's store:
//
//     std::shared_ptr<mooncake::RealClient> client = ...;     // the engine's own, set up
//     mws::mooncake_store::Adapter adapter(client);           // shares it, owns nothing of it
//     mws::Store store = adapter.store();                     // mws_store over the vtable
//     ... Writer / load_manifest / LoadPlan / store.load as with any store ...
//
// Ownership: the adapter keeps a copy of the shared_ptr (the client stays valid while a
// Store made from it lives) but never constructs, sets up or tears down the client. Free
// every mws::Store made from it before calling `tearDownAll()` on the client (the store
// unregisters its staging buffer when it is freed).
// Mapping (docs/STORE-VTABLE.md, the same as python/.../mooncake_backend.py):
//   put/upsert         put_from/upsert_from (ReplicateConfig{group_ids = {group}, with_hard_pin,
//                      data_type = WEIGHT | METADATA})
//   batch_put_from     batch_put_from(keys, ptrs, sizes, cfg with one group id per key)
//   get_size/get_into  getSize / get_into
//   batch_get_size     batch_get_replica_desc (COMPLETE memory replicas agreeing), else getSize
//   exists/batch_exists isExist / batchIsExist
//   remove             remove(key, force = true)
//   get_into_ranges    get_into_ranges in its buffer-major 3-D form
//   register/unregister register_buffer / unregister_buffer (host memory only)
//   get_cost           Options::cost
// Error codes: Mooncake's ErrorCode values pass through (0, -704, -600, ...). Transport
// failures (-800 TRANSFER_FAIL, -900 RPC_FAIL, -901 RPC_TIMEOUT) are reported as -200
// (NO_AVAILABLE_HANDLE) when Options::transport_errors_transient is on, because the
// library's RemoteStore retries only -200 and -706 (src/store/remote.rs `transient`);
// each such report is counted (Stats::transport_errors, last_transport_error). The
// adapter never retries anything itself. Callbacks never throw (an exception is -1).
// This header does not include Mooncake's headers (C++17); the library is compiled
// against them (C++20) in one translation unit.
#ifndef MOONCAKE_WEIGHT_STORE_MOONCAKE_STORE_HPP
#define MOONCAKE_WEIGHT_STORE_MOONCAKE_STORE_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"

namespace mooncake {
class RealClient;
}

namespace mws {
namespace mooncake_store {

struct Options {
    /// Report -800/-900/-901 as -200 so that the library retries them (see above).
    bool transport_errors_transient = true;
    /// What get_cost answers (the Python backend's MOONCAKE_COST).
    mws_store_cost cost{40000, 21000, 3000000000ull};
};

/// The client calls the adapter makes, one per vtable callback that reaches the client
/// (Stats::calls / Stats::nanos are indexed by them).
enum class Call : int {
    put,
    upsert,
    get_size,
    batch_get_size,
    get_into,
    exists,
    batch_exists,
    remove,
    batch_put_from,
    get_into_ranges,
    register_buffer,
    unregister_buffer,
    batch_query,                   ///< inside get_into_ranges (its time is also get_into_ranges')
    batch_get_into_multi_buffers,  ///< inside get_into_ranges (its time is also get_into_ranges')
};
constexpr int kCallKinds = 14;
/// The callback's name ("get_into_ranges", ...).
const char *call_name(Call kind);

/// Counters since the adapter was made (every store made from it adds to them). Read
/// with Adapter::stats(); each counter is read atomically, the set is not a snapshot.
struct Stats {
    /// Callbacks per kind and their wall-clock time inside the callback (client call,
    /// argument conversion, result mapping), in nanoseconds, summed over threads.
    std::uint64_t calls[kCallKinds] = {}, nanos[kCallKinds] = {};
    std::uint64_t batch_put_calls = 0, batch_put_items = 0;
    std::uint64_t range_calls = 0, ranges = 0;
    std::uint64_t get_into_calls = 0;
    std::uint64_t transport_errors = 0;  ///< codes reported as -200 (Options::transport_errors_transient)
    std::int64_t last_transport_error = 0;
};

/// The adapter over a caller-owned, set-up mooncake::RealClient.
class Adapter {
public:
    explicit Adapter(std::shared_ptr<::mooncake::RealClient> client, Options options = {});
    ~Adapter();
    Adapter(const Adapter &) = delete;
    Adapter &operator=(const Adapter &) = delete;

    /// The vtable (for mws_store_from_vtable from C). Its ctx must come from new_ctx();
    /// the vtable's destroy frees it (the store owns it once opened).
    static mws_store_vtable vtable();
    void *new_ctx() const;
    /// A library store over this adapter (it keeps the adapter's state alive).
    mws::Store store(const mws::StoreOptions &options = {}) const;

    Stats stats() const;
    ::mooncake::RealClient &client() const;

    /// Start-up guard against a header/wheel mismatch: registers a 64 KiB buffer, puts
    /// a pattern under `key`, reads it back into the same registered memory and compares,
    /// then force-removes the key. 0 = equal; otherwise a negative Mooncake code or -1.
    int self_test(const std::string &key = "mws/mooncake_store/self_test") const;

    // ---- raw client calls, for programs that do not include Mooncake's headers
    // (tests, benchmarks); codes exactly as the client returns them, no mapping.
    int raw_register(void *ptr, std::size_t len) const;
    int raw_unregister(void *ptr) const;
    int raw_upsert_from(const std::string &key, void *ptr, std::size_t len, const std::string &group = "",
                        bool payload = true) const;
    std::vector<int> raw_batch_put_from(const std::vector<std::string> &keys, const std::vector<void *> &ptrs,
                                        const std::vector<std::size_t> &lens, const std::string &group = "") const;
    std::vector<std::int64_t> raw_batch_get_into(const std::vector<std::string> &keys, const std::vector<void *> &ptrs,
                                                 const std::vector<std::size_t> &caps) const;
    std::int64_t raw_get_size(const std::string &key) const;
    long raw_remove_by_regex(const std::string &regex) const;  ///< force; count or negative

    struct Impl;

private:
    std::shared_ptr<Impl> impl_;
};

/// Convenience for programs that do not already own a client (tests, benchmarks,
/// examples): `RealClient::create()` + `setup_real(local_hostname, "P2PHANDSHAKE",
/// segment_bytes, local_buffer_bytes, "tcp", "", master, nullptr)`. nullptr on failure
/// (the code in *rc). The adapter itself never calls this.
std::shared_ptr<::mooncake::RealClient> connect_tcp(const std::string &master, std::uint64_t segment_bytes,
                                                    std::uint64_t local_buffer_bytes,
                                                    const std::string &local_hostname = "127.0.0.1",
                                                    int *rc = nullptr);
/// `client.tearDownAll()` (the caller's shutdown; free every Store first).
int tear_down(::mooncake::RealClient &client);
/// Mooncake's name of an ErrorCode value (toString), e.g. "OBJECT_NOT_FOUND".
std::string error_name(std::int64_t code);

}  // namespace mooncake_store
}  // namespace mws

#endif  // MOONCAKE_WEIGHT_STORE_MOONCAKE_STORE_HPP
