/**
 * @file mooncake_weight_store.hpp
 * Header-only C++17 RAII wrapper over the C ABI in mooncake_weight_store.h
 * (namespace mws). Hand-written (not generated); every member documents what it
 * wraps, so the C function named there has the full contract.
 *
 * Conventions (apply to every class and function below unless it says otherwise):
 *  - Ownership: every handle is owned by exactly one movable, non-copyable object (a
 *    unique_ptr with the matching mws_*_free as deleter, called by the destructor).
 *    `get()` lends the raw handle (valid while the owner holds it; never free it);
 *    `release()` gives up ownership (the caller then frees it with the mws_*_free
 *    function) and leaves the object empty. A moved-from or released object is
 *    empty: its fallible members throw mws::Error with MWS_NULL_ARGUMENT, its count
 *    and flag accessors return 0 / false (and set the C last error).
 *  - Errors: every failed C call throws mws::Error, which carries the mws_status and
 *    the thread-local message of the failure (mws_last_error_message()); the statuses
 *    listed for a member are those of the C function it wraps. A string accessor
 *    whose C function returns NULL throws mws::Error with MWS_NULL_ARGUMENT (and the C
 *    message). Members that build vectors or strings may also throw std::bad_alloc.
 *    A call that throws returns nothing; the object stays valid (a member says when
 *    a failure also changes its state, as an aborted Writer).
 *  - Strings and info structs are borrowed from the object that returned them: they
 *    stay valid while its C handle lives (moving the object keeps them valid; they
 *    end when the owning object is destroyed or its released handle is freed). Input
 *    strings and arrays are only read during the call unless a member says otherwise.
 *  - Thread safety is that of the C handles: Placement, UploadPlan, Store, Receipts,
 *    StoredManifest, LoadPlan, TransferPlan, TransferEngine, DeviceEngine and
 *    HostBuffers may be used from several threads at once (const members);
 *    Binding::add_fragment and Binding::add must not race with other calls on the
 *    same Binding;
 *    PlacementBuilder, Writer and Transaction serialize their calls internally; a
 *    Loader or Sink runs one call at a time. No object may be moved, assigned,
 *    released or destroyed while another thread uses it.
 *  - Callbacks (store vtable, guards, adapters) are C function pointers: they must not
 *    throw. Catch everything inside them and return a non-zero code. ProgressCallback
 *    functions may throw: the wrapper swallows the exception.
 */
#ifndef MOONCAKE_WEIGHT_STORE_HPP
#define MOONCAKE_WEIGHT_STORE_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake_weight_store.h"

/// The C++17 wrapper of the C ABI (see the conventions of mooncake_weight_store.hpp).
namespace mws {

/// A failed mws_ call: the status code plus the library's message. what() is
/// `"<status name>: <message>"`. Thrown by every fallible member of this wrapper.
/// An Error is an ordinary value: copy it, and read it from any thread.
class Error : public std::runtime_error {
public:
    /// Builds the error of a call that returned `status`, with `message` (usually
    /// mws_last_error_message(), which is copied here). Throws only std::bad_alloc.
    Error(mws_status status, const std::string &message)
        : std::runtime_error(std::string(mws_status_name(static_cast<int>(status))) + ": " + message),
          status_(status) {}

    /// The status the C call returned (never MWS_OK).
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
/// throws are swallowed. The mws_progress it gets is valid only during the call.
using ProgressCallback = std::function<void(const mws_progress &)>;

/// The library version ("MAJOR.MINOR.PATCH"; mws_version()). The view is static.
/// Does not throw; any thread.
inline std::string_view version() { return mws_version(); }

/// The static name of a status ("MWS_INVALID_ARGUMENT", ...; mws_status_name());
/// "MWS_UNKNOWN_STATUS" for a value that is not a status. Does not throw; any thread.
inline std::string_view status_name(mws_status status) { return mws_status_name(static_cast<int>(status)); }

/// One fragment of a placement, copied out of it (Placement::fragments): which
/// participant holds which box of which tensor. A plain value that owns its strings and
/// arrays (it does not borrow the placement); copy it and read it from any thread.
struct FragmentInfo {
    std::string placement_fragment_id;         ///< The fragment's wire id.
    std::string participant_id;                ///< The participant that holds it.
    std::string tensor_id;                     ///< The tensor it is a box of.
    std::vector<std::uint64_t> global_offset;  ///< Offset of the box in the tensor, in elements.
    std::vector<std::uint64_t> local_shape;    ///< Shape of the box, in elements.
    std::uint64_t nbytes = 0;                  ///< Bytes of its contiguous row-major buffer.
    std::uint64_t itemsize = 0;                ///< Bytes per element.

    /// Copies a borrowed mws_placement_fragment_info (from mws_placement_fragment).
    /// Throws mws::Error: MWS_NULL_ARGUMENT (a NULL string, or NULL arrays with ndim >
    /// 0); std::bad_alloc.
    static FragmentInfo from(const mws_placement_fragment_info &info) {
        if (info.placement_fragment_id == nullptr || info.participant_id == nullptr || info.tensor_id == nullptr ||
            (info.ndim > 0 && (info.global_offset == nullptr || info.local_shape == nullptr)))
            throw Error(MWS_NULL_ARGUMENT, "FragmentInfo::from: the fragment info has a NULL field");
        FragmentInfo f;
        f.placement_fragment_id = info.placement_fragment_id;
        f.participant_id = info.participant_id;
        f.tensor_id = info.tensor_id;
        if (info.ndim > 0) {
            f.global_offset.assign(info.global_offset, info.global_offset + info.ndim);
            f.local_shape.assign(info.local_shape, info.local_shape + info.ndim);
        }
        f.nbytes = info.nbytes;
        f.itemsize = info.itemsize;
        return f;
    }

    /// Elements of the box (the product of local_shape; 1 for a scalar). Does not
    /// throw (a placement's boxes are validated, so the product fits).
    std::uint64_t element_count() const noexcept {
        std::uint64_t n = 1;
        for (std::uint64_t d : local_shape) n *= d;
        return n;
    }

    /// The canonical row-major byte strides of the box (what Binding::add binds).
    /// Throws only std::bad_alloc.
    std::vector<std::uint64_t> strides_bytes() const {
        std::vector<std::uint64_t> st(local_shape.size());
        std::uint64_t acc = itemsize;
        for (std::size_t d = local_shape.size(); d-- > 0;) {
            st[d] = acc;
            acc *= local_shape[d];
        }
        return st;
    }

    /// The position in the whole tensor (global coordinates, one per dimension) of
    /// element `element` of the box, counted in row-major order of its buffer (byte n
    /// of the buffer belongs to element n / itemsize). Lets a caller fill or check a
    /// buffer whatever the layout. Throws mws::Error: MWS_INVALID_ARGUMENT (`element`
    /// >= element_count()); std::bad_alloc.
    std::vector<std::uint64_t> global_position(std::uint64_t element) const {
        if (global_offset.size() != local_shape.size())
            throw Error(MWS_INVALID_ARGUMENT, "FragmentInfo::global_position: global_offset and local_shape of '" +
                                                  placement_fragment_id + "' differ in length");
        if (element >= element_count())
            throw Error(MWS_INVALID_ARGUMENT, "FragmentInfo::global_position: element " + std::to_string(element) +
                                                  " is outside fragment '" + placement_fragment_id + "' (" +
                                                  std::to_string(element_count()) + " elements)");
        std::vector<std::uint64_t> pos(local_shape.size());
        for (std::size_t d = local_shape.size(); d-- > 0;) {
            pos[d] = global_offset[d] + element % local_shape[d];
            element /= local_shape[d];
        }
        return pos;
    }
};

/// A parsed, validated, immutable complete placement (owns an mws_placement).
/// Move-only. Thread safety: every const member may run on several threads at once.
/// Nothing made from it (bindings, plans) borrows it.
class Placement {
public:
    /// Parses and validates a placement from its JSON wire form
    /// (mws_placement_from_json; `json` is only read during the call).
    /// Throws mws::Error: MWS_INVALID_ARGUMENT (malformed JSON, duplicate keys,
    /// unknown fields, inconsistent ids, incomplete coverage). Any thread.
    static Placement from_json(std::string_view json) {
        mws_placement *raw = nullptr;
        detail::check(mws_placement_from_json(json.data(), json.size(), &raw));
        return Placement(raw);
    }

    /// Takes ownership of a handle from mws_placement_from_json or
    /// mws_placement_builder_build (nullptr: an empty object).
    explicit Placement(mws_placement *raw) noexcept : handle_(raw) {}

    /// The canonical JSON (sorted keys, compact, ASCII; the bytes the digest covers;
    /// mws_placement_to_json). Borrowed from this placement.
    std::string_view to_json() const { return str(mws_placement_to_json); }
    /// The placement id, `"sha256:<hex>"` (mws_placement_id). Borrowed.
    std::string_view id() const { return str(mws_placement_id); }
    /// The placement digest, 64 lowercase hex characters (mws_placement_digest). Borrowed.
    std::string_view digest() const { return str(mws_placement_digest); }
    /// The topology id, `"sha256:<hex>"` (mws_placement_topology_id). Borrowed.
    std::string_view topology_id() const { return str(mws_placement_topology_id); }
    /// The resource id (mws_placement_resource_id). Borrowed.
    std::string_view resource_id() const { return str(mws_placement_resource_id); }
    /// The revision (mws_placement_revision). Borrowed.
    std::string_view revision() const { return str(mws_placement_revision); }
    /// The weight generation (mws_placement_weight_generation); 0 when empty.
    std::uint64_t weight_generation() const { return mws_placement_weight_generation(get()); }
    /// Participants of the topology (mws_placement_participant_count); 0 when empty.
    std::size_t participant_count() const { return mws_placement_participant_count(get()); }
    /// Tensors of the placement (mws_placement_tensor_count); 0 when empty.
    std::size_t tensor_count() const { return mws_placement_tensor_count(get()); }
    /// Fragments over all parts (mws_placement_fragment_count); 0 when empty.
    std::size_t fragment_count() const { return mws_placement_fragment_count(get()); }

    /// Fragment `index` in canonical order (participant id, then placement fragment
    /// id; mws_placement_fragment). The pointers in the result are borrowed from this
    /// placement. Throws mws::Error: MWS_INVALID_ARGUMENT (index >= fragment_count()).
    mws_placement_fragment_info fragment(std::size_t index) const {
        mws_placement_fragment_info info{};
        detail::check(mws_placement_fragment(get(), index, &info));
        return info;
    }

    /// Every fragment, copied, in canonical order (participant id, then placement
    /// fragment id; mws_placement_fragment for each). Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty object); std::bad_alloc. Any thread.
    std::vector<FragmentInfo> fragments() const {
        if (get() == nullptr) throw Error(MWS_NULL_ARGUMENT, "Placement::fragments: empty object");
        std::vector<FragmentInfo> out;
        const std::size_t n = fragment_count();
        out.reserve(n);
        for (std::size_t i = 0; i < n; ++i) out.push_back(FragmentInfo::from(fragment(i)));
        return out;
    }

    /// The fragments held by `participant_id`, copied, in canonical order: the boxes a
    /// binding of that participant binds. Throws mws::Error: MWS_NULL_ARGUMENT (empty
    /// object), MWS_INVALID_ARGUMENT (no fragment is held by `participant_id`: an
    /// unknown participant, or one that holds nothing); std::bad_alloc. Any thread.
    std::vector<FragmentInfo> fragments(const std::string &participant_id) const {
        std::vector<FragmentInfo> out;
        for (FragmentInfo &f : fragments())
            if (f.participant_id == participant_id) out.push_back(std::move(f));
        if (out.empty())
            throw Error(MWS_INVALID_ARGUMENT,
                        "Placement::fragments: no fragment is held by participant '" + participant_id + "'");
        return out;
    }

    /// The participants that hold at least one fragment, sorted, each once (a
    /// participant of the topology that holds nothing is not listed). Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object); std::bad_alloc. Any thread.
    std::vector<std::string> participants() const {
        std::vector<std::string> out;
        for (FragmentInfo &f : fragments())
            if (out.empty() || out.back() != f.participant_id) out.push_back(std::move(f.participant_id));
        return out;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_placement *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_placement_free.
    mws_placement *release() noexcept { return handle_.release(); }

private:
    std::string_view str(const char *(*accessor)(const mws_placement *, std::size_t *)) const {
        std::size_t len = 0;
        const char *p = accessor(get(), &len);
        return detail::view(p, len);
    }

    std::unique_ptr<mws_placement, detail::Deleter<mws_placement, mws_placement_free>> handle_;
};

/// One tensor axis for PlacementBuilder::add_tensor (an mws_parallel_axis). A plain
/// value; the factories do not throw.
struct Axis {
    mws_axis_kind kind;              ///< The parallel axis (DP, PP, EP or TP).
    mws_axis_semantics semantics;    ///< What the tensor declares on it.
    std::uint64_t dim = 0;  ///< split axes only
    /// A split axis: the ranks along `k` partition dimension `d`.
    static Axis split(mws_axis_kind k, std::uint64_t d) { return {k, MWS_AXIS_SPLIT, d}; }
    /// A replicated axis: every rank along `k` holds a complete copy.
    static Axis replicated(mws_axis_kind k) { return {k, MWS_AXIS_REPLICATED, 0}; }
    /// An ownership axis: only the ranks along `k` that hold fragments hold the tensor.
    static Axis ownership(mws_axis_kind k) { return {k, MWS_AXIS_OWNERSHIP, 0}; }
};

/// A tensor descriptor for PlacementBuilder::add_tensor (shard dims are derived; see
/// mws_tensor_spec). Only read during add_tensor.
struct TensorSpec {
    std::string tensor_id;                      ///< Tensor id (required).
    std::vector<std::uint64_t> global_shape;    ///< Global shape (each >= 1).
    std::string dtype;                          ///< Dtype name, e.g. "bfloat16" (required).
    std::uint64_t itemsize = 1;                 ///< Bytes per element (>= 1).
    std::string layout_fingerprint;             ///< Framework layout identity (required, non-empty).
    std::vector<Axis> axes;                     ///< Axes, any order.
    std::optional<std::uint64_t> layer_id = std::nullopt;   ///< Optional layer id.
    std::optional<std::uint64_t> expert_id = std::nullopt;  ///< Optional expert id.
};

/// A fragment for PlacementBuilder::add_fragment (byte size and rank are derived; see
/// mws_fragment_spec). Only read during add_fragment.
struct FragmentSpec {
    std::string participant_id;                        ///< The participant that holds it (added before).
    std::string tensor_id;                             ///< The tensor (added before).
    std::vector<std::uint64_t> global_offset;          ///< Box offset (same length as local_shape).
    std::vector<std::uint64_t> local_shape;            ///< Box shape.
    std::optional<std::uint64_t> pipeline_stage_id;    ///< Optional virtual pipeline stage.
    std::vector<std::string> aliases;                  ///< Alias group (tensor ids, any order).
    std::optional<std::string> placement_fragment_id;  ///< empty: the canonical sha256 id
};

/// Builds a placement one participant, tensor and fragment at a time
/// (mws_placement_builder); ids and canonical JSON come from the library.
/// Move-only; owns an mws_placement_builder. It also remembers the topology sizes and
/// the participants and tensors added through it, for add_grid and shard. Thread
/// safety: its members may be called from several threads (the library serializes
/// them, and this object's own record is behind a mutex). Fragment ids that
/// add_fragment returns are owned by the builder.
class PlacementBuilder {
public:
    /// Starts a builder (mws_placement_builder_new) with the identity and the topology
    /// sizes (each >= 1; checked by build()). The strings are copied; an empty
    /// `placement_set_id` is passed as "" (the C default "placement" is for NULL only).
    /// Throws mws::Error: MWS_INVALID_UTF8.
    PlacementBuilder(const std::string &resource_id, const std::string &revision, std::uint64_t weight_generation,
                     const std::string &placement_set_id, std::uint64_t tp_size = 1, std::uint64_t pp_size = 1,
                     std::uint64_t ep_size = 1, std::uint64_t dp_size = 1)
        : state_(std::make_unique<State>()) {
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
        state_->sizes[MWS_AXIS_DP] = dp_size;
        state_->sizes[MWS_AXIS_PP] = pp_size;
        state_->sizes[MWS_AXIS_EP] = ep_size;
        state_->sizes[MWS_AXIS_TP] = tp_size;
    }

    /// Adds a topology participant with `rank` (mws_placement_builder_add_participant);
    /// returns `*this`. Throws mws::Error: MWS_NULL_ARGUMENT (empty object),
    /// MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT (duplicate participant, empty id).
    PlacementBuilder &add_participant(const std::string &participant_id, mws_rank rank) {
        std::lock_guard<std::mutex> lock(state("add_participant").mutex);
        add_participant_locked(participant_id, rank);
        return *this;
    }

    /// Adds one participant per point of the tp x pp x ep x dp grid of the sizes given
    /// to the constructor, named `"<name>-d<dp>-p<pp>-e<ep>-t<tp>"` (as Python's
    /// PlacementBuilder.add_grid), and returns their ids in rank order (dp slowest, tp
    /// fastest): `add_grid("rank")` with tp_size 2 gives `rank-d0-p0-e0-t0`,
    /// `rank-d0-p0-e0-t1`. Throws mws::Error: MWS_NULL_ARGUMENT (empty object),
    /// MWS_INVALID_ARGUMENT (a size is 0, the grid has more than 2^32 points, a name
    /// is taken; participants added before the failing one stay), MWS_INVALID_UTF8;
    /// std::bad_alloc.
    std::vector<std::string> add_grid(const std::string &name = "rank") {
        State &st = state("add_grid");
        std::lock_guard<std::mutex> lock(st.mutex);
        std::uint64_t points = 1;
        static const char *const kinds[4] = {"dp", "pp", "ep", "tp"};
        for (int k = 0; k < 4; ++k) {
            if (st.sizes[k] == 0)
                throw Error(MWS_INVALID_ARGUMENT,
                            std::string("add_grid: ") + kinds[k] + "_size is 0 (each size must be >= 1)");
            if (st.sizes[k] > (std::uint64_t{1} << 32) / points)
                throw Error(MWS_INVALID_ARGUMENT, "add_grid: the grid has more than 2^32 points");
            points *= st.sizes[k];
        }
        std::vector<std::string> ids;
        ids.reserve(static_cast<std::size_t>(points));
        const std::uint64_t *n = st.sizes;
        for (std::uint64_t dp = 0; dp < n[MWS_AXIS_DP]; ++dp)
            for (std::uint64_t pp = 0; pp < n[MWS_AXIS_PP]; ++pp)
                for (std::uint64_t ep = 0; ep < n[MWS_AXIS_EP]; ++ep)
                    for (std::uint64_t tp = 0; tp < n[MWS_AXIS_TP]; ++tp) {
                        std::string id = name + "-d" + std::to_string(dp) + "-p" + std::to_string(pp) + "-e" +
                                         std::to_string(ep) + "-t" + std::to_string(tp);
                        add_participant_locked(id, mws_rank{dp, pp, ep, tp});
                        ids.push_back(std::move(id));
                    }
        return ids;
    }

    /// Adds a tensor descriptor, validated at once (mws_placement_builder_add_tensor);
    /// returns `*this`. Throws mws::Error: MWS_NULL_ARGUMENT (empty object),
    /// MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT (the placement contract's tensor rules,
    /// duplicate tensor, unknown axis value).
    PlacementBuilder &add_tensor(const TensorSpec &t) {
        std::lock_guard<std::mutex> lock(state("add_tensor").mutex);
        add_tensor_locked(t);
        return *this;
    }

    /// Adds a fragment; returns its placement_fragment_id (owned by the builder).
    /// (mws_placement_builder_add_fragment.) The view stays valid until the builder's
    /// handle is freed. Throws mws::Error: MWS_INVALID_ARGUMENT when global_offset and
    /// local_shape differ in length (checked here, before the library is called), or
    /// for an unknown participant or tensor, or the fragment's geometry and id rules;
    /// MWS_INVALID_UTF8; MWS_NULL_ARGUMENT (empty object).
    std::string_view add_fragment(const FragmentSpec &f) {
        std::lock_guard<std::mutex> lock(state("add_fragment").mutex);
        return add_fragment_locked(f);
    }

    /// Adds the even-split fragment of tensor `tensor_id` (added with add_tensor) for
    /// every participant added so far, in the order they were added (as Python's
    /// PlacementBuilder.shard): along each split axis of kind k over dimension d, the
    /// participant with coordinate c on k gets elements [c*n/size, (c+1)*n/size) of d,
    /// where n is the tensor's extent along d and size the builder's k size; every
    /// other dimension is whole (replicated axes: each participant holds its copy).
    /// The fragments get the explicit ids `"<participant>/<tensor_id>#0"` (Python's
    /// too, so both build the same placement). Returns the ids in participant order.
    /// Everything is checked before the first fragment is added. Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty object); MWS_INVALID_ARGUMENT: unknown tensor, no
    /// participants yet, an extent not divisible by its axis size, a participant
    /// coordinate >= its axis size, an ownership axis of size > 1 (say which
    /// participants own the tensor with the other overload), a fragment id added
    /// before (a tensor sharded twice), or a fragment the library refuses (fragments
    /// added before it stay); MWS_INVALID_UTF8; std::bad_alloc.
    std::vector<std::string> shard(const std::string &tensor_id) {
        State &st = state("shard");
        std::lock_guard<std::mutex> lock(st.mutex);
        return shard_locked(tensor_id, st.participant_order, true);
    }

    /// shard(tensor_id) for the listed participants only (those that own the tensor,
    /// for ownership axes), in the order given. Throws mws::Error: as shard(tensor_id),
    /// but ownership axes are allowed; MWS_INVALID_ARGUMENT also for an empty list, an
    /// unknown participant, or a participant listed twice.
    std::vector<std::string> shard(const std::string &tensor_id, const std::vector<std::string> &participant_ids) {
        State &st = state("shard");
        std::lock_guard<std::mutex> lock(st.mutex);
        return shard_locked(tensor_id, participant_ids, false);
    }

    /// add_tensor(t), then shard(t.tensor_id): declares a tensor and adds its
    /// even-split fragment for every participant. Throws mws::Error: those of
    /// add_tensor and shard(tensor_id) (when sharding fails, the tensor stays added).
    std::vector<std::string> shard(const TensorSpec &t) {
        State &st = state("shard");
        std::lock_guard<std::mutex> lock(st.mutex);
        add_tensor_locked(t);
        return shard_locked(t.tensor_id, st.participant_order, true);
    }

    /// Validates and builds the placement (the builder stays usable).
    /// (mws_placement_builder_build; the result owns a new handle and does not borrow
    /// the builder.) Throws mws::Error: MWS_INVALID_ARGUMENT (topology, coverage,
    /// axes, aliases, unreferenced tensors), MWS_NULL_ARGUMENT (empty object).
    Placement build() const {
        mws_placement *raw = nullptr;
        detail::check(mws_placement_builder_build(handle_.get(), &raw));
        return Placement(raw);
    }

private:
    struct Tensor {
        std::vector<std::uint64_t> shape;
        std::vector<Axis> axes;
    };
    // What add_grid and shard need, kept in step with the library's builder (each
    // entry is recorded once the library accepted it).
    struct State {
        std::mutex mutex;
        std::uint64_t sizes[4] = {1, 1, 1, 1};  // by mws_axis_kind
        std::vector<std::string> participant_order;
        std::map<std::string, mws_rank> participants;
        std::map<std::string, Tensor> tensors;
        std::set<std::string> fragment_ids;  // placement fragment ids added
    };

    State &state(const char *what) const {
        if (!state_ || !handle_)
            throw Error(MWS_NULL_ARGUMENT, std::string("PlacementBuilder::") + what + ": empty object (moved from)");
        return *state_;
    }

    void add_participant_locked(const std::string &participant_id, mws_rank rank) {
        detail::check(mws_placement_builder_add_participant(handle_.get(), participant_id.c_str(), &rank));
        state_->participant_order.push_back(participant_id);
        state_->participants[participant_id] = rank;
    }

    void add_tensor_locked(const TensorSpec &t) {
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
        state_->tensors[t.tensor_id] = Tensor{t.global_shape, t.axes};
    }

    std::string_view add_fragment_locked(const FragmentSpec &f) {
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
        std::string_view added = detail::view(id, len);
        state_->fragment_ids.emplace(added);
        return added;
    }

    std::vector<std::string> shard_locked(const std::string &tensor_id, const std::vector<std::string> &participant_ids,
                                          bool every_participant) {
        static const char *const kinds[4] = {"dp", "pp", "ep", "tp"};
        const std::string what = "shard: tensor '" + tensor_id + "': ";
        auto t = state_->tensors.find(tensor_id);
        if (t == state_->tensors.end())
            throw Error(MWS_INVALID_ARGUMENT,
                        "shard: unknown tensor '" + tensor_id + "' (add it with add_tensor first)");
        const Tensor &tensor = t->second;
        if (participant_ids.empty())
            throw Error(MWS_INVALID_ARGUMENT, what + (every_participant ? "the builder has no participants yet "
                                                                          "(add them with add_grid or add_participant)"
                                                                        : "the participant list is empty"));
        for (const Axis &a : tensor.axes) {
            const auto k = static_cast<std::size_t>(a.kind);
            if (k < 4 && state_->sizes[k] == 0)
                throw Error(MWS_INVALID_ARGUMENT, what + kinds[k] + "_size is 0 (each size must be >= 1)");
            if (k < 4 && every_participant && a.semantics == MWS_AXIS_OWNERSHIP && state_->sizes[k] > 1)
                throw Error(MWS_INVALID_ARGUMENT, what + "it has an ownership axis (" + kinds[k] + ", size " +
                                                      std::to_string(state_->sizes[k]) +
                                                      "): list the participants that own it");
            if (k < 4 && a.semantics == MWS_AXIS_SPLIT && a.dim < tensor.shape.size() &&
                tensor.shape[a.dim] % state_->sizes[k] != 0)
                throw Error(MWS_INVALID_ARGUMENT, what + "dimension " + std::to_string(a.dim) + " (" +
                                                      std::to_string(tensor.shape[a.dim]) + ") is not divisible by " +
                                                      kinds[k] + "_size " + std::to_string(state_->sizes[k]));
        }
        std::vector<FragmentSpec> specs;
        std::map<std::string, bool> seen;
        for (const std::string &pid : participant_ids) {
            auto p = state_->participants.find(pid);
            if (p == state_->participants.end())
                throw Error(MWS_INVALID_ARGUMENT,
                            what + "unknown participant '" + pid + "' (add it with add_grid or add_participant)");
            if (seen[pid]) throw Error(MWS_INVALID_ARGUMENT, what + "participant '" + pid + "' is listed twice");
            seen[pid] = true;
            const std::uint64_t coord[4] = {p->second.dp, p->second.pp, p->second.ep, p->second.tp};
            FragmentSpec f;
            f.participant_id = pid;
            f.tensor_id = tensor_id;
            f.global_offset.assign(tensor.shape.size(), 0);
            f.local_shape = tensor.shape;
            for (const Axis &a : tensor.axes) {
                const auto k = static_cast<std::size_t>(a.kind);
                if (k >= 4 || a.semantics != MWS_AXIS_SPLIT || a.dim >= tensor.shape.size()) continue;
                if (coord[k] >= state_->sizes[k])
                    throw Error(MWS_INVALID_ARGUMENT, what + "participant '" + pid + "' has " + kinds[k] + " rank " +
                                                          std::to_string(coord[k]) + ", not below " + kinds[k] +
                                                          "_size " + std::to_string(state_->sizes[k]));
                f.local_shape[a.dim] = tensor.shape[a.dim] / state_->sizes[k];
                f.global_offset[a.dim] = coord[k] * f.local_shape[a.dim];
            }
            f.placement_fragment_id = pid + "/" + tensor_id + "#0";
            if (state_->fragment_ids.count(*f.placement_fragment_id) != 0)
                throw Error(MWS_INVALID_ARGUMENT, what + "fragment '" + *f.placement_fragment_id +
                                                      "' was added before (shard each tensor once)");
            specs.push_back(std::move(f));
        }
        std::vector<std::string> ids;
        ids.reserve(specs.size());
        for (const FragmentSpec &f : specs) ids.emplace_back(add_fragment_locked(f));
        return ids;
    }

    // Declared before the handle: the record goes after the library's builder.
    std::unique_ptr<State> state_;
    std::unique_ptr<mws_placement_builder, detail::Deleter<mws_placement_builder, mws_placement_builder_free>> handle_;
};

/// Identity of a runtime binding (see mws_binding_options). Every string is
/// required by the library (passed as given; empty strings are not replaced).
struct BindingOptions {
    std::string resource_id;       ///< Resource id; must equal the placement's.
    std::string revision;          ///< Revision; must equal the placement's.
    std::string placement_id;      ///< The placement id this binding attests.
    std::string placement_digest;  ///< The placement digest this binding attests.
    std::string participant_id;    ///< The topology participant whose part this binding lends.
    std::string instance_id;       ///< The process/engine instance holding the buffers.
    std::string lease_id;          ///< The lease under which the buffers are lent.
    std::uint64_t lease_generation = 0;  ///< The lease generation (the owner's runtime fence; not the weight generation).

    /// Fills resource id, revision, placement id and digest from `placement`.
    /// The lease generation starts at the placement's weight generation (any value the
    /// owner then moves with its lease); participant_id, instance_id and lease_id stay
    /// empty for the caller to set. Copies the strings.
    /// Throws mws::Error (MWS_NULL_ARGUMENT) when `placement` is empty.
    static BindingOptions for_placement(const Placement &placement) {
        BindingOptions o;
        o.resource_id = std::string(placement.resource_id());
        o.revision = std::string(placement.revision());
        o.placement_id = std::string(placement.id());
        o.placement_digest = std::string(placement.digest());
        o.lease_generation = placement.weight_generation();
        return o;
    }
};

/// A runtime binding of one participant (owns an mws_binding).
/// Move-only. It copies what it is given and never dereferences buffer addresses:
/// the caller keeps the buffers valid and stable while operations that move bytes use
/// them. Thread safety: add_fragment and add must not run concurrently with any other
/// use of the same Binding; the const members may run concurrently with each other.
class Binding {
public:
    /// Creates an empty binding of `participant_id` of `placement`, for Binding::add
    /// (mws_binding_new): resource id, revision, placement id and digest from the
    /// placement, lease generation = its weight generation, instance id = `participant_id`, lease id `lease_id`. It
    /// copies the geometry of the participant's fragments (it does not borrow the
    /// placement). Throws mws::Error: MWS_NULL_ARGUMENT (empty placement),
    /// MWS_INVALID_ARGUMENT (the placement has no fragment held by `participant_id`),
    /// MWS_INVALID_UTF8; std::bad_alloc.
    Binding(const Placement &placement, const std::string &participant_id, const std::string &lease_id = "lease-1")
        : Binding(placement, participant_id, lease_id, placement.fragments(participant_id)) {}

    /// Creates an empty binding with identity `o` (mws_binding_new; strings copied).
    /// Throws mws::Error: MWS_INVALID_UTF8.
    explicit Binding(const BindingOptions &o) {
        mws_binding_options c{};
        c.resource_id = o.resource_id.c_str();
        c.revision = o.revision.c_str();
        c.placement_id = o.placement_id.c_str();
        c.placement_digest = o.placement_digest.c_str();
        c.participant_id = o.participant_id.c_str();
        c.instance_id = o.instance_id.c_str();
        c.lease_id = o.lease_id.c_str();
        c.lease_generation = o.lease_generation;
        mws_binding *raw = nullptr;
        detail::check(mws_binding_new(&c, &raw));
        handle_.reset(raw);
    }

    /// Takes ownership of a handle from mws_binding_new.
    /// (nullptr: an empty object.)
    explicit Binding(mws_binding *raw) noexcept : handle_(raw) {}

    /// Adds one live buffer (copied; see mws_binding_add_fragment).
    /// The fragment itself is validated (shape, strides, sizes, storage bounds); on
    /// failure the binding is unchanged. Throws mws::Error: MWS_NULL_ARGUMENT (a NULL
    /// string field), MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT (invalid fragment,
    /// unknown memory kind). Must not race with any other use of this Binding.
    void add_fragment(const mws_runtime_fragment &fragment) {
        detail::check(mws_binding_add_fragment(handle_.get(), &fragment));
        if (layout_ && fragment.placement_fragment_id != nullptr)
            layout_->bound[fragment.placement_fragment_id] = true;
    }

    /// Binds placement fragment `placement_fragment_id` of this participant to the
    /// host buffer at `address`, which holds `size` bytes (at least the fragment's
    /// nbytes): its contiguous row-major bytes, as Python's Binding.add. Everything
    /// else comes from the placement or a default for one machine and host memory:
    /// shape, item size and canonical strides from the fragment; runtime fragment id
    /// `"<participant>:<placement_fragment_id>"`, worker "worker-0", endpoint
    /// "localhost", device "cpu", MWS_MEMORY_HOST, storage = [address, address +
    /// size). Use add_fragment to set any of them. Only for a Binding made with
    /// Binding(placement, participant_id). The buffer is borrowed: it must stay valid
    /// (writable, for a restore) while uploads and loads use this binding. Returns
    /// `*this`. Throws mws::Error: MWS_NULL_ARGUMENT (empty object),
    /// MWS_INVALID_ARGUMENT (a Binding not made from a placement; a fragment this
    /// participant does not hold; a null address; `size` below the fragment's nbytes;
    /// a fragment bound twice; what mws_binding_add_fragment refuses, e.g. a buffer
    /// that wraps around the address space); std::bad_alloc. On failure the binding is
    /// unchanged. Must not race with any other use of this Binding.
    Binding &add(const std::string &placement_fragment_id, void *address, std::uint64_t size) {
        if (!handle_) throw Error(MWS_NULL_ARGUMENT, "Binding::add: empty object");
        if (!layout_)
            throw Error(MWS_INVALID_ARGUMENT, "Binding::add: this binding was not made from a placement "
                                              "(use Binding(placement, participant_id), or add_fragment)");
        const std::string where = "Binding::add: fragment '" + placement_fragment_id + "'";
        auto it = layout_->fragments.find(placement_fragment_id);
        if (it == layout_->fragments.end())
            throw Error(MWS_INVALID_ARGUMENT, where + " is not held by participant '" + layout_->participant_id + "'");
        const FragmentInfo &f = it->second;
        if (address == nullptr) throw Error(MWS_INVALID_ARGUMENT, where + ": the address is null");
        if (size < f.nbytes)
            throw Error(MWS_INVALID_ARGUMENT, where + " needs " + std::to_string(f.nbytes) + " bytes, the buffer has " +
                                                  std::to_string(size));
        if (layout_->bound.count(placement_fragment_id) != 0)
            throw Error(MWS_INVALID_ARGUMENT, where + " is already bound");
        const std::vector<std::uint64_t> strides = f.strides_bytes();
        const std::string fragment_id = layout_->participant_id + ":" + placement_fragment_id;
        mws_runtime_fragment c{};
        c.placement_fragment_id = placement_fragment_id.c_str();
        c.fragment_id = fragment_id.c_str();
        c.address = address;
        c.nbytes = f.nbytes;
        c.worker_id = "worker-0";
        c.endpoint = "localhost";
        c.device = "cpu";
        c.itemsize = f.itemsize;
        c.local_shape = f.local_shape.data();
        c.local_shape_len = f.local_shape.size();
        c.strides_bytes = strides.data();
        c.strides_bytes_len = strides.size();
        c.storage_address = address;
        c.storage_nbytes = size;
        c.storage_offset_bytes = 0;
        c.memory_kind = MWS_MEMORY_HOST;
        detail::check(mws_binding_add_fragment(handle_.get(), &c));
        layout_->bound[placement_fragment_id] = true;
        return *this;
    }

    /// Fragments added so far (mws_binding_fragment_count); 0 when empty.
    std::size_t fragment_count() const { return mws_binding_fragment_count(get()); }

    /// Throws mws::Error unless the binding pairs with `placement`.
    /// (mws_binding_validate: complete, consistent, attested id and digest, every
    /// fragment of the participant's part bound with matching geometry.) Throws
    /// MWS_INVALID_BINDING or MWS_INVALID_ARGUMENT with the reason.
    void validate(const Placement &placement) const { detail::check(mws_binding_validate(placement.get(), get())); }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_binding *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_binding_free.
    mws_binding *release() noexcept {
        layout_.reset();
        return handle_.release();
    }

private:
    friend class HostBuffers;

    // The participant's fragments (from the placement), for add().
    struct Layout {
        std::string participant_id;
        std::map<std::string, FragmentInfo> fragments;  // by placement fragment id
        std::map<std::string, bool> bound;              // placement fragment ids bound so far
    };

    Binding(const Placement &placement, const std::string &participant_id, const std::string &lease_id,
            std::vector<FragmentInfo> fragments)
        : Binding([&] {
              BindingOptions o = BindingOptions::for_placement(placement);
              o.participant_id = o.instance_id = participant_id;
              o.lease_id = lease_id;
              return o;
          }()) {
        layout_ = std::make_unique<Layout>();
        layout_->participant_id = participant_id;
        for (FragmentInfo &f : fragments) {
            std::string id = f.placement_fragment_id;
            layout_->fragments.emplace(std::move(id), std::move(f));
        }
    }

    std::unique_ptr<mws_binding, detail::Deleter<mws_binding, mws_binding_free>> handle_;
    std::unique_ptr<Layout> layout_;
};

/// Host memory for every fragment of a placement, bound, for one machine: one zeroed
/// buffer per fragment, owned here, and one Binding per participant that holds
/// fragments (Binding(placement, participant) and Binding::add, with its defaults).
/// For programs and tests that snapshot from or restore into fresh host memory; to
/// lend your own buffers, use Binding::add. Move-only; moving keeps every buffer at its
/// address, so the bindings stay valid. Thread safety: the const members may run on
/// several threads at once; writing the bytes is the caller's to order with the
/// uploads and loads that use them (the data pointers write through a const object).
class HostBuffers {
public:
    /// One fragment's buffer.
    struct Buffer {
        FragmentInfo fragment;  ///< The placement fragment it holds.
        unsigned char *data;    ///< Its fragment.nbytes bytes, owned by the HostBuffers.
        std::size_t size;       ///< fragment.nbytes.
    };

    /// Allocates and binds every fragment of `placement` (all participants; lease id
    /// `lease_id`). Does not borrow the placement. Throws mws::Error: MWS_NULL_ARGUMENT
    /// (empty placement), MWS_INVALID_UTF8, MWS_LIMIT_EXCEEDED (a fragment larger than
    /// the address space); std::bad_alloc.
    explicit HostBuffers(const Placement &placement, const std::string &lease_id = "lease-1") {
        std::vector<FragmentInfo> all = placement.fragments();
        buffers_.reserve(all.size());
        for (std::size_t i = 0; i < all.size();) {  // canonical order: grouped by participant
            std::size_t end = i;
            while (end < all.size() && all[end].participant_id == all[i].participant_id) ++end;
            std::vector<FragmentInfo> mine(all.begin() + static_cast<std::ptrdiff_t>(i),
                                           all.begin() + static_cast<std::ptrdiff_t>(end));
            Binding &b = bindings_.emplace_back(Binding(placement, all[i].participant_id, lease_id, mine));
            for (FragmentInfo &f : mine) {
                const auto n = static_cast<std::size_t>(f.nbytes);
                if (static_cast<std::uint64_t>(n) != f.nbytes)
                    throw Error(MWS_LIMIT_EXCEEDED, "HostBuffers: fragment '" + f.placement_fragment_id +
                                                        "' does not fit in the address space");
                storage_.push_back(std::make_unique<unsigned char[]>(n));  // zeroed
                b.add(f.placement_fragment_id, storage_.back().get(), f.nbytes);
                buffers_.push_back(Buffer{std::move(f), storage_.back().get(), n});
            }
            i = end;
        }
    }

    HostBuffers(const HostBuffers &) = delete;
    HostBuffers &operator=(const HostBuffers &) = delete;
    /// Moves the buffers (they keep their addresses) and the bindings.
    HostBuffers(HostBuffers &&) noexcept = default;
    /// Frees this object's buffers and bindings, then takes `other`'s.
    HostBuffers &operator=(HostBuffers &&) noexcept = default;

    /// One buffer per fragment, in canonical order (participant id, then placement
    /// fragment id). Valid while this object lives (moves included). Does not throw.
    const std::vector<Buffer> &buffers() const noexcept { return buffers_; }
    /// One binding per participant that holds fragments, sorted by participant id: pass
    /// them to Store::snapshot, Store::restore, plan_upload... Does not throw.
    const std::vector<Binding> &bindings() const noexcept { return bindings_; }

private:
    std::vector<std::unique_ptr<unsigned char[]>> storage_;
    std::vector<Buffer> buffers_;
    std::vector<Binding> bindings_;  // destroyed first: they point into storage_
};

/// Options of plan_upload; an empty optional means the library default.
/// (mws_upload_options; Writer::begin uses only transaction_id and created_at.)
struct UploadOptions {
    std::optional<std::string> store_namespace;  ///< default "default"
    std::optional<std::string> key_prefix;       ///< default "weights"
    std::optional<std::string> transaction_id;   ///< default: random
    std::optional<std::string> created_at;       ///< default: now (UTC)
};

/// One operation of an upload plan; views borrowed from the UploadPlan.
/// (mws_upload_operation: copy one runtime fragment into one stored object.)
struct UploadOperation {
    std::string_view source_participant_id;         ///< The participant whose binding lends the source buffer.
    std::string_view source_instance_id;            ///< The instance id of that binding.
    std::string_view source_lease_id;               ///< The lease id of that binding.
    std::uint64_t source_lease_generation;          ///< The lease generation of that binding.
    std::string_view source_fragment_id;            ///< The runtime fragment id of the source buffer.
    std::string_view source_worker_id;              ///< The worker that owns the source buffer.
    std::string_view source_placement_fragment_id;  ///< The placement fragment the source buffer holds.
    std::string_view target_fragment_id;            ///< The stored fragment id (in the manifest).
    std::string_view object_key;                    ///< The object key the bytes are written to.
    std::uint64_t nbytes;                           ///< Number of bytes to copy.
};

/// A planned upload (owns an mws_upload_plan).
/// Move-only and immutable: the stored manifest to commit, every key of the upload
/// transaction and the copy operations, in plan order. It does not borrow the
/// placement or bindings it was planned from. Thread safety: every const member may
/// run on several threads at once.
class UploadPlan {
public:
    /// Takes ownership of a handle from mws_upload_plan_new.
    /// (Or mws_upload_plan_from_json / mws_writer_upload_plan; nullptr: an empty object.)
    explicit UploadPlan(mws_upload_plan *raw) noexcept : handle_(raw) {}

    /// The stored manifest JSON: the exact bytes stored at the manifest key and
    /// covered by the digest (mws_upload_plan_manifest_json). Borrowed.
    std::string_view manifest_json() const { return str(mws_upload_plan_manifest_json); }
    /// The manifest digest, sha256 hex of manifest_json() (mws_upload_plan_manifest_digest). Borrowed.
    std::string_view manifest_digest() const { return str(mws_upload_plan_manifest_digest); }
    /// The key the manifest is stored at (mws_upload_plan_manifest_key). Borrowed.
    std::string_view manifest_key() const { return str(mws_upload_plan_manifest_key); }
    /// The group id of the stored revision, the key base (mws_upload_plan_group_id). Borrowed.
    std::string_view group_id() const { return str(mws_upload_plan_group_id); }
    /// The control key, where the commit/abort decision record is stored
    /// (mws_upload_plan_control_key). Borrowed.
    std::string_view control_key() const { return str(mws_upload_plan_control_key); }
    /// The group of the payload objects of this upload
    /// (mws_upload_plan_transaction_group_id). Borrowed.
    std::string_view transaction_group_id() const { return str(mws_upload_plan_transaction_group_id); }
    /// The upload transaction id (mws_upload_plan_transaction_id). Borrowed.
    std::string_view transaction_id() const { return str(mws_upload_plan_transaction_id); }
    /// The id of the placement the plan was made from (mws_upload_plan_source_placement_id). Borrowed.
    std::string_view source_placement_id() const { return str(mws_upload_plan_source_placement_id); }
    /// The digest of the placement the plan was made from
    /// (mws_upload_plan_source_placement_digest). Borrowed.
    std::string_view source_placement_digest() const { return str(mws_upload_plan_source_placement_digest); }
    /// The exact bytes of the commit decision record to store at the control key
    /// (mws_upload_plan_commit_record). Borrowed.
    std::string_view commit_record() const { return str(mws_upload_plan_commit_record); }
    /// Operations of the plan (mws_upload_plan_operation_count); 0 when empty.
    std::size_t operation_count() const { return mws_upload_plan_operation_count(get()); }

    /// Transport JSON (for the other processes of one job; holds buffer addresses).
    /// (mws_upload_plan_to_json; built on first use, borrowed; never store it.)
    std::string_view to_json() const { return str(mws_upload_plan_to_json); }

    /// Decodes and re-validates a plan sent by to_json().
    /// (mws_upload_plan_from_json; `json` is only read during the call.) Throws
    /// mws::Error: MWS_INVALID_ARGUMENT (malformed or invalid plan). Any thread.
    static UploadPlan from_json(std::string_view json) {
        mws_upload_plan *raw = nullptr;
        detail::check(mws_upload_plan_from_json(json.data(), json.size(), &raw));
        return UploadPlan(raw);
    }

    /// Operation `index` in plan order (mws_upload_plan_operation); the views are
    /// borrowed from this plan. Throws mws::Error: MWS_INVALID_ARGUMENT (index >=
    /// operation_count()).
    UploadOperation operation(std::size_t index) const {
        mws_upload_operation op{};
        detail::check(mws_upload_plan_operation(get(), index, &op));
        return UploadOperation{op.source_participant_id,
                               op.source_instance_id,
                               op.source_lease_id,
                               op.source_lease_generation,
                               op.source_fragment_id,
                               op.source_worker_id,
                               op.source_placement_fragment_id,
                               op.target_fragment_id,
                               op.object_key,
                               op.nbytes};
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_upload_plan *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_upload_plan_free.
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
/// Pure: no I/O, no buffer is read. The bindings are borrowed for the call only and
/// must not be modified (Binding::add_fragment) during it; a nullptr element is
/// passed on as NULL. Throws mws::Error: MWS_NULL_ARGUMENT (a nullptr element, an
/// empty placement or binding), MWS_INVALID_UTF8, MWS_INVALID_BINDING (a binding does
/// not pair with the placement, or the set is empty), MWS_INVALID_ARGUMENT
/// (unplannable inputs, invalid options). May run concurrently with other calls on
/// the same const objects.
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
/// The same as the overload taking pointers (same errors and thread safety).
inline UploadPlan plan_upload(const Placement &placement, const std::vector<Binding> &bindings,
                              const UploadOptions &options = {}) {
    std::vector<const Binding *> ptrs;
    ptrs.reserve(bindings.size());
    for (const Binding &b : bindings) {
        ptrs.push_back(&b);
    }
    return plan_upload(placement, ptrs, options);
}

/// A device copy engine (owns an mws_device_engine): moves bytes between host and
/// device memory in batches of 2-D copies. Stores (StoreOptions::device_engine) and the
/// embedded transfer engine (TransferEngine::local(const DeviceEngine &)) reach device
/// memory only through one, and keep their own reference to it: a DeviceEngine may be
/// destroyed as soon as they are made (the engine itself, its stream, a fenced
/// device's memory or a vtable's ctx, lives until the last of them goes).
/// Move-only (no release()). Thread safety: every member may run on several threads at
/// once.
class DeviceEngine {
public:
    /// Takes ownership of a device engine handle (nullptr: an empty object).
    explicit DeviceEngine(mws_device_engine *raw) noexcept : handle_(raw) {}

    /// A CUDA engine for device `ordinal` (CUDA's driver API, opened at run time), in
    /// the device's primary context, copying on `stream` (a CUstream / cudaStream_t of
    /// that context, kept alive by the caller while the engine lives; 0 = the legacy
    /// default stream) or, without one, on a stream of its own
    /// (mws_device_engine_new_cuda). Throws mws::Error: MWS_UNSUPPORTED (no CUDA
    /// driver on this machine), MWS_INVALID_ARGUMENT, MWS_IO (the driver refused the
    /// device or the stream).
    static DeviceEngine cuda(std::uint32_t ordinal, std::optional<std::uint64_t> stream = std::nullopt) {
        mws_device_engine *out = nullptr;
        detail::check(mws_device_engine_new_cuda(ordinal, stream ? &*stream : nullptr, &out));
        return DeviceEngine(out);
    }
    /// A fenced test device of `capacity` bytes reporting ordinal `ordinal`: its memory
    /// faults on any host access (PROT_NONE), so only this engine reaches it
    /// (mws_device_engine_new_fenced). Allocate with fenced_alloc(); move bytes with
    /// copy(). Throws mws::Error: MWS_INVALID_ARGUMENT (zero capacity), MWS_IO.
    static DeviceEngine fenced(std::uint32_t ordinal, std::uint64_t capacity) {
        mws_device_engine *out = nullptr;
        detail::check(mws_device_engine_new_fenced(ordinal, capacity, &out));
        return DeviceEngine(out);
    }
    /// A caller's engine (mws_device_engine_from_vtable; `vt` is checked and copied;
    /// its callbacks must be thread-safe and never throw). On success the engine owns
    /// `ctx` (vt.destroy, if any, is called once when its last user is gone); on
    /// failure the caller keeps it. Throws mws::Error: MWS_INVALID_ARGUMENT (size,
    /// submit or wait NULL, only one staging callback), MWS_UNSUPPORTED (version).
    static DeviceEngine from_vtable(const mws_device_engine_vtable &vt, void *ctx) {
        mws_device_engine *out = nullptr;
        detail::check(mws_device_engine_from_vtable(&vt, ctx, &out));
        return DeviceEngine(out);
    }

    /// `len` bytes of a fenced device's memory (256-byte aligned, zeroed): its device
    /// address, which the host must never dereference; valid while the engine lives
    /// (mws_device_engine_fenced_alloc). Throws mws::Error: MWS_INVALID_ARGUMENT (not
    /// a fenced engine), MWS_LIMIT_EXCEEDED (the device is full).
    std::uint64_t fenced_alloc(std::uint64_t len) const {
        std::uint64_t address = 0;
        detail::check(mws_device_engine_fenced_alloc(get(), len, &address));
        return address;
    }
    /// Copies `n` ranges in `direction` (an mws_copy_direction value) on device
    /// `ordinal`, coalesced into 2-D copies, one batch, complete on return; returns the
    /// number of 2-D copies made (mws_device_engine_copy). Every source range must be
    /// readable and every target range writable in the memory the direction names for
    /// the call. Throws mws::Error: MWS_INVALID_ARGUMENT (direction, a range the engine
    /// cannot copy), MWS_IO, MWS_UNSUPPORTED.
    std::uint64_t copy(std::uint32_t ordinal, std::uint32_t direction, const mws_copy_range *ranges,
                       std::size_t n) const {
        std::uint64_t copies = 0;
        detail::check(mws_device_engine_copy(get(), ordinal, direction, ranges, n, &copies));
        return copies;
    }
    /// As copy(ordinal, direction, ranges.data(), ranges.size()).
    std::uint64_t copy(std::uint32_t ordinal, std::uint32_t direction,
                       const std::vector<mws_copy_range> &ranges) const {
        return copy(ordinal, direction, ranges.data(), ranges.size());
    }
    /// One range: `len` bytes from `source` to `target`.
    std::uint64_t copy(std::uint32_t ordinal, std::uint32_t direction, std::uint64_t source, std::uint64_t target,
                       std::uint64_t len) const {
        mws_copy_range r{source, target, len};
        return copy(ordinal, direction, &r, 1);
    }
    /// The engine's counters, over every user of it (mws_device_engine_stats). Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object).
    mws_device_stats stats() const {
        mws_device_stats s{};
        detail::check(mws_device_engine_stats(get(), &s));
        return s;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_device_engine *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_device_engine, detail::Deleter<mws_device_engine, mws_device_engine_free>> handle_;
};

/// Options of the store constructors (see mws_store_options); empty = defaults.
struct StoreOptions {
    std::optional<std::string> key_prefix;     ///< default "weights"
    std::uint64_t max_range_bytes = 0;         ///< 0 = default (64 MiB)
    std::uint64_t max_ranges_per_request = 0;  ///< 0 = default (1024)
    std::uint64_t max_region_segments = 0;     ///< 0 = default (2^32)
    /// The device engine through which the store reads device sources and writes
    /// device targets (staged in its host buffers; restores are verified before a byte
    /// reaches the device), for every kind of store. nullptr: none (the embedded stores
    /// refuse device memory, MWS_UNSUPPORTED). Only read when the store is opened: the
    /// store takes its own reference, so `*device_engine` may be destroyed afterwards.
    /// See mws_store_options::device_engine.
    const DeviceEngine *device_engine = nullptr;
    /// Host staging budget of restores through range-priced stores (Mooncake): 0 =
    /// the default (64 MiB per store, on); MWS_STAGING_OFF = never stage. Embedded
    /// stores never stage. See mws_store_options::staging_bytes.
    std::uint64_t staging_bytes = 0;
    /// Largest manifest or decision record read back; 0 = default (256 MiB).
    std::uint64_t max_metadata_bytes = 0;
    /// Verify restores against the revision's integrity record (on by default; the
    /// check is fused with the copy; false opts out). Revisions without a record
    /// restore unverified. See mws_store_options::verify_integrity.
    bool verify_integrity = true;
    /// Snapshots compute block checksums and write the integrity record (on by
    /// default). false: no checksums, no record; the revision is what the reference
    /// writes and restores unverified. See mws_store_options::write_integrity.
    bool write_integrity = true;

    /// The C options; key_prefix points into this object, which must outlive their
    /// use and not change meanwhile.
    mws_store_options c() const noexcept {
        mws_store_options o{};
        o.key_prefix = detail::c_str_or_null(key_prefix);
        o.max_range_bytes = max_range_bytes;
        o.max_ranges_per_request = max_ranges_per_request;
        o.max_region_segments = max_region_segments;
        o.device_engine = device_engine != nullptr ? device_engine->get() : nullptr;
        o.staging_bytes = staging_bytes;
        o.max_metadata_bytes = max_metadata_bytes;
        o.verify_integrity = verify_integrity ? MWS_VERIFY_ON : MWS_VERIFY_OFF;
        o.write_integrity = write_integrity ? MWS_WRITE_INTEGRITY_ON : MWS_WRITE_INTEGRITY_OFF;
        return o;
    }
};

/// Per-call arguments of uploads and loads (see mws_io_args).
/// Default-constructed: every default (static guard, no lease, no progress).
struct IoArgs {
    /// Restricts the call to one worker's fragments. Empty: an upload requires it
    /// when the participant's fragments live on several workers; a load serves every
    /// worker of the participant.
    std::optional<std::string> worker_id;
    /// Transfer id handed to the guard. Empty: a fresh random id.
    std::optional<std::string> transfer_id;
    const mws_guard_vtable *guard = nullptr;  ///< nullptr: static guard (caller keeps buffers stable)
    void *guard_ctx = nullptr;  ///< Passed to the guard's callbacks.
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
/// Move-only and immutable: proof that stored fragments were written and are
/// visible. Thread safety: every const member may run on several threads at once.
class Receipts {
public:
    /// Takes ownership of a receipts handle (nullptr: an empty object).
    explicit Receipts(mws_receipts *raw) noexcept : handle_(raw) {}

    /// Decodes receipts sent by to_json() (mws_receipts_from_json; strict; their
    /// validity for a plan is checked at commit). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT.
    static Receipts from_json(std::string_view json) {
        mws_receipts *raw = nullptr;
        detail::check(mws_receipts_from_json(json.data(), json.size(), &raw));
        return Receipts(raw);
    }
    /// Concatenates `list` (borrowed for the call) into new receipts
    /// (mws_receipts_concat); an empty list gives an empty set. Throws mws::Error:
    /// MWS_NULL_ARGUMENT (a nullptr or empty element).
    static Receipts concat(const std::vector<const Receipts *> &list) {
        std::vector<const mws_receipts *> raw;
        for (const Receipts *r : list) raw.push_back(r != nullptr ? r->get() : nullptr);
        mws_receipts *out = nullptr;
        detail::check(mws_receipts_concat(raw.data(), raw.size(), &out));
        return Receipts(out);
    }
    /// The receipts of every operation of `plan` (mws_receipts_from_plan): a
    /// coordinator rebuilds them to retry a commit after a crash. Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty plan object).
    static Receipts for_plan(const UploadPlan &plan) {
        mws_receipts *out = nullptr;
        detail::check(mws_receipts_from_plan(plan.get(), &out));
        return Receipts(out);
    }

    /// Number of receipts (mws_receipts_count); 0 when empty.
    std::size_t size() const { return mws_receipts_count(get()); }
    /// The transport encoding (mws_receipts_to_json; built on first use). Borrowed.
    std::string_view to_json() const {
        std::size_t len = 0;
        const char *p = mws_receipts_to_json(get(), &len);
        return detail::view(p, len);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_receipts *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_receipts_free.
    mws_receipts *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_receipts, detail::Deleter<mws_receipts, mws_receipts_free>> handle_;
};

/// A published stored manifest (owns an mws_stored_manifest).
/// Move-only and immutable: tensors, stored fragments and object keys of one
/// revision. Load plans made from it do not borrow it. Thread safety: every const
/// member may run on several threads at once.
class StoredManifest {
public:
    /// Takes ownership of a stored manifest handle (nullptr: an empty object).
    explicit StoredManifest(mws_stored_manifest *raw) noexcept : handle_(raw) {}

    /// Decodes a manifest from its JSON with the strict validation of
    /// Store::load_manifest (mws_stored_manifest_from_json). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (invalid document).
    static StoredManifest from_json(std::string_view json) {
        mws_stored_manifest *raw = nullptr;
        detail::check(mws_stored_manifest_from_json(json.data(), json.size(), &raw));
        return StoredManifest(raw);
    }

    /// The manifest JSON, the exact stored bytes (mws_stored_manifest_to_json). Borrowed.
    std::string_view to_json() const { return str(mws_stored_manifest_to_json); }
    /// The manifest digest, 64 lowercase hex (mws_stored_manifest_digest). Borrowed.
    std::string_view digest() const { return str(mws_stored_manifest_digest); }
    /// The key the manifest is stored at (mws_stored_manifest_key). Borrowed.
    std::string_view key() const { return str(mws_stored_manifest_key); }
    /// The group id of the revision (mws_stored_manifest_group_id). Borrowed.
    std::string_view group_id() const { return str(mws_stored_manifest_group_id); }
    /// The store namespace of the revision (mws_stored_manifest_namespace). Borrowed.
    std::string_view store_namespace() const { return str(mws_stored_manifest_namespace); }
    /// The resource id (mws_stored_manifest_resource_id). Borrowed.
    std::string_view resource_id() const { return str(mws_stored_manifest_resource_id); }
    /// The revision (mws_stored_manifest_revision). Borrowed.
    std::string_view revision() const { return str(mws_stored_manifest_revision); }
    /// The weight generation (mws_stored_manifest_weight_generation); 0 when empty.
    std::uint64_t weight_generation() const { return mws_stored_manifest_weight_generation(get()); }
    /// Tensors (mws_stored_manifest_tensor_count); 0 when empty.
    std::size_t tensor_count() const { return mws_stored_manifest_tensor_count(get()); }
    /// Stored fragments (mws_stored_manifest_fragment_count); 0 when empty.
    std::size_t fragment_count() const { return mws_stored_manifest_fragment_count(get()); }
    /// Sum of the stored fragments' sizes in bytes (mws_stored_manifest_total_bytes); 0 when empty.
    std::uint64_t total_bytes() const { return mws_stored_manifest_total_bytes(get()); }

    /// Stored fragment `index` (borrowed pointers, valid while this object lives).
    /// (Manifest order; mws_stored_manifest_fragment.) Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (index >= fragment_count()).
    mws_stored_fragment_info fragment(std::size_t index) const {
        mws_stored_fragment_info info{};
        detail::check(mws_stored_manifest_fragment(get(), index, &info));
        return info;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_stored_manifest *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_stored_manifest_free.
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
/// Move-only and immutable: each participant's Store::load may run concurrently. It
/// copies what it needs from the manifest, placement and bindings but records the
/// bindings' buffer addresses: the buffers must stay where they are until the loads
/// ran.
class LoadPlan {
public:
    /// Takes ownership of a load plan handle (nullptr: an empty object).
    explicit LoadPlan(mws_load_plan *raw) noexcept : handle_(raw) {}

    /// Plans the restore of `manifest` into `target` for the participants of `bindings`.
    /// (mws_load_plan_new; pure, no store I/O; all participants or a subset; `limits`
    /// nullptr = defaults; nothing is borrowed after the call.) Throws mws::Error:
    /// MWS_NULL_ARGUMENT (a nullptr element), MWS_INVALID_BINDING (a binding does not
    /// pair with `target`, duplicates, empty set), MWS_INVALID_ARGUMENT (revision or
    /// tensor set mismatch, incompatible layouts, uncovered target),
    /// MWS_INVALID_MANIFEST, MWS_LIMIT_EXCEEDED.
    static LoadPlan plan(const StoredManifest &manifest, const Placement &target,
                         const std::vector<const Binding *> &bindings, const mws_planning_limits *limits = nullptr) {
        std::vector<const mws_binding *> raw;
        for (const Binding *b : bindings) raw.push_back(b != nullptr ? b->get() : nullptr);
        mws_load_plan *out = nullptr;
        detail::check(mws_load_plan_new(manifest.get(), target.get(), raw.data(), raw.size(), limits, &out));
        return LoadPlan(out);
    }

    /// Transfer regions (mws_load_plan_region_count); 0 when empty.
    std::size_t region_count() const { return mws_load_plan_region_count(get()); }
    /// Bytes the plan moves (mws_load_plan_total_bytes); 0 when empty.
    std::uint64_t total_bytes() const { return mws_load_plan_total_bytes(get()); }
    /// Target participants the plan loads (mws_load_plan_participant_count); 0 when empty.
    std::size_t participant_count() const { return mws_load_plan_participant_count(get()); }
    /// Target participant `index`, in sorted order (mws_load_plan_participant).
    /// Borrowed. Throws mws::Error with MWS_NULL_ARGUMENT when the C call returns
    /// NULL: an empty plan, or `index` >= participant_count() (the message says so).
    std::string_view participant(std::size_t index) const {
        std::size_t len = 0;
        const char *p = mws_load_plan_participant(get(), index, &len);
        return detail::view(p, len);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_load_plan *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_load_plan_free.
    mws_load_plan *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_load_plan, detail::Deleter<mws_load_plan, mws_load_plan_free>> handle_;
};

/// One committed revision of a resource (Store::revisions, Store::latest): a copy of
/// an mws_revision_info, valid on its own (nothing borrowed). An ordinary value.
struct RevisionInfo {
    /// Revision name.
    std::string revision;
    /// Weight generation.
    std::uint64_t weight_generation = 0;
    /// Key of its published manifest (pass it to Store::load_manifest).
    std::string manifest_key;
    /// Its manifest digest (64 lowercase hex).
    std::string manifest_digest;
    /// The manifest's created_at: when the upload was planned (UTC
    /// YYYY-MM-DDTHH:MM:SSZ from this library's planner; the store keeps no commit time).
    std::string created_at;
};

namespace detail {

/// Copies every entry of `list` (owned here, freed on return or throw).
inline std::vector<RevisionInfo> take_revisions(mws_revision_list *list) {
    std::unique_ptr<mws_revision_list, Deleter<mws_revision_list, mws_revision_list_free>> owned(list);
    std::vector<RevisionInfo> out;
    std::size_t n = mws_revision_list_count(owned.get());
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        mws_revision_info info{};
        check(mws_revision_list_get(owned.get(), i, &info));
        out.push_back(RevisionInfo{info.revision, info.weight_generation, info.manifest_key, info.manifest_digest,
                                   info.created_at});
    }
    return out;
}

}  // namespace detail

/// A weight store over a backend (owns an mws_store).
/// Move-only: an object store backend (memory, directory or caller vtable) plus the
/// key prefix, limits and buffer-registration state of the weight protocol.
/// Transactions, writers and registration leases keep the backend alive, so a Store
/// may be destroyed before them. Thread safety: every const member may run on several
/// threads at once (uploads and loads of different participants run in parallel).
class Store {
public:
    /// Takes ownership of a store handle (nullptr: an empty object).
    explicit Store(mws_store *raw) noexcept : handle_(raw) {}

    /// Opens an empty in-memory store; its objects live as long as the store
    /// (mws_store_open_memory). Throws mws::Error: MWS_INVALID_UTF8,
    /// MWS_INVALID_ARGUMENT (invalid options).
    static Store open_memory(const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_open_memory(&c, &raw));
        return Store(raw);
    }
    /// Opens (creating if needed) the directory store rooted at `path`: one file per
    /// key, atomic fsynced writes; several stores and processes may share a root
    /// (mws_store_open_dir). Throws mws::Error: as open_memory, plus MWS_IO (cannot
    /// create or open the directory).
    static Store open_dir(const std::string &path, const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_open_dir(path.c_str(), &c, &raw));
        return Store(raw);
    }
    /// Takes ownership of `ctx` on success (vt->destroy is called when freed).
    /// (mws_store_from_vtable_with_options; `vt` is checked and copied; its callbacks
    /// must be thread-safe and never throw while the store lives. On failure the
    /// caller keeps `ctx`.) Throws mws::Error: MWS_INVALID_ARGUMENT (size too small,
    /// missing mandatory callback, invalid options),
    /// MWS_UNSUPPORTED (vtable version), MWS_STORE (get_cost failed).
    static Store from_vtable(const mws_store_vtable &vt, void *ctx, const StoreOptions &o = {}) {
        mws_store_options c = o.c();
        mws_store *raw = nullptr;
        detail::check(mws_store_from_vtable_with_options(&vt, ctx, &c, &raw));
        return Store(raw);
    }

    /// The key prefix of every key the store writes (mws_store_key_prefix). Borrowed.
    std::string_view key_prefix() const {
        std::size_t len = 0;
        const char *p = mws_store_key_prefix(get(), &len);  // before `len` is read
        return detail::view(p, len);
    }

    /// Raw access: the whole object.
    /// (mws_store_get twice: a length query, then the read; an object that grows
    /// between them fails with MWS_INVALID_ARGUMENT.) Throws mws::Error:
    /// MWS_INVALID_UTF8, MWS_NOT_FOUND, MWS_STORE / MWS_IO (backend),
    /// MWS_INVALID_ARGUMENT, MWS_LIMIT_EXCEEDED.
    std::vector<unsigned char> get_object(const std::string &key) const {
        std::size_t len = 0;
        detail::check(mws_store_get(get(), key.c_str(), nullptr, 0, &len));
        std::vector<unsigned char> out(len);
        detail::check(mws_store_get(get(), key.c_str(), out.data(), out.size(), &len));
        out.resize(len);
        return out;
    }
    /// Raw access: whether object `key` exists (mws_store_exists). Throws mws::Error:
    /// MWS_INVALID_UTF8, backend errors (MWS_STORE / MWS_IO).
    bool exists(const std::string &key) const {
        int present = 0;
        detail::check(mws_store_exists(get(), key.c_str(), &present));
        return present != 0;
    }
    /// Raw access: writes `value` as object `key`, replacing any existing value, as a
    /// metadata record of group "" (mws_store_upsert). Throws mws::Error:
    /// MWS_INVALID_UTF8, backend errors (MWS_STORE / MWS_IO).
    void upsert(const std::string &key, std::string_view value) const {
        detail::check(mws_store_upsert(get(), key.c_str(), reinterpret_cast<const std::uint8_t *>(value.data()),
                                       value.size(), nullptr));
    }
    /// Raw access: removes object `key`; an absent key succeeds (mws_store_remove).
    /// Throws mws::Error: MWS_INVALID_UTF8, backend errors (MWS_STORE / MWS_IO).
    void remove(const std::string &key) const { detail::check(mws_store_remove(get(), key.c_str())); }

    /// Uploads `binding`'s participant for `plan` (planned from `placement`).
    /// (mws_store_upload; only `args.worker_id`'s fragments when set.) Every
    /// freshness check runs before any store call; a failure never deletes payloads
    /// (clean up with abort_upload). Every source buffer must stay valid for reads and
    /// unwritten during the call (or while the guard pins it); `args` must outlive the
    /// call. Returns the receipts, in plan order (empty for a participant without
    /// operations). Throws mws::Error: MWS_INVALID_BINDING, MWS_STALE_BINDING,
    /// MWS_INVALID_ARGUMENT (unknown worker, worker required), MWS_UNSUPPORTED (device
    /// memory without a device engine), MWS_CONFLICT (the transaction already chose
    /// abort), MWS_STORE / MWS_IO (backend; retryable). Uploads of different
    /// participants may run concurrently.
    Receipts upload(const UploadPlan &plan, const Placement &placement, const Binding &binding,
                    const IoArgs &args = {}) const {
        mws_io_args a = args.c();
        mws_receipts *out = nullptr;
        detail::check(mws_store_upload(get(), plan.get(), placement.get(), binding.get(), &a, &out));
        return Receipts(out);
    }
    /// Commits the upload: checks receipts and payloads, claims the commit decision
    /// and publishes the manifest (mws_store_commit). `*decision_may_exist`, when
    /// given, is set to 0 at entry and to 1 (also on failure) once the decision may be
    /// written: then keep the plan and retry the commit or finalize_upload, never
    /// abort. Throws mws::Error: MWS_INVALID_ARGUMENT (receipts do not match the
    /// plan), MWS_STORE (retryable), MWS_CONFLICT (the transaction chose abort or lost
    /// to a conflicting revision).
    StoredManifest commit(const UploadPlan &plan, const Receipts &receipts, int *decision_may_exist = nullptr) const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_store_commit(get(), plan.get(), receipts.get(), decision_may_exist, &out));
        return StoredManifest(out);
    }
    /// Records the abort decision and removes every payload of `plan` that no
    /// published manifest references (mws_store_abort_upload; `receipts` may be
    /// nullptr). Throws mws::Error: MWS_CONFLICT (already published or committed),
    /// MWS_STORE (cleanup failed; retry or finalize later).
    void abort_upload(const UploadPlan &plan, const Receipts *receipts = nullptr) const {
        detail::check(mws_store_abort_upload(get(), plan.get(), receipts != nullptr ? receipts->get() : nullptr));
    }
    /// Idempotent recovery: brings the transaction of `plan` to its terminal state and
    /// removes the payloads it must not keep (mws_store_finalize_upload). Throws
    /// mws::Error: MWS_CONFLICT (no terminal decision yet, or one of another plan),
    /// MWS_STORE (retryable).
    void finalize_upload(const UploadPlan &plan) const { detail::check(mws_store_finalize_upload(get(), plan.get())); }
    /// Reads the decision record at the plan's control key (mws_store_read_decision);
    /// MWS_DECISION_NONE when none is recorded. Throws mws::Error:
    /// MWS_INVALID_MANIFEST (invalid record), MWS_CONFLICT (record of another plan of
    /// the same transaction id), MWS_STORE.
    mws_decision read_decision(const UploadPlan &plan) const {
        mws_decision d = MWS_DECISION_NONE;
        detail::check(mws_store_read_decision(get(), plan.get(), &d));
        return d;
    }
    /// Reads and strictly decodes the manifest stored at `key`
    /// (mws_stored_manifest_from_store). Throws mws::Error: MWS_NOT_FOUND,
    /// MWS_INVALID_MANIFEST (invalid document, digest fields, key mismatch),
    /// MWS_STORE / MWS_IO.
    StoredManifest load_manifest(const std::string &key) const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_stored_manifest_from_store(get(), key.c_str(), &out));
        return StoredManifest(out);
    }
    /// Every committed revision of `resource_id` in `store_namespace` (std::nullopt:
    /// "default", the namespace uploads default to) under this store's key prefix,
    /// oldest first: by weight generation, then created_at, then revision name, so the
    /// newest is the last; empty when there is none (mws_revision_list_from_store;
    /// reads every manifest of the resource; a store that cannot list its keys, such
    /// as a Mooncake vtable store, through the revision index its commits write, each
    /// revision also checked against its decision record). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (empty namespace or resource id), MWS_INVALID_MANIFEST (a
    /// manifest that does not decode or lies at another revision's key, an indexed
    /// revision's decision record that does not decode), MWS_LIMIT_EXCEEDED,
    /// MWS_STORE / MWS_IO. May run beside any other call.
    std::vector<RevisionInfo> revisions(const std::string &resource_id,
                                        const std::optional<std::string> &store_namespace = std::nullopt) const {
        mws_revision_list *list = nullptr;
        detail::check(mws_revision_list_from_store(get(), detail::c_str_or_null(store_namespace),
                                                   resource_id.c_str(), &list));
        return detail::take_revisions(list);
    }
    /// The newest committed revision of `resource_id` (the last of revisions():
    /// highest weight generation, then latest created_at, then greatest revision
    /// name), or std::nullopt when there is none
    /// (mws_revision_list_latest_from_store; reads only the manifests of the highest
    /// generation). Throws mws::Error: as revisions().
    std::optional<RevisionInfo> latest(const std::string &resource_id,
                                       const std::optional<std::string> &store_namespace = std::nullopt) const {
        mws_revision_list *list = nullptr;
        detail::check(mws_revision_list_latest_from_store(get(), detail::c_str_or_null(store_namespace),
                                                          resource_id.c_str(), &list));
        std::vector<RevisionInfo> all = detail::take_revisions(list);
        if (all.empty()) return std::nullopt;
        return all.back();
    }
    /// Restores the part of `plan` that belongs to `binding`'s participant (one worker
    /// when `args.worker_id` is set) and returns what moved (mws_store_load). Every
    /// check runs before anything is registered or read; a refused plan leaves the
    /// buffers untouched. The target buffers must stay valid for writes and untouched
    /// by anyone else during the call; `args` must outlive it. Throws mws::Error:
    /// MWS_STALE_BINDING, MWS_INVALID_BINDING, MWS_INVALID_MANIFEST / MWS_INTEGRITY,
    /// MWS_NOT_FOUND, MWS_UNSUPPORTED (device memory without a device engine), MWS_STORE /
    /// MWS_IO, MWS_LIMIT_EXCEEDED. Loads of different participants may run
    /// concurrently.
    mws_load_stats load(const LoadPlan &plan, const Binding &binding, const IoArgs &args = {}) const {
        mws_io_args a = args.c();
        mws_load_stats stats{};
        detail::check(mws_store_load(get(), plan.get(), binding.get(), &a, &stats));
        return stats;
    }
    /// Loads several target participants of this process in one call
    /// (mws_store_load_many): what load() per binding does, with the plan's checks
    /// (committed manifest, object sizes, integrity record) made once and the
    /// bindings loaded on several threads (in turn with a progress callback);
    /// returns the totals. `args.lease` must be nullptr. The buffers as for load().
    /// Throws mws::Error: those of load(), MWS_INVALID_ARGUMENT (a participant given
    /// twice, a lease).
    mws_load_stats load_many(const LoadPlan &plan, const std::vector<const Binding *> &bindings,
                             const IoArgs &args = {}) const {
        std::vector<const mws_binding *> b;
        b.reserve(bindings.size());
        for (const Binding *x : bindings) b.push_back(x != nullptr ? x->get() : nullptr);
        mws_io_args a = args.c();
        mws_load_stats stats{};
        detail::check(mws_store_load_many(get(), plan.get(), b.data(), b.size(), &a, &stats));
        return stats;
    }

    /// Snapshots `placement` from `bindings` (every participant, all lent by this
    /// process) in one call: plans the upload (plan_upload; the store's key prefix
    /// unless `options.key_prefix` is set), uploads every binding through one
    /// Transaction (upload_many with `args`, whose `lease` must be nullptr) and
    /// commits; returns the published manifest. The buffers as for Store::upload. When
    /// a step fails before the commit decision may exist, the upload is aborted (its
    /// payloads removed, best effort) and the error rethrown; after that point the
    /// commit is retried once, and if that fails too its error is thrown and the
    /// transaction is left for recovery (use plan_upload and Transaction when you need
    /// to drive recovery yourself). Throws mws::Error: those of plan_upload,
    /// Transaction::upload_many and Transaction::commit; std::bad_alloc. Snapshots of
    /// different revisions may run concurrently.
    StoredManifest snapshot(const Placement &placement, const std::vector<Binding> &bindings, const IoArgs &args = {},
                            const UploadOptions &options = {}) const;

    /// Restores `manifest` into `bindings` (participants of `placement`, all or some,
    /// lent by this process): plans the load (LoadPlan::plan) and loads every binding
    /// in one Store::load_many call with `args` (the plan's checks once; a progress
    /// callback sees one restore per binding; with `args.lease`, which covers one
    /// binding, Store::load per binding instead). Returns the sum of the load
    /// statistics. The buffers as for Store::load; a refused plan leaves them
    /// untouched, a load that fails leaves the bindings before it restored. Throws
    /// mws::Error: those of LoadPlan::plan and Store::load_many; std::bad_alloc. May
    /// run concurrently with other const members.
    mws_load_stats restore(const StoredManifest &manifest, const Placement &placement,
                           const std::vector<Binding> &bindings, const IoArgs &args = {}) const {
        std::vector<const Binding *> ptrs;
        ptrs.reserve(bindings.size());
        for (const Binding &b : bindings) ptrs.push_back(&b);
        const LoadPlan plan = LoadPlan::plan(manifest, placement, ptrs);
        if (args.lease == nullptr) return load_many(plan, ptrs, args);
        mws_load_stats total{};
        for (const Binding &b : bindings) {
            const mws_load_stats s = load(plan, b, args);
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
    /// restore() of the manifest stored at `manifest_key` (load_manifest, then the
    /// overload above). Throws mws::Error: those of load_manifest and restore.
    mws_load_stats restore(const std::string &manifest_key, const Placement &placement,
                           const std::vector<Binding> &bindings, const IoArgs &args = {}) const {
        return restore(load_manifest(manifest_key), placement, bindings, args);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_store *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_store_free.
    mws_store *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_store, detail::Deleter<mws_store, mws_store_free>> handle_;
};

/// Buffers pinned and registered once for many uploads or loads (owns an
/// mws_registration_lease; see mws_registration_lease_new). Pass `get()` in
/// IoArgs::lease. Destroying an open lease closes it as MWS_TERMINAL_ABORTED; call
/// close() to report another state or to see errors.
/// Move-only; keeps its store's backend alive. Thread safety: uploads and loads using
/// one lease may run concurrently; close() waits until they returned.
class RegistrationLease {
public:
    /// Takes ownership of a lease handle (nullptr: an empty object).
    explicit RegistrationLease(mws_registration_lease *raw) noexcept : handle_(raw) {}

    /// Pins (guard: nullptr = static guard) and registers `fragment_ids` of `binding`.
    /// (mws_registration_lease_new with `store`'s backend, once; duplicates ignored;
    /// the guard vtable is copied and `guard_ctx` must stay valid until the lease is
    /// closed; `transfer_id` empty: a fresh random one.) The fragments' buffers must
    /// stay valid until the lease is closed. On failure the pin is released as
    /// aborted. Throws mws::Error: MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT (no
    /// fragments, invalid side or guard vtable), MWS_INVALID_BINDING,
    /// MWS_STALE_BINDING (unknown fragment, guard observed another binding),
    /// MWS_UNSUPPORTED (guard vtable version), MWS_STORE (guard or registration
    /// failure, pending registrations).
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
    /// (mws_registration_lease_close; waits for uploads and loads using the lease;
    /// later uses are refused with MWS_STALE_BINDING.) Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (invalid state; the lease stays open), MWS_STORE (an
    /// unregistration or the guard's release failed; the lease is closed anyway).
    void close(mws_terminal_state state = MWS_TERMINAL_COMPLETED) const {
        detail::check(mws_registration_lease_close(get(), static_cast<std::uint32_t>(state)));
    }
    /// Whether the lease is closed (mws_registration_lease_is_closed); false when empty.
    bool closed() const { return mws_registration_lease_is_closed(get()) == 1; }

    /// IoArgs using this lease.
    /// (Only IoArgs::lease is set; the result borrows this lease's handle.)
    IoArgs io_args() const {
        IoArgs a;
        a.lease = get();
        return a;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_registration_lease *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller closes and frees the result
    /// (mws_registration_lease_close, mws_registration_lease_free).
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
/// Move-only; keeps the store alive and holds its own copy of the plan. Thread
/// safety: every member may be called from several threads; the library holds a mutex
/// for the whole call (I/O included), so uploads through one transaction never run in
/// parallel. Guard callbacks must not call into the same transaction.
class Transaction {
public:
    /// Takes ownership of a transaction handle (nullptr: an empty object).
    explicit Transaction(mws_transaction *raw) noexcept : handle_(raw) {}

    /// Starts a transaction of `plan` in `store` (no I/O; keeps the store alive and
    /// copies the plan).
    /// (mws_transaction_new; several transactions over one plan are the same store
    /// transaction.) Throws mws::Error: MWS_NULL_ARGUMENT (an empty store or plan).
    static Transaction begin(const Store &store, const UploadPlan &plan) {
        mws_transaction *raw = nullptr;
        detail::check(mws_transaction_new(store.get(), plan.get(), &raw));
        return Transaction(raw);
    }

    /// Uploads `binding`'s participant (see mws_store_upload) and keeps its receipts.
    /// (mws_transaction_upload; `placement` is the plan's source placement.) A failed
    /// upload adds no receipts and leaves the transaction open; uploading a
    /// participant twice makes the commit fail. Buffers and `args` as Store::upload.
    /// Throws mws::Error: those of Store::upload, plus MWS_CONFLICT (committed or
    /// aborted; nothing is uploaded).
    void upload(const Placement &placement, const Binding &binding, const IoArgs &args = {}) {
        mws_io_args a = args.c();
        detail::check(mws_transaction_upload(get(), placement.get(), binding.get(), &a));
    }
    /// Uploads several participants of this process in one call (see
    /// mws_transaction_upload_many): every check first, then one stream of put batches.
    /// `leases` is empty (none) or has one entry per binding (nullptr: that binding is
    /// pinned through `args.guard`); `args.lease` must be nullptr. Borrows every
    /// argument for the call only; thread safety as upload. Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (`leases` of the wrong length, a participant or lease given
    /// twice, `args.lease` set), MWS_NULL_ARGUMENT (a null entry in `bindings`), and
    /// those of upload. Check errors come before any payload is written; a failure
    /// adds no receipts, leaves the transaction open and never deletes payloads.
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
    /// (mws_transaction_add_receipts copies them; checked against the plan at commit.)
    /// Throws mws::Error: MWS_NULL_ARGUMENT (empty `receipts`), MWS_CONFLICT
    /// (committed or aborted).
    void add_receipts(const Receipts &receipts) { detail::check(mws_transaction_add_receipts(get(), receipts.get())); }
    /// A copy of every receipt held now (send it with Receipts::to_json()).
    /// (mws_transaction_receipts; in the order they came.) Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty object).
    Receipts receipts() const {
        mws_receipts *out = nullptr;
        detail::check(mws_transaction_receipts(get(), &out));
        return Receipts(out);
    }
    /// Commits with every receipt held; once committed, returns the same manifest again.
    /// (mws_transaction_commit; a failed commit leaves the transaction open; see
    /// commit_decision_may_exist() before aborting.) Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (receipts missing, duplicated or not of the plan),
    /// MWS_STORE (retryable), MWS_CONFLICT (aborted, the store transaction chose abort
    /// or lost to a conflicting revision).
    StoredManifest commit() {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_transaction_commit(get(), &out));
        return StoredManifest(out);
    }
    /// True once a commit may have written the commit decision (never abort then).
    /// (mws_transaction_commit_decision_may_exist; stays true once set; false when empty.)
    bool commit_decision_may_exist() const { return mws_transaction_commit_decision_may_exist(get()) == 1; }
    /// The state of this handle (mws_transaction_get_state; MWS_TRANSACTION_OPEN when
    /// empty). It reflects only calls on this handle: Store::read_decision reads the
    /// store.
    mws_transaction_state state() const { return mws_transaction_get_state(get()); }
    /// Records abort and removes the payloads; a no-op once aborted.
    /// (mws_transaction_abort; also when no upload succeeded. On failure the
    /// transaction stays open.) Throws mws::Error: MWS_CONFLICT (committed, or the
    /// store transaction is committed or published: retry the commit instead),
    /// MWS_STORE (cleanup failed; retry), MWS_INVALID_ARGUMENT (added receipts not of
    /// the plan).
    void abort() { detail::check(mws_transaction_abort(get())); }
    /// Idempotent recovery of the store transaction (see mws_store_finalize_upload).
    /// (mws_transaction_finalize; does not change state().) Throws mws::Error:
    /// MWS_CONFLICT (no terminal decision yet, or one of another plan), MWS_STORE
    /// (retryable).
    void finalize() const { detail::check(mws_transaction_finalize(get())); }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    mws_transaction *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_transaction_free.
    mws_transaction *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_transaction, detail::Deleter<mws_transaction, mws_transaction_free>> handle_;
};

inline StoredManifest Store::snapshot(const Placement &placement, const std::vector<Binding> &bindings,
                                      const IoArgs &args, const UploadOptions &options) const {
    UploadOptions o = options;
    if (!o.key_prefix) o.key_prefix = std::string(key_prefix());
    const UploadPlan plan = plan_upload(placement, bindings, o);
    Transaction tx = Transaction::begin(*this, plan);
    std::vector<const Binding *> ptrs;
    ptrs.reserve(bindings.size());
    for (const Binding &b : bindings) ptrs.push_back(&b);
    try {
        tx.upload_many(placement, ptrs, {}, args);
        return tx.commit();
    } catch (...) {
        if (!tx.commit_decision_may_exist()) {
            try {
                tx.abort();
            } catch (const Error &) {
                // best effort: the original error is the one to report
            }
            throw;
        }
    }
    return tx.commit();  // the commit decision may exist: retry once, never abort
}

/// A snapshot in progress (owns an mws_writer; destroying an open Writer aborts it).
/// One upload plan written tensor by tensor; each participant is uploaded once all its
/// fragments were written. Move-only; keeps its store alive. The abort on destruction
/// is best effort (errors dropped; left for Store::finalize_upload when the commit
/// decision may exist). Thread safety: calls are serialized by the library, so the
/// const members may run on several threads (the adapter callbacks then run on
/// whichever thread calls); set_progress() and release() must not race with each
/// other.
class Writer {
public:
    /// Takes ownership of a writer handle (nullptr: an empty object).
    explicit Writer(mws_writer *raw) noexcept : handle_(raw) {}

    /// Begins a snapshot (see mws_writer_new). `adapter` is copied; `ctx` must
    /// outlive the Writer.
    /// Calls the adapter's export_source once, checks the identity and plans the
    /// upload (no store I/O); only options.transaction_id and options.created_at are
    /// used (the key prefix comes from the store). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (descriptor, identity mismatch, adapter failure, vtable
    /// size), MWS_UNSUPPORTED (vtable version), MWS_INVALID_BINDING.
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
    /// (mws_writer_write_tensor; `tensor` is opaque, passed to the adapter's
    /// resolve_fragment_ids; the receipts may be empty.) Errors after the fragments
    /// were resolved abort the writer. Throws mws::Error: MWS_INVALID_ARGUMENT
    /// (unknown or duplicate fragment), MWS_CONFLICT (writer closed), the upload
    /// errors of Store::upload.
    Receipts write_tensor(const std::string &tensor_id, void *tensor) const {
        mws_receipts *r = nullptr;
        detail::check(mws_writer_write_tensor(get(), tensor_id.c_str(), tensor, &r));
        return Receipts(r);
    }
    /// Defers the uploads to commit() (true) or not (false, the default;
    /// mws_writer_defer_uploads): deferred, write_tensor() returns no receipts and
    /// commit() uploads every participant in one upload call; the source buffers must
    /// stay unchanged until commit() returns. Throws mws::Error: MWS_CONFLICT (writer
    /// closed).
    void defer_uploads(bool defer = true) const { detail::check(mws_writer_defer_uploads(get(), defer ? 1 : 0)); }
    /// Publishes the snapshot's manifest (mws_writer_commit). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (missing fragments; the writer is aborted), MWS_STORE
    /// (transaction error; the writer stays open for a retry).
    StoredManifest commit() const {
        mws_stored_manifest *out = nullptr;
        detail::check(mws_writer_commit(get(), &out));
        return StoredManifest(out);
    }
    /// Aborts the snapshot: records the abort and removes its payloads; a no-op on a
    /// closed writer (mws_writer_abort). Throws mws::Error: MWS_CONFLICT when the
    /// commit decision may exist (the writer stays open: retry commit() instead).
    void abort() const { detail::check(mws_writer_abort(get())); }
    /// A copy of the writer's upload plan: its operations say which tensors and
    /// participants the snapshot expects (mws_writer_upload_plan). Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty object).
    UploadPlan upload_plan() const {
        mws_upload_plan *out = nullptr;
        detail::check(mws_writer_upload_plan(get(), &out));
        return UploadPlan(out);
    }
    /// Reports the snapshot's uploads (totals: the whole plan) to `progress` from now
    /// on (see mws_writer_set_progress); an empty function removes it. The Writer keeps
    /// the function.
    /// The previous function is destroyed once the library no longer uses it (the call
    /// waits for a running write_tensor). Throws mws::Error: MWS_NULL_ARGUMENT (empty
    /// object; the previous callback stays). Must not race with another set_progress()
    /// or release() on this Writer.
    void set_progress(ProgressCallback progress) {
        auto next = progress ? std::make_unique<ProgressCallback>(std::move(progress)) : nullptr;
        detail::check(mws_writer_set_progress(get(), next ? &detail::progress_trampoline : nullptr, next.get()));
        progress_ = std::move(next);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_writer *get() const noexcept { return handle_.get(); }
    /// Releases the handle: the caller frees the result with mws_writer_free.
    /// A function given to set_progress() is owned by this Writer, so release() first
    /// removes it from the handle (the released handle reports no progress until
    /// mws_writer_set_progress sets a callback) and destroys it. Waits for a running
    /// write_tensor; must not race with set_progress().
    mws_writer *release() noexcept {
        if (progress_ && handle_) {
            // Cannot fail for a live handle; the function below must not stay set on it.
            (void)mws_writer_set_progress(handle_.get(), nullptr, nullptr);
        }
        progress_.reset();
        return handle_.release();
    }

private:
    // Declared before the handle: destroyed after it.
    std::unique_ptr<ProgressCallback> progress_;
    std::unique_ptr<mws_writer, detail::Deleter<mws_writer, mws_writer_free>> handle_;
};

// ---- live transfer ---------------------------------------------------------------

/// A live-transfer plan (owns an mws_transfer_plan): logical (address-free, from two
/// placements) or bound to source and target runtime bindings. Immutable; accessor
/// results borrow from the plan and stay valid while it lives.
/// Move-only; copies everything it needs (placements and bindings may be destroyed
/// after creation). Thread safety: every const member may run on several threads.
class TransferPlan {
public:
    /// Takes ownership of a transfer plan handle (nullptr: an empty object).
    explicit TransferPlan(mws_transfer_plan *raw) noexcept : handle_(raw) {}

    /// Plans `source` -> `target` (every target participant, or only `target_participant`).
    /// (mws_transfer_plan_new; pure; `limits` nullptr = defaults.) Returns a logical
    /// plan. Throws mws::Error: MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT (identity,
    /// tensor sets, descriptors, unknown participant, coverage), MWS_LIMIT_EXCEEDED.
    static TransferPlan plan(const Placement &source, const Placement &target,
                             const std::optional<std::string> &target_participant = std::nullopt,
                             const mws_planning_limits *limits = nullptr) {
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_new(source.get(), target.get(), detail::c_str_or_null(target_participant),
                                            limits, &out));
        return TransferPlan(out);
    }

    /// Restores a logical plan from its transport JSON.
    /// (mws_transfer_plan_from_json: re-planned from the shipped placements and
    /// compared with the shipped regions and executors.) Throws mws::Error:
    /// MWS_INVALID_UTF8, MWS_INVALID_ARGUMENT, MWS_LIMIT_EXCEEDED.
    static TransferPlan from_json(std::string_view json) {
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_from_json(json.data(), json.size(), &out));
        return TransferPlan(out);
    }

    /// Binds this logical plan to target and source bindings (a new, bound plan).
    /// (mws_transfer_plan_bind; the bindings are copied; this plan is unchanged.)
    /// Throws mws::Error: MWS_NULL_ARGUMENT (a nullptr element), MWS_INVALID_BINDING,
    /// MWS_INVALID_ARGUMENT (already bound; missing or foreign bindings, overlapping
    /// ranges, in-place reshard, conflicting target ranges), MWS_LIMIT_EXCEEDED.
    TransferPlan bind(const std::vector<const Binding *> &targets, const std::vector<const Binding *> &sources) const {
        std::vector<const mws_binding *> t, s;
        for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
        for (const Binding *b : sources) s.push_back(b != nullptr ? b->get() : nullptr);
        mws_transfer_plan *out = nullptr;
        detail::check(mws_transfer_plan_bind(get(), t.data(), t.size(), s.data(), s.size(), &out));
        return TransferPlan(out);
    }

    /// Whether the plan is bound (mws_transfer_plan_is_bound); false when empty.
    bool is_bound() const { return mws_transfer_plan_is_bound(get()) == 1; }
    /// Regions (= operations of a bound plan; mws_transfer_plan_region_count); 0 when empty.
    std::size_t region_count() const { return mws_transfer_plan_region_count(get()); }
    /// Bytes the plan moves (mws_transfer_plan_total_bytes); 0 when empty.
    std::uint64_t total_bytes() const { return mws_transfer_plan_total_bytes(get()); }
    /// The transport JSON (mws_transfer_plan_to_json; logical or bound form, no
    /// absolute address; built on first use). Borrowed.
    std::string_view to_json() const {
        std::size_t len = 0;
        const char *p = mws_transfer_plan_to_json(get(), &len);
        return detail::view(p, len);
    }
    /// Region `index` (mws_transfer_plan_region; pointers borrowed from this plan).
    /// Throws mws::Error: MWS_INVALID_ARGUMENT (index >= region_count()).
    mws_transfer_region_info region(std::size_t index) const {
        mws_transfer_region_info info{};
        detail::check(mws_transfer_plan_region(get(), index, &info));
        return info;
    }
    /// Bound plans only.
    /// Operation `index` with both sides (mws_transfer_plan_operation; pointers
    /// borrowed). Throws mws::Error: MWS_INVALID_ARGUMENT (logical plan, index out of
    /// range).
    mws_transfer_operation_info operation(std::size_t index) const {
        mws_transfer_operation_info info{};
        detail::check(mws_transfer_plan_operation(get(), index, &info));
        return info;
    }
    /// Executors on `side`: per participant (logical) or per (participant, worker)
    /// (bound) (mws_transfer_plan_executor_count); 0 when empty or for an invalid side.
    std::size_t executor_count(mws_transfer_side side) const {
        return mws_transfer_plan_executor_count(get(), static_cast<std::uint32_t>(side));
    }
    /// Executor `index` of `side`, sorted by rank then worker
    /// (mws_transfer_plan_executor; pointers borrowed). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (side, index).
    mws_transfer_executor_info executor(mws_transfer_side side, std::size_t index) const {
        mws_transfer_executor_info info{};
        detail::check(mws_transfer_plan_executor(get(), static_cast<std::uint32_t>(side), index, &info));
        return info;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_transfer_plan *get() const noexcept { return handle_.get(); }
    /// Gives up ownership: the caller frees the result with mws_transfer_plan_free.
    mws_transfer_plan *release() noexcept { return handle_.release(); }

private:
    std::unique_ptr<mws_transfer_plan, detail::Deleter<mws_transfer_plan, mws_transfer_plan_free>> handle_;
};

/// The verdict of a live call for one target participant (mws_target_outcome, copied).
struct TargetOutcome {
    /// The target participant.
    std::string participant_id;
    /// The weight generation of the call (or step).
    std::uint64_t weight_generation = 0;
    /// Updated, unchanged or torn.
    mws_target_verdict verdict = MWS_TARGET_UNCHANGED;
};

/// What a live call did, successful or not (mws_live_report, copied): whether anything
/// was submitted to the engine (false proves nothing was written), how the guards'
/// pins were released, the pending transfer holding its resources (empty: none), the
/// verdict per target participant it writes, and its statistics.
struct LiveReport {
    /// Whether any batch was handed to the engine.
    bool submitted = false;
    /// How the guards' pins were released.
    mws_guard_release guard_release = MWS_GUARD_NOT_PINNED;
    /// The pending transfer holding the call's resources (empty: none).
    std::string pending_transfer_id;
    /// The verdict per target participant the call writes.
    std::vector<TargetOutcome> targets;
    /// The call's statistics (zero on failure).
    mws_transfer_stats stats{};

    /// The copy of a C report.
    static LiveReport from(const mws_live_report &r) {
        LiveReport out;
        out.submitted = r.submitted != 0;
        out.guard_release = static_cast<mws_guard_release>(r.guard_release);
        if (r.pending_transfer_id != nullptr) out.pending_transfer_id = r.pending_transfer_id;
        for (std::size_t i = 0; i < r.n_targets; ++i)
            out.targets.push_back({r.targets[i].participant_id, r.targets[i].weight_generation,
                                   static_cast<mws_target_verdict>(r.targets[i].verdict)});
        out.stats = r.stats;
        return out;
    }
};

/// A transfer engine (owns an mws_transfer_engine): the embedded LocalEngine or a
/// caller's vtable (for example Mooncake's TransferEngine).
/// Move-only (no release()); loaders and sinks keep it alive, so it may be destroyed
/// before them. Thread safety: every member may run on several threads at once.
class TransferEngine {
public:
    /// Takes ownership of an engine handle (nullptr: an empty object).
    explicit TransferEngine(mws_transfer_engine *raw) noexcept : handle_(raw) {}

    /// The embedded engine: memcpy between memory registered in this process; device
    /// memory is refused at registration (mws_transfer_engine_new_local; see
    /// local(const DeviceEngine &)). Throws
    /// mws::Error only if the library fails (MWS_PANIC).
    static TransferEngine local() {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_new_local(&out));
        return TransferEngine(out);
    }
    /// The embedded engine with a device engine: as local(), and device memory may be
    /// registered too; its bytes move only through `device` (one batch per direction
    /// and device, coalesced into 2-D copies). The engine keeps its own reference to
    /// `device`, which may be destroyed afterwards (mws_transfer_engine_new_local_device).
    /// Throws mws::Error: MWS_NULL_ARGUMENT (empty `device`).
    static TransferEngine local(const DeviceEngine &device) {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_new_local_device(device.get(), &out));
        return TransferEngine(out);
    }
    /// `vt` is copied; `ctx` must outlive the engine and every loader or sink made from it.
    /// (mws_transfer_engine_from_vtable; the callbacks must be thread-safe and never
    /// throw.) Throws mws::Error: MWS_INVALID_ARGUMENT (size, a required callback is
    /// NULL), MWS_UNSUPPORTED (version).
    static TransferEngine from_vtable(const mws_transfer_engine_vtable &vt, void *ctx) {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_from_vtable(&vt, ctx, &out));
        return TransferEngine(out);
    }
    /// As from_vtable(vt, ctx), with a device engine through which the library reads
    /// and writes the device buffers of this engine's transfers on the host (content
    /// checksums of verified steps, staging of delta steps); the caller's engine still
    /// moves every transferred byte. The engine keeps its own reference to `device`
    /// (mws_transfer_engine_from_vtable_device). Throws mws::Error: as from_vtable;
    /// MWS_NULL_ARGUMENT (empty `device`).
    static TransferEngine from_vtable(const mws_transfer_engine_vtable &vt, void *ctx, const DeviceEngine &device) {
        mws_transfer_engine *out = nullptr;
        detail::check(mws_transfer_engine_from_vtable_device(&vt, ctx, device.get(), &out));
        return TransferEngine(out);
    }

    /// The owner's registration of a whole allocation (valid until unregistered).
    /// (mws_transfer_engine_register_memory; `memory_kind` an mws_memory_kind value,
    /// `device` the ordinal for device memory. The memory must stay valid until it is
    /// unregistered.) Throws mws::Error: MWS_INVALID_ARGUMENT (memory kind, zero
    /// length), MWS_STORE (the engine refused: overlap, device memory on an embedded
    /// engine without a device engine, or the engine's code).
    void register_memory(const void *address, std::uint64_t len, std::uint32_t memory_kind = MWS_MEMORY_HOST,
                         std::uint32_t device = 0) const {
        detail::check(mws_transfer_engine_register_memory(get(), address, len, memory_kind, device));
    }
    /// Unregisters the region registered at `address`
    /// (mws_transfer_engine_unregister_memory). Throws mws::Error: MWS_STORE (the
    /// engine's code).
    void unregister_memory(const void *address) const {
        detail::check(mws_transfer_engine_unregister_memory(get(), address));
    }
    /// Pending transfers (completion unknown, or quarantined registrations) that block
    /// the engine (mws_transfer_engine_pending_count); 0 when empty.
    std::size_t pending_count() const { return mws_transfer_engine_pending_count(get()); }
    /// Drains every pending transfer once; returns how many remain.
    /// (mws_transfer_engine_drain, `timeout_ms` per transfer.) Throws mws::Error:
    /// MWS_STORE (a drain failed; the transfer stays pending).
    std::size_t drain(std::uint64_t timeout_ms = 1000) const {
        std::size_t remaining = 0;
        detail::check(mws_transfer_engine_drain(get(), timeout_ms, &remaining));
        return remaining;
    }
    /// What the engine still holds: its registered regions (when it can list them),
    /// its pending transfers and the registrations and pins they hold
    /// (mws_transfer_engine_resources). Throws mws::Error: MWS_NULL_ARGUMENT (empty
    /// object), MWS_STORE (the engine identity cannot be read).
    mws_engine_resources resources() const {
        mws_engine_resources r{};
        detail::check(mws_transfer_engine_resources(get(), &r));
        return r;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_transfer_engine *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_transfer_engine, detail::Deleter<mws_transfer_engine, mws_transfer_engine_free>> handle_;
};

/// A rotated runtime lease of one prepared binding (the strings of an
/// mws_lease_rotation): its owner moved the lease on while the buffers stayed where
/// they were prepared.
struct LeaseRotation {
    /// The binding's instance (as prepared).
    std::string instance_id;
    /// The binding's participant.
    std::string participant_id;
    /// The new lease id.
    std::string lease_id;
    /// The new lease generation.
    std::uint64_t lease_generation = 0;
};

namespace detail {
/// A started step's completion callback on the heap, handed to C as `user_data`:
/// `trampoline` runs it once and deletes it; `release` hands it over once the start
/// succeeded (before that, the unique_ptr deletes it).
struct StepDone {
    using Fn = std::function<void(mws_status)>;
    std::unique_ptr<Fn> fn;
    explicit StepDone(Fn f) : fn(f ? new Fn(std::move(f)) : nullptr) {}
    mws_step_callback callback() const { return fn ? &trampoline : nullptr; }
    void *user_data() const { return fn.get(); }
    void release() { (void)fn.release(); }
    static void trampoline(void *user_data, mws_status status) {
        std::unique_ptr<Fn> f(static_cast<Fn *>(user_data));
        try {
            (*f)(status);
        } catch (...) {
            // A callback must not throw across the C ABI: the exception is dropped.
        }
    }
};
}  // namespace detail

/// A step of a live prepared transfer started without blocking
/// (PreparedTransfer::start_step; owns an mws_step_handle). Move-only. Destroying it
/// does not stop the step: it runs to its end on the library's step driver, and the
/// buffers it moves stay in use until then (cancel() and wait() first to stop it
/// early). Thread safety: every method may be called from any thread.
class StepHandle {
public:
    /// Takes ownership of a step handle (nullptr: an empty object).
    explicit StepHandle(mws_step_handle *raw) noexcept : handle_(raw) {}

    /// True once the step ended (mws_step_handle_poll); never blocks. Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object).
    bool poll() const {
        std::uint32_t finished = 0;
        detail::check(mws_step_handle_poll(get(), &finished));
        return finished != 0;
    }
    /// Waits up to `timeout` for the step to end (mws_step_handle_wait): std::nullopt
    /// while it still runs, its statistics once it ended. Throws mws::Error: the
    /// step's error once it ended failing (as PreparedTransfer::step would).
    template <class Rep, class Period>
    std::optional<mws_transfer_stats> wait_for(std::chrono::duration<Rep, Period> timeout) const {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
        return wait_ms(ms < 0 ? 0 : static_cast<std::uint64_t>(ms));
    }
    /// Waits for the step to end, without a limit; returns its statistics. Throws
    /// mws::Error: the step's error.
    mws_transfer_stats wait() const { return *wait_ms(UINT64_MAX); }
    /// Stops the step before its next batch (mws_step_handle_cancel; a running batch
    /// completes); it then ends with MWS_STORE ("... cancelled ...") unless it
    /// already ended. Does not wait.
    void cancel() const { detail::check(mws_step_handle_cancel(get())); }
    /// The report of the ended step, successful or not (mws_step_handle_report),
    /// copied. Throws mws::Error: MWS_NOT_FOUND (not ended yet).
    LiveReport report() const {
        mws_live_report r{};
        detail::check(mws_step_handle_report(get(), &r));
        return LiveReport::from(r);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_step_handle *get() const noexcept { return handle_.get(); }

private:
    std::optional<mws_transfer_stats> wait_ms(std::uint64_t ms) const {
        std::uint32_t finished = 0;
        mws_transfer_stats stats{};
        detail::check(mws_step_handle_wait(get(), ms, &finished, &stats));
        if (finished == 0)
            return std::nullopt;
        return stats;
    }
    std::unique_ptr<mws_step_handle, detail::Deleter<mws_step_handle, mws_step_handle_free>> handle_;
};

/// How a started sink step notifies its targets (PreparedTransfer::start_step), as
/// the arguments of PreparedTransfer::step_notified.
struct StepNotify {
    /// `key`, `verify_content` and `held` as the members below.
    StepNotify(std::string key = {}, bool verify_content = false,
               std::optional<std::map<std::string, std::uint64_t>> held = std::nullopt)
        : key(std::move(key)), verify_content(verify_content), held(std::move(held)) {}
    /// Empty: unkeyed; else the key shared with the targets' acceptors (>= 16 bytes).
    std::string key;
    /// The `done` carries the CRC-32C of the bytes sent into each target.
    bool verify_content = false;
    /// A delta step (implies verify_content): what each target participant
    /// verifiably holds (NotifyAcceptor::held_generation on the target side).
    std::optional<std::map<std::string, std::uint64_t>> held;
};

/// The outbox of one source executor for pulled delta steps (mws_delta_outbox):
/// DeltaPublisher::outbox() on the source side, PreparedTransfer::enable_delta_pull()
/// on the readers' side.
struct DeltaOutbox {
    /// The source executor's participant.
    std::string participant_id;
    /// The source executor's worker.
    std::string worker_id;
    /// First byte (a source-side host address).
    std::uint64_t address = 0;
    /// Bytes.
    std::uint64_t capacity = 0;
};

/// A live transfer prepared once for many steps (owns an mws_prepared_transfer), made
/// by Sink::prepare or Loader::prepare_live: each step() moves one weight generation
/// through the prepared batches after the freshness checks. Move-only; keeps its
/// engine alive; its steps go through the sink's or loader's cancellation flag and
/// progress callback while that object lives. Destroying it unregisters the memory
/// the preparation registered.
class PreparedTransfer {
public:
    /// Takes ownership of a prepared transfer handle (nullptr: an empty object).
    explicit PreparedTransfer(mws_prepared_transfer *raw) noexcept : handle_(raw) {}

    /// Every prepared buffer, local and remote, must be valid at its prepared address
    /// for the step (and, when completion is unknown, until the pending transfer is
    /// drained). Moves one weight generation (mws_prepared_transfer_step; `leases`:
    /// rotated since the last step, kept for later steps; `transfer_id` nullptr: a
    /// fresh one). Returns the step's statistics. Throws mws::Error:
    /// MWS_STALE_BINDING ("prepared transfer is stale: ...; prepare the transfer
    /// again": engine restart, new instance, another placement, lease, generation,
    /// moved or freed buffers, registrations held by a pending transfer),
    /// MWS_INVALID_ARGUMENT (a rotation names no prepared binding), MWS_STORE (closed,
    /// cancelled, engine failures, completion unknown).
    mws_transfer_stats step(std::uint64_t weight_generation, const std::vector<LeaseRotation> &leases = {},
                            const char *transfer_id = nullptr) const {
        std::vector<mws_lease_rotation> l;
        for (const LeaseRotation &r : leases)
            l.push_back({r.instance_id.c_str(), r.participant_id.c_str(), r.lease_id.c_str(), r.lease_generation});
        mws_step_args args{weight_generation, l.empty() ? nullptr : l.data(), l.size(), transfer_id, nullptr};
        mws_transfer_stats stats{};
        detail::check(mws_prepared_transfer_step(get(), &args, &stats));
        return stats;
    }
    /// step() of a prepared sink with the notify hook
    /// (mws_prepared_transfer_step_notified): `begin` to every target endpoint, the
    /// prepared batches, `done` when they completed, each carrying this step's weight
    /// generation. `key` empty: unkeyed, else the key shared with the targets'
    /// acceptors (at least 16 bytes). `verify_content`: the `done` carries the
    /// CRC-32C of the bytes sent into each target (host source buffers only), which a
    /// verifying NotifyAcceptor checks. Throws mws::Error: as step(); MWS_INVALID_ARGUMENT
    /// (a prepared reader or restore, a short key), MWS_UNSUPPORTED (the engine cannot
    /// notify, a verified step of device memory), MWS_STORE (a begin could not be
    /// delivered: nothing written; a done could not: bytes landed, targets torn).
    mws_transfer_stats step_notified(std::uint64_t weight_generation, std::string_view key = {},
                                     bool verify_content = false, const std::vector<LeaseRotation> &leases = {},
                                     const char *transfer_id = nullptr) const {
        std::vector<mws_lease_rotation> l;
        for (const LeaseRotation &r : leases)
            l.push_back({r.instance_id.c_str(), r.participant_id.c_str(), r.lease_id.c_str(), r.lease_generation});
        mws_step_args args{weight_generation, l.empty() ? nullptr : l.data(), l.size(), transfer_id, nullptr};
        mws_transfer_stats stats{};
        detail::check(mws_prepared_transfer_step_notified(
            get(), &args, key.empty() ? nullptr : reinterpret_cast<const std::uint8_t *>(key.data()), key.size(),
            verify_content ? MWS_STEP_VERIFY_CONTENT : 0u, &stats));
        return stats;
    }
    /// Every prepared buffer, local and remote, must stay valid at its prepared
    /// address until the step ended. Starts step() (or, with `notify`, step_notified()
    /// of a prepared sink) without blocking (mws_prepared_transfer_step_start) and
    /// returns its handle; `on_complete` (empty: none) runs once when the step ended,
    /// on the library's step driver thread, with the step's status: it must be quick
    /// and must not throw. A step started while another step of this transfer runs
    /// ends at once with MWS_INVALID_ARGUMENT. Throws mws::Error (nothing started):
    /// MWS_INVALID_ARGUMENT (a prepared restore, a short key).
    StepHandle start_step(std::uint64_t weight_generation, const std::optional<StepNotify> &notify = std::nullopt,
                          std::function<void(mws_status)> on_complete = {},
                          const std::vector<LeaseRotation> &leases = {}, const char *transfer_id = nullptr) const {
        std::vector<mws_lease_rotation> l;
        for (const LeaseRotation &r : leases)
            l.push_back({r.instance_id.c_str(), r.participant_id.c_str(), r.lease_id.c_str(), r.lease_generation});
        mws_step_args args{weight_generation, l.empty() ? nullptr : l.data(), l.size(), transfer_id, nullptr};
        mws_step_notify n{};
        std::vector<mws_target_held> held;
        if (notify) {
            n.key = notify->key.empty() ? nullptr : reinterpret_cast<const std::uint8_t *>(notify->key.data());
            n.key_len = notify->key.size();
            n.flags = notify->verify_content ? MWS_STEP_VERIFY_CONTENT : 0u;
            if (notify->held) {
                for (const auto &h : *notify->held) held.push_back({h.first.c_str(), h.second});
                n.flags |= MWS_STEP_DELTA;
                n.held = held.empty() ? nullptr : held.data();
                n.n_held = held.size();
            }
        }
        detail::StepDone done(std::move(on_complete));
        mws_step_handle *raw = nullptr;
        detail::check(mws_prepared_transfer_step_start(get(), &args, notify ? &n : nullptr, done.callback(),
                                                       done.user_data(), &raw));
        done.release();  // the step owns it now: the trampoline deletes it after its one call
        return StepHandle(raw);
    }
    /// Enables delta steps of a prepared sink (mws_prepared_transfer_enable_delta):
    /// `inboxes` maps every target participant it writes to its inbox (address,
    /// capacity: a host buffer of the target side, registered with the target's
    /// engine; others are ignored). Keeps a host copy of the bytes it sends and one
    /// registered outbox per target until closed. Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (a reader, a target without an inbox, a slot under 64
    /// bytes), MWS_UNSUPPORTED (device memory), MWS_STORE (registration refused).
    void enable_delta(const std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> &inboxes) const {
        std::vector<mws_delta_inbox> v;
        for (const auto &i : inboxes) v.push_back({i.first.c_str(), i.second.first, i.second.second});
        detail::check(mws_prepared_transfer_enable_delta(get(), v.empty() ? nullptr : v.data(), v.size()));
    }
    /// A delta step (mws_prepared_transfer_step_delta): step_notified(..., true) but
    /// each target whose `held` generation is the source's base gets only the changed
    /// elements, the others every byte. Throws mws::Error: as step_notified();
    /// MWS_INVALID_ARGUMENT (delta steps not enabled).
    mws_transfer_stats step_delta(std::uint64_t weight_generation, const std::map<std::string, std::uint64_t> &held,
                                  std::string_view key = {}) const {
        std::vector<mws_target_held> h;
        for (const auto &x : held) h.push_back({x.first.c_str(), x.second});
        mws_step_args args{weight_generation, nullptr, 0, nullptr, nullptr};
        mws_transfer_stats stats{};
        detail::check(mws_prepared_transfer_step_delta(
            get(), &args, key.empty() ? nullptr : reinterpret_cast<const std::uint8_t *>(key.data()), key.size(),
            h.empty() ? nullptr : h.data(), h.size(), &stats));
        return stats;
    }
    /// Enables pulled delta steps of a prepared reader
    /// (mws_prepared_transfer_enable_delta_pull): `outboxes` names the outbox of every
    /// source executor it reads (DeltaPublisher::outbox() on the source side; others
    /// are ignored). From then on every step reads the sources' publications first,
    /// pulls only the changed elements from the sources whose base it holds and every
    /// byte from the others, applies them and verifies the content. Keeps a
    /// registered staging buffer until destroyed. Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (a sink or restore, a source executor without an outbox,
    /// an outbox under its least capacity), MWS_UNSUPPORTED (device target buffers and
    /// no device engine), MWS_STORE (registration refused). A step then throws
    /// MWS_CONFLICT when a source has not published its generation (nothing moved)
    /// and MWS_INTEGRITY when the content does not match (the target torn; the next
    /// step pulls every byte).
    void enable_delta_pull(const std::vector<DeltaOutbox> &outboxes) const {
        std::vector<mws_delta_outbox> v;
        for (const DeltaOutbox &o : outboxes)
            v.push_back({o.participant_id.c_str(), o.worker_id.c_str(), o.address, o.capacity});
        detail::check(mws_prepared_transfer_enable_delta_pull(get(), v.empty() ? nullptr : v.data(), v.size()));
    }
    /// The generation a delta-enabled reader's buffers hold, verified against the
    /// sources' publications (mws_prepared_transfer_held_generation); std::nullopt
    /// when none (not enabled, before the first verified step, after a failed one).
    std::optional<std::uint64_t> held_generation() const {
        std::uint64_t g = 0;
        mws_status st = mws_prepared_transfer_held_generation(get(), &g);
        if (st == MWS_NOT_FOUND) return std::nullopt;
        detail::check(st);
        return g;
    }
    /// What the last delta step sent (mws_prepared_transfer_delta_stats); std::nullopt
    /// before the first.
    std::optional<mws_delta_stats> delta_stats() const {
        mws_delta_stats d{};
        mws_status st = mws_prepared_transfer_delta_stats(get(), &d);
        if (st == MWS_NOT_FOUND) return std::nullopt;
        detail::check(st);
        return d;
    }
    /// The target buffers must be valid and untouched by anyone else for the step.
    /// Restores revision `revision` (nullptr: the prepared one), weight generation
    /// `weight_generation`, of a prepared restore (Loader::prepare_stored;
    /// mws_prepared_transfer_step). Throws mws::Error: MWS_NOT_FOUND (nothing committed
    /// there), MWS_STALE_BINDING (another layout, freed or moved buffers: "prepare the
    /// transfer again"), and the errors of Store::load.
    mws_transfer_stats restore(std::uint64_t weight_generation, const char *revision = nullptr,
                               const char *transfer_id = nullptr) const {
        mws_step_args args{weight_generation, nullptr, 0, transfer_id, revision};
        mws_transfer_stats stats{};
        detail::check(mws_prepared_transfer_step(get(), &args, &stats));
        return stats;
    }
    /// The report of the last step, successful or not
    /// (mws_prepared_transfer_last_report), copied. Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty object), MWS_NOT_FOUND (no step yet).
    LiveReport last_report() const {
        mws_live_report r{};
        detail::check(mws_prepared_transfer_last_report(get(), &r));
        return LiveReport::from(r);
    }
    /// What one step does: nothing (empty), its batches, pinned bindings and bytes
    /// (mws_prepared_transfer_info). Throws mws::Error: MWS_NULL_ARGUMENT (empty object).
    mws_prepared_info info() const {
        mws_prepared_info i{};
        detail::check(mws_prepared_transfer_info(get(), &i));
        return i;
    }
    /// Unregisters the memory the preparation registered and refuses later steps
    /// (mws_prepared_transfer_close; idempotent). Throws mws::Error: MWS_STORE (an
    /// unregistration failed and is quarantined in a pending transfer).
    void close() const { detail::check(mws_prepared_transfer_close(get())); }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_prepared_transfer *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_prepared_transfer, detail::Deleter<mws_prepared_transfer, mws_prepared_transfer_free>> handle_;
};

/// Fills the buffers of one target participant from a live source (reader mode) or
/// from a stored revision (owns an mws_loader). One call at a time; cancel() from
/// any thread.
/// Move-only (no release()); keeps its engine alive. Unlike the C function,
/// set_progress() must not run while a load runs: it destroys the replaced function
/// at once, and a running load keeps the callback it started with.
class Loader {
public:
    /// Creates a loader on `engine` with `limits` (nullptr: defaults; mws_loader_new).
    /// Throws mws::Error: MWS_NULL_ARGUMENT (empty engine), MWS_INVALID_ARGUMENT
    /// (limits), MWS_STORE (the engine identity cannot be resolved).
    explicit Loader(const TransferEngine &engine, const mws_executor_limits *limits = nullptr) {
        mws_loader *out = nullptr;
        detail::check(mws_loader_new(engine.get(), limits, &out));
        handle_.reset(out);
    }

    /// `ctx` must stay valid while the callback is set; the callback must not throw.
    /// Sets (nullptr: clears) a C progress callback (mws_loader_set_progress) and
    /// destroys a function set by the other overload. Not while a load runs. Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object).
    void set_progress(mws_progress_fn progress, void *ctx) {
        detail::check(mws_loader_set_progress(get(), progress, ctx));
        progress_.reset();
    }
    /// Reports live and stored loads to `progress` (see mws_loader_set_progress); an
    /// empty function removes it. The Loader keeps the function.
    /// Stored loads whose io arguments bring their own callback use that one. Not
    /// while a load runs. Throws mws::Error: MWS_NULL_ARGUMENT (empty object; the
    /// previous callback stays).
    void set_progress(ProgressCallback progress) {
        auto next = progress ? std::make_unique<ProgressCallback>(std::move(progress)) : nullptr;
        detail::check(mws_loader_set_progress(get(), next ? &detail::progress_trampoline : nullptr, next.get()));
        progress_ = std::move(next);
    }
    /// Requests cancellation: the running and every later live load stops before its
    /// next batch and fails with MWS_STORE ("cancelled"); completed batches stay
    /// written (mws_loader_cancel). Any thread, any time.
    void cancel() const noexcept { mws_loader_cancel(get()); }
    /// Clears a cancellation request (mws_loader_reset_cancel). Any thread.
    void reset_cancel() const noexcept { mws_loader_reset_cancel(get()); }

    /// Pulls every operation of the local target executor of the bound `plan` into
    /// `local`'s buffers, reading from the sources through the engine
    /// (mws_loader_load_live). The remote source memory must be registered by its
    /// owners; every buffer stays valid for the call (and, when completion is unknown,
    /// until the pending transfer is drained). `args` nullptr: defaults. Throws
    /// mws::Error: MWS_NULL_ARGUMENT (a nullptr element), MWS_INVALID_BINDING,
    /// MWS_INVALID_ARGUMENT (logical plan, contract errors), MWS_LIMIT_EXCEEDED,
    /// MWS_STALE_BINDING (bindings or leases differ from the plan), MWS_STORE (engine
    /// failures, cancellation, completion unknown; see TransferEngine::drain).
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

    /// Every buffer must stay valid at its address until the step ended (a guard in
    /// `args` as long). load_live without blocking (mws_loader_load_live_start):
    /// prepared on this thread, its one step started on the library's step driver;
    /// `on_complete` as for PreparedTransfer::start_step. Throws mws::Error (nothing
    /// started): as prepare_live.
    StepHandle start_load_live(const TransferPlan &plan, const Placement &source,
                               const std::vector<const Binding *> &sources, const Placement &target,
                               const Binding &local, const mws_live_args *args = nullptr,
                               std::function<void(mws_status)> on_complete = {}) const {
        std::vector<const mws_binding *> s;
        for (const Binding *b : sources) s.push_back(b != nullptr ? b->get() : nullptr);
        detail::StepDone done(std::move(on_complete));
        mws_step_handle *out = nullptr;
        detail::check(mws_loader_load_live_start(get(), plan.get(), source.get(), s.data(), s.size(), target.get(),
                                                 local.get(), args, done.callback(), done.user_data(), &out));
        done.release();
        return StepHandle(out);
    }

    /// The local target buffers must stay valid at their addresses until the returned
    /// object is destroyed (they are registered with the engine until then, unless
    /// `args->local_pre_registered`); a guard in `args` must stay valid as long.
    /// Prepares load_live with these arguments for many steps
    /// (mws_loader_prepare_live): every check of the call under the pins, its batches
    /// lowered once. Throws mws::Error: as load_live before its first batch.
    PreparedTransfer prepare_live(const TransferPlan &plan, const Placement &source,
                                  const std::vector<const Binding *> &sources, const Placement &target,
                                  const Binding &local, const mws_live_args *args = nullptr) const {
        std::vector<const mws_binding *> s;
        for (const Binding *b : sources) s.push_back(b != nullptr ? b->get() : nullptr);
        mws_prepared_transfer *out = nullptr;
        detail::check(mws_loader_prepare_live(get(), plan.get(), source.get(), s.data(), s.size(), target.get(),
                                              local.get(), args, &out));
        return PreparedTransfer(out);
    }

    /// `store` and a guard in `args` are kept until the returned object is destroyed.
    /// Prepares restores of `local`'s part of `plan`'s layout from `store`, one revision
    /// or weight generation per PreparedTransfer::restore (mws_loader_prepare_stored;
    /// only `worker_id` and the guard of `args` are used). Throws mws::Error:
    /// MWS_INVALID_BINDING, MWS_STALE_BINDING (`local` is not one of the plan's bindings).
    PreparedTransfer prepare_stored(const Store &store, const LoadPlan &plan, const Binding &local,
                                    const mws_live_args *args = nullptr) const {
        mws_prepared_transfer *out = nullptr;
        detail::check(mws_loader_prepare_stored(get(), store.get(), plan.get(), local.get(), args, &out));
        return PreparedTransfer(out);
    }

    /// Restores the part of `plan` that belongs to `local` from `store`, as
    /// Store::load (same errors and buffer rules), honouring the cancellation flag
    /// (checked before the call) and the loader's progress callback unless `args`
    /// sets one (mws_loader_load_stored). `args` is the C struct (nullptr: defaults;
    /// use IoArgs::c() and keep the IoArgs alive for the call).
    mws_load_stats load_stored(const Store &store, const LoadPlan &plan, const Binding &local,
                               const mws_io_args *args = nullptr) const {
        mws_load_stats stats{};
        detail::check(mws_loader_load_stored(get(), store.get(), plan.get(), local.get(), args, &stats));
        return stats;
    }

    /// The statistics of the loader's last successful call (mws_loader_stats).
    /// Throws mws::Error: MWS_NULL_ARGUMENT (empty object).
    mws_transfer_stats stats() const {
        mws_transfer_stats s{};
        detail::check(mws_loader_stats(get(), &s));
        return s;
    }
    /// The report of the last live load, successful or not (mws_loader_last_report),
    /// copied. Throws mws::Error: MWS_NULL_ARGUMENT (empty object), MWS_NOT_FOUND (no
    /// live load yet).
    LiveReport last_report() const {
        mws_live_report r{};
        detail::check(mws_loader_last_report(get(), &r));
        return LiveReport::from(r);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_loader *get() const noexcept { return handle_.get(); }

private:
    // Declared before the handle: destroyed after it.
    std::unique_ptr<ProgressCallback> progress_;
    std::unique_ptr<mws_loader, detail::Deleter<mws_loader, mws_loader_free>> handle_;
};

/// A source worker's side of a live transfer: pushes its part of a bound plan into
/// the remote targets (owns an mws_sink).
/// Move-only (no release()); keeps its engine alive. One call at a time.
class Sink {
public:
    /// Creates a sink on `engine` with `limits` (nullptr: defaults; mws_sink_new).
    /// Throws mws::Error: as Loader's constructor.
    explicit Sink(const TransferEngine &engine, const mws_executor_limits *limits = nullptr) {
        mws_sink *out = nullptr;
        detail::check(mws_sink_new(engine.get(), limits, &out));
        handle_.reset(out);
    }

    /// Pushes every operation of the local source executor of the bound `plan` from
    /// `local`'s buffers into the remote targets (mws_sink_execute). The remote target
    /// memory must be registered by its owners; a source participant the plan does not
    /// read from succeeds with zero statistics. `args` nullptr: defaults. Throws
    /// mws::Error: as Loader::load_live, with the sides swapped.
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

    /// Every buffer must stay valid at its address until the step ended (a guard in
    /// `args` as long). execute without blocking (mws_sink_execute_start): prepared
    /// on this thread, its one step started on the library's step driver;
    /// `on_complete` as for PreparedTransfer::start_step. Throws mws::Error (nothing
    /// started): as prepare.
    StepHandle start_execute(const TransferPlan &plan, const Placement &source, const Binding &local,
                             const Placement &target, const std::vector<const Binding *> &targets,
                             const mws_live_args *args = nullptr,
                             std::function<void(mws_status)> on_complete = {}) const {
        std::vector<const mws_binding *> t;
        for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
        detail::StepDone done(std::move(on_complete));
        mws_step_handle *out = nullptr;
        detail::check(mws_sink_execute_start(get(), plan.get(), source.get(), local.get(), target.get(), t.data(),
                                             t.size(), args, done.callback(), done.user_data(), &out));
        done.release();
        return StepHandle(out);
    }

    /// The local source buffers must stay valid at their addresses until the returned
    /// object is destroyed (they are registered with the engine until then, unless
    /// `args->local_pre_registered`); a guard in `args` must stay valid as long.
    /// Prepares execute with these arguments for many steps (mws_sink_prepare): every
    /// check of the call under the pins, its batches lowered once; a source the plan
    /// does not read from prepares steps that do nothing. Throws mws::Error: as
    /// execute before its first batch.
    PreparedTransfer prepare(const TransferPlan &plan, const Placement &source, const Binding &local,
                             const Placement &target, const std::vector<const Binding *> &targets,
                             const mws_live_args *args = nullptr) const {
        std::vector<const mws_binding *> t;
        for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
        mws_prepared_transfer *out = nullptr;
        detail::check(mws_sink_prepare(get(), plan.get(), source.get(), local.get(), target.get(), t.data(), t.size(),
                                       args, &out));
        return PreparedTransfer(out);
    }

    /// Reports executions to `progress` (mws_sink_set_progress); an empty function
    /// removes it. The Sink keeps the function. Not while an execution runs. Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object; the previous callback stays).
    void set_progress(ProgressCallback progress) {
        auto next = progress ? std::make_unique<ProgressCallback>(std::move(progress)) : nullptr;
        detail::check(mws_sink_set_progress(get(), next ? &detail::progress_trampoline : nullptr, next.get()));
        progress_ = std::move(next);
    }
    /// Requests cancellation of the running and every later execution
    /// (mws_sink_cancel). Any thread, any time.
    void cancel() const noexcept { mws_sink_cancel(get()); }
    /// Clears a cancellation request (mws_sink_reset_cancel). Any thread.
    void reset_cancel() const noexcept { mws_sink_reset_cancel(get()); }
    /// The statistics of the sink's last successful call (mws_sink_stats). Throws
    /// mws::Error: MWS_NULL_ARGUMENT (empty object).
    mws_transfer_stats stats() const {
        mws_transfer_stats s{};
        detail::check(mws_sink_stats(get(), &s));
        return s;
    }
    /// The report of the last execution, successful or not (mws_sink_last_report),
    /// copied: one verdict per target participant it writes (for this call's share).
    /// Throws mws::Error: MWS_NULL_ARGUMENT (empty object), MWS_NOT_FOUND (no call
    /// yet).
    LiveReport last_report() const {
        mws_live_report r{};
        detail::check(mws_sink_last_report(get(), &r));
        return LiveReport::from(r);
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_sink *get() const noexcept { return handle_.get(); }

private:
    // Declared before the handle: destroyed after it.
    std::unique_ptr<ProgressCallback> progress_;
    std::unique_ptr<mws_sink, detail::Deleter<mws_sink, mws_sink_free>> handle_;
};

// ---------------------------------------------------------------------------------
// The notify hook (issue 27): a sink tells each target, through the transfer engine's
// own notify channel, what landed; the target checks it against its own bound plan.
// See docs/mooncake/LIVE-TRANSFER-ON-TE.md, "The notify hook".
// ---------------------------------------------------------------------------------

/// The notify name of this library's messages (mws_notify_name()): a serving
/// engine's notify poll hands messages with exactly this name to
/// NotifyAcceptor::accept. Does not throw; any thread.
inline std::string_view notify_name() { return mws_notify_name(); }

/// Sink::execute with the notify hook (mws_sink_execute_notified): stale checks (no
/// engine call), `begin` to every target endpoint the local executor writes, the sink
/// call, `done` to the same endpoints. `key` empty: unkeyed; else the key shared with
/// the targets' acceptors (at least 16 bytes). Throws mws::Error: as Sink::execute;
/// MWS_STALE_BINDING before any engine call, MWS_UNSUPPORTED when the engine cannot
/// notify, MWS_STORE when a begin (nothing written) or a done (bytes landed, target
/// stays torn) could not be delivered.
inline mws_transfer_stats sink_execute_notified(const Sink &sink, std::string_view key, const TransferPlan &plan,
                                                const Placement &source, const Binding &local,
                                                const Placement &target, const std::vector<const Binding *> &targets,
                                                const mws_live_args *args = nullptr) {
    std::vector<const mws_binding *> t;
    for (const Binding *b : targets) t.push_back(b != nullptr ? b->get() : nullptr);
    mws_transfer_stats stats{};
    detail::check(mws_sink_execute_notified(sink.get(), reinterpret_cast<const std::uint8_t *>(key.data()),
                                            key.size(), plan.get(), source.get(), local.get(), target.get(),
                                            t.data(), t.size(), args, &stats));
    return stats;
}

/// The target side of the notify hook for one participant under one bound plan
/// (owns an mws_notify_acceptor). Move-only. Thread safety: every member may run on
/// several threads at once (serialized inside).
class NotifyAcceptor {
public:
    /// An acceptor for `participant` under the bound `plan` (mws_notify_acceptor_new;
    /// `key` empty: unkeyed, else at least 16 bytes, copied). Throws mws::Error:
    /// MWS_INVALID_ARGUMENT (logical plan, short key, not a target participant).
    NotifyAcceptor(const TransferPlan &plan, const std::string &participant, std::string_view key = {}) {
        mws_notify_acceptor *out = nullptr;
        detail::check(mws_notify_acceptor_new(plan.get(), participant.c_str(),
                                              key.empty() ? nullptr : reinterpret_cast<const std::uint8_t *>(key.data()),
                                              key.size(), &out));
        handle_.reset(out);
    }

    /// Checks one received message (mws_notify_acceptor_accept). Returns the verdict
    /// (MWS_NOTIFY_ACCEPTED or the refusal); never throws on a refusal (the reason is
    /// in `*why` when given). `outcome`, when given, receives the outcome after it.
    std::uint32_t accept(std::string_view message, mws_notify_outcome *outcome = nullptr,
                         std::string *why = nullptr) const {
        std::uint32_t verdict = MWS_NOTIFY_ACCEPTED;
        mws_status s = mws_notify_acceptor_accept(get(), reinterpret_cast<const std::uint8_t *>(message.data()),
                                                  message.size(), &verdict, outcome);
        if (s == MWS_NULL_ARGUMENT || s == MWS_PANIC) detail::check(s);
        if (s != MWS_OK && why != nullptr) *why = mws_last_error_message();
        return verdict;
    }

    /// The outcome from the messages accepted so far (mws_notify_acceptor_outcome).
    mws_notify_outcome outcome() const {
        mws_notify_outcome o{};
        detail::check(mws_notify_acceptor_outcome(get(), &o));
        return o;
    }

    /// Turns content verification on (mws_notify_acceptor_verify_content): a `done`
    /// must carry checksums, and the acceptor reads its participant's buffers to
    /// compare them before it counts the writer done. Those buffers must stay valid
    /// for reads while this object lives. Throws mws::Error: MWS_UNSUPPORTED (a device
    /// buffer).
    void verify_content() const { detail::check(mws_notify_acceptor_verify_content(get())); }
    /// The device engine through which the acceptor reads (verify_content) and writes
    /// (accept_deltas) the participant's device buffers, staged in host memory; call
    /// it before verify_content() when they are device memory. The acceptor keeps its
    /// own reference (mws_notify_acceptor_use_device_engine). Throws mws::Error:
    /// MWS_NULL_ARGUMENT (empty `device`).
    void use_device_engine(const DeviceEngine &device) const {
        detail::check(mws_notify_acceptor_use_device_engine(get(), device.get()));
    }

    /// Accepts delta steps (mws_notify_acceptor_accept_deltas): the sources write
    /// encoded changes into the inbox (`capacity` bytes at `address`, host memory of
    /// this side registered with its engine, valid while this object lives); a delta
    /// `done` is applied to the target buffers, then verified. Call verify_content()
    /// first. Throws mws::Error: MWS_INVALID_ARGUMENT.
    void accept_deltas(const void *address, std::uint64_t capacity) const {
        detail::check(mws_notify_acceptor_accept_deltas(
            get(), static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(address)), capacity));
    }
    /// The weight generation the target's bytes hold, verified by content and untouched
    /// since (mws_notify_acceptor_held_generation); std::nullopt when none.
    std::optional<std::uint64_t> held_generation() const {
        std::uint64_t g = 0;
        mws_status st = mws_notify_acceptor_held_generation(get(), &g);
        if (st == MWS_NOT_FOUND) return std::nullopt;
        detail::check(st);
        return g;
    }

    /// Moves the acceptor to `weight_generation` (mws_notify_acceptor_expect_generation).
    /// Throws mws::Error: MWS_STALE_BINDING (older than its generation).
    void expect_generation(std::uint64_t weight_generation) const {
        detail::check(mws_notify_acceptor_expect_generation(get(), weight_generation));
    }

    /// One mismatched target range, copied.
    struct Mismatch {
        std::string source_participant;  ///< the writing source executor's participant
        std::string source_worker;       ///< the writing source executor's worker
        std::string fragment_id;         ///< the target runtime fragment
        std::uint32_t operation = 0;     ///< the plan operation
        std::uint64_t offset = 0;        ///< first byte of the operation's box in the fragment
        std::uint64_t bytes = 0;         ///< bytes the operation writes
    };
    /// The target ranges whose verified bytes differ in the current generation
    /// (mws_notify_acceptor_mismatch_count / _mismatch), copied. Not concurrently with
    /// itself on one acceptor.
    std::vector<Mismatch> mismatches() const {
        std::size_t n = 0;
        detail::check(mws_notify_acceptor_mismatch_count(get(), &n));
        std::vector<Mismatch> out;
        for (std::size_t i = 0; i < n; ++i) {
            mws_notify_mismatch m{};
            detail::check(mws_notify_acceptor_mismatch(get(), i, &m));
            out.push_back({m.source_participant, m.source_worker, m.fragment_id, m.operation, m.offset, m.bytes});
        }
        return out;
    }

    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_notify_acceptor *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_notify_acceptor, detail::Deleter<mws_notify_acceptor, mws_notify_acceptor_free>> handle_;
};

/// The source side of pulled delta steps for one source executor (owns an
/// mws_delta_publisher): publish() encodes, for every target executor it feeds, the
/// elements that changed since the previous publication into a registered outbox the
/// servers' delta-enabled readers read. Move-only. Keeps its own reference to the
/// engine. Thread safety: every member may run on several threads at once
/// (publications are serialized inside).
class DeltaPublisher {
public:
    /// A publisher for the source executor of `participant` (worker: its only one,
    /// or `worker`) under the bound `plan`, with an outbox of `capacity` bytes
    /// registered with `engine` until destroyed (mws_delta_publisher_new). Throws
    /// mws::Error: MWS_INVALID_ARGUMENT (a logical plan, not a source executor, a
    /// capacity under min_outbox_capacity()), MWS_UNSUPPORTED (device sources and no
    /// device engine), MWS_STORE (registration refused).
    DeltaPublisher(const TransferPlan &plan, const std::string &participant, const TransferEngine &engine,
                   std::uint64_t capacity, const std::optional<std::string> &worker = std::nullopt) {
        mws_delta_publisher *out = nullptr;
        detail::check(mws_delta_publisher_new(plan.get(), participant.c_str(), detail::c_str_or_null(worker),
                                              engine.get(), capacity, &out));
        handle_.reset(out);
    }
    /// The least outbox capacity of that source executor (mws_delta_min_outbox_capacity).
    static std::uint64_t min_outbox_capacity(const TransferPlan &plan, const std::string &participant,
                                             const std::optional<std::string> &worker = std::nullopt) {
        std::uint64_t n = 0;
        detail::check(mws_delta_min_outbox_capacity(plan.get(), participant.c_str(),
                                                    detail::c_str_or_null(worker), &n));
        return n;
    }
    /// The outbox the readers need (mws_delta_publisher_outbox).
    DeltaOutbox outbox() const {
        mws_delta_outbox o{};
        detail::check(mws_delta_publisher_outbox(get(), &o));
        return DeltaOutbox{o.participant_id, o.worker_id, o.address, o.capacity};
    }
    /// The source executor's buffers must hold `weight_generation` and stay unwritten
    /// during the call and while the readers step it. Publishes it
    /// (mws_delta_publisher_publish) and returns what was published. Throws
    /// mws::Error: MWS_INVALID_ARGUMENT (the engine restarted), a device engine's error.
    mws_delta_stats publish(std::uint64_t weight_generation) const {
        mws_delta_stats d{};
        detail::check(mws_delta_publisher_publish(get(), weight_generation, &d));
        return d;
    }
    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    mws_delta_publisher *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_delta_publisher, detail::Deleter<mws_delta_publisher, mws_delta_publisher_free>> handle_;
};

/// Routes received notifications to the acceptors of a process that hosts several
/// targets (owns an mws_notify_router): each message goes to the acceptor of the
/// plan and target it names. Move-only. Remove an acceptor (or destroy the router)
/// before destroying the acceptor. Thread safety: every member may run on several
/// threads at once.
class NotifyRouter {
public:
    /// An empty router (mws_notify_router_new).
    NotifyRouter() {
        mws_notify_router *out = nullptr;
        detail::check(mws_notify_router_new(&out));
        handle_.reset(out);
    }
    /// Adds `acceptor` (mws_notify_router_add). Throws mws::Error: MWS_CONFLICT (one of
    /// the same plan and participant is routed).
    void add(const NotifyAcceptor &acceptor) const { detail::check(mws_notify_router_add(get(), acceptor.get())); }
    /// Removes `acceptor`; true when it was routed (mws_notify_router_remove).
    bool remove(const NotifyAcceptor &acceptor) const {
        std::uint32_t removed = 0;
        detail::check(mws_notify_router_remove(get(), acceptor.get(), &removed));
        return removed != 0;
    }
    /// Hands one received message to its acceptor (mws_notify_router_accept). Returns
    /// the verdict (never throws on a refusal; the reason in `*why` when given);
    /// `*routed` receives the acceptor's handle (nullptr: none matched) and `*outcome`
    /// its outcome after the message.
    std::uint32_t accept(std::string_view message, const mws_notify_acceptor **routed = nullptr,
                         mws_notify_outcome *outcome = nullptr, std::string *why = nullptr) const {
        std::uint32_t verdict = MWS_NOTIFY_ACCEPTED;
        mws_status s = mws_notify_router_accept(get(), reinterpret_cast<const std::uint8_t *>(message.data()),
                                                message.size(), &verdict, outcome, routed);
        if (s == MWS_NULL_ARGUMENT || s == MWS_PANIC) detail::check(s);
        if (s != MWS_OK && why != nullptr) *why = mws_last_error_message();
        return verdict;
    }
    /// The raw handle, lent (nullptr when empty); valid while this object owns it.
    const mws_notify_router *get() const noexcept { return handle_.get(); }

private:
    std::unique_ptr<mws_notify_router, detail::Deleter<mws_notify_router, mws_notify_router_free>> handle_;
};

}  // namespace mws


#endif  // MOONCAKE_WEIGHT_STORE_HPP
