// mooncake_te_core.hpp: the mapping of the library's engine vtable
// (mws_transfer_engine_vtable) onto an engine with the calls of Mooncake's
// `mooncake::TransferEngine`, as a template over the engine's types (`Api`), so that
// one implementation serves two builds:
//   - the adapter library (mooncake_te.cpp, CMake target mooncake_weight_store::mooncake_te):
//     Api = Mooncake's own types from transfer_engine.h;
//   - the in-process stand-in (examples/mooncake_te_vtable.cpp): Api = a class with
//     the same calls and semantics, built and tested everywhere (valgrind, ASan).
// This header does not include Mooncake's headers. C++17.
//
// The mapping (TeCore<Api>):
//   get_engine_id        an identity per native engine object: every adapter of one
//                        engine reports the same value while any of them lives; a new
//                        value once all are gone (a "restarted" engine)
//   register_memory      registerLocalMemory(addr, len, host_location | "cuda:<n>");
//                        recorded as the adapter's own registration
//   unregister_memory    unregisterLocalMemory(addr) only for a region this adapter
//                        registered; any other address: kErrNotOurs, no engine call
//                        (memory the serving engine registered itself is never touched)
//   batch_transfer_sync  openSegment(endpoint) (cached), then native batches of
//   _read / _write       `chunk_requests` requests, each allocateBatchID(k) ->
//                        submitTransfer -> getTransferStatus (tasks in order) until every
//                        task is terminal -> freeBatchID; a batch is submitted as soon as
//                        the peer has room for it: at most `queue_limit` requests in
//                        flight per peer (the per-peer queue of Mooncake's TCP transport),
//                        counting every batch of this adapter. 0 only when every task
//                        COMPLETED.
//   submit_with_ticket   the same chunks, advanced by ticket_status / ticket_drain;
//   ticket_status/_drain the ticket id is the adapter's own counter, never a native
//   ticket_release       BatchID: an unknown or released ticket is kErrUnknownTicket,
//                        never a call on a freed batch. Status: 0 every task
//                        completed; -1 a task failed and none is still in flight
//                        (failed-drained); -2 still running / cannot tell.
//                        Released while running: the native batch is kept (never
//                        freed while a task may run) and freed once terminal.
//   large ranges         split into pieces of Options::max_request_bytes (every lane busy)
//   staged reads         READ ranges contiguous on the remote side but not locally (the
//                        rows of a column split pulled by its target): one request per
//                        remote run into a registered staging pool, copied to the local
//                        ranges once the run COMPLETED (Options::staging_bytes; a failed
//                        staged ticket is re-read once without staging). Never for
//                        local ranges in device memory (registered as cuda:<n>): the
//                        CPU never writes device memory, TE reads into it directly
//   send_notify          sendNotifyByName(endpoint, {name, message}) (synchronous: 0
//                        once the peer acknowledged it)
// Only COMPLETED and FAILED (and the stand-in's INVALID) are terminal: Mooncake's
// TIMEOUT is reported while slices may still be in flight, so it counts as running.
// Every callback catches everything (nothing unwinds into the library); the adapter's
// mutex is held only inside one engine step, never while waiting.
#ifndef MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_CORE_HPP
#define MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_CORE_HPP

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <map>
#include <memory>
#include <mutex>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"

namespace mws {
namespace mooncake_te {

/// Codes the adapter returns through the vtable besides the engine's own (Mooncake's
/// negative ERR_* codes, passed as they are). describe() names every one.
enum : std::int32_t {
    kOk = 0,
    kFailed = -1,            ///< a batch failed (legacy entry points: completion unknown)
    kUnknown = -2,           ///< ticket status: still running / cannot tell
    kErrNotOurs = -1001,     ///< unregister of memory this adapter did not register
    kErrUnknownTicket = -1002,  ///< a ticket id never issued, or already released
    kErrBadArgument = -1003,    ///< NULL out-pointer, empty endpoint, zero length
    kErrSegment = -1004,        ///< openSegment(endpoint) failed (unknown or unreachable peer)
    kErrAllocate = -1005,       ///< allocateBatchID failed
    kErrException = -1006,      ///< the engine threw (caught at the boundary)
    kErrTimeout = -1007,        ///< a legacy batch did not finish within batch_timeout
    kErrStatusBase = -1100,     ///< -1100 - code: a Mooncake Status with that Status::Code (0..999)
};

/// Adapter options.
struct Options {
    /// Requests per native batch and per peer in flight (Mooncake's TCP transport:
    /// MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER, default 1024). Must be > 0.
    std::size_t queue_limit = 1024;
    /// Expose the ticketed entries (asynchronous batches); false: legacy batches only.
    bool tickets = true;
    /// Legacy batches: give up waiting after this long (completion unknown).
    std::chrono::milliseconds batch_timeout{30000};
    /// registerLocalMemory location for host memory ("*": Mooncake's wildcard).
    std::string host_location = "*";
    /// Staged reads: a READ batch whose consecutive ranges are contiguous on the
    /// remote side but not locally (a resharded column split pulled by its target) is
    /// read as one request per remote run into an adapter-owned registered staging
    /// buffer of this size, then copied to the local ranges when the run completed
    /// (never on failure). 0 disables it. Host memory only.
    std::size_t staging_bytes = 64u << 20;
    /// Longest remote run read as one request (bytes).
    std::size_t staging_run_bytes = 1u << 20;
    /// Direct requests longer than this are split into pieces of this size, so that
    /// a batch of a few large ranges keeps every lane of the transport busy (Mooncake's
    /// TCP transport: MC_TCP_LANES_PER_PEER connections, one request each at a time).
    /// 0: never split.
    std::size_t max_request_bytes = 1u << 20;
    /// Requests per native batch. A ticket larger than queue_limit is submitted as
    /// chunks of this size, a new one as soon as the peer's queue has room for it, so
    /// the queue stays full across chunk boundaries (with a library batch bound
    /// `max_batch_operations` well above queue_limit, one call keeps the peer busy
    /// without the pause a batch-by-batch submission has at each batch's end).
    /// 0: queue_limit.
    std::size_t chunk_requests = 256;
};

/// What the adapter did (cumulative).
struct Counters {
    std::uint64_t engine_calls = 0;     ///< every call into the native engine
    std::uint64_t native_batches = 0;   ///< allocateBatchID calls that succeeded
    std::uint64_t largest_batch = 0;    ///< requests in the largest native batch
    std::uint64_t requests = 0;         ///< requests submitted
    std::uint64_t submit_errors = 0;    ///< submitTransfer calls that returned an error
    std::uint64_t peak_in_flight = 0;   ///< most requests in flight to one peer
    std::uint64_t notifies = 0;         ///< notifications delivered
    std::uint64_t registrations = 0;    ///< registerLocalMemory calls that succeeded
    std::uint64_t staged_runs = 0;      ///< staged read requests (remote runs)
    std::uint64_t staged_ranges = 0;    ///< ranges those runs replaced
    std::uint64_t unstaged_retries = 0; ///< tickets re-run without staging after a staged run failed
};

/// Process-wide identity of native engine objects (see get_engine_id above).
class EngineIdentity {
public:
    static std::uint64_t acquire(const void *engine) {
        std::lock_guard<std::mutex> g(mu());
        auto &e = table()[engine];
        if (e.second++ == 0) e.first = ++next();
        return e.first;
    }
    static void release(const void *engine) {
        std::lock_guard<std::mutex> g(mu());
        auto it = table().find(engine);
        if (it != table().end() && --it->second.second == 0) table().erase(it);
    }

private:
    static std::mutex &mu() {
        static std::mutex m;
        return m;
    }
    static std::map<const void *, std::pair<std::uint64_t, int>> &table() {
        static std::map<const void *, std::pair<std::uint64_t, int>> t;
        return t;
    }
    static std::uint64_t &next() {
        static std::uint64_t n = 0;
        return n;
    }
};

template <class Api>
class TeCore {
public:
    using Engine = typename Api::Engine;
    using Request = typename Api::Request;
    using BatchID = typename Api::BatchID;
    using SegmentHandle = typename Api::SegmentHandle;
    using OpCode = decltype(Request{}.opcode);

    /// Borrows `engine` (never owned; it must outlive the adapter and every library
    /// engine, loader and sink made from it).
    explicit TeCore(Engine &engine, Options options = {})
        : engine_(&engine), options_(std::move(options)), identity_(EngineIdentity::acquire(&engine)) {
        if (options_.queue_limit == 0) options_.queue_limit = 1;
    }
    TeCore(const TeCore &) = delete;
    TeCore &operator=(const TeCore &) = delete;
    /// Frees the native batches that are terminal; unregisters what the adapter
    /// registered and the library left (only when no batch is still in flight).
    ~TeCore() {
        std::lock_guard<std::mutex> g(mu_);
        for (auto &t : tickets_) drop(t.second);
        tickets_.clear();
        reap();
        if (zombies_.empty()) {
            for (auto &r : regs_) guarded_int([&] { return engine_->unregisterLocalMemory(ptr(r.first)); });
            regs_.clear();
            if (pool_registered_) guarded_int([&] { return engine_->unregisterLocalMemory(pool_.get()); });
        } else {
            pool_.release();  // a running batch may still write into it: never freed
        }
        EngineIdentity::release(engine_);
    }

    /// The vtable (ctx = this adapter).
    mws_transfer_engine_vtable vtable() const {
        mws_transfer_engine_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_TRANSFER_ENGINE_VTABLE_VERSION;
        vt.get_engine_id = &get_engine_id;
        vt.register_memory = &register_memory;
        vt.unregister_memory = &unregister_memory;
        vt.batch_transfer_sync_write = &sync_write;
        vt.batch_transfer_sync_read = &sync_read;
        if (options_.tickets) {
            vt.submit_with_ticket = &submit_with_ticket;
            vt.ticket_status = &ticket_status;
            vt.ticket_drain = &ticket_drain;
            vt.ticket_release = &ticket_release;
        }
        vt.send_notify = &send_notify;
        return vt;
    }
    /// The `ctx` of vtable().
    void *ctx() noexcept { return this; }
    /// A library engine over this adapter (keep the adapter alive as long as it and
    /// every loader and sink made from it).
    mws::TransferEngine engine() { return mws::TransferEngine::from_vtable(vtable(), this); }

    Counters counters() const {
        std::lock_guard<std::mutex> g(mu_);
        return counters_;
    }
    /// Regions registered through this adapter and not unregistered.
    std::size_t registered_regions() const {
        std::lock_guard<std::mutex> g(mu_);
        return regs_.size();
    }
    /// Native batches not freed yet (tickets' current chunks and released ones still running).
    std::size_t batches_in_flight() {
        std::lock_guard<std::mutex> g(mu_);
        reap();
        std::size_t n = zombies_.size();
        for (auto &t : tickets_) n += t.second.inflight.size();
        return n;
    }
    /// Tickets issued and not released.
    std::size_t open_tickets() const {
        std::lock_guard<std::mutex> g(mu_);
        return tickets_.size();
    }
    /// The staging pool's address and size (nullptr before the first staged read).
    std::pair<const void *, std::size_t> staging_pool() const {
        std::lock_guard<std::mutex> g(mu_);
        return {pool_.get(), pool_ ? options_.staging_bytes : 0};
    }
    /// The last engine error text (a Mooncake Status message), empty when none.
    std::string last_error() const {
        std::lock_guard<std::mutex> g(mu_);
        return last_error_;
    }
    const Options &options() const noexcept { return options_; }
    Engine &native() noexcept { return *engine_; }

    // The vtable's entries, callable directly (tests call them with made-up ids).
    static std::uint64_t get_engine_id(void *ctx) noexcept { return self(ctx).identity_; }

    static std::int32_t register_memory(void *ctx, std::uint64_t address, std::uint64_t len, std::int32_t device) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            if (address == 0 || len == 0) return std::int32_t{kErrBadArgument};
            std::string location = device < 0 ? s.options_.host_location : "cuda:" + std::to_string(device);
            std::lock_guard<std::mutex> g(s.mu_);
            s.counters_.engine_calls += 1;
            int rc = s.engine_->registerLocalMemory(ptr(address), static_cast<std::size_t>(len), location);
            if (rc == 0) {
                s.regs_[address] = len;
                if (device >= 0) s.device_regs_[address] = len;
                s.counters_.registrations += 1;
            }
            return static_cast<std::int32_t>(rc);
        });
    }

    static std::int32_t unregister_memory(void *ctx, std::uint64_t address) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.regs_.find(address);
            if (it == s.regs_.end()) return std::int32_t{kErrNotOurs};
            s.counters_.engine_calls += 1;
            int rc = s.engine_->unregisterLocalMemory(ptr(address));
            if (rc == 0) {
                s.regs_.erase(it);
                s.device_regs_.erase(address);
            }
            return static_cast<std::int32_t>(rc);
        });
    }

    static std::int32_t sync_read(void *ctx, mws_bytes endpoint, const std::uint64_t *local, const std::uint64_t *remote,
                                  const std::uint64_t *sizes, std::size_t n) noexcept {
        return guarded_int([&] { return self(ctx).sync(Api::kRead, endpoint, local, remote, sizes, n); });
    }
    static std::int32_t sync_write(void *ctx, mws_bytes endpoint, const std::uint64_t *local, const std::uint64_t *remote,
                                   const std::uint64_t *sizes, std::size_t n) noexcept {
        return guarded_int([&] { return self(ctx).sync(Api::kWrite, endpoint, local, remote, sizes, n); });
    }

    static std::int32_t submit_with_ticket(void *ctx, std::uint32_t direction, mws_bytes endpoint,
                                           const std::uint64_t *local, const std::uint64_t *remote,
                                           const std::uint64_t *sizes, std::size_t n, std::uint64_t *ticket) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            if (ticket == nullptr) return std::int32_t{kErrBadArgument};
            OpCode op = direction == MWS_TRANSFER_READ ? Api::kRead : Api::kWrite;
            std::lock_guard<std::mutex> g(s.mu_);
            Ticket t;
            std::int32_t rc = s.make_ticket(op, endpoint, local, remote, sizes, n, t);
            if (rc == kErrBadArgument) return rc;
            if (rc != kOk) {
                // Nothing was submitted (unknown peer): a ticket that is failed-drained,
                // a known failure rather than "no ticket" (which fences the engine).
                t.failed = true;
                t.error = rc;
            } else {
                // Submit the first chunk now when the peer has room (else ticket_status
                // submits it later).
                s.advance(t);
            }
            std::uint64_t id = s.next_ticket_++;
            s.tickets_.emplace(id, std::move(t));
            *ticket = id;
            return std::int32_t{kOk};
        });
    }

    static std::int32_t ticket_status(void *ctx, std::uint64_t ticket, std::int32_t *status) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.tickets_.find(ticket);
            if (it == s.tickets_.end()) return std::int32_t{kErrUnknownTicket};
            if (status == nullptr) return std::int32_t{kErrBadArgument};
            *status = s.advance(it->second);
            return std::int32_t{kOk};
        });
    }

    static std::int32_t ticket_drain(void *ctx, std::uint64_t ticket, std::uint64_t timeout_ms,
                                     std::int32_t *status) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            if (status == nullptr) return std::int32_t{kErrBadArgument};
            auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
            for (unsigned spins = 0;; ++spins) {
                {
                    std::lock_guard<std::mutex> g(s.mu_);
                    auto it = s.tickets_.find(ticket);
                    if (it == s.tickets_.end()) return std::int32_t{kErrUnknownTicket};
                    std::int32_t st = s.advance(it->second);
                    if (st != kUnknown || Clock::now() >= deadline) {
                        *status = st;
                        return std::int32_t{kOk};
                    }
                }
                pause(spins);
            }
        });
    }

    static void ticket_release(void *ctx, std::uint64_t ticket) noexcept {
        guarded_int([&] {
            TeCore &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.tickets_.find(ticket);
            if (it == s.tickets_.end()) return std::int32_t{kErrUnknownTicket};
            s.drop(it->second);
            s.tickets_.erase(it);
            s.reap();
            return std::int32_t{kOk};
        });
    }

    static std::int32_t send_notify(void *ctx, mws_bytes endpoint, mws_bytes name, mws_bytes message) noexcept {
        return guarded_int([&] {
            TeCore &s = self(ctx);
            if (endpoint.len == 0 || (endpoint.ptr == nullptr) || (message.len != 0 && message.ptr == nullptr) ||
                (name.len != 0 && name.ptr == nullptr)) {
                return std::int32_t{kErrBadArgument};
            }
            typename Api::NotifyDesc desc;
            desc.name.assign(name.ptr, name.len);
            desc.notify_msg.assign(message.ptr, message.len);
            std::string peer(endpoint.ptr, endpoint.len);
            {
                std::lock_guard<std::mutex> g(s.mu_);
                s.counters_.engine_calls += 1;
            }
            // Not under the adapter's lock: a synchronous RPC to the peer.
            int rc = s.engine_->sendNotifyByName(peer, desc);
            std::lock_guard<std::mutex> g(s.mu_);
            if (rc == 0) s.counters_.notifies += 1;
            return static_cast<std::int32_t>(rc);
        });
    }

private:
    using Clock = std::chrono::steady_clock;

    struct Range {
        std::uint64_t local, remote, len;
    };

    struct Chunk {
        BatchID id{};
        SegmentHandle segment{};
        std::size_t from = 0;           ///< index of its first request in the ticket
        std::size_t polled = 0;         ///< tasks [0, polled) are known terminal
        bool any_failed = false;        ///< one of them FAILED
        std::vector<Request> requests;  ///< kept alive until freed (the engine refers to them)
        bool holds_pool = false;        ///< released while running with the staging pool reserved
    };
    /// One local range a staged run is copied to: `len` bytes at `stage_off` of the pool.
    struct Piece {
        std::uint64_t local;
        std::size_t stage_off;
        std::size_t len;
    };
    struct Ticket {
        OpCode op{};
        SegmentHandle segment{};
        std::vector<Request> all;
        std::vector<std::vector<Piece>> copies;  ///< per request: staged pieces (empty: direct)
        std::vector<Range> ranges;               ///< the caller's ranges (for an unstaged re-run)
        std::size_t next = 0;
        std::deque<Chunk> inflight;  ///< submitted chunks, oldest first
        bool failed = false;
        bool ever_submitted = false;
        bool holds_pool = false;
        bool staged = false;
        bool retried_unstaged = false;
        std::int32_t error = 0;
    };

    static TeCore &self(void *ctx) { return *static_cast<TeCore *>(ctx); }
    static void *ptr(std::uint64_t a) { return reinterpret_cast<void *>(static_cast<std::uintptr_t>(a)); }

    template <class F>
    static std::int32_t guarded_int(F &&f) noexcept {
        try {
            return static_cast<std::int32_t>(f());
        } catch (...) {
            return kErrException;
        }
    }

    static void pause(unsigned spins) {
        if (spins < 64) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    void note(const typename Api::Status &st) { last_error_ = Api::status_text(st); }

    /// openSegment once per endpoint (under mu_).
    bool segment(const std::string &endpoint, SegmentHandle &out) {
        auto it = segments_.find(endpoint);
        if (it != segments_.end()) {
            out = it->second;
            return true;
        }
        counters_.engine_calls += 1;
        SegmentHandle h = engine_->openSegment(endpoint);
        if (Api::invalid_segment(h)) return false;
        segments_.emplace(endpoint, h);
        out = h;
        return true;
    }

    std::int32_t make_ticket(OpCode op, mws_bytes endpoint, const std::uint64_t *local, const std::uint64_t *remote,
                             const std::uint64_t *sizes, std::size_t n, Ticket &t) {
        if (endpoint.ptr == nullptr || endpoint.len == 0 || n == 0 || local == nullptr || remote == nullptr ||
            sizes == nullptr) {
            return kErrBadArgument;
        }
        SegmentHandle seg{};
        if (!segment(std::string(endpoint.ptr, endpoint.len), seg)) return kErrSegment;
        t.op = op;
        t.segment = seg;
        t.ranges.resize(n);
        for (std::size_t i = 0; i < n; ++i) t.ranges[i] = Range{local[i], remote[i], sizes[i]};
        build_requests(t, op == Api::kRead && reserve_pool(t));
        return kOk;
    }

    /// The staging pool for ticket `t` (under mu_): false when staging is off, the
    /// pool is in use, or it cannot be registered.
    bool reserve_pool(Ticket &t) {
        if (options_.staging_bytes == 0 || pool_holders_ != 0) return false;
        if (!pool_) {
            pool_.reset(new (std::nothrow) unsigned char[options_.staging_bytes]);
            if (!pool_) return false;
        }
        if (!pool_registered_) {
            counters_.engine_calls += 1;
            if (engine_->registerLocalMemory(pool_.get(), options_.staging_bytes, options_.host_location) != 0) {
                return false;
            }
            pool_registered_ = true;
        }
        pool_holders_ = 1;
        t.holds_pool = true;
        return true;
    }
    void release_pool(bool &holds) {
        if (holds) {
            holds = false;
            pool_holders_ -= 1;
        }
    }

    /// True when the local range starting at `address` lies in device memory this
    /// adapter registered (cuda:<n>): it is never staged (the CPU would write it).
    bool in_device(std::uint64_t address) const {
        auto it = device_regs_.upper_bound(address);
        if (it == device_regs_.begin()) return false;
        --it;
        return address < it->first + it->second;
    }

    /// The ticket's native requests from its ranges: with `stage`, remote-contiguous
    /// runs of READ ranges whose local sides are not contiguous and lie in host memory
    /// become one request into the staging pool (see Options::staging_bytes).
    void build_requests(Ticket &t, bool stage) {
        t.all.clear();
        t.copies.clear();
        t.staged = false;
        std::size_t pool_off = 0;
        const std::size_t n = t.ranges.size();
        auto direct = [&](const Range &r) {
            const std::uint64_t piece = options_.max_request_bytes == 0 ? r.len : options_.max_request_bytes;
            for (std::uint64_t off = 0; off < r.len; off += piece) {
                Request q{};
                q.opcode = t.op;
                q.source = ptr(r.local + off);
                q.target_id = t.segment;
                q.target_offset = r.remote + off;  // RAM segments: the remote virtual address
                q.length = static_cast<std::size_t>(std::min(piece, r.len - off));
                t.all.push_back(q);
                t.copies.emplace_back();
            }
        };
        for (std::size_t i = 0; i < n;) {
            std::size_t j = i + 1, bytes = static_cast<std::size_t>(t.ranges[i].len);
            bool local_contiguous = true;
            if (stage && !in_device(t.ranges[i].local)) {
                while (j < n && t.ranges[j].remote == t.ranges[j - 1].remote + t.ranges[j - 1].len &&
                       bytes + t.ranges[j].len <= options_.staging_run_bytes &&
                       pool_off + bytes + t.ranges[j].len <= options_.staging_bytes &&
                       !in_device(t.ranges[j].local)) {
                    local_contiguous &= t.ranges[j].local == t.ranges[j - 1].local + t.ranges[j - 1].len;
                    bytes += static_cast<std::size_t>(t.ranges[j].len);
                    ++j;
                }
            }
            if (j - i < 2 || local_contiguous) {
                // One range, or a run contiguous on both sides (the library merges those
                // already): direct requests.
                for (std::size_t k = i; k < j; ++k) direct(t.ranges[k]);
                i = j;
                continue;
            }
            Request q{};
            q.opcode = t.op;
            q.source = pool_.get() + pool_off;
            q.target_id = t.segment;
            q.target_offset = t.ranges[i].remote;
            q.length = bytes;
            std::vector<Piece> pieces;
            std::size_t off = pool_off;
            for (std::size_t k = i; k < j; ++k) {
                pieces.push_back(Piece{t.ranges[k].local, off, static_cast<std::size_t>(t.ranges[k].len)});
                off += static_cast<std::size_t>(t.ranges[k].len);
            }
            t.all.push_back(q);
            t.copies.push_back(std::move(pieces));
            counters_.staged_runs += 1;
            counters_.staged_ranges += j - i;
            t.staged = true;
            pool_off += bytes;
            i = j;
        }
        if (!t.staged) release_pool(t.holds_pool);
    }

    /// A completed chunk: copies its staged runs to their local ranges.
    void land(const Ticket &t, const Chunk &c) {
        for (std::size_t k = 0; k < c.requests.size(); ++k) {
            for (const Piece &p : t.copies[c.from + k]) std::memcpy(ptr(p.local), pool_.get() + p.stage_off, p.len);
        }
    }

    /// OK / FAILED / UNKNOWN of one native batch (under mu_). Tasks are polled in
    /// order from the first one not known terminal, stopping at the first running one
    /// (a terminal status never changes), so a poll costs O(1) while the batch runs.
    std::int32_t poll(Chunk &c) {
        for (; c.polled < c.requests.size(); ++c.polled) {
            typename Api::TransferStatus st{};
            counters_.engine_calls += 1;
            typename Api::Status rc = engine_->getTransferStatus(c.id, c.polled, st);
            if (!rc.ok()) {
                note(rc);
                return kUnknown;
            }
            if (Api::completed(st)) continue;
            if (Api::failed(st)) {
                c.any_failed = true;
                continue;
            }
            return kUnknown;
        }
        return c.any_failed ? kFailed : kOk;
    }

    /// Frees a terminal batch; false (kept) when the engine refuses.
    bool free_chunk(Chunk &c) {
        counters_.engine_calls += 1;
        typename Api::Status st = engine_->freeBatchID(c.id);
        if (!st.ok()) {
            note(st);
            return false;
        }
        in_flight_[c.segment] -= c.requests.size();
        return true;
    }

    /// A batch nobody waits for any more: freed now if terminal, else later (reap()).
    void retire(Chunk c) {
        if (poll(c) != kUnknown && free_chunk(c)) {
            release_pool(c.holds_pool);
            return;
        }
        zombies_.push_back(std::move(c));
    }

    /// A chunk of `t` that goes to the zombies: it keeps a reservation of the pool
    /// while it may still write into it.
    void orphan(Ticket &t, Chunk &c) {
        if (t.holds_pool) {
            c.holds_pool = true;
            pool_holders_ += 1;
        }
    }

    /// A ticket nobody waits for any more (under mu_).
    void drop(Ticket &t) {
        while (!t.inflight.empty()) {
            orphan(t, t.inflight.front());
            retire(std::move(t.inflight.front()));
            t.inflight.pop_front();
        }
        release_pool(t.holds_pool);
    }

    void reap() {
        for (auto it = zombies_.begin(); it != zombies_.end();) {
            if (poll(*it) != kUnknown && free_chunk(*it)) {
                release_pool(it->holds_pool);
                it = zombies_.erase(it);
            } else {
                ++it;
            }
        }
    }

    /// Moves a ticket on (under mu_): retires its oldest chunks that are terminal
    /// (copying staged runs of completed ones), then submits further chunks of
    /// Options::chunk_requests while the peer has room (at most queue_limit requests
    /// in flight per peer, across tickets): the queue stays full across chunk
    /// boundaries. OK / FAILED (only once nothing of the ticket is in flight) / UNKNOWN.
    std::int32_t advance(Ticket &t) {
        if (!zombies_.empty()) reap();
        for (;;) {
            while (!t.inflight.empty()) {
                Chunk &c = t.inflight.front();
                std::int32_t s = poll(c);
                if (s == kUnknown) break;
                if (s == kOk) land(t, c);
                if (!free_chunk(c)) {
                    orphan(t, c);  // the pool stays reserved until it is freed
                    zombies_.push_back(std::move(c));
                }
                t.inflight.pop_front();
                if (s == kFailed) t.failed = true;
            }
            if (t.failed) {
                if (!t.inflight.empty()) return kUnknown;  // failed-drained only once drained
                if (t.staged && !t.retried_unstaged && t.holds_pool) {
                    // A staged run failed (for example a run across two remote
                    // registrations): read every range again, one request each (reads
                    // are idempotent).
                    t.retried_unstaged = true;
                    counters_.unstaged_retries += 1;
                    release_pool(t.holds_pool);
                    build_requests(t, false);
                    t.next = 0;
                    t.failed = false;
                    t.error = 0;
                    continue;
                }
                release_pool(t.holds_pool);
                return kFailed;
            }
            if (t.next == t.all.size()) {
                if (!t.inflight.empty()) return kUnknown;
                release_pool(t.holds_pool);
                return kOk;
            }
            const std::size_t chunk = std::max<std::size_t>(
                1, std::min(options_.queue_limit, options_.chunk_requests == 0 ? options_.queue_limit
                                                                               : options_.chunk_requests));
            bool submitted = false;
            while (t.next < t.all.size() && !t.failed) {
                std::size_t k = std::min(chunk, t.all.size() - t.next);
                std::size_t &busy = in_flight_[t.segment];
                if (busy + k > options_.queue_limit) break;  // wait for room at this peer
                counters_.engine_calls += 1;
                BatchID id = engine_->allocateBatchID(k);
                if (id == Api::kInvalidBatch) {
                    t.failed = true;
                    t.error = kErrAllocate;
                    break;
                }
                Chunk c;
                c.id = id;
                c.segment = t.segment;
                c.from = t.next;
                c.requests.assign(t.all.begin() + static_cast<std::ptrdiff_t>(t.next),
                                  t.all.begin() + static_cast<std::ptrdiff_t>(t.next + k));
                counters_.native_batches += 1;
                counters_.engine_calls += 1;
                counters_.requests += k;
                counters_.largest_batch = std::max<std::uint64_t>(counters_.largest_batch, k);
                typename Api::Status st = engine_->submitTransfer(c.id, c.requests);
                busy += k;
                counters_.peak_in_flight = std::max<std::uint64_t>(counters_.peak_in_flight, busy);
                t.ever_submitted = true;
                t.next += k;
                if (!st.ok()) {
                    // Part of it may have been admitted: poll it to terminal before reporting.
                    note(st);
                    counters_.submit_errors += 1;
                    t.failed = true;
                    t.error = Api::status_code(st);
                }
                t.inflight.push_back(std::move(c));
                submitted = true;
            }
            if (t.failed && t.inflight.empty()) continue;  // nothing was submitted: report now
            if (!submitted || !t.inflight.empty()) return kUnknown;
        }
    }

    std::int32_t sync(OpCode op, mws_bytes endpoint, const std::uint64_t *local, const std::uint64_t *remote,
                      const std::uint64_t *sizes, std::size_t n) {
        Ticket t;
        {
            std::lock_guard<std::mutex> g(mu_);
            std::int32_t rc = make_ticket(op, endpoint, local, remote, sizes, n, t);
            if (rc != kOk) return rc;
        }
        auto deadline = Clock::now() + options_.batch_timeout;
        for (unsigned spins = 0;; ++spins) {
            {
                std::lock_guard<std::mutex> g(mu_);
                std::int32_t st = advance(t);
                if (st == kOk) return kOk;
                if (st == kFailed) return t.error != 0 ? t.error : kFailed;
                if (Clock::now() >= deadline) {
                    drop(t);  // never freed while running
                    return kErrTimeout;
                }
            }
            pause(spins);
        }
    }

    Engine *engine_;
    Options options_;
    std::uint64_t identity_;
    mutable std::mutex mu_;
    std::map<std::string, SegmentHandle> segments_;
    std::map<std::uint64_t, Ticket> tickets_;
    std::vector<Chunk> zombies_;
    std::map<SegmentHandle, std::size_t> in_flight_;
    std::map<std::uint64_t, std::uint64_t> regs_;  ///< address -> length, registered by this adapter
    std::map<std::uint64_t, std::uint64_t> device_regs_;  ///< the device (cuda:<n>) ones among them
    std::unique_ptr<unsigned char[]> pool_;       ///< the staging pool (Options::staging_bytes)
    bool pool_registered_ = false;
    /// Reservations of the pool: its ticket, or the released batches that may still
    /// write into it. Free when 0.
    std::size_t pool_holders_ = 0;
    std::uint64_t next_ticket_ = 1;
    Counters counters_;
    std::string last_error_;
};

}  // namespace mooncake_te
}  // namespace mws

#endif  // MOONCAKE_WEIGHT_STORE_MOONCAKE_TE_CORE_HPP
