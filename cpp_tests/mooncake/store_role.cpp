// store_role.cpp: one C++ PROCESS on the REAL Mooncake Store (a mooncake_master on
// loopback, TCP, P2PHANDSHAKE), through the store adapter
// (mooncake_weight_store::mooncake_store over the process's own mooncake::RealClient).
// Driven by store_real.py; prints one JSON line per result. This file includes no
// Mooncake header (the adapter's one TU does).
//
//   store_role MASTER hold SEGMENT_MIB            a client that contributes SEGMENT_MIB of memory to the
//                                                 pool (the objects of the pure clients below live there);
//                                                 {"ready":true}, then waits for a line on stdin
//   store_role MASTER snapshot NS REV LAYERS [pause]  trainer TP4 x PP2 x DP2 snapshots the model (generation =
//                                                 LAYERS) as revision REV; `pause`: stops in the progress
//                                                 callback after half of the payload ({"paused":true})
//   store_role MASTER restore MANIFEST_KEY LAYERS  server TP2 x EP2 restores it; every byte checked
//   store_role MASTER corrupt KEY GROUP            overwrites one payload object (same length) with upsert_from
//   store_role MASTER revisions NS                 Store::revisions and Store::latest of test-model (found
//                                                 through the revision index: Mooncake cannot list keys)
//   store_role MASTER selftest                     Adapter::self_test + every client code the adapter maps
// Exit 0 on success; 3 with {"error": STATUS} when the library refused (the driver decides).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
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

const mwsmodel::Layout kTrainer{4, 2, 1, 2};  // TP4 x PP2 x DP2
const mwsmodel::Layout kServer{2, 1, 2, 1};   // TP2 x EP2

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<TensorDef> model(std::uint64_t layers) { return model_tensors(layers, 256, 4); }

std::string jstr(const std::string &s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

int snapshot_cmd(const ms::Adapter &a, const std::string &ns, const std::string &rev, std::uint64_t layers, bool pause) {
    const auto defs = model(layers);
    mws::Store store = a.store();
    HostModel src(placement_json("trainer", kTrainer, defs, layers, "test-model", rev), defs, true, "trainer");
    HostAdapter adapter(src);
    mws_snapshot_adapter_vtable vt = HostAdapter::vtable();
    auto t0 = std::chrono::steady_clock::now();
    mws::Writer w = mws::Writer::begin(store, std::string(src.placement.resource_id()), rev,
                                       src.placement.weight_generation(), vt, &adapter, ns);
    mws::UploadPlan plan = w.upload_plan();
    std::string payload_key, group(plan.group_id()), manifest_key(plan.manifest_key());
    std::map<std::string, std::string> tensor_of;
    for (const View &v : src.views) tensor_of[v.pfid] = v.tensor;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) total += plan.operation(i).nbytes;
    payload_key = std::string(plan.operation(0).object_key);
    std::printf("{\"op\":\"plan\",\"manifest\":%s,\"group\":%s,\"payload_key\":%s,\"payload_bytes\":%llu}\n",
                jstr(manifest_key).c_str(), jstr(group).c_str(), jstr(payload_key).c_str(),
                static_cast<unsigned long long>(total));
    std::fflush(stdout);
    if (pause) {
        w.set_progress([total](const mws_progress &p) {
            if (p.bytes_done * 2 >= total && p.bytes_done < total) {
                std::printf("{\"paused\":true,\"bytes_done\":%llu}\n", static_cast<unsigned long long>(p.bytes_done));
                std::fflush(stdout);
                for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // killed here
            }
        });
    }
    std::set<std::pair<std::string, std::string>> seen;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        mws::UploadOperation op = plan.operation(i);
        std::string participant(op.source_participant_id);
        const std::string &tensor = tensor_of.at(std::string(op.source_placement_fragment_id));
        if (seen.insert({tensor, participant}).second) w.write_tensor(tensor, const_cast<char *>(participant.c_str()));
    }
    mws::StoredManifest m = w.commit();
    double t = ms_since(t0);
    ms::Stats s = a.stats();
    std::printf("{\"op\":\"snapshot\",\"manifest\":%s,\"tensors\":%zu,\"fragments\":%zu,\"bytes\":%llu,\"ms\":%.1f,"
                "\"batch_put_calls\":%llu,\"batch_put_items\":%llu}\n",
                jstr(std::string(m.key())).c_str(), m.tensor_count(), m.fragment_count(),
                static_cast<unsigned long long>(total), t, static_cast<unsigned long long>(s.batch_put_calls),
                static_cast<unsigned long long>(s.batch_put_items));
    return 0;
}

int restore_cmd(const ms::Adapter &a, const std::string &manifest_key, std::uint64_t layers) {
    const auto defs = model(layers);
    mws::Store store = a.store();
    auto t0 = std::chrono::steady_clock::now();
    mws::StoredManifest m = store.load_manifest(manifest_key);
    HostModel dst(placement_json("serving", kServer, defs, layers, "test-model", std::string(m.revision())), defs,
                  false, "server");
    std::size_t regions = 0;
    mws_load_stats st = restore(store, m, dst, &regions);
    double t = ms_since(t0);
    std::size_t verified = dst.verify();
    ms::Stats s = a.stats();
    std::printf("{\"op\":\"restore\",\"revision\":%s,\"regions\":%zu,\"bytes\":%llu,\"verified\":%zu,\"ms\":%.1f,"
                "\"ranges\":%llu,\"requests\":%llu,\"range_calls\":%llu}\n",
                jstr(std::string(m.revision())).c_str(), regions, static_cast<unsigned long long>(st.bytes), verified,
                t, static_cast<unsigned long long>(st.ranges), static_cast<unsigned long long>(st.requests),
                static_cast<unsigned long long>(s.range_calls));
    return 0;
}

int corrupt_cmd(const ms::Adapter &a, const std::string &key, const std::string &group) {
    std::int64_t n = a.raw_get_size(key);
    if (n <= 0) {
        std::printf("{\"op\":\"corrupt\",\"error\":\"get_size %lld\"}\n", static_cast<long long>(n));
        return 1;
    }
    std::vector<unsigned char> junk(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<unsigned char>(i * 7 + 1);
    a.raw_register(junk.data(), junk.size());
    int rc = a.raw_upsert_from(key, junk.data(), junk.size(), group, true);
    a.raw_unregister(junk.data());
    std::printf("{\"op\":\"corrupt\",\"key\":%s,\"bytes\":%lld,\"rc\":%d}\n", jstr(key).c_str(),
                static_cast<long long>(n), rc);
    return rc == 0 ? 0 : 1;
}

int selftest_cmd(const ms::Adapter &a) {
    int rc = a.self_test();
    // The codes the adapter reports, through the vtable itself.
    mws_store_vtable vt = ms::Adapter::vtable();
    void *ctx = a.new_ctx();
    auto b = [](const std::string &s) { return mws_bytes{s.data(), s.size()}; };
    std::string missing = "mws/selftest/missing";
    std::int64_t gs = vt.get_size(ctx, b(missing));
    std::int32_t ex = vt.exists(ctx, b(missing));
    std::int32_t rm = vt.remove(ctx, b(missing));
    mws_store_cost cost{};
    vt.get_cost(ctx, &cost);
    std::string k1 = "mws/selftest/k1";
    std::string v = "hello mooncake";
    std::int32_t put = vt.put(ctx, b(k1), reinterpret_cast<const uint8_t *>(v.data()), v.size(), b(""), 1);
    mws_bytes keys[2] = {b(k1), b(missing)};
    std::int64_t sizes[2] = {INT64_MIN, INT64_MIN};
    std::int32_t bgs = vt.batch_get_size(ctx, keys, 2, sizes);
    std::int32_t exs[2] = {-1, -1};
    std::int32_t bex = vt.batch_exists(ctx, keys, 2, exs);
    char small[4];
    std::int64_t gi_small = vt.get_into(ctx, b(k1), reinterpret_cast<uint8_t *>(small), sizeof small);
    // Ranged reads through the vtable into one registered buffer: k1 in two pieces that
    // tile it (read whole: batch_get_into_multi_buffers), k2 in one inner range and in
    // two pieces that stop short of its end (get_into_ranges), a missing key (-704).
    std::string k2 = "mws/selftest/k2", v2 = "0123456789abcdefghij";
    std::int32_t put2 = vt.put(ctx, b(k2), reinterpret_cast<const uint8_t *>(v2.data()), v2.size(), b(""), 1);
    alignas(64) static unsigned char buf[128];
    std::memset(buf, '.', sizeof buf);
    const std::uint64_t base = reinterpret_cast<std::uintptr_t>(buf);
    std::int32_t reg = vt.register_buffer(ctx, base, sizeof buf, MWS_MEMORY_HOST, 0);
    auto item = [&](const std::string &key, std::uint64_t off, std::uint64_t len, std::uint64_t at) {
        mws_range_item r{};
        r.key = b(key);
        r.object_offset = off;
        r.len = len;
        r.buffer_address = base;
        r.dest_address = base + at;
        r.memory_kind = MWS_MEMORY_HOST;
        return r;
    };
    // Listed out of object order on purpose: the adapter sorts a key's ranges.
    std::vector<mws_range_item> ranges = {item(k1, 5, 9, 20), item(k2, 3, 4, 40),  item(k1, 0, 5, 0),
                                          item(missing, 0, 4, 50), item(k2, 0, 2, 60), item(k2, 2, 6, 70)};
    std::vector<std::int64_t> rr(ranges.size(), INT64_MIN);
    ms::Stats before = a.stats();
    std::int32_t gir = vt.get_into_ranges(ctx, ranges.data(), ranges.size(), rr.data());
    ms::Stats after = a.stats();
    auto delta = [&](ms::Call c) { return after.calls[static_cast<int>(c)] - before.calls[static_cast<int>(c)]; };
    std::string got(reinterpret_cast<const char *>(buf), 78);
    // k1 grows behind the adapter's back (upsert, 16 bytes): the same two pieces tile
    // the size it remembers (14) but not the object; the whole-object read fails and
    // get_into_ranges reads the two ranges.
    std::string v1b = "HELLO MOONCAKE!!";
    std::int32_t ups = vt.upsert(ctx, b(k1), reinterpret_cast<const uint8_t *>(v1b.data()), v1b.size(), b(""), 1);
    std::vector<mws_range_item> stale = {item(k1, 0, 5, 100), item(k1, 5, 9, 110)};
    std::vector<std::int64_t> sr(stale.size(), INT64_MIN);
    ms::Stats before2 = a.stats();
    std::int32_t gir2 = vt.get_into_ranges(ctx, stale.data(), stale.size(), sr.data());
    ms::Stats after2 = a.stats();
    auto delta2 = [&](ms::Call c) { return after2.calls[static_cast<int>(c)] - before2.calls[static_cast<int>(c)]; };
    std::string got2(reinterpret_cast<const char *>(buf) + 100, 19);
    std::int32_t unreg = vt.unregister_buffer(ctx, base);
    std::int32_t rm2 = vt.remove(ctx, b(k2));
    std::int32_t rm1 = vt.remove(ctx, b(k1));
    vt.destroy(ctx);
    std::printf("{\"op\":\"ranges\",\"put\":%d,\"register\":%d,\"rc\":%d,\"results\":[", put2, reg, gir);
    for (std::size_t i = 0; i < rr.size(); ++i)
        std::printf("%s%lld", i ? "," : "", static_cast<long long>(rr[i]));
    std::printf("],\"bytes\":%s,\"batch_query\":%llu,\"multi_buffers\":%llu,\"unregister\":%d,\"remove\":%d}\n",
                jstr(got).c_str(), static_cast<unsigned long long>(delta(ms::Call::batch_query)),
                static_cast<unsigned long long>(delta(ms::Call::batch_get_into_multi_buffers)), unreg, rm2);
    std::printf("{\"op\":\"stale_size\",\"upsert\":%d,\"rc\":%d,\"results\":[%lld,%lld],\"bytes\":%s,"
                "\"batch_query\":%llu,\"multi_buffers\":%llu}\n",
                ups, gir2, static_cast<long long>(sr[0]), static_cast<long long>(sr[1]), jstr(got2).c_str(),
                static_cast<unsigned long long>(delta2(ms::Call::batch_query)),
                static_cast<unsigned long long>(delta2(ms::Call::batch_get_into_multi_buffers)));
    std::printf("{\"op\":\"selftest\",\"self_test\":%d,\"get_size_missing\":%lld,\"exists_missing\":%d,"
                "\"remove_missing\":%d,\"put\":%d,\"batch_get_size\":[%d,%lld,%lld],\"batch_exists\":[%d,%d,%d],"
                "\"get_into_small\":%lld,\"remove\":%d,\"name_704\":%s}\n",
                rc, static_cast<long long>(gs), ex, rm, put, bgs, static_cast<long long>(sizes[0]),
                static_cast<long long>(sizes[1]), bex, exs[0], exs[1], static_cast<long long>(gi_small), rm1,
                jstr(ms::error_name(-704)).c_str());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s MASTER hold|snapshot|restore|corrupt|revisions|selftest ...\n", argv[0]);
        return 2;
    }
    const std::string master = argv[1], cmd = argv[2];
    auto arg = [&](int i) { return std::string(i < argc ? argv[i] : ""); };
    const std::uint64_t segment = cmd == "hold" ? std::strtoull(arg(3).c_str(), nullptr, 10) << 20 : 0;
    int rc = 0;
    auto t0 = std::chrono::steady_clock::now();
    auto client = ms::connect_tcp(master, segment, 16u << 20, "127.0.0.1", &rc);
    if (!client) {
        std::printf("{\"error\":\"setup_real\",\"rc\":%d}\n", rc);
        return 1;
    }
    double setup_ms = ms_since(t0);
    int out = 0;
    {
        ms::Adapter adapter(client);
        try {
            if (cmd == "hold") {
                std::printf("{\"ready\":true,\"setup_ms\":%.1f}\n", setup_ms);
                std::fflush(stdout);
                std::string line;
                std::getline(std::cin, line);
            } else if (cmd == "snapshot") {
                out = snapshot_cmd(adapter, arg(3), arg(4), std::strtoull(arg(5).c_str(), nullptr, 10), arg(6) == "pause");
            } else if (cmd == "restore") {
                out = restore_cmd(adapter, arg(3), std::strtoull(arg(4).c_str(), nullptr, 10));
            } else if (cmd == "corrupt") {
                out = corrupt_cmd(adapter, arg(3), arg(4));
            } else if (cmd == "revisions") {
                mws::Store store = adapter.store();
                auto revs = store.revisions("test-model", arg(3));
                auto latest = store.latest("test-model", arg(3));
                std::printf("{\"op\":\"revisions\",\"count\":%zu,\"revisions\":[", revs.size());
                for (std::size_t i = 0; i < revs.size(); ++i)
                    std::printf("%s{\"revision\":%s,\"generation\":%llu,\"manifest\":%s}", i ? "," : "",
                                jstr(revs[i].revision).c_str(),
                                static_cast<unsigned long long>(revs[i].weight_generation),
                                jstr(revs[i].manifest_key).c_str());
                std::printf("],\"latest\":%s}\n", latest ? jstr(latest->manifest_key).c_str() : "null");
            } else if (cmd == "selftest") {
                out = selftest_cmd(adapter);
            } else {
                std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
                out = 2;
            }
        } catch (const mws::Error &e) {
            std::printf("{\"error\":%s,\"message\":%s}\n", jstr(std::string(mws::status_name(e.status()))).c_str(),
                        jstr(e.what()).c_str());
            out = 3;
        } catch (const std::exception &e) {
            std::printf("{\"error\":\"exception\",\"message\":%s}\n", jstr(e.what()).c_str());
            out = 1;
        }
        std::fflush(stdout);
    }
    ms::tear_down(*client);
    client.reset();
    return out;
}
