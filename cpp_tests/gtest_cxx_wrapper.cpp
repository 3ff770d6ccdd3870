// GoogleTest suites for the header-only C++ wrapper (mooncake_weight_store.hpp).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/sample.h"

static_assert(!std::is_copy_constructible_v<mws::Placement>, "handles are not copyable");
static_assert(std::is_nothrow_move_constructible_v<mws::Placement>, "handles move");
static_assert(!std::is_copy_constructible_v<mws::Binding>, "handles are not copyable");
static_assert(!std::is_copy_constructible_v<mws::UploadPlan>, "handles are not copyable");

namespace {

std::vector<mws::Binding> bind_all(const mws::Placement &p, unsigned char *buffers) {
    std::vector<mws::Binding> out;
    const char *participants[2] = {MWS_SAMPLE_P0, MWS_SAMPLE_P1};
    for (int i = 0; i < 2; ++i) {
        mws_binding *raw = nullptr;
        mws::detail::check(sample_bind(p.get(), participants[i], 1, buffers + 32 * i, 32, &raw));
        out.emplace_back(raw);
    }
    return out;
}

}  // namespace

TEST(CxxWrapper, PlacementAccessors) {
    auto p = mws::Placement::from_json(MWS_SAMPLE_PLACEMENT_JSON);
    EXPECT_EQ(p.id(), MWS_SAMPLE_PLACEMENT_ID);
    EXPECT_EQ(p.digest(), MWS_SAMPLE_PLACEMENT_DIGEST);
    EXPECT_EQ(p.topology_id(), MWS_SAMPLE_TOPOLOGY_ID);
    EXPECT_EQ(p.resource_id(), "fixture-model");
    EXPECT_EQ(p.revision(), "rev-1");
    EXPECT_EQ(p.weight_generation(), 1u);
    EXPECT_EQ(p.fragment_count(), 2u);
    EXPECT_EQ(std::string(p.fragment(1).participant_id), MWS_SAMPLE_P1);
    auto again = mws::Placement::from_json(p.to_json());
    EXPECT_EQ(again.to_json(), p.to_json());
}

TEST(CxxWrapper, ErrorsCarryStatusAndMessage) {
    try {
        mws::Placement::from_json("{\"nope\":");
        FAIL() << "expected mws::Error";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("MWS_INVALID_ARGUMENT"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("mws_placement_from_json"), std::string::npos);
    }
    auto p = mws::Placement::from_json(MWS_SAMPLE_PLACEMENT_JSON);
    EXPECT_THROW(p.fragment(99), mws::Error);
    mws::Placement moved = std::move(p);
    EXPECT_THROW((void)p.id(), mws::Error);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(moved.id(), MWS_SAMPLE_PLACEMENT_ID);
}

TEST(CxxWrapper, PlanUploadMatchesTheReference) {
    auto p = mws::Placement::from_json(MWS_SAMPLE_PLACEMENT_JSON);
    std::vector<unsigned char> buffers(64);
    auto bindings = bind_all(p, buffers.data());
    for (const auto &b : bindings) {
        b.validate(p);
    }
    mws::UploadOptions o;
    o.transaction_id = MWS_SAMPLE_TRANSACTION_ID;
    o.created_at = MWS_SAMPLE_CREATED_AT;
    auto plan = mws::plan_upload(p, bindings, o);
    EXPECT_EQ(plan.manifest_digest(), MWS_SAMPLE_MANIFEST_DIGEST);
    EXPECT_EQ(plan.transaction_id(), MWS_SAMPLE_TRANSACTION_ID);
    EXPECT_EQ(plan.source_placement_id(), MWS_SAMPLE_PLACEMENT_ID);
    ASSERT_EQ(plan.operation_count(), 2u);
    auto op = plan.operation(0);
    EXPECT_EQ(op.target_fragment_id, "515f4b27b6a1cad7e471983b");
    EXPECT_EQ(op.nbytes, 32u);
    EXPECT_THROW(plan.operation(2), mws::Error);
}

TEST(CxxWrapper, BindingOptionsForPlacementAndErrors) {
    auto p = mws::Placement::from_json(MWS_SAMPLE_PLACEMENT_JSON);
    auto o = mws::BindingOptions::for_placement(p);
    EXPECT_EQ(o.placement_id, MWS_SAMPLE_PLACEMENT_ID);
    o.participant_id = MWS_SAMPLE_P0;
    o.instance_id = "i0";
    o.lease_id = "l0";
    mws::Binding b(o);
    EXPECT_EQ(b.fragment_count(), 0u);
    EXPECT_THROW(b.validate(p), mws::Error);  // no fragment bound
    mws_runtime_fragment f{};
    try {
        b.add_fragment(f);  // every string NULL
        FAIL() << "expected mws::Error";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_NULL_ARGUMENT);
    }
    std::vector<const mws::Binding *> none;
    EXPECT_THROW(mws::plan_upload(p, none), mws::Error);
    std::vector<const mws::Binding *> with_null{nullptr};
    try {
        mws::plan_upload(p, with_null);
        FAIL() << "expected mws::Error";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_NULL_ARGUMENT);
    }
}

TEST(CxxWrapper, VersionAndStatusName) {
    EXPECT_EQ(mws::version(), std::to_string(MWS_VERSION_MAJOR) + "." + std::to_string(MWS_VERSION_MINOR) + "." +
                                  std::to_string(MWS_VERSION_PATCH));
    EXPECT_EQ(mws::status_name(MWS_CONFLICT), "MWS_CONFLICT");
}

TEST(CxxWrapper, RevisionsAndLatestWithoutHandBuiltKeys) {
    auto p = mws::Placement::from_json(MWS_SAMPLE_PLACEMENT_JSON);
    std::vector<unsigned char> buffers(64);
    auto bindings = bind_all(p, buffers.data());
    mws::UploadOptions o;
    o.transaction_id = MWS_SAMPLE_TRANSACTION_ID;
    o.created_at = MWS_SAMPLE_CREATED_AT;
    auto plan = mws::plan_upload(p, bindings, o);
    mws::Store store = mws::Store::open_memory();
    EXPECT_TRUE(store.revisions("fixture-model").empty());
    EXPECT_FALSE(store.latest("fixture-model").has_value());
    // A published manifest is what a listing reads (a commit publishes it).
    store.upsert(std::string(plan.manifest_key()), plan.manifest_json());
    auto all = store.revisions("fixture-model");
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].revision, "rev-1");
    EXPECT_EQ(all[0].weight_generation, 1u);
    EXPECT_EQ(all[0].manifest_key, plan.manifest_key());
    EXPECT_EQ(all[0].manifest_digest, MWS_SAMPLE_MANIFEST_DIGEST);
    EXPECT_EQ(all[0].created_at, MWS_SAMPLE_CREATED_AT);
    auto latest = store.latest("fixture-model", std::string("default"));
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(store.load_manifest(latest->manifest_key).digest(), MWS_SAMPLE_MANIFEST_DIGEST);
    EXPECT_TRUE(store.revisions("fixture-model", std::string("other")).empty());
    try {
        store.revisions("");
        FAIL() << "expected mws::Error";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("resource_id"), std::string::npos);
    }
}

// The prefix and its length come from one C call: the length must be read after it
// (the arguments of one call are evaluated in an unspecified order).
TEST(CxxWrapper, StoreKeyPrefix) {
    EXPECT_EQ(mws::Store::open_memory().key_prefix(), "weights");
    mws::StoreOptions o;
    o.key_prefix = "/ckpt/llm/";
    EXPECT_EQ(mws::Store::open_memory(o).key_prefix(), "ckpt/llm");
    mws::Store empty(nullptr);
    EXPECT_THROW((void)empty.key_prefix(), mws::Error);
}
