// prepared_transfer.cpp: a live transfer prepared once and stepped many times through
// the C ABI and the C++ wrapper, over an engine implemented in C callbacks
// (mws_transfer_engine_vtable: memcpy between buffers, an identity that can change
// like a restarted engine, legacy batches that can fail) and an allocation guard in
// C callbacks (mws_guard_vtable) that reports what it observes under its pins.
//
// A trainer in TP4 x PP2 x DP2 pushes (sink mode) and a server in TP8 pulls (reader
// mode) generation after generation: the trainer's buffers change between steps and
// every server byte is verified after each. Then each refusal of stale prepared state,
// each before any byte moves and reported with "prepare the transfer again":
// another placement, a new instance, another lease, moved buffers, freed buffers (the
// guard's MWS_STALE_BINDING), a rotation under another instance, an engine restart,
// and registrations held by a pending transfer. Last, the stored source: a restore
// prepared once reads each generation the trainer commits, given only that generation,
// and refuses one never committed and one of another layout. Exits non-zero on any failure.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/callback_engine.hpp"
#include "support/mws_model.hpp"

using namespace mwsmodel;

namespace {

void require(bool ok, const char *what) {
    if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

// ---- an allocation guard in C callbacks ------------------------------------------------

/// What the guard reports for one participant from now on.
enum class Seen { same, other_placement, new_instance, other_lease, moved, freed };

struct Guard {
    std::mutex mu;
    std::string participant;  // the participant the stale observation is about
    Seen seen = Seen::same;
    HostModel *other = nullptr;  // the model an observed binding is taken from
    std::string instance = "serving";
    std::uint64_t generation = 1;
    std::uint64_t acquires = 0, releases = 0;
    std::vector<std::uint32_t> states;

    static Guard &of(void *ctx) { return *static_cast<Guard *>(ctx); }
    static std::int32_t acquire(void *ctx, const char *, const char *participant, const char *const *, std::size_t,
                                mws_binding **observed, std::uint64_t *token) noexcept {
        Guard &g = of(ctx);
        try {
            std::lock_guard<std::mutex> lock(g.mu);
            g.acquires += 1;
            *token = g.acquires;
            if (g.seen == Seen::same || g.participant != participant) return 0;
            if (g.seen == Seen::freed) return MWS_STALE_BINDING;
            g.other->make_bindings(g.instance, g.generation);
            // Bindings follow the participants' buffers in order.
            std::size_t i = 0;
            for (const auto &b : g.other->buffers) {
                if (b.first == participant) {
                    *observed = g.other->bindings[i].release();
                    return 0;
                }
                ++i;
            }
            return -1;
        } catch (...) {
            return -1;
        }
    }
    static std::int32_t release(void *ctx, std::uint64_t, std::uint32_t state) noexcept {
        Guard &g = of(ctx);
        std::lock_guard<std::mutex> lock(g.mu);
        g.releases += 1;
        g.states.push_back(state);
        return 0;
    }
    void observe(const std::string &p, Seen s, HostModel *m, const std::string &inst, std::uint64_t gen) {
        std::lock_guard<std::mutex> lock(mu);
        participant = p;
        seen = s;
        other = m;
        instance = inst;
        generation = gen;
    }
};

void register_all(const mws::TransferEngine &engine, const HostModel &m) {
    for (const auto &b : m.buffers) engine.register_memory(b.second.data(), b.second.size());
}

void unregister_all(const mws::TransferEngine &engine, const HostModel &m) {
    for (const auto &b : m.buffers) engine.unregister_memory(b.second.data());
}

void reset(HostModel &m) {
    for (auto &b : m.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
}

bool untouched(const HostModel &m) {
    for (const auto &b : m.buffers)
        for (unsigned char x : b.second)
            if (x != 0xA5) return false;
    return true;
}

/// Flips every byte of the trainer (a new generation in the same buffers).
void next_generation(HostModel &m) {
    for (auto &b : m.buffers)
        for (unsigned char &x : b.second) x ^= 0xFF;
}

/// Every view of `participant` holds its expected bytes.
void verify_participant(const HostModel &m, const std::string &participant) {
    std::vector<unsigned char> want;
    std::size_t views = 0;
    for (const View &v : m.views) {
        if (v.participant != participant) continue;
        want.resize(v.nbytes);
        expected_bytes(m.content_ids.at(v.tensor), m.global_shapes.at(v.tensor), v.itemsize, v.goffset.data(),
                       v.shape.data(), v.shape.size(), want.data());
        require(std::memcmp(m.buffers.at(participant).data() + v.offset, want.data(), v.nbytes) == 0,
                "the participant's bytes");
        views += 1;
    }
    require(views > 0, "the participant has views");
}

/// The step fails with `status`, its message contains `text`, and no byte moved.
void refused(const mws::PreparedTransfer &p, std::uint64_t generation, const HostModel &dst, mws_status status,
             const char *text, const char *what, const std::vector<mws::LeaseRotation> &leases = {}) {
    bool thrown = false;
    try {
        p.step(generation, leases);
    } catch (const mws::Error &e) {
        thrown = true;
        std::string m = e.what();
        if (e.status() != status || m.find(text) == std::string::npos) {
            throw std::runtime_error(std::string(what) + ": unexpected error " + std::to_string(e.status()) + ": " + m);
        }
    }
    require(thrown, what);
    require(untouched(dst), what);
    mws::LiveReport r = p.last_report();
    require(!r.submitted, what);
    for (const mws::TargetOutcome &t : r.targets) require(t.verdict == MWS_TARGET_UNCHANGED, what);
}

}  // namespace

int main() {
    try {
        std::vector<TensorDef> defs = model_tensors(2, 32, 0, 1);
        HostModel src(placement_json("trainer", Layout{4, 2, 1, 2}, defs, 1), defs, true, "trainer");
        // TP8: the server participants t4..t7 have no namesake among the trainer's (the
        // guard's callbacks see participant ids only).
        HostModel dst(placement_json("serving", Layout{8, 1, 1, 1}, defs, 1), defs, false, "serving");
        mws::TransferPlan plan = mws::TransferPlan::plan(src.placement, dst.placement)
                                     .bind(dst.binding_ptrs(), src.binding_ptrs());

        CallbackEngine native;
        mws::TransferEngine engine = native.open();
        Guard guard;
        mws_guard_vtable gvt{};
        gvt.size = sizeof gvt;
        gvt.version = MWS_GUARD_VTABLE_VERSION;
        gvt.acquire = &Guard::acquire;
        gvt.release = &Guard::release;
        mws_live_args args{};
        args.guard = &gvt;
        args.guard_ctx = &guard;

        // Sink mode: every trainer participant prepared once, three generations.
        register_all(engine, dst);
        {
            mws::Sink sink(engine);
            std::vector<mws::PreparedTransfer> prepared;
            for (const auto &b : src.bindings)
                prepared.push_back(sink.prepare(plan, src.placement, b, dst.placement, dst.binding_ptrs(), &args));
            require(untouched(dst), "preparing moves no byte");
            for (std::uint64_t g = 2; g <= 4; ++g) {
                reset(dst);
                std::uint64_t bytes = 0;
                for (const mws::PreparedTransfer &p : prepared) {
                    mws_transfer_stats s = p.step(g);
                    bytes += s.bytes;
                    mws::LiveReport r = p.last_report();
                    for (const mws::TargetOutcome &t : r.targets)
                        require(t.verdict == MWS_TARGET_UPDATED && t.weight_generation == g, "updated to the step's generation");
                }
                require(bytes == plan.total_bytes(), "every planned byte per step");
                // Generation 3 moved the flipped trainer bytes: flip them back to compare.
                if (g == 3) next_generation(dst);
                dst.verify();
                if (g != 4) next_generation(src);
            }
            std::printf("sink mode: %zu prepared, 3 steps verified\n", prepared.size());
            std::fflush(stdout);
        }
        unregister_all(engine, dst);
        require(engine.resources().pending_transfers == 0, "nothing pending");
        {
            std::lock_guard<std::mutex> g(native.mu);
            require(native.regions.empty(), "the prepared transfers unregistered their sources");
        }

        // Reader mode, then every staleness refusal on one prepared reader.
        reset(dst);
        register_all(engine, src);
        mws::Loader loader(engine);
        const std::string participant = "w-d0-p0-e0-t5";
        std::size_t k = 0;
        for (const auto &b : dst.buffers) {
            if (b.first == participant) break;
            ++k;
        }
        require(k < dst.bindings.size(), "participant t5");
        const mws::Binding &local = dst.bindings[k];
        mws::PreparedTransfer p =
            loader.prepare_live(plan, src.placement, src.binding_ptrs(), dst.placement, local, &args);
        mws_prepared_info info = p.info();
        require(info.empty == 0 && info.batches > 0 && info.pinned_bindings == 1 + plan.executor_count(MWS_SIDE_SOURCE),
                "the reader pins its target and every planned source");
        std::uint64_t before = guard.acquires;
        p.step(7);
        require(guard.acquires - before == info.pinned_bindings, "one pin per binding per step");
        mws::LiveReport ok = p.last_report();
        require(ok.submitted && ok.guard_release == MWS_GUARD_COMPLETED && ok.targets.size() == 1 &&
                    ok.targets[0].verdict == MWS_TARGET_UPDATED && ok.targets[0].weight_generation == 7,
                "reader step report");

        // The same server placement under another placement set: another placement id.
        HostModel other_set(placement_json("serving-b", Layout{8, 1, 1, 1}, defs, 1), defs, false, "serving");
        HostModel moved(placement_json("serving", Layout{8, 1, 1, 1}, defs, 1), defs, false, "serving");
        struct Case {
            Seen seen;
            HostModel *model;
            const char *instance;
            std::uint64_t generation;
            mws_status status;
            const char *text;
            const char *what;
        };
        const Case cases[] = {
            {Seen::other_placement, &other_set, "serving", 1, MWS_STALE_BINDING, "placement_id differs", "another placement"},
            {Seen::new_instance, &dst, "serving-restarted", 1, MWS_STALE_BINDING, "instance_id differs", "a new instance"},
            {Seen::other_lease, &dst, "serving", 2, MWS_STALE_BINDING, "generation differs", "another lease"},
            {Seen::moved, &moved, "serving", 1, MWS_STALE_BINDING, "address differs", "moved buffers"},
            {Seen::freed, nullptr, "serving", 1, MWS_STALE_BINDING, "freed or moved", "freed buffers"},
        };
        for (const Case &c : cases) {
            guard.observe(participant, c.seen, c.model, c.instance, c.generation);
            reset(dst);
            std::size_t releases = guard.states.size();
            refused(p, 8, dst, c.status, c.text, c.what);
            refused(p, 8, dst, c.status, "prepare the transfer again", c.what);
            for (std::size_t i = releases; i < guard.states.size(); ++i)
                require(guard.states[i] == MWS_TERMINAL_ABORTED, "pins released aborted");
        }
        guard.observe(participant, Seen::same, nullptr, "serving", 1);
        reset(dst);
        p.step(8);
        verify_participant(dst, participant);

        // A rotated lease, then a rotation under another instance: a new instance.
        p.step(9, {{"serving", participant, "serving-lease-9", 9}});
        reset(dst);
        refused(p, 10, dst, MWS_STALE_BINDING, "now runs as instance", "a rotation under another instance",
                {{"serving-2", participant, "serving-lease-10", 10}});
        refused(p, 10, dst, MWS_INVALID_ARGUMENT, "names no binding", "a rotation naming nothing",
                {{"nowhere", "nobody", "l", 1}});

        // An engine restart (a new identity behind the same vtable).
        native.id += 1;
        refused(p, 11, dst, MWS_STALE_BINDING, "restarted since the transfer was prepared", "an engine restart");
        native.id -= 1;
        p.step(11);

        // A legacy batch that fails leaves completion unknown: the prepared target
        // registration goes to the pending transfer, later steps are refused.
        native.fail_batches = -1;
        bool unknown = false;
        try {
            p.step(12);
        } catch (const mws::Error &e) {
            unknown = std::string(e.what()).find("completion is unknown") != std::string::npos;
        }
        require(unknown, "completion unknown");
        require(p.last_report().guard_release == MWS_GUARD_PENDING, "pins held by the pending transfer");
        native.fail_batches = 0;
        reset(dst);
        refused(p, 13, dst, MWS_STALE_BINDING, "held by pending transfer", "registrations held by a pending transfer");
        require(engine.pending_count() == 1, "the restart-required entry stays");
        std::printf("reader mode: steps verified; every staleness refused before any byte moved\n");

        // The stored source: a server prepared once restores each generation the
        // trainer commits (same layout, new bytes), given only that generation.
        {
            mws::Store store = mws::Store::open_memory();
            HostModel t1(placement_json("trainer", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer");
            mws::StoredManifest first = snapshot(store, t1);
            HostModel server(placement_json("serving", Layout{8, 1, 1, 1}, defs, 1), defs, false, "serving");
            mws::LoadPlan lp = mws::LoadPlan::plan(first, server.placement, server.binding_ptrs());
            mws::TransferEngine local = mws::TransferEngine::local();
            mws::Loader restorer(local);
            mws::PreparedTransfer restore = restorer.prepare_stored(store, lp, server.bindings[k]);
            require(restore.info().bytes > 0 && restore.info().batches == 0, "a prepared restore");
            restore.restore(1);
            verify_participant(server, participant);
            for (std::uint64_t g = 2; g <= 3; ++g) {
                HostModel t(placement_json("trainer", Layout{2, 1, 1, 1}, defs, g), defs, true, "trainer");
                if (g == 2) next_generation(t);
                snapshot(store, t);
                reset(server);
                mws_transfer_stats s = restore.restore(g);
                require(s.bytes == restore.info().bytes, "every byte of the participant");
                if (g == 2) next_generation(server);  // flipped bytes restored: flip back to compare
                verify_participant(server, participant);
            }
            bool missing = false;
            try {
                restore.restore(9);
            } catch (const mws::Error &e) {
                missing = e.status() == MWS_NOT_FOUND;
            }
            require(missing, "a generation never committed");
            std::vector<TensorDef> bigger = model_tensors(3, 32, 0, 1);
            HostModel t4(placement_json("trainer", Layout{2, 1, 1, 1}, bigger, 4), bigger, true, "trainer");
            snapshot(store, t4);
            bool stale = false;
            try {
                restore.restore(4);
            } catch (const mws::Error &e) {
                stale = e.status() == MWS_STALE_BINDING &&
                        std::string(e.what()).find("prepare the transfer again") != std::string::npos;
            }
            require(stale, "a generation of another layout");
            std::printf("stored source: generations 1..3 restored through one preparation\n");
        }
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "prepared_transfer: %s\n", e.what());
        return 1;
    }
}
