// GoogleTest suites (label api): the store, writer and load-plan functions of the C ABI
// against hostile inputs (NULLs, bad vtables, stale bindings, tampered manifests).
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
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
    EXPECT_EQ(mws_writer_new(s, nullptr, nullptr, nullptr, nullptr, nullptr), MWS_NULL_ARGUMENT);
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

TEST(Hostile, DeviceMemoryWithoutDeviceEngineRefusedBeforeIo) {
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
        if (mws_stored_manifest_from_store(store.get(), key.c_str(), &out) == MWS_OK) {
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

// ---- registration leases and batch existence -------------------------------------

namespace {

// A MapStore that counts buffer registrations and existence checks; with `batch`, its
// vtable has the optional batch_exists callback.
struct CountingStore : MapStore {
    std::atomic<int> registers{0}, unregisters{0}, exists_calls{0}, batch_exists_calls{0};
    void *ctx() { return static_cast<MapStore *>(this); }
    static CountingStore *self(void *c) { return static_cast<CountingStore *>(static_cast<MapStore *>(c)); }
    static int32_t reg(void *c, uint64_t, uint64_t, uint32_t, uint32_t) {
        self(c)->registers++;
        return 0;
    }
    static int32_t unreg(void *c, uint64_t) {
        self(c)->unregisters++;
        return 0;
    }
    static int32_t exists_counted(void *c, mws_bytes k) {
        self(c)->exists_calls++;
        return MapStore::exists(c, k);
    }
    static int32_t batch_exists(void *c, const mws_bytes *keys, size_t n, int32_t *results) {
        self(c)->batch_exists_calls++;
        for (size_t i = 0; i < n; ++i) results[i] = MapStore::exists(c, keys[i]);
        return 0;
    }
    static mws_store_vtable vtable(bool batch) {
        mws_store_vtable vt = MapStore::vtable();
        vt.register_buffer = &reg;
        vt.unregister_buffer = &unreg;
        vt.exists = &exists_counted;
        vt.batch_exists = batch ? &batch_exists : nullptr;
        return vt;
    }
};

// participant -> source fragment ids of its operations in `plan`
std::map<std::string, std::vector<std::string>> source_ids(const mws::UploadPlan &plan) {
    std::map<std::string, std::vector<std::string>> out;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        mws::UploadOperation op = plan.operation(i);
        out[std::string(op.source_participant_id)].push_back(std::string(op.source_fragment_id));
    }
    return out;
}

// every runtime fragment id of each participant of a HostModel (its ":rt<k>" ids)
std::map<std::string, std::vector<std::string>> all_ids(const HostModel &m) {
    std::map<std::string, std::vector<std::string>> out;
    for (const View &v : m.views) {
        auto &ids = out[v.participant];
        ids.push_back(v.participant + ":rt" + std::to_string(ids.size()));
    }
    return out;
}

}  // namespace

TEST(Lease, UploadAndLoadWithALeaseRegisterNothingPerCall) {
    CountingStore cs;
    mws::Store store = mws::Store::from_vtable(CountingStore::vtable(true), cs.ctx());
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
    mws::UploadPlan plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto ids = source_ids(plan);
    std::vector<mws::RegistrationLease> leases;
    std::vector<mws::Receipts> receipts;
    std::size_t k = 0;
    for (const auto &buf : src.buffers) {
        const mws::Binding &b = src.bindings[k++];
        if (!ids.count(buf.first)) continue;
        leases.push_back(mws::RegistrationLease::create(store, b, ids[buf.first], MWS_LEASE_SOURCE));
        int regs = cs.registers;
        // twice with one lease: nothing registered or unregistered per call
        receipts.push_back(store.upload(plan, src.placement, b, leases.back().io_args()));
        store.upload(plan, src.placement, b, leases.back().io_args());  // a retry
        EXPECT_EQ(cs.registers.load(), regs);
        EXPECT_EQ(cs.unregisters.load(), 0);
    }
    ASSERT_FALSE(leases.empty());
    std::vector<const mws::Receipts *> rp;
    for (const auto &r : receipts) rp.push_back(&r);
    int single = cs.exists_calls;
    mws::StoredManifest m = store.commit(plan, mws::Receipts::concat(rp));
    EXPECT_GT(cs.batch_exists_calls.load(), 0);  // payload checks are batched
    EXPECT_LT(cs.exists_calls.load() - single, static_cast<int>(plan.operation_count()));  // only control keys
    int regs = cs.registers;
    for (const auto &l : leases) l.close();
    EXPECT_EQ(cs.unregisters.load(), regs);

    HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
    mws::LoadPlan lp = mws::LoadPlan::plan(store.load_manifest(std::string(m.key())), dst.placement,
                                           dst.binding_ptrs());
    auto tids = all_ids(dst);
    k = 0;
    int staging = 0, staged_regions = 0;
    for (const auto &buf : dst.buffers) {
        const mws::Binding &b = dst.bindings[k++];
        mws::RegistrationLease lease = mws::RegistrationLease::create(store, b, tids[buf.first], MWS_LEASE_TARGET);
        int before_r = cs.registers, before_u = cs.unregisters;
        mws_load_stats st = store.load(lp, b, lease.io_args());
        EXPECT_GT(st.bytes, 0u);
        store.load(lp, b, lease.io_args());
        staged_regions += static_cast<int>(st.staged_regions);
        // Nothing per call: only the store's restore staging buffer, registered once
        // for every restore of this store (when some region is staged).
        staging += cs.registers.load() - before_r;
        EXPECT_EQ(cs.unregisters.load(), before_u);
        lease.close(MWS_TERMINAL_COMPLETED);
        EXPECT_GT(cs.unregisters.load(), before_u);
    }
    EXPECT_EQ(staging, staged_regions > 0 ? 1 : 0);
    EXPECT_GT(dst.verify(), 0u);
    EXPECT_EQ(store.get() != nullptr, true);
    EXPECT_EQ(mws_store_pending_registration_count(store.get()), 0u);
}

TEST(Lease, CloseTwiceIsANoOpAndAClosedLeaseIsRefused) {
    CountingStore cs;
    mws::Store store = mws::Store::from_vtable(CountingStore::vtable(false), cs.ctx());
    const auto &defs = dense_model();
    HostModel src(placement_json("src", Layout{1, 1, 1, 1}, defs, 1), defs, true, "trainer");
    mws::UploadPlan plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto ids = source_ids(plan);
    ASSERT_EQ(ids.size(), 1u);
    const mws::Binding &b = src.bindings.front();
    mws::RegistrationLease lease = mws::RegistrationLease::create(store, b, ids.begin()->second, MWS_LEASE_SOURCE);
    EXPECT_FALSE(lease.closed());
    lease.close();
    EXPECT_TRUE(lease.closed());
    int unregs = cs.unregisters;
    lease.close(MWS_TERMINAL_ABORTED);  // no-op
    EXPECT_EQ(cs.unregisters.load(), unregs);
    mws_io_args a = lease.io_args().c();
    mws_receipts *out = nullptr;
    EXPECT_EQ(mws_store_upload(store.get(), plan.get(), src.placement.get(), b.get(), &a, &out), MWS_STALE_BINDING);
    EXPECT_NE(std::string(mws_last_error_message()).find("lease is closed"), std::string::npos);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(cs.objects.size(), 0u);  // refused before any I/O
    // invalid state, NULLs, a lease of another store
    EXPECT_EQ(mws_registration_lease_close(lease.get(), 7), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_registration_lease_close(nullptr, 0), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_registration_lease_is_closed(nullptr), -1);
    mws_registration_lease *raw = nullptr;
    const char *none[] = {"no-such-fragment"};
    EXPECT_NE(mws_registration_lease_new(store.get(), b.get(), none, 1, MWS_LEASE_SOURCE, nullptr, nullptr, nullptr,
                                         &raw),
              MWS_OK);
    EXPECT_EQ(mws_registration_lease_new(store.get(), b.get(), none, 0, MWS_LEASE_SOURCE, nullptr, nullptr, nullptr,
                                         &raw),
              MWS_INVALID_ARGUMENT);
    EXPECT_EQ(mws_registration_lease_new(store.get(), b.get(), none, 1, 9, nullptr, nullptr, nullptr, &raw),
              MWS_INVALID_ARGUMENT);
    EXPECT_EQ(raw, nullptr);
    mws::Store other = mws::Store::open_memory();
    mws::RegistrationLease open = mws::RegistrationLease::create(store, b, ids.begin()->second, MWS_LEASE_SOURCE);
    a = open.io_args().c();
    EXPECT_EQ(mws_store_upload(other.get(), plan.get(), src.placement.get(), b.get(), &a, &out), MWS_INVALID_ARGUMENT);
    // freeing an open lease closes it (aborted)
    int before = cs.unregisters;
    { mws::RegistrationLease dropped = std::move(open); }
    EXPECT_GT(cs.unregisters.load(), before);
}

TEST(VtableGrowth, AVtableWithoutBatchExistsStillWorks) {
    // A caller built before batch_exists existed passes the smaller size.
    CountingStore cs;
    mws_store_vtable vt = CountingStore::vtable(true);
    vt.size = offsetof(mws_store_vtable, batch_exists);
    mws::Store store = mws::Store::from_vtable(vt, cs.ctx());
    round_trip(store, Layout{2, 1, 1, 1}, Layout{1, 1, 1, 1}, dense_model());
    EXPECT_EQ(cs.batch_exists_calls.load(), 0);  // not read past `size`
    EXPECT_GT(cs.exists_calls.load(), 0);
    vt.size = offsetof(mws_store_vtable, batch_exists) - 1;
    mws_store *out = nullptr;
    EXPECT_EQ(mws_store_from_vtable(&vt, cs.ctx(), &out), MWS_INVALID_ARGUMENT);
}

TEST(StoreOptions, StagingBytesRestoresTheSameBytes) {
    // Host staging (mws_store_options.staging_bytes) on every constructor: the
    // resharded restores give the same bytes as without it.
    mws::StoreOptions o;
    o.staging_bytes = 1 << 20;
    round_trip(mws::Store::open_memory(o), Layout{4, 1, 1, 1}, Layout{2, 1, 1, 1}, dense_model());
    round_trip(mws::Store::open_memory(o), Layout{1, 1, 4, 1}, Layout{2, 1, 2, 2}, moe_model());
    // A vtable store pays per range: by default (no options) the restore stages spans
    // of short rows and reads far fewer ranges than with staging off, same bytes.
    auto *map = new MapStore();
    {
        mws::StoreOptions never;
        never.staging_bytes = MWS_STAGING_OFF;
        mws::Store plain = mws::Store::from_vtable(MapStore::vtable(), map, never);
        mws::Store staged = mws::Store::from_vtable(MapStore::vtable(), map);
        const auto &defs = model_tensors(2, 64, 4);
        HostModel src(placement_json("src", Layout{4, 1, 2, 1}, defs, 1), defs, true, "trainer");
        std::string key(snapshot(plain, src).key());
        HostModel off(placement_json("dst", Layout{2, 1, 4, 1}, defs, 1), defs, false, "serving");
        mws_load_stats st_off = restore(plain, plain.load_manifest(key), off);
        HostModel on(placement_json("dst", Layout{2, 1, 4, 1}, defs, 1), defs, false, "serving");
        mws_load_stats st_on = restore(staged, staged.load_manifest(key), on);
        EXPECT_GT(off.verify(), 0u);
        EXPECT_EQ(on.verify(), off.verify());
        EXPECT_EQ(on.buffers, off.buffers);
        EXPECT_LT(st_on.ranges * 4, st_off.ranges) << st_on.ranges << " ranges staged vs " << st_off.ranges;
        EXPECT_GT(st_on.staged_regions, 0u);
        EXPECT_EQ(st_on.staged_regions + st_on.direct_regions, st_on.regions);
        EXPECT_EQ(st_off.staged_regions, 0u);
        EXPECT_EQ(st_off.direct_regions, st_off.regions);
    }
    EXPECT_EQ(map->destroyed, 2);
    delete map;
    std::string dir = scratch_dir("staging");
    round_trip(mws::Store::open_dir(dir, o), Layout{4, 1, 1, 1}, Layout{2, 1, 1, 1}, dense_model());
    std::filesystem::remove_all(dir);
    // A zeroed options struct is every default (staging on, 64 MiB).
    mws_store_options zero{};
    mws_store *s = nullptr;
    ASSERT_EQ(mws_store_open_memory(&zero, &s), MWS_OK);
    mws_store_free(s);
}

TEST(StoreOptions, RestoresVerifyIntegrityByDefaultAndCanOptOut) {
    // Issue 29: a zeroed mws_store_options (MWS_VERIFY_DEFAULT) and a default
    // mws::StoreOptions verify restores; a changed payload fails with MWS_INTEGRITY
    // naming the tensor and its box; MWS_VERIFY_OFF (verify_integrity = false)
    // restores it without error; other values are refused.
    auto *map = new MapStore();
    {
        mws::Store store = mws::Store::from_vtable(MapStore::vtable(), map);
        const auto &defs = dense_model();
        HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
        std::string key(snapshot(store, src).key());
        mws::StoredManifest m = store.load_manifest(key);
        mws_stored_fragment_info f = m.fragment(0);
        std::string object(f.object_key, std::strlen(f.object_key));
        std::string tensor(f.tensor_id, std::strlen(f.tensor_id));
        {
            std::lock_guard<std::mutex> g(map->mu);
            map->objects[object][3] ^= 0x01;
        }
        HostModel dst(placement_json("dst", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving");
        try {
            restore(store, store.load_manifest(key), dst);
            FAIL() << "a default restore of a corrupted payload succeeded";
        } catch (const mws::Error &e) {
            EXPECT_EQ(e.status(), MWS_INTEGRITY) << e.what();
            EXPECT_NE(std::string(e.what()).find("payload of tensor " + tensor + " (box offset ["), std::string::npos)
                << e.what();
        }
        mws::StoreOptions off;
        off.verify_integrity = false;
        mws::Store unverified = mws::Store::from_vtable(MapStore::vtable(), map, off);
        HostModel dst2(placement_json("dst", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving");
        mws_load_stats st = restore(unverified, unverified.load_manifest(key), dst2);
        EXPECT_GT(st.bytes, 0u);
    }
    EXPECT_EQ(map->destroyed, 2);
    delete map;
    mws_store_options o{};
    mws_store *s = nullptr;
    o.verify_integrity = MWS_VERIFY_OFF;
    ASSERT_EQ(mws_store_open_memory(&o, &s), MWS_OK);
    mws_store_free(s);
    o.verify_integrity = MWS_VERIFY_ON;
    ASSERT_EQ(mws_store_open_memory(&o, &s), MWS_OK);
    mws_store_free(s);
    o.verify_integrity = 3;
    EXPECT_EQ(mws_store_open_memory(&o, &s), MWS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("MWS_VERIFY_OFF"), std::string::npos);
}

TEST(StoreOptions, SnapshotsWithoutIntegrityRecordRestoreUnverified) {
    // write_integrity = false (MWS_WRITE_INTEGRITY_OFF): the snapshot writes no
    // integrity record (what the reference writes); a verifying store restores it
    // unverified, so even a changed payload goes through; other values are refused.
    auto *map = new MapStore();
    {
        mws::StoreOptions no_record;
        no_record.write_integrity = false;
        mws::Store writer = mws::Store::from_vtable(MapStore::vtable(), map, no_record);
        mws::Store reader = mws::Store::from_vtable(MapStore::vtable(), map);
        const auto &defs = dense_model();
        HostModel src(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
        std::vector<std::string> meta;
        std::string key(snapshot(writer, src, "default", {}, &meta).key());
        ASSERT_EQ(meta.size(), 3u);
        {
            std::lock_guard<std::mutex> g(map->mu);
            EXPECT_EQ(map->objects.count(meta[1]), 0u) << meta[1];  // no integrity record
            EXPECT_EQ(map->objects.count(meta[0]), 1u);             // the decision
            EXPECT_EQ(map->objects.count(meta[2]), 1u);             // the manifest
        }
        HostModel dst(placement_json("dst", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving");
        mws_load_stats st = restore(reader, reader.load_manifest(key), dst);
        EXPECT_GT(st.bytes, 0u);
        dst.verify();
        mws::StoredManifest m = reader.load_manifest(key);
        mws_stored_fragment_info f = m.fragment(0);
        {
            std::lock_guard<std::mutex> g(map->mu);
            map->objects[std::string(f.object_key)][3] ^= 0x01;
        }
        HostModel dst2(placement_json("dst", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving");
        EXPECT_NO_THROW(restore(reader, reader.load_manifest(key), dst2));  // nothing to verify against
    }
    delete map;
    mws_store_options o{};
    mws_store *s = nullptr;
    o.write_integrity = MWS_WRITE_INTEGRITY_OFF;
    ASSERT_EQ(mws_store_open_memory(&o, &s), MWS_OK);
    mws_store_free(s);
    o.write_integrity = MWS_WRITE_INTEGRITY_ON;
    ASSERT_EQ(mws_store_open_memory(&o, &s), MWS_OK);
    mws_store_free(s);
    o.write_integrity = 3;
    EXPECT_EQ(mws_store_open_memory(&o, &s), MWS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("MWS_WRITE_INTEGRITY_OFF"), std::string::npos);
}
