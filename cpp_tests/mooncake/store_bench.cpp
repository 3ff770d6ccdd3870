// store_bench.cpp: snapshot and resharded restore through the Mooncake Store adapter
// against raw mooncake::RealClient calls of the same bytes, in the same run, on a real
// mooncake_master (not a timed test; run by hand or by store_real.py bench):
//
//   mws_store_bench MASTER [LAYERS [HIDDEN [SEGMENT_MIB [REPEAT]]]]
//
// One client contributes SEGMENT_MIB (default 1024) to the pool, so the bytes are
// local memcpy through Mooncake's TCP transport path (loopback, no RDMA). Trainer TP4 x
// PP2 x DP2 snapshots; a server TP2 x EP2 restores (every byte checked after timing);
// raw: batch_put_from / batch_get_into of objects with the snapshot's sizes from/into
// one registered buffer. Prints GB/s and calls per GiB, then `figure: NAME = VALUE`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
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
        const Layout trainer{4, 2, 1, 2}, server{2, 1, 2, 1};
        double best_snap = 1e30, best_restore = 1e30, best_put = 1e30, best_get = 1e30;
        std::uint64_t snap_bytes = 0, restore_bytes = 0, snap_calls = 0, restore_calls = 0, objects = 0;
        std::vector<std::size_t> sizes;
        for (int it = 0; it < repeat; ++it) {
            const std::string rev = "bench-" + std::to_string(it);
            mws::Store store = a.store();
            HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", rev), defs, true, "trainer");
            ms::Stats s0 = a.stats();
            auto t0 = std::chrono::steady_clock::now();
            mws::StoredManifest m = snapshot(store, src, "bench");
            best_snap = std::min(best_snap, secs_since(t0));
            ms::Stats s1 = a.stats();
            snap_calls = s1.batch_put_calls - s0.batch_put_calls;
            HostModel dst(placement_json("serving", server, defs, 1, "bench-model", rev), defs, false, "server");
            t0 = std::chrono::steady_clock::now();
            mws_load_stats st = restore(store, m, dst);
            best_restore = std::min(best_restore, secs_since(t0));
            ms::Stats s2 = a.stats();
            restore_calls = s2.range_calls - s1.range_calls;
            restore_bytes = st.bytes;
            dst.verify();
            a.raw_remove_by_regex("^weights/bench/");
        }
        // Snapshot bytes: one copy of every box (DP replicas are written once).
        {
            HostModel src(placement_json("trainer", trainer, defs, 1, "bench-model", "x"), defs, true, "trainer");
            std::set<std::string> boxes;
            for (const View &v : src.views)
                if (boxes.insert(src.box_key(v)).second) sizes.push_back(v.nbytes);
            for (std::size_t n : sizes) snap_bytes += n;
            objects = sizes.size();
        }
        // Raw: the same object sizes, one batch_put_from and one batch_get_into.
        std::vector<unsigned char> sbuf(snap_bytes), dbuf(snap_bytes);
        for (std::size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<unsigned char>(i * 131 + 7);
        a.raw_register(sbuf.data(), sbuf.size());
        a.raw_register(dbuf.data(), dbuf.size());
        for (int it = 0; it < repeat; ++it) {
            std::vector<std::string> keys;
            std::vector<void *> sp, dp;
            std::size_t off = 0;
            for (std::size_t i = 0; i < sizes.size(); ++i) {
                keys.push_back("raw-bench/" + std::to_string(it) + "/" + std::to_string(i));
                sp.push_back(sbuf.data() + off);
                dp.push_back(dbuf.data() + off);
                off += sizes[i];
            }
            auto t0 = std::chrono::steady_clock::now();
            std::vector<int> prc = a.raw_batch_put_from(keys, sp, sizes, "raw-bench/" + std::to_string(it));
            best_put = std::min(best_put, secs_since(t0));
            for (int r : prc)
                if (r != 0) throw std::runtime_error("raw batch_put_from failed: " + std::to_string(r));
            t0 = std::chrono::steady_clock::now();
            std::vector<std::int64_t> grc = a.raw_batch_get_into(keys, dp, sizes);
            best_get = std::min(best_get, secs_since(t0));
            for (std::size_t i = 0; i < grc.size(); ++i)
                if (grc[i] != static_cast<std::int64_t>(sizes[i])) throw std::runtime_error("raw batch_get_into failed");
            if (std::memcmp(sbuf.data(), dbuf.data(), sbuf.size()) != 0) throw std::runtime_error("raw bytes differ");
            a.raw_remove_by_regex("^raw-bench/");
        }
        a.raw_unregister(sbuf.data());
        a.raw_unregister(dbuf.data());
        const double gib = 1024.0 * 1024 * 1024;
        auto gbps = [](std::uint64_t b, double s) { return b / s / 1e9; };
        std::printf("model: %llu layers, hidden %llu, 4 experts; %zu payload objects, %.1f MiB snapshot, %.1f MiB "
                    "restored (TP4xPP2xDP2 -> TP2xEP2); best of %d\n",
                    (unsigned long long)layers, (unsigned long long)hidden, (std::size_t)objects, snap_bytes / 1048576.0,
                    restore_bytes / 1048576.0, repeat);
        std::printf("adapter snapshot  %8.1f ms  %6.2f GB/s  %6.1f batch_put_from calls/GiB\n", best_snap * 1e3,
                    gbps(snap_bytes, best_snap), snap_calls / (snap_bytes / gib));
        std::printf("raw batch_put_from%8.1f ms  %6.2f GB/s  %6.1f calls/GiB\n", best_put * 1e3,
                    gbps(snap_bytes, best_put), 1 / (snap_bytes / gib));
        std::printf("adapter restore   %8.1f ms  %6.2f GB/s  %6.1f get_into_ranges calls/GiB\n", best_restore * 1e3,
                    gbps(restore_bytes, best_restore), restore_calls / (restore_bytes / gib));
        std::printf("raw batch_get_into%8.1f ms  %6.2f GB/s  %6.1f calls/GiB\n", best_get * 1e3,
                    gbps(snap_bytes, best_get), 1 / (snap_bytes / gib));
        std::printf("figure: mooncake_store_adapter_snapshot_gbps = %.3f\n", gbps(snap_bytes, best_snap));
        std::printf("figure: mooncake_store_raw_batch_put_gbps = %.3f\n", gbps(snap_bytes, best_put));
        std::printf("figure: mooncake_store_adapter_restore_gbps = %.3f\n", gbps(restore_bytes, best_restore));
        std::printf("figure: mooncake_store_raw_batch_get_gbps = %.3f\n", gbps(snap_bytes, best_get));
        std::printf("figure: mooncake_store_snapshot_calls_per_gib = %.1f\n", snap_calls / (snap_bytes / gib));
        std::printf("figure: mooncake_store_restore_calls_per_gib = %.1f\n", restore_calls / (restore_bytes / gib));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        out = 1;
    }
    ms::tear_down(*client);
    return out;
}
