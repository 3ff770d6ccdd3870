// GoogleTest suites (label api): the store, writer and load-plan functions of the C ABI
// against hostile inputs (NULLs, bad vtables, stale bindings, tampered manifests).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"
#include "support/stores.hpp"

using namespace mwsmodel;
using namespace mwstest;

TEST(Hostile, VtableChecks) {
    MapStore map;
    mws_store_vtable vt = MapStore::vtable();
    mws_store *out = nullptr;
    mws_store_vtable bad = vt;
    bad.size = 8;
    EXPECT_EQ(mws_store_from_vtable(&bad, &map, &out), MWS_INVALID_ARGUMENT);
    bad = vt;
    bad.version = 99;
    EXPECT_EQ(mws_store_from_vtable(&bad, &map, &out), MWS_UNSUPPORTED);
    bad = vt;
    bad.get_into_ranges = nullptr;
    EXPECT_EQ(mws_store_from_vtable(&bad, &map, &out), MWS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("get_into_ranges"), std::string::npos);
    EXPECT_EQ(mws_store_from_vtable(nullptr, &map, &out), MWS_NULL_ARGUMENT);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(map.destroyed, 0);
}

TEST(Hostile, NullsAndBadArguments) {
    mws_store *s = nullptr;
    EXPECT_EQ(mws_store_open_memory(nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_store_open_dir(nullptr, nullptr, &s), MWS_NULL_ARGUMENT);
    ASSERT_EQ(mws_store_open_memory(nullptr, &s), MWS_OK);
    size_t len = 0;
    EXPECT_EQ(mws_store_get(s, "nope", nullptr, 0, &len), MWS_NOT_FOUND);
    EXPECT_EQ(mws_store_get(s, nullptr, nullptr, 0, &len), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_store_load(s, nullptr, nullptr, nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_store_commit(s, nullptr, nullptr, nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_store_upload(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_writer_begin(s, nullptr, nullptr, nullptr, nullptr, nullptr), MWS_NULL_ARGUMENT);
    mws_store_free(s);
    mws_store_free(nullptr);
    mws_writer_free(nullptr);
    mws_load_plan_free(nullptr);
    mws_receipts_free(nullptr);
    mws_stored_manifest_free(nullptr);
    // A path store refuses keys that leave its root.
    std::string dir = scratch_dir("keys");
    mws::Store dirstore = mws::Store::open_dir(dir);
    EXPECT_THROW(dirstore.upsert("../escape", "x"), mws::Error);
    EXPECT_THROW(dirstore.upsert("a/../../b", "x"), mws::Error);
    std::filesystem::remove_all(dir);
}

TEST(Hostile, DotDotNamespaceStaysInsideTheStore) {
    std::string dir = scratch_dir("ns");
    mws::Store store = mws::Store::open_dir(dir);
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    // NOTE: planning accepts the namespace ".." (keys "weights/../..."); the directory
    // store refuses such keys at I/O time, so nothing escapes its root. Reported upstream.
    EXPECT_THROW(snapshot(store, src, ".."), mws::Error);
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir).parent_path() / "weights"));
    std::filesystem::remove_all(dir);
}

TEST(Hostile, StaleLeaseAndGenerationRefusedBeforeIo) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    // Same buffers, another lease: stale.
    HostModel other(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    other.make_bindings("trainer", 1, "-renewed");
    try {
        store.upload(plan, src.placement, other.bindings[0]);
        FAIL() << "expected a stale binding";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_STALE_BINDING) << e.what();
    }
    other.make_bindings("trainer", 2);
    EXPECT_THROW(store.upload(plan, src.placement, other.bindings[0]), mws::Error);
    EXPECT_FALSE(store.exists(std::string(plan.operation(0).object_key)));
}

TEST(Hostile, DeviceMemoryWithoutCopyHookRefusedBeforeIo) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    src.memory_kind = MWS_MEMORY_DEVICE;
    src.make_bindings("trainer", 1);
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    try {
        store.upload(plan, src.placement, src.bindings[0]);
        FAIL() << "expected MWS_UNSUPPORTED";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_UNSUPPORTED) << e.what();
    }
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        EXPECT_FALSE(store.exists(std::string(plan.operation(i).object_key)));
    }
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_NONE);
}

TEST(Hostile, TamperedManifestsRefusedAndTargetsUntouched) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    auto m = snapshot(store, src);
    std::string key(m.key());
    std::string good(m.to_json());
    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    auto untouched = [&] {
        for (const auto &b : dst.buffers)
            for (unsigned char c : b.second)
                if (c != 0xA5) return false;
        return true;
    };
    auto mutate = [&](const std::string &from, const std::string &to) {
        std::string j = good;
        auto pos = j.find(from);
        EXPECT_NE(pos, std::string::npos) << from;
        if (pos != std::string::npos) j.replace(pos, from.size(), to);
        return j;
    };
    // Wrong digest / absurd counts / overlapping or missing fragments: refused at decode.
    std::vector<std::string> bad = {
        mutate("\"nbytes\":", "\"nbytes\":1"),
        mutate("\"global_offset\":[0", "\"global_offset\":[1"),
        mutate("\"object_offset\":0", "\"object_offset\":18446744073709551615"),
        good.substr(0, good.size() / 2),
    };
    for (const auto &j : bad) {
        for (auto &b : dst.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
        store.upsert(key, j);
        mws_stored_manifest *out = nullptr;
        if (mws_store_load_manifest(store.get(), key.c_str(), &out) == MWS_OK) {
            // Decodes (the inconsistency is only visible against the objects): the
            // restore must then be refused.
            mws::StoredManifest decoded(out);
            bool refused = false;
            try {
                mws::LoadPlan plan = mws::LoadPlan::plan(decoded, dst.placement, dst.binding_ptrs());
                for (const auto &b : dst.bindings) store.load(plan, b);
            } catch (const mws::Error &) {
                refused = true;
            }
            EXPECT_TRUE(refused) << j.substr(0, 300);
        } else {
            EXPECT_EQ(out, nullptr);
            EXPECT_TRUE(untouched());
        }
    }
    // A valid manifest whose object was truncated: the load is refused, targets untouched.
    store.upsert(key, good);
    auto fresh = store.load_manifest(key);
    mws_stored_fragment_info f0 = fresh.fragment(0);
    std::vector<unsigned char> obj = store.get_object(f0.object_key);
    store.upsert(f0.object_key, std::string(reinterpret_cast<const char *>(obj.data()), obj.size() / 2));
    mws::LoadPlan plan = mws::LoadPlan::plan(fresh, dst.placement, dst.binding_ptrs());
    bool failed = false;
    for (const auto &b : dst.bindings) {
        try {
            store.load(plan, b);
        } catch (const mws::Error &) {
            failed = true;
        }
    }
    EXPECT_TRUE(failed);
}
