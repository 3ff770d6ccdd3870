// The Mooncake Store adapter: the only translation unit that includes Mooncake's
// headers (real_client.h costs about 19 s to compile on a 2-core machine). The mapping
// is described in include/mooncake_weight_store/mooncake_store.hpp and
// docs/STORE-VTABLE.md.
#include "mooncake_weight_store/mooncake_store.hpp"
#include "mooncake_weight_store/range_batches.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>

#include "real_client.h"
#include "replica.h"
#include "types.h"

namespace mws {
namespace mooncake_store {

namespace {

constexpr int32_t OK = 0;
constexpr int32_t INTERNAL_ERROR = -1;
constexpr int32_t NO_AVAILABLE_HANDLE = -200;
constexpr int32_t INVALID_PARAMS = -600;
constexpr int32_t OBJECT_NOT_FOUND = -704;
constexpr int64_t TRANSFER_FAIL = -800, RPC_FAIL = -900, RPC_TIMEOUT = -901;

std::string str(mws_bytes b) { return std::string(b.ptr == nullptr ? "" : b.ptr, b.len); }
void *ptr_of(uint64_t a) { return reinterpret_cast<void *>(static_cast<uintptr_t>(a)); }

}  // namespace

struct Adapter::Impl {
    std::shared_ptr<::mooncake::RealClient> client;
    Options options;
    std::atomic<uint64_t> batch_put_calls{0}, batch_put_items{0}, range_calls{0}, ranges{0}, get_into_calls{0},
        transport_errors{0};
    std::atomic<int64_t> last_transport_error{0};
    /// Object sizes this adapter was last told (batch_get_size, get_size): a ranged
    /// read whose ranges tile a remembered size is read whole without asking the
    /// master first. A stale size only costs the fallback (get_into_ranges reports
    /// the truth); bounded: cleared past kMaxRememberedSizes keys.
    std::mutex sizes_mu;
    std::unordered_map<std::string, uint64_t> sizes;
    static constexpr std::size_t kMaxRememberedSizes = 1 << 16;

    void remember_size(const std::string &key, int64_t size) {
        if (size < 0) return;
        std::lock_guard<std::mutex> g(sizes_mu);
        if (sizes.size() >= kMaxRememberedSizes) sizes.clear();
        sizes[key] = static_cast<uint64_t>(size);
    }
    std::optional<uint64_t> remembered_size(const std::string &key) {
        std::lock_guard<std::mutex> g(sizes_mu);
        auto it = sizes.find(key);
        return it == sizes.end() ? std::nullopt : std::optional<uint64_t>(it->second);
    }
    std::atomic<uint64_t> call_count[kCallKinds]{}, call_nanos[kCallKinds]{};

    /// Times one client call of `kind` (wall clock, added to Stats::calls / nanos).
    struct Timed {
        Impl &s;
        Call kind;
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        ~Timed() {
            auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
            s.call_count[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
            s.call_nanos[static_cast<int>(kind)].fetch_add(static_cast<uint64_t>(ns.count()),
                                                           std::memory_order_relaxed);
        }
    };
    Timed timed(Call kind) { return Timed{*this, kind}; }

    ::mooncake::RealClient &c() { return *client; }

    /// A client code as the vtable reports it (see the header: transport errors -> -200).
    template <class T>
    T code(T rc) {
        if (options.transport_errors_transient && (rc == TRANSFER_FAIL || rc == RPC_FAIL || rc == RPC_TIMEOUT)) {
            transport_errors.fetch_add(1, std::memory_order_relaxed);
            last_transport_error.store(static_cast<int64_t>(rc), std::memory_order_relaxed);
            return static_cast<T>(NO_AVAILABLE_HANDLE);
        }
        return rc;
    }

    ::mooncake::ReplicateConfig config(std::vector<std::string> groups, uint32_t record_type) const {
        ::mooncake::ReplicateConfig cfg;
        cfg.group_ids = std::move(groups);
        cfg.with_hard_pin = true;
        cfg.data_type = record_type == MWS_RECORD_PAYLOAD ? ::mooncake::ObjectDataType::WEIGHT
                                                          : ::mooncake::ObjectDataType::METADATA;
        return cfg;
    }
};

namespace {

using Impl = Adapter::Impl;
/// The vtable ctx: a heap-allocated shared_ptr (freed by `destroy`), so that a Store
/// keeps the adapter's state and the client alive however long it lives.
Impl &I(void *ctx) { return **static_cast<std::shared_ptr<Impl> *>(ctx); }

// Callbacks must never unwind into the library: every one catches everything.
template <class R, class F>
R guarded(F &&f, R on_error) noexcept {
    try {
        return f();
    } catch (...) {
        return on_error;
    }
}

/// `guarded`, the call timed as `kind` (Stats::calls / Stats::nanos).
template <class R, class F>
R timed(void *ctx, Call kind, F &&f, R on_error) noexcept {
    Impl::Timed t = I(ctx).timed(kind);
    return guarded<R>(std::forward<F>(f), on_error);
}

int32_t cb_put(void *ctx, mws_bytes key, const uint8_t *value, uint64_t len, mws_bytes group,
               uint32_t record_type) noexcept {
    return timed<int32_t>(ctx, Call::put, [&] {
        Impl &s = I(ctx);
        // put_from: the library's metadata buffers are not registered; with the TCP
        // transport put_from copies from unregistered memory (docs/mooncake/README.md).
        // `put` (a span) goes through the client's staging buffer instead, which bounds
        // the object by local_buffer_size; put_from does not.
        return s.code(static_cast<int32_t>(s.c().put_from(str(key), const_cast<uint8_t *>(value),
                                                          static_cast<size_t>(len), s.config({str(group)}, record_type))));
    }, INTERNAL_ERROR);
}

int32_t cb_upsert(void *ctx, mws_bytes key, const uint8_t *value, uint64_t len, mws_bytes group,
                  uint32_t record_type) noexcept {
    return timed<int32_t>(ctx, Call::upsert, [&] {
        Impl &s = I(ctx);
        return s.code(static_cast<int32_t>(s.c().upsert_from(
            str(key), const_cast<uint8_t *>(value), static_cast<size_t>(len), s.config({str(group)}, record_type))));
    }, INTERNAL_ERROR);
}

int64_t cb_get_size(void *ctx, mws_bytes key) noexcept {
    return timed<int64_t>(ctx, Call::get_size, [&] {
        Impl &s = I(ctx);
        std::string k = str(key);
        int64_t size = s.code(static_cast<int64_t>(s.c().getSize(k)));
        s.remember_size(k, size);
        return size;
    }, INTERNAL_ERROR);
}

int64_t cb_get_into(void *ctx, mws_bytes key, uint8_t *buf, uint64_t cap) noexcept {
    return timed<int64_t>(ctx, Call::get_into, [&] {
        Impl &s = I(ctx);
        s.get_into_calls.fetch_add(1, std::memory_order_relaxed);
        return s.code(static_cast<int64_t>(s.c().get_into(str(key), buf, static_cast<size_t>(cap))));
    }, INTERNAL_ERROR);
}

int32_t cb_exists(void *ctx, mws_bytes key) noexcept {
    return timed<int32_t>(ctx, Call::exists,
                          [&] { return I(ctx).code(static_cast<int32_t>(I(ctx).c().isExist(str(key)))); },
                          INTERNAL_ERROR);
}

int32_t cb_batch_exists(void *ctx, const mws_bytes *keys, size_t n, int32_t *results) noexcept {
    return timed<int32_t>(ctx, Call::batch_exists, [&] {
        Impl &s = I(ctx);
        std::vector<std::string> ks;
        ks.reserve(n);
        for (size_t i = 0; i < n; ++i) ks.push_back(str(keys[i]));
        std::vector<int> rcs = s.c().batchIsExist(ks);
        if (rcs.size() != n) return INTERNAL_ERROR;
        for (size_t i = 0; i < n; ++i) results[i] = s.code(static_cast<int32_t>(rcs[i]));
        return OK;
    }, INTERNAL_ERROR);
}

int32_t cb_remove(void *ctx, mws_bytes key) noexcept {
    return timed<int32_t>(ctx, Call::remove,
                          [&] { return I(ctx).code(static_cast<int32_t>(I(ctx).c().remove(str(key), true))); },
                          INTERNAL_ERROR);
}

int32_t cb_batch_put_from(void *ctx, const mws_put_item *items, size_t n, uint32_t record_type,
                          int32_t *results) noexcept {
    return timed<int32_t>(ctx, Call::batch_put_from, [&] {
        Impl &s = I(ctx);
        std::vector<std::string> keys, groups;
        std::vector<void *> ptrs;
        std::vector<size_t> sizes, index;
        keys.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            if (items[i].memory_kind != MWS_MEMORY_HOST) {  // the non-CUDA wheel: host memory only
                results[i] = INVALID_PARAMS;
                continue;
            }
            keys.push_back(str(items[i].key));
            groups.push_back(str(items[i].group_id));
            ptrs.push_back(ptr_of(items[i].address));
            sizes.push_back(static_cast<size_t>(items[i].len));
            index.push_back(i);
        }
        if (keys.empty()) return OK;
        s.batch_put_calls.fetch_add(1, std::memory_order_relaxed);
        s.batch_put_items.fetch_add(keys.size(), std::memory_order_relaxed);
        std::vector<int> rcs = s.c().batch_put_from(keys, ptrs, sizes, s.config(std::move(groups), record_type));
        for (size_t j = 0; j < index.size(); ++j) {
            results[index[j]] = j < rcs.size() ? s.code(static_cast<int32_t>(rcs[j])) : INTERNAL_ERROR;
        }
        return OK;
    }, INTERNAL_ERROR);
}

/// The size of `key`'s object from a query answer: every COMPLETE replica a memory
/// replica and all of them agreeing; nullopt otherwise (a failed query, disk replicas,
/// disagreeing replicas).
std::optional<uint64_t> object_size(const std::vector<::mooncake::Replica::Descriptor> &replicas) {
    std::optional<uint64_t> size;
    for (const auto &r : replicas) {
        if (r.status != ::mooncake::ReplicaStatus::COMPLETE) continue;
        if (!r.is_memory_replica()) return std::nullopt;
        uint64_t sz = std::get<::mooncake::MemoryDescriptor>(r.descriptor_variant).buffer_descriptor.size_;
        if (size && *size != sz) return std::nullopt;
        size = sz;
    }
    return size;
}

/// One object whose ranges in a get_into_ranges call tile it exactly (offsets 0, a,
/// a + b, ... up to its size, no gap, no overlap): read whole with
/// batch_get_into_multi_buffers, each range's destination one of its buffers.
struct WholeObject {
    std::string key;
    std::vector<void *> buffers;
    std::vector<size_t> sizes;
    std::vector<size_t> items;  ///< the range items, in object order
};

int32_t cb_get_into_ranges(void *ctx, const mws_range_item *items, size_t n, int64_t *results) noexcept {
    return timed<int32_t>(ctx, Call::get_into_ranges, [&] {
        Impl &s = I(ctx);
        // Host ranges by key (device memory and malformed items fail here, as in
        // RangeBatches::of).
        std::map<std::string, std::vector<size_t>> by_key;
        for (size_t i = 0; i < n; ++i) {
            if (items[i].memory_kind != MWS_MEMORY_HOST || items[i].dest_address < items[i].buffer_address) {
                results[i] = INVALID_PARAMS;
                continue;
            }
            by_key[str(items[i].key)].push_back(i);
        }
        if (by_key.empty()) return OK;
        s.range_calls.fetch_add(1, std::memory_order_relaxed);
        s.ranges.fetch_add(n, std::memory_order_relaxed);
        // Which keys are read whole: those whose ranges tile the object exactly (offsets
        // 0, a, a + b, ... up to its size, no gap, no overlap). The size is the one
        // last told by batch_get_size (every restore asks for its objects' sizes before
        // reading) or, for a key never sized, the answer of one batch_query of all such
        // keys. That query also fills the cache get_into_ranges takes below: without
        // it get_into_ranges asks the master for each key's replica in its own Query
        // RPC, one after the other (real_client.cpp, resolve_ranged_read_metadata;
        // measured: most of a restore's time). The cache lives for this call only, as
        // PyClient::QueryResultCache requires; a key's failed query (e.g. -704) is
        // cached and fails that key's ranges as the per-key Query would.
        ::mooncake::PyClient::QueryResultCache cache;
        auto query = [&](const std::vector<std::string> &keys) {
            if (keys.empty()) return;
            Impl::Timed t = s.timed(Call::batch_query);
            auto queried = s.c().batch_query(keys);
            if (queried.size() != keys.size()) return;
            for (std::size_t i = 0; i < keys.size(); ++i) cache.emplace(keys[i], std::move(queried[i]));
        };
        std::vector<std::string> unsized;
        for (const auto &kv : by_key)
            if (!s.remembered_size(kv.first)) unsized.push_back(kv.first);
        query(unsized);
        auto tiles = [&](std::vector<size_t> &list, std::optional<uint64_t> size) {
            if (!size || *size == 0 || *size > static_cast<uint64_t>(INT32_MAX)) return false;
            std::sort(list.begin(), list.end(),
                      [&](size_t a, size_t b) { return items[a].object_offset < items[b].object_offset; });
            uint64_t at = 0;
            for (size_t i : list) {
                if (items[i].object_offset != at || items[i].len == 0) return false;
                at += items[i].len;
            }
            return at == *size;
        };
        // 2. Objects read whole: batch_get_into_multi_buffers, the path of
        // batch_get_into (one BatchGet; a local memcpy when the replica is in this
        // process's segment), where get_into_ranges submits every range to the
        // transfer engine. Its answer is an int: objects up to INT32_MAX bytes.
        std::vector<WholeObject> whole;
        std::vector<size_t> rest;
        for (auto &[key, list] : by_key) {
            std::optional<uint64_t> size = s.remembered_size(key);
            if (!size) {
                auto q = cache.find(key);
                if (q != cache.end() && q->second) size = object_size(q->second->replicas);
            }
            if (!tiles(list, size)) {
                rest.insert(rest.end(), list.begin(), list.end());
                continue;
            }
            WholeObject w{key, {}, {}, list};
            for (size_t i : list) {
                w.buffers.push_back(ptr_of(items[i].dest_address));
                w.sizes.push_back(static_cast<size_t>(items[i].len));
            }
            whole.push_back(std::move(w));
        }
        if (!whole.empty()) {
            std::vector<std::string> keys;
            std::vector<std::vector<void *>> buffers;
            std::vector<std::vector<size_t>> sizes;
            for (auto &w : whole) {
                keys.push_back(w.key);
                buffers.push_back(w.buffers);
                sizes.push_back(w.sizes);
            }
            std::vector<int> rcs;
            {
                Impl::Timed t = s.timed(Call::batch_get_into_multi_buffers);
                rcs = s.c().batch_get_into_multi_buffers(keys, buffers, sizes, false);
            }
            for (size_t k = 0; k < whole.size(); ++k) {
                int64_t total = 0;
                for (size_t z : whole[k].sizes) total += static_cast<int64_t>(z);
                if (k < rcs.size() && rcs[k] == total) {
                    for (size_t i : whole[k].items) results[i] = static_cast<int64_t>(items[i].len);
                } else {
                    // Anything else (the object changed since the query, an error):
                    // its ranges go through get_into_ranges below, which reports them.
                    rest.insert(rest.end(), whole[k].items.begin(), whole[k].items.end());
                }
            }
        }
        if (rest.empty()) return OK;
        // 3. The other ranges: get_into_ranges with the query cache (keys not yet asked
        // are asked now, in one batch_query).
        std::sort(rest.begin(), rest.end());
        std::set<std::string> unasked;
        for (size_t i : rest) {
            std::string k = str(items[i].key);
            if (cache.find(k) == cache.end()) unasked.insert(std::move(k));
        }
        query(std::vector<std::string>(unasked.begin(), unasked.end()));
        std::vector<mws_range_item> sub;
        sub.reserve(rest.size());
        for (size_t i : rest) sub.push_back(items[i]);
        std::vector<int64_t> sub_results(rest.size(), INTERNAL_ERROR);
        RangeBatches rb = RangeBatches::of(sub.data(), sub.size(), sub_results.data(), INVALID_PARAMS);
        auto out =
            s.c().get_into_ranges(rb.ptrs, rb.keys, rb.dsts, rb.srcs, rb.sizes, cache.empty() ? nullptr : &cache);
        rb.scatter(out, sub_results.data(), [&](int64_t v) { return s.code(v); }, int64_t{INTERNAL_ERROR});
        for (size_t j = 0; j < rest.size(); ++j) results[rest[j]] = sub_results[j];
        return OK;
    }, INTERNAL_ERROR);
}

int32_t cb_register(void *ctx, uint64_t address, uint64_t len, uint32_t memory_kind, uint32_t) noexcept {
    if (memory_kind != MWS_MEMORY_HOST) return INVALID_PARAMS;
    return timed<int32_t>(ctx, Call::register_buffer, [&] {
        return static_cast<int32_t>(I(ctx).c().register_buffer(ptr_of(address), static_cast<size_t>(len)));
    }, INTERNAL_ERROR);
}

int32_t cb_unregister(void *ctx, uint64_t address) noexcept {
    return timed<int32_t>(ctx, Call::unregister_buffer,
                          [&] { return static_cast<int32_t>(I(ctx).c().unregister_buffer(ptr_of(address))); },
                          INTERNAL_ERROR);
}

void cb_destroy(void *ctx) noexcept { delete static_cast<std::shared_ptr<Impl> *>(ctx); }

int32_t cb_get_cost(void *ctx, mws_store_cost *out) noexcept {
    *out = I(ctx).options.cost;
    return OK;
}

int32_t cb_batch_get_size(void *ctx, const mws_bytes *keys, size_t n, int64_t *sizes) noexcept {
    return timed<int32_t>(ctx, Call::batch_get_size, [&] {
        Impl &s = I(ctx);
        std::vector<std::string> ks;
        ks.reserve(n);
        for (size_t i = 0; i < n; ++i) ks.push_back(str(keys[i]));
        std::map<std::string, std::vector<::mooncake::Replica::Descriptor>> descs;
        try {
            descs = s.c().batch_get_replica_desc(ks);
        } catch (...) {
            descs.clear();
        }
        for (size_t i = 0; i < n; ++i) {
            // A key's size with certainty: every COMPLETE replica a memory replica and
            // all of them agreeing; anything else is asked with getSize (as Python does).
            std::optional<int64_t> size;
            auto it = descs.find(ks[i]);
            if (it != descs.end()) {
                bool ok = false;
                uint64_t v = 0;
                for (const auto &r : it->second) {
                    if (r.status != ::mooncake::ReplicaStatus::COMPLETE) continue;
                    if (!r.is_memory_replica()) {
                        ok = false;
                        break;
                    }
                    uint64_t sz = std::get<::mooncake::MemoryDescriptor>(r.descriptor_variant).buffer_descriptor.size_;
                    if (ok && sz != v) {
                        ok = false;
                        break;
                    }
                    ok = true;
                    v = sz;
                }
                if (ok && v <= static_cast<uint64_t>(INT64_MAX)) size = static_cast<int64_t>(v);
            }
            sizes[i] = size ? *size : s.code(static_cast<int64_t>(s.c().getSize(ks[i])));
            s.remember_size(ks[i], sizes[i]);
        }
        return OK;
    }, INTERNAL_ERROR);
}

}  // namespace

Adapter::Adapter(std::shared_ptr<::mooncake::RealClient> client, Options options) : impl_(std::make_shared<Impl>()) {
    impl_->client = std::move(client);
    impl_->options = options;
}

Adapter::~Adapter() = default;

mws_store_vtable Adapter::vtable() {
    mws_store_vtable vt{};
    vt.size = sizeof vt;
    vt.version = MWS_STORE_VTABLE_VERSION;
    vt.put = &cb_put;
    vt.upsert = &cb_upsert;
    vt.get_size = &cb_get_size;
    vt.get_into = &cb_get_into;
    vt.exists = &cb_exists;
    vt.remove = &cb_remove;
    vt.batch_put_from = &cb_batch_put_from;
    vt.get_into_ranges = &cb_get_into_ranges;
    vt.register_buffer = &cb_register;
    vt.unregister_buffer = &cb_unregister;
    vt.destroy = &cb_destroy;
    vt.batch_exists = &cb_batch_exists;
    vt.list = nullptr;  // Mooncake Store has no call that enumerates keys
    vt.get_cost = &cb_get_cost;
    vt.batch_get_size = &cb_batch_get_size;
    return vt;
}

void *Adapter::new_ctx() const { return new std::shared_ptr<Impl>(impl_); }

mws::Store Adapter::store(const mws::StoreOptions &options) const {
    auto *ctx = static_cast<std::shared_ptr<Impl> *>(new_ctx());
    try {
        return mws::Store::from_vtable(vtable(), ctx, options);  // owns ctx on success
    } catch (...) {
        delete ctx;
        throw;
    }
}

Stats Adapter::stats() const {
    Stats s;
    s.batch_put_calls = impl_->batch_put_calls.load();
    s.batch_put_items = impl_->batch_put_items.load();
    s.range_calls = impl_->range_calls.load();
    s.ranges = impl_->ranges.load();
    s.get_into_calls = impl_->get_into_calls.load();
    s.transport_errors = impl_->transport_errors.load();
    s.last_transport_error = impl_->last_transport_error.load();
    for (int k = 0; k < kCallKinds; ++k) {
        s.calls[k] = impl_->call_count[k].load();
        s.nanos[k] = impl_->call_nanos[k].load();
    }
    return s;
}

const char *call_name(Call kind) {
    static const char *const names[kCallKinds] = {
        "put",          "upsert", "get_size",       "batch_get_size",  "get_into",        "exists",
        "batch_exists", "remove", "batch_put_from", "get_into_ranges", "register_buffer", "unregister_buffer",
        "batch_query",  "batch_get_into_multi_buffers"};
    int k = static_cast<int>(kind);
    return k >= 0 && k < kCallKinds ? names[k] : "unknown";
}

::mooncake::RealClient &Adapter::client() const { return *impl_->client; }

int Adapter::self_test(const std::string &key) const {
    constexpr size_t n = 64 << 10;
    void *mem = nullptr;
    if (posix_memalign(&mem, 4096, 2 * n) != 0) return INTERNAL_ERROR;
    auto *p = static_cast<unsigned char *>(mem);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 131 + 7);
    std::memset(p + n, 0, n);
    auto &c = *impl_->client;
    int rc = c.register_buffer(p, 2 * n);
    if (rc == 0) {
        ::mooncake::ReplicateConfig cfg;
        cfg.group_ids = std::vector<std::string>{""};
        rc = c.upsert_from(key, p, n, cfg);
        if (rc == 0) {
            int64_t got = c.get_into(key, p + n, n);
            rc = got == static_cast<int64_t>(n) ? (std::memcmp(p, p + n, n) == 0 ? 0 : INTERNAL_ERROR)
                                                : static_cast<int>(got < 0 ? got : INTERNAL_ERROR);
            c.remove(key, true);
        }
        c.unregister_buffer(p);
    }
    std::free(mem);
    return rc;
}

int Adapter::raw_register(void *ptr, std::size_t len) const { return impl_->client->register_buffer(ptr, len); }
int Adapter::raw_unregister(void *ptr) const { return impl_->client->unregister_buffer(ptr); }

int Adapter::raw_upsert_from(const std::string &key, void *ptr, std::size_t len, const std::string &group,
                             bool payload) const {
    return impl_->client->upsert_from(key, ptr, len,
                                      impl_->config({group}, payload ? MWS_RECORD_PAYLOAD : MWS_RECORD_METADATA));
}

std::vector<int> Adapter::raw_batch_put_from(const std::vector<std::string> &keys, const std::vector<void *> &ptrs,
                                             const std::vector<std::size_t> &lens, const std::string &group) const {
    return impl_->client->batch_put_from(
        keys, ptrs, lens, impl_->config(std::vector<std::string>(keys.size(), group), MWS_RECORD_PAYLOAD));
}

std::vector<std::int64_t> Adapter::raw_batch_get_into(const std::vector<std::string> &keys,
                                                      const std::vector<void *> &ptrs,
                                                      const std::vector<std::size_t> &caps) const {
    return impl_->client->batch_get_into(keys, ptrs, caps);
}

std::int64_t Adapter::raw_get_size(const std::string &key) const { return impl_->client->getSize(key); }

long Adapter::raw_remove_by_regex(const std::string &regex) const { return impl_->client->removeByRegex(regex, true); }

std::shared_ptr<::mooncake::RealClient> connect_tcp(const std::string &master, std::uint64_t segment_bytes,
                                                    std::uint64_t local_buffer_bytes, const std::string &local_hostname,
                                                    int *rc) {
    std::shared_ptr<::mooncake::RealClient> c = ::mooncake::RealClient::create();
    int r = c ? c->setup_real(local_hostname, "P2PHANDSHAKE", segment_bytes, local_buffer_bytes, "tcp", "", master,
                              nullptr)
              : INTERNAL_ERROR;
    if (rc != nullptr) *rc = r;
    return r == 0 ? c : nullptr;
}

int tear_down(::mooncake::RealClient &client) { return client.tearDownAll(); }

std::string error_name(std::int64_t code) {
    if (code > 0 || code < INT32_MIN) return "UNKNOWN";
    return ::mooncake::toString(static_cast<::mooncake::ErrorCode>(static_cast<int32_t>(code)));
}

}  // namespace mooncake_store
}  // namespace mws
