// close_race.cpp: no handle is freed under a running call (issue 43). Through the C ABI:
//
// 1. free racing a step: a step blocked inside the engine (a C callback) while another
//    thread calls mws_prepared_transfer_free; the free must return only after the step
//    did (before the fix it freed the prepared transfer under the step, which then
//    wrote its report into freed memory);
// 2. close racing steps: two threads step one prepared transfer while a third closes
//    it at a random moment; every step completes or is refused as closed, and the
//    transfer is freed (once the steppers ended: no call may start after a free) and
//    prepared again;
// 3. free from inside a call: the engine callback of a loader's live load frees that
//    loader (deferred to the end of the load).
//
// Thousands of iterations, bounded in time; run by ctest (label int), and under
// AddressSanitizer by the asan workflow, where any use of freed memory by the C/C++
// side or a double free fails the run. Exits non-zero on any failure.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/callback_engine.hpp"
#include "support/mws_model.hpp"

using namespace mwsmodel;
using Clock = std::chrono::steady_clock;

namespace {

void require(bool ok, const char *what) {
    if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}


struct Setup {
    std::vector<TensorDef> defs = model_tensors(1, 16, 0, 1);
    HostModel src{placement_json("trainer", Layout{2, 1, 1, 1}, defs, 1), defs, true, "trainer"};
    HostModel dst{placement_json("serving", Layout{1, 1, 1, 1}, defs, 1), defs, false, "serving"};
    mws::TransferPlan plan =
        mws::TransferPlan::plan(src.placement, dst.placement).bind(dst.binding_ptrs(), src.binding_ptrs());
};

/// The raw handles of the trainer's bindings.
std::vector<const mws_binding *> source_handles(const Setup &s) {
    std::vector<const mws_binding *> out;
    for (const mws::Binding &b : s.src.bindings) out.push_back(b.get());
    return out;
}

mws_prepared_transfer *prepare(const Setup &s, const mws::Loader &loader) {
    std::vector<const mws_binding *> sources = source_handles(s);
    mws_prepared_transfer *out = nullptr;
    mws_status st = mws_loader_prepare_live(loader.get(), s.plan.get(), s.src.placement.get(), sources.data(),
                                            sources.size(), s.dst.placement.get(), s.dst.bindings[0].get(), nullptr,
                                            &out);
    require(st == MWS_OK && out != nullptr, "prepare_live");
    return out;
}

mws_status step(mws_prepared_transfer *p, std::uint64_t generation) {
    mws_step_args args{generation, nullptr, 0, nullptr, nullptr};
    mws_transfer_stats stats{};
    return mws_prepared_transfer_step(p, &args, &stats);
}

}  // namespace

int main() {
    try {
        Setup s;
        CallbackEngine native;
        mws::TransferEngine engine = native.open();
        for (const auto &b : s.src.buffers) engine.register_memory(b.second.data(), b.second.size());
        mws::Loader loader(engine);
        std::mt19937 rng(43);
        const auto deadline = Clock::now() + std::chrono::seconds(30);

        // 1. free racing a step.
        int frees = 0;
        for (; frees < 300 && Clock::now() < deadline; ++frees) {
            mws_prepared_transfer *p = prepare(s, loader);
            native.entered = false;
            native.hold_us = 200 + rng() % 800;
            std::atomic<bool> returned{false};
            mws_status st = MWS_PANIC;
            std::thread stepper([&] {
                st = step(p, 2);
                returned = true;
            });
            while (!native.entered) std::this_thread::yield();
            mws_prepared_transfer_free(p);  // waits for the step
            bool early = !returned.load();
            stepper.join();
            require(!early, "mws_prepared_transfer_free returned before the running step did");
            native.hold_us = 0;
            require(st == MWS_OK, "the step under the free completed");
        }
        s.dst.verify();
        std::printf("free racing a step: %d iterations, every free waited for its step\n", frees);

        // 2. close racing steps, re-preparing each time.
        int rounds = 0, completed = 0, refused = 0;
        std::atomic<int> unexpected{0};
        for (; rounds < 3000 && Clock::now() < deadline; ++rounds) {
            mws_prepared_transfer *p = prepare(s, loader);
            std::atomic<int> done{0}, closed{0};
            auto stepper = [&](std::uint64_t g) {
                for (;; g += 2) {
                    mws_status st = step(p, g);
                    if (st == MWS_OK) {
                        done += 1;
                        continue;
                    }
                    if (std::strstr(mws_last_error_message(), "closed") == nullptr) unexpected += 1;
                    closed += 1;
                    return;
                }
            };
            std::thread a(stepper, 1), b(stepper, 2);
            if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
            require(mws_prepared_transfer_close(p) == MWS_OK, "close");
            // No call may start once the free returned: the steppers end first.
            a.join();
            b.join();
            mws_prepared_transfer_free(p);
            completed += done;
            refused += closed;
        }
        require(unexpected == 0, "a step failed for another reason than the close");
        require(refused == 2 * rounds, "every stepper ended on the closed transfer");
        std::printf("close racing steps: %d rounds, %d steps completed, %d refused as closed\n", rounds, completed,
                    refused);

        // 3. A loader freed by the engine callback of its own live load: deferred to
        // the end of that load, which completes.
        {
            for (auto &b : s.dst.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
            mws_loader *raw = nullptr;
            require(mws_loader_new(engine.get(), nullptr, &raw) == MWS_OK, "loader");
            native.once_arg = raw;
            native.once = [](void *l) { mws_loader_free(static_cast<mws_loader *>(l)); };
            std::vector<const mws_binding *> sources = source_handles(s);
            mws_live_args args{};
            mws_transfer_stats stats{};
            mws_status st = mws_loader_load_live(raw, s.plan.get(), s.src.placement.get(), sources.data(),
                                                 sources.size(), s.dst.placement.get(), s.dst.bindings[0].get(),
                                                 &args, &stats);
            require(native.once.load() == nullptr, "the callback freed the loader");
            require(st == MWS_OK, "the load whose loader was freed inside it completed");
            s.dst.verify();
            std::printf("free inside a call: deferred to its end\n");
        }
        for (const auto &b : s.src.buffers) engine.unregister_memory(b.second.data());
        std::printf("close_race: OK\n");
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "close_race: %s\n", e.what());
        return 1;
    }
}
