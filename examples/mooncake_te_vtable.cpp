// mooncake_te_vtable.cpp: how a C++ process that runs Mooncake's Transfer Engine
// (`mooncake::TransferEngine`, mooncake-transfer-engine/include/transfer_engine.h) plugs
// it into the live-transfer executors through mws_transfer_engine_from_vtable. The
// mapping (TeVtable<Engine>):
//
//   get_engine_id             the engine object's address (stable per engine, as the
//                             wheel's get_engine_ptr)
//   register_memory           registerLocalMemory(addr, len, "*" | "cuda:<ordinal>")
//   unregister_memory         unregisterLocalMemory(addr)
//   batch_transfer_sync_read  openSegment(endpoint) (cached per endpoint), then per chunk
//   batch_transfer_sync_write of at most `queue_limit` requests (the TCP transport queues
//                             at most 1024 transfers per peer):
//                             allocateBatchID(k) -> submitTransfer(TransferRequest{READ |
//                             WRITE, local address, segment, remote address, length}) ->
//                             getTransferStatus(batch, task) polled until every task is
//                             terminal -> freeBatchID. 0 only when every task COMPLETED.
//   submit_with_ticket        the same requests, submitted chunk by chunk as the previous
//   ticket_status/_drain      chunk completes; the ticket id is ours (a counter), never a
//   ticket_release            native BatchID, so an unknown or released ticket is an
//                             error code, never a native call on a freed batch. Status:
//                             0 every task completed; -1 a task failed and none is still
//                             pending (failed-drained); -2 still running / cannot tell.
//
// Every callback catches everything (nothing unwinds into the library) and takes the
// adapter's mutex (the vtable contract asks for thread-safe callbacks).
//
// Two engines:
//   - MWS_HAVE_MOONCAKE (cmake -DMWS_WITH_MOONCAKE=ON, only when CMake finds Mooncake's
//     transfer_engine.h and libtransfer_engine): TeVtable<mooncake::TransferEngine>; the
//     program then only checks that the adapter compiles and links against the real
//     engine and registers a buffer (a real two-process run needs a peer: see
//     docs/mooncake/LIVE-TRANSFER-ON-TE.md).
//   - otherwise: standin::TransferEngine, an in-process class with the same method
//     names, signatures and observable semantics (segments by name, registrations
//     checked on both sides as RDMA does, a per-peer queue of 1024 transfers with
//     partial admission past it, status polling, unknown batch id -> error status,
//     freeBatchID refused while tasks are pending), so that the mapping itself is built
//     and tested everywhere (ctest int.example_mooncake_te_vtable).
//
// The stand-in program: a trainer in TP4 x DP2 and a server in TP2 x EP2, one engine
// per participant (one process per rank in real life), plans the live reshard, pulls
// (reader) and pushes (sink) through the adapter, legacy batches and tickets, and
// verifies every target byte each time; it checks that a batch larger than the
// queue limit is split by the adapter (and fails when the adapter does not split),
// and that an engine failure fails the call with nothing pending, no registration
// left behind, and a clean retry.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"

#ifdef MWS_HAVE_MOONCAKE
#include "transfer_engine.h"
#endif

namespace mcte {

// ---- the adapter -----------------------------------------------------------------

/// The engine vtable over an engine described by `Api` (the types and status
/// predicates of mooncake::TransferEngine, or of the stand-in below). The adapter
/// borrows the engine (which must outlive it); the caller keeps the adapter alive as
/// long as every mws::TransferEngine made by `open` and every loader and sink on it.
template <class Api>
class TeVtable {
public:
    using Engine = typename Api::Engine;
    using Request = typename Api::Request;
    using BatchID = typename Api::BatchID;
    using SegmentHandle = typename Api::SegmentHandle;
    using OpCode = decltype(Request{}.opcode);

    explicit TeVtable(Engine &engine, std::size_t queue_limit = 1024) : engine_(&engine), queue_limit_(queue_limit) {}
    TeVtable(const TeVtable &) = delete;
    TeVtable &operator=(const TeVtable &) = delete;
    ~TeVtable() {
        // Release what the library did not (tickets are released by the library; this
        // covers native batches that were still pending when their ticket went).
        std::lock_guard<std::mutex> g(mu_);
        for (auto &t : tickets_) free_if_done(t.second.batch, t.second.submitted_in_chunk);
        for (auto &z : zombies_) free_if_done(z.first, z.second);
    }

    /// The vtable; `with_tickets` also sets the ticketed entries (async batches).
    static mws_transfer_engine_vtable vtable(bool with_tickets) {
        mws_transfer_engine_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_TRANSFER_ENGINE_VTABLE_VERSION;
        vt.get_engine_id = &get_engine_id;
        vt.register_memory = &register_memory;
        vt.unregister_memory = &unregister_memory;
        vt.batch_transfer_sync_write = &sync_write;
        vt.batch_transfer_sync_read = &sync_read;
        if (with_tickets) {
            vt.submit_with_ticket = &submit_with_ticket;
            vt.ticket_status = &ticket_status;
            vt.ticket_drain = &ticket_drain;
            vt.ticket_release = &ticket_release;
        }
        return vt;
    }

    /// A library engine over this adapter.
    mws::TransferEngine open(bool with_tickets) { return mws::TransferEngine::from_vtable(vtable(with_tickets), this); }

    /// Native batches submitted so far (chunks), and the largest one.
    std::size_t native_batches() const { return native_batches_; }
    std::size_t largest_native_batch() const { return largest_; }
    /// Polling deadline of one native batch (the engine's own timeout applies as well).
    std::chrono::milliseconds batch_timeout{30000};

private:
    enum : int32_t { OK = 0, FAILED = -1, UNKNOWN = -2 };
    using Clock = std::chrono::steady_clock;

    struct Ticket {
        OpCode opcode;
        SegmentHandle segment;
        std::vector<Request> requests;
        std::size_t next = 0;               ///< first request not yet submitted
        BatchID batch{};                    ///< the current chunk's native batch
        std::size_t submitted_in_chunk = 0;  ///< its size (0: none outstanding)
        bool failed = false;                ///< a task failed or a submission failed
    };

    static TeVtable &self(void *ctx) { return *static_cast<TeVtable *>(ctx); }

    template <class F, class R>
    static R guarded(F &&f, R on_error) noexcept {
        try {
            return f();
        } catch (...) {
            return on_error;
        }
    }

    static uint64_t get_engine_id(void *ctx) noexcept {
        return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(self(ctx).engine_));
    }

    static int32_t register_memory(void *ctx, uint64_t address, uint64_t len, int32_t device) noexcept {
        return guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            std::string location = device < 0 ? std::string("*") : "cuda:" + std::to_string(device);
            return static_cast<int32_t>(
                s.engine_->registerLocalMemory(reinterpret_cast<void *>(static_cast<uintptr_t>(address)),
                                               static_cast<size_t>(len), location));
        }, int32_t{FAILED});
    }

    static int32_t unregister_memory(void *ctx, uint64_t address) noexcept {
        return guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            return static_cast<int32_t>(
                s.engine_->unregisterLocalMemory(reinterpret_cast<void *>(static_cast<uintptr_t>(address))));
        }, int32_t{FAILED});
    }

    /// openSegment once per endpoint; false when the engine refuses it.
    bool segment(const std::string &endpoint, SegmentHandle &out) {
        auto it = segments_.find(endpoint);
        if (it != segments_.end()) {
            out = it->second;
            return true;
        }
        SegmentHandle h = engine_->openSegment(endpoint);
        if (static_cast<long long>(h) < 0) return false;
        segments_.emplace(endpoint, h);
        out = h;
        return true;
    }

    std::vector<Request> requests(OpCode op, SegmentHandle seg, const uint64_t *local,
                                                   const uint64_t *remote, const uint64_t *sizes, size_t n) {
        std::vector<Request> v(n);
        for (size_t i = 0; i < n; ++i) {
            v[i].opcode = op;
            v[i].source = reinterpret_cast<void *>(static_cast<uintptr_t>(local[i]));
            v[i].target_id = seg;
            v[i].target_offset = remote[i];  // RAM segments: the remote virtual address
            v[i].length = static_cast<size_t>(sizes[i]);
        }
        return v;
    }

    /// Submits requests[from, from + k) as one native batch; false if nothing was
    /// submitted (`batch` unset) or the submission was refused (`batch` set: tasks may
    /// have been admitted in part; poll them before freeing).
    bool submit_chunk(const std::vector<Request> &all, std::size_t from, std::size_t k,
                      BatchID &batch, bool &allocated) {
        allocated = false;
        batch = engine_->allocateBatchID(k);
        if (batch == Api::kInvalidBatch) return false;
        allocated = true;
        native_batches_ += 1;
        largest_ = std::max(largest_, k);
        std::vector<Request> chunk(all.begin() + static_cast<std::ptrdiff_t>(from),
                                                    all.begin() + static_cast<std::ptrdiff_t>(from + k));
        return engine_->submitTransfer(batch, chunk).ok();
    }

    /// Polls every task of a native batch once: OK (all completed), FAILED (all terminal,
    /// one failed), UNKNOWN (some pending, or the status cannot be read).
    int32_t poll(BatchID batch, std::size_t k) {
        bool pending = false, failed = false;
        for (std::size_t t = 0; t < k; ++t) {
            typename Api::TransferStatus st{};
            if (!engine_->getTransferStatus(batch, t, st).ok()) return UNKNOWN;
            if (Api::completed(st)) continue;
            if (Api::failed(st)) {
                failed = true;
            } else {
                pending = true;
            }
        }
        return pending ? UNKNOWN : failed ? FAILED : OK;
    }

    /// Frees a native batch whose tasks are all terminal; false (kept) otherwise.
    bool free_if_done(BatchID batch, std::size_t k) {
        if (k == 0) return true;
        if (poll(batch, k) == UNKNOWN) return false;
        return engine_->freeBatchID(batch).ok();
    }

    /// Waits (polling) until every task of the batch is terminal or the deadline passes.
    int32_t wait(BatchID batch, std::size_t k, Clock::time_point deadline) {
        for (;;) {
            int32_t s = poll(batch, k);
            if (s != UNKNOWN || Clock::now() >= deadline) return s;
        }
    }

    int32_t sync(OpCode op, mws_bytes endpoint, const uint64_t *local, const uint64_t *remote, const uint64_t *sizes,
                 size_t n) {
        std::lock_guard<std::mutex> g(mu_);
        SegmentHandle seg{};
        if (!segment(std::string(endpoint.ptr, endpoint.len), seg)) return FAILED;
        std::vector<Request> all = requests(op, seg, local, remote, sizes, n);
        for (std::size_t from = 0; from < n; from += queue_limit_) {
            std::size_t k = std::min(queue_limit_, n - from);
            BatchID batch{};
            bool allocated = false;
            bool ok = submit_chunk(all, from, k, batch, allocated);
            if (!allocated) return FAILED;
            int32_t s = wait(batch, k, Clock::now() + batch_timeout);
            if (s == UNKNOWN) {
                zombies_.emplace_back(batch, k);  // cannot be freed while tasks run
                return FAILED;                   // the library treats it as completion unknown
            }
            engine_->freeBatchID(batch);
            if (!ok || s != OK) return FAILED;
        }
        return OK;
    }

    static int32_t sync_read(void *ctx, mws_bytes endpoint, const uint64_t *local, const uint64_t *remote,
                             const uint64_t *sizes, size_t n) noexcept {
        return guarded([&] { return self(ctx).sync(Api::kRead, endpoint, local, remote, sizes, n); },
                       int32_t{FAILED});
    }
    static int32_t sync_write(void *ctx, mws_bytes endpoint, const uint64_t *local, const uint64_t *remote,
                              const uint64_t *sizes, size_t n) noexcept {
        return guarded([&] { return self(ctx).sync(Api::kWrite, endpoint, local, remote, sizes, n); },
                       int32_t{FAILED});
    }

    /// Moves a ticket on: polls its chunk; when it completed, frees it and submits the
    /// next one. Returns the ticket's status (OK / FAILED / UNKNOWN).
    int32_t advance(Ticket &t) {
        for (;;) {
            if (t.submitted_in_chunk != 0) {
                int32_t s = poll(t.batch, t.submitted_in_chunk);
                if (s == UNKNOWN) return UNKNOWN;
                engine_->freeBatchID(t.batch);
                t.submitted_in_chunk = 0;
                if (s == FAILED) t.failed = true;
            }
            if (t.failed) return FAILED;
            if (t.next == t.requests.size()) return OK;
            std::size_t k = std::min(queue_limit_, t.requests.size() - t.next);
            bool allocated = false;
            bool ok = submit_chunk(t.requests, t.next, k, t.batch, allocated);
            if (!allocated) {
                t.failed = true;
                return FAILED;
            }
            t.submitted_in_chunk = k;
            t.next += k;
            if (!ok) t.failed = true;  // poll the admitted part before reporting
        }
    }

    static int32_t submit_with_ticket(void *ctx, uint32_t direction, mws_bytes endpoint, const uint64_t *local,
                                      const uint64_t *remote, const uint64_t *sizes, size_t n,
                                      uint64_t *ticket) noexcept {
        return guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            SegmentHandle seg{};
            if (ticket == nullptr || !s.segment(std::string(endpoint.ptr, endpoint.len), seg)) return int32_t{FAILED};
            OpCode op = direction == MWS_TRANSFER_READ ? Api::kRead : Api::kWrite;
            Ticket t{op, seg, s.requests(op, seg, local, remote, sizes, n)};
            std::size_t k = std::min(s.queue_limit_, n);
            bool allocated = false;
            bool ok = s.submit_chunk(t.requests, 0, k, t.batch, allocated);
            if (!allocated) return int32_t{FAILED};  // nothing submitted, no ticket
            t.submitted_in_chunk = k;
            t.next = k;
            if (!ok) t.failed = true;
            uint64_t id = s.next_ticket_++;
            s.tickets_.emplace(id, std::move(t));
            *ticket = id;
            return int32_t{OK};
        }, int32_t{FAILED});
    }

    static int32_t ticket_status(void *ctx, uint64_t ticket, int32_t *status) noexcept {
        return guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.tickets_.find(ticket);
            if (it == s.tickets_.end() || status == nullptr) return int32_t{FAILED};  // unknown ticket: an error
            *status = s.advance(it->second);
            return int32_t{OK};
        }, int32_t{FAILED});
    }

    static int32_t ticket_drain(void *ctx, uint64_t ticket, uint64_t timeout_ms, int32_t *status) noexcept {
        return guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.tickets_.find(ticket);
            if (it == s.tickets_.end() || status == nullptr) return int32_t{FAILED};
            Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
            int32_t st = s.advance(it->second);
            while (st == UNKNOWN && Clock::now() < deadline) st = s.advance(it->second);
            *status = st;
            return int32_t{OK};
        }, int32_t{FAILED});
    }

    static void ticket_release(void *ctx, uint64_t ticket) noexcept {
        guarded([&] {
            TeVtable &s = self(ctx);
            std::lock_guard<std::mutex> g(s.mu_);
            auto it = s.tickets_.find(ticket);
            if (it == s.tickets_.end()) return 0;
            Ticket &t = it->second;
            if (t.submitted_in_chunk != 0 && !s.free_if_done(t.batch, t.submitted_in_chunk)) {
                s.zombies_.emplace_back(t.batch, t.submitted_in_chunk);
            }
            s.tickets_.erase(it);
            return 0;
        }, 0);
    }

    Engine *engine_;
    std::size_t queue_limit_;
    std::mutex mu_;
    std::map<std::string, SegmentHandle> segments_;
    std::map<uint64_t, Ticket> tickets_;
    std::vector<std::pair<BatchID, std::size_t>> zombies_;  ///< native batches still running
    uint64_t next_ticket_ = 1;
    std::size_t native_batches_ = 0, largest_ = 0;
};


// ---- the stand-in ------------------------------------------------------------------

namespace standin {

/// mooncake::Status in miniature: ok() and a message.
struct Status {
    int code = 0;
    std::string message;
    bool ok() const { return code == 0; }
    std::string ToString() const { return ok() ? "OK" : message; }
    static Status OK() { return Status{}; }
    static Status Error(std::string m) { return Status{-1, std::move(m)}; }
};

using SegmentID = int32_t;
using SegmentHandle = SegmentID;
using BatchID = uint64_t;
constexpr BatchID INVALID_BATCH_ID = UINT64_MAX;

struct TransferRequest {
    enum OpCode { READ, WRITE };
    OpCode opcode;
    void *source;
    SegmentID target_id;
    uint64_t target_offset;
    size_t length;
};

enum TransferStatusEnum { WAITING, PENDING, INVALID, CANCELED, COMPLETED, TIMEOUT, FAILED };

struct TransferStatus {
    TransferStatusEnum s;
    size_t transferred_bytes;
};

class TransferEngine;

/// The "network": segment names -> engines of this process (what the metadata service
/// or the P2P handshake resolves), and one lock for every stand-in call.
struct Fabric {
    std::mutex mu;
    std::map<std::string, TransferEngine *> segments;
};

/// In-process stand-in of mooncake::TransferEngine: the same calls, with the
/// observable semantics the adapter depends on. A task runs when it is polled for the
/// second time (the first poll reports PENDING), so status polling is exercised.
class TransferEngine {
public:
    explicit TransferEngine(Fabric &fabric, std::size_t queue_limit = 1024) : fabric_(&fabric), limit_(queue_limit) {}
    TransferEngine(const TransferEngine &) = delete;
    TransferEngine &operator=(const TransferEngine &) = delete;
    ~TransferEngine() {
        std::lock_guard<std::mutex> g(fabric_->mu);
        if (!name_.empty()) fabric_->segments.erase(name_);
    }

    /// Publishes this engine's segment as `local_server_name`. -1 if the name is taken.
    int init(const std::string & /*metadata_conn_string*/, const std::string &local_server_name,
             const std::string & /*ip_or_host_name*/ = "", uint64_t /*rpc_port*/ = 12345) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        if (!name_.empty() || !fabric_->segments.emplace(local_server_name, this).second) return -1;
        name_ = local_server_name;
        return 0;
    }

    /// 0, or -7 for an overlap with an existing registration (as the real engine), -1
    /// for an empty range.
    int registerLocalMemory(void *addr, size_t length, const std::string & /*location*/ = "*",
                            bool /*remote_accessible*/ = true, bool /*update_metadata*/ = true) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        auto a = reinterpret_cast<uintptr_t>(addr);
        if (addr == nullptr || length == 0) return -1;
        for (const auto &r : regs_) {
            if (a < r.first + r.second && r.first < a + length) return -7;
        }
        regs_.emplace(a, length);
        return 0;
    }

    /// 0, or -3 when `addr` is not the start of a registration.
    int unregisterLocalMemory(void *addr, bool /*update_metadata*/ = true) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        return regs_.erase(reinterpret_cast<uintptr_t>(addr)) == 1 ? 0 : -3;
    }

    /// A handle (>= 0) for a published segment, -1 for an unknown name.
    SegmentHandle openSegment(const std::string &segment_name) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        if (fabric_->segments.count(segment_name) == 0) return -1;
        for (std::size_t i = 0; i < opened_.size(); ++i) {
            if (opened_[i] == segment_name) return static_cast<SegmentHandle>(i);
        }
        opened_.push_back(segment_name);
        return static_cast<SegmentHandle>(opened_.size() - 1);
    }

    BatchID allocateBatchID(size_t batch_size) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        if (batch_size == 0) return INVALID_BATCH_ID;
        BatchID id = 0x5eed0000ull + next_batch_++;  // not a pointer: unknown ids are detectable
        batches_[id].capacity = batch_size;
        return id;
    }

    /// Queues the entries. Unknown batch or capacity exceeded: an error, nothing queued.
    /// Past the per-peer queue limit the rest of the entries is rejected (FAILED) and
    /// the call reports an error, while the admitted part still runs (as TCP does).
    Status submitTransfer(BatchID batch_id, const std::vector<TransferRequest> &entries) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        auto it = batches_.find(batch_id);
        if (it == batches_.end()) return Status::Error("submitTransfer: unknown batch id");
        Batch &b = it->second;
        if (b.tasks.size() + entries.size() > b.capacity) return Status::Error("submitTransfer: batch capacity exceeded");
        bool rejected = false;
        for (const TransferRequest &r : entries) {
            Task t{r, PENDING, 0};
            if (r.target_id < 0 || static_cast<std::size_t>(r.target_id) >= opened_.size()) {
                t.state = INVALID;
                rejected = true;
            } else if (queued_[r.target_id] >= limit_) {
                t.state = FAILED;  // queue full
                rejected = true;
                rejections += 1;
            } else {
                queued_[r.target_id] += 1;
                max_queued = std::max(max_queued, queued_[r.target_id]);
            }
            b.tasks.push_back(t);
        }
        submissions += 1;
        return rejected ? Status::Error("submitTransfer: queue full or invalid target") : Status::OK();
    }

    /// Unknown batch or task: an error status (never a crash).
    Status getTransferStatus(BatchID batch_id, size_t task_id, TransferStatus &status) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        auto it = batches_.find(batch_id);
        if (it == batches_.end() || task_id >= it->second.tasks.size()) {
            return Status::Error("getTransferStatus: unknown batch or task");
        }
        Task &t = it->second.tasks[task_id];
        if (t.state == PENDING && ++t.polls >= 2) run(t);
        status = TransferStatus{t.state, t.state == COMPLETED ? t.req.length : 0};
        return Status::OK();
    }

    /// Unknown batch, or tasks still pending: an error (the batch stays).
    Status freeBatchID(BatchID batch_id) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        auto it = batches_.find(batch_id);
        if (it == batches_.end()) return Status::Error("freeBatchID: unknown batch id");
        for (const Task &t : it->second.tasks) {
            if (t.state == PENDING) return Status::Error("freeBatchID: tasks pending");
        }
        batches_.erase(it);
        return Status::OK();
    }

    // Test hooks.
    /// The `n`-th task that runs from now on fails without moving bytes (n = 0: the next).
    void fail_task_after(long long n) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        fail_countdown_ = n;
    }
    std::size_t registration_count() {
        std::lock_guard<std::mutex> g(fabric_->mu);
        return regs_.size();
    }
    std::size_t open_batches() {
        std::lock_guard<std::mutex> g(fabric_->mu);
        return batches_.size();
    }
    std::size_t rejections = 0, max_queued = 0, submissions = 0;

private:
    struct Task {
        TransferRequest req;
        TransferStatusEnum state;
        int polls;
    };
    struct Batch {
        std::size_t capacity = 0;
        std::vector<Task> tasks;
    };

    bool registered(uintptr_t a, size_t n) const {
        auto it = regs_.upper_bound(a);
        if (it == regs_.begin()) return false;
        --it;
        return a >= it->first && n <= it->second && a - it->first <= it->second - n;
    }

    // Under fabric_->mu.
    void run(Task &t) {
        queued_[t.req.target_id] -= 1;
        auto peer = fabric_->segments.find(opened_[static_cast<std::size_t>(t.req.target_id)]);
        auto local = reinterpret_cast<uintptr_t>(t.req.source);
        bool fail = fail_countdown_ == 0;
        if (fail_countdown_ >= 0) fail_countdown_ -= 1;
        // Both sides must be registered (RDMA checks both; TCP only the remote one).
        if (fail || peer == fabric_->segments.end() || !registered(local, t.req.length) ||
            !peer->second->registered(static_cast<uintptr_t>(t.req.target_offset), t.req.length)) {
            t.state = FAILED;
            return;
        }
        void *remote = reinterpret_cast<void *>(static_cast<uintptr_t>(t.req.target_offset));
        if (t.req.opcode == TransferRequest::READ) {
            std::memmove(t.req.source, remote, t.req.length);
        } else {
            std::memmove(remote, t.req.source, t.req.length);
        }
        t.state = COMPLETED;
    }

    Fabric *fabric_;
    std::size_t limit_;
    std::string name_;
    std::map<uintptr_t, size_t> regs_;
    std::vector<std::string> opened_;
    std::map<SegmentID, std::size_t> queued_;
    std::map<BatchID, Batch> batches_;
    uint64_t next_batch_ = 1;
    long long fail_countdown_ = -1;
};

}  // namespace standin

/// The stand-in's types for TeVtable.
struct StandInApi {
    using Engine = standin::TransferEngine;
    using Request = standin::TransferRequest;
    using BatchID = standin::BatchID;
    using SegmentHandle = standin::SegmentHandle;
    using TransferStatus = standin::TransferStatus;
    static constexpr BatchID kInvalidBatch = standin::INVALID_BATCH_ID;
    static constexpr Request::OpCode kRead = Request::READ;
    static constexpr Request::OpCode kWrite = Request::WRITE;
    static bool completed(const TransferStatus &s) { return s.s == standin::COMPLETED; }
    static bool failed(const TransferStatus &s) {
        return s.s == standin::FAILED || s.s == standin::TIMEOUT || s.s == standin::INVALID ||
               s.s == standin::CANCELED;
    }
};

#ifdef MWS_HAVE_MOONCAKE
/// Mooncake's own types for TeVtable (transfer_engine.h / transport.h).
struct MooncakeApi {
    using Engine = mooncake::TransferEngine;
    using Request = mooncake::TransferRequest;
    using BatchID = mooncake::BatchID;
    using SegmentHandle = mooncake::SegmentHandle;
    using TransferStatus = mooncake::TransferStatus;
    static constexpr BatchID kInvalidBatch = mooncake::INVALID_BATCH_ID;
    static constexpr Request::OpCode kRead = Request::READ;
    static constexpr Request::OpCode kWrite = Request::WRITE;
    static bool completed(const TransferStatus &s) { return s.s == mooncake::TransferStatusEnum::COMPLETED; }
    // The cancelled state is spelt differently across Mooncake versions; it is not
    // reported by the TCP and RDMA transports, so it stays "not terminal" here and a
    // batch in it ends by the adapter's batch_timeout (completion unknown).
    static bool failed(const TransferStatus &s) {
        return s.s == mooncake::TransferStatusEnum::FAILED || s.s == mooncake::TransferStatusEnum::TIMEOUT ||
               s.s == mooncake::TransferStatusEnum::INVALID;
    }
};
#endif

}  // namespace mcte

namespace {

using namespace mwsmodel;

void require(bool ok, const std::string &what) {
    if (!ok) throw std::runtime_error("check failed: " + what);
}

#ifndef MWS_HAVE_MOONCAKE
using Adapter = mcte::TeVtable<mcte::StandInApi>;

/// One instance (trainer or server): a model, one stand-in engine and adapter per
/// participant (a process per rank in real life), all published on one fabric.
struct Instance {
    HostModel model;
    std::map<std::string, std::unique_ptr<mcte::standin::TransferEngine>> engines;
    std::map<std::string, std::unique_ptr<Adapter>> adapters;

    Instance(mcte::standin::Fabric &fabric, const std::string &set, const Layout &layout,
             const std::vector<TensorDef> &defs, bool fill, const std::string &instance, const std::string &prefix)
        : model(placement_json(set, layout, defs, 1), defs, fill, instance) {
        model.endpoint_prefix = prefix;
        model.make_bindings(instance, 1);
        for (const auto &b : model.buffers) {
            auto e = std::make_unique<mcte::standin::TransferEngine>(fabric);
            require(e->init("P2PHANDSHAKE", prefix + b.first + ":17000") == 0, "engine init");
            adapters[b.first] = std::make_unique<Adapter>(*e);
            engines[b.first] = std::move(e);
        }
    }
    /// The owners register their whole allocations on their own engines.
    void register_all() {
        for (auto &b : model.buffers) require(engines[b.first]->registerLocalMemory(b.second.data(), b.second.size()) == 0, "register");
    }
    void unregister_all() {
        for (auto &b : model.buffers) require(engines[b.first]->unregisterLocalMemory(b.second.data()) == 0, "unregister");
    }
    void reset() {
        for (auto &b : model.buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
    }
    const mws::Binding &binding(const std::string &participant) const {
        std::size_t i = 0;
        for (const auto &b : model.buffers) {
            if (b.first == participant) return model.bindings.at(i);
            ++i;
        }
        throw std::runtime_error("no participant " + participant);
    }
    std::size_t registrations() {
        std::size_t n = 0;
        for (auto &e : engines) n += e.second->registration_count();
        return n;
    }
};

struct Totals {
    std::uint64_t bytes = 0, operations = 0, engine_operations = 0, receipts = 0;
    void add(const mws_transfer_stats &s) {
        bytes += s.bytes;
        operations += s.operations;
        engine_operations += s.engine_operations;
        receipts += s.receipts;
    }
};

/// Every server participant pulls its part through its own engine.
Totals pull(Instance &src, Instance &dst, const mws::TransferPlan &plan, bool tickets,
            const mws_executor_limits *limits = nullptr) {
    Totals t;
    src.register_all();
    for (const auto &b : dst.model.buffers) {
        mws::TransferEngine engine = dst.adapters[b.first]->open(tickets);
        mws::Loader loader(engine, limits);
        mws_transfer_stats s = loader.load_live(plan, src.model.placement, src.model.binding_ptrs(),
                                                dst.model.placement, dst.binding(b.first));
        t.add(s);
        require(engine.pending_count() == 0, "nothing pending after a pull");
    }
    src.unregister_all();
    return t;
}

/// Every trainer participant pushes its part (the unselected DP replica sends nothing).
Totals push(Instance &src, Instance &dst, const mws::TransferPlan &plan, bool tickets,
            const mws_executor_limits *limits = nullptr) {
    Totals t;
    dst.register_all();
    for (const auto &b : src.model.buffers) {
        mws::TransferEngine engine = src.adapters[b.first]->open(tickets);
        mws::Sink sink(engine, limits);
        mws_transfer_stats s =
            sink.execute(plan, src.model.placement, src.binding(b.first), dst.model.placement, dst.model.binding_ptrs());
        t.add(s);
    }
    dst.unregister_all();
    return t;
}

int run_stand_in() {
    // Column splits (o_proj, down_proj) give many short rows: more than 1024 segments
    // between one source and one target participant.
    const std::vector<TensorDef> defs = model_tensors(2, 512, 2);
    mcte::standin::Fabric fabric;
    Instance src(fabric, "trainer", Layout{4, 1, 1, 2}, defs, true, "trainer", "trainer/");
    Instance dst(fabric, "serving", Layout{2, 1, 2, 1}, defs, false, "serving", "server/");
    mws::TransferPlan plan =
        mws::TransferPlan::plan(src.model.placement, dst.model.placement).bind(dst.model.binding_ptrs(), src.model.binding_ptrs());
    const std::uint64_t total = plan.total_bytes();

    // Pull and push, legacy batches and tickets; every target byte verified each time.
    for (bool tickets : {false, true}) {
        const char *mode = tickets ? "tickets" : "legacy batches";
        dst.reset();
        Totals p = pull(src, dst, plan, tickets);
        require(p.bytes == total, "pull moved every planned byte");
        std::size_t checked = dst.model.verify();
        std::printf("pull (%s): %llu bytes, %llu planned segments in %llu engine operations, %llu receipts, "
                    "%zu bytes verified\n",
                    mode, static_cast<unsigned long long>(p.bytes), static_cast<unsigned long long>(p.operations),
                    static_cast<unsigned long long>(p.engine_operations), static_cast<unsigned long long>(p.receipts),
                    checked);
        dst.reset();
        Totals w = push(src, dst, plan, tickets);
        require(w.bytes == total, "push moved every planned byte");
        checked = dst.model.verify();
        std::printf("push (%s): %llu bytes, %llu planned segments in %llu engine operations, %llu receipts, "
                    "%zu bytes verified\n",
                    mode, static_cast<unsigned long long>(w.bytes), static_cast<unsigned long long>(w.operations),
                    static_cast<unsigned long long>(w.engine_operations), static_cast<unsigned long long>(w.receipts),
                    checked);
        require(src.registrations() == 0 && dst.registrations() == 0, "no registration left behind");
    }

    // One executor batch per endpoint (max_batch_operations far above the queue limit):
    // the adapter must split it into native batches of at most 1024 requests.
    mws_executor_limits big{1u << 20, 1000000, 10000000, 3, 1000, 0};
    for (bool tickets : {false, true}) {
        dst.reset();
        std::size_t native_before = 0;
        for (auto &a : dst.adapters) native_before += a.second->native_batches();
        Totals p = pull(src, dst, plan, tickets, &big);
        std::size_t native = 0, largest = 0, rejected = 0, queued = 0;
        for (auto &a : dst.adapters) {
            native += a.second->native_batches();
            largest = std::max(largest, a.second->largest_native_batch());
        }
        for (auto &e : dst.engines) {
            rejected += e.second->rejections;
            queued = std::max(queued, e.second->max_queued);
        }
        native -= native_before;
        require(p.engine_operations > 1024 * p.receipts, "some endpoint's batch exceeds the queue limit");
        require(native > p.receipts && largest <= 1024 && queued <= 1024 && rejected == 0,
                "the adapter split every batch to the queue limit");
        std::size_t checked = dst.model.verify();
        std::printf("split (%s): %llu operations to %llu endpoints in %zu native batches (largest %zu, "
                    "peak queue %zu), %zu bytes verified\n",
                    tickets ? "tickets" : "legacy", static_cast<unsigned long long>(p.operations),
                    static_cast<unsigned long long>(p.receipts), native, largest, queued, checked);
    }

    // Negative control: an adapter that does not split overflows the stand-in's queue,
    // and the call fails (a failed ticket: nothing pending afterwards).
    {
        dst.reset();
        src.register_all();
        const std::string p0 = dst.model.buffers.begin()->first;
        Adapter unsplit(*dst.engines[p0], std::size_t{1} << 20);
        mws::TransferEngine engine = unsplit.open(true);
        mws::Loader loader(engine, &big);
        bool failed = false;
        try {
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        } catch (const mws::Error &e) {
            failed = e.status() == MWS_STORE;
        }
        src.unregister_all();
        require(failed && dst.engines[p0]->rejections > 0, "an unsplit batch over the queue limit fails");
        require(engine.pending_count() == 0 && dst.engines[p0]->open_batches() == 0 && dst.registrations() == 0,
                "the failed call leaves nothing pending or registered");
        std::printf("unsplit batch over the queue limit: refused by the engine (%zu requests rejected), call failed\n",
                    dst.engines[p0]->rejections);
    }

    // An engine failure mid-transfer: the call fails, nothing is pending, registered or
    // reported (the loader's statistics stay empty), and a retry succeeds.
    {
        dst.reset();
        src.register_all();
        const std::string p0 = dst.model.buffers.begin()->first;
        mws::TransferEngine engine = dst.adapters[p0]->open(true);
        mws::Loader loader(engine);
        dst.engines[p0]->fail_task_after(100);
        bool failed = false;
        std::string message;
        try {
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        } catch (const mws::Error &e) {
            failed = e.status() == MWS_STORE;
            message = e.what();
        }
        require(failed, "an engine failure fails the call");
        require(message.find("FAILED") != std::string::npos, "the failure is a known failure: " + message);
        mws_transfer_stats s = loader.stats();
        require(s.bytes == 0 && s.receipts == 0, "nothing reported updated");
        require(engine.pending_count() == 0 && dst.engines[p0]->open_batches() == 0 && dst.registrations() == 0,
                "nothing pending or registered after the failure");
        dst.engines[p0]->fail_task_after(-1);
        mws_transfer_stats ok =
            loader.load_live(plan, src.model.placement, src.model.binding_ptrs(), dst.model.placement, dst.binding(p0));
        require(ok.bytes > 0, "retry");
        src.unregister_all();
        std::printf("engine failure: call failed (%s); retry moved %llu bytes\n", message.c_str(),
                    static_cast<unsigned long long>(ok.bytes));
    }

    // Unknown ids are errors, never crashes: a ticket the adapter never issued, and a
    // native batch id the engine never allocated.
    {
        Adapter &a = *dst.adapters.begin()->second;
        mws_transfer_engine_vtable vt = Adapter::vtable(true);
        std::int32_t status = 0;
        require(vt.ticket_status(&a, 987654321, &status) != 0, "unknown ticket -> error");
        require(vt.ticket_drain(&a, 987654321, 10, &status) != 0, "unknown ticket drain -> error");
        vt.ticket_release(&a, 987654321);
        mcte::standin::TransferStatus st{};
        require(!dst.engines.begin()->second->getTransferStatus(42, 0, st).ok(), "unknown batch id -> error status");
        require(!dst.engines.begin()->second->freeBatchID(42).ok(), "unknown batch id -> error on free");
    }
    std::printf("in-process Mooncake TE stand-in, TP4 x DP2 -> TP2 x EP2, %llu bytes per transfer: "
                "every target byte verified: OK\n",
                static_cast<unsigned long long>(total));
    return 0;
}
#else
/// With the real engine: initialise it, register two buffers, move 4 MiB from one to
/// the other through the adapter (a loopback read from this engine's own segment) and
/// compare. The two-process live transfer on the real engine is the Python path's
/// test (python/tests/test_te_two_process.py).
int run_real(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s METADATA (P2PHANDSHAKE or http://host:port/metadata) [LOCAL_NAME]\n", argv[0]);
        return 2;
    }
    mooncake::TransferEngine engine(false);
    const std::string local = argc > 2 ? argv[2] : "127.0.0.1";
    if (engine.init(argv[1], local) != 0) {
        std::fprintf(stderr, "TransferEngine::init failed\n");
        return 1;
    }
    if (engine.installTransport("tcp", nullptr) == nullptr) {
        std::fprintf(stderr, "installTransport(tcp) failed\n");
        return 1;
    }
    mcte::TeVtable<mcte::MooncakeApi> adapter(engine);
    mws::TransferEngine mws_engine = adapter.open(true);
    std::vector<unsigned char> a(4u << 20), b(4u << 20, 0);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 131 + 7);
    mws_engine.register_memory(a.data(), a.size());
    mws_engine.register_memory(b.data(), b.size());
    mws_transfer_engine_vtable vt = decltype(adapter)::vtable(false);
    const std::string segment = engine.getLocalIpAndPort();
    std::vector<std::uint64_t> local_addrs, remote_addrs, sizes;
    for (std::size_t off = 0; off < a.size(); off += 64u << 10) {
        local_addrs.push_back(reinterpret_cast<std::uintptr_t>(b.data() + off));
        remote_addrs.push_back(reinterpret_cast<std::uintptr_t>(a.data() + off));
        sizes.push_back(64u << 10);
    }
    int32_t rc = vt.batch_transfer_sync_read(&adapter, mws_bytes{segment.data(), segment.size()}, local_addrs.data(),
                                             remote_addrs.data(), sizes.data(), sizes.size());
    mws_engine.unregister_memory(b.data());
    mws_engine.unregister_memory(a.data());
    require(rc == 0 && a == b, "loopback read through the adapter");
    std::printf("Mooncake TransferEngine (%s): loopback read of %zu bytes through the adapter: bytes verified: OK\n",
                segment.c_str(), a.size());
    return 0;
}
#endif

}  // namespace

int main(int argc, char **argv) {
    try {
#ifdef MWS_HAVE_MOONCAKE
        return run_real(argc, argv);
#else
        (void)argc;
        (void)argv;
        return run_stand_in();
#endif
    } catch (const std::exception &e) {
        std::fprintf(stderr, "mooncake_te_vtable: %s\n", e.what());
        return 1;
    }
}
