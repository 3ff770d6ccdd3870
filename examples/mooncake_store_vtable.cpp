// mooncake_store_vtable.cpp: how a C++ engine plugs Mooncake Store's client into the
// library through mws_store_from_vtable, with the mapping of docs/STORE-VTABLE.md
// (the same as python/mooncake_weight_store/mooncake_backend.py):
//
//   put / upsert       put / upsert(key, bytes, cfg)   (put is insert-if-absent: 0, value kept)
//   get_size/get_into  get_size(key) / get_into(key, ptr, cap)
//   exists             is_exist(key)
//   batch_exists       batch_is_exist(keys)            (optional vtable field; -> 1 / 0 / negative)
//   remove             remove(key, force = true)       (-704 counts as success)
//   batch_put_from     batch_put_from(keys, ptrs, sizes, cfg with one group per key)
//   get_into_ranges    get_into_ranges in Mooncake's buffer-major 3-D form: items grouped
//                      by buffer_address (first appearance), then by key; dst offsets
//                      are dest_address - buffer_address
//   register_buffer    register_buffer(ptr, size) / unregister_buffer(ptr)
//   every write: ReplicateConfig{group_ids, with_hard_pin = true,
//                data_type = WEIGHT (payload) | METADATA (manifests, decisions)}
//
// MooncakeVtable<Client> is the whole binding; Client is anything with the method
// shapes of Mooncake's `MooncakeDistributedStore` (the Python class documented in
// docs/mooncake/README.md, whose pybind layer forwards to the C++ client).
//
// The client here is FakeMooncakeClient, an in-process object map with Mooncake's
// observable semantics (insert-if-absent put, -704, -600 for ranged reads into
// unregistered buffers, immutable groups), so that the mapping itself is built and
// tested everywhere (ctest int.example_mooncake_store_vtable). The same mapping over
// the REAL mooncake::RealClient is the adapter mooncake_weight_store::mooncake_store
// (adapters/mooncake_store, built and run on a real master by .ci/mooncake.sh;
// docs/mooncake/CPP-STORE.md).
//
// The program snapshots a small MoE model (TP2 x EP2) through the vtable store and
// restores it into TP4, checking every byte.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/range_batches.hpp"
#include "support/mws_model.hpp"

namespace mcvt {

// Mooncake ErrorCode values used by the contract.
constexpr int32_t OK = 0;
constexpr int32_t INTERNAL_ERROR = -1;
constexpr int32_t INVALID_PARAMS = -600;
constexpr int32_t OBJECT_NOT_FOUND = -704;

inline std::string str(mws_bytes b) { return std::string(b.ptr, b.len); }

/// The vtable over a Client. The store owns a heap-allocated Ctx (destroyed by
/// `destroy`); the Client itself is borrowed and must outlive the store.
template <class Client>
class MooncakeVtable {
public:
    struct Ctx {
        Client *client;
    };

    static mws_store_vtable vtable() {
        mws_store_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_STORE_VTABLE_VERSION;
        vt.put = &put;
        vt.upsert = &upsert;
        vt.get_size = &get_size;
        vt.get_into = &get_into;
        vt.exists = &exists;
        vt.remove = &remove;
        vt.batch_put_from = &batch_put_from;
        vt.get_into_ranges = &get_into_ranges;
        vt.register_buffer = &register_buffer;
        vt.unregister_buffer = &unregister_buffer;
        vt.destroy = &destroy;
        vt.batch_exists = &batch_exists;
        return vt;
    }

    /// A store over `client` (which must outlive it).
    static mws::Store open(Client &client, const mws::StoreOptions &options = {}) {
        auto *ctx = new Ctx{&client};
        mws_store_vtable vt = vtable();
        try {
            return mws::Store::from_vtable(vt, ctx, options);  // owns ctx on success
        } catch (...) {
            delete ctx;
            throw;
        }
    }

private:
    static Client &c(void *ctx) { return *static_cast<Ctx *>(ctx)->client; }

    // Callbacks must never unwind into the library: every one catches everything.
    template <class F>
    static auto guarded(F &&f, decltype(f()) on_error) noexcept -> decltype(f()) {
        try {
            return f();
        } catch (...) {
            return on_error;
        }
    }

    static int32_t put(void *ctx, mws_bytes key, const uint8_t *value, uint64_t len, mws_bytes group,
                       uint32_t record_type) noexcept {
        return guarded([&] {
            return static_cast<int32_t>(c(ctx).put(str(key), value, len, c(ctx).config({str(group)}, record_type)));
        }, INTERNAL_ERROR);
    }
    static int32_t upsert(void *ctx, mws_bytes key, const uint8_t *value, uint64_t len, mws_bytes group,
                          uint32_t record_type) noexcept {
        return guarded([&] {
            return static_cast<int32_t>(c(ctx).upsert(str(key), value, len, c(ctx).config({str(group)}, record_type)));
        }, INTERNAL_ERROR);
    }
    static int64_t get_size(void *ctx, mws_bytes key) noexcept {
        return guarded([&] { return static_cast<int64_t>(c(ctx).get_size(str(key))); }, int64_t{INTERNAL_ERROR});
    }
    static int64_t get_into(void *ctx, mws_bytes key, uint8_t *buf, uint64_t cap) noexcept {
        return guarded([&] { return static_cast<int64_t>(c(ctx).get_into(str(key), buf, cap)); },
                       int64_t{INTERNAL_ERROR});
    }
    static int32_t exists(void *ctx, mws_bytes key) noexcept {
        return guarded([&] { return static_cast<int32_t>(c(ctx).is_exist(str(key))); }, INTERNAL_ERROR);
    }
    static int32_t batch_exists(void *ctx, const mws_bytes *keys, size_t n, int32_t *results) noexcept {
        return guarded(
            [&] {
                std::vector<std::string> ks;
                ks.reserve(n);
                for (size_t i = 0; i < n; ++i) ks.push_back(str(keys[i]));
                std::vector<int> rcs = c(ctx).batch_is_exist(ks);
                if (rcs.size() != n) return static_cast<int32_t>(INTERNAL_ERROR);
                for (size_t i = 0; i < n; ++i) results[i] = static_cast<int32_t>(rcs[i]);
                return int32_t{0};
            },
            INTERNAL_ERROR);
    }
    static int32_t remove(void *ctx, mws_bytes key) noexcept {
        return guarded([&] { return static_cast<int32_t>(c(ctx).remove(str(key), /*force=*/true)); }, INTERNAL_ERROR);
    }

    static int32_t batch_put_from(void *ctx, const mws_put_item *items, size_t n, uint32_t record_type,
                                  int32_t *results) noexcept {
        return guarded([&] {
            std::vector<std::string> keys, groups;
            std::vector<void *> ptrs;
            std::vector<size_t> sizes, index;
            for (size_t i = 0; i < n; ++i) {
                if (items[i].memory_kind != MWS_MEMORY_HOST) {  // host-only client (as the non-CUDA wheel)
                    results[i] = INVALID_PARAMS;
                    continue;
                }
                keys.push_back(str(items[i].key));
                groups.push_back(str(items[i].group_id));
                ptrs.push_back(reinterpret_cast<void *>(static_cast<uintptr_t>(items[i].address)));
                sizes.push_back(static_cast<size_t>(items[i].len));
                index.push_back(i);
            }
            if (keys.empty()) return OK;
            std::vector<int> rcs = c(ctx).batch_put_from(keys, ptrs, sizes, c(ctx).config(groups, record_type));
            for (size_t j = 0; j < index.size(); ++j) {
                results[index[j]] = j < rcs.size() ? static_cast<int32_t>(rcs[j]) : INTERNAL_ERROR;
            }
            return OK;
        }, INTERNAL_ERROR);
    }

    static int32_t get_into_ranges(void *ctx, const mws_range_item *items, size_t n, int64_t *results) noexcept {
        return guarded([&] {
            mws::mooncake_store::RangeBatches rb =
                mws::mooncake_store::RangeBatches::of(items, n, results, INVALID_PARAMS);
            if (rb.ptrs.empty()) return OK;
            auto out = c(ctx).get_into_ranges(rb.ptrs, rb.keys, rb.dsts, rb.srcs, rb.sizes);
            rb.scatter(out, results, [](int64_t v) { return v; }, int64_t{INTERNAL_ERROR});
            return OK;
        }, INTERNAL_ERROR);
    }

    static int32_t register_buffer(void *ctx, uint64_t address, uint64_t len, uint32_t memory_kind,
                                   uint32_t) noexcept {
        if (memory_kind != MWS_MEMORY_HOST) return INVALID_PARAMS;
        return guarded([&] {
            return static_cast<int32_t>(
                c(ctx).register_buffer(reinterpret_cast<void *>(static_cast<uintptr_t>(address)), len));
        }, INTERNAL_ERROR);
    }
    static int32_t unregister_buffer(void *ctx, uint64_t address) noexcept {
        return guarded([&] {
            return static_cast<int32_t>(
                c(ctx).unregister_buffer(reinterpret_cast<void *>(static_cast<uintptr_t>(address))));
        }, INTERNAL_ERROR);
    }
    static void destroy(void *ctx) noexcept { delete static_cast<Ctx *>(ctx); }
};

// ---- a stand-in with Mooncake's observable semantics ----------------------------
class FakeMooncakeClient {
public:
    struct Config {  // the fields of mooncake::ReplicateConfig that the mapping sets
        std::vector<std::string> group_ids;
        bool with_hard_pin = false;
        uint32_t data_type = 0;
    };
    Config config(std::vector<std::string> groups, uint32_t record_type) const {
        return Config{std::move(groups), true, record_type};
    }

    int put(const std::string &key, const void *value, size_t len, const Config &cfg) {
        std::lock_guard<std::mutex> g(mu_);
        if (cfg.group_ids.size() != 1 || !cfg.with_hard_pin) return INVALID_PARAMS;
        objects_.emplace(key, Object{bytes(value, len), cfg.group_ids[0]});  // insert-if-absent
        return OK;
    }
    int upsert(const std::string &key, const void *value, size_t len, const Config &cfg) {
        std::lock_guard<std::mutex> g(mu_);
        if (cfg.group_ids.size() != 1) return INVALID_PARAMS;
        auto it = objects_.find(key);
        if (it != objects_.end() && it->second.group != cfg.group_ids[0]) return INVALID_PARAMS;  // groups are immutable
        objects_[key] = Object{bytes(value, len), cfg.group_ids[0]};
        return OK;
    }
    int64_t get_size(const std::string &key) {
        std::lock_guard<std::mutex> g(mu_);
        auto it = objects_.find(key);
        return it == objects_.end() ? OBJECT_NOT_FOUND : static_cast<int64_t>(it->second.data.size());
    }
    int64_t get_into(const std::string &key, void *buf, size_t cap) {
        std::lock_guard<std::mutex> g(mu_);
        auto it = objects_.find(key);
        if (it == objects_.end()) return OBJECT_NOT_FOUND;
        if (cap < it->second.data.size()) return INVALID_PARAMS;
        std::memcpy(buf, it->second.data.data(), it->second.data.size());
        return static_cast<int64_t>(it->second.data.size());
    }
    int is_exist(const std::string &key) {
        std::lock_guard<std::mutex> g(mu_);
        return objects_.count(key) ? 1 : 0;
    }
    std::vector<int> batch_is_exist(const std::vector<std::string> &keys) {
        std::lock_guard<std::mutex> g(mu_);
        std::vector<int> out;
        out.reserve(keys.size());
        for (const auto &k : keys) out.push_back(objects_.count(k) ? 1 : 0);
        return out;
    }
    int remove(const std::string &key, bool force) {
        std::lock_guard<std::mutex> g(mu_);
        if (!force) return INVALID_PARAMS;  // the mapping always forces
        return objects_.erase(key) ? OK : OBJECT_NOT_FOUND;
    }
    std::vector<int> batch_put_from(const std::vector<std::string> &keys, const std::vector<void *> &ptrs,
                                    const std::vector<size_t> &sizes, const Config &cfg) {
        std::lock_guard<std::mutex> g(mu_);
        if (cfg.group_ids.size() != keys.size()) return std::vector<int>(keys.size(), INVALID_PARAMS);
        std::vector<int> rcs;
        for (size_t i = 0; i < keys.size(); ++i) {
            objects_.emplace(keys[i], Object{bytes(ptrs[i], sizes[i]), cfg.group_ids[i]});
            rcs.push_back(OK);
        }
        ++batch_puts;
        return rcs;
    }
    std::vector<std::vector<std::vector<int64_t>>> get_into_ranges(
        const std::vector<void *> &buffers, const std::vector<std::vector<std::string>> &keys,
        const std::vector<std::vector<std::vector<size_t>>> &dsts, const std::vector<std::vector<std::vector<size_t>>> &srcs,
        const std::vector<std::vector<std::vector<size_t>>> &sizes) {
        std::lock_guard<std::mutex> g(mu_);
        std::vector<std::vector<std::vector<int64_t>>> out(buffers.size());
        for (size_t b = 0; b < buffers.size(); ++b) {
            auto reg = registered_.find(buffers[b]);
            out[b].resize(keys[b].size());
            for (size_t k = 0; k < keys[b].size(); ++k) {
                auto obj = objects_.find(keys[b][k]);
                for (size_t r = 0; r < sizes[b][k].size(); ++r) {
                    size_t dst = dsts[b][k][r], src = srcs[b][k][r], len = sizes[b][k][r];
                    int64_t rc;
                    if (reg == registered_.end() || dst + len > reg->second) rc = INVALID_PARAMS;  // must be registered
                    else if (obj == objects_.end()) rc = OBJECT_NOT_FOUND;
                    else if (src + len > obj->second.data.size()) rc = INVALID_PARAMS;
                    else {
                        std::memcpy(static_cast<char *>(buffers[b]) + dst, obj->second.data.data() + src, len);
                        rc = static_cast<int64_t>(len);
                    }
                    out[b][k].push_back(rc);
                }
            }
        }
        ++ranged_requests;
        return out;
    }
    int register_buffer(void *ptr, size_t len) {
        std::lock_guard<std::mutex> g(mu_);
        return registered_.emplace(ptr, len).second ? OK : INVALID_PARAMS;
    }
    int unregister_buffer(void *ptr) {
        std::lock_guard<std::mutex> g(mu_);
        return registered_.erase(ptr) ? OK : INVALID_PARAMS;
    }

    std::size_t object_count() {
        std::lock_guard<std::mutex> g(mu_);
        return objects_.size();
    }
    std::size_t batch_puts = 0, ranged_requests = 0;

private:
    struct Object {
        std::string data, group;
    };
    static std::string bytes(const void *p, size_t n) { return std::string(static_cast<const char *>(p), n); }
    std::mutex mu_;
    std::map<std::string, Object> objects_;
    std::map<void *, size_t> registered_;
};

}  // namespace mcvt


namespace {

using namespace mwsmodel;

template <class Client>
int round_trip(Client &client, const char *what) {
    const std::vector<TensorDef> defs = model_tensors(2, 64, 4);
    mws::Store store = mcvt::MooncakeVtable<Client>::open(client);
    HostModel src(placement_json("trainer", Layout{2, 1, 2, 1}, defs, 1), defs, true, "trainer");
    mws::StoredManifest m = snapshot(store, src);
    HostModel dst(placement_json("serving", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    std::size_t regions = 0;
    mws_load_stats st = restore(store, store.load_manifest(std::string(m.key())), dst, &regions);
    std::size_t verified = dst.verify();
    std::printf("%s: %zu tensors, %zu stored fragments snapshotted; restored %zu regions, %llu bytes "
                "(%llu ranged reads in %llu requests); %zu bytes verified: OK\n",
                what, m.tensor_count(), m.fragment_count(), regions, static_cast<unsigned long long>(st.bytes),
                static_cast<unsigned long long>(st.ranges), static_cast<unsigned long long>(st.requests), verified);
    return 0;
}

}  // namespace

int main() {
    try {
        mcvt::FakeMooncakeClient client;
        int rc = round_trip(client, "in-process Mooncake stand-in");
        std::printf("stand-in: %zu objects, %zu batch_put_from calls, %zu get_into_ranges calls\n",
                    client.object_count(), client.batch_puts, client.ranged_requests);
        return rc;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
