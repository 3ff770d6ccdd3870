// te_bench.cpp: a benchmark (not a test) on the REAL Mooncake Transfer Engine (TCP,
// loopback, two engines in one process): our reader (mws::Loader) and sink
// (mws::Sink) through the adapter (mooncake_weight_store::mooncake_te) against raw
// `submitTransfer` of exactly the planned ranges in the same run, both directions:
//
//   same     TP4 -> TP4, same layout (every fragment one range)
//   reshard  TP4 -> TP2 (column splits: o_proj and down_proj rows are strided on
//            the target side)
//
// "library operations" = the engine operations the executors submit (after coalescing
// adjacent segments); "our requests" = the native TE requests the adapter made of them
// (after staged reads).
// raw  = one TE request per planned segment, native batches of at most 1024 requests
//        (the per-peer queue), allocateBatchID / submitTransfer / getTransferStatus
//        polled / freeBatchID, one batch in flight (the naive per-range batch);
// ours = Loader::load_live per target participant / Sink::execute per source
//        participant through the adapter (tickets, owner-registered buffers), with
//        coalescing of adjacent segments and one library batch per call
//        (max_batch_operations 2^20): the adapter submits native batches of 256 and
//        keeps up to 1024 requests in flight to the peer (no pause at batch ends),
//        reads remote-contiguous runs through its staging pool, and splits ranges over
//        1 MiB.
// raw and ours alternate, --repeat times (default 5) after a warm-up; the table gives
// the best run of each, the `*_median_ratio` figures the ratio of the medians; every
// byte is verified after each of our runs. Prints a table (GB/s, microseconds per engine
// request and per planned segment) and ends with `figure: NAME = VALUE` lines.
//
//   mws_te_bench [--hidden 1024] [--layers 4] [--repeat 3]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_te.hpp"
#include "support/mws_model.hpp"
#include "transfer_engine.h"

using namespace mwsmodel;
using Clock = std::chrono::steady_clock;

namespace {

struct Engine {
    mooncake::TransferEngine te{false};
    std::string segment;
    explicit Engine() {
        if (te.init("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0) != 0) throw std::runtime_error("init");
        if (te.installTransport("tcp", nullptr) == nullptr) throw std::runtime_error("installTransport");
        segment = te.getLocalIpAndPort();
    }
};

struct Range {
    std::uint64_t local, remote, len;
};

/// Every planned segment of `plan`, as (local, remote, len) for `read` (local =
/// target) or write (local = source).
std::vector<Range> planned_ranges(const mws::TransferPlan &plan, bool read) {
    std::vector<Range> out;
    for (std::size_t i = 0; i < plan.region_count(); ++i) {
        mws_transfer_operation_info op = plan.operation(i);
        const mws_transfer_region_info &r = op.region;
        std::vector<std::uint64_t> idx(r.outer_ndim, 0);
        for (std::uint64_t s = 0; s < r.segment_count; ++s) {
            std::uint64_t so = r.source_base_offset, to = r.target_base_offset;
            for (std::size_t d = 0; d < r.outer_ndim; ++d) {
                so += idx[d] * r.source_strides[d];
                to += idx[d] * r.target_strides[d];
            }
            std::uint64_t src = op.source.address + so, dst = op.target.address + to;
            out.push_back(read ? Range{dst, src, r.inner_bytes} : Range{src, dst, r.inner_bytes});
            for (std::size_t d = r.outer_ndim; d-- > 0;) {
                if (++idx[d] < r.outer_loop_counts[d]) break;
                idx[d] = 0;
            }
        }
    }
    return out;
}

/// Raw TE: one request per range, native batches of <= 1024, one in flight.
std::uint64_t raw(mooncake::TransferEngine &te, const std::string &peer, const std::vector<Range> &ranges, bool read) {
    mooncake::SegmentHandle seg = te.openSegment(peer);
    std::uint64_t batches = 0;
    for (std::size_t from = 0; from < ranges.size(); from += 1024) {
        std::size_t k = std::min<std::size_t>(1024, ranges.size() - from);
        std::vector<mooncake::TransferRequest> reqs(k);
        for (std::size_t i = 0; i < k; ++i) {
            const Range &r = ranges[from + i];
            reqs[i].opcode = read ? mooncake::TransferRequest::READ : mooncake::TransferRequest::WRITE;
            reqs[i].source = reinterpret_cast<void *>(static_cast<std::uintptr_t>(r.local));
            reqs[i].target_id = seg;
            reqs[i].target_offset = r.remote;
            reqs[i].length = r.len;
        }
        mooncake::BatchID b = te.allocateBatchID(k);
        if (!te.submitTransfer(b, reqs).ok()) throw std::runtime_error("raw submitTransfer failed");
        for (std::size_t t = 0; t < k; ++t) {
            mooncake::TransferStatus st{};
            for (unsigned spins = 0;; ++spins) {
                te.getTransferStatus(b, t, st);
                if (st.s == mooncake::TransferStatusEnum::COMPLETED) break;
                if (st.s == mooncake::TransferStatusEnum::FAILED) throw std::runtime_error("raw task failed");
                if (spins < 64) {
                    std::this_thread::yield();
                } else {
                    std::this_thread::sleep_for(std::chrono::microseconds(20));
                }
            }
        }
        te.freeBatchID(b);
        batches += 1;
    }
    return batches;
}

struct Model {
    std::unique_ptr<HostModel> m;
    std::vector<mws::Binding> bindings;
    std::vector<const mws::Binding *> ptrs() const {
        std::vector<const mws::Binding *> o;
        for (auto &b : bindings) o.push_back(&b);
        return o;
    }
};

Model make(const std::string &set, const Layout &l, const std::vector<TensorDef> &defs, bool fill,
           const std::string &instance, const std::string &endpoint) {
    Model out;
    out.m = std::make_unique<HostModel>(placement_json(set, l, defs, 1), defs, fill, instance);
    HostModel &m = *out.m;
    for (auto &b : m.buffers) {
        mws::BindingOptions o = mws::BindingOptions::for_placement(m.placement);
        o.participant_id = b.first;
        o.instance_id = instance;
        o.lease_id = instance + "-lease";
        mws::Binding binding(o);
        std::size_t k = 0;
        for (const View &v : m.views) {
            if (v.participant != b.first) continue;
            std::vector<std::uint64_t> strides(v.shape.size());
            std::uint64_t acc = v.itemsize;
            for (std::size_t d = v.shape.size(); d-- > 0;) {
                strides[d] = acc;
                acc *= v.shape[d];
            }
            std::string fid = b.first + ":rt" + std::to_string(k++);
            mws_runtime_fragment f{};
            f.placement_fragment_id = v.pfid.c_str();
            f.fragment_id = fid.c_str();
            f.address = b.second.data() + v.offset;
            f.nbytes = v.nbytes;
            f.worker_id = b.first.c_str();
            f.endpoint = endpoint.c_str();
            f.device = "cpu";
            f.itemsize = v.itemsize;
            f.local_shape = v.shape.data();
            f.local_shape_len = v.shape.size();
            f.strides_bytes = strides.data();
            f.strides_bytes_len = strides.size();
            f.storage_address = b.second.data();
            f.storage_nbytes = b.second.size();
            f.storage_offset_bytes = v.offset;
            f.memory_kind = MWS_MEMORY_HOST;
            binding.add_fragment(f);
        }
        out.bindings.push_back(std::move(binding));
    }
    return out;
}

struct Figure {
    double seconds = 1e30;  ///< best
    std::vector<double> all;
    std::uint64_t requests = 0;
    double median() const {
        std::vector<double> v = all;
        std::sort(v.begin(), v.end());
        return v.empty() ? 0 : v[v.size() / 2];
    }
};

struct Row {
    std::string name, dir;
    std::uint64_t bytes = 0, segments = 0, engine_operations = 0;  ///< the library's (after coalescing)
    Figure raw, ours;
};

template <class F>
double timed(F &&f) {
    auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char **argv) {
    std::uint64_t hidden = 1024, layers = 4;
    int repeat = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--hidden") hidden = std::strtoull(argv[i + 1], nullptr, 10);
        if (a == "--layers") layers = std::strtoull(argv[i + 1], nullptr, 10);
        if (a == "--repeat") repeat = std::atoi(argv[i + 1]);
    }
    try {
        Engine src, dst;  // the trainer's engine and the server's engine
        mws::mooncake_te::Adapter src_adapter(src.te), dst_adapter(dst.te);
        mws::TransferEngine src_engine = src_adapter.engine(), dst_engine = dst_adapter.engine();
        std::vector<TensorDef> defs = model_tensors(layers, hidden, 0);
        std::vector<Row> rows;
        for (int c = 0; c < 2; ++c) {
            const bool reshard = c == 1;
            Model s = make("trainer", Layout{4, 1, 1, 1}, defs, true, "trainer", src.segment);
            Model t = make("serving", reshard ? Layout{2, 1, 1, 1} : Layout{4, 1, 1, 1}, defs, false, "server",
                           dst.segment);
            for (auto &b : s.m->buffers) src.te.registerLocalMemory(b.second.data(), b.second.size(), "cpu:0");
            for (auto &b : t.m->buffers) dst.te.registerLocalMemory(b.second.data(), b.second.size(), "cpu:0");
            mws::TransferPlan plan = mws::TransferPlan::plan(s.m->placement, t.m->placement).bind(t.ptrs(), s.ptrs());
            mws_live_args args{};
            args.local_pre_registered = 1;
            for (bool read : {true, false}) {
                Row row;
                row.name = reshard ? "reshard TP4->TP2" : "same TP4->TP4";
                row.dir = read ? "read" : "write";
                row.bytes = plan.total_bytes();
                std::vector<Range> ranges = planned_ranges(plan, read);
                row.segments = ranges.size();
                for (int r = -1; r < repeat; ++r) {  // r = -1: warm-up (handshakes, caches)
                    double secs = timed([&] {
                        raw(read ? dst.te : src.te, read ? src.segment : dst.segment, ranges, read);
                    });
                    if (r >= 0) {
                        row.raw.seconds = std::min(row.raw.seconds, secs);
                        row.raw.all.push_back(secs);
                    }
                    row.raw.requests = ranges.size();
                    for (auto &b : t.m->buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
                    std::uint64_t ops = 0;
                    const std::uint64_t native_before =
                        (read ? dst_adapter : src_adapter).counters().requests;
                    // One library batch per call: the adapter keeps the peer's queue full.
                    mws_executor_limits limits{1u << 20, 1000000, 10000000, 3, 1000, 0};
                    secs = timed([&] {
                        if (read) {
                            mws::Loader loader(dst_engine, &limits);
                            for (const auto &b : t.bindings)
                                ops += loader.load_live(plan, s.m->placement, s.ptrs(), t.m->placement, b, &args)
                                           .engine_operations;
                        } else {
                            mws::Sink sink(src_engine, &limits);
                            for (const auto &b : s.bindings)
                                ops += sink.execute(plan, s.m->placement, b, t.m->placement, t.ptrs(), &args)
                                           .engine_operations;
                        }
                    });
                    t.m->verify();  // throws on any differing byte
                    if (r >= 0) {
                        row.ours.seconds = std::min(row.ours.seconds, secs);
                        row.ours.all.push_back(secs);
                    }
                    row.ours.requests = (read ? dst_adapter : src_adapter).counters().requests - native_before;
                    row.engine_operations = ops;
                }
                rows.push_back(row);
                std::fprintf(stderr, "%s %s done\n", row.name.c_str(), row.dir.c_str());
            }
            for (auto &b : s.m->buffers) src.te.unregisterLocalMemory(b.second.data());
            for (auto &b : t.m->buffers) dst.te.unregisterLocalMemory(b.second.data());
        }
        std::printf("Mooncake TE %s (tcp, loopback, two engines in one process), best of %d, hidden %llu, "
                    "layers %llu\n\n",
                    "0.3.13.post1 engine.so", repeat, static_cast<unsigned long long>(hidden),
                    static_cast<unsigned long long>(layers));
        std::printf("| case | dir | MiB | planned segments | library operations | raw GB/s | ours GB/s | ours/raw | "
                    "raw requests | our requests | raw us/request | our us/request | our us/segment |\n");
        std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        std::vector<std::pair<std::string, double>> figures;
        for (const Row &r : rows) {
            double raw_gbs = r.bytes / r.raw.seconds / 1e9, ours_gbs = r.bytes / r.ours.seconds / 1e9;
            std::printf("| %s | %s | %.1f | %llu | %llu | %.3f | %.3f | %.2f | %llu | %llu | %.1f | %.1f | %.1f |\n",
                        r.name.c_str(), r.dir.c_str(), r.bytes / 1048576.0, static_cast<unsigned long long>(r.segments),
                        static_cast<unsigned long long>(r.engine_operations), raw_gbs, ours_gbs, ours_gbs / raw_gbs, static_cast<unsigned long long>(r.raw.requests),
                        static_cast<unsigned long long>(r.ours.requests), r.raw.seconds * 1e6 / r.raw.requests,
                        r.ours.seconds * 1e6 / std::max<std::uint64_t>(r.ours.requests, 1),
                        r.ours.seconds * 1e6 / r.segments);
            std::string key = std::string(r.name.rfind("reshard", 0) == 0 ? "reshard" : "same") + "_" + r.dir;
            figures.emplace_back(key + "_raw_gbps", raw_gbs);
            figures.emplace_back(key + "_ours_gbps", ours_gbs);
            figures.emplace_back(key + "_ratio", ours_gbs / raw_gbs);
            figures.emplace_back(key + "_median_ratio", r.raw.median() / r.ours.median());
        }
        std::printf("\n");
        for (const auto &f : figures) std::printf("figure: %s = %.3f\n", f.first.c_str(), f.second);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "te_bench: %s\n", e.what());
        return 1;
    }
}
