// GoogleTest suites (label int): snapshot + restore round trips through the C ABI and
// the C++ wrapper, on the memory, directory and vtable stores.
#include <gtest/gtest.h>

#include <atomic>
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

TEST(Snapshot, TrainerLayoutIntoDirectoryStoreRawBytesMatch) {
    std::string dir = scratch_dir("raw");
    mws::Store store = mws::Store::open_dir(dir);
    const auto &defs = moe_model();
    HostModel src(placement_json("trainer", Layout{4, 2, 2, 2}, defs, 1), defs, true, "trainer");
    mws::StoredManifest m = snapshot(store, src);
    EXPECT_EQ(m.tensor_count(), defs.size());
    ASSERT_GT(m.fragment_count(), 0u);
    EXPECT_TRUE(store.exists(std::string(m.key())));
    // Every stored fragment's bytes, read back raw, equal the expected box.
    std::map<std::string, std::vector<std::uint64_t>> shapes;
    for (const auto &d : defs) shapes[d.id] = d.shape;
    for (std::size_t i = 0; i < m.fragment_count(); ++i) {
        mws_stored_fragment_info f = m.fragment(i);
        std::vector<unsigned char> obj = store.get_object(f.object_key);
        ASSERT_GE(obj.size(), f.object_offset + f.nbytes);
        std::vector<unsigned char> want(f.nbytes);
        expected_bytes(f.tensor_id, shapes[f.tensor_id], 2, f.global_offset, f.local_shape, f.ndim, want.data());
        ASSERT_EQ(0, std::memcmp(obj.data() + f.object_offset, want.data(), f.nbytes)) << f.tensor_id;
    }
    // Round trip through JSON.
    auto again = mws::StoredManifest::from_json(m.to_json());
    EXPECT_EQ(again.digest(), m.digest());
    std::filesystem::remove_all(dir);
}

TEST(Restore, TrainerToServingThroughDirectoryStore) {
    std::string dir = scratch_dir("serve");
    mws::Store store = mws::Store::open_dir(dir);
    round_trip(store, Layout{4, 2, 2, 2}, Layout{2, 1, 4, 1}, moe_model());
    std::filesystem::remove_all(dir);
}

TEST(Restore, Tp4ToTp2) { round_trip(mws::Store::open_memory(), Layout{4, 1, 1, 1}, Layout{2, 1, 1, 1}, dense_model()); }
TEST(Restore, Tp2ToTp8) { round_trip(mws::Store::open_memory(), Layout{2, 1, 1, 1}, Layout{8, 1, 1, 1}, dense_model()); }
TEST(Restore, PipelineRestaging) {
    round_trip(mws::Store::open_memory(), Layout{1, 2, 1, 1}, Layout{2, 4, 1, 1}, model_tensors(4, 32, 0));
}
TEST(Restore, ExpertRegrouping) { round_trip(mws::Store::open_memory(), Layout{1, 1, 4, 1}, Layout{2, 1, 2, 2}, moe_model()); }

TEST(Restore, SplitDimensionChangeAndHighRankTensors) {
    // The same tensors split on dim 0 in the source and dim 1 in the target; 3-D and 4-D.
    std::vector<TensorDef> a, b;
    auto def = [](const std::string &id, std::vector<std::uint64_t> shape, int split) {
        TensorDef d;
        d.id = id;
        d.shape = std::move(shape);
        d.tp_split = split;
        return d;
    };
    a = {def("w2d", {16, 24}, 0), def("w3d", {8, 12, 16}, 0), def("w4d", {4, 8, 6, 8}, 1)};
    b = {def("w2d", {16, 24}, 1), def("w3d", {8, 12, 16}, 2), def("w4d", {4, 8, 6, 8}, 3)};
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("a", Layout{4, 1, 1, 1}, a, 1), a, true, "trainer");
    auto m = snapshot(store, src);
    HostModel dst(placement_json("b", Layout{2, 1, 1, 1}, b, 1), b, false, "serving");
    restore(store, m, dst);
    EXPECT_GT(dst.verify(), 0u);
}

TEST(Restore, SeveralWorkersPerParticipant) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    auto m = snapshot(store, src);
    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    dst.workers_per_participant = 2;
    dst.make_bindings("serving", 1);
    mws::LoadPlan plan = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
    EXPECT_EQ(plan.participant_count(), 4u);
    for (const auto &b : dst.bindings) {
        (void)b;
    }
    // Worker by worker: each call loads only the fragments of one worker.
    for (std::size_t i = 0; i < dst.bindings.size(); ++i) {
        std::string participant(plan.participant(i));
        for (int w = 0; w < 2; ++w) {
            mws::IoArgs args;
            args.worker_id = participant + "/w" + std::to_string(w);
            store.load(plan, dst.bindings[i], args);
        }
    }
    EXPECT_GT(dst.verify(), 0u);
}

TEST(Restore, VtableStoreWholeCycle) {
    auto *map = new MapStore();
    mws_store_vtable vt = MapStore::vtable();
    {
        mws::Store store = mws::Store::from_vtable(vt, map);
        round_trip(store, Layout{4, 2, 2, 2}, Layout{2, 1, 4, 1}, moe_model());
        EXPECT_GT(map->objects.size(), 2u);
    }
    EXPECT_EQ(map->destroyed, 1);
    delete map;
}

// A MapStore that answers the optional batch_get_size (after get_cost) and counts the
// size queries of both kinds.
struct SizedMapStore : MapStore {
    std::atomic<int> batch_calls{0};
    std::atomic<int> batch_keys{0};
    std::atomic<int> single_calls{0};
    static SizedMapStore *of(void *c) { return static_cast<SizedMapStore *>(static_cast<MapStore *>(c)); }
    static int64_t counted_get_size(void *c, mws_bytes k) {
        of(c)->single_calls++;
        return MapStore::get_size(c, k);
    }
    static int32_t batch_get_size(void *c, const mws_bytes *keys, size_t n, int64_t *sizes) {
        of(c)->batch_calls++;
        of(c)->batch_keys += static_cast<int>(n);
        for (size_t i = 0; i < n; ++i) sizes[i] = MapStore::get_size(c, keys[i]);
        return 0;
    }
};

TEST(Restore, VtableBatchGetSizeAnswersTheRestoreSizeChecks) {
    auto *map = new SizedMapStore();
    mws_store_vtable vt = MapStore::vtable();
    vt.get_size = &SizedMapStore::counted_get_size;
    vt.batch_get_size = &SizedMapStore::batch_get_size;
    {
        mws::Store store = mws::Store::from_vtable(vt, static_cast<MapStore *>(map));
        round_trip(store, Layout{4, 2, 2, 2}, Layout{2, 1, 4, 1}, moe_model());
    }
    // One call per participant load (a handful), covering every payload it reads;
    // no per-key get_size for them.
    EXPECT_GT(map->batch_calls.load(), 0);
    EXPECT_GE(map->batch_keys.load(), map->batch_calls.load());
    EXPECT_EQ(map->single_calls.load(), 0);
    EXPECT_EQ(map->destroyed, 1);
    delete map;
}

TEST(Transaction, CoordinatorPlansRanksUploadCoordinatorCommits) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    std::string wire(plan.to_json());
    std::vector<std::string> receipts_wire;
    for (const auto &b : src.bindings) {
        auto rank_plan = mws::UploadPlan::from_json(wire);
        receipts_wire.emplace_back(store.upload(rank_plan, src.placement, b).to_json());
    }
    std::vector<mws::Receipts> parts;
    for (const auto &w : receipts_wire) parts.push_back(mws::Receipts::from_json(w));
    std::vector<const mws::Receipts *> ptrs;
    for (const auto &r : parts) ptrs.push_back(&r);
    auto all = mws::Receipts::concat(ptrs);
    EXPECT_EQ(all.size(), plan.operation_count());
    int may_exist = -1;
    auto m = store.commit(plan, all, &may_exist);
    EXPECT_EQ(may_exist, 1);
    EXPECT_EQ(m.digest(), plan.manifest_digest());
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_COMMIT);
    store.finalize_upload(plan);
    EXPECT_THROW(store.abort_upload(plan), mws::Error);
}

// ---- aliases: tied embeddings sharing one buffer -------------------------------------

namespace {

/// Offsets of the views of `tensor` in `m`, by participant.
std::map<std::string, std::size_t> offsets_of(const HostModel &m, const std::string &tensor) {
    std::map<std::string, std::size_t> out;
    for (const View &v : m.views)
        if (v.tensor == tensor) out[v.participant] = v.offset;
    return out;
}

/// Snapshot of tied embeddings (one buffer) and restore into `to`; the target binds
/// the tied pair to one buffer (`share`) or to two.
void tied_round_trip(const mws::Store &store, Layout from, Layout to, bool share, std::uint64_t experts = 0) {
    const std::vector<TensorDef> defs = tied_model(experts);
    HostModel src(placement_json("tied-src", from, defs, 1), defs, true, "trainer");
    // The trainer really binds both tensors to the same bytes.
    ASSERT_EQ(offsets_of(src, "lm_head.weight"), offsets_of(src, "model.embed_tokens.weight"));
    mws::StoredManifest m = snapshot(store, src);
    EXPECT_EQ(m.tensor_count(), defs.size());
    // Two stored fragments per box (one per alias member), with equal payload bytes.
    std::map<std::string, std::vector<std::uint64_t>> shapes;
    for (const auto &d : defs) shapes[d.id] = d.shape;
    std::map<std::string, std::string> payload;  // tensor|offset -> bytes
    for (std::size_t i = 0; i < m.fragment_count(); ++i) {
        mws_stored_fragment_info f = m.fragment(i);
        std::string tensor(f.tensor_id);
        if (tensor != "lm_head.weight" && tensor != "model.embed_tokens.weight") continue;
        std::vector<unsigned char> obj = store.get_object(f.object_key);
        ASSERT_GE(obj.size(), f.object_offset + f.nbytes);
        std::string box = u64_array(std::vector<std::uint64_t>(f.global_offset, f.global_offset + f.ndim));
        payload[tensor + "|" + box] = std::string(reinterpret_cast<const char *>(obj.data()) + f.object_offset, f.nbytes);
    }
    std::size_t pairs = 0;
    for (const auto &p : payload) {
        if (p.first.rfind("lm_head.weight|", 0) != 0) continue;
        auto twin = payload.find("model.embed_tokens.weight|" + p.first.substr(p.first.find('|') + 1));
        ASSERT_NE(twin, payload.end()) << p.first;
        EXPECT_EQ(twin->second, p.second) << p.first;
        ++pairs;
    }
    EXPECT_EQ(pairs * 2, payload.size());
    EXPECT_EQ(pairs, from.tp);

    HostModel dst(placement_json("tied-dst", to, defs, 1), defs, false, "serving", 1, share);
    if (share) {
        ASSERT_EQ(offsets_of(dst, "lm_head.weight"), offsets_of(dst, "model.embed_tokens.weight"));
    } else {
        ASSERT_NE(offsets_of(dst, "lm_head.weight"), offsets_of(dst, "model.embed_tokens.weight"));
    }
    std::size_t regions = 0;
    mws_load_stats st = restore(store, store.load_manifest(std::string(m.key())), dst, &regions);
    EXPECT_GT(regions, 0u);
    EXPECT_GT(st.bytes, 0u);
    EXPECT_GT(dst.verify(), 0u);  // both members of every tied pair, every byte
}

}  // namespace

TEST(Alias, TiedEmbeddingsSharedBufferIntoSharedBuffer) {
    std::string dir = scratch_dir("tied");
    mws::Store store = mws::Store::open_dir(dir);
    tied_round_trip(store, Layout{4, 1, 1, 1}, Layout{2, 1, 1, 1}, true);
    std::filesystem::remove_all(dir);
}

TEST(Alias, TiedEmbeddingsSharedBufferIntoSeparateBuffers) {
    tied_round_trip(mws::Store::open_memory(), Layout{2, 1, 1, 1}, Layout{4, 1, 1, 1}, false);
}

TEST(Alias, TiedEmbeddingsTrainerToServingMoe) {
    tied_round_trip(mws::Store::open_memory(), Layout{4, 2, 2, 2}, Layout{2, 1, 4, 1}, true, 4);
}

// ---- allocation guards: every pin released once, with its terminal state -----------

namespace {

struct RecordingGuard {
    std::mutex mu;
    std::uint64_t next = 0;
    std::map<std::uint64_t, std::string> pinned;  // token -> participant
    std::vector<std::uint32_t> released;          // mws_terminal_state values
    bool refuse = false;

    static int32_t acquire(void *ctx, const char *transfer_id, const char *participant_id,
                           const char *const *fragment_ids, size_t count, mws_binding **observed,
                           uint64_t *token) noexcept {
        auto *g = static_cast<RecordingGuard *>(ctx);
        std::lock_guard<std::mutex> l(g->mu);
        if (g->refuse || transfer_id == nullptr || fragment_ids == nullptr || count == 0) return -1;
        *observed = nullptr;  // "exactly the binding that was passed"
        *token = ++g->next;
        g->pinned[*token] = participant_id;
        return 0;
    }
    static int32_t release(void *ctx, uint64_t token, uint32_t state) noexcept {
        auto *g = static_cast<RecordingGuard *>(ctx);
        std::lock_guard<std::mutex> l(g->mu);
        if (g->pinned.erase(token) != 1) return -1;
        g->released.push_back(state);
        return 0;
    }
    static mws_guard_vtable vtable() {
        mws_guard_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_GUARD_VTABLE_VERSION;
        vt.acquire = &acquire;
        vt.release = &release;
        return vt;
    }
};

int32_t failing_register(void *, uint64_t, uint64_t, uint32_t, uint32_t) { return -1; }

}  // namespace

TEST(Guard, UploadAndLoadPinsAreReleasedCompleted) {
    const auto &defs = dense_model();
    mws::Store store = mws::Store::open_memory();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    RecordingGuard guard;
    mws_guard_vtable vt = RecordingGuard::vtable();
    mws::IoArgs args;
    args.guard = &vt;
    args.guard_ctx = &guard;
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    std::vector<mws::Receipts> parts;
    for (const auto &b : src.bindings) parts.push_back(store.upload(plan, src.placement, b, args));
    std::vector<const mws::Receipts *> ptrs;
    for (const auto &r : parts) ptrs.push_back(&r);
    auto m = store.commit(plan, mws::Receipts::concat(ptrs));
    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws::LoadPlan lp = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
    for (const auto &b : dst.bindings) store.load(lp, b, args);
    EXPECT_GT(dst.verify(), 0u);
    EXPECT_TRUE(guard.pinned.empty());
    ASSERT_EQ(guard.released.size(), src.bindings.size() + dst.bindings.size());
    for (std::uint32_t s : guard.released) EXPECT_EQ(s, static_cast<std::uint32_t>(MWS_TERMINAL_COMPLETED));
}

TEST(Guard, RefusedPinAndFailedRegistration) {
    const auto &defs = dense_model();
    MapStore map, map2;  // outlive the stores that use them
    mws_store_vtable svt = MapStore::vtable();
    mws::Store good = mws::Store::from_vtable(svt, &map);
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    auto m = snapshot(good, src);
    HostModel dst(placement_json("dst", Layout{2, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws::LoadPlan lp = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
    RecordingGuard guard;
    mws_guard_vtable gvt = RecordingGuard::vtable();
    mws::IoArgs args;
    args.guard = &gvt;
    args.guard_ctx = &guard;
    // The guard refuses: the load fails before any I/O, nothing to release.
    guard.refuse = true;
    try {
        good.load(lp, dst.bindings[0], args);
        FAIL() << "expected MWS_STORE";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_STORE) << e.what();
    }
    EXPECT_TRUE(guard.released.empty());
    // Registration fails after the pin: released as aborted (no I/O was submitted).
    guard.refuse = false;
    map2.objects = map.objects;
    mws_store_vtable bad = MapStore::vtable();
    bad.register_buffer = &failing_register;
    mws::Store store = mws::Store::from_vtable(bad, &map2);
    EXPECT_THROW(store.load(lp, dst.bindings[0], args), mws::Error);
    EXPECT_TRUE(guard.pinned.empty());
    ASSERT_EQ(guard.released.size(), 1u);
    EXPECT_EQ(guard.released[0], static_cast<std::uint32_t>(MWS_TERMINAL_ABORTED));
    for (const auto &b : dst.buffers)
        for (unsigned char c : b.second) ASSERT_EQ(c, 0xA5);
}
