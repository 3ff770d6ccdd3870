// Helpers of the GoogleTest suites that snapshot and restore (gtest_snapshot_restore.cpp,
// gtest_store_api.cpp): scratch directories, a round trip, a vtable store over a
// std::map, and two small models.
#ifndef MWS_TESTS_STORES_HPP
#define MWS_TESTS_STORES_HPP

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"

namespace mwstest {

using namespace mwsmodel;

inline std::string scratch_dir(const std::string &name) {
    auto dir = std::filesystem::temp_directory_path() / ("mws-gtest-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    return dir.string();
}

inline void round_trip(const mws::Store &store, Layout from, Layout to, const std::vector<TensorDef> &defs) {
    HostModel src(placement_json("src", from, defs, 1), defs, true, "trainer");
    mws::StoredManifest m = snapshot(store, src);
    HostModel dst(placement_json("dst", to, defs, 1), defs, false, "serving");
    mws_load_stats st = restore(store, store.load_manifest(std::string(m.key())), dst);
    EXPECT_GT(st.bytes, 0u);
    EXPECT_GT(dst.verify(), 0u);
}

// A vtable-backed store implemented here: a std::map under a mutex.
struct MapStore {
    std::mutex mu;
    std::map<std::string, std::string> objects;
    int destroyed = 0;
    static std::string key(mws_bytes k) { return std::string(k.ptr, k.len); }
    static int32_t put(void *c, mws_bytes k, const uint8_t *v, uint64_t n, mws_bytes, uint32_t) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        s->objects.emplace(key(k), std::string(reinterpret_cast<const char *>(v), n));
        return 0;  // Mooncake: 0 for an existing key, value kept
    }
    static int32_t upsert(void *c, mws_bytes k, const uint8_t *v, uint64_t n, mws_bytes, uint32_t) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        s->objects[key(k)] = std::string(reinterpret_cast<const char *>(v), n);
        return 0;
    }
    static int64_t get_size(void *c, mws_bytes k) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->objects.find(key(k));
        return it == s->objects.end() ? -704 : static_cast<int64_t>(it->second.size());
    }
    static int64_t get_into(void *c, mws_bytes k, uint8_t *buf, uint64_t cap) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->objects.find(key(k));
        if (it == s->objects.end()) return -704;
        if (it->second.size() > cap) return -600;
        std::memcpy(buf, it->second.data(), it->second.size());
        return static_cast<int64_t>(it->second.size());
    }
    static int32_t exists(void *c, mws_bytes k) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        return s->objects.count(key(k)) ? 1 : 0;
    }
    static int32_t remove(void *c, mws_bytes k) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        return s->objects.erase(key(k)) ? 0 : -704;
    }
    static int32_t batch_put_from(void *c, const mws_put_item *items, size_t n, uint32_t, int32_t *results) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        for (size_t i = 0; i < n; ++i) {
            if (items[i].memory_kind != MWS_MEMORY_HOST) {
                results[i] = -600;
                continue;
            }
            s->objects.emplace(key(items[i].key),
                               std::string(reinterpret_cast<const char *>(items[i].address), items[i].len));
            results[i] = 0;
        }
        return 0;
    }
    static int32_t get_into_ranges(void *c, const mws_range_item *items, size_t n, int64_t *results) {
        auto *s = static_cast<MapStore *>(c);
        std::lock_guard<std::mutex> g(s->mu);
        for (size_t i = 0; i < n; ++i) {
            auto it = s->objects.find(key(items[i].key));
            if (it == s->objects.end()) {
                results[i] = -704;
            } else if (items[i].object_offset + items[i].len > it->second.size()) {
                results[i] = -600;
            } else {
                std::memcpy(reinterpret_cast<void *>(items[i].dest_address), it->second.data() + items[i].object_offset,
                            items[i].len);
                results[i] = static_cast<int64_t>(items[i].len);
            }
        }
        return 0;
    }
    static void destroy(void *c) { static_cast<MapStore *>(c)->destroyed++; }

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
        vt.destroy = &destroy;
        return vt;
    }
};

inline const std::vector<TensorDef> &moe_model() {
    static const std::vector<TensorDef> defs = model_tensors(2, 64, 4);
    return defs;
}
inline const std::vector<TensorDef> &dense_model() {
    static const std::vector<TensorDef> defs = model_tensors(2, 64, 0);
    return defs;
}

/// A small dense model with tied embeddings: `lm_head.weight` and
/// `model.embed_tokens.weight` form one alias group (same shape, dtype, layout and TP
/// split), so a HostModel binds both to one buffer and both hold the same bytes.
inline std::vector<TensorDef> tied_model(std::uint64_t experts = 0) {
    std::vector<TensorDef> defs = model_tensors(2, 64, experts);
    const std::vector<std::string> group = {"lm_head.weight", "model.embed_tokens.weight"};  // sorted
    for (auto &d : defs) {
        if (d.id == "model.embed_tokens.weight") d.aliases = group;
    }
    TensorDef head = defs.front();
    head.id = "lm_head.weight";
    head.aliases = group;
    defs.push_back(head);
    return defs;
}

}  // namespace mwstest

#endif  // MWS_TESTS_STORES_HPP
