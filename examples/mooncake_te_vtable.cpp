// mooncake_te_vtable.cpp: how a C++ process that runs Mooncake's Transfer Engine
// (`mooncake::TransferEngine`) plugs it into the live-transfer executors through the
// engine vtable, built and run everywhere against an in-process STAND-IN of that
// engine (no Mooncake needed). The mapping itself is the adapter library's
// (adapters/mooncake_te/include/mooncake_weight_store/mooncake_te_core.hpp, TeCore<Api>),
// which the real adapter mooncake_weight_store::mooncake_te instantiates with
// Mooncake's own types and this program with the stand-in's; see that header for the
// call-by-call mapping. On the real engine the same code runs in cpp_tests/mooncake
// (ctest label `mooncake`, two processes; .ci/mooncake.sh).
//
// The stand-in (support/te_standin.hpp, shared with examples/serving_engine.cpp) has
// the observable semantics of mooncake::TransferEngine as far as the adapter depends
// on them, so the mapping is tested here under valgrind and ASan (ctest
// int.example_mooncake_te_vtable and leak.mws_example_mooncake_te_vtable).
//
// The program: a trainer in TP4 x DP2 and a server in TP2 x EP2, one engine per
// participant, plans the live reshard, pulls (reader: staged reads of the column-split
// rows, and without staging) and pushes (sink, notified: the server accepts through
// getNotifies) through the adapter, legacy batches and tickets, and verifies every
// target byte each time; it checks that a batch larger than the queue limit is split
// by the adapter (and fails when the adapter does not split), that an engine failure
// fails the call with nothing pending and no registration left behind (and that a
// failed staged read is re-read unstaged), and that unknown ids are errors.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"
#include "support/te_standin.hpp"

namespace {

using namespace mwsmodel;

void require(bool ok, const std::string &what) {
    if (!ok) throw std::runtime_error("check failed: " + what);
}

using Adapter = mcte::TeVtable<mcte::StandInApi>;

/// One instance (trainer or server): a model, one stand-in engine and adapter per
/// participant (a process per rank in real life), all published on one fabric.
struct Instance {
    HostModel model;
    std::map<std::string, std::unique_ptr<mcte::standin::TransferEngine>> engines;
    std::map<std::string, std::unique_ptr<Adapter>> adapters;

    Instance(mcte::standin::Fabric &fabric, const std::string &set, const Layout &layout,
             const std::vector<TensorDef> &defs, bool fill, const std::string &instance, const std::string &prefix)
        : model(placement_json(set, layout, defs, 1), defs, fill, instance) {
        model.endpoint_prefix = prefix;
        model.make_bindings(instance, 1);
        for (const auto &b : model.buffers) {
            auto e = std::make_unique<mcte::standin::TransferEngine>(fabric);
            require(e->init("P2PHANDSHAKE", prefix + b.first + ":17000") == 0, "engine init");
            adapters[b.first] = std::make_unique<Adapter>(*e, mcte::plain_options());
            engines[b.first] = std::move(e);
        }
    }
    /// The owners register their whole allocations on their own engines.
    void register_all() {
        for (auto &b : model.buffers) require(engines[b.first]->registerLocalMemory(b.second.data(), b.second.size()) == 0, "register");
    }
    void unregister_all() {
        for (auto &b : model.buffers) require(engines[b.first]->unregisterLocalMemory(b.second.data()) == 0, "unregister");
    }
    void reset() {
        for (auto &b : model.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
    }
    const mws::Binding &binding(const std::string &participant) const {
        std::size_t i = 0;
        for (const auto &b : model.buffers) {
            if (b.first == participant) return model.bindings.at(i);
            ++i;
        }
        throw std::runtime_error("no participant " + participant);
    }
    std::size_t registrations() {
        std::size_t n = 0;
        for (auto &e : engines) n += e.second->registration_count();
        return n;
    }
};

struct Totals {
    std::uint64_t bytes = 0, operations = 0, engine_operations = 0, receipts = 0;
    void add(const mws_transfer_stats &s) {
        bytes += s.bytes;
        operations += s.operations;
        engine_operations += s.engine_operations;
        receipts += s.receipts;
    }
};

/// Every server participant pulls its part through its own engine.
Totals pull(Instance &src, Instance &dst, const mws::TransferPlan &plan, bool tickets,
            const mws_executor_limits *limits = nullptr) {
    Totals t;
    src.register_all();
    for (const auto &b : dst.model.buffers) {
        mws::TransferEngine engine = dst.adapters[b.first]->open(tickets);
        mws::Loader loader(engine, limits);
        mws_transfer_stats s = loader.load_live(plan, src.model.placement, src.model.binding_ptrs(),
                                                dst.model.placement, dst.binding(b.first));
        t.add(s);
        require(engine.pending_count() == 0, "nothing pending after a pull");
    }
    src.unregister_all();
    return t;
}

/// Every trainer participant pushes its part (the unselected DP replica sends nothing).
Totals push(Instance &src, Instance &dst, const mws::TransferPlan &plan, bool tickets,
            const mws_executor_limits *limits = nullptr) {
    Totals t;
    dst.register_all();
    for (const auto &b : src.model.buffers) {
        mws::TransferEngine engine = src.adapters[b.first]->open(tickets);
        mws::Sink sink(engine, limits);
        mws_transfer_stats s =
            sink.execute(plan, src.model.placement, src.binding(b.first), dst.model.placement, dst.model.binding_ptrs());
        t.add(s);
    }
    dst.unregister_all();
    return t;
}

int run_stand_in() {
    // Column splits (o_proj, down_proj) give many short rows: more than 1024 segments
    // between one source and one target participant.
    const std::vector<TensorDef> defs = model_tensors(2, 512, 2);
    mcte::standin::Fabric fabric;
    Instance src(fabric, "trainer", Layout{4, 1, 1, 2}, defs, true, "trainer", "trainer/");
    Instance dst(fabric, "serving", Layout{2, 1, 2, 1}, defs, false, "serving", "server/");
    mws::TransferPlan plan =
        mws::TransferPlan::plan(src.model.placement, dst.model.placement).bind(dst.model.binding_ptrs(), src.model.binding_ptrs());
    const std::uint64_t total = plan.total_bytes();

    // Pull and push, legacy batches and tickets; every target byte verified each time.
    for (bool tickets : {false, true}) {
        const char *mode = tickets ? "tickets" : "legacy batches";
        dst.reset();
        Totals p = pull(src, dst, plan, tickets);
        require(p.bytes == total, "pull moved every planned byte");
        std::size_t checked = dst.model.verify();
        std::printf("pull (%s): %llu bytes, %llu planned segments in %llu engine operations, %llu receipts, "
                    "%zu bytes verified\n",
                    mode, static_cast<unsigned long long>(p.bytes), static_cast<unsigned long long>(p.operations),
                    static_cast<unsigned long long>(p.engine_operations), static_cast<unsigned long long>(p.receipts),
                    checked);
        dst.reset();
        Totals w = push(src, dst, plan, tickets);
        require(w.bytes == total, "push moved every planned byte");
        checked = dst.model.verify();
        std::printf("push (%s): %llu bytes, %llu planned segments in %llu engine operations, %llu receipts, "
                    "%zu bytes verified\n",
                    mode, static_cast<unsigned long long>(w.bytes), static_cast<unsigned long long>(w.operations),
                    static_cast<unsigned long long>(w.engine_operations), static_cast<unsigned long long>(w.receipts),
                    checked);
        require(src.registrations() == 0 && dst.registrations() == 0, "no registration left behind");
    }

    // One executor batch per endpoint (max_batch_operations far above the queue limit):
    // the adapter must split it into native batches of at most 1024 requests.
    mws_executor_limits big{1u << 20, 1000000, 10000000, 3, 1000, 0};
    for (bool tickets : {false, true}) {
        dst.reset();
        std::size_t native_before = 0;
        for (auto &a : dst.adapters) native_before += a.second->native_batches();
        Totals p = pull(src, dst, plan, tickets, &big);
        std::size_t native = 0, largest = 0, rejected = 0, queued = 0;
        for (auto &a : dst.adapters) {
            native += a.second->native_batches();
            largest = std::max(largest, a.second->largest_native_batch());
        }
        for (auto &e : dst.engines) {
            rejected += e.second->rejections;
            queued = std::max(queued, e.second->max_queued);
        }
        native -= native_before;
        require(p.engine_operations > 1024 * p.receipts, "some endpoint's batch exceeds the queue limit");
        require(native > p.receipts && largest <= 1024 && queued <= 1024 && rejected == 0,
                "the adapter split every batch to the queue limit");
        std::size_t checked = dst.model.verify();
        std::printf("split (%s): %llu operations to %llu endpoints in %zu native batches (largest %zu, "
                    "peak queue %zu), %zu bytes verified\n",
                    tickets ? "tickets" : "legacy", static_cast<unsigned long long>(p.operations),
                    static_cast<unsigned long long>(p.receipts), native, largest, queued, checked);
    }

    // Negative control: an adapter that does not split overflows the stand-in's queue,
    // and the call fails (a failed ticket: nothing pending afterwards).
    {
        dst.reset();
        src.register_all();
        const std::string p0 = dst.model.buffers.begin()->first;
        Adapter unsplit(*dst.engines[p0], mcte::plain_options(std::size_t{1} << 20));
        mws::TransferEngine engine = unsplit.open(true);
        mws::Loader loader(engine, &big);
        bool failed = false;
        try {
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        } catch (const mws::Error &e) {
            failed = e.status() == MWS_STORE;
        }
        src.unregister_all();
        require(failed && dst.engines[p0]->rejections > 0, "an unsplit batch over the queue limit fails");
        require(engine.pending_count() == 0 && dst.engines[p0]->open_batches() == 0 && dst.registrations() == 0,
                "the failed call leaves nothing pending or registered");
        std::printf("unsplit batch over the queue limit: refused by the engine (%zu requests rejected), call failed\n",
                    dst.engines[p0]->rejections);
    }

    // An engine failure mid-transfer: the call fails, nothing is pending, registered or
    // reported (the loader's statistics stay empty), and a retry succeeds.
    {
        dst.reset();
        src.register_all();
        const std::string p0 = dst.model.buffers.begin()->first;
        mws::TransferEngine engine = dst.adapters[p0]->open(true);
        mws::Loader loader(engine);
        dst.engines[p0]->fail_task_after(100);
        bool failed = false;
        std::string message;
        try {
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        } catch (const mws::Error &e) {
            failed = e.status() == MWS_STORE;
            message = e.what();
        }
        require(failed, "an engine failure fails the call");
        require(message.find("FAILED") != std::string::npos, "the failure is a known failure: " + message);
        mws_transfer_stats s = loader.stats();
        require(s.bytes == 0 && s.receipts == 0, "nothing reported updated");
        require(engine.pending_count() == 0 && dst.engines[p0]->open_batches() == 0 && dst.registrations() == 0,
                "nothing pending or registered after the failure");
        dst.engines[p0]->fail_task_after(-1);
        mws_transfer_stats ok =
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        require(ok.bytes > 0, "retry");
        src.unregister_all();
        std::printf("engine failure: call failed (%s); retry moved %llu bytes\n", message.c_str(),
                    static_cast<unsigned long long>(ok.bytes));
    }

    // Staged reads: the column-split rows of each source fragment are contiguous on the
    // source side, so each run is read as one request into the adapter's registered
    // staging pool and copied to the strided target rows; a failed staged run is read
    // again without staging.
    {
        std::uint64_t runs = 0, ranges = 0, retries = 0;
        std::size_t verified = 0, verified_after_failure = 0;
        src.register_all();
        for (const auto &b : dst.model.buffers) {
            Adapter staged(*dst.engines[b.first]);  // default options: staging on
            mws::TransferEngine engine = staged.open(true);
            mws::Loader loader(engine);
            for (int round = 0; round < 2; ++round) {
                dst.reset();
                if (round == 1) {
                    // The next staged run fails: the ticket is read again unstaged.
                    auto pool = staged.staging_pool();
                    require(pool.first != nullptr, "the first round staged");
                    dst.engines[b.first]->fail_next_local_in(pool.first, pool.second);
                }
                std::uint64_t moved = loader.load_live(plan, src.model.placement, src.model.binding_ptrs(),
                                                       dst.model.placement, dst.binding(b.first))
                                          .bytes;
                require(moved > 0 && engine.pending_count() == 0, "staged pull, nothing pending");
                for (const View &v : dst.model.views) {
                    if (v.participant != b.first) continue;
                    std::vector<unsigned char> want(v.nbytes);
                    expected_bytes(dst.model.content_ids.at(v.tensor), dst.model.global_shapes.at(v.tensor),
                                   v.itemsize, v.goffset.data(), v.shape.data(), v.shape.size(), want.data());
                    require(std::memcmp(dst.model.buffers.at(b.first).data() + v.offset, want.data(), v.nbytes) == 0,
                            "staged target bytes");
                    (round == 0 ? verified : verified_after_failure) += v.nbytes;
                }
            }
            mws::mooncake_te::Counters c = staged.counters();
            runs += c.staged_runs;
            ranges += c.staged_ranges;
            retries += c.unstaged_retries;
        }
        src.unregister_all();
        require(verified == total && verified_after_failure == total, "every byte, both rounds");
        require(runs > 0 && ranges > runs, "staged reads moved the rows in fewer requests");
        require(retries == dst.model.buffers.size(), "each failed staged read was re-read unstaged");
        require(dst.registrations() == 0, "the staging pools are unregistered with their adapters");
        std::printf("staged reads: %llu ranges in %llu requests; a failed staged run re-read unstaged %llu times; "
                    "%zu + %zu bytes verified\n",
                    static_cast<unsigned long long>(ranges), static_cast<unsigned long long>(runs),
                    static_cast<unsigned long long>(retries), verified, verified_after_failure);
    }

    // Device targets are never staged: a READ into local memory registered as cuda:0
    // goes straight to the engine (the CPU would otherwise copy the staged run into
    // device memory); the same READ into host memory is staged.
    {
        src.register_all();
        const auto &s0 = *src.model.buffers.begin();
        const std::string endpoint = "trainer/" + s0.first + ":17000";
        for (int device : {-1, 0}) {
            Adapter a(*dst.engines.begin()->second);  // default options: staging on
            mws_transfer_engine_vtable vt = a.vtable_with(true);
            std::vector<unsigned char> local(8 * 128, 0);
            require(vt.register_memory(a.ctx(), reinterpret_cast<std::uint64_t>(local.data()), local.size(), device) == 0,
                    "register the local buffer");
            std::uint64_t l[8], r[8], n[8];
            for (int i = 0; i < 8; ++i) {
                l[i] = reinterpret_cast<std::uint64_t>(local.data()) + 128 * i;  // strided locally
                r[i] = reinterpret_cast<std::uint64_t>(s0.second.data()) + 64 * i;  // contiguous remotely
                n[i] = 64;
            }
            mws_bytes ep{endpoint.data(), endpoint.size()};
            require(vt.batch_transfer_sync_read(a.ctx(), ep, l, r, n, 8) == 0, "read");
            for (int i = 0; i < 8; ++i) {
                require(std::memcmp(local.data() + 128 * i, s0.second.data() + 64 * i, 64) == 0, "read bytes");
            }
            std::uint64_t runs = a.counters().staged_runs;
            require(device < 0 ? runs == 1 : runs == 0,
                    device < 0 ? "host memory: the run is staged" : "device memory: never staged");
            require(vt.unregister_memory(a.ctx(), reinterpret_cast<std::uint64_t>(local.data())) == 0, "unregister");
        }
        src.unregister_all();
        std::printf("staged reads: host targets staged, device (cuda:0) targets read directly\n");
    }

    // The notify hook: each source pushes with mws_sink_execute_notified; each target
    // learns what landed only through its engine's getNotifies and its acceptor.
    {
        const std::string key = "a shared key of at least 16 bytes";
        dst.reset();
        dst.register_all();
        for (const auto &b : src.model.buffers) {
            mws::TransferEngine engine = src.adapters[b.first]->open(true);
            mws::Sink sink(engine);
            mws::sink_execute_notified(sink, key, plan, src.model.placement, src.binding(b.first), dst.model.placement,
                                       dst.model.binding_ptrs());
        }
        std::size_t accepted = 0;
        for (const auto &b : dst.model.buffers) {
            mws::NotifyAcceptor acceptor(plan, b.first, key);
            std::vector<mcte::standin::NotifyDesc> got;
            dst.engines[b.first]->getNotifies(got);
            for (const auto &n : got) {
                require(n.name == mws::notify_name(), "notify name");
                std::string why;
                require(acceptor.accept(n.notify_msg, nullptr, &why) == MWS_NOTIFY_ACCEPTED, "accepted: " + why);
                ++accepted;
                std::string replay_why;
                require(acceptor.accept(n.notify_msg, nullptr, &replay_why) == MWS_NOTIFY_REPLAYED, "replay refused");
            }
            mws_notify_outcome o = acceptor.outcome();
            require(o.verdict == MWS_TARGET_UPDATED && o.weight_generation == 1, "target updated through the notify hook");
        }
        dst.unregister_all();
        std::printf("notified push: %zu notifications accepted, every target updated, %zu bytes verified\n", accepted,
                    dst.model.verify());
    }

    // Unknown ids are errors, never crashes: a ticket the adapter never issued, and a
    // native batch id the engine never allocated.
    {
        Adapter &a = *dst.adapters.begin()->second;
        mws_transfer_engine_vtable vt = a.vtable_with(true);
        std::int32_t status = 0;
        require(vt.ticket_status(a.ctx(), 987654321, &status) == mws::mooncake_te::kErrUnknownTicket,
                "unknown ticket -> error");
        require(vt.ticket_drain(a.ctx(), 987654321, 10, &status) == mws::mooncake_te::kErrUnknownTicket,
                "unknown ticket drain -> error");
        vt.ticket_release(a.ctx(), 987654321);
        require(vt.unregister_memory(a.ctx(), 0x1000) == mws::mooncake_te::kErrNotOurs,
                "memory the adapter did not register is never unregistered");
        mcte::standin::TransferStatus st{};
        require(!dst.engines.begin()->second->getTransferStatus(42, 0, st).ok(), "unknown batch id -> error status");
        require(!dst.engines.begin()->second->freeBatchID(42).ok(), "unknown batch id -> error on free");
    }
    std::printf("in-process Mooncake TE stand-in, TP4 x DP2 -> TP2 x EP2, %llu bytes per transfer: "
                "every target byte verified: OK\n",
                static_cast<unsigned long long>(total));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        (void)argc;
        (void)argv;
        return run_stand_in();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "mooncake_te_vtable: %s\n", e.what());
        return 1;
    }
}
