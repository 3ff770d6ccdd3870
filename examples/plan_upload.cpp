// plan_upload.cpp: plan a weight upload through the C++ RAII wrapper.
//
//   plan_upload_cpp [PLACEMENT.json]
//
// Parses a placement (the file given, or a small embedded TP=2 sample), binds every
// fragment of every participant to a host buffer, plans the upload and prints the
// plan. Every failure throws mws::Error (status + message).
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"

namespace {

// A TP=2 placement of one bf16 tensor [8, 4] split on dim 0.
const char SAMPLE_PLACEMENT[] =
    "{\"parts\":[{\"fragments\":[{\"aliases\":[],\"global_offset\":[0,0],\"local_shape\":[4,4],\"nbytes\":3"
    "2,\"placement_fragment_id\":\"sha256:0d6d6e1f48414d495aac3125087eaf76e0b574ef0b3b2a5a4e4ec781"
    "a0b1b225\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0},\"tensor_id\":\"model.layers.0.mlp.down_proj.w"
    "eight\"}],\"participant_id\":\"rank-d0-p0-e0-t0\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0}},{\"fragm"
    "ents\":[{\"aliases\":[],\"global_offset\":[4,0],\"local_shape\":[4,4],\"nbytes\":32,\"placement_frag"
    "ment_id\":\"sha256:6e784bd2304958a1cff065a922dd3ccf3bc4a543e460c639529c89f7208bc552\",\"rank\":"
    "{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1},\"tensor_id\":\"model.layers.0.mlp.down_proj.weight\"}],\"partici"
    "pant_id\":\"rank-d0-p0-e0-t1\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1}}],\"placement_id\":\"sha256:"
    "cabe1ad0eee61a901c0f83f2d89a7815f4a4fa647feec6ae4309f6086b6da8ac\",\"placement_set_id\":\"fixt"
    "ure-set\",\"resource_id\":\"fixture-model\",\"resource_kind\":\"model_weight\",\"revision\":\"rev-1\",\""
    "tensors\":[{\"dtype\":\"bfloat16\",\"expert_id\":null,\"global_shape\":[8,4],\"itemsize\":2,\"layer_id"
    "\":0,\"layout_fingerprint\":\"fixture:logical-contiguous:v1\",\"parallel_axes\":[{\"kind\":\"dp\",\"se"
    "mantics\":\"replicated\"},{\"dim\":0,\"kind\":\"tp\",\"semantics\":\"split\"}],\"shard_dims\":[0],\"tensor"
    "_id\":\"model.layers.0.mlp.down_proj.weight\"}],\"topology\":{\"dp_size\":1,\"ep_size\":1,\"particip"
    "ants\":[{\"participant_id\":\"rank-d0-p0-e0-t0\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0}},{\"partic"
    "ipant_id\":\"rank-d0-p0-e0-t1\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1}}],\"pp_size\":1,\"topology_"
    "id\":\"sha256:c6c933912144915393c0c11187e25447738938b0bd4b44e28ca291298121e8ea\",\"tp_size\":2}"
    ",\"weight_generation\":1}"
;

}  // namespace

int main(int argc, char **argv) try {
    std::string json = SAMPLE_PLACEMENT;
    if (argc > 1) {
        std::ifstream in(argv[1], std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        json = ss.str();
    }
    const mws::Placement placement = mws::Placement::from_json(json);
    std::cout << "placement " << placement.id() << "\n  " << placement.participant_count() << " participants, "
              << placement.tensor_count() << " tensors, " << placement.fragment_count() << " fragments\n";

    // Host buffers must outlive every use of the bindings that lend them.
    std::vector<std::vector<unsigned char>> buffers(placement.fragment_count());
    std::map<std::string, mws::Binding> bindings;  // by participant
    for (std::size_t i = 0; i < placement.fragment_count(); ++i) {
        const mws_placement_fragment_info info = placement.fragment(i);
        auto it = bindings.find(info.participant_id);
        if (it == bindings.end()) {
            mws::BindingOptions o = mws::BindingOptions::for_placement(placement);
            o.participant_id = info.participant_id;
            o.instance_id = info.participant_id;
            o.lease_id = "example-lease";
            it = bindings.emplace(info.participant_id, mws::Binding(o)).first;
        }
        buffers[i].resize(info.nbytes);
        std::vector<std::uint64_t> strides(info.ndim);
        for (std::size_t d = info.ndim; d-- > 0;) {
            strides[d] = d + 1 == info.ndim ? info.itemsize : strides[d + 1] * info.local_shape[d + 1];
        }
        const std::string fragment_id = std::string(info.participant_id) + ":rt" + std::to_string(i);
        mws_runtime_fragment f{};
        f.placement_fragment_id = info.placement_fragment_id;
        f.fragment_id = fragment_id.c_str();
        f.address = buffers[i].data();
        f.nbytes = info.nbytes;
        f.worker_id = info.participant_id;
        f.endpoint = "localhost:17000";
        f.device = "cpu";
        f.itemsize = info.itemsize;
        f.local_shape = info.local_shape;
        f.local_shape_len = info.ndim;
        f.strides_bytes = strides.data();
        f.strides_bytes_len = strides.size();
        f.storage_address = buffers[i].data();
        f.storage_nbytes = info.nbytes;
        f.memory_kind = MWS_MEMORY_HOST;
        it->second.add_fragment(f);
    }

    std::vector<const mws::Binding *> set;
    for (const auto &entry : bindings) {
        entry.second.validate(placement);
        set.push_back(&entry.second);
    }
    mws::UploadOptions options;  // defaults: namespace "default", prefix "weights"
    options.transaction_id = "de644a8d8f23b7ea0895fc8cad62451c";
    options.created_at = "2025-03-14T15:09:26Z";
    const mws::UploadPlan plan = mws::plan_upload(placement, set, options);

    std::cout << "manifest digest " << plan.manifest_digest() << "\n  manifest key " << plan.manifest_key()
              << "\n  control key  " << plan.control_key() << "\n";
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        const mws::UploadOperation op = plan.operation(i);
        std::cout << "  op " << i << ": " << op.source_fragment_id << " (" << op.source_participant_id << ") -> "
                  << op.object_key << " [" << op.nbytes << " bytes]\n";
    }
    return 0;
} catch (const mws::Error &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
}
