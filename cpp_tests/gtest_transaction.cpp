// GoogleTest suite (label api): the upload transaction handle (mws_transaction) and its
// C++ wrapper mws::Transaction: happy path, receipts merged from other "processes",
// abort, finalize, free without abort, NULL arguments, use after commit.
#include <gtest/gtest.h>

#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"
#include "support/stores.hpp"

using namespace mwsmodel;
using namespace mwstest;

namespace {

HostModel source_model() {
    const auto &defs = dense_model();
    return HostModel(placement_json("src", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
}

mws_status status_of(const std::function<void()> &f) {
    try {
        f();
    } catch (const mws::Error &e) {
        return e.status();
    }
    return MWS_OK;
}

bool every_payload_exists(const mws::Store &store, const mws::UploadPlan &plan, bool want) {
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        if (store.exists(std::string(plan.operation(i).object_key)) != want) return false;
    }
    return true;
}

}  // namespace

TEST(Transaction, HappyPathKeepsStoreAndPlanAlive) {
    auto *map = new MapStore();
    mws_store_vtable vt = MapStore::vtable();
    HostModel src = source_model();
    std::string digest;
    std::string key;
    std::size_t operations = 0;
    std::optional<mws::Transaction> tx;
    {
        mws::Store store = mws::Store::from_vtable(vt, map);
        mws::UploadPlan plan = mws::plan_upload(src.placement, src.binding_ptrs());
        digest = plan.manifest_digest();
        key = plan.manifest_key();
        operations = plan.operation_count();
        tx.emplace(mws::Transaction::begin(store, plan));
    }  // the store and plan objects are gone; the transaction keeps what it needs
    EXPECT_EQ(map->destroyed, 0);
    EXPECT_EQ(tx->state(), MWS_TRANSACTION_OPEN);
    EXPECT_FALSE(tx->commit_decision_may_exist());
    for (const auto &b : src.bindings) tx->upload(src.placement, b);
    EXPECT_EQ(tx->receipts().size(), operations);
    mws::StoredManifest m = tx->commit();
    EXPECT_EQ(m.digest(), digest);
    EXPECT_EQ(m.key(), key);
    EXPECT_EQ(tx->state(), MWS_TRANSACTION_COMMITTED);
    EXPECT_TRUE(tx->commit_decision_may_exist());
    tx.reset();
    EXPECT_EQ(map->destroyed, 1);

    // The published snapshot restores into another layout.
    {
        mws::Store store = mws::Store::from_vtable(vt, map);
        const auto &defs = dense_model();
        HostModel dst(placement_json("dst", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
        mws_load_stats st = restore(store, store.load_manifest(key), dst);
        EXPECT_GT(st.bytes, 0u);
        EXPECT_GT(dst.verify(), 0u);
    }
    EXPECT_EQ(map->destroyed, 2);
    delete map;
}

TEST(Transaction, ReceiptsOfOtherProcessesAreMerged) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    ASSERT_GE(src.bindings.size(), 2u);
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    std::string wire(plan.to_json());

    // The coordinator uploads participant 0 itself; every other participant is
    // uploaded by a "rank" with its own transaction over the plan sent as JSON.
    auto coordinator = mws::Transaction::begin(store, mws::UploadPlan::from_json(wire));
    coordinator.upload(src.placement, src.bindings[0]);
    std::vector<std::string> receipts_wire;
    for (std::size_t i = 1; i < src.bindings.size(); ++i) {
        auto rank = mws::Transaction::begin(store, mws::UploadPlan::from_json(wire));
        rank.upload(src.placement, src.bindings[i]);
        receipts_wire.emplace_back(rank.receipts().to_json());
    }  // each rank's transaction is freed open: nothing is aborted

    // Incomplete receipts: refused before any decision, the transaction stays open.
    EXPECT_EQ(status_of([&] { coordinator.commit(); }), MWS_INVALID_ARGUMENT);
    EXPECT_FALSE(coordinator.commit_decision_may_exist());
    EXPECT_EQ(coordinator.state(), MWS_TRANSACTION_OPEN);
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_NONE);

    for (const auto &w : receipts_wire) coordinator.add_receipts(mws::Receipts::from_json(w));
    EXPECT_EQ(coordinator.receipts().size(), plan.operation_count());
    auto m = coordinator.commit();
    EXPECT_EQ(m.digest(), plan.manifest_digest());
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_COMMIT);

    // Adding the same receipts twice is caught at commit (duplicate receipt).
    auto twice = mws::Transaction::begin(store, plan);
    twice.add_receipts(mws::Receipts::for_plan(plan));
    twice.add_receipts(mws::Receipts::for_plan(plan));
    EXPECT_EQ(status_of([&] { twice.commit(); }), MWS_INVALID_ARGUMENT);
}

TEST(Transaction, ConcurrentUploadsAreSerialized) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto tx = mws::Transaction::begin(store, plan);
    std::vector<std::thread> threads;
    for (const auto &b : src.bindings) {
        threads.emplace_back([&tx, &src, &b] { tx.upload(src.placement, b); });
    }
    for (auto &t : threads) t.join();
    EXPECT_EQ(tx.receipts().size(), plan.operation_count());
    EXPECT_EQ(tx.commit().digest(), plan.manifest_digest());
}

TEST(Transaction, AbortRemovesPayloadsAndCloses) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto tx = mws::Transaction::begin(store, plan);
    for (const auto &b : src.bindings) tx.upload(src.placement, b);
    EXPECT_TRUE(every_payload_exists(store, plan, true));
    tx.abort();
    EXPECT_EQ(tx.state(), MWS_TRANSACTION_ABORTED);
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_ABORT);
    EXPECT_TRUE(every_payload_exists(store, plan, false));
    tx.abort();  // a no-op once aborted
    EXPECT_EQ(status_of([&] { tx.upload(src.placement, src.bindings[0]); }), MWS_CONFLICT);
    EXPECT_EQ(status_of([&] { tx.add_receipts(mws::Receipts::for_plan(plan)); }), MWS_CONFLICT);
    EXPECT_EQ(status_of([&] { tx.commit(); }), MWS_CONFLICT);
    EXPECT_FALSE(every_payload_exists(store, plan, true));
    tx.finalize();  // idempotent recovery of an aborted transaction
    // Another transaction over the plan cannot commit: the store chose abort.
    auto late = mws::Transaction::begin(store, plan);
    late.add_receipts(mws::Receipts::for_plan(plan));
    EXPECT_NE(status_of([&] { late.commit(); }), MWS_OK);
    EXPECT_EQ(late.state(), MWS_TRANSACTION_OPEN);

    // Abort without any upload still records the decision.
    auto plan2 = mws::plan_upload(src.placement, src.binding_ptrs());
    auto empty = mws::Transaction::begin(store, plan2);
    empty.abort();
    EXPECT_EQ(store.read_decision(plan2), MWS_DECISION_ABORT);
}

TEST(Transaction, FreeDoesNotAbortAndFinalizeRecovers) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    {
        auto tx = mws::Transaction::begin(store, plan);
        for (const auto &b : src.bindings) tx.upload(src.placement, b);
        // No decision yet: finalize has nothing to bring to a terminal state.
        EXPECT_EQ(status_of([&] { tx.finalize(); }), MWS_CONFLICT);
    }  // freed open: not aborted
    EXPECT_EQ(store.read_decision(plan), MWS_DECISION_NONE);
    EXPECT_TRUE(every_payload_exists(store, plan, true));
    // Recovery by a coordinator: receipts are determined by the plan.
    auto recovery = mws::Transaction::begin(store, plan);
    recovery.add_receipts(mws::Receipts::for_plan(plan));
    EXPECT_EQ(recovery.commit().digest(), plan.manifest_digest());
    recovery.finalize();
    // A committed store transaction cannot be aborted through another handle.
    auto other = mws::Transaction::begin(store, plan);
    EXPECT_EQ(status_of([&] { other.abort(); }), MWS_CONFLICT);
    EXPECT_EQ(other.state(), MWS_TRANSACTION_OPEN);
    other.finalize();
}

TEST(Transaction, UseAfterCommit) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto tx = mws::Transaction::begin(store, plan);
    for (const auto &b : src.bindings) tx.upload(src.placement, b);
    auto m = tx.commit();
    EXPECT_EQ(status_of([&] { tx.upload(src.placement, src.bindings[0]); }), MWS_CONFLICT);
    EXPECT_EQ(status_of([&] { tx.add_receipts(mws::Receipts::for_plan(plan)); }), MWS_CONFLICT);
    EXPECT_EQ(status_of([&] { tx.abort(); }), MWS_CONFLICT);
    EXPECT_TRUE(tx.commit_decision_may_exist());
    EXPECT_EQ(tx.state(), MWS_TRANSACTION_COMMITTED);
    EXPECT_EQ(tx.commit().digest(), m.digest());  // the same manifest again
    EXPECT_EQ(tx.receipts().size(), plan.operation_count());
    tx.finalize();
    EXPECT_TRUE(every_payload_exists(store, plan, true));
}

TEST(Transaction, NullArguments) {
    mws::Store store = mws::Store::open_memory();
    HostModel src = source_model();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    mws_transaction *tx = reinterpret_cast<mws_transaction *>(0x1);
    EXPECT_EQ(mws_transaction_new(nullptr, plan.get(), &tx), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_new(store.get(), nullptr, &tx), MWS_NULL_ARGUMENT);
    EXPECT_EQ(tx, reinterpret_cast<mws_transaction *>(0x1));  // not written on failure
    EXPECT_EQ(mws_transaction_new(store.get(), plan.get(), nullptr), MWS_NULL_ARGUMENT);
    ASSERT_EQ(mws_transaction_new(store.get(), plan.get(), &tx), MWS_OK);

    const mws_binding *b = src.bindings[0].get();
    EXPECT_EQ(mws_transaction_upload(nullptr, src.placement.get(), b, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_upload(tx, nullptr, b, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_upload(tx, src.placement.get(), nullptr, nullptr), MWS_NULL_ARGUMENT);
    mws_receipts *r = nullptr;
    EXPECT_EQ(mws_transaction_receipts(nullptr, &r), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_receipts(tx, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_add_receipts(nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_add_receipts(tx, nullptr), MWS_NULL_ARGUMENT);
    mws_stored_manifest *m = nullptr;
    EXPECT_EQ(mws_transaction_commit(nullptr, &m), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_commit(tx, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_abort(nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_finalize(nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_commit_decision_may_exist(nullptr), 0);
    EXPECT_NE(std::string(mws_last_error_message()).find("tx"), std::string::npos);
    EXPECT_EQ(mws_transaction_get_state(nullptr), MWS_TRANSACTION_OPEN);
    mws_transaction_free(nullptr);

    // The handle is still usable after the refused calls; nothing was uploaded.
    EXPECT_EQ(mws_transaction_get_state(tx), MWS_TRANSACTION_OPEN);
    ASSERT_EQ(mws_transaction_receipts(tx, &r), MWS_OK);
    EXPECT_EQ(mws_receipts_count(r), 0u);
    mws_receipts_free(r);
    for (const auto &bd : src.bindings) {
        ASSERT_EQ(mws_transaction_upload(tx, src.placement.get(), bd.get(), nullptr), MWS_OK);
    }
    ASSERT_EQ(mws_transaction_commit(tx, &m), MWS_OK);
    EXPECT_EQ(mws_transaction_commit_decision_may_exist(tx), 1);
    mws_stored_manifest_free(m);
    mws_transaction_free(tx);
}

// ---- upload_many: several local participants in one call -------------------------

namespace {

// A MapStore that counts batch_put_from calls and the items they carry.
struct PutCountingStore : MapStore {
    int batches = 0;
    std::size_t items = 0;
    void *ctx() { return static_cast<MapStore *>(this); }
    static PutCountingStore *self(void *c) { return static_cast<PutCountingStore *>(static_cast<MapStore *>(c)); }
    static int32_t counted_put(void *c, const mws_put_item *it, size_t n, uint32_t rt, int32_t *results) {
        self(c)->batches++;
        self(c)->items += n;
        return MapStore::batch_put_from(c, it, n, rt, results);
    }
    static mws_store_vtable vtable() {
        mws_store_vtable vt = MapStore::vtable();
        vt.batch_put_from = &counted_put;
        return vt;
    }
};

HostModel tp4_model() {
    const auto &defs = dense_model();
    return HostModel(placement_json("src", Layout{4, 1, 1, 1}, defs, 1), defs, true, "trainer");
}

// The participant of m.bindings[k] (bindings follow the order of m.buffers).
std::string participant(const HostModel &m, std::size_t k) {
    auto it = m.buffers.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(k));
    return it->first;
}

std::vector<const mws::Binding *> ptrs(const HostModel &m) {
    std::vector<const mws::Binding *> out;
    for (const auto &b : m.bindings) out.push_back(&b);
    return out;
}

}  // namespace

TEST(Transaction, UploadManyMatchesOneUploadPerParticipant) {
    HostModel src = tp4_model();
    ASSERT_EQ(src.bindings.size(), 4u);
    PutCountingStore many_map, one_map;
    mws::Store many_store = mws::Store::from_vtable(PutCountingStore::vtable(), many_map.ctx());
    mws::Store one_store = mws::Store::from_vtable(PutCountingStore::vtable(), one_map.ctx());
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());

    auto many = mws::Transaction::begin(many_store, plan);
    many.upload_many(src.placement, ptrs(src));
    auto one = mws::Transaction::begin(one_store, plan);
    for (const auto &b : src.bindings) one.upload(src.placement, b);

    EXPECT_EQ(many.receipts().to_json(), one.receipts().to_json());  // same receipts, same order
    EXPECT_EQ(many_map.batches, 1);
    EXPECT_EQ(one_map.batches, 4);
    EXPECT_EQ(many_map.items, plan.operation_count());
    EXPECT_EQ(many.commit().digest(), one.commit().digest());
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        std::string key(plan.operation(i).object_key);
        EXPECT_EQ(many_store.get_object(key), one_store.get_object(key)) << key;
    }
}

TEST(Transaction, UploadManyStaleBindingFailsBeforeAnyPut) {
    HostModel src = tp4_model();
    HostModel later = tp4_model();
    later.make_bindings("trainer", 2);  // a later generation: stale for a plan of generation 1
    PutCountingStore map;
    mws::Store store = mws::Store::from_vtable(PutCountingStore::vtable(), map.ctx());
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto tx = mws::Transaction::begin(store, plan);
    std::vector<const mws::Binding *> mixed = ptrs(src);
    mixed[2] = &later.bindings[2];
    EXPECT_EQ(status_of([&] { tx.upload_many(src.placement, mixed); }), MWS_STALE_BINDING);
    EXPECT_EQ(map.batches, 0);
    EXPECT_EQ(tx.receipts().size(), 0u);
    // A participant twice is refused, nothing written.
    std::vector<const mws::Binding *> twice = {&src.bindings[0], &src.bindings[1], &src.bindings[0]};
    EXPECT_EQ(status_of([&] { tx.upload_many(src.placement, twice); }), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(map.batches, 0);
    // leases of the wrong length are refused by the wrapper.
    mws::RegistrationLease lease = mws::RegistrationLease::create(
        store, src.bindings[0], {std::string(plan.operation(0).source_fragment_id)}, MWS_LEASE_SOURCE);
    EXPECT_EQ(status_of([&] { tx.upload_many(src.placement, ptrs(src), {&lease}); }), MWS_INVALID_ARGUMENT);
    EXPECT_EQ(map.batches, 0);
    tx.upload_many(src.placement, ptrs(src));
    EXPECT_EQ(tx.receipts().size(), plan.operation_count());
    EXPECT_EQ(tx.commit().digest(), plan.manifest_digest());
}

TEST(Transaction, UploadManyMixesLeasesAndPins) {
    HostModel src = tp4_model();
    mws::Store store = mws::Store::open_memory();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    std::map<std::string, std::vector<std::string>> ids;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        mws::UploadOperation op = plan.operation(i);
        ids[std::string(op.source_participant_id)].push_back(std::string(op.source_fragment_id));
    }
    mws::RegistrationLease l1 =
        mws::RegistrationLease::create(store, src.bindings[1], ids[participant(src, 1)], MWS_LEASE_SOURCE);
    mws::RegistrationLease l3 =
        mws::RegistrationLease::create(store, src.bindings[3], ids[participant(src, 3)], MWS_LEASE_SOURCE);
    auto tx = mws::Transaction::begin(store, plan);
    tx.upload_many(src.placement, ptrs(src), {nullptr, &l1, nullptr, &l3});
    EXPECT_EQ(tx.receipts().size(), plan.operation_count());
    EXPECT_EQ(tx.commit().digest(), plan.manifest_digest());
}

TEST(Transaction, UploadManyNullAndLengthErrors) {
    HostModel src = tp4_model();
    mws::Store store = mws::Store::open_memory();
    auto plan = mws::plan_upload(src.placement, src.binding_ptrs());
    auto tx = mws::Transaction::begin(store, plan);
    std::vector<const mws_binding *> b;
    for (const auto &x : src.bindings) b.push_back(x.get());
    mws_transaction *raw = const_cast<mws_transaction *>(tx.get());
    EXPECT_EQ(mws_transaction_upload_many(nullptr, src.placement.get(), b.data(), b.size(), nullptr, nullptr),
              MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_upload_many(raw, nullptr, b.data(), b.size(), nullptr, nullptr), MWS_NULL_ARGUMENT);
    EXPECT_EQ(mws_transaction_upload_many(raw, src.placement.get(), nullptr, b.size(), nullptr, nullptr),
              MWS_NULL_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("bindings"), std::string::npos);
    std::vector<const mws_binding *> with_null = b;
    with_null[1] = nullptr;
    EXPECT_EQ(mws_transaction_upload_many(raw, src.placement.get(), with_null.data(), with_null.size(), nullptr,
                                          nullptr),
              MWS_NULL_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("bindings[1]"), std::string::npos);
    // args->lease is refused (leases go per binding).
    std::map<std::string, std::vector<std::string>> ids;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        mws::UploadOperation op = plan.operation(i);
        ids[std::string(op.source_participant_id)].push_back(std::string(op.source_fragment_id));
    }
    mws::RegistrationLease l0 =
        mws::RegistrationLease::create(store, src.bindings[0], ids[participant(src, 0)], MWS_LEASE_SOURCE);
    mws_io_args args{};
    args.lease = l0.get();
    EXPECT_EQ(mws_transaction_upload_many(raw, src.placement.get(), b.data(), 1, nullptr, &args),
              MWS_INVALID_ARGUMENT);
    // The same lease for two bindings is refused before any lock or I/O.
    std::vector<const mws_registration_lease *> dup = {l0.get(), l0.get(), nullptr, nullptr};
    EXPECT_EQ(mws_transaction_upload_many(raw, src.placement.get(), b.data(), b.size(), dup.data(), nullptr),
              MWS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mws_last_error_message()).find("leases[1]"), std::string::npos);
    // count 0: nothing to do (bindings may then be NULL).
    EXPECT_EQ(mws_transaction_upload_many(raw, src.placement.get(), nullptr, 0, nullptr, nullptr), MWS_OK);
    EXPECT_EQ(tx.receipts().size(), 0u);
    // The refused calls left the transaction usable.
    std::vector<const mws_registration_lease *> leases = {l0.get(), nullptr, nullptr, nullptr};
    ASSERT_EQ(mws_transaction_upload_many(raw, src.placement.get(), b.data(), b.size(), leases.data(), nullptr),
              MWS_OK);
    EXPECT_EQ(tx.receipts().size(), plan.operation_count());
    EXPECT_EQ(tx.commit().digest(), plan.manifest_digest());
}
