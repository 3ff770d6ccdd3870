// quickstart.cpp: the README's C++ example, a complete program. A trainer holds one
// tensor [8, 6] in TP=2 (rows split), snapshots it into the embedded memory store; a
// server in TP=3 (columns split) restores it and checks every byte.
#include <cstdio>
#include <vector>

#include "mooncake_weight_store.hpp"

struct Rank {  // one TP rank: its box of the tensor and the buffer that holds it
    std::uint64_t row0, col0, rows, cols;
    std::vector<unsigned char> buf;
};

struct Layout {
    mws::Placement placement;
    std::vector<Rank> ranks;
    std::vector<mws::Binding> bindings;
};

Layout make_layout(std::uint64_t tp, std::uint64_t dim, const std::string &name) {
    const std::string tensor = "model.layers.0.mlp.down_proj.weight";
    mws::PlacementBuilder b("quickstart-model", "rev-1", /*generation*/ 1, name, tp);
    b.add_tensor({tensor, {8, 6}, "bfloat16", 2, "quickstart:row-major:v1",
                  {mws::Axis::replicated(MWS_AXIS_DP), mws::Axis::split(MWS_AXIS_TP, dim)}, {}, {}});
    std::vector<Rank> ranks;
    std::vector<std::string> ids;
    for (std::uint64_t r = 0; r < tp; ++r) {
        Rank k{dim == 0 ? r * 8 / tp : 0, dim == 1 ? r * 6 / tp : 0, dim == 0 ? 8 / tp : 8, dim == 1 ? 6 / tp : 6, {}};
        k.buf.assign(k.rows * k.cols * 2, 0);
        b.add_participant(name + "-tp" + std::to_string(r), mws_rank{0, 0, 0, r});
        ids.emplace_back(b.add_fragment({name + "-tp" + std::to_string(r), tensor, {k.row0, k.col0}, {k.rows, k.cols}, {}, {}, {}}));
        ranks.push_back(std::move(k));
    }
    Layout l{b.build(), std::move(ranks), {}};
    for (std::uint64_t r = 0; r < tp; ++r) {
        Rank &k = l.ranks[r];
        std::string who = name + "-tp" + std::to_string(r);
        mws::BindingOptions o = mws::BindingOptions::for_placement(l.placement);
        o.participant_id = o.instance_id = who;
        o.lease_id = "lease-1";
        mws::Binding binding(o);
        std::uint64_t shape[2] = {k.rows, k.cols}, strides[2] = {k.cols * 2, 2};
        mws_runtime_fragment f{};
        f.placement_fragment_id = ids[r].c_str();
        f.fragment_id = who.c_str();
        f.address = f.storage_address = k.buf.data();  // borrowed: must outlive uploads and loads
        f.nbytes = f.storage_nbytes = k.buf.size();
        f.worker_id = "worker-0";
        f.endpoint = "localhost";
        f.device = "cpu";
        f.itemsize = 2;
        f.local_shape = shape;
        f.local_shape_len = 2;
        f.strides_bytes = strides;
        f.strides_bytes_len = 2;
        f.memory_kind = MWS_MEMORY_HOST;
        binding.add_fragment(f);  // copied: `shape` and `strides` may go
        l.bindings.push_back(std::move(binding));
    }
    return l;
}

unsigned char value(std::uint64_t i, std::uint64_t j, std::uint64_t byte) { return (unsigned char)(i * 31 + j * 7 + byte); }

int main() try {
    mws::Store store = mws::Store::open_memory();  // or mws::Store::open_dir("/var/lib/mws")

    Layout trainer = make_layout(2, 0, "trainer");  // TP=2, rows split
    for (Rank &k : trainer.ranks)
        for (std::size_t n = 0; n < k.buf.size(); ++n)
            k.buf[n] = value(k.row0 + n / 2 / k.cols, k.col0 + n / 2 % k.cols, n % 2);
    std::vector<const mws::Binding *> sources;
    for (const auto &b : trainer.bindings) sources.push_back(&b);
    mws::UploadPlan plan = mws::plan_upload(trainer.placement, sources);
    std::vector<mws::Receipts> receipts;
    for (const auto &b : trainer.bindings) receipts.push_back(store.upload(plan, trainer.placement, b));
    std::vector<const mws::Receipts *> all;
    for (const auto &r : receipts) all.push_back(&r);
    mws::StoredManifest manifest = store.commit(plan, mws::Receipts::concat(all));

    Layout server = make_layout(3, 1, "server");  // TP=3, columns split
    std::vector<const mws::Binding *> targets;
    for (const auto &b : server.bindings) targets.push_back(&b);
    mws::LoadPlan load = mws::LoadPlan::plan(manifest, server.placement, targets);
    mws::IoArgs args;
    args.progress = [](const mws_progress &p) {
        std::printf("  restore %llu/%llu bytes\n", (unsigned long long)p.bytes_done, (unsigned long long)p.bytes_total);
    };
    std::size_t wrong = 0;
    for (std::size_t r = 0; r < server.ranks.size(); ++r) {
        store.load(load, server.bindings[r], args);
        const Rank &k = server.ranks[r];
        for (std::size_t n = 0; n < k.buf.size(); ++n)
            wrong += k.buf[n] != value(k.row0 + n / 2 / k.cols, k.col0 + n / 2 % k.cols, n % 2);
    }
    std::printf("%s: restored TP=2 into TP=3, %s\n", std::string(manifest.key()).c_str(),
                wrong == 0 ? "every byte matches" : "MISMATCH");
    return wrong == 0 ? 0 : 1;
} catch (const mws::Error &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
