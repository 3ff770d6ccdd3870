// live_reshard.cpp: a live reshard between two in-process "instances" through the
// C ABI and the C++ wrapper, with the embedded LocalEngine, in both modes.
//
// A trainer in TP4 x PP2 x EP2 x DP2 holds a small MoE model (host buffers with
// deterministic contents); a server in TP2 x EP4 starts empty. The coordinator plans
// the reshard (placement -> placement), binds it to both sides' runtime bindings,
// and then:
//   * sink mode: the server registers its allocations with the engine; every trainer
//     participant pushes its part (mws::Sink); unselected DP replicas send nothing;
//   * reader mode: the trainer registers its allocations; every server participant
//     pulls its part (mws::Loader), with a progress callback.
// After each mode every byte of every server fragment is verified. Also checks the
// plan accessors (regions, bound operations, executors) and the JSON round trip of
// the logical plan. Exits non-zero on any failure.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"

using namespace mwsmodel;

namespace {

void require(bool ok, const char *what) {
    if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

struct Progress {
    std::uint64_t calls = 0, last_done = 0, last_total = 0, last_items = 0, last_items_total = 0;
    bool monotonic = true, phase_ok = true;
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

}  // namespace

int main() {
    try {
        std::vector<TensorDef> defs = model_tensors(4, 64, 8, 1);
        HostModel src(placement_json("trainer", Layout{4, 2, 2, 2}, defs, 1), defs, true, "trainer");
        HostModel dst(placement_json("serving", Layout{2, 1, 4, 1}, defs, 1), defs, false, "serving");

        mws::TransferPlan logical = mws::TransferPlan::plan(src.placement, dst.placement);
        require(!logical.is_bound() && logical.region_count() > 0, "logical plan");
        mws::TransferPlan again = mws::TransferPlan::from_json(logical.to_json());
        require(again.region_count() == logical.region_count(), "logical plan JSON round trip");
        mws::TransferPlan plan = logical.bind(dst.binding_ptrs(), src.binding_ptrs());
        require(plan.is_bound() && plan.region_count() == logical.region_count(), "bound plan");
        require(plan.executor_count(MWS_SIDE_TARGET) == dst.bindings.size(), "one target executor per server rank");
        for (std::size_t i = 0; i < plan.executor_count(MWS_SIDE_SOURCE); ++i) {
            require(plan.executor(MWS_SIDE_SOURCE, i).dp == 0, "only the selected DP replica sends");
        }
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < plan.region_count(); ++i) {
            mws_transfer_operation_info op = plan.operation(i);
            require(op.region.total_bytes == op.region.inner_bytes * op.region.segment_count, "region bytes");
            require(op.source.address + 0 == op.source.storage_address + (op.source.storage_offset - op.source.address_offset),
                    "source address = storage + offset");
            require(op.target.address_offset == op.region.target_base_offset, "target offset");
            bytes += op.region.total_bytes;
        }
        require(bytes == plan.total_bytes(), "total bytes");

        mws::TransferEngine engine = mws::TransferEngine::local();

        // Sink mode: sources push into the pre-registered server buffers.
        register_all(engine, dst);
        mws::Sink sink(engine);
        std::uint64_t sink_reports = 0;
        sink.set_progress([&sink_reports](const mws_progress &p) {
            sink_reports += p.phase == MWS_PROGRESS_TRANSFER && p.bytes_done <= p.bytes_total;
        });
        std::uint64_t pushed = 0;
        for (const auto &b : src.bindings) {
            mws_transfer_stats s = sink.execute(plan, src.placement, b, dst.placement, dst.binding_ptrs());
            pushed += s.bytes;
            mws::LiveReport r = sink.last_report();
            require(r.stats.bytes == s.bytes && sink.stats().bytes == s.bytes, "report and stats of the call");
            if (s.bytes == 0) {
                require(!r.submitted && r.targets.empty() && r.guard_release == MWS_GUARD_NOT_PINNED,
                        "an unselected replica's report");
                continue;
            }
            require(r.submitted && r.guard_release == MWS_GUARD_COMPLETED && r.pending_transfer_id.empty(),
                    "a completed push: submitted, pins released completed");
            require(!r.targets.empty(), "a push names its targets");
            for (const mws::TargetOutcome &t : r.targets)
                require(t.verdict == MWS_TARGET_UPDATED && t.weight_generation == 1 && !t.participant_id.empty(),
                        "every target share updated");
        }
        require(sink_reports > 0, "sink progress");
        unregister_all(engine, dst);
        mws_engine_resources res = engine.resources();
        require(res.registrations_known == 1 && res.registered_regions == 0 && res.pending_transfers == 0 &&
                    res.quarantined_registrations == 0 && res.pinned_tokens == 0,
                "the engine holds nothing after the pushes");
        require(pushed == plan.total_bytes(), "sink moved every planned byte");
        std::size_t checked = dst.verify();
        std::printf("sink mode:   %zu regions, %llu bytes pushed, %zu bytes verified\n", plan.region_count(),
                    static_cast<unsigned long long>(pushed), checked);

        // Reader mode: targets pull from the pre-registered trainer buffers.
        reset(dst);
        register_all(engine, src);
        mws::Loader loader(engine);
        Progress progress;
        loader.set_progress([&progress](const mws_progress &p) {
            if (p.bytes_done == 0) progress.last_done = 0;  // a new call starts
            progress.monotonic = progress.monotonic && p.bytes_done >= progress.last_done && p.bytes_done <= p.bytes_total;
            progress.phase_ok = progress.phase_ok && p.phase == MWS_PROGRESS_TRANSFER;
            progress.calls += 1;
            progress.last_done = p.bytes_done;
            progress.last_total = p.bytes_total;
            progress.last_items = p.items_done;
            progress.last_items_total = p.items_total;
        });
        std::uint64_t pulled = 0;
        for (const auto &b : dst.bindings) {
            mws_transfer_stats s = loader.load_live(plan, src.placement, src.binding_ptrs(), dst.placement, b);
            pulled += s.bytes;
            require(progress.last_done == progress.last_total && progress.last_total == s.bytes, "progress");
            require(progress.last_items == progress.last_items_total && progress.last_items_total > 0, "progress items");
            require(progress.monotonic && progress.phase_ok, "progress is monotonic, phase transfer");
        }
        unregister_all(engine, src);
        require(pulled == plan.total_bytes() && progress.calls > 0, "reader moved every planned byte");
        checked = dst.verify();
        std::printf("reader mode: %llu bytes pulled in %llu progress steps, %zu bytes verified\n",
                    static_cast<unsigned long long>(pulled), static_cast<unsigned long long>(progress.calls), checked);

        // A cancelled loader submits nothing.
        reset(dst);
        register_all(engine, src);
        loader.cancel();
        bool refused = false;
        try {
            loader.load_live(plan, src.placement, src.binding_ptrs(), dst.placement, dst.bindings.front());
        } catch (const mws::Error &e) {
            refused = std::string(e.what()).find("cancelled") != std::string::npos;
        }
        mws::LiveReport cancelled = loader.last_report();
        unregister_all(engine, src);
        require(refused, "cancellation");
        require(!cancelled.submitted && cancelled.guard_release == MWS_GUARD_ABORTED, "nothing submitted, pins aborted");
        require(cancelled.targets.size() == 1 && cancelled.targets[0].verdict == MWS_TARGET_UNCHANGED,
                "the target is reported unchanged");
        require(engine.pending_count() == 0, "no pending transfer");
        std::printf("live reshard TP4xPP2xEP2xDP2 -> TP2xEP4: ok\n");
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "live_reshard: %s\n", e.what());
        return 1;
    }
}
