// te_role.cpp: a trainer or server PROCESS on the REAL Mooncake Transfer Engine (one
// mooncake::TransferEngine per process, TCP on loopback, P2PHANDSHAKE), driven by
// te_two_process.py through JSON lines on stdin/stdout (only JSON crosses processes:
// placements, bindings, logical plans, results). TE logs go to stderr.
//
// The process owns its TE and registers each participant's buffer with it at set-up
// (the serving engine's own registration); the library runs over it through the
// adapter (mooncake_weight_store::mooncake_te) with local_pre_registered = 1, so the
// adapter must never unregister those buffers. Trainer: TP4 x DP2 (fills its buffers
// with the generation's bytes); server: TP2 x EP2 (targets, reset to 0xA5).
//
// A test hook wraps the adapter's vtable: it counts engine-bound calls, records the
// notifications the sink sends (for the forged/replayed/truncated/stale checks), and
// can pause before the second native submission of a call (so the driver kills the
// peer between batches: "mid-transfer").
//
// Commands (one JSON object per line; each answered by one JSON line):
//   setup {role, generation, layers, hidden, experts, lease}     -> placement, bindings
//   peer {placement, bindings}
//   plan                          (server) -> logical plan JSON source -> target
//   pull {tickets, split, pause, stale}       (server, reader mode, every participant)
//   push {plan, tickets, key, pause, stale}    (trainer, notified sink, every participant)
//   accept {key, timeout_ms}      (server) poll getNotifies -> per-participant outcome
//   forge {}                      (trainer) re-send recorded notifications, altered
//   verify / reset / state / drain / quit
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "mooncake_weight_store/mooncake_te.hpp"
#include "support/mini_json.h"
#include "support/mws_model.hpp"
#include "transfer_engine.h"

using namespace mwsmodel;

namespace {

// ---- JSON output ----------------------------------------------------------------
std::string q(const std::string &s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += static_cast<char>(c);
        } else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else {
            o += static_cast<char>(c);
        }
    }
    return o + "\"";
}
std::string num(std::uint64_t v) { return std::to_string(v); }
std::string strs(const std::vector<std::string> &v) {
    std::string o = "[";
    for (std::size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + q(v[i]);
    return o + "]";
}

struct Json {
    mj_value *v = nullptr;
    explicit Json(const std::string &text) : v(mj_parse(text.data(), text.size())) {
        if (v == nullptr) throw std::runtime_error("malformed JSON command");
    }
    ~Json() { mj_free(v); }
    Json(const Json &) = delete;
    Json &operator=(const Json &) = delete;
};
std::string get_str(const mj_value *v, const char *k, const std::string &dflt = "") {
    const mj_value *x = mj_get(v, k);
    return x != nullptr && x->kind == MJ_STRING ? std::string(x->str) : dflt;
}
std::uint64_t get_u64(const mj_value *v, const char *k, std::uint64_t dflt = 0) {
    const mj_value *x = mj_get(v, k);
    return x != nullptr && x->kind == MJ_NUMBER ? x->u64 : dflt;
}
bool get_bool(const mj_value *v, const char *k) {
    const mj_value *x = mj_get(v, k);
    return x != nullptr && x->kind == MJ_BOOL && x->boolean;
}

std::string unhex(const std::string &h) {
    std::string o;
    for (std::size_t i = 0; i + 1 < h.size(); i += 2) o += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    return o;
}

// ---- the test hook around the adapter's vtable --------------------------------------
struct Hook {
    mws_transfer_engine_vtable inner{};
    void *inner_ctx = nullptr;
    std::atomic<std::uint64_t> submits{0};  // native-bound submissions (batches) this call
    bool pause = false;                      // pause before the second submission of a call
    bool paused = false;
    std::vector<std::pair<std::string, std::string>> sent;  // (endpoint, message) notifications

    void maybe_pause() {
        if (pause && !paused && submits.fetch_add(1) == 1) {
            paused = true;
            std::printf("{\"paused\":true}\n");
            std::fflush(stdout);
            std::string line;
            std::getline(std::cin, line);  // the driver kills the peer, then says go
        }
    }
    static Hook &h(void *ctx) { return *static_cast<Hook *>(ctx); }
    static std::uint64_t id(void *c) { return h(c).inner.get_engine_id(h(c).inner_ctx); }
    static int32_t reg(void *c, std::uint64_t a, std::uint64_t n, int32_t d) {
        return h(c).inner.register_memory(h(c).inner_ctx, a, n, d);
    }
    static int32_t unreg(void *c, std::uint64_t a) { return h(c).inner.unregister_memory(h(c).inner_ctx, a); }
    static int32_t sw(void *c, mws_bytes e, const std::uint64_t *l, const std::uint64_t *r, const std::uint64_t *s,
                      size_t n) {
        h(c).maybe_pause();
        return h(c).inner.batch_transfer_sync_write(h(c).inner_ctx, e, l, r, s, n);
    }
    static int32_t sr(void *c, mws_bytes e, const std::uint64_t *l, const std::uint64_t *r, const std::uint64_t *s,
                      size_t n) {
        h(c).maybe_pause();
        return h(c).inner.batch_transfer_sync_read(h(c).inner_ctx, e, l, r, s, n);
    }
    static int32_t sub(void *c, uint32_t d, mws_bytes e, const std::uint64_t *l, const std::uint64_t *r,
                       const std::uint64_t *s, size_t n, std::uint64_t *t) {
        h(c).maybe_pause();
        return h(c).inner.submit_with_ticket(h(c).inner_ctx, d, e, l, r, s, n, t);
    }
    static int32_t st(void *c, std::uint64_t t, int32_t *s) { return h(c).inner.ticket_status(h(c).inner_ctx, t, s); }
    static int32_t dr(void *c, std::uint64_t t, std::uint64_t ms, int32_t *s) {
        return h(c).inner.ticket_drain(h(c).inner_ctx, t, ms, s);
    }
    static void rel(void *c, std::uint64_t t) { h(c).inner.ticket_release(h(c).inner_ctx, t); }
    static int32_t notify(void *c, mws_bytes e, mws_bytes name, mws_bytes m) {
        h(c).sent.emplace_back(std::string(e.ptr, e.len), std::string(m.ptr, m.len));
        return h(c).inner.send_notify(h(c).inner_ctx, e, name, m);
    }
    mws_transfer_engine_vtable vtable() const {
        mws_transfer_engine_vtable vt = inner;
        vt.get_engine_id = &id;
        vt.register_memory = &reg;
        vt.unregister_memory = &unreg;
        vt.batch_transfer_sync_write = &sw;
        vt.batch_transfer_sync_read = &sr;
        if (inner.submit_with_ticket != nullptr) {
            vt.submit_with_ticket = &sub;
            vt.ticket_status = &st;
            vt.ticket_drain = &dr;
            vt.ticket_release = &rel;
        }
        vt.send_notify = &notify;
        return vt;
    }
};

// ---- a counting allocation guard (pins) --------------------------------------------
std::atomic<long> g_pins_held{0};
std::atomic<std::uint64_t> g_pins_total{0};
int32_t pin(void *, const char *, const char *, const char *const *, size_t, mws_binding **, std::uint64_t *token) {
    *token = ++g_pins_total;
    g_pins_held += 1;
    return 0;
}
int32_t unpin(void *, std::uint64_t, uint32_t) {
    g_pins_held -= 1;
    return 0;
}
mws_guard_vtable counting_guard() {
    mws_guard_vtable g{};
    g.size = sizeof g;
    g.version = MWS_GUARD_VTABLE_VERSION;
    g.acquire = &pin;
    g.release = &unpin;
    return g;
}
const mws_guard_vtable g_guard = counting_guard();

// ---- the process ------------------------------------------------------------------
struct Role {
    mooncake::TransferEngine te{false};
    std::string segment;
    std::string role;
    std::uint64_t generation = 0;
    std::unique_ptr<HostModel> model;
    std::vector<std::string> participants;
    std::vector<std::string> wire;              // own bindings as wire JSON
    std::vector<mws::Binding> bindings;         // own, rebuilt from the wire
    std::unique_ptr<mws::Placement> peer_placement;
    std::vector<mws::Binding> peer_bindings;
    std::vector<void *> owner_registered;       // registered by the process itself
    std::unique_ptr<mws::TransferPlan> kept;    // a plan bound earlier ("bind"), for stale checks
    std::string acceptor_plan;                  // the logical plan JSON the acceptors belong to
    std::map<std::string, std::unique_ptr<mws::NotifyAcceptor>> acceptors;
    std::unique_ptr<mws::NotifyRouter> router;  // routes each message to its acceptor

    Role() {
        const char *port_env = std::getenv("MWS_TE_RPC_PORT");
        std::uint64_t port = port_env ? std::strtoull(port_env, nullptr, 10) : 0;
        if (port == 0) port = 20000 + static_cast<std::uint64_t>(getpid() % 20000);
        if (te.init("P2PHANDSHAKE", "127.0.0.1:" + std::to_string(port), "127.0.0.1", port) != 0)
            throw std::runtime_error("TransferEngine::init failed");
        if (te.installTransport("tcp", nullptr) == nullptr) throw std::runtime_error("installTransport(tcp) failed");
        segment = te.getLocalIpAndPort();
    }

    void release_buffers() {
        for (void *p : owner_registered) te.unregisterLocalMemory(p);
        owner_registered.clear();
    }

    std::string wire_of(const std::string &p, const std::string &lease) {
        std::string o = "{\"participant_id\":" + q(p) + ",\"instance_id\":" + q(role + "-" + p) +
                        ",\"lease_id\":" + q(lease) + ",\"generation\":" + num(generation) +
                        ",\"endpoint\":" + q(segment) + ",\"fragments\":[";
        std::size_t k = 0;
        for (const View &v : model->views) {
            if (v.participant != p) continue;
            auto addr = reinterpret_cast<std::uintptr_t>(model->buffers.at(p).data() + v.offset);
            o += std::string(k ? "," : "") + "[" + q(v.pfid) + "," + num(addr) + "," + num(v.nbytes) + "," +
                 q(p + ":rt" + std::to_string(k)) + "]";
            ++k;
        }
        return o + "]}";
    }

    static mws::Binding from_wire(const mws::Placement &placement, const mj_value *w) {
        mws::BindingOptions o = mws::BindingOptions::for_placement(placement);
        o.participant_id = get_str(w, "participant_id");
        o.instance_id = get_str(w, "instance_id");
        o.lease_id = get_str(w, "lease_id");
        o.lease_generation = get_u64(w, "generation");
        std::string endpoint = get_str(w, "endpoint");
        mws::Binding b(o);
        std::map<std::string, mws_placement_fragment_info> infos;
        for (std::size_t i = 0; i < placement.fragment_count(); ++i) {
            mws_placement_fragment_info f = placement.fragment(i);
            infos[f.placement_fragment_id] = f;
        }
        const mj_value *frags = mj_get(w, "fragments");
        for (std::size_t i = 0; frags != nullptr && i < frags->count; ++i) {
            const mj_value *f = mj_at(frags, i);
            std::string pfid = mj_at(f, 0)->str;
            std::uint64_t addr = mj_at(f, 1)->u64, n = mj_at(f, 2)->u64;
            std::string fid = mj_at(f, 3)->str;
            const mws_placement_fragment_info &info = infos.at(pfid);
            std::vector<std::uint64_t> shape(info.local_shape, info.local_shape + info.ndim), strides(info.ndim);
            std::uint64_t acc = info.itemsize;
            for (std::size_t d = info.ndim; d-- > 0;) {
                strides[d] = acc;
                acc *= shape[d];
            }
            mws_runtime_fragment r{};
            r.placement_fragment_id = pfid.c_str();
            r.fragment_id = fid.c_str();
            r.address = reinterpret_cast<void *>(static_cast<std::uintptr_t>(addr));
            r.nbytes = n;
            r.worker_id = o.participant_id.c_str();
            r.endpoint = endpoint.c_str();
            r.device = "cpu";
            r.itemsize = info.itemsize;
            r.local_shape = shape.data();
            r.local_shape_len = shape.size();
            r.strides_bytes = strides.data();
            r.strides_bytes_len = strides.size();
            r.storage_address = r.address;
            r.storage_nbytes = n;
            r.storage_offset_bytes = 0;
            r.memory_kind = MWS_MEMORY_HOST;
            b.add_fragment(r);
        }
        return b;
    }

    std::string setup(const mj_value *c) {
        release_buffers();
        role = get_str(c, "role");
        generation = get_u64(c, "generation", 1);
        std::uint64_t layers = get_u64(c, "layers", 2), hidden = get_u64(c, "hidden", 256),
                      experts = get_u64(c, "experts", 2);
        std::string lease = get_str(c, "lease", role + "-lease-" + num(generation));
        std::vector<TensorDef> defs = model_tensors(layers, hidden, experts);
        bool trainer = role == "trainer";
        Layout layout = trainer ? Layout{4, 1, 1, 2} : Layout{2, 1, 2, 1};
        bindings.clear();
        model = std::make_unique<HostModel>(placement_json(trainer ? "trainer" : "serving", layout, defs, generation),
                                            defs, false, role, generation);
        participants.clear();
        for (auto &b : model->buffers) participants.push_back(b.first);
        if (trainer) fill();
        // The serving engine's own registration of every participant buffer.
        for (auto &b : model->buffers) {
            int rc = te.registerLocalMemory(b.second.data(), b.second.size(), "cpu:0");
            if (rc != 0) throw std::runtime_error("owner registerLocalMemory failed: " + std::to_string(rc));
            owner_registered.push_back(b.second.data());
        }
        wire.clear();
        std::string out = "{\"placement\":" + q(std::string(model->placement.to_json())) + ",\"bindings\":[";
        for (std::size_t i = 0; i < participants.size(); ++i) {
            wire.push_back(wire_of(participants[i], lease));
            Json j(wire.back());
            bindings.push_back(from_wire(model->placement, j.v));
            out += (i ? "," : "") + wire.back();
        }
        return out + "],\"segment\":" + q(segment) + ",\"bytes\":" + num(total_bytes()) + "}";
    }

    std::uint64_t total_bytes() const {
        std::uint64_t n = 0;
        for (const View &v : model->views) n += v.nbytes;
        return n;
    }

    void fill() { model->fill_generation(generation); }
    void reset() {
        for (auto &b : model->buffers) std::fill(b.second.begin(), b.second.end(), 0xA5);
    }
    /// Per participant: the first tensor that differs from this generation's bytes.
    std::map<std::string, std::string> verify() const { return model->generation_differs(generation); }
    std::string verify_json() const {
        auto bad = verify();
        std::string o = "{";
        std::size_t i = 0;
        for (const auto &p : participants) {
            auto it = bad.find(p);
            o += (i++ ? "," : "") + q(p) + ":" + (it == bad.end() ? std::string("null") : q(it->second));
        }
        return o + "}";
    }

    std::vector<const mws::Binding *> ptrs(const std::vector<mws::Binding> &v) const {
        std::vector<const mws::Binding *> o;
        for (const auto &b : v) o.push_back(&b);
        return o;
    }

    void peer(const std::string &text, const mj_value *c) {
        (void)text;  // `placement` is a JSON string holding the document.
        peer_placement = std::make_unique<mws::Placement>(mws::Placement::from_json(get_str(c, "placement")));
        peer_bindings.clear();
        const mj_value *bs = mj_get(c, "bindings");
        for (std::size_t i = 0; bs != nullptr && i < bs->count; ++i)
            peer_bindings.push_back(from_wire(*peer_placement, mj_at(bs, i)));
    }
};

mws::mooncake_te::Options adapter_options(bool tickets, bool staging = true) {
    mws::mooncake_te::Options o;
    o.tickets = tickets;
    if (!staging) o.staging_bytes = 0;
    o.host_location = "cpu:0";
    const char *q_env = std::getenv("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER");
    if (q_env != nullptr) o.queue_limit = std::strtoull(q_env, nullptr, 10);
    o.batch_timeout = std::chrono::milliseconds(20000);
    return o;
}

std::string counters_json(const mws::mooncake_te::Counters &c) {
    return "{\"engine_calls\":" + num(c.engine_calls) + ",\"native_batches\":" + num(c.native_batches) +
           ",\"largest_batch\":" + num(c.largest_batch) + ",\"requests\":" + num(c.requests) +
           ",\"submit_errors\":" + num(c.submit_errors) + ",\"peak_in_flight\":" + num(c.peak_in_flight) +
           ",\"notifies\":" + num(c.notifies) + ",\"registrations\":" + num(c.registrations) +
           ",\"staged_runs\":" + num(c.staged_runs) + ",\"staged_ranges\":" + num(c.staged_ranges) + "}";
}

struct Session {
    Role &r;
    mws::mooncake_te::Adapter adapter;
    Hook hook;
    mws::TransferEngine engine{nullptr};

    Session(Role &role, bool tickets, bool pause, bool staging = true)
        : r(role), adapter(role.te, adapter_options(tickets, staging)) {
        hook.inner = adapter.vtable();
        hook.inner_ctx = adapter.ctx();
        hook.pause = pause;
        mws_transfer_engine_vtable vt = hook.vtable();
        engine = mws::TransferEngine::from_vtable(vt, &hook);
    }
    std::string state() {
        return "\"registered\":" + num(adapter.registered_regions()) + ",\"pins_held\":" +
               std::to_string(g_pins_held.load()) + ",\"pins_taken\":" + num(g_pins_total.load()) +
               ",\"pending\":" + num(engine.pending_count()) +
               ",\"in_flight\":" + num(adapter.batches_in_flight()) + ",\"open_tickets\":" +
               num(adapter.open_tickets()) + ",\"counters\":" + counters_json(adapter.counters());
    }
};

std::unique_ptr<Session> g_last;  // the last call's session (kept for state/drain)
std::vector<std::pair<std::string, std::string>> g_sent;  // notifications of the last push

mws_executor_limits split_limits() { return mws_executor_limits{1u << 20, 1000000, 10000000, 3, 1000, 1}; }

std::vector<mws::Binding> re_leased(const Role &r) {
    std::vector<mws::Binding> out;
    for (const std::string &w0 : r.wire) {
        std::string w = w0;
        const std::string from = "\"lease_id\":\"";
        std::size_t at = w.find(from) + from.size();
        w.replace(at, w.find('"', at) - at, "re-leased");
        Json j(w);
        out.push_back(Role::from_wire(r.model->placement, j.v));
    }
    return out;
}

mws_executor_limits call_limits(const mj_value *c) {
    if (get_bool(c, "split")) return split_limits();
    // Pausing needs several batches per call.
    if (get_bool(c, "pause")) return mws_executor_limits{64, 1000000, 10000000, 3, 1000, 0};
    return mws_executor_limits{1024, 1000000, 10000000, 3, 1000, 0};
}

/// The plan of the call: `plan` (logical JSON) bound now, the server's bindings as
/// targets and the trainer's as sources (the same bound plan on both sides).
mws::TransferPlan call_plan(Role &r, const mj_value *c, bool server) {
    mws::TransferPlan logical = mws::TransferPlan::from_json(get_str(c, "plan"));
    return server ? logical.bind(r.ptrs(r.bindings), r.ptrs(r.peer_bindings))
                  : logical.bind(r.ptrs(r.peer_bindings), r.ptrs(r.bindings));
}

std::string pull(Role &r, const std::string &text, const mj_value *c) {
    (void)text;
    bool tickets = get_bool(c, "tickets");
    std::string stale = get_str(c, "stale");
    // The split case checks the per-peer queue limit: staged reads would merge the rows.
    auto s = std::make_unique<Session>(r, tickets, get_bool(c, "pause"),
                                       !get_bool(c, "split") && !get_bool(c, "no_staging"));
    const mws::TransferPlan *plan_ptr = nullptr;
    std::unique_ptr<mws::TransferPlan> fresh;
    if (get_bool(c, "use_kept")) {
        plan_ptr = r.kept.get();
        if (plan_ptr == nullptr) throw std::runtime_error("no kept plan");
    } else {
        fresh = std::make_unique<mws::TransferPlan>(call_plan(r, c, true));
        plan_ptr = fresh.get();
    }
    mws_executor_limits limits = call_limits(c);
    mws::Loader loader(s->engine, &limits);
    mws_live_args args{};
    args.local_pre_registered = 1;
    args.guard = &g_guard;  // counts pins: none may be left held after a call
    std::uint64_t calls_before = s->adapter.counters().engine_calls;
    std::vector<mws::Binding> releases;
    if (stale == "lease") releases = re_leased(r);
    std::uint64_t bytes = 0, ops = 0, eops = 0;
    std::string failed;
    mws_status status = MWS_OK;
    try {
        for (std::size_t i = 0; i < r.bindings.size(); ++i) {
            const mws::Binding &local = stale == "lease" ? releases[i] : r.bindings[i];
            mws_transfer_stats st = loader.load_live(*plan_ptr, *r.peer_placement, r.ptrs(r.peer_bindings),
                                                     r.model->placement, local, &args);
            bytes += st.bytes;
            ops += st.operations;
            eops += st.engine_operations;
        }
    } catch (const mws::Error &e) {
        failed = e.what();
        status = e.status();
    }
    std::uint64_t calls = s->adapter.counters().engine_calls - calls_before;
    std::string out = "{\"outcome\":" + q(failed.empty() ? "ok" : "failed") + ",\"status\":" +
                      q(std::string(mws::status_name(status))) + ",\"reason\":" + q(failed) +
                      ",\"bytes\":" + num(bytes) + ",\"operations\":" + num(ops) + ",\"engine_operations\":" +
                      num(eops) + ",\"engine_calls_in_call\":" + num(calls) + ",\"verify\":" + r.verify_json() +
                      ",\"updated\":" + strs(failed.empty() ? r.participants : std::vector<std::string>{}) + "," +
                      s->state() + "}";
    g_last = std::move(s);
    return out;
}

std::string push(Role &r, const mj_value *c) {
    bool tickets = get_bool(c, "tickets");
    std::string key = unhex(get_str(c, "key")), stale = get_str(c, "stale");
    auto s = std::make_unique<Session>(r, tickets, get_bool(c, "pause"));
    const mws::TransferPlan *plan_ptr = nullptr;
    std::unique_ptr<mws::TransferPlan> fresh;
    if (get_bool(c, "use_kept")) {
        plan_ptr = r.kept.get();
        if (plan_ptr == nullptr) throw std::runtime_error("no kept plan");
    } else {
        fresh = std::make_unique<mws::TransferPlan>(call_plan(r, c, false));
        plan_ptr = fresh.get();
    }
    mws_executor_limits limits = call_limits(c);
    mws::Sink sink(s->engine, &limits);
    mws_live_args args{};
    args.local_pre_registered = 1;
    args.guard = &g_guard;  // counts pins: none may be left held after a call
    std::uint64_t calls_before = s->adapter.counters().engine_calls;
    std::uint64_t bytes = 0, ops = 0, eops = 0;
    std::string failed;
    mws_status status = MWS_OK;
    std::vector<mws::Binding> releases;
    if (stale == "lease") releases = re_leased(r);
    try {
        for (std::size_t i = 0; i < r.bindings.size(); ++i) {
            const mws::Binding &local = stale == "lease" ? releases[i] : r.bindings[i];
            mws_transfer_stats st = mws::sink_execute_notified(sink, key, *plan_ptr, r.model->placement, local,
                                                               *r.peer_placement, r.ptrs(r.peer_bindings), &args);
            bytes += st.bytes;
            ops += st.operations;
            eops += st.engine_operations;
        }
    } catch (const mws::Error &e) {
        failed = e.what();
        status = e.status();
    }
    g_sent = s->hook.sent;
    std::uint64_t calls = s->adapter.counters().engine_calls - calls_before;
    std::string out = "{\"outcome\":" + q(failed.empty() ? "ok" : "failed") + ",\"status\":" +
                      q(std::string(mws::status_name(status))) + ",\"reason\":" + q(failed) + ",\"bytes\":" +
                      num(bytes) + ",\"operations\":" + num(ops) + ",\"engine_operations\":" + num(eops) +
                      ",\"notifications\":" + num(g_sent.size()) + ",\"engine_calls_in_call\":" + num(calls) + "," +
                      s->state() + "}";
    g_last = std::move(s);
    return out;
}

/// Server: polls the engine's notifications until every participant is Updated or
/// the timeout passes; each message goes to the acceptor of its participant.
std::string accept(Role &r, const mj_value *c) {
    std::string key = unhex(get_str(c, "key"));
    std::uint64_t timeout_ms = get_u64(c, "timeout_ms", 10000);
    bool until_quiet = get_bool(c, "until_quiet");
    const std::string plan_json = get_str(c, "plan");
    if (plan_json != r.acceptor_plan || get_bool(c, "fresh") || r.acceptors.empty()) {
        // The acceptors of this generation: bound to the plan the server binds itself.
        mws::TransferPlan plan = call_plan(r, c, true);
        r.router = std::make_unique<mws::NotifyRouter>();
        r.acceptors.clear();
        for (const auto &p : r.participants) {
            r.acceptors[p] = std::make_unique<mws::NotifyAcceptor>(plan, p, key);
            r.router->add(*r.acceptors[p]);
        }
        r.acceptor_plan = plan_json;
    }
    auto &acc = r.acceptors;
    std::map<std::string, std::uint64_t> verdicts;
    std::vector<std::string> refusals;
    std::uint64_t messages = 0, others = 0;
    auto all_updated = [&] {
        for (auto &a : acc)
            if (a.second->outcome().verdict != MWS_TARGET_UPDATED) return false;
        return true;
    };
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto quiet_since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < deadline) {
        bool got = false;
        auto rest = mws::mooncake_te::poll_notifies(r.te, [&](std::string_view msg) {
            got = true;
            messages += 1;
            // The library routes each message to the acceptor of its plan and target.
            std::string why;
            std::uint32_t v = r.router->accept(msg, nullptr, nullptr, &why);
            verdicts[std::to_string(v)] += 1;
            if (v != MWS_NOTIFY_ACCEPTED) refusals.push_back(std::to_string(v) + ": " + why);
        });
        others += rest.size();
        if (got) quiet_since = std::chrono::steady_clock::now();
        if (!until_quiet && all_updated()) break;
        if (until_quiet && std::chrono::steady_clock::now() - quiet_since > std::chrono::milliseconds(1500)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto bad = r.verify();
    std::string o = "{\"outcomes\":{";
    std::size_t i = 0;
    std::vector<std::string> wrong_updated;
    for (auto &a : acc) {
        mws_notify_outcome oc = a.second->outcome();
        const char *k = oc.verdict == MWS_TARGET_UPDATED ? "updated" : oc.verdict == MWS_TARGET_TORN ? "torn" : "unchanged";
        o += (i++ ? "," : "") + q(a.first) + ":{\"kind\":" + q(k) + ",\"generation\":" + num(oc.weight_generation) +
             ",\"incomplete\":" + num(oc.incomplete) + "}";
        if (oc.verdict == MWS_TARGET_UPDATED && bad.count(a.first)) wrong_updated.push_back(a.first);
    }
    o += "},\"messages\":" + num(messages) + ",\"other_notifications\":" + num(others) + ",\"verdicts\":{";
    i = 0;
    for (auto &v : verdicts) o += (i++ ? "," : "") + q(v.first) + ":" + num(v.second);
    o += "},\"refusals\":" + strs(refusals) + ",\"verify\":" + r.verify_json() +
         ",\"updated_but_wrong\":" + strs(wrong_updated) + "}";
    return o;
}

/// Trainer: re-sends the last push's notifications altered (truncated, forged: a byte
/// of the body flipped, replayed as is, stale: the previous generation's) plus one
/// foreign notification, straight through TE's sendNotifyByName.
std::string forge(Role &r, const mj_value *c) {
    std::vector<std::pair<std::string, std::string>> stale;
    const mj_value *prev = mj_get(c, "stale_messages");
    for (std::size_t i = 0; prev != nullptr && i < prev->count; ++i)
        stale.emplace_back(mj_at(prev, i)->items[0]->str, unhex(mj_at(prev, i)->items[1]->str));
    std::uint64_t sent = 0, rc_bad = 0;
    auto send = [&](const std::string &endpoint, const std::string &name, const std::string &msg) {
        mooncake::TransferMetadata::NotifyDesc d;
        d.name = name;
        d.notify_msg = msg;
        int rc = r.te.sendNotifyByName(endpoint, d);
        sent += 1;
        rc_bad += rc != 0;
    };
    const std::string name(mws::notify_name());
    for (const auto &m : g_sent) {
        send(m.first, name, m.second.substr(0, m.second.size() / 2));  // truncated
        std::string f = m.second;
        f[f.size() - 3] ^= 0x01;  // forged: one body byte
        send(m.first, name, f);
        send(m.first, name, m.second);  // replayed
    }
    for (const auto &m : stale) send(m.first, name, m.second);  // a previous generation's
    if (!g_sent.empty()) send(g_sent.front().first, "someone-else", "not ours");
    return "{\"sent\":" + num(sent) + ",\"send_failures\":" + num(rc_bad) + "}";
}

std::string hexs(const std::string &s) {
    static const char *d = "0123456789abcdef";
    std::string o;
    for (unsigned char c : s) {
        o += d[c >> 4];
        o += d[c & 15];
    }
    return o;
}

std::string handle(Role &r, const std::string &line) {
    Json j(line);
    const mj_value *c = j.v;
    std::string op = get_str(c, "op");
    if (op == "setup") return r.setup(c);
    if (op == "peer") {
        r.peer(line, c);
        return "{}";
    }
    if (op == "plan") {
        mws::TransferPlan logical = mws::TransferPlan::plan(*r.peer_placement, r.model->placement);
        return "{\"plan\":" + q(std::string(logical.to_json())) + ",\"regions\":" + num(logical.region_count()) +
               ",\"bytes\":" + num(logical.total_bytes()) + "}";
    }
    if (op == "placement_for") {  // a placement of this model for a process of another language
        bool trainer = get_str(c, "role") == "trainer";
        std::vector<TensorDef> defs =
            model_tensors(get_u64(c, "layers", 2), get_u64(c, "hidden", 256), get_u64(c, "experts", 2));
        return "{\"placement\":" +
               q(placement_json(trainer ? "trainer" : "serving", trainer ? Layout{4, 1, 1, 2} : Layout{2, 1, 2, 1},
                                defs, get_u64(c, "generation", 1))) +
               "}";
    }
    if (op == "bind") {
        r.kept = std::make_unique<mws::TransferPlan>(call_plan(r, c, get_str(c, "side", "server") == "server"));
        return "{}";
    }
    if (op == "pull") return pull(r, line, c);
    if (op == "push") return push(r, c);
    if (op == "accept") return accept(r, c);
    if (op == "forge") return forge(r, c);
    if (op == "sent") {
        std::string o = "{\"messages\":[";
        for (std::size_t i = 0; i < g_sent.size(); ++i)
            o += (i ? "," : "") + std::string("[") + q(g_sent[i].first) + "," + q(hexs(g_sent[i].second)) + "]";
        return o + "]}";
    }
    if (op == "verify") return "{\"verify\":" + r.verify_json() + "}";
    if (op == "reset") {
        r.reset();
        return "{}";
    }
    if (op == "self_check") {
        mws::mooncake_te::Adapter a(r.te, adapter_options(true));
        std::int32_t rc = a.self_check();
        return "{\"rc\":" + std::to_string(rc) + ",\"what\":" + q(mws::mooncake_te::Adapter::describe(rc)) + "}";
    }
    if (op == "state") return g_last ? "{" + g_last->state() + "}" : "{}";
    if (op == "drain") {
        std::size_t rem = g_last ? g_last->engine.drain(2000) : 0;
        return "{\"remaining\":" + num(rem) + (g_last ? "," + g_last->state() : std::string()) + "}";
    }
    if (op == "quit") {
        g_last.reset();
        r.release_buffers();
        return "{\"bye\":true}";
    }
    throw std::runtime_error("unknown op " + op);
}

}  // namespace

int main() {
    try {
        Role role;
        std::printf("{\"ready\":true,\"segment\":%s,\"pid\":%d}\n", q(role.segment).c_str(), static_cast<int>(getpid()));
        std::fflush(stdout);
        std::string line;
        while (std::getline(std::cin, line)) {
            if (line.empty()) continue;
            std::string reply;
            bool quit = line.find("\"quit\"") != std::string::npos;
            try {
                reply = handle(role, line);
            } catch (const std::exception &e) {
                reply = "{\"error\":" + q(e.what()) + "}";
            }
            std::printf("%s\n", reply.c_str());
            std::fflush(stdout);
            if (quit) break;
        }
        g_last.reset();
        role.release_buffers();
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "te_role: %s\n", e.what());
        std::printf("{\"error\":%s}\n", q(e.what()).c_str());
        return 1;
    }
}
