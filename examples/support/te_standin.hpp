// te_standin.hpp: an in-process STAND-IN of Mooncake's Transfer Engine
// (`mooncake::TransferEngine`) and the engine-vtable adapter over it, shared by the
// examples that run everywhere without Mooncake (examples/mooncake_te_vtable.cpp,
// examples/serving_engine.cpp).
//
// standin::TransferEngine has the same method names, signatures and observable
// semantics as mooncake::TransferEngine as far as the adapter depends on them
// (segments by name, registrations checked on both sides as RDMA does, a per-peer
// queue of 1024 transfers with partial admission past it, status polling, unknown
// batch id -> error status, freeBatchID refused while tasks are pending,
// sendNotifyByName / getNotifies). Every engine of a process is published on one
// `standin::Fabric` (what the metadata service or the P2P handshake resolves).
// mcte::TeVtable<StandInApi> is the adapter's mapping (TeCore, mooncake_te_core.hpp)
// instantiated with the stand-in's types, as the real adapter
// (mooncake_weight_store::mooncake_te) instantiates it with Mooncake's.
#ifndef MWS_EXAMPLES_TE_STANDIN_HPP
#define MWS_EXAMPLES_TE_STANDIN_HPP

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_te_core.hpp"

namespace mcte {

/// The adapter over an engine described by `Api`: TeCore plus `open(with_tickets)`
/// (a library engine with or without the ticketed entries).
template <class Api>
class TeVtable : public mws::mooncake_te::TeCore<Api> {
public:
    using Core = mws::mooncake_te::TeCore<Api>;
    explicit TeVtable(typename Api::Engine &engine, mws::mooncake_te::Options options = {})
        : Core(engine, std::move(options)) {}
    mws_transfer_engine_vtable vtable_with(bool with_tickets) const {
        mws_transfer_engine_vtable vt = Core::vtable();
        if (!with_tickets) {
            vt.submit_with_ticket = nullptr;
            vt.ticket_status = nullptr;
            vt.ticket_drain = nullptr;
            vt.ticket_release = nullptr;
        }
        return vt;
    }
    mws::TransferEngine open(bool with_tickets) {
        return mws::TransferEngine::from_vtable(vtable_with(with_tickets), this->ctx());
    }
    std::size_t native_batches() const { return this->counters().native_batches; }
    std::size_t largest_native_batch() const { return this->counters().largest_batch; }
};

/// Options without staged reads or request splitting: one native request per library
/// operation (the split and failure checks count requests).
inline mws::mooncake_te::Options plain_options(std::size_t queue_limit = 1024) {
    mws::mooncake_te::Options o;
    o.queue_limit = queue_limit;
    o.staging_bytes = 0;
    o.max_request_bytes = 0;
    return o;
}

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

struct NotifyDesc {
    std::string name;
    std::string notify_msg;
};

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
/// observable semantics the adapter depends on. A batch's tasks run at its second
/// status poll (the first poll reports them PENDING), so status polling is exercised.
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

    /// The published segment name (mooncake: "<ip>:<rpc port>"; here the init name).
    std::string getLocalIpAndPort() {
        std::lock_guard<std::mutex> g(fabric_->mu);
        return name_;
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
        // The batch progresses in the background of status polls: the first poll of a
        // batch reports its tasks pending, later polls find them run (in order).
        Batch &batch = it->second;
        if (++batch.polls >= 2) {
            for (Task &p : batch.tasks) {
                if (p.state == PENDING) run(p);
            }
        }
        Task &t = batch.tasks[task_id];
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

    /// Delivers a notification to the engine published as `remote_agent`: 0, or -200
    /// (ERR_METADATA) for an unknown segment (as the real engine).
    int sendNotifyByName(std::string remote_agent, NotifyDesc notify_msg) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        auto peer = fabric_->segments.find(remote_agent);
        if (peer == fabric_->segments.end()) return -200;
        peer->second->notifies_.push_back(std::move(notify_msg));
        return 0;
    }
    /// Moves every received notification to `out` (as the real engine: drains).
    int getNotifies(std::vector<NotifyDesc> &out) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        for (auto &n : notifies_) out.push_back(std::move(n));
        notifies_.clear();
        return 0;
    }

    // Test hooks.
    /// The `n`-th task that runs from now on fails without moving bytes (n = 0: the next).
    void fail_task_after(long long n) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        fail_countdown_ = n;
    }
    /// The next task whose local buffer starts inside [begin, begin + n) fails.
    void fail_next_local_in(const void *begin, std::size_t n) {
        std::lock_guard<std::mutex> g(fabric_->mu);
        fail_local_ = {reinterpret_cast<uintptr_t>(begin), n};
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
        int polls = 0;
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
        if (fail_local_.second != 0 && local - fail_local_.first < fail_local_.second) {
            fail = true;
            fail_local_ = {0, 0};
        }
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
    std::pair<uintptr_t, std::size_t> fail_local_{0, 0};
    std::vector<NotifyDesc> notifies_;
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
        return s.s == standin::FAILED || s.s == standin::INVALID || s.s == standin::CANCELED;
    }
    using Status = standin::Status;
    using NotifyDesc = standin::NotifyDesc;
    static bool invalid_segment(SegmentHandle h) { return h < 0; }
    static std::int32_t status_code(const Status &) { return mws::mooncake_te::kErrStatusBase - 1; }
    static std::string status_text(const Status &s) { return s.ToString(); }
};
}  // namespace mcte

#endif  // MWS_EXAMPLES_TE_STANDIN_HPP
