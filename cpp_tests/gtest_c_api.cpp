// GoogleTest suites for the C ABI: every handle, valid and invalid input.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.h"
#include "support/sample.h"

namespace {

std::string last_error() { return mws_last_error_message(); }

struct PlacementDeleter {
    void operator()(mws_placement *p) const { mws_placement_free(p); }
};
struct BindingDeleter {
    void operator()(mws_binding *p) const { mws_binding_free(p); }
};
struct PlanDeleter {
    void operator()(mws_upload_plan *p) const { mws_upload_plan_free(p); }
};
using PlacementPtr = std::unique_ptr<mws_placement, PlacementDeleter>;
using BindingPtr = std::unique_ptr<mws_binding, BindingDeleter>;
using PlanPtr = std::unique_ptr<mws_upload_plan, PlanDeleter>;

PlacementPtr parse(const std::string &json, mws_status expected = MWS_OK) {
    mws_placement *p = nullptr;
    EXPECT_EQ(mws_placement_from_json(json.data(), json.size(), &p), expected) << last_error();
    return PlacementPtr(p);
}

PlacementPtr sample() { return parse(MWS_SAMPLE_PLACEMENT_JSON); }

class WithBindings : public ::testing::Test {
protected:
    void SetUp() override {
        placement = sample();
        ASSERT_TRUE(placement);
        mws_binding *b = nullptr;
        ASSERT_EQ(sample_bind(placement.get(), MWS_SAMPLE_P0, 1, buf0, sizeof buf0, &b), MWS_OK) << last_error();
        b0.reset(b);
        ASSERT_EQ(sample_bind(placement.get(), MWS_SAMPLE_P1, 1, buf1, sizeof buf1, &b), MWS_OK) << last_error();
        b1.reset(b);
    }

    PlanPtr plan(const mws_upload_options *options, mws_status expected = MWS_OK) {
        const mws_binding *set[2] = {b0.get(), b1.get()};
        mws_upload_plan *out = nullptr;
        EXPECT_EQ(mws_upload_plan_new(placement.get(), set, 2, options, &out), expected) << last_error();
        return PlanPtr(out);
    }

    static mws_upload_options fixed() {
        mws_upload_options o{};
        o.transaction_id = MWS_SAMPLE_TRANSACTION_ID;
        o.created_at = MWS_SAMPLE_CREATED_AT;
        return o;
    }

    unsigned char buf0[32] = {};
    unsigned char buf1[32] = {};
    PlacementPtr placement;
    BindingPtr b0, b1;
};

}  // namespace

TEST(Status, NamesAreStableAndTotal) {
    EXPECT_STREQ(mws_status_name(MWS_OK), "MWS_OK");
    EXPECT_STREQ(mws_status_name(MWS_PANIC), "MWS_PANIC");
    EXPECT_STREQ(mws_status_name(MWS_INVALID_UTF8), "MWS_INVALID_UTF8");
    EXPECT_STREQ(mws_status_name(MWS_STALE_BINDING), "MWS_STALE_BINDING");
    EXPECT_STREQ(mws_status_name(999), "MWS_UNKNOWN_STATUS");
    for (int s = 0; s <= MWS_INTEGRITY; ++s) {
        EXPECT_STRNE(mws_status_name(s), "MWS_UNKNOWN_STATUS") << s;
    }
}

TEST(Version, MatchesHeaderMacros) {
    EXPECT_EQ(std::string(mws_version()), std::to_string(MWS_VERSION_MAJOR) + "." +
                                              std::to_string(MWS_VERSION_MINOR) + "." +
                                              std::to_string(MWS_VERSION_PATCH));
}

TEST(Panic, IsCaughtAtTheBoundaryOnEveryThread) {
    EXPECT_EQ(mws_test_panic(), MWS_PANIC);
    EXPECT_NE(last_error().find("mws_test_panic"), std::string::npos);
    std::thread t([] {
        EXPECT_EQ(mws_test_panic(), MWS_PANIC);
        EXPECT_NE(last_error().find("panic"), std::string::npos);
    });
    t.join();
}

TEST(LastError, IsThreadLocal) {
    EXPECT_EQ(mws_placement_from_json(nullptr, 1, nullptr), MWS_NULL_ARGUMENT);
    std::string here = last_error();
    std::thread t([] { EXPECT_STREQ(mws_last_error_message(), ""); });
    t.join();
    EXPECT_EQ(last_error(), here);
}

TEST(Placement, ParsesAndExposesIdentity) {
    auto p = sample();
    ASSERT_TRUE(p);
    std::size_t len = 0;
    EXPECT_STREQ(mws_placement_id(p.get(), &len), MWS_SAMPLE_PLACEMENT_ID);
    EXPECT_EQ(len, std::strlen(MWS_SAMPLE_PLACEMENT_ID));
    EXPECT_STREQ(mws_placement_digest(p.get(), nullptr), MWS_SAMPLE_PLACEMENT_DIGEST);
    EXPECT_STREQ(mws_placement_topology_id(p.get(), nullptr), MWS_SAMPLE_TOPOLOGY_ID);
    EXPECT_EQ(mws_placement_participant_count(p.get()), 2u);
    EXPECT_EQ(mws_placement_tensor_count(p.get()), 1u);
    EXPECT_EQ(mws_placement_fragment_count(p.get()), 2u);
    const char *json = mws_placement_to_json(p.get(), &len);
    ASSERT_NE(json, nullptr);
    auto again = parse(std::string(json, len));
    ASSERT_TRUE(again);
    EXPECT_STREQ(mws_placement_to_json(again.get(), nullptr), json);
}

TEST(Placement, FragmentsInCanonicalOrder) {
    auto p = sample();
    mws_placement_fragment_info f0{}, f1{};
    ASSERT_EQ(mws_placement_fragment(p.get(), 0, &f0), MWS_OK);
    ASSERT_EQ(mws_placement_fragment(p.get(), 1, &f1), MWS_OK);
    EXPECT_STREQ(f0.participant_id, MWS_SAMPLE_P0);
    EXPECT_STREQ(f1.participant_id, MWS_SAMPLE_P1);
    EXPECT_EQ(f0.ndim, 2u);
    EXPECT_EQ(f1.global_offset[0], 4u);
    EXPECT_EQ(f1.nbytes, 32u);
    EXPECT_EQ(mws_placement_fragment(p.get(), 2, &f0), MWS_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("out of range"), std::string::npos);
}

TEST(Placement, RejectsMalformedJson) {
    parse("", MWS_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("mws_placement_from_json"), std::string::npos);
    parse("{", MWS_INVALID_ARGUMENT);
    parse("[]", MWS_INVALID_ARGUMENT);
    parse("{\"parts\":[]}", MWS_INVALID_ARGUMENT);
    parse("nul", MWS_INVALID_ARGUMENT);
    parse(std::string("{\"a\":\"\xff\"}"), MWS_INVALID_ARGUMENT);
}

TEST(Placement, RejectsDuplicateKeysAndTampering) {
    std::string json = MWS_SAMPLE_PLACEMENT_JSON;
    // Duplicate key: a second "revision" member at the top level.
    std::string dup = json;
    dup.insert(1, "\"revision\":\"rev-1\",");
    parse(dup, MWS_INVALID_ARGUMENT);
    EXPECT_FALSE(last_error().empty());
    // Tampered placement id.
    std::string tampered = json;
    auto pos = tampered.find("cabe1ad0");
    ASSERT_NE(pos, std::string::npos);
    tampered[pos] = 'd';
    parse(tampered, MWS_INVALID_ARGUMENT);
    // Unknown field.
    std::string unknown = json;
    unknown.insert(1, "\"extra\":1,");
    parse(unknown, MWS_INVALID_ARGUMENT);
}

TEST(Placement, WrongLengthsAndNulls) {
    std::string json = MWS_SAMPLE_PLACEMENT_JSON;
    mws_placement *p = nullptr;
    EXPECT_EQ(mws_placement_from_json(json.data(), json.size() - 1, &p), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_placement_from_json(json.data(), 1, &p), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_placement_from_json(json.data(), 0, &p), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_placement_from_json(nullptr, 0, &p), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_placement_from_json(json.data(), json.size(), nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(mws_placement_digest(nullptr, nullptr), nullptr);
    EXPECT_NE(last_error().find("placement"), std::string::npos);
    EXPECT_EQ(mws_placement_tensor_count(nullptr), 0u);
    mws_placement_free(nullptr);
}

TEST(Placement, SharedAcrossThreads) {
    auto p = sample();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 50; ++i) {
                EXPECT_STREQ(mws_placement_id(p.get(), nullptr), MWS_SAMPLE_PLACEMENT_ID);
                mws_placement_fragment_info f{};
                EXPECT_EQ(mws_placement_fragment(p.get(), static_cast<std::size_t>(i % 2), &f), MWS_OK);
            }
        });
    }
    for (auto &t : threads) t.join();
}

TEST_F(WithBindings, BindingsValidate) {
    EXPECT_EQ(mws_binding_validate(placement.get(), b0.get()), MWS_OK) << last_error();
    EXPECT_EQ(mws_binding_validate(placement.get(), b1.get()), MWS_OK) << last_error();
    EXPECT_EQ(mws_binding_fragment_count(b0.get()), 1u);
}

TEST_F(WithBindings, MismatchedBindingIsRejected) {
    // A binding that attests another placement digest.
    mws_binding_options o{};
    o.resource_id = "fixture-model";
    o.revision = "rev-1";
    o.placement_id = MWS_SAMPLE_PLACEMENT_ID;
    o.placement_digest = "0000000000000000000000000000000000000000000000000000000000000000";
    o.participant_id = MWS_SAMPLE_P0;
    o.instance_id = "i";
    o.lease_id = "l";
    o.lease_generation = 1;
    mws_binding *raw = nullptr;
    ASSERT_EQ(mws_binding_new(&o, &raw), MWS_OK);
    BindingPtr other(raw);
    mws_placement_fragment_info info{};
    ASSERT_EQ(mws_placement_fragment(placement.get(), 0, &info), MWS_OK);
    uint64_t strides[2] = {8, 2};
    mws_runtime_fragment f{};
    f.placement_fragment_id = info.placement_fragment_id;
    f.fragment_id = "x:rt0";
    f.address = buf0;
    f.nbytes = 32;
    f.worker_id = "w";
    f.endpoint = "e";
    f.device = "cpu";
    f.itemsize = 2;
    f.local_shape = info.local_shape;
    f.local_shape_len = 2;
    f.strides_bytes = strides;
    f.strides_bytes_len = 2;
    f.storage_address = buf0;
    f.storage_nbytes = 32;
    f.memory_kind = MWS_MEMORY_HOST;
    ASSERT_EQ(mws_binding_add_fragment(other.get(), &f), MWS_OK) << last_error();
    mws_status st = mws_binding_validate(placement.get(), other.get());
    EXPECT_TRUE(st == MWS_INVALID_BINDING || st == MWS_INVALID_ARGUMENT) << mws_status_name(st);
    EXPECT_FALSE(last_error().empty());
    const mws_binding *set[2] = {other.get(), b1.get()};
    mws_upload_plan *out = nullptr;
    st = mws_upload_plan_new(placement.get(), set, 2, nullptr, &out);
    EXPECT_TRUE(st == MWS_INVALID_BINDING || st == MWS_INVALID_ARGUMENT) << mws_status_name(st);
    EXPECT_EQ(out, nullptr);
}

TEST_F(WithBindings, InvalidFragmentsAreRejected) {
    mws_placement_fragment_info info{};
    ASSERT_EQ(mws_placement_fragment(placement.get(), 0, &info), MWS_OK);
    uint64_t strides[2] = {8, 2};
    mws_runtime_fragment f{};
    f.placement_fragment_id = info.placement_fragment_id;
    f.fragment_id = "y:rt0";
    f.address = buf0;
    f.nbytes = 32;
    f.worker_id = "w";
    f.endpoint = "e";
    f.device = "cpu";
    f.itemsize = 2;
    f.local_shape = info.local_shape;
    f.local_shape_len = 2;
    f.strides_bytes = strides;
    f.strides_bytes_len = 2;
    f.storage_address = buf0;
    f.storage_nbytes = 16;  // smaller than the fragment
    f.memory_kind = MWS_MEMORY_HOST;
    std::size_t before = mws_binding_fragment_count(b0.get());
    EXPECT_NE(mws_binding_add_fragment(b0.get(), &f), MWS_OK);
    EXPECT_FALSE(last_error().empty());
    f.storage_nbytes = 32;
    f.strides_bytes = nullptr;  // NULL with a non-zero length
    EXPECT_EQ(mws_binding_add_fragment(b0.get(), &f), MWS_NULL_ARGUMENT);
    f.strides_bytes = strides;
    f.device = "cpu\xc0";
    EXPECT_EQ(mws_binding_add_fragment(b0.get(), &f), MWS_INVALID_UTF8);
    EXPECT_EQ(mws_binding_fragment_count(b0.get()), before);
}

TEST_F(WithBindings, PlanMatchesTheReference) {
    mws_upload_options o = fixed();
    auto p = plan(&o);
    ASSERT_TRUE(p);
    EXPECT_STREQ(mws_upload_plan_manifest_digest(p.get(), nullptr), MWS_SAMPLE_MANIFEST_DIGEST);
    EXPECT_EQ(mws_upload_plan_operation_count(p.get()), 2u);
    mws_upload_operation op{};
    ASSERT_EQ(mws_upload_plan_operation(p.get(), 1, &op), MWS_OK);
    EXPECT_STREQ(op.source_participant_id, MWS_SAMPLE_P1);
    EXPECT_STREQ(op.source_placement_fragment_id,
                 "sha256:6e784bd2304958a1cff065a922dd3ccf3bc4a543e460c639529c89f7208bc552");
    EXPECT_EQ(mws_upload_plan_operation(p.get(), 5, &op), MWS_INVALID_ARGUMENT);
    // Bindings and placement may be freed; the plan does not borrow them.
    b0.reset();
    b1.reset();
    placement.reset();
    EXPECT_STREQ(mws_upload_plan_manifest_digest(p.get(), nullptr), MWS_SAMPLE_MANIFEST_DIGEST);
}

TEST_F(WithBindings, OptionsAreValidated) {
    mws_upload_options o = fixed();
    o.store_namespace = "";
    plan(&o, MWS_INVALID_ARGUMENT);
    o.store_namespace = nullptr;
    o.key_prefix = "//";
    plan(&o, MWS_INVALID_ARGUMENT);
    o.key_prefix = nullptr;
    o.created_at = "\xff";
    plan(&o, MWS_INVALID_UTF8);
    o.created_at = MWS_SAMPLE_CREATED_AT;
    o.store_namespace = "ns/with space";
    auto p = plan(&o);
    ASSERT_TRUE(p);
    EXPECT_NE(std::string(mws_upload_plan_group_id(p.get(), nullptr)).find("ns%2Fwith%20space"), std::string::npos);
}

TEST_F(WithBindings, IncompleteBindingSetIsRejected) {
    const mws_binding *set[1] = {b0.get()};
    mws_upload_plan *out = nullptr;
    EXPECT_NE(mws_upload_plan_new(placement.get(), set, 1, nullptr, &out), MWS_OK);
    EXPECT_FALSE(last_error().empty());
    EXPECT_NE(mws_upload_plan_new(placement.get(), set, 0, nullptr, &out), MWS_OK);
    const mws_binding *dup[2] = {b0.get(), b0.get()};
    EXPECT_NE(mws_upload_plan_new(placement.get(), dup, 2, nullptr, &out), MWS_OK);
    EXPECT_EQ(out, nullptr);
}
