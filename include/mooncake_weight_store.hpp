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
// - Thread safety is that of the C handles: Placement and UploadPlan may be used from
//   several threads at once; Binding::add_fragment must not race with other calls on
//   the same Binding.
#ifndef MOONCAKE_WEIGHT_STORE_HPP
#define MOONCAKE_WEIGHT_STORE_HPP

#include <cstddef>
#include <cstdint>
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

}  // namespace detail

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
    /// Takes ownership of a handle from mws_plan_upload.
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

/// Plans an upload of `placement` from `bindings` (see mws_plan_upload).
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
    detail::check(mws_plan_upload(placement.get(), raw.data(), raw.size(), &c, &out));
    return UploadPlan(out);
}

/// Plans an upload of `placement` from `bindings` (see mws_plan_upload).
inline UploadPlan plan_upload(const Placement &placement, const std::vector<Binding> &bindings,
                              const UploadOptions &options = {}) {
    std::vector<const Binding *> ptrs;
    ptrs.reserve(bindings.size());
    for (const Binding &b : bindings) {
        ptrs.push_back(&b);
    }
    return plan_upload(placement, ptrs, options);
}

}  // namespace mws

#endif  // MOONCAKE_WEIGHT_STORE_HPP
