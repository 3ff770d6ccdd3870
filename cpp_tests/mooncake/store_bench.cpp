// store_bench.cpp: snapshot and resharded restore through the Mooncake Store adapter
// against raw mooncake::RealClient calls of the same bytes, in the same run, on a real
// mooncake_master (not a timed test; run by hand or by store_real.py bench):
//
//   mws_store_bench MASTER [LAYERS [HIDDEN [SEGMENT_MIB [REPEAT]]]]
//
// One client contributes SEGMENT_MIB (default 1024) to the pool, so the bytes are
// local memcpy through Mooncake's TCP transport path (loopback, no RDMA). Trainer TP4 x
// PP2 x DP2 snapshots; servers restore (every byte checked after timing);
// raw: batch_put_from / batch_get_into of objects with the snapshot's sizes from/into
// one registered buffer, and the raw puts plus one upsert_from per metadata object the
// protocol writes (decision, integrity record, manifest; their sizes read back from the
// snapshot). Snapshots: through the Writer (participants in turn) and in one call
// (Transaction::upload_many of every participant, as Store::snapshot), the Writer with
// its uploads deferred to commit (Writer::defer_uploads: one upload call), each with the
// integrity record (the default) and without it (StoreOptions::write_integrity false;
// compared with raw puts plus the protocol's own metadata objects, the decision and
// the manifest). Restores: same
// layout (TP4 x PP2) and resharded (TP2 x EP2), with integrity verification on and off
// (its cost), the bindings loaded in turn, at once (one thread per binding) and in one
// call (Store::load_many: the plan's checks once). Paired snapshots, the method of
// python/bench_mooncake.py (the headline figure): per pair the plan and source
// registration leases untimed, the snapshot and raw puts of the same fragments from
// the same buffers plus the metadata objects timed apart, alternating which goes
// first; the median of the per-pair ratios. Each
// timed phase prints where its time went (the adapter's client calls: count and ms,
// and the rest). Prints GB/s and calls per GiB, then `figure: NAME = VALUE` (ratios:
// > 1 = the adapter is faster than raw).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_store.hpp"
#include "support/mws_model.hpp"

using namespace mwsmodel;
namespace ms = mws::mooncake_store;

namespace {
double secs_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Where a phase's wall time went: the adapter's client calls (count, ms) between two
/// Stats, the rest being the library (planning, checks, checksums) and the bench.
std::string breakdown(const ms::Stats &a, const ms::Stats &b, double secs) {
    std::string out;
    double in_calls = 0;
    char buf[160];
    for (int k = 0; k < ms::kCallKinds; ++k) {
        std::uint64_t n = b.calls[k] - a.calls[k];
        if (n == 0) continue;
        double ms_ = (b.nanos[k] - a.nanos[k]) / 1e6;
        // batch_query and batch_get_into_multi_buffers run inside get_into_ranges.
        const auto kind = static_cast<ms::Call>(k);
        if (kind != ms::Call::batch_query && kind != ms::Call::batch_get_into_multi_buffers) in_calls += ms_;
        std::snprintf(buf, sizeof buf, " %s %llux %.1f ms;", ms::call_name(static_cast<ms::Call>(k)),
                      (unsigned long long)n, ms_);
        out += buf;
    }
    std::snprintf(buf, sizeof buf, " outside client calls %.1f ms of %.1f", secs * 1e3 - in_calls, secs * 1e3);
    return out + buf;
}
}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MASTER [LAYERS [HIDDEN [SEGMENT_MIB [REPEAT]]]]\n", argv[0]);
        return 2;
    }
    const std::string master = argv[1];
    const std::uint64_t layers = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4;
    const std::uint64_t hidden = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1024;
    const std::uint64_t seg_mib = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1024;
    const int repeat = argc > 5 ? std::atoi(argv[5]) : 3;
    int rc = 0;
    auto client = ms::connect_tcp(master, seg_mib << 20, 64u << 20, "127.0.0.1", &rc);
    if (!client) {
        std::fprintf(stderr, "setup_real failed: %d\n", rc);
        return 1;
    }
    int out = 0;
    try {
        ms::Adapter a(client);
        if (a.self_test() != 0) throw std::runtime_error("adapter self_test failed (header/wheel mismatch?)");
        const auto defs = model_tensors(layers, hidden, 4);
        const Layout trainer{4, 2, 1, 2}, same{4, 2, 1, 1}, server{2, 1, 2, 1};
        mws::StoreOptions unverified, no_record;
        unverified.verify_integrity = false;
        no_record.write_integrity = false;
        // Best seconds. Snapshots: the Writer (participants uploaded in turn as their
        // tensors are written), one call (upload_many of every participant).
        // Restores of the one-call snapshot: same layout and resharded, verified and
        // unverified, the bindings loaded in turn by this process (as before issue 45's
        // speed work: the figures to compare) and at once (one thread per binding).
        double best_snap = 1e30, best_writer = 1e30, best_snap_nr = 1e30, best_writer_nr = 1e30;
        double best_deferred = 1e30, best_deferred_nr = 1e30;
        std::uint64_t deferred_calls = 0;
        double best_same = 1e30, best_same_nv = 1e30, best_resh = 1e30, best_resh_nv = 1e30;
        double best_same_par = 1e30, best_resh_par = 1e30;
        double best_same_many = 1e30, best_same_many_nv = 1e30, best_resh_many = 1e30, best_resh_many_nv = 1e30;
        std::uint64_t snap_bytes = 0, same_bytes = 0, resh_bytes = 0, snap_calls = 0, writer_calls = 0;
        std::uint64_t same_calls = 0, resh_calls = 0, ignored_bytes = 0, ignored_calls = 0;
        std::vector<std::size_t> sizes, meta_sizes, meta_sizes_nr;
        // A restore of `m` into layout L. parallel: one thread per binding, as the
        // ranks of a server each load their own binding at once; one_call: every
        // binding in one Store::load_many; otherwise this one process loads them in
        // turn (mwsmodel::restore).
        enum Mode { in_turn, parallel, one_call };
        auto timed_restore = [&](const mws::Store &store, const mws::StoredManifest &m, const Layout &L,
                                 const std::string &rev, Mode mode, double &best, std::uint64_t &bytes,
                                 std::uint64_t &calls) {
            HostModel dst(placement_json("serving", L, defs, 1, "bench-model", rev), defs, false, "server");
            ms::Stats s0 = a.stats();
            auto t0 = std::chrono::steady_clock::now();
            if (mode == one_call) {
                mws::LoadPlan plan = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
                std::vector<const mws::Binding *> bs;
                for (const auto &b : dst.bindings) bs.push_back(&b);
                bytes = store.load_many(plan, bs).bytes;
            } else if (mode == parallel) {
                mws::LoadPlan plan = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
                std::vector<mws_load_stats> st(dst.bindings.size());
                std::vector<std::string> errors(dst.bindings.size());
                std::vector<std::thread> ranks;
                for (std::size_t i = 0; i < dst.bindings.size(); ++i)
                    ranks.emplace_back([&, i] {
                        try {
                            st[i] = store.load(plan, dst.bindings[i]);
                        } catch (const std::exception &e) {
                            errors[i] = e.what();
                        }
                    });
                for (auto &t : ranks) t.join();
                for (const auto &e : errors)
                    if (!e.empty()) throw std::runtime_error("parallel load: " + e);
                bytes = 0;
                for (const auto &x : st) bytes += x.bytes;
            } else {
                auto tp = std::chrono::steady_clock::now();
                mws::LoadPlan plan = mws::LoadPlan::plan(m, dst.placement, dst.binding_ptrs());
                double plan_ms = secs_since(tp) * 1e3;
                bytes = 0;
                std::string per;
                for (const auto &b : dst.bindings) {
                    auto tl = std::chrono::steady_clock::now();
                    mws_load_stats st = store.load(plan, b);
                    bytes += st.bytes;
                    char buf[96];
                    std::snprintf(buf, sizeof buf, " %.1f(%llu staged)", secs_since(tl) * 1e3,
                                  (unsigned long long)st.staged_bytes);
                    per += buf;
                }
                std::printf("  plan %.1f ms; loads ms:%s\n", plan_ms, per.c_str());
            }
            double t = secs_since(t0);
            best = std::min(best, t);
            ms::Stats s1 = a.stats();
            calls = s1.range_calls - s0.range_calls;
            std::printf("  [%s -> tp%llu pp%llu ep%llu, %s]%s\n", rev.c_str(), (unsigned long long)L.tp,
                        (unsigned long long)L.pp, (unsigned long long)L.ep,
                        mode == parallel ? "parallel" : mode == one_call ? "load_many" : "sequential",
                        breakdown(s0, s1, t).c_str());
            dst.verify();
        };
        for (int it = 0; it < repeat; ++it) {
            const std::string rev = "bench-" + std::to_string(it);
            mws::Store store = a.store(), store_nv = a.store(unverified), store_nr = a.store(no_record);
            // The Writer: a trainer's participants uploaded one by one as their
            // tensors are written (8 participant uploads in turn); with the integrity
            // record and without it.
            auto timed_writer = [&](const mws::Store &st, const char *what, bool defer, double &best,
                                    std::uint64_t &calls) {
                const std::string wrev = std::string("bench-writer-") + what + "-" + std::to_string(it);
                HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", wrev), defs, true, "trainer");
                ms::Stats s0 = a.stats();
                auto t0 = std::chrono::steady_clock::now();
                snapshot(st, src, "bench", {}, nullptr, defer);
                double t = secs_since(t0);
                best = std::min(best, t);
                ms::Stats s1 = a.stats();
                calls = s1.batch_put_calls - s0.batch_put_calls;
                std::printf("  [%s Writer snapshot]%s\n", wrev.c_str(), breakdown(s0, s1, t).c_str());
            };
            timed_writer(store, "record", false, best_writer, writer_calls);
            timed_writer(store_nr, "no-record", false, best_writer_nr, writer_calls);
            // The Writer with its uploads deferred to commit (one upload call).
            timed_writer(store, "deferred-record", true, best_deferred, deferred_calls);
            timed_writer(store_nr, "deferred-no-record", true, best_deferred_nr, deferred_calls);
            // One call without the integrity record: its decision and manifest sizes
            // are the raw baseline's metadata objects.
            {
                const std::string nrev = "bench-no-record-" + std::to_string(it);
                HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", nrev), defs, true, "trainer");
                ms::Stats s0 = a.stats();
                auto t0 = std::chrono::steady_clock::now();
                mws::UploadOptions uo;
                uo.key_prefix = std::string(store_nr.key_prefix());
                uo.store_namespace = "bench";
                const mws::UploadPlan up = mws::plan_upload(src.placement, src.bindings, uo);
                mws::Transaction tx = mws::Transaction::begin(store_nr, up);
                tx.upload_many(src.placement, src.binding_ptrs(), {}, {});
                tx.commit();
                double t = secs_since(t0);
                best_snap_nr = std::min(best_snap_nr, t);
                ms::Stats s1 = a.stats();
                std::printf("  [%s snapshot]%s\n", nrev.c_str(), breakdown(s0, s1, t).c_str());
                const std::string ikey = std::string(up.group_id()) + "/integrity/" + std::string(up.transaction_id());
                if (a.raw_get_size(ikey) > 0) throw std::runtime_error("write_integrity off wrote " + ikey);
                meta_sizes_nr.clear();
                for (const std::string &k : {std::string(up.control_key()), std::string(up.manifest_key())}) {
                    std::int64_t n = a.raw_get_size(k);
                    if (n <= 0) throw std::runtime_error("metadata object " + k + ": get_size " + std::to_string(n));
                    meta_sizes_nr.push_back(static_cast<std::size_t>(n));
                }
            }
            // One call for every participant this process holds (Store::snapshot's
            // steps: plan_upload, Transaction::upload_many, commit), the plan kept for
            // its metadata keys.
            HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", rev), defs, true, "trainer");
            ms::Stats s0 = a.stats();
            auto t0 = std::chrono::steady_clock::now();
            mws::UploadOptions uo;
            uo.key_prefix = std::string(store.key_prefix());
            uo.store_namespace = "bench";
            const mws::UploadPlan up = mws::plan_upload(src.placement, src.bindings, uo);
            mws::Transaction tx = mws::Transaction::begin(store, up);
            tx.upload_many(src.placement, src.binding_ptrs(), {}, {});
            mws::StoredManifest m = tx.commit();
            double t = secs_since(t0);
            best_snap = std::min(best_snap, t);
            ms::Stats s1 = a.stats();
            snap_calls = s1.batch_put_calls - s0.batch_put_calls;
            std::printf("  [%s snapshot]%s\n", rev.c_str(), breakdown(s0, s1, t).c_str());
            const std::vector<std::string> meta_keys = {
                std::string(up.control_key()),
                std::string(up.group_id()) + "/integrity/" + std::string(up.transaction_id()),
                std::string(up.manifest_key())};
            meta_sizes.clear();
            for (const std::string &k : meta_keys) {
                std::int64_t n = a.raw_get_size(k);
                if (n <= 0) throw std::runtime_error("metadata object " + k + ": get_size " + std::to_string(n));
                meta_sizes.push_back(static_cast<std::size_t>(n));
            }
            timed_restore(store, m, same, rev, in_turn, best_same, same_bytes, same_calls);
            timed_restore(store_nv, m, same, rev, in_turn, best_same_nv, ignored_bytes, ignored_calls);
            timed_restore(store, m, server, rev, in_turn, best_resh, resh_bytes, resh_calls);
            timed_restore(store_nv, m, server, rev, in_turn, best_resh_nv, ignored_bytes, ignored_calls);
            timed_restore(store, m, same, rev, parallel, best_same_par, ignored_bytes, ignored_calls);
            timed_restore(store, m, server, rev, parallel, best_resh_par, ignored_bytes, ignored_calls);
            timed_restore(store, m, same, rev, one_call, best_same_many, ignored_bytes, ignored_calls);
            timed_restore(store_nv, m, same, rev, one_call, best_same_many_nv, ignored_bytes, ignored_calls);
            timed_restore(store, m, server, rev, one_call, best_resh_many, ignored_bytes, ignored_calls);
            timed_restore(store_nv, m, server, rev, one_call, best_resh_many_nv, ignored_bytes, ignored_calls);
            a.raw_remove_by_regex("^weights/bench/");
        }
        // Snapshot bytes: one copy of every box (DP replicas are written once).
        {
            HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", "x"), defs, true, "trainer");
            std::set<std::string> boxes;
            for (const View &v : src.views)
                if (boxes.insert(src.box_key(v)).second) sizes.push_back(v.nbytes);
            for (std::size_t n : sizes) snap_bytes += n;
        }
        // Raw: the same object sizes, one batch_put_from (+ one upsert_from per metadata
        // object of the snapshot's sizes, METADATA) and one batch_get_into.
        std::size_t meta_total = 0;
        for (std::size_t n : meta_sizes) meta_total += n;
        for (std::size_t n : meta_sizes_nr) meta_total += n;
        std::vector<unsigned char> sbuf(snap_bytes + meta_total), dbuf(snap_bytes);
        for (std::size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<unsigned char>(i * 131 + 7);
        a.raw_register(sbuf.data(), sbuf.size());
        a.raw_register(dbuf.data(), dbuf.size());
        // Raw puts of metadata objects: one upsert_from each (METADATA, group `group`),
        // keys `prefix` + their index.
        using Objects = std::vector<std::pair<void *, std::size_t>>;
        auto put_metadata = [&](const std::string &prefix, const Objects &objects, const std::string &group) {
            for (std::size_t i = 0; i < objects.size(); ++i) {
                const auto [ptr, len] = objects[i];
                const int rc = a.raw_upsert_from(prefix + std::to_string(i), ptr, len, group, false);
                if (rc != 0) throw std::runtime_error("raw upsert_from of a metadata object: " + std::to_string(rc));
            }
        };
        // The metadata objects' stand-ins, bytes of sbuf after the payloads, of the
        // snapshot's sizes: with the integrity record, and without it.
        Objects meta, meta_nr;
        std::size_t meta_off = snap_bytes;
        for (std::size_t n : meta_sizes) {
            meta.emplace_back(sbuf.data() + meta_off, n);
            meta_off += n;
        }
        for (std::size_t n : meta_sizes_nr) {
            meta_nr.emplace_back(sbuf.data() + meta_off, n);
            meta_off += n;
        }
        double best_put = 1e30, best_put_meta = 1e30, best_put_meta_nr = 1e30, best_get = 1e30;
        for (int it = 0; it < repeat; ++it) {
            const std::string group = "raw-bench/" + std::to_string(it);
            std::vector<std::string> keys;
            std::vector<void *> sp, dp;
            std::size_t off = 0;
            for (std::size_t i = 0; i < sizes.size(); ++i) {
                keys.push_back(group + "/" + std::to_string(i));
                sp.push_back(sbuf.data() + off);
                dp.push_back(dbuf.data() + off);
                off += sizes[i];
            }
            auto t0 = std::chrono::steady_clock::now();
            std::vector<int> prc = a.raw_batch_put_from(keys, sp, sizes, group);
            best_put = std::min(best_put, secs_since(t0));
            put_metadata(group + "/meta/", meta, group);
            best_put_meta = std::min(best_put_meta, secs_since(t0));
            for (int r : prc)
                if (r != 0) throw std::runtime_error("raw batch_put_from failed: " + std::to_string(r));
            // The same puts (other keys) plus the protocol's own metadata objects
            // (decision, manifest).
            std::vector<std::string> keys_nr;
            for (const std::string &k : keys) keys_nr.push_back(k + "-nr");
            t0 = std::chrono::steady_clock::now();
            prc = a.raw_batch_put_from(keys_nr, sp, sizes, group);
            put_metadata(group + "/meta-nr/", meta_nr, group);
            best_put_meta_nr = std::min(best_put_meta_nr, secs_since(t0));
            for (int r : prc)
                if (r != 0) throw std::runtime_error("raw batch_put_from failed: " + std::to_string(r));
            t0 = std::chrono::steady_clock::now();
            std::vector<std::int64_t> grc = a.raw_batch_get_into(keys, dp, sizes);
            best_get = std::min(best_get, secs_since(t0));
            for (std::size_t i = 0; i < grc.size(); ++i)
                if (grc[i] != static_cast<std::int64_t>(sizes[i]))
                    throw std::runtime_error("raw batch_get_into failed");
            if (std::memcmp(sbuf.data(), dbuf.data(), dbuf.size()) != 0) throw std::runtime_error("raw bytes differ");
            a.raw_remove_by_regex("^raw-bench/");
        }
        a.raw_unregister(sbuf.data());
        a.raw_unregister(dbuf.data());
        // Paired snapshots, python/bench_mooncake.py's method (snapshot_pairs), so the
        // C++ and Python figures compare: per pair, one plan (untimed), a source
        // registration lease per participant (untimed, like the raw puts'
        // registration), then the timed snapshot (Transaction::begin, upload_many with
        // the leases, commit) and, timed apart, raw batch_put_from of the same fragments
        // FROM THE SAME BUFFERS plus one upsert_from per metadata object the protocol
        // writes; which goes first alternates (snapshot first in even pairs). The
        // figure is the median of the per-pair ratios (raw time / snapshot time).
        auto paired = [&](const mws::Store &st, bool with_record, const std::string &tag) {
            HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", "pairs"), defs, true, "trainer");
            std::vector<std::string> participants;  // src.bindings' participants, in order
            for (const auto &b : src.buffers) participants.push_back(b.first);
            std::map<std::string, unsigned char *> at;  // placement fragment id -> its bytes
            for (const View &v : src.views) at[v.pfid] = src.buffers[v.participant].data() + v.offset;
            std::vector<unsigned char> integrity(with_record ? meta_sizes.at(1) : 0, 0x5A);
            std::vector<double> ratios, snaps;
            const int warmup = 1;
            for (int i = 0; i < warmup + repeat; ++i) {
                const std::string ns = "bench-" + tag + std::to_string(i), rgroup = "raw-" + tag + std::to_string(i);
                mws::UploadOptions uo;
                uo.key_prefix = std::string(st.key_prefix());
                uo.store_namespace = ns;
                const mws::UploadPlan up = mws::plan_upload(src.placement, src.bindings, uo);
                std::map<std::string, std::vector<std::string>> fids;  // participant -> its source fragments
                std::vector<std::string> keys;
                std::vector<void *> ptrs;
                std::vector<std::size_t> lens;
                for (std::size_t k = 0; k < up.operation_count(); ++k) {
                    const mws::UploadOperation op = up.operation(k);
                    fids[std::string(op.source_participant_id)].emplace_back(op.source_fragment_id);
                    keys.push_back(rgroup + "/" + std::string(op.target_fragment_id));
                    ptrs.push_back(at.at(std::string(op.source_placement_fragment_id)));
                    lens.push_back(static_cast<std::size_t>(op.nbytes));
                }
                double snap = 0, raw = 0;
                for (int step = 0; step < 2; ++step) {
                    const bool snapshot_now = (step == 0) == (i < warmup || (i - warmup) % 2 == 0);
                    if (snapshot_now) {
                        std::vector<mws::RegistrationLease> leases;
                        std::vector<const mws::Binding *> mine;
                        for (std::size_t b = 0; b < participants.size(); ++b) {
                            auto f = fids.find(participants[b]);
                            if (f == fids.end()) continue;
                            leases.push_back(
                                mws::RegistrationLease::create(st, src.bindings[b], f->second, MWS_LEASE_SOURCE));
                            mine.push_back(&src.bindings[b]);
                        }
                        std::vector<const mws::RegistrationLease *> lease_ptrs;
                        for (const auto &l : leases) lease_ptrs.push_back(&l);
                        ms::Stats s0 = a.stats();
                        auto t0 = std::chrono::steady_clock::now();
                        mws::Transaction tx = mws::Transaction::begin(st, up);
                        tx.upload_many(src.placement, mine, lease_ptrs, {});
                        tx.commit();
                        snap = secs_since(t0);
                        if (i >= warmup)
                            std::printf("  [pair %s %d snapshot]%s\n", tag.c_str(), i - warmup,
                                        breakdown(s0, a.stats(), snap).c_str());
                        for (auto &l : leases) l.close(MWS_TERMINAL_COMPLETED);
                    } else {
                        // Registered for the raw puts only (Mooncake refuses a registration
                        // inside another, so never while the leases hold theirs).
                        // The protocol's metadata objects with their real bytes: the
                        // decision record, the integrity record, the manifest.
                        Objects objects = {{const_cast<char *>(up.commit_record().data()), up.commit_record().size()}};
                        if (with_record) objects.emplace_back(integrity.data(), integrity.size());
                        objects.emplace_back(const_cast<char *>(up.manifest_json().data()), up.manifest_json().size());
                        for (auto &b : src.buffers) a.raw_register(b.second.data(), b.second.size());
                        auto t0 = std::chrono::steady_clock::now();
                        std::vector<int> prc = a.raw_batch_put_from(keys, ptrs, lens, rgroup);
                        put_metadata(rgroup + "/meta/", objects, rgroup);
                        raw = secs_since(t0);
                        for (auto &b : src.buffers) a.raw_unregister(b.second.data());
                        for (int r : prc)
                            if (r != 0) throw std::runtime_error("paired raw batch_put_from failed: " + std::to_string(r));
                    }
                }
                a.raw_remove_by_regex("^weights/" + ns + "/");
                a.raw_remove_by_regex("^" + rgroup + "/");
                if (i < warmup) continue;
                ratios.push_back(raw / snap);
                snaps.push_back(snap);
                std::printf("  [pair %s %d] snapshot %.1f ms, raw put + metadata %.1f ms: %.3f\n", tag.c_str(),
                            i - warmup, snap * 1e3, raw * 1e3, raw / snap);
            }
            auto median = [](std::vector<double> v) {
                std::sort(v.begin(), v.end());
                const std::size_t n = v.size();
                return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
            };
            return std::make_pair(median(ratios), median(snaps));  // (ratio, snapshot seconds)
        };
        mws::Store pair_store = a.store(), pair_store_nr = a.store(no_record);
        const auto paired_nr = paired(pair_store_nr, false, "pairnr");
        const auto paired_rec = paired(pair_store, true, "pair");
        const double gib = 1024.0 * 1024 * 1024;
        auto gbps = [](std::uint64_t b, double s) { return b / s / 1e9; };
        auto row = [&](const char *what, double s, std::uint64_t bytes, double calls, const char *call) {
            std::printf("%-38s %8.1f ms  %6.2f GB/s  %7.1f %s calls/GiB\n", what, s * 1e3, gbps(bytes, s),
                        calls / (bytes / gib), call);
        };
        std::size_t meta_bytes = 0, meta_bytes_nr = 0;
        for (std::size_t n : meta_sizes) meta_bytes += n;
        for (std::size_t n : meta_sizes_nr) meta_bytes_nr += n;
        std::printf("model: %llu layers, hidden %llu, 4 experts; %zu payload objects, %.1f MiB snapshot, %zu metadata "
                    "objects (%zu bytes; without the integrity record %zu, %zu bytes); best of %d\n",
                    (unsigned long long)layers, (unsigned long long)hidden, sizes.size(), snap_bytes / 1048576.0,
                    meta_sizes.size(), meta_bytes, meta_sizes_nr.size(), meta_bytes_nr, repeat);
        row("adapter snapshot, Writer (8 in turn)", best_writer, snap_bytes, writer_calls, "batch_put_from");
        row("  same, no integrity record", best_writer_nr, snap_bytes, writer_calls, "batch_put_from");
        row("adapter snapshot, Writer, deferred", best_deferred, snap_bytes, deferred_calls, "batch_put_from");
        row("  same, no integrity record", best_deferred_nr, snap_bytes, deferred_calls, "batch_put_from");
        row("adapter snapshot, one call (upload_many)", best_snap, snap_bytes, snap_calls, "batch_put_from");
        row("  same, no integrity record", best_snap_nr, snap_bytes, snap_calls, "batch_put_from");
        row("raw batch_put_from (payloads)", best_put, snap_bytes, 1, "batch_put_from");
        row("raw batch_put_from + metadata puts", best_put_meta, snap_bytes, 1 + meta_sizes.size(), "put");
        row("raw batch_put_from + decision, manifest", best_put_meta_nr, snap_bytes, 1 + meta_sizes_nr.size(), "put");
        row("adapter restore same layout (TP4xPP2)", best_same, same_bytes, same_calls, "get_into_ranges");
        row("  same, integrity verification off", best_same_nv, same_bytes, same_calls, "get_into_ranges");
        row("  same, bindings at once (threads)", best_same_par, same_bytes, same_calls, "get_into_ranges");
        row("  same, one call (load_many)", best_same_many, same_bytes, same_calls, "get_into_ranges");
        row("  same, one call, verification off", best_same_many_nv, same_bytes, same_calls, "get_into_ranges");
        row("adapter restore resharded (TP2xEP2)", best_resh, resh_bytes, resh_calls, "get_into_ranges");
        row("  same, integrity verification off", best_resh_nv, resh_bytes, resh_calls, "get_into_ranges");
        row("  same, bindings at once (threads)", best_resh_par, resh_bytes, resh_calls, "get_into_ranges");
        row("  same, one call (load_many)", best_resh_many, resh_bytes, resh_calls, "get_into_ranges");
        row("  same, one call, verification off", best_resh_many_nv, resh_bytes, resh_calls, "get_into_ranges");
        row("raw batch_get_into (payloads)", best_get, snap_bytes, 1, "batch_get_into");
        const double raw_get = gbps(snap_bytes, best_get);
        auto fig = [](const char *name, double v) { std::printf("figure: mooncake_store_%s = %.3f\n", name, v); };
        fig("adapter_snapshot_gbps", gbps(snap_bytes, best_writer));
        fig("one_call_snapshot_gbps", gbps(snap_bytes, best_snap));
        fig("raw_batch_put_gbps", gbps(snap_bytes, best_put));
        fig("snapshot_vs_raw_put_plus_metadata", best_put_meta / best_writer);
        fig("one_call_snapshot_vs_raw_put_plus_metadata", best_put_meta / best_snap);
        // The snapshot target: integrity off, against raw puts plus the
        // protocol's metadata objects (decision, manifest); the record's cost apart.
        fig("snapshot_integrity_off_vs_raw_put_plus_metadata", best_put_meta_nr / best_writer_nr);
        fig("one_call_snapshot_integrity_off_vs_raw_put_plus_metadata", best_put_meta_nr / best_snap_nr);
        fig("deferred_writer_snapshot_vs_raw_put_plus_metadata", best_put_meta / best_deferred);
        fig("deferred_writer_snapshot_integrity_off_vs_raw_put_plus_metadata", best_put_meta_nr / best_deferred_nr);
        // The Python bench's method (above): plan and source leases untimed, raw from the
        // same buffers, alternating pairs, median ratio.
        fig("paired_snapshot_integrity_off_vs_raw_put_plus_metadata", paired_nr.first);
        fig("paired_snapshot_vs_raw_put_plus_metadata", paired_rec.first);
        // As Python's snapshot_integrity_record_cost: 1 - (time without) / (time with).
        fig("paired_snapshot_integrity_record_cost", 1 - paired_nr.second / paired_rec.second);
        fig("snapshot_integrity_cost", best_writer / best_writer_nr - 1);
        fig("one_call_snapshot_integrity_cost", best_snap / best_snap_nr - 1);
        fig("adapter_restore_same_layout_gbps", gbps(same_bytes, best_same));
        fig("adapter_restore_resharded_gbps", gbps(resh_bytes, best_resh));
        fig("raw_batch_get_gbps", raw_get);
        fig("restore_same_layout_vs_raw", gbps(same_bytes, best_same) / raw_get);
        fig("restore_same_layout_unverified_vs_raw", gbps(same_bytes, best_same_nv) / raw_get);
        fig("restore_same_layout_at_once_vs_raw", gbps(same_bytes, best_same_par) / raw_get);
        fig("restore_resharded_vs_raw", gbps(resh_bytes, best_resh) / raw_get);
        fig("restore_resharded_unverified_vs_raw", gbps(resh_bytes, best_resh_nv) / raw_get);
        fig("restore_resharded_at_once_vs_raw", gbps(resh_bytes, best_resh_par) / raw_get);
        fig("one_call_restore_same_layout_vs_raw", gbps(same_bytes, best_same_many) / raw_get);
        fig("one_call_restore_same_layout_unverified_vs_raw", gbps(same_bytes, best_same_many_nv) / raw_get);
        fig("one_call_restore_resharded_vs_raw", gbps(resh_bytes, best_resh_many) / raw_get);
        fig("one_call_restore_resharded_unverified_vs_raw", gbps(resh_bytes, best_resh_many_nv) / raw_get);
        fig("restore_integrity_cost", best_resh / best_resh_nv - 1);
        fig("restore_same_layout_integrity_cost", best_same / best_same_nv - 1);
        std::printf("figure: mooncake_store_snapshot_calls_per_gib = %.1f\n", writer_calls / (snap_bytes / gib));
        std::printf("figure: mooncake_store_one_call_snapshot_calls_per_gib = %.1f\n", snap_calls / (snap_bytes / gib));
        std::printf("figure: mooncake_store_deferred_writer_snapshot_calls_per_gib = %.1f\n",
                    deferred_calls / (snap_bytes / gib));
        std::printf("figure: mooncake_store_restore_calls_per_gib = %.1f\n", resh_calls / (resh_bytes / gib));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        out = 1;
    }
    std::fflush(stdout);  // the figures before the client's teardown logs (stderr)
    ms::tear_down(*client);
    return out;
}
