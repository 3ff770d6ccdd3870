// mooncake_weight_store.hpp: header-only C++17 RAII wrapper over the C ABI in
// mooncake_weight_store.h. Hand-written (not generated).
//
// - Every handle is owned by exactly one movable, non-copyable object (a unique_ptr
//   with the matching mws_*_free as deleter). `get()` lends the raw handle;
//   `release()` gives up ownership.
// - Every failed C call throws mws::Error, which carries the mws_status and the
//   thread-local message of the failure (mws_last_error_message()).
// - Strings are returned as std::string_view borrowed from the object that returned
//   them: they stay valid while that object lives (and is not moved from or reset).
// - Thread safety is that of the C handles: Placement, UploadPlan, Store, Receipts,
//   StoredManifest and LoadPlan may be used from several threads at once;
//   Binding::add_fragment must not race with other calls on the same Binding; Writer
//   and Transaction serialize their calls internally.
// - Callbacks (store vtable, guards, adapters) are C function pointers: they must not
//   throw. Catch everything inside them and return a non-zero code.
#ifndef MOONCAKE_WEIGHT_STORE_HPP
#define MOONCAKE_WEIGHT_STORE_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake_weight_store.h"

namespace mws {

/// A failed mws_ call: the status code plus the library's message.
class Error : public std::runtime_error {
public:
    Error(mws_status status, const std::string &message)
        : std::runtime_error(std::string(mws_status_name(static_cast<int>(status))) + ": " + message),
          status_(status) {}

    /// The status the C call returned.
    mws_status status() const noexcept { return status_; }

private:
    mws_status status_;
};

namespace detail {

/// Throws mws::Error if `status` is not MWS_OK.
inline void check(mws_status status) {
    if (status != MWS_OK) {
        throw Error(status, mws_last_error_message());
    }
}

/// Wraps a borrowed (pointer, length) string; NULL means the call failed.
inline std::string_view view(const char *p, std::size_t len) {
    if (p == nullptr) {
        throw Error(MWS_NULL_ARGUMENT, mws_last_error_message());
    }
    return std::string_view(p, len);
}

/// Converts an optional string to a nullable C string (borrowed from `s`).
inline const char *c_str_or_null(const std::optional<std::string> &s) noexcept {
    return s ? s->c_str() : nullptr;
}

template <typename T, void (*Free)(T *)>
struct Deleter {
    void operator()(T *p) const noexcept { Free(p); }
};

/// Calls the std::function behind `ctx` (a `const ProgressCallback *`); an exception
/// it throws is swallowed here, since none may cross into the library.
inline void progress_trampoline(void *ctx, const mws_progress *progress) noexcept {
    try {
        (*static_cast<const std::function<void(const mws_progress &)> *>(ctx))(*progress);
    } catch (...) {
    }
}

}  // namespace detail

/// A progress callback (see mws_progress_fn): called on the calling thread, inside the
/// call, once at the start, at most every 100 ms, and once when the data phase is done.
/// Keep it quick; it must not call back into the object that reports. Exceptions it
/// throws are swallowed.
using ProgressCallback = std::function<void(const mws_progress &)>;

/// The library version ("MAJOR.MINOR.PATCH").
inline std::string_view version() { return mws_version(); }

/// The static name of a status ("MWS_INVALID_ARGUMENT", ...).
inline std::string_view status_name(mws_status status) { return mws_status_name(static_cast<int>(status)); }

/// A parsed, validated, immutable complete placement (owns an mws_placement).
class Placement {
public:
    /// Parses and validates a placement from its JSON wire form.
    static Placement from_json(std::string_view json) {
        mws_placement *raw = nullptr;
        detail::check(mws_placement_from_json(json.data(), json.size(), &raw));
        return Placement(raw);
    }

    /// Takes ownership of a handle from mws_placement_from_json.
    explicit Placement(mws_placement *raw) noexcept : handle_(raw) {}

    std::string_view to_json() const { return str(mws_placement_to_json); }
    std::string_view id() const { return str(mws_placement_id); }
    std::string_view digest() const { return str(mws_placement_digest); }
    std::string_view topology_id() const { return str(mws_placement_topology_id); }
    std::string_view resource_id() const { return str(mws_placement_resource_id); }
    std::string_view revision() const { return str(mws_placement_revision); }
    std::uint64_t weight_generation() const { return mws_placement_weight_generation(get()); }
    std::size_t participant_count() const { return mws_placement_participant_count(get()); }
    std::size_t tensor_count() const { return mws_placement_tensor_count(get()); }
    std::size_t fragment_count() const { return mws_placement_fragment_count(get()); }

    /// Fragment `index` (borrowed pointers, valid while this Placement lives).
    mws_placement_fragment_info fragment(std::size_t index) const {
        mws_placement_fragment_info info{};
        detail::check(mws_placement_fragment(get(), index, &info));
        return info;
    }

    const mws_placement *get() const noexcept { return handle_.get(); }
    mws_placement *release() noexcept { return handle_.release(); }

private:
    std::string_view str(const char *(*accessor)(const mws_placement *, std::size_t *)) const {
        std::size_t len = 0;
        const char *p = accessor(get(), &len);
        return detail::view(p, len);
    }

    std::unique_ptr<mws_placement, detail::Deleter<mws_placement, mws_placement_free>> handle_;
};

/// One tensor axis for PlacementBuilder::add_tensor.
struct Axis {
    mws_axis_kind kind;
    mws_axis_semantics semantics;
    std::uint64_t dim = 0;  ///< split axes only
    static Axis split(mws_axis_kind k, std::uint64_t d) { return {k, MWS_AXIS_SPLIT, d}; }
    static Axis replicated(mws_axis_kind k) { return {k, MWS_AXIS_REPLICATED, 0}; }
    static Axis ownership(mws_axis_kind k) { return {k, MWS_AXIS_OWNERSHIP, 0}; }
};

/// A tensor descriptor for PlacementBuilder::add_tensor (shard dims are derived).
struct TensorSpec {
    std::string tensor_id;
    std::vector<std::uint64_t> global_shape;
    std::string dtype;
    std::uint64_t itemsize = 1;
    std::string layout_fingerprint;
    std::vector<Axis> axes;
    std::optional<std::uint64_t> layer_id;
    std::optional<std::uint64_t> expert_id;
};

/// A fragment for PlacementBuilder::add_fragment (byte size and rank are derived).
struct FragmentSpec {
    std::string participant_id;
    std::string tensor_id;
    std::vector<std::uint64_t> global_offset;
    std::vector<std::uint64_t> local_shape;
    std::optional<std::uint64_t> pipeline_stage_id;
    std::vector<std::string> aliases;
    std::optional<std::string> placement_fragment_id;  ///< empty: the canonical sha256 id
};

/// Builds a placement one participant, tensor and fragment at a time
/// (mws_placement_builder); ids and canonical JSON come from the library. Not
/// copyable; calls on one builder are serialized by the library.
class PlacementBuilder {
public:
    PlacementBuilder(const std::string &resource_id, const std::string &revision, std::uint64_t weight_generation,
                     const std::string &placement_set_id, std::uint64_t tp_size = 1, std::uint64_t pp_size = 1,
                     std::uint64_t ep_size = 1, std::uint64_t dp_size = 1) {
        mws_placement_builder_options o{};
        o.resource_id = resource_id.c_str();
        o.revision = revision.c_str();
        o.weight_generation = weight_generation;
        o.placement_set_id = placement_set_id.c_str();
        o.tp_size = tp_size;
        o.pp_size = pp_size;
        o.ep_size = ep_size;
        o.dp_size = dp_size;
        mws_placement_builder *raw = nullptr;
        detail::check(mws_placement_builder_new(&o, &raw));
        handle_.reset(raw);
    }

    PlacementBuilder &add_participant(const std::string &participant_id, mws_rank rank) {
        detail::check(mws_placement_builder_add_participant(handle_.get(), participant_id.c_str(), &rank));
        return *this;
    }

    PlacementBuilder &add_tensor(const TensorSpec &t) {
        std::vector<mws_parallel_axis> axes;
        for (const Axis &a : t.axes)
            axes.push_back({static_cast<std::uint32_t>(a.kind), static_cast<std::uint32_t>(a.semantics), a.dim});
        mws_tensor_spec c{};
        c.tensor_id = t.tensor_id.c_str();
        c.global_shape = t.global_shape.data();
        c.ndim = t.global_shape.size();
        c.dtype = t.dtype.c_str();
        c.itemsize = t.itemsize;
        c.layout_fingerprint = t.layout_fingerprint.c_str();
        c.axes = axes.data();
        c.axis_count = axes.size();
        c.layer_id = t.layer_id ? &*t.layer_id : nullptr;
        c.expert_id = t.expert_id ? &*t.expert_id : nullptr;
        detail::check(mws_placement_builder_add_tensor(handle_.get(), &c));
        return *this;
    }

    /// Adds a fragment; returns its placement_fragment_id (owned by the builder).
    std::string_view add_fragment(const FragmentSpec &f) {
        if (f.global_offset.size() != f.local_shape.size())
            throw Error(MWS_INVALID_ARGUMENT, "global_offset and local_shape differ in length");
        std::vector<const char *> aliases;
        for (const std::string &a : f.aliases) aliases.push_back(a.c_str());
        mws_fragment_spec c{};
        c.participant_id = f.participant_id.c_str();
        c.tensor_id = f.tensor_id.c_str();
        c.global_offset = f.global_offset.data();
        c.local_shape = f.local_shape.data();
        c.ndim = f.local_shape.size();
        c.pipeline_stage_id = f.pipeline_stage_id ? &*f.pipeline_stage_id : nullptr;
        c.aliases = aliases.data();
        c.alias_count = aliases.size();
        c.placement_fragment_id = f.placement_fragment_id ? f.placement_fragment_id->c_str() : nullptr;
        const char *id = nullptr;
        std::size_t len = 0;
        detail::check(mws_placement_builder_add_fragment(handle_.get(), &c, &id, &len));
        return detail::view(id, len);
    }

    /// Validates and builds the placement (the builder stays usable).
    Placement build() const {
        mws_placement *raw = nullptr;
        detail::check(mws_placement_builder_build(handle_.get(), &raw));
        return Placement(raw);
    }

private:
    std::unique_ptr<mws_placement_builder, detail::Deleter<mws_placement_builder, mws_placement_builder_free>> handle_;
};

/// Identity of a runtime binding (see mws_binding_options).
struct BindingOptions {
    std::string resource_id;
    std::string revision;
    std::string placement_id;
    std::string placement_digest;
    std::string participant_id;
    std::string instance_id;
    std::string lease_id;
    std::uint64_t generation = 0;

    /// Fills resource id, revision, placement id and digest from `placement`.
    static BindingOptions for_placement(const Placement &placement) {
        BindingOptions o;
        o.resource_id = std::string(placement.resource_id());
        o.revision = std::string(placement.revision());
        o.placement_id = std::string(placement.id());
        o.placement_digest = std::string(placement.digest());
        o.generation = placement.weight_generation();
        return o;
    }
};

/// A runtime binding of one participant (owns an mws_binding).
class Binding {
public:
    explicit Binding(const BindingOptions &o) {
        mws_binding_options c{};
        c.resource_id = o.resource_id.c_str();
        c.revision = o.revision.c_str();
        c.placement_id = o.placement_id.c_str();
        c.placement_digest = o.placement_digest.c_str();
        c.participant_id = o.participant_id.c_str();
        c.instance_id = o.instance_id.c_str();
        c.lease_id = o.lease_id.c_str();
        c.generation = o.generation;
        mws_binding *raw = nullptr;
        detail::check(mws_binding_new(&c, &raw));
        handle_.reset(raw);
    }

    /// Takes ownership of a handle from mws_binding_new.
    explicit Binding(mws_binding *raw) noexcept : handle_(raw) {}

    /// Adds one live buffer (copied; see mws_binding_add_fragment).
    void add_fragment(const mws_runtime_fragment &fragment) {
        detail::check(mws_binding_add_fragment(handle_.get(), &fragment));
    }

    std::size_t fragment_count() const { return mws_binding_fragment_count(get()); }

    /// Throws mws::Error unless the binding pairs with `placement`.
    void validate(const Placement &placement) const { detail::check(mws_binding_validate(placement.get(), get())); }

    const mws_binding *get() const noexcept { return handle_.get(); }
    mws_binding *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_binding, detail::Deleter<mws_binding, mws_binding_free>> handle_;
};

/// Options of plan_upload; an empty optional means the library default.
struct UploadOptions {
    std::optional<std::string> store_namespace;  ///< default "default"
    std::optional<std::string> key_prefix;       ///< default "weights"
    std::optional<std::string> transaction_id;   ///< default: random
    std::optional<std::string> created_at;       ///< default: now (UTC)
};

/// One operation of an upload plan; views borrowed from the UploadPlan.
struct UploadOperation {
    std::string_view source_participant_id;
    std::string_view source_instance_id;
    std::string_view source_lease_id;
    std::uint64_t source_generation;
    std::string_view source_fragment_id;
    std::string_view source_worker_id;
    std::string_view source_placement_fragment_id;
    std::string_view target_fragment_id;
    std::string_view object_key;
    std::uint64_t nbytes;
};

/// A planned upload (owns an mws_upload_plan).
class UploadPlan {
public:
    /// Takes ownership of a handle from mws_upload_plan_new.
    explicit UploadPlan(mws_upload_plan *raw) noexcept : handle_(raw) {}

    std::string_view manifest_json() const { return str(mws_upload_plan_manifest_json); }
    std::string_view manifest_digest() const { return str(mws_upload_plan_manifest_digest); }
    std::string_view manifest_key() const { return str(mws_upload_plan_manifest_key); }
    std::string_view group_id() const { return str(mws_upload_plan_group_id); }
    std::string_view control_key() const { return str(mws_upload_plan_control_key); }
    std::string_view transaction_group_id() const { return str(mws_upload_plan_transaction_group_id); }
    std::string_view transaction_id() const { return str(mws_upload_plan_transaction_id); }
    std::string_view source_placement_id() const { return str(mws_upload_plan_source_placement_id); }
    std::string_view source_placement_digest() const { return str(mws_upload_plan_source_placement_digest); }
    std::string_view commit_record() const { return str(mws_upload_plan_commit_record); }
    std::size_t operation_count() const { return mws_upload_plan_operation_count(get()); }

    /// Transport JSON (for the other processes of one job; holds buffer addresses).
    std::string_view to_json() const { return str(mws_upload_plan_to_json); }

    /// Decodes and re-validates a plan sent by to_json().
    static UploadPlan from_json(std::string_view json) {
        mws_upload_plan *raw = nullptr;
        detail::check(mws_upload_plan_from_json(json.data(), json.size(), &raw));
        return UploadPlan(raw);
    }

    UploadOperation operation(std::size_t index) const {
        mws_upload_operation op{};
        detail::check(mws_upload_plan_operation(get(), index, &op));
        return UploadOperation{op.source_participant_id,
                               op.source_instance_id,
                               op.source_lease_id,
                               op.source_generation,
                               op.source_fragment_id,
                               op.source_worker_id,
                               op.source_placement_fragment_id,
                               op.target_fragment_id,
                               op.object_key,
                               op.nbytes};
    }

    const mws_upload_plan *get() const noexcept { return handle_.get(); }
    mws_upload_plan *release() noexcept { return handle_.release(); }

private:
    std::string_view str(const char *(*accessor)(const mws_upload_plan *, std::size_t *)) const {
        std::size_t len = 0;
        const char *p = accessor(get(), &len);
        return detail::view(p, len);
    }

    std::unique_ptr<mws_upload_plan, detail::Deleter<mws_upload_plan, mws_upload_plan_free>> handle_;
};

/// Plans an upload of `placement` from `bindings` (see mws_upload_plan_new).
inline UploadPlan plan_upload(const Placement &placement, const std::vector<const Binding *> &bindings,
                              const UploadOptions &options = {}) {
    std::vector<const mws_binding *> raw;
    raw.reserve(bindings.size());
    for (const Binding *b : bindings) {
        raw.push_back(b != nullptr ? b->get() : nullptr);
    }
    mws_upload_options c{};
    c.store_namespace = detail::c_str_or_null(options.store_namespace);
    c.key_prefix = detail::c_str_or_null(options.key_prefix);
    c.transaction_id = detail::c_str_or_null(options.transaction_id);
    c.created_at = detail::c_str_or_null(options.created_at);
    mws_upload_plan *out = nullptr;
    detail::check(mws_upload_plan_new(placement.get(), raw.data(), raw.size(), &c, &out));
    return UploadPlan(out);
}

/// Plans an upload of `placement` from `bindings` (see mws_upload_plan_new).
inline UploadPlan plan_upload(const Placement &placement, const std::vector<Binding> &bindings,
                              const UploadOptions &options = {}) {
    std::vector<const Binding *> ptrs;
    ptrs.reserve(bindings.size());
    for (const Binding &b : bindings) {
        ptrs.push_back(&b);
    }
    return plan_upload(placement, ptrs, options);
}

/// Options of the store constructors (see mws_store_options); empty = defaults.
struct StoreOptions {
    std::optional<std::string> key_prefix;     ///< default "weights"
    std::uint64_t max_range_bytes = 0;         ///< 0 = default (64 MiB)
    std::uint64_t max_ranges_per_request = 0;  ///< 0 = default (1024)
    std::uint64_t max_region_segments = 0;     ///< 0 = default (2^32)
    const mws_copy_hook_vtable *copy_hook = nullptr;  ///< embedded stores only
    void *copy_hook_ctx = nullptr;
    /// Host staging for restores through range-priced stores (Mooncake); 0 = off
    /// (default). See mws_store_options::staging_bytes.
    std::uint64_t staging_bytes = 0;
    /// Largest manifest or decision record read back; 0 = default (256 MiB).
    std::uint64_t max_metadata_bytes = 0;
    /// Verify restores against the revision's integrity record (off by default;
    /// see mws_store_options::verify_integrity).
    bool verify_integrity = false;

    mws_store_options c() const noexcept {
        mws_store_options o{};
        o.key_prefix = detail::c_str_or_null(key_prefix);
        o.max_range_bytes = max_range_bytes;
        o.max_ranges_per_request = max_ranges_per_request;
        o.max_region_segments = max_region_segments;
        o.copy_hook = copy_hook;
        o.copy_hook_ctx = copy_hook_ctx;
        o.staging_bytes = staging_bytes;
        o.max_metadata_bytes = max_metadata_bytes;
        o.verify_integrity = verify_integrity ? 1u : 0u;
        return o;
    }
};

/// Per-call arguments of uploads and loads (see mws_io_args).
struct IoArgs {
    std::optional<std::string> worker_id;
    std::optional<std::string> transfer_id;
    const mws_guard_vtable *guard = nullptr;  ///< nullptr: static guard (caller keeps buffers stable)
    void *guard_ctx = nullptr;
    /// A registration lease of the same store (see RegistrationLease): nothing is pinned
    /// or registered per call. nullptr: pin and register for the call only.
    const mws_registration_lease *lease = nullptr;
    /// Progress of the call (upload or restore); empty: none. Must outlive the call.
    ProgressCallback progress;

    /// The C arguments; they point into this object, which must outlive their use.
    mws_io_args c() const noexcept {
        mws_io_args a{};
        a.worker_id = detail::c_str_or_null(worker_id);
        a.transfer_id = detail::c_str_or_null(transfer_id);
        a.guard = guard;
        a.guard_ctx = guard_ctx;
        a.lease = lease;
        if (progress) {
            a.progress = &detail::progress_trampoline;
            a.progress_ctx = const_cast<ProgressCallback *>(&progress);
        }
        return a;
    }
};

/// Upload receipts (owns an mws_receipts).
class Receipts {
public:
    explicit Receipts(mws_receipts *raw) noexcept : handle_(raw) {}

    static Receipts from_json(std::string_view json) {
        mws_receipts *raw = nullptr;
        detail::check(mws_receipts_from_json(json.data(), json.size(), &raw));
        return Receipts(raw);
    }
    static Receipts concat(const std::vector<const Receipts *> &list) {
        std::vector<const mws_receipts *> raw;
        for (const Receipts *r : list) raw.push_back(r != nullptr ? r->get() : nullptr);
        mws_receipts *out = nullptr;
        detail::check(mws_receipts_concat(raw.data(), raw.size(), &out));
        return Receipts(out);
    }
    static Receipts for_plan(const UploadPlan &plan) {
        mws_receipts *out = nullptr;
        detail::check(mws_receipts_from_plan(plan.get(), &out));
        return Receipts(out);
    }

    std::size_t size() const { return mws_receipts_count(get()); }
    std::string_view to_json() const {
        std::size_t len = 0;
        const char *p = mws_receipts_to_json(get(), &len);
        return detail::view(p, len);
    }

    const mws_receipts *get() const noexcept { return handle_.get(); }
    mws_receipts *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_receipts, detail::Deleter<mws_receipts, mws_receipts_free>> handle_;
};

/// A published stored manifest (owns an mws_stored_manifest).
class StoredManifest {
public:
    explicit StoredManifest(mws_stored_manifest *raw) noexcept : handle_(raw) {}

    static StoredManifest from_json(std::string_view json) {
        mws_stored_manifest *raw = nullptr;
        detail::check(mws_stored_manifest_from_json(json.data(), json.size(), &raw));
        return StoredManifest(raw);
    }

    std::string_view to_json() const { return str(mws_stored_manifest_to_json); }
    std::string_view digest() const { return str(mws_stored_manifest_digest); }
    std::string_view key() const { return str(mws_stored_manifest_key); }
    std::string_view group_id() const { return str(mws_stored_manifest_group_id); }
    std::string_view store_namespace() const { return str(mws_stored_manifest_namespace); }
    std::string_view resource_id() const { return str(mws_stored_manifest_resource_id); }
    std::string_view revision() const { return str(mws_stored_manifest_revision); }
    std::uint64_t weight_generation() const { return mws_stored_manifest_weight_generation(get()); }
    std::size_t tensor_count() const { return mws_stored_manifest_tensor_count(get()); }
    std::size_t fragment_count() const { return mws_stored_manifest_fragment_count(get()); }
    std::uint64_t total_bytes() const { return mws_stored_manifest_total_bytes(get()); }

    /// Stored fragment `index` (borrowed pointers, valid while this object lives).
    mws_stored_fragment_info fragment(std::size_t index) const {
        mws_stored_fragment_info info{};
        detail::check(mws_stored_manifest_fragment(get(), index, &info));
        return info;
    }

    const mws_stored_manifest *get() const noexcept { return handle_.get(); }
    mws_stored_manifest *release() noexcept { return handle_.release(); }

private:
    std::string_view str(const char *(*accessor)(const mws_stored_manifest *, std::size_t *)) const {
        std::size_t len = 0;
        const char *p = accessor(get(), &len);
        return detail::view(p, len);
    }

    std::unique_ptr<mws_stored_manifest, detail::Deleter<mws_stored_manifest, mws_stored_manifest_free>> handle_;
};

/// A restore plan (owns an mws_load_plan).
class LoadPlan {
public:
    explicit LoadPlan(mws_load_plan *raw) noexcept : handle_(raw) {}

    /// Plans the restore of `manifest` into `target` for the participants of `bindings`.
    static LoadPlan plan(const StoredManifest &manifest, const Placement &target,
                         const std::vector<const Binding *> &bindings, const mws_planning_limits *limits = nullptr) {
        std::vector<const mws_binding *> raw;
        for (const Binding *b : bindings) raw.push_back(b != nullptr ? b->get() : nullptr);
        mws_load_plan *out = nullptr;
        detail::check(mws_load_plan_new(manifest.get(), target.get(), raw.data(), raw.size(), limits, &out));
        return LoadPlan(out);
    }

    std::size_t region_count() const { return mws_load_plan_region_count(get()); }
    std::uint64_t total_bytes() const { return mws_load_plan_total_bytes(get()); }
    std::size_t participant_count() const { return mws_load_plan_participant_count(get()); }
    std::string_view participant(std::size_t index) const {
        std::size_t len = 0;
        const char *p = mws_load_plan_participant(get(), index, &len);
        return detail::view(p, len);
    }

    const mws_load_plan *get() const noexcept { return handle_.get(); }
    mws_load_plan *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_load_plan, detail::Deleter<mws_load_plan, mws_load_plan_free>> handle_;
};

/// A weight store over a backend (owns an mws_store).
class Store {
public:
    explicit Store(mws_store *raw) noexcept : handle_(raw) {}

    static Store open_memory(const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_open_memory(&c, &raw));
        return Store(raw);
    }
    static Store open_dir(const std::string &path, const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_open_dir(path.c_str(), &c, &raw));
        return Store(raw);
    }
    /// Takes ownership of `ctx` on success (vt->destroy is called when freed).
    static Store from_vtable(const mws_store_vtable &vt, void *ctx, const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_from_vtable_with_options(&vt, ctx, &c, &raw));
        return Store(raw);
    }

    std::string_view key_prefix() const {
        std::size_t len = 0;
        return detail::view(mws_store_key_prefix(get(), &len), len);
    }

    /// Raw access: the whole object.
    std::vector<unsigned char> get_object(const std::string &key) const {
        std::size_t len = 0;
        detail::check(mws_store_get(get(), key.c_str(), nullptr, 0, &len));
        std::vector<unsigned char> out(len);
        detail::check(mws_store_get(get(), key.c_str(), out.data(), out.size(), &len));
        out.resize(len);
        return out;
    }
    bool exists(const std::string &key) const {
        int present = 0;
        detail::check(mws_store_exists(get(), key.c_str(), &present));
        return present != 0;
    }
    void upsert(const std::string &key, std::string_view value) const {
        detail::check(mws_store_upsert(get(), key.c_str(), reinterpret_cast<const std::uint8_t *>(value.data()),
                                       value.size(), nullptr));
    }
    void remove(const std::string &key) const { detail::check(mws_store_remove(get(), key.c_str())); }

    /// Uploads `binding`'s participant for `plan` (planned from `placement`).
    Receipts upload(const UploadPlan &plan, const Placement &placement, const Binding &binding,
                    const IoArgs &args = {}) const {
        mws_io_args a = args.c();
        mws_receipts *out = nullptr;
        detail::check(mws_store_upload(get(), plan.get(), placement.get(), binding.get(), &a, &out));
        return Receipts(out);
    }
    StoredManifest commit(const UploadPlan &plan, const Receipts &receipts, int *decision_may_exist = nullptr) const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_store_commit(get(), plan.get(), receipts.get(), decision_may_exist, &out));
        return StoredManifest(out);
    }
    void abort_upload(const UploadPlan &plan, const Receipts *receipts = nullptr) const {
        detail::check(mws_store_abort_upload(get(), plan.get(), receipts != nullptr ? receipts->get() : nullptr));
    }
    void finalize_upload(const UploadPlan &plan) const { detail::check(mws_store_finalize_upload(get(), plan.get())); }
    mws_decision read_decision(const UploadPlan &plan) const {
        mws_decision d = MWS_DECISION_NONE;
        detail::check(mws_store_read_decision(get(), plan.get(), &d));
        return d;
    }
    StoredManifest load_manifest(const std::string &key) const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_stored_manifest_from_store(get(), key.c_str(), &out));
        return StoredManifest(out);
    }
    mws_load_stats load(const LoadPlan &plan, const Binding &binding, const IoArgs &args = {}) const {
        mws_io_args a = args.c();
        mws_load_stats stats{};
        detail::check(mws_store_load(get(), plan.get(), binding.get(), &a, &stats));
        return stats;
    }

    const mws_store *get() const noexcept { return handle_.get(); }
    mws_store *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_store, detail::Deleter<mws_store, mws_store_free>> handle_;
};

/// Buffers pinned and registered once for many uploads or loads (owns an
/// mws_registration_lease; see mws_registration_lease_new). Pass `get()` in
/// IoArgs::lease. Destroying an open lease closes it as MWS_TERMINAL_ABORTED; call
/// close() to report another state or to see errors.
class RegistrationLease {
public:
    explicit RegistrationLease(mws_registration_lease *raw) noexcept : handle_(raw) {}

    /// Pins (guard: nullptr = static guard) and registers `fragment_ids` of `binding`.
    static RegistrationLease create(const Store &store, const Binding &binding,
                                    const std::vector<std::string> &fragment_ids, mws_lease_side side,
                                    const mws_guard_vtable *guard = nullptr, void *guard_ctx = nullptr,
                                    const std::optional<std::string> &transfer_id = std::nullopt) {
        std::vector<const char *> ids;
        ids.reserve(fragment_ids.size());
        for (const auto &id : fragment_ids) ids.push_back(id.c_str());
        mws_registration_lease *raw = nullptr;
        detail::check(mws_registration_lease_new(store.get(), binding.get(), ids.data(), ids.size(),
                                                 static_cast<std::uint32_t>(side), guard, guard_ctx,
                                                 detail::c_str_or_null(transfer_id), &raw));
        return RegistrationLease(raw);
    }

    /// Unregisters and releases the pin with `state`; a no-op when already closed.
    void close(mws_terminal_state state = MWS_TERMINAL_COMPLETED) const {
        detail::check(mws_registration_lease_close(get(), static_cast<std::uint32_t>(state)));
    }
    bool closed() const { return mws_registration_lease_is_closed(get()) == 1; }

    /// IoArgs using this lease.
    IoArgs io_args() const {
        IoArgs a;
        a.lease = get();
        return a;
    }

    const mws_registration_lease *get() const noexcept { return handle_.get(); }
    mws_registration_lease *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_registration_lease,
                    detail::Deleter<mws_registration_lease, mws_registration_lease_free>>
        handle_;
};

/// An upload transaction of one plan in one store, collecting receipts (owns an
/// mws_transaction; see mws_transaction_new). Calls are serialized internally.
/// Destroying a Transaction does NOT abort it: recovery is explicit (abort(), or
/// Store::abort_upload / Store::finalize_upload with the plan), because a commit
/// decision may exist or another process may still commit the plan.
class Transaction {
public:
    explicit Transaction(mws_transaction *raw) noexcept : handle_(raw) {}

    /// Starts a transaction of `plan` in `store` (no I/O; keeps the store alive and
    /// copies the plan).
    static Transaction begin(const Store &store, const UploadPlan &plan) {
        mws_transaction *raw = nullptr;
        detail::check(mws_transaction_new(store.get(), plan.get(), &raw));
        return Transaction(raw);
    }

    /// Uploads `binding`'s participant (see mws_store_upload) and keeps its receipts.
    void upload(const Placement &placement, const Binding &binding, const IoArgs &args = {}) {
        mws_io_args a = args.c();
        detail::check(mws_transaction_upload(get(), placement.get(), binding.get(), &a));
    }
    /// Uploads several participants of this process in one call (see
    /// mws_transaction_upload_many): every check first, then one stream of put batches.
    /// `leases` is empty (none) or has one entry per binding (nullptr: that binding is
    /// pinned through `args.guard`); `args.lease` must be nullptr. Throws Error.
    void upload_many(const Placement &placement, const std::vector<const Binding *> &bindings,
                     const std::vector<const RegistrationLease *> &leases = {}, const IoArgs &args = {}) {
        if (!leases.empty() && leases.size() != bindings.size()) {
            throw Error(MWS_INVALID_ARGUMENT, "upload_many: leases must be empty or one per binding");
        }
        std::vector<const mws_binding *> b;
        b.reserve(bindings.size());
        for (const Binding *x : bindings) b.push_back(x != nullptr ? x->get() : nullptr);
        std::vector<const mws_registration_lease *> l;
        l.reserve(leases.size());
        for (const RegistrationLease *x : leases) l.push_back(x != nullptr ? x->get() : nullptr);
        mws_io_args a = args.c();
        detail::check(mws_transaction_upload_many(get(), placement.get(), b.data(), b.size(),
                                                  l.empty() ? nullptr : l.data(), &a));
    }
    /// Adds receipts of other processes' uploads of the same plan.
    void add_receipts(const Receipts &receipts) { detail::check(mws_transaction_add_receipts(get(), receipts.get())); }
    /// A copy of every receipt held now (send it with Receipts::to_json()).
    Receipts receipts() const {
        mws_receipts *out = nullptr;
        detail::check(mws_transaction_receipts(get(), &out));
        return Receipts(out);
    }
    /// Commits with every receipt held; once committed, returns the same manifest again.
    StoredManifest commit() {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_transaction_commit(get(), &out));
        return StoredManifest(out);
    }
    /// True once a commit may have written the commit decision (never abort then).
    bool commit_decision_may_exist() const { return mws_transaction_commit_decision_may_exist(get()) == 1; }
    mws_transaction_state state() const { return mws_transaction_get_state(get()); }
    /// Records abort and removes the payloads; a no-op once aborted.
    void abort() { detail::check(mws_transaction_abort(get())); }
    /// Idempotent recovery of the store transaction (see mws_store_finalize_upload).
    void finalize() const { detail::check(mws_transaction_finalize(get())); }

    mws_transaction *get() const noexcept { return handle_.get(); }
    mws_transaction *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_transaction, detail::Deleter<mws_transaction, mws_transaction_free>> handle_;
};

/// A snapshot in progress (owns an mws_writer; destroying an open Writer aborts it).
class Writer {
public:
    explicit Writer(mws_writer *raw) noexcept : handle_(raw) {}

    /// Begins a snapshot (see mws_writer_new). `adapter` is copied; `ctx` must
    /// outlive the Writer.
    static Writer begin(const Store &store, const std::string &resource_id, const std::string &revision,
                        std::uint64_t weight_generation, const mws_snapshot_adapter_vtable &adapter, void *ctx,
                        const std::string &store_namespace = "default", const UploadOptions &options = {}) {
        mws_snapshot_descriptor d{};
        d.resource_id = resource_id.c_str();
        d.revision = revision.c_str();
        d.weight_generation = weight_generation;
        d.store_namespace = store_namespace.c_str();
        mws_upload_options o{};
        o.transaction_id = detail::c_str_or_null(options.transaction_id);
        o.created_at = detail::c_str_or_null(options.created_at);
        mws_writer *raw = nullptr;
        detail::check(mws_writer_new(store.get(), &d, &adapter, ctx, &o, &raw));
        return Writer(raw);
    }

    /// Records a written tensor; returns the receipts of the uploads it triggered.
    Receipts write_tensor(const std::string &tensor_id, void *tensor) const {
        mws_receipts *r = nullptr;
        detail::check(mws_writer_write_tensor(get(), tensor_id.c_str(), tensor, &r));
        return Receipts(r);
    }
    StoredManifest commit() const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_writer_commit(get(), &out));
        return StoredManifest(out);
    }
    void abort() const { detail::check(mws_writer_abort(get())); }
    UploadPlan upload_plan() const {
        mws_upload_plan *out = nullptr;
        detail::check(mws_writer_upload_plan(get(), &out));
        return UploadPlan(out);
    }
    /// Reports the snapshot's uploads (totals: the whole plan) to `progress` from now
    /// on (see mws_writer_set_progress); an empty function removes it. The Writer keeps
    /// the function.
    void set_progress(ProgressCallback progress) {
        auto next = progress ? std::make_unique<ProgressCallback>(std::move(progress)) : nullptr;
        detail::check(mws_writer_set_progress(get(), next ? &detail::progress_trampoline : nullptr, next.get()));
        progress_ = std::move(next);
    }

    const mws_writer *get() const noexcept { return handle_.get(); }
    /// Releases the handle; a progress callback set here must then outlive it.
    mws_writer *release() noexcept { return handle_.release(); }

private:
    // Declared before the handle: destroyed after it.
    std::unique_ptr<ProgressCallback> progress_;
    std::unique_ptr<mws_writer, detail::Deleter<mws_writer, mws_writer_free>> handle_;
};

// ---- live transfer ---------------------------------------------------------------

/// A live-transfer plan (owns an mws_transfer_plan): logical (address-free, from two
/// placements) or bound to source and target runtime bindings. Immutable; accessor
/// results borrow from the plan and stay valid while it lives.
class TransferPlan {
public:
    explicit TransferPlan(mws_transfer_plan *raw) noexcept : handle_(raw) {}

    /// Plans `source` -> `target` (every target participant, or only `target_participant`).
    static TransferPlan plan(const Placement &source, const Placement &target,
                             const std::optional<std::string> &target_participant = std::nullopt,
                             const mws_planning_limits *limits = nullptr) {
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_new(source.get(), target.get(), detail::c_str_or_null(target_participant),
                                            limits, &out));
        return TransferPlan(out);
    }

    /// Restores a logical plan from its transport JSON.
    static TransferPlan from_json(std::string_view json) {
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_from_json(json.data(), json.size(), &out));
        return TransferPlan(out);
    }

    /// Binds this logical plan to target and source bindings (a new, bound plan).
    TransferPlan bind(const std::vector<const Binding *> &targets, const std::vector<const Binding *> &sources) const {
        std::vector<const mws_binding *> t, s;
        for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
        for (const Binding *b : sources) s.push_back(b != nullptr ? b->get() : nullptr);
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_bind(get(), t.data(), t.size(), s.data(), s.size(), &out));
        return TransferPlan(out);
    }

    bool is_bound() const { return mws_transfer_plan_is_bound(get()) == 1; }
    std::size_t region_count() const { return mws_transfer_plan_region_count(get()); }
    std::uint64_t total_bytes() const { return mws_transfer_plan_total_bytes(get()); }
    std::string_view to_json() const {
        std::size_t len = 0;
        const char *p = mws_transfer_plan_to_json(get(), &len);
        return detail::view(p, len);
    }
    mws_transfer_region_info region(std::size_t index) const {
        mws_transfer_region_info info{};
        detail::check(mws_transfer_plan_region(get(), index, &info));
        return info;
    }
    /// Bound plans only.
    mws_transfer_operation_info operation(std::size_t index) const {
        mws_transfer_operation_info info{};
        detail::check(mws_transfer_plan_operation(get(), index, &info));
        return info;
    }
    std::size_t executor_count(mws_transfer_side side) const {
        return mws_transfer_plan_executor_count(get(), static_cast<std::uint32_t>(side));
    }
    mws_transfer_executor_info executor(mws_transfer_side side, std::size_t index) const {
        mws_transfer_executor_info info{};
        detail::check(mws_transfer_plan_executor(get(), static_cast<std::uint32_t>(side), index, &info));
        return info;
    }

    const mws_transfer_plan *get() const noexcept { return handle_.get(); }
    mws_transfer_plan *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_transfer_plan, detail::Deleter<mws_transfer_plan, mws_transfer_plan_free>> handle_;
};

/// A transfer engine (owns an mws_transfer_engine): the embedded LocalEngine or a
/// caller's vtable (for example Mooncake's TransferEngine).
class TransferEngine {
public:
    explicit TransferEngine(mws_transfer_engine *raw) noexcept : handle_(raw) {}

    static TransferEngine local() {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_new_local(&out));
        return TransferEngine(out);
    }
    /// `vt` is copied; `ctx` must outlive the engine and every loader or sink made from it.
    static TransferEngine from_vtable(const mws_transfer_engine_vtable &vt, void *ctx) {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_from_vtable(&vt, ctx, &out));
        return TransferEngine(out);
    }

    /// The owner's registration of a whole allocation (valid until unregistered).
    void register_memory(const void *address, std::uint64_t len, std::uint32_t memory_kind = MWS_MEMORY_HOST,
                         std::uint32_t device = 0) const {
        detail::check(mws_transfer_engine_register_memory(get(), address, len, memory_kind, device));
    }
    void unregister_memory(const void *address) const {
        detail::check(mws_transfer_engine_unregister_memory(get(), address));
    }
    std::size_t pending_count() const { return mws_transfer_engine_pending_count(get()); }
    /// Drains every pending transfer once; returns how many remain.
    std::size_t drain(std::uint64_t timeout_ms = 1000) const {
        std::size_t remaining = 0;
        detail::check(mws_transfer_engine_drain(get(), timeout_ms, &remaining));
        return remaining;
    }

    const mws_transfer_engine *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_transfer_engine, detail::Deleter<mws_transfer_engine, mws_transfer_engine_free>> handle_;
};

/// Fills the buffers of one target participant from a live source (reader mode) or
/// from a stored revision (owns an mws_loader). One call at a time; cancel() from
/// any thread.
class Loader {
public:
    explicit Loader(const TransferEngine &engine, const mws_executor_limits *limits = nullptr) {
        mws_loader *out = nullptr;
        detail::check(mws_loader_new(engine.get(), limits, &out));
        handle_.reset(out);
    }

    /// `ctx` must stay valid while the callback is set; the callback must not throw.
    void set_progress(mws_progress_fn progress, void *ctx) {
        detail::check(mws_loader_set_progress(get(), progress, ctx));
        progress_.reset();
    }
    /// Reports live and stored loads to `progress` (see mws_loader_set_progress); an
    /// empty function removes it. The Loader keeps the function.
    void set_progress(ProgressCallback progress) {
        auto next = progress ? std::make_unique<ProgressCallback>(std::move(progress)) : nullptr;
        detail::check(mws_loader_set_progress(get(), next ? &detail::progress_trampoline : nullptr, next.get()));
        progress_ = std::move(next);
    }
    void cancel() const noexcept { mws_loader_cancel(get()); }
    void reset_cancel() const noexcept { mws_loader_reset_cancel(get()); }

    mws_transfer_stats load_live(const TransferPlan &plan, const Placement &source,
                                 const std::vector<const Binding *> &sources, const Placement &target,
                                 const Binding &local, const mws_live_args *args = nullptr) const {
        std::vector<const mws_binding *> s;
        for (const Binding *b : sources) s.push_back(b != nullptr ? b->get() : nullptr);
        mws_transfer_stats stats{};
        detail::check(mws_loader_load_live(get(), plan.get(), source.get(), s.data(), s.size(), target.get(),
                                           local.get(), args, &stats));
        return stats;
    }

    mws_load_stats load_stored(const Store &store, const LoadPlan &plan, const Binding &local,
                               const mws_io_args *args = nullptr) const {
        mws_load_stats stats{};
        detail::check(mws_loader_load_stored(get(), store.get(), plan.get(), local.get(), args, &stats));
        return stats;
    }

    mws_transfer_stats stats() const {
        mws_transfer_stats s{};
        detail::check(mws_loader_stats(get(), &s));
        return s;
    }

    const mws_loader *get() const noexcept { return handle_.get(); }

private:
    // Declared before the handle: destroyed after it.
    std::unique_ptr<ProgressCallback> progress_;
    std::unique_ptr<mws_loader, detail::Deleter<mws_loader, mws_loader_free>> handle_;
};

/// A source worker's side of a live transfer: pushes its part of a bound plan into
/// the remote targets (owns an mws_sink).
class Sink {
public:
    explicit Sink(const TransferEngine &engine, const mws_executor_limits *limits = nullptr) {
        mws_sink *out = nullptr;
        detail::check(mws_sink_new(engine.get(), limits, &out));
        handle_.reset(out);
    }

    mws_transfer_stats execute(const TransferPlan &plan, const Placement &source, const Binding &local,
                               const Placement &target, const std::vector<const Binding *> &targets,
                               const mws_live_args *args = nullptr) const {
        std::vector<const mws_binding *> t;
        for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
        mws_transfer_stats stats{};
        detail::check(mws_sink_execute(get(), plan.get(), source.get(), local.get(), target.get(), t.data(), t.size(),
                                       args, &stats));
        return stats;
    }

    const mws_sink *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_sink, detail::Deleter<mws_sink, mws_sink_free>> handle_;
};

}  // namespace mws


#endif  // MOONCAKE_WEIGHT_STORE_HPP
