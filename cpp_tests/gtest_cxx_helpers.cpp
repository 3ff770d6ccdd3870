// GoogleTest suites (label api) for the C++ wrapper's helpers of issue 29: placement
// grids and even shards (PlacementBuilder::add_grid / shard), fragment boxes
// (FragmentInfo, Placement::fragments / participants), host bindings with defaults
// (Binding(placement, participant), Binding::add, HostBuffers) and the one-call
// snapshot and restore (Store::snapshot / restore). Each helper with good and bad input.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/stores.hpp"

static_assert(!std::is_copy_constructible_v<mws::HostBuffers>, "HostBuffers owns bindings");
static_assert(std::is_nothrow_move_constructible_v<mws::Binding>, "bindings move without throwing");
static_assert(std::is_move_constructible_v<mws::PlacementBuilder>, "builders move");

namespace {

// Expects `f` to throw mws::Error with `status` and a message containing `needle`.
template <typename F>
void expect_error(F &&f, mws_status status, const std::string &needle) {
    try {
        f();
        ADD_FAILURE() << "expected mws::Error (" << mws::status_name(status) << ") containing: " << needle;
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), status) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

mws::TensorSpec tensor(const std::string &id, std::vector<std::uint64_t> shape, std::vector<mws::Axis> axes,
                       std::uint64_t itemsize = 2) {
    mws::TensorSpec t;
    t.tensor_id = id;
    t.global_shape = std::move(shape);
    t.dtype = itemsize == 4 ? "float32" : "bfloat16";
    t.itemsize = itemsize;
    t.layout_fingerprint = "mws:python:v1";
    t.axes = std::move(axes);
    return t;
}

// A [8, 6] tensor "w" over `tp` ranks split along `dim`.
mws::Placement tp_layout(const std::string &name, std::uint64_t tp, std::uint64_t dim) {
    mws::PlacementBuilder b("helpers-model", "rev-1", 1, name, tp);
    b.add_grid(name);
    b.shard(tensor("w", {8, 6}, {mws::Axis::split(MWS_AXIS_TP, dim)}));
    return b.build();
}

unsigned char value(const mws::FragmentInfo &f, std::uint64_t n) {
    std::vector<std::uint64_t> ij = f.global_position(n / f.itemsize);
    return static_cast<unsigned char>(ij[0] * 31 + ij[1] * 7 + n % f.itemsize);
}

void fill(const mws::HostBuffers &h) {
    for (const auto &buf : h.buffers())
        for (std::size_t n = 0; n < buf.size; ++n) buf.data[n] = value(buf.fragment, n);
}

std::size_t mismatches(const mws::HostBuffers &h) {
    std::size_t wrong = 0;
    for (const auto &buf : h.buffers())
        for (std::size_t n = 0; n < buf.size; ++n) wrong += buf.data[n] != value(buf.fragment, n);
    return wrong;
}

}  // namespace

// ---- PlacementBuilder::add_grid --------------------------------------------------

TEST(Helpers, AddGridNamesEveryRankInRankOrder) {
    mws::PlacementBuilder b("m", "r", 1, "set", /*tp*/ 2, /*pp*/ 2, /*ep*/ 1, /*dp*/ 2);
    std::vector<std::string> ids = b.add_grid("w");
    std::vector<std::string> want = {"w-d0-p0-e0-t0", "w-d0-p0-e0-t1", "w-d0-p1-e0-t0", "w-d0-p1-e0-t1",
                                     "w-d1-p0-e0-t0", "w-d1-p0-e0-t1", "w-d1-p1-e0-t0", "w-d1-p1-e0-t1"};
    EXPECT_EQ(ids, want);
    EXPECT_EQ(mws::PlacementBuilder("m", "r", 1, "set").add_grid(), std::vector<std::string>{"rank-d0-p0-e0-t0"});
    // The ranks are those of the names: a TP split over the grid shards by the t index.
    b.shard(tensor("w", {4, 2}, {mws::Axis::split(MWS_AXIS_TP, 0), mws::Axis::replicated(MWS_AXIS_DP),
                                 mws::Axis::replicated(MWS_AXIS_PP)}));
    mws::Placement p = b.build();
    EXPECT_EQ(p.participant_count(), 8u);
    for (const mws::FragmentInfo &f : p.fragments()) {
        const bool t1 = f.participant_id.back() == '1';
        EXPECT_EQ(f.global_offset, (std::vector<std::uint64_t>{t1 ? 2u : 0u, 0}));
    }
}

TEST(Helpers, AddGridRefusesBadSizesTakenNamesAndEmptyBuilders) {
    expect_error([] { mws::PlacementBuilder("m", "r", 1, "set", 2, 1, 0, 1).add_grid(); }, MWS_INVALID_ARGUMENT,
                 "add_grid: ep_size is 0");
    expect_error([] { mws::PlacementBuilder("m", "r", 1, "set", 1u << 20, 1u << 20, 1u << 20, 1).add_grid(); },
                 MWS_INVALID_ARGUMENT, "more than 2^32 points");
    mws::PlacementBuilder b("m", "r", 1, "set", 2);
    b.add_participant("x-d0-p0-e0-t1", mws_rank{0, 0, 0, 1});
    expect_error([&] { b.add_grid("x"); }, MWS_INVALID_ARGUMENT, "x-d0-p0-e0-t1");
    mws::PlacementBuilder moved = std::move(b);
    expect_error([&] { b.add_grid(); }, MWS_NULL_ARGUMENT, "empty object");  // NOLINT(bugprone-use-after-move)
    expect_error([&] { b.add_participant("p", mws_rank{}); }, MWS_NULL_ARGUMENT, "empty object");
    expect_error([&] { b.shard("w"); }, MWS_NULL_ARGUMENT, "empty object");
    expect_error([&] { (void)b.build(); }, MWS_NULL_ARGUMENT, "");
}

// ---- PlacementBuilder::shard -----------------------------------------------------

TEST(Helpers, ShardSplitsEvenlyAndBuildsPythonsPlacement) {
    // The same calls as in Python:
    //   b = PlacementBuilder("xlang-model", "rev-1", weight_generation=3, placement_set_id="xlang",
    //                        tp_size=2, ep_size=2)
    //   b.add_grid("rank")
    //   b.add_tensor(TensorSpec("experts", (4, 8, 6), "bfloat16", 2, (Split("ep", 0), Split("tp", 2))))
    //   b.add_tensor(TensorSpec("norm", (4,), "float32", 4, (Replicated("tp"), Replicated("ep"))))
    //   b.shard("experts"); b.shard("norm"); b.build().placement_id
    mws::PlacementBuilder b("xlang-model", "rev-1", 3, "xlang", /*tp*/ 2, /*pp*/ 1, /*ep*/ 2);
    b.add_grid("rank");
    b.add_tensor(tensor("experts", {4, 8, 6}, {mws::Axis::split(MWS_AXIS_TP, 2), mws::Axis::split(MWS_AXIS_EP, 0)}));
    std::vector<std::string> ids = b.shard("experts");
    EXPECT_EQ(ids, (std::vector<std::string>{"rank-d0-p0-e0-t0/experts#0", "rank-d0-p0-e0-t1/experts#0",
                                             "rank-d0-p0-e1-t0/experts#0", "rank-d0-p0-e1-t1/experts#0"}));
    b.shard(tensor("norm", {4}, {mws::Axis::replicated(MWS_AXIS_TP), mws::Axis::replicated(MWS_AXIS_EP)}, 4));
    mws::Placement p = b.build();
    EXPECT_EQ(p.id(), "sha256:0f2c0417cfc87c36572b21f18db8bcbbbdb021e2c9120915a6908be1ed4673a2");

    std::vector<mws::FragmentInfo> e1t1 = p.fragments("rank-d0-p0-e1-t1");
    ASSERT_EQ(e1t1.size(), 2u);
    EXPECT_EQ(e1t1[0].placement_fragment_id, "rank-d0-p0-e1-t1/experts#0");
    EXPECT_EQ(e1t1[0].tensor_id, "experts");
    EXPECT_EQ(e1t1[0].global_offset, (std::vector<std::uint64_t>{2, 0, 3}));
    EXPECT_EQ(e1t1[0].local_shape, (std::vector<std::uint64_t>{2, 8, 3}));
    EXPECT_EQ(e1t1[0].nbytes, 2u * 8 * 3 * 2);
    EXPECT_EQ(e1t1[1].local_shape, std::vector<std::uint64_t>{4});  // replicated: whole
    EXPECT_EQ(e1t1[1].itemsize, 4u);

    // shard() builds exactly what the explicit add_fragment calls build.
    mws::PlacementBuilder manual("xlang-model", "rev-1", 3, "xlang", 2, 1, 2);
    for (std::uint64_t ep = 0; ep < 2; ++ep)
        for (std::uint64_t tp = 0; tp < 2; ++tp)
            manual.add_participant("rank-d0-p0-e" + std::to_string(ep) + "-t" + std::to_string(tp),
                                   mws_rank{0, 0, ep, tp});
    manual.add_tensor(tensor("experts", {4, 8, 6}, {mws::Axis::split(MWS_AXIS_EP, 0), mws::Axis::split(MWS_AXIS_TP, 2)}));
    manual.add_tensor(tensor("norm", {4}, {mws::Axis::replicated(MWS_AXIS_TP), mws::Axis::replicated(MWS_AXIS_EP)}, 4));
    for (std::uint64_t ep = 0; ep < 2; ++ep)
        for (std::uint64_t tp = 0; tp < 2; ++tp) {
            std::string pid = "rank-d0-p0-e" + std::to_string(ep) + "-t" + std::to_string(tp);
            manual.add_fragment({pid, "experts", {ep * 2, 0, tp * 3}, {2, 8, 3}, {}, {}, pid + "/experts#0"});
            manual.add_fragment({pid, "norm", {0}, {4}, {}, {}, pid + "/norm#0"});
        }
    EXPECT_EQ(manual.build().id(), p.id());
}

TEST(Helpers, ShardOwnershipAxesTakeTheOwners) {
    mws::PlacementBuilder b("m", "r", 1, "set", /*tp*/ 2, /*pp*/ 2);
    std::vector<std::string> ranks = b.add_grid();
    mws::TensorSpec layer0 = tensor("layer0", {4, 4}, {mws::Axis::split(MWS_AXIS_TP, 1), mws::Axis::ownership(MWS_AXIS_PP)});
    layer0.layer_id = 0;
    b.add_tensor(layer0);
    expect_error([&] { b.shard("layer0"); }, MWS_INVALID_ARGUMENT,
                 "shard: tensor 'layer0': it has an ownership axis (pp, size 2): list the participants that own it");
    // pp = 0 owns layer 0: ranks[0] and ranks[1] (tp 0 and 1).
    EXPECT_EQ(b.shard("layer0", {ranks[1], ranks[0]}),
              (std::vector<std::string>{"rank-d0-p0-e0-t1/layer0#0", "rank-d0-p0-e0-t0/layer0#0"}));
    mws::TensorSpec layer1 = layer0;
    layer1.tensor_id = "layer1";
    layer1.layer_id = 1;
    b.add_tensor(layer1);
    b.shard("layer1", {ranks[2], ranks[3]});
    mws::Placement p = b.build();
    EXPECT_EQ(p.fragments(ranks[3])[0].global_offset, (std::vector<std::uint64_t>{0, 2}));
}

TEST(Helpers, ShardRefusesBadInputBeforeAddingAnything) {
    mws::PlacementBuilder b("m", "r", 1, "set", /*tp*/ 3);
    expect_error([&] { b.shard(tensor("w", {6, 4}, {mws::Axis::split(MWS_AXIS_TP, 0)})); }, MWS_INVALID_ARGUMENT,
                 "shard: tensor 'w': the builder has no participants yet");
    std::vector<std::string> ranks = b.add_grid();
    expect_error([&] { b.shard("nope"); }, MWS_INVALID_ARGUMENT,
                 "shard: unknown tensor 'nope' (add it with add_tensor first)");
    b.add_tensor(tensor("odd", {8, 4}, {mws::Axis::split(MWS_AXIS_TP, 0)}));
    expect_error([&] { b.shard("odd"); }, MWS_INVALID_ARGUMENT,
                 "shard: tensor 'odd': dimension 0 (8) is not divisible by tp_size 3");
    expect_error([&] { b.shard("w", {}); }, MWS_INVALID_ARGUMENT, "the participant list is empty");
    expect_error([&] { b.shard("w", {ranks[0], "ghost"}); }, MWS_INVALID_ARGUMENT, "unknown participant 'ghost'");
    expect_error([&] { b.shard("w", {ranks[0], ranks[0]}); }, MWS_INVALID_ARGUMENT,
                 "participant 'rank-d0-p0-e0-t0' is listed twice");
    b.add_participant("stray", mws_rank{0, 0, 0, 7});
    expect_error([&] { b.shard("w"); }, MWS_INVALID_ARGUMENT,
                 "participant 'stray' has tp rank 7, not below tp_size 3");
    // Nothing was added by the refused calls: sharding the three ranks still works once.
    EXPECT_EQ(b.shard("w", ranks).size(), 3u);
    expect_error([&] { b.shard("w", ranks); }, MWS_INVALID_ARGUMENT,
                 "fragment 'rank-d0-p0-e0-t0/w#0' was added before (shard each tensor once)");
    // A size of 0 (accepted by the constructor, refused by build()) never divides.
    mws::PlacementBuilder zero("m", "r", 1, "set", /*tp*/ 0);
    zero.add_participant("p", mws_rank{});
    zero.add_tensor(tensor("w", {4}, {mws::Axis::split(MWS_AXIS_TP, 0)}));
    expect_error([&] { zero.shard("w"); }, MWS_INVALID_ARGUMENT, "tp_size is 0");
}

// The builder's record and the library's builder stay in step when several threads
// add participants at once; shard then sees every one of them.
TEST(Helpers, BuilderMembersFromSeveralThreads) {
    mws::PlacementBuilder b("m", "r", 1, "set", /*tp*/ 64);
    b.add_tensor(tensor("w", {64, 2}, {mws::Axis::split(MWS_AXIS_TP, 0)}));
    std::vector<std::thread> threads;
    for (std::uint64_t t = 0; t < 4; ++t)
        threads.emplace_back([&b, t] {
            for (std::uint64_t i = 0; i < 16; ++i)
                b.add_participant("p" + std::to_string(t * 16 + i), mws_rank{0, 0, 0, t * 16 + i});
        });
    for (std::thread &t : threads) t.join();
    EXPECT_EQ(b.shard("w").size(), 64u);
    mws::Placement p = b.build();
    EXPECT_EQ(p.participants().size(), 64u);
    EXPECT_EQ(p.fragments("p17")[0].global_offset, (std::vector<std::uint64_t>{17, 0}));
}

// ---- FragmentInfo, Placement::fragments / participants -------------------------------

TEST(Helpers, FragmentBoxesAndGlobalPositions) {
    mws::Placement p = tp_layout("server", 3, 1);  // [8, 6] split in columns of 2
    EXPECT_EQ(p.participants(), (std::vector<std::string>{"server-d0-p0-e0-t0", "server-d0-p0-e0-t1",
                                                          "server-d0-p0-e0-t2"}));
    std::vector<mws::FragmentInfo> all = p.fragments();
    ASSERT_EQ(all.size(), 3u);
    const mws::FragmentInfo &f = all[2];
    EXPECT_EQ(f.participant_id, "server-d0-p0-e0-t2");
    EXPECT_EQ(f.global_offset, (std::vector<std::uint64_t>{0, 4}));
    EXPECT_EQ(f.local_shape, (std::vector<std::uint64_t>{8, 2}));
    EXPECT_EQ(f.element_count(), 16u);
    EXPECT_EQ(f.strides_bytes(), (std::vector<std::uint64_t>{4, 2}));
    EXPECT_EQ(f.global_position(0), (std::vector<std::uint64_t>{0, 4}));
    EXPECT_EQ(f.global_position(3), (std::vector<std::uint64_t>{1, 5}));
    EXPECT_EQ(f.global_position(15), (std::vector<std::uint64_t>{7, 5}));
    expect_error([&] { f.global_position(16); }, MWS_INVALID_ARGUMENT,
                 "element 16 is outside fragment 'server-d0-p0-e0-t2/w#0' (16 elements)");
    mws::FragmentInfo broken = f;
    broken.global_offset.pop_back();
    expect_error([&] { broken.global_position(0); }, MWS_INVALID_ARGUMENT, "differ in length");

    // from(): the C struct, copied; NULL fields refused.
    mws_placement_fragment_info raw = p.fragment(0);
    mws::FragmentInfo copy = mws::FragmentInfo::from(raw);
    EXPECT_EQ(copy.placement_fragment_id, raw.placement_fragment_id);
    EXPECT_EQ(copy.nbytes, raw.nbytes);
    raw.tensor_id = nullptr;
    expect_error([&] { mws::FragmentInfo::from(raw); }, MWS_NULL_ARGUMENT, "NULL field");

    expect_error([&] { p.fragments("nobody"); }, MWS_INVALID_ARGUMENT,
                 "no fragment is held by participant 'nobody'");
    mws::Placement empty(nullptr);
    expect_error([&] { empty.fragments(); }, MWS_NULL_ARGUMENT, "Placement::fragments: empty object");
    expect_error([&] { empty.participants(); }, MWS_NULL_ARGUMENT, "empty object");
}

// ---- Binding(placement, participant) and Binding::add --------------------------------

TEST(Helpers, BindingAddUsesThePlacementAndOneMachineDefaults) {
    mws::Placement p = tp_layout("trainer", 2, 0);  // [8, 6] in two [4, 6] row blocks
    std::vector<unsigned char> a(48), b(64);        // a larger buffer is fine
    std::vector<mws::Binding> bindings;
    bindings.emplace_back(p, "trainer-d0-p0-e0-t0").add("trainer-d0-p0-e0-t0/w#0", a.data(), a.size());
    bindings.emplace_back(p, "trainer-d0-p0-e0-t1", "lease-7").add("trainer-d0-p0-e0-t1/w#0", b.data(), b.size());
    for (const mws::Binding &x : bindings) {
        EXPECT_EQ(x.fragment_count(), 1u);
        x.validate(p);
    }
    mws::UploadPlan plan = mws::plan_upload(p, bindings);
    ASSERT_EQ(plan.operation_count(), 2u);
    mws::UploadOperation op = plan.operation(1);
    EXPECT_EQ(op.source_participant_id, "trainer-d0-p0-e0-t1");
    EXPECT_EQ(op.source_instance_id, "trainer-d0-p0-e0-t1");
    EXPECT_EQ(op.source_lease_id, "lease-7");
    EXPECT_EQ(op.source_lease_generation, 1u);
    EXPECT_EQ(op.source_fragment_id, "trainer-d0-p0-e0-t1:trainer-d0-p0-e0-t1/w#0");
    EXPECT_EQ(op.source_worker_id, "worker-0");
    EXPECT_EQ(op.nbytes, 48u);
    EXPECT_NE(plan.to_json().find("\"endpoint\":\"localhost\""), std::string::npos);
    EXPECT_NE(plan.to_json().find("\"device\":\"cpu\""), std::string::npos);
}

TEST(Helpers, BindingAddRefusesBadInputAndLeavesTheBindingUnchanged) {
    mws::Placement p = tp_layout("trainer", 2, 0);
    const std::string mine = "trainer-d0-p0-e0-t0/w#0";
    std::vector<unsigned char> buf(48);
    expect_error([&] { mws::Binding(p, "ghost"); }, MWS_INVALID_ARGUMENT,
                 "no fragment is held by participant 'ghost'");
    expect_error([&] { mws::Binding(mws::Placement(nullptr), "x"); }, MWS_NULL_ARGUMENT, "empty object");

    mws::Binding b(p, "trainer-d0-p0-e0-t0");
    expect_error([&] { b.add("trainer-d0-p0-e0-t1/w#0", buf.data(), 48); }, MWS_INVALID_ARGUMENT,
                 "fragment 'trainer-d0-p0-e0-t1/w#0' is not held by participant 'trainer-d0-p0-e0-t0'");
    expect_error([&] { b.add(mine, nullptr, 48); }, MWS_INVALID_ARGUMENT, "the address is null");
    expect_error([&] { b.add(mine, buf.data(), 47); }, MWS_INVALID_ARGUMENT,
                 "fragment 'trainer-d0-p0-e0-t0/w#0' needs 48 bytes, the buffer has 47");
    // A buffer that would wrap around the address space: refused by the library.
    expect_error([&] { b.add(mine, reinterpret_cast<void *>(UINTPTR_MAX - 15), 48); }, MWS_INVALID_ARGUMENT, "");
    EXPECT_EQ(b.fragment_count(), 0u);
    b.add(mine, buf.data(), buf.size());
    expect_error([&] { b.add(mine, buf.data(), buf.size()); }, MWS_INVALID_ARGUMENT, "is already bound");
    EXPECT_EQ(b.fragment_count(), 1u);

    mws::BindingOptions o = mws::BindingOptions::for_placement(p);
    o.participant_id = o.instance_id = "trainer-d0-p0-e0-t0";
    o.lease_id = "lease-1";
    mws::Binding plain(o);
    expect_error([&] { plain.add(mine, buf.data(), 48); }, MWS_INVALID_ARGUMENT, "not made from a placement");
    mws::Binding moved = std::move(b);
    expect_error([&] { b.add(mine, buf.data(), 48); }, MWS_NULL_ARGUMENT, "empty object");  // NOLINT
    mws_binding *raw = moved.release();
    expect_error([&] { moved.add(mine, buf.data(), 48); }, MWS_NULL_ARGUMENT, "empty object");
    mws_binding_free(raw);
}

// ---- HostBuffers -------------------------------------------------------------------

TEST(Helpers, HostBuffersBindEveryFragmentAndSurviveMoves) {
    mws::PlacementBuilder pb("m", "r", 1, "set", /*tp*/ 2);
    pb.add_grid("g");
    pb.shard(tensor("a", {4, 2}, {mws::Axis::split(MWS_AXIS_TP, 0)}));
    pb.shard(tensor("b", {3}, {mws::Axis::replicated(MWS_AXIS_TP)}, 4));
    mws::Placement p = pb.build();
    mws::HostBuffers h(p);
    ASSERT_EQ(h.buffers().size(), 4u);
    ASSERT_EQ(h.bindings().size(), 2u);
    std::vector<mws::FragmentInfo> all = p.fragments();
    for (std::size_t i = 0; i < all.size(); ++i) {
        const mws::HostBuffers::Buffer &buf = h.buffers()[i];
        EXPECT_EQ(buf.fragment.placement_fragment_id, all[i].placement_fragment_id);
        EXPECT_EQ(buf.size, all[i].nbytes);
        for (std::size_t n = 0; n < buf.size; ++n) EXPECT_EQ(buf.data[n], 0) << "zeroed";
    }
    for (const mws::Binding &b : h.bindings()) {
        EXPECT_EQ(b.fragment_count(), 2u);
        b.validate(p);
    }
    unsigned char *first = h.buffers()[0].data;
    mws::HostBuffers moved = std::move(h);
    EXPECT_EQ(moved.buffers()[0].data, first);
    mws::UploadPlan plan = mws::plan_upload(p, moved.bindings());
    EXPECT_EQ(plan.operation_count(), 3u);  // both halves of a, one replica of b
    expect_error([] { mws::HostBuffers(mws::Placement(nullptr)); }, MWS_NULL_ARGUMENT, "empty object");
}

// ---- Store::snapshot / restore -----------------------------------------------------

TEST(Helpers, SnapshotAndRestoreRoundTripAcrossLayouts) {
    mws::StoreOptions so;
    so.key_prefix = "ckpt";
    mws::Store store = mws::Store::open_memory(so);
    mws::Placement trainer = tp_layout("trainer", 2, 0);
    mws::HostBuffers src(trainer);
    fill(src);
    int reports = 0;
    mws::IoArgs args;
    args.progress = [&](const mws_progress &) { ++reports; };
    mws::StoredManifest manifest = store.snapshot(trainer, src.bindings(), args);
    EXPECT_GT(reports, 0);
    EXPECT_EQ(manifest.key().substr(0, 5), "ckpt/");  // the store's prefix, not the default

    mws::Placement server = tp_layout("server", 3, 1);
    mws::HostBuffers dst(server);
    mws_load_stats stats = store.restore(manifest, server, dst.bindings());
    EXPECT_EQ(stats.bytes, 8u * 6 * 2);
    EXPECT_EQ(mismatches(dst), 0u);

    mws::HostBuffers again(server);
    store.restore(std::string(manifest.key()), server, again.bindings());
    EXPECT_EQ(mismatches(again), 0u);
    // A subset of the participants restores only theirs.
    std::vector<mws::Binding> one;
    one.emplace_back(server, "server-d0-p0-e0-t1");
    std::vector<unsigned char> mid(32);  // [8, 2] bfloat16
    one.back().add("server-d0-p0-e0-t1/w#0", mid.data(), mid.size());
    EXPECT_EQ(store.restore(manifest, server, one).bytes, 32u);
    const mws::FragmentInfo box = server.fragments("server-d0-p0-e0-t1")[0];
    for (std::size_t n = 0; n < mid.size(); ++n) EXPECT_EQ(mid[n], value(box, n));
}

TEST(Helpers, SnapshotAndRestoreErrors) {
    mws::Store store = mws::Store::open_memory();
    mws::Placement trainer = tp_layout("trainer", 2, 0);
    mws::HostBuffers src(trainer);
    // Bindings that do not cover the placement: refused before any transaction.
    std::vector<mws::Binding> half;
    half.emplace_back(trainer, "trainer-d0-p0-e0-t0");
    std::vector<unsigned char> buf(48);
    half.back().add("trainer-d0-p0-e0-t0/w#0", buf.data(), buf.size());
    EXPECT_THROW(store.snapshot(trainer, half), mws::Error);
    expect_error([&] { store.restore("weights/nothing/here/manifest", trainer, src.bindings()); }, MWS_NOT_FOUND, "");

    mws::StoredManifest manifest = store.snapshot(trainer, src.bindings());
    // Bindings of another placement: refused by the load plan, buffers untouched.
    mws::Placement server = tp_layout("server", 3, 1);
    mws::HostBuffers dst(server);
    for (const auto &b : dst.buffers()) std::memset(b.data, 0xAB, b.size);
    EXPECT_THROW(store.restore(manifest, trainer, dst.bindings()), mws::Error);
    for (const auto &b : dst.buffers())
        for (std::size_t n = 0; n < b.size; ++n) ASSERT_EQ(b.data[n], 0xAB);
    mws::Store empty(nullptr);
    EXPECT_THROW(empty.snapshot(trainer, src.bindings()), mws::Error);
}

// A backend whose payload puts fail: the snapshot's upload fails before the commit
// decision can exist, so it is aborted: no manifest, and no payload left behind.
TEST(Helpers, FailedSnapshotIsAborted) {
    mwstest::MapStore map;
    mws_store_vtable vt = mwstest::MapStore::vtable();
    vt.batch_put_from = [](void *, const mws_put_item *, size_t n, uint32_t, int32_t *results) -> int32_t {
        for (size_t i = 0; i < n; ++i) results[i] = -600;
        return 0;
    };
    mws::Store store = mws::Store::from_vtable(vt, &map);
    mws::Placement trainer = tp_layout("trainer", 2, 0);
    mws::HostBuffers src(trainer);
    EXPECT_THROW(store.snapshot(trainer, src.bindings()), mws::Error);
    std::lock_guard<std::mutex> g(map.mu);
    EXPECT_EQ(map.objects.size(), 1u);  // the abort decision
    for (const auto &kv : map.objects) {
        EXPECT_EQ(kv.first.find("manifest"), std::string::npos) << kv.first;
        EXPECT_NE(kv.second.find("abort"), std::string::npos) << kv.first << ": only the abort decision stays";
    }
}
