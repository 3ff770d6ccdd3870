// store_te_role.cpp: ONE C++ process that uses BOTH Mooncake adapters, as a serving
// engine does after a new revision: mooncake_weight_store::mooncake_store (the wheel's
// store.so, mooncake::RealClient with the Transfer Engine copy inside store.so) restores
// a revision from the REAL Mooncake Store, then mooncake_weight_store::mooncake_te (the
// process's own mooncake::TransferEngine from the wheel's engine.so) pushes the restored
// weights live, resharded, into a second instance's buffers. Here the second instance
// lives in the same process (its buffers registered by their owner with the same TE, its
// bindings naming this TE's segment), so every byte of the push crosses TE's TCP
// transport on loopback. Driven by store_real.py (case store_and_te).
//
//   store_te_role MASTER MANIFEST_KEY LAYERS TE_PORT
//
// Prints one JSON line {"op":"store_te",...}; exit 0 on success, 1 on any failure (the
// message on stderr).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_store.hpp"
#include "mooncake_weight_store/mooncake_te.hpp"
#include "support/mws_model.hpp"
#include "transfer_engine.h"

using namespace mwsmodel;
namespace ms = mws::mooncake_store;

namespace {

const Layout kServer{2, 1, 2, 1};  // TP2 x EP2: restored from the store
const Layout kPeer{4, 1, 1, 1};    // TP4: the instance the server pushes into

struct Result {
    int store_self_test = -1, te_self_check = -1;
    std::uint64_t restored = 0, restore_verified = 0, pushed = 0, push_verified = 0, te_calls = 0;
};

Result run(ms::Adapter &store_adapter, const std::string &manifest_key, std::uint64_t layers, int te_port) {
    Result r;
    r.store_self_test = store_adapter.self_test();
    if (r.store_self_test != 0) throw std::runtime_error("store adapter self_test failed");
    const auto defs = model_tensors(layers, 256, 4);

    // 1. Restore the revision from Mooncake Store (RealClient; store.so's TE inside).
    mws::Store store = store_adapter.store();
    mws::StoredManifest m = store.load_manifest(manifest_key);
    const std::string rev(m.revision());
    HostModel server(placement_json("serving", kServer, defs, layers, "test-model", rev), defs, false, "server",
                     layers);
    r.restored = restore(store, m, server).bytes;
    r.restore_verified = server.verify();

    // 2. The process's own Transfer Engine (engine.so) next to the store client's.
    mooncake::TransferEngine te(false);
    const std::string host = "127.0.0.1:" + std::to_string(te_port);
    if (te.init("P2PHANDSHAKE", host, "127.0.0.1", static_cast<std::uint64_t>(te_port)) != 0)
        throw std::runtime_error("TransferEngine::init failed");
    if (te.installTransport("tcp", nullptr) == nullptr) throw std::runtime_error("installTransport(tcp) failed");
    mws::mooncake_te::Adapter te_adapter(te);
    r.te_self_check = te_adapter.self_check();
    if (r.te_self_check != 0)
        throw std::runtime_error("TE adapter self_check: " + te_adapter.describe(r.te_self_check));
    mws::TransferEngine engine = te_adapter.engine();

    // 3. Push the restored weights live (TP2 x EP2 -> TP4) through TE.
    HostModel peer(placement_json("peer", kPeer, defs, layers, "test-model", rev), defs, false, "peer", layers);
    server.process_endpoint = peer.process_endpoint = te.getLocalIpAndPort();
    server.make_bindings("server", layers);
    peer.make_bindings("peer", layers);
    for (auto &b : peer.buffers) {  // the owner registers its weights with its TE
        if (te.registerLocalMemory(b.second.data(), b.second.size(), "cpu:0") != 0)
            throw std::runtime_error("registerLocalMemory failed");
    }
    {
        mws::TransferPlan plan =
            mws::TransferPlan::plan(server.placement, peer.placement).bind(peer.binding_ptrs(), server.binding_ptrs());
        mws::Sink sink(engine);
        for (const auto &b : server.bindings)
            r.pushed += sink.execute(plan, server.placement, b, peer.placement, peer.binding_ptrs()).bytes;
    }
    for (auto &b : peer.buffers) te.unregisterLocalMemory(b.second.data());
    r.push_verified = peer.verify();
    r.te_calls = te_adapter.counters().native_batches;
    return r;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s MASTER MANIFEST_KEY LAYERS TE_PORT\n", argv[0]);
        return 2;
    }
    int rc = 0;
    auto client = ms::connect_tcp(argv[1], 0, 16u << 20, "127.0.0.1", &rc);
    if (!client) {
        std::fprintf(stderr, "setup_real failed: %d\n", rc);
        return 1;
    }
    int out = 0;
    try {
        ms::Adapter store_adapter(client);
        Result r = run(store_adapter, argv[2], std::strtoull(argv[3], nullptr, 10), std::atoi(argv[4]));
        std::printf("{\"op\":\"store_te\",\"store_self_test\":%d,\"te_self_check\":%d,\"restored\":%llu,"
                    "\"restore_verified\":%llu,\"pushed\":%llu,\"push_verified\":%llu,\"te_batches\":%llu}\n",
                    r.store_self_test, r.te_self_check, static_cast<unsigned long long>(r.restored),
                    static_cast<unsigned long long>(r.restore_verified), static_cast<unsigned long long>(r.pushed),
                    static_cast<unsigned long long>(r.push_verified), static_cast<unsigned long long>(r.te_calls));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        out = 1;
    }
    std::fflush(stdout);
    ms::tear_down(*client);
    client.reset();
    return out;
}
