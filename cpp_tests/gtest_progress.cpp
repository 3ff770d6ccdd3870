// GoogleTest suite (label api): progress callbacks through the C ABI (mws_io_args
// progress for uploads and restores, mws_writer_set_progress for snapshots) and the
// C++ wrapper (IoArgs::progress, Writer::set_progress as std::function).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"
#include "support/stores.hpp"

using namespace mwsmodel;
using namespace mwstest;

namespace {

/// Every report of one or more calls, checked as it arrives.
struct Recorder {
    std::vector<mws_progress> reports;
    bool ok = true;  // within totals, monotonic inside a call
    void add(const mws_progress &p) {
        if (p.bytes_done > p.bytes_total || p.items_done > p.items_total) ok = false;
        if (!reports.empty() && p.bytes_done != 0) {
            const mws_progress &q = reports.back();
            if (p.bytes_done < q.bytes_done || p.items_done < q.items_done || p.bytes_total != q.bytes_total) ok = false;
        }
        reports.push_back(p);
    }
    /// Sum of the totals of every call (a call starts with a 0-done report).
    std::uint64_t call_bytes() const {
        std::uint64_t n = 0;
        for (const auto &p : reports)
            if (p.bytes_done == 0) n += p.bytes_total;
        return n;
    }
    std::size_t calls() const {
        std::size_t n = 0;
        for (const auto &p : reports) n += p.bytes_done == 0 ? 1 : 0;
        return n;
    }
};

extern "C" void on_progress(void *ctx, const mws_progress *p) { static_cast<Recorder *>(ctx)->add(*p); }

}  // namespace

TEST(Progress, UploadAndRestoreReportThroughMwsIoArgs) {
    mws::Store store = mws::Store::open_memory();
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    mws::UploadPlan plan = mws::plan_upload(src.placement, src.binding_ptrs());
    std::uint64_t plan_bytes = 0;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) plan_bytes += plan.operation(i).nbytes;
    Recorder up;
    mws_io_args a{};
    a.progress = &on_progress;
    a.progress_ctx = &up;
    std::vector<mws::Receipts> receipts;
    for (const auto &b : src.bindings) {
        mws_receipts *out = nullptr;
        ASSERT_EQ(mws_store_upload(store.get(), plan.get(), src.placement.get(), b.get(), &a, &out), MWS_OK)
            << mws_last_error_message();
        receipts.emplace_back(out);
    }
    ASSERT_TRUE(up.ok);
    ASSERT_FALSE(up.reports.empty());
    EXPECT_EQ(up.calls(), src.bindings.size());
    EXPECT_EQ(up.call_bytes(), plan_bytes);
    std::uint64_t objects = 0;
    for (const auto &p : up.reports) {
        EXPECT_EQ(p.phase, MWS_PROGRESS_UPLOAD);
        if (p.bytes_done == 0) objects += p.items_total;
    }
    EXPECT_EQ(objects, plan.operation_count());
    EXPECT_EQ(up.reports.back().bytes_done, up.reports.back().bytes_total);
    EXPECT_EQ(up.reports.back().items_done, up.reports.back().items_total);

    std::vector<const mws::Receipts *> rp;
    for (const auto &r : receipts) rp.push_back(&r);
    mws::StoredManifest m = store.commit(plan, mws::Receipts::concat(rp));
    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws::LoadPlan lp = mws::LoadPlan::plan(store.load_manifest(std::string(m.key())), dst.placement,
                                           dst.binding_ptrs());
    Recorder down;
    a.progress_ctx = &down;
    std::uint64_t regions = 0;
    for (const auto &b : dst.bindings) {
        mws_load_stats st{};
        ASSERT_EQ(mws_store_load(store.get(), lp.get(), b.get(), &a, &st), MWS_OK) << mws_last_error_message();
        regions += st.regions;
        ASSERT_FALSE(down.reports.empty());
        EXPECT_EQ(down.reports.back().bytes_done, st.bytes);
        EXPECT_EQ(down.reports.back().items_done, st.regions);
    }
    EXPECT_TRUE(down.ok);
    EXPECT_EQ(down.call_bytes(), lp.total_bytes());
    for (const auto &p : down.reports) EXPECT_EQ(p.phase, MWS_PROGRESS_RESTORE);
    EXPECT_EQ(regions, lp.region_count());
    EXPECT_GT(dst.verify(), 0u);
}

TEST(Progress, CxxCallbacksForSnapshotsAndRestores) {
    mws::Store store = mws::Store::open_memory();
    const auto &defs = moe_model();
    HostModel src(placement_json("src", Layout{1, 1, 4, 1}, defs, 1), defs, true, "trainer");
    Recorder snap;
    mws::StoredManifest m = snapshot(store, src, "default", [&snap](const mws_progress &p) { snap.add(p); });
    ASSERT_FALSE(snap.reports.empty());
    EXPECT_TRUE(snap.ok);
    // One set of totals for the whole snapshot: every object of the plan.
    const mws_progress &last = snap.reports.back();
    EXPECT_EQ(last.bytes_done, last.bytes_total);
    EXPECT_EQ(last.items_total, m.fragment_count());
    for (const auto &p : snap.reports) {
        EXPECT_EQ(p.bytes_total, last.bytes_total);
        EXPECT_EQ(p.phase, MWS_PROGRESS_UPLOAD);
    }

    HostModel dst(placement_json("dst", Layout{2, 1, 2, 2}, defs, 1), defs, false, "serving");
    Recorder down;
    mws::IoArgs args;
    args.progress = [&down](const mws_progress &p) {
        down.add(p);
        throw std::runtime_error("swallowed: never crosses the C ABI");
    };
    mws_load_stats st = restore(store, m, dst, nullptr, args);
    EXPECT_TRUE(down.ok);
    EXPECT_EQ(down.call_bytes(), st.bytes);
    EXPECT_GT(dst.verify(), 0u);
}

TEST(Progress, NullCallbackAndNullWriterAreHandled) {
    EXPECT_EQ(mws_writer_set_progress(nullptr, &on_progress, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_loader_set_progress(nullptr, &on_progress, nullptr), MWS_NULL_ARGUMENT);
    // A zeroed mws_io_args (no progress) restores as before.
    mws::Store store = mws::Store::open_memory();
    round_trip(store, Layout{2, 1, 1, 1}, Layout{1, 1, 1, 1}, dense_model());
}

// Writer::release() hands out a handle that outlives the Writer and the std::function
// it owns: the callback must not stay set on the released handle (it would dangle).
TEST(Progress, WriterReleaseRemovesItsProgressFunction) {
    mws::Store store = mws::Store::open_memory();
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    HostAdapter adapter(src);
    mws_snapshot_adapter_vtable vt = HostAdapter::vtable();
    std::map<std::string, std::string> tensor_of;  // placement fragment id -> tensor
    for (const View &v : src.views) tensor_of[v.pfid] = v.tensor;

    std::size_t reports = 0;
    mws_writer *raw = nullptr;
    std::vector<std::pair<std::string, std::string>> rest;  // (tensor, participant) written after release
    {
        mws::Writer w = mws::Writer::begin(store, std::string(src.placement.resource_id()),
                                           std::string(src.placement.revision()), src.placement.weight_generation(),
                                           vt, &adapter);
        w.set_progress([&reports](const mws_progress &) { ++reports; });
        mws::UploadPlan plan = w.upload_plan();
        std::set<std::pair<std::string, std::string>> seen;
        std::string first;
        for (std::size_t i = 0; i < plan.operation_count(); ++i) {
            mws::UploadOperation op = plan.operation(i);
            std::string participant(op.source_participant_id);
            std::pair<std::string, std::string> tp{tensor_of.at(std::string(op.source_placement_fragment_id)),
                                                   participant};
            if (!seen.insert(tp).second) continue;
            if (first.empty()) first = participant;
            if (participant == first) {
                w.write_tensor(tp.first, const_cast<char *>(tp.second.c_str()));  // uploads `first`
            } else {
                rest.push_back(tp);
            }
        }
        ASSERT_GT(reports, 0u);  // the callback works while the Writer owns it
        ASSERT_FALSE(rest.empty());
        raw = w.release();
        ASSERT_NE(raw, nullptr);
        EXPECT_EQ(w.get(), nullptr);
    }  // the Writer (and the function it owned) is gone; the handle lives on
    const std::size_t before = reports;
    for (const auto &tp : rest) {
        mws_receipts *r = nullptr;
        ASSERT_EQ(mws_writer_write_tensor(raw, tp.first.c_str(), const_cast<char *>(tp.second.c_str()), &r), MWS_OK)
            << mws_last_error_message();
        mws_receipts_free(r);
    }
    EXPECT_EQ(reports, before);  // uploads through the released handle did not call the destroyed function
    mws_stored_manifest *m = nullptr;
    ASSERT_EQ(mws_writer_commit(raw, &m), MWS_OK) << mws_last_error_message();
    mws::StoredManifest manifest(m);
    EXPECT_GT(manifest.fragment_count(), 0u);
    mws_writer_free(raw);
}

// Writer::defer_uploads(): every participant uploaded at commit, in one upload call;
// the snapshot restores every byte and its progress covers the whole plan; the C
// function refuses values other than 0 and 1.
TEST(Progress, WriterWithDeferredUploadsUploadsAtCommit) {
    mws::Store store = mws::Store::open_memory();
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 2}, defs, 1), defs, true, "trainer");
    std::uint64_t last_done = 0, total = 0;
    mws::StoredManifest m = snapshot(
        store, src, "default",
        [&](const mws_progress &p) {
            last_done = p.bytes_done;
            total = p.bytes_total;
        },
        nullptr, true);
    EXPECT_GT(total, 0u);
    EXPECT_EQ(last_done, total);
    HostModel dst(placement_json("dst", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving");
    restore(store, store.load_manifest(std::string(m.key())), dst);
    dst.verify();

    HostModel src2(placement_json("src", Layout{2, 1, 1, 1}, defs, 2), defs, true, "trainer");
    HostAdapter adapter(src2);
    mws_snapshot_adapter_vtable vt = HostAdapter::vtable();
    mws::Writer w = mws::Writer::begin(store, std::string(src2.placement.resource_id()),
                                       std::string(src2.placement.revision()), src2.placement.weight_generation(),
                                       vt, &adapter);
    mws_writer *raw = w.release();
    EXPECT_EQ(mws_writer_defer_uploads(raw, 2), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_writer_defer_uploads(raw, 1), MWS_OK);
    EXPECT_EQ(mws_writer_abort(raw), MWS_OK);
    EXPECT_EQ(mws_writer_defer_uploads(raw, 0), MWS_CONFLICT);
    mws_writer_free(raw);
}

// Store::load_many (mws_store_load_many): every binding in one call restores every
// byte with the totals of the loads in turn; a participant given twice is refused.
TEST(Progress, StoreLoadManyRestoresEveryBinding) {
    mws::Store store = mws::Store::open_memory();
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    mws::StoredManifest m = snapshot(store, src);
    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws_load_stats in_turn = restore(store, m, dst);
    HostModel dst2(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws::LoadPlan plan = mws::LoadPlan::plan(m, dst2.placement, dst2.binding_ptrs());
    std::vector<const mws::Binding *> bs;
    for (const auto &b : dst2.bindings) bs.push_back(&b);
    mws_load_stats st = store.load_many(plan, bs);
    dst2.verify();
    EXPECT_EQ(st.bytes, in_turn.bytes);
    EXPECT_EQ(st.regions, in_turn.regions);
    std::vector<const mws::Binding *> twice{bs[0], bs[0]};
    try {
        store.load_many(plan, twice);
        FAIL() << "a participant given twice was accepted";
    } catch (const mws::Error &e) {
        EXPECT_EQ(e.status(), MWS_INVALID_ARGUMENT) << e.what();
    }
}
