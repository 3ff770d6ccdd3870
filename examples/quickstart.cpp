// quickstart.cpp: the README's C++ example, a complete program. A trainer holds one
// tensor [8, 6] in TP=2 (rows split), snapshots it into the embedded memory store; a
// server in TP=3 (columns split) restores it and checks every byte.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"

// The tensor over `tp` ranks that split dimension `dim` evenly: one participant per rank.
mws::Placement layout(const std::string &name, std::uint64_t tp, std::uint64_t dim) {
    mws::PlacementBuilder b("quickstart-model", "rev-1", /*weight_generation*/ 1, name, tp);
    b.add_grid(name);  // participants <name>-d0-p0-e0-t0, <name>-d0-p0-e0-t1, ...
    // Declares the tensor (id, shape, dtype, itemsize, layout fingerprint, axes) and
    // adds each rank's fragment: its even share of dimension `dim`.
    b.shard({"model.layers.0.mlp.down_proj.weight", {8, 6}, "bfloat16", 2, "quickstart:row-major:v1",
             {mws::Axis::split(MWS_AXIS_TP, dim)}});
    return b.build();
}

// Byte n of a fragment's buffer: a function of its element's place in the whole tensor.
unsigned char value(const mws::FragmentInfo &f, std::uint64_t n) {
    std::vector<std::uint64_t> ij = f.global_position(n / f.itemsize);
    return static_cast<unsigned char>(ij[0] * 31 + ij[1] * 7 + n % f.itemsize);
}

int main() try {
    mws::Store store = mws::Store::open_memory();  // or mws::Store::open_dir("/var/lib/mws")

    mws::Placement trainer = layout("trainer", 2, 0);  // TP=2, rows split
    mws::HostBuffers src(trainer);  // a zeroed buffer per fragment, bound (your own memory: mws::Binding::add)
    for (const mws::HostBuffers::Buffer &buf : src.buffers())
        for (std::size_t n = 0; n < buf.size; ++n) buf.data[n] = value(buf.fragment, n);
    mws::StoredManifest manifest = store.snapshot(trainer, src.bindings());

    mws::Placement server = layout("server", 3, 1);  // TP=3, columns split
    mws::HostBuffers dst(server);
    store.restore(manifest, server, dst.bindings());
    std::size_t wrong = 0;
    for (const mws::HostBuffers::Buffer &buf : dst.buffers())
        for (std::size_t n = 0; n < buf.size; ++n) wrong += buf.data[n] != value(buf.fragment, n);
    std::cout << manifest.key() << ": restored TP=2 into TP=3, " << (wrong ? "MISMATCH" : "every byte matches") << "\n";
    return wrong == 0 ? 0 : 1;
} catch (const mws::Error &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
}
