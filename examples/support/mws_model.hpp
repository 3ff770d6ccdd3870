// mws_model.hpp: a synthetic sharded transformer for the C++ examples and tests
// (examples/snapshot_restore.cpp, cpp_tests/gtest_snapshot_restore.cpp).
//
// Builds the placement of a model in any TP x PP x EP x DP layout through the
// library's placement builder (mws::PlacementBuilder), binds every
// participant to one host allocation with deterministic contents, and verifies
// restored bytes. Only the public C ABI / C++ wrapper is used.
//
// Contents: byte b of element e of a tensor is a hash of (content id, linear element
// index, b), where the content id is the tensor id, or the first member of its alias
// group (tied tensors hold the same bytes). Any box of any tensor can thus be checked
// on its own, whatever the layout it was restored into.
#ifndef MWS_MODEL_HPP
#define MWS_MODEL_HPP

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"

namespace mwsmodel {

struct Layout {
    std::uint64_t tp = 1, pp = 1, ep = 1, dp = 1;
};

struct TensorDef {
    std::string id;
    std::vector<std::uint64_t> shape;
    int tp_split = -1;          ///< TP split dimension, -1 = TP-replicated
    long long expert = -1;      ///< expert id (EP ownership), -1 = EP-replicated
    std::uint64_t experts = 0;  ///< experts per layer when expert >= 0
    long long layer = -1;       ///< layer (PP ownership), -1 = first stage
    std::uint64_t layers = 1;
    std::uint64_t itemsize = 2;
    std::vector<std::string> aliases;  ///< alias group (sorted), empty = none
};

/// The id whose contents a tensor holds: its own, or its alias group's first member.
inline const std::string &content_id(const TensorDef &d) { return d.aliases.empty() ? d.id : d.aliases.front(); }

/// `layers` layers (attention + dense MLP or `experts` MoE experts), dims divisible by 8.
/// The first `dense_layers` layers have a dense MLP even when `experts` > 0 (as in
/// DeepSeek-style models).
inline std::vector<TensorDef> model_tensors(std::uint64_t layers, std::uint64_t hidden, std::uint64_t experts,
                                            std::uint64_t dense_layers = 0) {
    std::vector<TensorDef> v;
    TensorDef emb;
    emb.id = "model.embed_tokens.weight";
    emb.shape = {4 * hidden, hidden};
    emb.tp_split = 0;
    v.push_back(emb);
    for (std::uint64_t l = 0; l < layers; ++l) {
        auto t = [&](const std::string &name, std::vector<std::uint64_t> shape, int tp) {
            TensorDef d;
            d.id = "model.layers." + std::to_string(l) + "." + name;
            d.shape = std::move(shape);
            d.tp_split = tp;
            d.layer = static_cast<long long>(l);
            d.layers = layers;
            return d;
        };
        v.push_back(t("input_layernorm.weight", {hidden}, -1));
        v.push_back(t("self_attn.qkv_proj.weight", {3 * hidden, hidden}, 0));
        v.push_back(t("self_attn.o_proj.weight", {hidden, hidden}, 1));
        if (experts == 0 || l < dense_layers) {
            v.push_back(t("mlp.up_proj.weight", {2 * hidden, hidden}, 0));
            v.push_back(t("mlp.down_proj.weight", {hidden, 2 * hidden}, 1));
        } else {
            for (std::uint64_t e = 0; e < experts; ++e) {
                TensorDef g = t("mlp.experts." + std::to_string(e) + ".gate_up_proj.weight", {hidden, hidden}, 0);
                g.expert = static_cast<long long>(e);
                g.experts = experts;
                v.push_back(g);
                TensorDef d = t("mlp.experts." + std::to_string(e) + ".down_proj.weight", {hidden, hidden / 2}, 1);
                d.expert = static_cast<long long>(e);
                d.experts = experts;
                v.push_back(d);
            }
        }
    }
    return v;
}

struct Rank {
    std::uint64_t dp, pp, ep, tp;
};

inline std::string u64_array(const std::vector<std::uint64_t> &v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

inline std::string participant_name(const Rank &r) {
    return "w-d" + std::to_string(r.dp) + "-p" + std::to_string(r.pp) + "-e" + std::to_string(r.ep) + "-t" +
           std::to_string(r.tp);
}

/// The canonical placement JSON of the model in layout `L`, built through the library's
/// placement builder (mws::PlacementBuilder: the ids and canonical JSON are the
/// library's, nothing is hashed here).
inline std::string placement_json(const std::string &set, const Layout &L, const std::vector<TensorDef> &defs,
                                  std::uint64_t generation, const std::string &resource_id = "test-model",
                                  const std::string &revision = "rev-1") {
    mws::PlacementBuilder b(resource_id, revision, generation, set, L.tp, L.pp, L.ep, L.dp);
    std::vector<std::pair<std::string, Rank>> participants;
    for (std::uint64_t dp = 0; dp < L.dp; ++dp)
        for (std::uint64_t pp = 0; pp < L.pp; ++pp)
            for (std::uint64_t ep = 0; ep < L.ep; ++ep)
                for (std::uint64_t tp = 0; tp < L.tp; ++tp) {
                    Rank r{dp, pp, ep, tp};
                    participants.emplace_back(participant_name(r), r);
                    b.add_participant(participant_name(r), mws_rank{dp, pp, ep, tp});
                }
    for (const TensorDef &d : defs) {
        mws::TensorSpec t;
        t.tensor_id = d.id;
        t.global_shape = d.shape;
        t.dtype = "bfloat16";
        t.itemsize = d.itemsize;
        t.layout_fingerprint = "test:row-major:v1";
        t.axes = {mws::Axis::replicated(MWS_AXIS_DP), mws::Axis::ownership(MWS_AXIS_PP),
                  d.expert >= 0 ? mws::Axis::ownership(MWS_AXIS_EP) : mws::Axis::replicated(MWS_AXIS_EP),
                  d.tp_split >= 0 ? mws::Axis::split(MWS_AXIS_TP, static_cast<std::uint64_t>(d.tp_split))
                                  : mws::Axis::replicated(MWS_AXIS_TP)};
        if (d.layer >= 0) t.layer_id = static_cast<std::uint64_t>(d.layer);
        if (d.expert >= 0) t.expert_id = static_cast<std::uint64_t>(d.expert);
        b.add_tensor(t);
        std::uint64_t pp_owner = d.layer >= 0 ? static_cast<std::uint64_t>(d.layer) * L.pp / d.layers : 0;
        for (const auto &p : participants) {
            const Rank &r = p.second;
            if (r.pp != pp_owner) continue;
            if (d.expert >= 0 && r.ep != static_cast<std::uint64_t>(d.expert) / (d.experts / L.ep)) continue;
            mws::FragmentSpec f;
            f.participant_id = p.first;
            f.tensor_id = d.id;
            f.global_offset.assign(d.shape.size(), 0);
            f.local_shape = d.shape;
            if (d.tp_split >= 0) {
                std::size_t dim = static_cast<std::size_t>(d.tp_split);
                f.local_shape[dim] /= L.tp;
                f.global_offset[dim] = r.tp * f.local_shape[dim];
            }
            f.aliases = d.aliases;
            f.placement_fragment_id = "f:" + d.id + "@" + p.first;
            b.add_fragment(f);
        }
    }
    return std::string(b.build().to_json());
}

// ---- deterministic contents -------------------------------------------------------
inline std::uint64_t tensor_seed(const std::string &id) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

/// Fills `out` with the expected bytes of the box (offset, shape) of a tensor of
/// global shape `gs` (row-major, contiguous).
inline void expected_bytes(const std::string &tensor_id, const std::vector<std::uint64_t> &gs, std::uint64_t item,
                           const std::uint64_t *offset, const std::uint64_t *shape, std::size_t n, unsigned char *out) {
    std::uint64_t seed = tensor_seed(tensor_id);
    std::uint64_t rows = 1;
    for (std::size_t d = 0; d + 1 < n; ++d) rows *= shape[d];
    std::vector<std::uint64_t> idx(n, 0);
    std::uint64_t inner = shape[n - 1];
    std::size_t pos = 0;
    for (std::uint64_t r = 0; r < rows; ++r) {
        std::uint64_t linear = 0;
        for (std::size_t d = 0; d + 1 < n; ++d) linear = linear * gs[d] + offset[d] + idx[d];
        linear = linear * gs[n - 1] + offset[n - 1];
        for (std::uint64_t e = 0; e < inner; ++e)
            for (std::uint64_t b = 0; b < item; ++b) {
                std::uint64_t x = (seed ^ ((linear + e) * item + b)) * 0x9E3779B97F4A7C15ull;
                out[pos++] = static_cast<unsigned char>(x >> 56);
            }
        for (std::size_t d = n - 1; d-- > 0;) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

// ---- a placement bound to host buffers -------------------------------------------
struct View {
    std::string participant, pfid, tensor;
    std::size_t offset, nbytes;
    std::vector<std::uint64_t> goffset, shape;
    std::uint64_t itemsize;
};

/// A placement bound to host buffers: one allocation per participant, fragments at
/// 64-byte aligned offsets. Aliased fragments (same alias group, same box) share bytes
/// unless `share_aliases` is false. `fill`: write the expected contents (a source);
/// otherwise every byte is 0xA5 (a restore target).
class HostModel {
public:
    HostModel(const std::string &json, const std::vector<TensorDef> &defs, bool fill, const std::string &instance,
              std::uint64_t generation = 1, bool share_aliases = true)
        : placement(mws::Placement::from_json(json)) {
        std::map<std::string, const TensorDef *> by_id;
        for (const auto &d : defs) by_id[d.id] = &d;
        std::map<std::string, std::size_t> size;
        std::map<std::string, std::size_t> alias_at;  // participant|aliases|offset -> offset
        for (std::size_t i = 0; i < placement.fragment_count(); ++i) {
            mws_placement_fragment_info f = placement.fragment(i);
            View v;
            v.participant = f.participant_id;
            v.pfid = f.placement_fragment_id;
            v.tensor = f.tensor_id;
            v.nbytes = static_cast<std::size_t>(f.nbytes);
            v.goffset.assign(f.global_offset, f.global_offset + f.ndim);
            v.shape.assign(f.local_shape, f.local_shape + f.ndim);
            v.itemsize = f.itemsize;
            const TensorDef *d = by_id.at(v.tensor);
            std::string akey;
            if (share_aliases && !d->aliases.empty()) {
                akey = v.participant + "|" + d->aliases[0] + "|" + u64_array(v.goffset);
            }
            if (!akey.empty() && alias_at.count(akey)) {
                v.offset = alias_at[akey];
            } else {
                v.offset = size[v.participant];
                size[v.participant] += (v.nbytes + 63) / 64 * 64;
                if (!akey.empty()) alias_at[akey] = v.offset;
            }
            global_shapes[v.tensor] = d->shape;
            content_ids[v.tensor] = content_id(*d);
            views.push_back(v);
        }
        for (const auto &s : size) {
            buffers[s.first].assign(std::max<std::size_t>(s.second, 64), 0xA5);
        }
        if (fill) {
            // Replicas (DP, replicated axes) and alias twins of a box hold the same
            // bytes: compute each distinct box once, copy it to the others.
            std::map<std::string, const unsigned char *> filled;  // box key -> first copy
            for (const View &v : views) {
                unsigned char *dst = buffers[v.participant].data() + v.offset;
                auto it = filled.find(box_key(v));
                if (it != filled.end()) {
                    if (it->second != dst) std::memcpy(dst, it->second, v.nbytes);
                    continue;
                }
                expected_bytes(content_ids[v.tensor], global_shapes[v.tensor], v.itemsize, v.goffset.data(),
                               v.shape.data(), v.shape.size(), dst);
                filled.emplace(box_key(v), dst);
            }
        }
        make_bindings(instance, generation);
    }

    void make_bindings(const std::string &instance, std::uint64_t generation, const std::string &lease_suffix = "") {
        bindings.clear();
        const std::string device =
            memory_kind == MWS_MEMORY_DEVICE ? "cuda:" + std::to_string(device_ordinal) : std::string("cpu");
        for (auto &b : buffers) {
            auto placed = base_addresses.find(b.first);
            const std::uint64_t base = placed != base_addresses.end()
                                           ? placed->second
                                           : static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(b.second.data()));
            mws::BindingOptions o = mws::BindingOptions::for_placement(placement);
            o.participant_id = b.first;
            o.instance_id = instance;
            o.lease_id = instance + "-lease-" + std::to_string(generation) + lease_suffix;
            o.lease_generation = generation;
            mws::Binding binding(o);
            std::size_t k = 0;
            for (const View &v : views) {
                if (v.participant != b.first) continue;
                std::vector<std::uint64_t> strides(v.shape.size());
                std::uint64_t acc = v.itemsize;
                for (std::size_t d = v.shape.size(); d-- > 0;) {
                    strides[d] = acc;
                    acc *= v.shape[d];
                }
                std::string fid = b.first + ":rt" + std::to_string(k++);
                std::string endpoint =
                    process_endpoint.empty() ? endpoint_prefix + b.first + ":17000" : process_endpoint;
                mws_runtime_fragment f{};
                f.placement_fragment_id = v.pfid.c_str();
                f.fragment_id = fid.c_str();
                f.address = reinterpret_cast<const void *>(static_cast<std::uintptr_t>(base + v.offset));
                f.nbytes = v.nbytes;
                f.worker_id = worker_of(b.first, k - 1).c_str();
                f.endpoint = endpoint.c_str();
                f.device = device.c_str();
                f.itemsize = v.itemsize;
                f.local_shape = v.shape.data();
                f.local_shape_len = v.shape.size();
                f.strides_bytes = strides.data();
                f.strides_bytes_len = strides.size();
                f.storage_address = reinterpret_cast<const void *>(static_cast<std::uintptr_t>(base));
                f.storage_nbytes = b.second.size();
                f.storage_offset_bytes = v.offset;
                f.memory_kind = memory_kind;
                f.device_ordinal = memory_kind == MWS_MEMORY_DEVICE ? device_ordinal : 0;
                binding.add_fragment(f);
            }
            bindings.push_back(std::move(binding));
        }
    }

    /// Number of bytes checked; throws on the first difference.
    /// Every view is compared with independently computed expected bytes (computed
    /// once per distinct box and compared with each of its copies).
    std::size_t verify() const {
        std::map<std::string, std::vector<const View *>> boxes;  // box key -> views
        for (const View &v : views) boxes[box_key(v)].push_back(&v);
        std::size_t checked = 0;
        std::vector<unsigned char> want;
        for (const auto &box : boxes) {
            const View &v0 = *box.second.front();
            want.resize(v0.nbytes);
            expected_bytes(content_ids.at(v0.tensor), global_shapes.at(v0.tensor), v0.itemsize, v0.goffset.data(),
                           v0.shape.data(), v0.shape.size(), want.data());
            for (const View *v : box.second) {
                if (std::memcmp(buffers.at(v->participant).data() + v->offset, want.data(), v->nbytes) != 0) {
                    throw std::runtime_error("target bytes differ: " + v->participant + " " + v->tensor);
                }
                checked += v->nbytes;
            }
        }
        return checked;
    }

    /// Writes weight generation `generation`'s contents into every view (the bytes of
    /// generation_content_id(), so each generation differs from the last).
    void fill_generation(std::uint64_t generation) {
        for (const View &v : views) {
            expected_bytes(generation_content_id(content_ids.at(v.tensor), generation), global_shapes.at(v.tensor),
                           v.itemsize, v.goffset.data(), v.shape.data(), v.shape.size(),
                           buffers.at(v.participant).data() + v.offset);
        }
    }
    /// Per participant whose bytes are not generation `generation`'s: the first tensor
    /// that differs. `in`: other buffers of the same layout (nullptr: this model's).
    std::map<std::string, std::string> generation_differs(
        std::uint64_t generation, const std::map<std::string, std::vector<unsigned char>> *in = nullptr) const {
        const auto &bufs = in != nullptr ? *in : buffers;
        std::map<std::string, std::string> bad;
        std::vector<unsigned char> want;
        for (const View &v : views) {
            want.resize(v.nbytes);
            expected_bytes(generation_content_id(content_ids.at(v.tensor), generation), global_shapes.at(v.tensor),
                           v.itemsize, v.goffset.data(), v.shape.data(), v.shape.size(), want.data());
            if (std::memcmp(bufs.at(v.participant).data() + v.offset, want.data(), v.nbytes) != 0)
                bad.emplace(v.participant, v.tensor);
        }
        return bad;
    }
    /// The content id a tensor's bytes derive from at weight generation `generation`.
    static std::string generation_content_id(const std::string &content_id, std::uint64_t generation) {
        return content_id + "#gen" + std::to_string(generation);
    }

    /// Views with equal keys hold equal bytes: same contents, same box.
    std::string box_key(const View &v) const {
        return content_ids.at(v.tensor) + "|" + u64_array(v.goffset) + "|" + u64_array(v.shape) + "|" +
               std::to_string(v.itemsize);
    }

    std::vector<const mws::Binding *> binding_ptrs() const {
        std::vector<const mws::Binding *> out;
        for (const auto &b : bindings) out.push_back(&b);
        return out;
    }

    /// Worker of the k-th fragment of a participant (`workers_per_participant` > 1
    /// spreads fragments over several workers).
    const std::string &worker_of(const std::string &participant, std::size_t k) {
        std::string w = participant;
        if (workers_per_participant > 1) w += "/w" + std::to_string(k % workers_per_participant);
        return *worker_names.insert(w).first;
    }

    mws::Placement placement;
    std::map<std::string, std::vector<unsigned char>> buffers;  // participant -> allocation
    std::vector<View> views;
    std::map<std::string, std::vector<std::uint64_t>> global_shapes;
    std::map<std::string, std::string> content_ids;  // tensor -> id its contents derive from
    std::vector<mws::Binding> bindings;
    std::size_t workers_per_participant = 1;
    std::uint32_t memory_kind = MWS_MEMORY_HOST;
    std::uint32_t device_ordinal = 0;  ///< with memory_kind MWS_MEMORY_DEVICE ("cuda:<ordinal>")
    /// participant -> the address its allocation is bound at instead of its host buffer
    /// (device memory: the buffer then holds a host image of it); call make_bindings
    /// again after setting it.
    std::map<std::string, std::uint64_t> base_addresses;
    /// Prepended to every fragment's endpoint (`<prefix><participant>:17000`); set it and
    /// call make_bindings again to give two instances distinct endpoints.
    std::string endpoint_prefix;
    /// When set, the endpoint of every fragment instead (one engine per process: its
    /// segment name); call make_bindings again after setting it.
    std::string process_endpoint;
    std::set<std::string> worker_names;
};

// ---- a snapshot adapter over a HostModel ----------------------------------------
/// The framework "tensor" passed to write_tensor is a `const char *` participant id;
/// resolve_fragment_ids returns that participant's fragments of the tensor.
/// Callbacks never throw (the C ABI forbids unwinding through it).
struct HostAdapter {
    explicit HostAdapter(const HostModel &m) : model(&m) {
        for (const View &v : m.views) fragments[{v.tensor, v.participant}].push_back(v.pfid.c_str());
    }

    static mws_snapshot_adapter_vtable vtable() {
        mws_snapshot_adapter_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION;
        vt.export_source = &export_source;
        vt.resolve_fragment_ids = &resolve;
        return vt;
    }

    static int32_t export_source(void *ctx, const mws_snapshot_descriptor *, const mws_placement **placement,
                                 const mws_binding *const **bindings, size_t *count) noexcept {
        auto *self = static_cast<HostAdapter *>(ctx);
        try {
            self->raw_bindings.clear();
            for (const auto &b : self->model->bindings) self->raw_bindings.push_back(b.get());
        } catch (...) {
            return -1;
        }
        *placement = self->model->placement.get();
        *bindings = self->raw_bindings.data();
        *count = self->raw_bindings.size();
        return 0;
    }

    static int32_t resolve(void *ctx, const char *tensor_id, void *tensor, const char *const **ids,
                           size_t *count) noexcept {
        auto *self = static_cast<HostAdapter *>(ctx);
        try {
            auto it = self->fragments.find({std::string(tensor_id), std::string(static_cast<const char *>(tensor))});
            if (it == self->fragments.end()) {
                *ids = nullptr;
                *count = 0;
                return 0;
            }
            *ids = it->second.data();
            *count = it->second.size();
            return 0;
        } catch (...) {
            return -1;
        }
    }

    const HostModel *model;
    std::map<std::pair<std::string, std::string>, std::vector<const char *>> fragments;  // (tensor, participant)
    std::vector<const mws_binding *> raw_bindings;
};

/// Snapshots `src` into `store` through a Writer (one write_tensor per tensor and
/// participant of the writer's plan, as a trainer would call it); returns the manifest.
/// `progress` (optional) sees the whole snapshot's uploads. `metadata_keys` (optional)
/// receives the keys of the protocol's metadata objects besides the payloads: the
/// decision record (control key), the integrity record (`<group>/integrity/<tx>`) and
/// the manifest. `defer_uploads`: the Writer uploads every participant in one call at
/// commit (Writer::defer_uploads) instead of each as it completes.
inline mws::StoredManifest snapshot(const mws::Store &store, const HostModel &src, const std::string &ns = "default",
                                    mws::ProgressCallback progress = {},
                                    std::vector<std::string> *metadata_keys = nullptr, bool defer_uploads = false) {
    HostAdapter adapter(src);
    mws_snapshot_adapter_vtable vt = HostAdapter::vtable();
    mws::Writer w = mws::Writer::begin(store, std::string(src.placement.resource_id()),
                                       std::string(src.placement.revision()), src.placement.weight_generation(), vt,
                                       &adapter, ns);
    if (progress) w.set_progress(std::move(progress));
    if (defer_uploads) w.defer_uploads();
    mws::UploadPlan plan = w.upload_plan();
    if (metadata_keys != nullptr)
        *metadata_keys = {std::string(plan.control_key()),
                          std::string(plan.group_id()) + "/integrity/" + std::string(plan.transaction_id()),
                          std::string(plan.manifest_key())};
    std::map<std::string, std::string> tensor_of;  // placement fragment id -> tensor
    for (const View &v : src.views) tensor_of[v.pfid] = v.tensor;
    std::set<std::pair<std::string, std::string>> seen;
    for (std::size_t i = 0; i < plan.operation_count(); ++i) {
        mws::UploadOperation op = plan.operation(i);
        std::string participant(op.source_participant_id);
        const std::string &tensor = tensor_of.at(std::string(op.source_placement_fragment_id));
        if (seen.insert({tensor, participant}).second) {
            w.write_tensor(tensor, const_cast<char *>(participant.c_str()));
        }
    }
    return w.commit();
}

/// Restores `manifest` into every participant of `dst` (each load with `args`, e.g.
/// a progress callback); returns total stats.
inline mws_load_stats restore(const mws::Store &store, const mws::StoredManifest &manifest, const HostModel &dst,
                              std::size_t *regions = nullptr, const mws::IoArgs &args = {}) {
    mws::LoadPlan plan = mws::LoadPlan::plan(manifest, dst.placement, dst.binding_ptrs());
    if (regions != nullptr) *regions = plan.region_count();
    mws_load_stats total{};
    for (const auto &b : dst.bindings) {
        mws_load_stats s = store.load(plan, b, args);
        total.regions += s.regions;
        total.ranges += s.ranges;
        total.requests += s.requests;
        total.bytes += s.bytes;
        total.strided_regions += s.strided_regions;
        total.direct_regions += s.direct_regions;
        total.staged_regions += s.staged_regions;
        total.staged_bytes += s.staged_bytes;
    }
    return total;
}

}  // namespace mwsmodel

#endif  // MWS_MODEL_HPP
