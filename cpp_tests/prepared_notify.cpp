// prepared_notify.cpp (issue 46, items 1 and 3): prepared pushes that notify and
// content-verified flips, through the C ABI and the C++ wrapper, over an engine
// implemented in C callbacks with a notify channel (support/callback_engine.hpp:
// memcpy between registered buffers, a mailbox per endpoint, a byte flipped on demand
// after a batch, as a faulty NIC or DMA would).
//
// A trainer in TP2 x PP2 pushes into a server in TP4, prepared once, generation after
// generation, each step notified and content-verified; the server's acceptors (one per
// participant, all in one mws_notify_router, as one serving process holding every
// target would) follow the step's generation and report each target updated only
// after checking its bytes. Then: an older generation's replay is stale and changes
// nothing; a flipped target byte is torn with its range named; an unverified done at
// a verifying acceptor is refused; steps started without blocking (item 2) do the
// same, their callbacks run once; a prepared reader cannot notify. Exits non-zero on
// any failure.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/callback_engine.hpp"
#include "support/mws_model.hpp"

using namespace mwsmodel;

namespace {

void require(bool ok, const char *what) {
    if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

void reset(HostModel &m) {
    for (auto &b : m.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
}

const std::string kKey = "a key of at least sixteen bytes";

}  // namespace

int main() {
    try {
        std::vector<TensorDef> defs = model_tensors(2, 32, 0, 1);
        HostModel src(placement_json("trainer", Layout{2, 2, 1, 1}, defs, 1), defs, true, "trainer");
        HostModel dst(placement_json("serving", Layout{4, 1, 1, 1}, defs, 1), defs, false, "serving");
        mws::TransferPlan plan = mws::TransferPlan::plan(src.placement, dst.placement)
                                     .bind(dst.binding_ptrs(), src.binding_ptrs());

        CallbackEngine native;
        mws::TransferEngine engine = native.open(true);
        for (const auto &b : dst.buffers) engine.register_memory(b.second.data(), b.second.size());
        mws::Sink sink(engine);
        std::vector<mws::PreparedTransfer> prepared;
        for (const auto &b : src.bindings)
            prepared.push_back(sink.prepare(plan, src.placement, b, dst.placement, dst.binding_ptrs()));

        // The serving side: one verifying acceptor per participant, one router.
        std::vector<std::string> targets;
        for (const auto &b : dst.buffers) targets.push_back(b.first);
        std::vector<mws::NotifyAcceptor> acceptors;
        mws::NotifyRouter router;
        for (const std::string &t : targets) {
            acceptors.emplace_back(plan, t, kKey);
            acceptors.back().verify_content();
        }
        for (const mws::NotifyAcceptor &a : acceptors) router.add(a);
        bool conflict = false;
        try {
            router.add(acceptors[0]);
        } catch (const mws::Error &e) {
            conflict = e.status() == MWS_CONFLICT;
        }
        require(conflict, "one acceptor per plan and target");

        // Hands every delivered message to the router; checks each went to its target.
        auto deliver = [&](std::vector<std::string> *kept) {
            std::size_t n = 0;
            for (std::size_t i = 0; i < targets.size(); ++i) {
                for (const std::string &m : native.take(targets[i] + ":17000")) {
                    const mws_notify_acceptor *routed = nullptr;
                    std::string why;
                    std::uint32_t v = router.accept(m, &routed, nullptr, &why);
                    if (v != MWS_NOTIFY_ACCEPTED) throw std::runtime_error("refused: " + why);
                    require(routed == acceptors[i].get(), "routed to the acceptor of its target");
                    if (kept != nullptr) kept->push_back(m);
                    ++n;
                }
            }
            return n;
        };

        std::vector<std::string> old;
        for (std::uint64_t g = 2; g <= 4; ++g) {
            reset(dst);
            for (const mws::PreparedTransfer &p : prepared) {
                if (g == 3) {
                    // The C entry point itself.
                    mws_step_args args{g, nullptr, 0, nullptr, nullptr};
                    mws_transfer_stats stats{};
                    require(mws_prepared_transfer_step_notified(
                                p.get(), &args, reinterpret_cast<const std::uint8_t *>(kKey.data()), kKey.size(),
                                MWS_STEP_VERIFY_CONTENT, &stats) == MWS_OK,
                            "mws_prepared_transfer_step_notified");
                } else {
                    p.step_notified(g, kKey, true);
                }
            }
            require(deliver(g == 2 ? &old : nullptr) > 0, "messages delivered");
            for (const mws::NotifyAcceptor &a : acceptors) {
                mws_notify_outcome o = a.outcome();
                require(o.verdict == MWS_TARGET_UPDATED && o.weight_generation == g, "updated to the step's generation");
                require(a.mismatches().empty(), "no mismatch");
            }
            dst.verify();
        }
        // An older generation's messages: stale, nothing changes.
        for (const std::string &m : old) {
            std::uint32_t v = router.accept(m);
            require(v == MWS_NOTIFY_STALE, "an older generation is stale");
        }
        for (const mws::NotifyAcceptor &a : acceptors)
            require(a.outcome().verdict == MWS_TARGET_UPDATED && a.outcome().weight_generation == 4, "still 4");
        std::printf("3 notified, content-verified steps; old generations stale\n");

        // A byte flipped in a target after the copy: that target is torn, the range named.
        native.flip_next = true;
        for (const mws::PreparedTransfer &p : prepared) p.step_notified(5, kKey, true);
        deliver(nullptr);
        std::size_t torn = 0;
        for (std::size_t i = 0; i < acceptors.size(); ++i) {
            mws_notify_outcome o = acceptors[i].outcome();
            if (o.verdict != MWS_TARGET_TORN) {
                require(o.verdict == MWS_TARGET_UPDATED && o.weight_generation == 5, "the others are updated");
                continue;
            }
            ++torn;
            std::vector<mws::NotifyAcceptor::Mismatch> mm = acceptors[i].mismatches();
            require(!mm.empty() && o.incomplete == 1, "the mismatched writer is named");
            require(mm[0].fragment_id.rfind(targets[i], 0) == 0 && mm[0].bytes > 0, "its ranges are named");
            std::printf("flipped byte caught: %s, %zu range(s) of %s/%s, e.g. %s +%llu\n", targets[i].c_str(),
                        mm.size(), mm[0].source_participant.c_str(), mm[0].source_worker.c_str(),
                        mm[0].fragment_id.c_str(), static_cast<unsigned long long>(mm[0].offset));
        }
        require(torn == 1, "exactly one target torn");

        // An unverified step at verifying acceptors: begins accepted, dones refused.
        for (const mws::PreparedTransfer &p : prepared) p.step_notified(6, kKey, false);
        std::size_t unverified = 0;
        for (const std::string &t : targets) {
            for (const std::string &m : native.take(t + ":17000")) {
                std::uint32_t v = router.accept(m);
                require(v == MWS_NOTIFY_ACCEPTED || v == MWS_NOTIFY_UNVERIFIED, "begin accepted, done unverified");
                unverified += v == MWS_NOTIFY_UNVERIFIED;
            }
        }
        require(unverified > 0, "unverified dones refused");
        for (const mws::NotifyAcceptor &a : acceptors) require(a.outcome().verdict == MWS_TARGET_TORN, "torn");

        // Unknown flags and a short key are refused before anything moves.
        mws_step_args args{7, nullptr, 0, nullptr, nullptr};
        require(mws_prepared_transfer_step_notified(prepared[0].get(), &args, nullptr, 0, 2, nullptr) ==
                    MWS_INVALID_ARGUMENT,
                "unknown flags");
        require(mws_prepared_transfer_step_notified(prepared[0].get(), &args,
                                                    reinterpret_cast<const std::uint8_t *>("short"), 5, 0,
                                                    nullptr) == MWS_INVALID_ARGUMENT,
                "a short key");
        require(native.take(targets[0] + ":17000").empty(), "nothing sent");

        // The router forgets a removed acceptor: its messages are misrouted.
        require(router.remove(acceptors[0]), "removed");
        require(!router.remove(acceptors[0]), "removed once");
        for (const mws::PreparedTransfer &p : prepared) p.step_notified(8, kKey, true);
        std::vector<std::string> first = native.take(targets[0] + ":17000");
        require(!first.empty(), "messages for the first target");
        const mws_notify_acceptor *routed = acceptors[1].get();
        require(router.accept(first[0], &routed) == MWS_NOTIFY_MISROUTED && routed == nullptr, "misrouted");

        // Steps that do not block (issue 46, item 2): started, notified and verified,
        // generation after generation; each callback runs once with the step's status.
        router.add(acceptors[0]);
        std::atomic<int> callbacks{0};
        for (std::uint64_t g = 10; g <= 12; ++g) {
            native.flip_next = g == 12;
            std::vector<mws::StepHandle> steps;
            for (const mws::PreparedTransfer &p : prepared)
                steps.push_back(p.start_step(g, mws::StepNotify{kKey, true}, [&callbacks](mws_status s) {
                    if (s == MWS_OK) callbacks.fetch_add(1);
                }));
            for (const mws::StepHandle &h : steps) {
                std::optional<mws_transfer_stats> st;
                while (!(st = h.wait_for(std::chrono::milliseconds(50)))) {
                }
                require(h.poll(), "ended");
                mws::LiveReport r = h.report();
                for (const auto &t : r.targets)
                    require(t.verdict == MWS_TARGET_UPDATED && t.weight_generation == g, "the step's own report");
            }
            deliver(nullptr);
            std::size_t torn_now = 0;
            for (const mws::NotifyAcceptor &a : acceptors) {
                mws_notify_outcome o = a.outcome();
                if (o.verdict == MWS_TARGET_TORN) {
                    ++torn_now;
                    continue;
                }
                require(o.verdict == MWS_TARGET_UPDATED && o.weight_generation == g, "started steps update");
            }
            require(torn_now == (g == 12 ? 1u : 0u), "a flipped byte of a started step is caught as torn");
        }
        // A callback runs after the step's outcome is published: wait_for may return first.
        for (int i = 0; i < 5000 && callbacks.load() < static_cast<int>(3 * prepared.size()); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        require(callbacks.load() == static_cast<int>(3 * prepared.size()), "each callback ran once");
        {
            // The C entry points' arguments: nothing starts on bad input.
            mws_step_args a10{13, nullptr, 0, nullptr, nullptr};
            mws_step_handle *h = nullptr;
            require(mws_prepared_transfer_step_start(prepared[0].get(), &a10, nullptr, nullptr, nullptr, nullptr) ==
                        MWS_NULL_ARGUMENT,
                    "NULL out");
            mws_step_notify bad{nullptr, 0, 4, nullptr, 0};
            require(mws_prepared_transfer_step_start(prepared[0].get(), &a10, &bad, nullptr, nullptr, &h) ==
                            MWS_INVALID_ARGUMENT &&
                        h == nullptr,
                    "unknown flags");
            require(mws_prepared_transfer_step_start(prepared[0].get(), &a10, nullptr, nullptr, nullptr, &h) == MWS_OK,
                    "plain started step");
            std::uint32_t finished = 0;
            require(mws_step_handle_wait(h, UINT64_MAX, &finished, nullptr) == MWS_OK && finished == 1, "waited");
            mws_live_report r{};
            require(mws_step_handle_report(h, &r) == MWS_OK, "report");
            require(mws_step_handle_cancel(h) == MWS_OK, "cancelling an ended step does nothing");
            require(mws_step_handle_wait(nullptr, 0, &finished, nullptr) == MWS_NULL_ARGUMENT, "NULL handle");
            mws_step_handle_free(h);
            native.take(targets[0] + ":17000");
        }
        std::printf("3 started, notified, content-verified steps; a flipped byte caught as torn\n");

        // Sparse delta steps (issue 47): each target gets an inbox; after a full step,
        // the targets that hold the sources' base get only the changed elements.
        std::vector<std::vector<std::uint8_t>> inboxes;
        std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> named;
        for (std::size_t i = 0; i < targets.size(); ++i) {
            inboxes.emplace_back(dst.buffers[targets[i]].size() / 4 + 4096);
            engine.register_memory(inboxes[i].data(), inboxes[i].size());
            named[targets[i]] = {static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(inboxes[i].data())),
                                 inboxes[i].size()};
            acceptors[i].accept_deltas(inboxes[i].data(), inboxes[i].size());
        }
        for (const mws::PreparedTransfer &p : prepared) p.enable_delta(named);
        std::vector<std::pair<std::uint8_t *, std::uint8_t>> changed;
        for (std::uint64_t g = 20; g <= 23; ++g) {
            if (g == 21)
                for (auto &b : src.buffers)
                    for (std::size_t k = 7; k < b.second.size(); k += 97) {
                        changed.push_back({&b.second[k], b.second[k]});
                        b.second[k] ^= 0x11;
                    }
            if (g == 22)
                for (auto &c : changed) *c.first = c.second;  // back to the model's bytes
            std::map<std::string, std::uint64_t> held;
            for (std::size_t i = 0; i < targets.size(); ++i)
                if (std::optional<std::uint64_t> h = acceptors[i].held_generation()) held[targets[i]] = *h;
            if (g == 20) require(held.size() < targets.size(), "a torn target holds nothing");
            std::uint64_t wire = 0, logical = 0, delta_targets = 0;
            for (const mws::PreparedTransfer &p : prepared) {
                if (g == 23) {
                    // A started delta step.
                    p.start_step(g, mws::StepNotify{kKey, true, held}).wait();
                } else {
                    p.step_delta(g, held, kKey);
                }
                std::optional<mws_delta_stats> d = p.delta_stats();
                require(d && d->weight_generation == g, "delta stats of the step");
                wire += d->wire_bytes;
                logical += d->logical_bytes;
                delta_targets += d->delta_targets;
            }
            require(deliver(nullptr) > 0, "delta messages delivered");
            for (const mws::NotifyAcceptor &a : acceptors) {
                mws_notify_outcome o = a.outcome();
                require(o.verdict == MWS_TARGET_UPDATED && o.weight_generation == g, "delta steps update");
                require(a.held_generation() == g, "the target holds the step's generation");
            }
            if (g == 20) require(wire == logical, "the first step after enable_delta is full");
            if (g >= 21) require(delta_targets > 0 && wire * 4 < logical, "only the changes moved");
            if (g == 22 || g == 23) dst.verify();
            std::printf("delta step %llu: %llu of %llu bytes moved\n", static_cast<unsigned long long>(g),
                        static_cast<unsigned long long>(wire), static_cast<unsigned long long>(logical));
        }
        for (auto &b : inboxes) engine.unregister_memory(b.data());

        // A prepared reader's steps notify no one.
        prepared.clear();
        for (const auto &b : dst.buffers) engine.unregister_memory(b.second.data());
        for (const auto &b : src.buffers) engine.register_memory(b.second.data(), b.second.size());
        {
            mws::Loader loader(engine);
            mws::PreparedTransfer reader =
                loader.prepare_live(plan, src.placement, src.binding_ptrs(), dst.placement, dst.bindings[0]);
            bool refused = false;
            try {
                reader.step_notified(9);
            } catch (const mws::Error &e) {
                refused = e.status() == MWS_INVALID_ARGUMENT;
            }
            require(refused, "a reader's step notifies no one");
            reader.step(9);
            mws::LiveReport r = reader.last_report();
            require(r.targets.size() == 1 && r.targets[0].verdict == MWS_TARGET_UPDATED &&
                        r.targets[0].weight_generation == 9,
                    "a reader's report is its own outcome");
        }
        // Pulled delta steps (issue 47): the trainer publishes each generation, every
        // server participant's reader pulls only the changes once it holds the base.
        {
            std::vector<mws::DeltaPublisher> publishers;
            std::vector<mws::DeltaOutbox> outboxes;
            for (const auto &b : src.buffers) {
                std::uint64_t least = mws::DeltaPublisher::min_outbox_capacity(plan, b.first);
                publishers.emplace_back(plan, b.first, engine, std::max<std::uint64_t>(b.second.size() / 2, least));
                outboxes.push_back(publishers.back().outbox());
                require(outboxes.back().participant_id == b.first && outboxes.back().capacity >= least, "outbox");
            }
            bool small = false;
            try {
                mws::DeltaPublisher tiny(plan, src.buffers.begin()->first, engine, 10);
            } catch (const mws::Error &e) {
                small = e.status() == MWS_INVALID_ARGUMENT;
            }
            require(small, "an outbox under the least capacity is refused");
            mws::Loader loader(engine);
            std::vector<mws::PreparedTransfer> readers;
            for (const auto &b : dst.bindings) {
                readers.push_back(loader.prepare_live(plan, src.placement, src.binding_ptrs(), dst.placement, b));
                readers.back().enable_delta_pull(outboxes);
                require(!readers.back().held_generation(), "nothing held before the first step");
            }
            // A reader that steps before the generation is published: refused, nothing moved.
            bool conflict = false;
            try {
                readers[0].step(30);
            } catch (const mws::Error &e) {
                conflict = e.status() == MWS_CONFLICT;
            }
            require(conflict, "no publication: MWS_CONFLICT");
            std::vector<std::pair<std::uint8_t *, std::uint8_t>> flipped;
            for (std::uint64_t g = 30; g <= 33; ++g) {
                if (g == 31)
                    for (auto &b : src.buffers)
                        for (std::size_t k = 5; k < b.second.size(); k += 101) {
                            flipped.push_back({&b.second[k], b.second[k]});
                            b.second[k] ^= 0x21;
                        }
                if (g == 32)
                    for (auto &c : flipped) *c.first = c.second;  // back to the model's bytes
                if (g == 33) dst.buffers.begin()->second[3] ^= 0x40;  // a racing writer on the server
                std::uint64_t published_deltas = 0;
                for (const mws::DeltaPublisher &p : publishers) published_deltas += p.publish(g).delta_targets;
                require((g == 30) == (published_deltas == 0), "the first publication has no delta");
                std::uint64_t wire = 0, logical = 0, torn = 0;
                for (const mws::PreparedTransfer &r : readers) {
                    try {
                        r.step(g);
                    } catch (const mws::Error &e) {
                        require(g == 33 && e.status() == MWS_INTEGRITY, "only the corrupted target fails");
                        require(!r.held_generation(), "a torn reader holds nothing");
                        ++torn;
                        continue;
                    }
                    require(r.held_generation() == g, "the reader holds the step's generation");
                    std::optional<mws_delta_stats> d = r.delta_stats();
                    require(d && d->weight_generation == g, "pull stats");
                    wire += d->wire_bytes;
                    logical += d->logical_bytes;
                }
                require(torn == (g == 33 ? 1u : 0u), "the corrupted base is caught as torn");
                if (g == 31 || g == 32) require(wire * 4 < logical, "only the changes pulled");
                if (g == 32) dst.verify();
                std::printf("pulled delta step %llu: %llu of %llu bytes pulled\n", static_cast<unsigned long long>(g),
                            static_cast<unsigned long long>(wire), static_cast<unsigned long long>(logical));
            }
            for (const mws::DeltaPublisher &p : publishers) p.publish(34);
            for (const mws::PreparedTransfer &r : readers) r.step(34);  // full for the torn one: repaired
            dst.verify();
            mws_delta_outbox none{nullptr, nullptr, 0, 0};
            require(mws_prepared_transfer_enable_delta_pull(readers[0].get(), &none, 1) == MWS_NULL_ARGUMENT,
                    "NULL strings refused");
            require(mws_delta_publisher_publish(nullptr, 1, nullptr) == MWS_NULL_ARGUMENT, "NULL publisher");
        }
        for (const auto &b : src.buffers) engine.unregister_memory(b.second.data());
        std::printf("prepared_notify: ok\n");
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "prepared_notify: %s\n", e.what());
        return 1;
    }
}
