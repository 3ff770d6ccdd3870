// serving_engine.cpp: the live weight update of a serving engine and its trainer on
// Mooncake's Transfer Engine, as one program to copy. Each side owns its
// `mooncake::TransferEngine` and registers its own weight buffers; the trainer pushes
// every new weight generation with a PREPARED transfer (prepared once, one step per
// generation) that it starts WITHOUT BLOCKING; each step NOTIFIES the server through
// the engine's own notify channel and carries the CRC-32C of the bytes it sent; the
// server's notify poll hands the messages to one NotifyRouter with a content-VERIFYING
// NotifyAcceptor per local target, and the server flips the generation it serves only
// when every local target reports Updated for that generation.
//
//   start-up   server: own a TE, register the landing buffers, build the placement,
//                      bind the plan, one verifying acceptor per target in one router,
//                      then poll notifications (section 3, Server)
//              trainer: own a TE, register its buffers, build the placement, bind the
//                      same plan, prepare one transfer per local participant
//                      (section 4, Trainer)
//   update     trainer: write generation g, start_step(g, notify + verify) on every
//                      prepared transfer, keep working while the steps run, check each
//                      step's own report
//              server: getNotifies -> router.accept -> acceptor outcomes -> Updated(g)
//                      on every target: flip the served generation; Torn: keep serving
//                      the previous one and log the mismatched ranges
//   shutdown   trainer: close the prepared transfers, unregister what it registered;
//              server: unregister what it registered (Owned, section 2)
//
// The loop is written once, over the engine's API (section 1): built with
// MWS_SERVING_REAL_TE it runs on the real mooncake::TransferEngine (adapter
// mooncake_weight_store::mooncake_te), two processes on loopback TCP started by
// cpp_tests/mooncake/te_two_process.py (ctest mooncake.serving_engine):
//
//   serving_engine --role server  --dir DIR [--generations N] [--corrupt G]
//   serving_engine --role trainer --dir DIR [--generations N] [--corrupt G]
//
// Otherwise it runs on the in-process stand-in of that engine
// (support/te_standin.hpp), both sides in one process (ctest
// int.example_serving_engine, leak.mws_example_serving_engine): `serving_engine`.
//
// The two sides exchange their placements, buffer addresses and segment names, and
// the server's decision per generation, through files in DIR (section 2): a real
// deployment uses its own control plane for that. The server decides generation g
// before the trainer pushes g + 1 (the served copy is taken from the landing buffers
// the next step writes). To show that a verified step catches what the sender cannot
// see, the server flips one landing byte of generation G (--corrupt; default: the
// third) after its bytes landed and before its first `done` is accepted (a fault at
// the target's NIC or memory): G is Torn, the server keeps serving G - 1, and G + 1
// repairs it. Every served byte is checked against the trainer's generation. Exits
// non-zero on any failed check; prints "serving_engine: OK" at the end.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"
#ifdef MWS_SERVING_REAL_TE
#include "mooncake_weight_store/mooncake_te.hpp"
#include "transfer_engine.h"
#else
#include "support/te_standin.hpp"
#endif

using namespace mwsmodel;

namespace {

void require(bool ok, const std::string &what) {
    if (!ok) throw std::runtime_error("check failed: " + what);
}

// ---- 1. The engine API: the only part that differs between Mooncake and the stand-in --
//
// Te::Engine      the native engine (init, registerLocalMemory, unregisterLocalMemory,
//                 getNotifies, getLocalIpAndPort: Mooncake's calls)
// Te::NotifyDesc  what getNotifies returns (name, notify_msg)
// Te::Adapter     the library's engine over it: Adapter(engine, options).engine()
// Te::start(who)  a new engine, initialised, its transport installed

#ifdef MWS_SERVING_REAL_TE
struct Te {
    using Engine = ::mooncake::TransferEngine;
    using NotifyDesc = ::mooncake::TransferMetadata::NotifyDesc;
    using Adapter = mws::mooncake_te::Adapter;
    static const char *name() { return "Mooncake Transfer Engine (TCP on loopback, P2PHANDSHAKE)"; }
    static std::unique_ptr<Engine> start(const std::string & /*who*/) {
        // MC_TCP_BIND_ADDRESS=127.0.0.1 in the environment keeps TCP on loopback.
        const char *port_env = std::getenv("MWS_TE_RPC_PORT");
        std::uint64_t port = port_env != nullptr ? std::strtoull(port_env, nullptr, 10) : 0;
        if (port == 0) port = 20000 + static_cast<std::uint64_t>(getpid() % 20000);
        auto te = std::make_unique<Engine>(false);
        if (te->init("P2PHANDSHAKE", "127.0.0.1:" + std::to_string(port), "127.0.0.1", port) != 0)
            throw std::runtime_error("TransferEngine::init failed");
        if (te->installTransport("tcp", nullptr) == nullptr) throw std::runtime_error("installTransport(tcp) failed");
        return te;
    }
};
#else
struct Te {
    using Engine = mcte::standin::TransferEngine;
    using NotifyDesc = mcte::standin::NotifyDesc;
    using Adapter = mcte::TeVtable<mcte::StandInApi>;
    static const char *name() { return "in-process Mooncake TE stand-in"; }
    static std::unique_ptr<Engine> start(const std::string &who) {
        static mcte::standin::Fabric fabric;  // this process's "network"
        auto te = std::make_unique<Engine>(fabric);
        if (te->init("P2PHANDSHAKE", who + ":17000") != 0) throw std::runtime_error("engine init");
        return te;
    }
};
#endif

/// Adapter options: the adapter never registers these buffers (the engine's owner
/// did, and says so with mws_live_args::local_pre_registered).
mws::mooncake_te::Options adapter_options() {
    mws::mooncake_te::Options o;
    o.host_location = "cpu:0";
    return o;
}

// ---- 2. What both sides agree on, and how they exchange the rest ---------------------

/// The model and layouts (both sides know the architecture), the shared notify key
/// (distributed out of band in a real deployment) and the run's parameters.
struct Config {
    std::vector<TensorDef> defs = model_tensors(2, 64, 2);
    Layout trainer_layout{4, 1, 1, 2};  // TP4 x DP2
    Layout server_layout{2, 1, 2, 1};   // TP2 x EP2
    std::string key = "serving-engine example notify key";
    std::uint64_t first_generation = 2;  // generation 1 is the placements' own
    std::uint64_t generations = 4;
    std::uint64_t corrupt = 0;  // the generation whose landing byte the server flips
    std::string dir;            // the exchange folder
    std::chrono::seconds timeout{240};
    std::uint64_t last() const { return first_generation + generations - 1; }
};

/// Files in one folder: put() writes atomically (a temporary file, then rename), get()
/// waits for a file to appear.
class Exchange {
public:
    Exchange(std::string dir, std::chrono::seconds timeout) : dir_(std::move(dir)), timeout_(timeout) {}
    void put(const std::string &name, const std::string &text) const {
        const std::string tmp = dir_ + "/." + name + ".tmp";
        {
            std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
            f << text;
            if (!f) throw std::runtime_error("cannot write " + tmp);
        }
        if (std::rename(tmp.c_str(), (dir_ + "/" + name).c_str()) != 0) throw std::runtime_error("cannot publish " + name);
    }
    std::string get(const std::string &name) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (;;) {
            std::ifstream f(dir_ + "/" + name, std::ios::binary);
            if (f) {
                std::ostringstream s;
                s << f.rdbuf();
                return s.str();
            }
            if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("timed out waiting for " + name);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

private:
    std::string dir_;
    std::chrono::seconds timeout_;
};

/// One side's model: its placement, one host allocation per participant, and its
/// bindings with every fragment at this process's engine (its segment name).
std::unique_ptr<HostModel> own_model(const Config &c, bool trainer, const std::string &segment) {
    const std::string set = trainer ? "trainer" : "serving";
    auto m = std::make_unique<HostModel>(
        placement_json(set, trainer ? c.trainer_layout : c.server_layout, c.defs, 1), c.defs, false, set);
    m->process_endpoint = segment;
    m->make_bindings(set, 1);
    return m;
}

/// What a side publishes: its placement, segment and buffer addresses ("card").
void publish(const Exchange &x, const std::string &side, const HostModel &m) {
    std::string card = "segment " + m.process_endpoint + "\n";
    for (const auto &b : m.buffers)
        card += b.first + " " + std::to_string(reinterpret_cast<std::uintptr_t>(b.second.data())) + "\n";
    x.put(side + ".placement.json", std::string(m.placement.to_json()));
    x.put(side + ".card", card);
}

/// The peer's placement and bindings, rebuilt from what it published (the bindings are
/// a function of the placement, the addresses and the segment: both sides bind the
/// same plan). Its buffers here are unused shadows; only the addresses count.
std::unique_ptr<HostModel> peer_model(const Exchange &x, const Config &c, const std::string &side) {
    const std::string set = side == "trainer" ? "trainer" : "serving";
    auto m = std::make_unique<HostModel>(x.get(side + ".placement.json"), c.defs, false, set);
    std::istringstream card(x.get(side + ".card"));
    std::string word, value;
    while (card >> word >> value) {
        if (word == "segment")
            m->process_endpoint = value;
        else
            m->base_addresses[word] = std::strtoull(value.c_str(), nullptr, 10);
    }
    require(!m->process_endpoint.empty() && m->base_addresses.size() == m->buffers.size(), side + "'s card");
    m->make_bindings(set, 1);
    return m;
}

/// The bound plan trainer -> server (the same on both sides: the notify acceptors
/// recognise the steps' messages by the plan's identity).
mws::TransferPlan bound_plan(const HostModel &trainer, const HostModel &server) {
    return mws::TransferPlan::plan(trainer.placement, server.placement)
        .bind(server.binding_ptrs(), trainer.binding_ptrs());
}

/// What each side owns: its engine, its model and the registrations it made itself.
struct Owned {
    std::unique_ptr<Te::Engine> te;
    std::unique_ptr<HostModel> model;
    std::vector<void *> registered;

    Owned(const Config &c, bool trainer) : te(Te::start(trainer ? "trainer" : "server")) {
        model = own_model(c, trainer, te->getLocalIpAndPort());
        // The engine's owner registers its weight buffers itself, once.
        for (auto &b : model->buffers) {
            require(te->registerLocalMemory(b.second.data(), b.second.size(), "cpu:0") == 0, "register");
            registered.push_back(b.second.data());
        }
    }
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    /// Shutdown: unregister only what we registered, then the engine goes.
    ~Owned() {
        for (void *p : registered) te->unregisterLocalMemory(p);
    }
};

/// Start-up common to both sides: its own engine and buffers (Owned); publish our
/// placement and addresses, read the peer's, bind the plan trainer -> server.
class Side {
protected:
    Side(const Config &c, const Exchange &x, bool trainer)
        : c_(c), x_(x), own_(c, trainer), te_(*own_.te), model_(*own_.model) {
        publish(x_, trainer ? "trainer" : "server", model_);
        peer_ = peer_model(x_, c_, trainer ? "server" : "trainer");
        plan_ = std::make_unique<mws::TransferPlan>(trainer ? bound_plan(model_, *peer_) : bound_plan(*peer_, model_));
    }

    const Config &c_;
    const Exchange &x_;
    Owned own_;  // destroyed last
    Te::Engine &te_;
    HostModel &model_;
    std::unique_ptr<HostModel> peer_;
    std::unique_ptr<mws::TransferPlan> plan_;
};

/// One message field of a notify body (`"name":value`), for the fault injection only.
std::string field(const std::string &message, const std::string &name) {
    const std::string tag = "\"" + name + "\":";
    std::size_t at = message.find(tag);
    if (at == std::string::npos) return {};
    at += tag.size();
    if (message[at] == '"') return message.substr(at + 1, message.find('"', at + 1) - at - 1);
    return message.substr(at, message.find_first_of(",}", at) - at);
}

// ---- 3. The server ----------------------------------------------------------------------

class Server : Side {
public:
    // -- start-up --
    Server(const Config &c, const Exchange &x) : Side(c, x, false) {
        served_ = model_.buffers;  // what inference reads (generation 0: nothing yet)
        // One verifying acceptor per local target participant, all in one router.
        for (const auto &b : model_.buffers) {
            acceptors_.push_back(std::make_unique<mws::NotifyAcceptor>(*plan_, b.first, c_.key));
            acceptors_.back()->verify_content();
            router_.add(*acceptors_.back());
        }
        x_.put("server.ready", "");
    }

    // -- each update: the notify poll --
    /// Polls the engine's notifications until generation c.last() is decided.
    void run() {
        const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
        while (decided_ < c_.last()) {
            require(std::chrono::steady_clock::now() < deadline, "the server decided every generation in time");
            std::vector<Te::NotifyDesc> got;
            te_.getNotifies(got);  // drains everything the engine received
            for (const Te::NotifyDesc &n : got) {
                if (n.name != mws::notify_name()) continue;  // the engine's other notifications
                inject_fault(n.notify_msg);
                std::string why;
                std::uint32_t verdict = router_.accept(n.notify_msg, nullptr, nullptr, &why);
                if (verdict != MWS_NOTIFY_ACCEPTED) {
                    std::printf("server: notification refused (verdict %u): %s\n", verdict, why.c_str());
                    ++refused_;
                    continue;
                }
                decide();
            }
            if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        require(refused_ == 0, "no notification refused");
        require(torn_ == (c_.corrupt != 0 ? 1u : 0u), "exactly the corrupted generation was torn");
    }

    // -- shutdown --
    /// Once the trainer closed its transfers, own_ unregisters what we registered.
    ~Server() {
        try {
            x_.get("trainer.closed");
        } catch (...) {
            // the trainer failed: its transfers are gone with it
        }
    }

    std::uint64_t served_generation() const { return served_generation_; }

private:
    /// A generation is decided when every target is Updated(g), or Torn(g) with every
    /// writer accounted for (done, or its bytes found to differ).
    void decide() {
        std::uint64_t g = 0;
        bool all_updated = true;
        for (const auto &a : acceptors_) {
            mws_notify_outcome o = a->outcome();
            if (g == 0) g = o.weight_generation;
            if (o.weight_generation != g || g <= decided_) return;  // not every target began g
            if (o.verdict == MWS_TARGET_UPDATED) continue;
            if (o.verdict != MWS_TARGET_TORN) return;
            all_updated = false;
            std::set<std::pair<std::string, std::string>> mismatched;
            for (const auto &m : a->mismatches()) mismatched.emplace(m.source_participant, m.source_worker);
            if (mismatched.empty() || mismatched.size() != o.incomplete) return;  // writers still running
        }
        decided_ = g;
        if (all_updated) {
            // Flip: serve generation g (here a copy of the landing buffers; an engine
            // with two buffer sets flips a pointer instead).
            served_ = model_.buffers;
            served_generation_ = g;
            require(model_.generation_differs(g, &served_).empty(), "every served byte is generation g's");
            std::printf("generation %llu: server: Updated on %zu targets, content verified -> serving generation "
                        "%llu (every served byte checked)\n",
                        static_cast<unsigned long long>(g), acceptors_.size(), static_cast<unsigned long long>(g));
            x_.put("decided." + std::to_string(g), "updated");
            return;
        }
        ++torn_;
        for (const auto &a : acceptors_) {
            for (const auto &m : a->mismatches())
                std::printf("generation %llu: server: TORN: target %s, range %s +%llu (%llu bytes) written by %s/%s "
                            "differs from the trainer's checksum\n",
                            static_cast<unsigned long long>(g), m.fragment_id.substr(0, m.fragment_id.find(':')).c_str(),
                            m.fragment_id.c_str(), static_cast<unsigned long long>(m.offset),
                            static_cast<unsigned long long>(m.bytes), m.source_participant.c_str(),
                            m.source_worker.c_str());
        }
        require(served_generation_ < g && (served_generation_ == 0 || model_.generation_differs(served_generation_,
                                                                                                  &served_)
                                                                              .empty()),
                "the previous generation is still served intact");
        std::printf("generation %llu: server: not flipped, still serving generation %llu\n",
                    static_cast<unsigned long long>(g), static_cast<unsigned long long>(served_generation_));
        x_.put("decided." + std::to_string(g), "torn");
    }

    /// Fault injection (not part of the loop to copy): before the first `done` of the
    /// corrupted generation, flip the first landing byte of an operation of that
    /// writer into that target (its bytes landed; its `done` covers that byte).
    void inject_fault(const std::string &message) {
        if (c_.corrupt == 0 || flipped_ || field(message, "kind") != "done" ||
            field(message, "generation") != std::to_string(c_.corrupt))
            return;
        const std::string target = field(message, "target_participant");
        const std::string writer = field(message, "source_participant");
        for (std::size_t i = 0; i < plan_->region_count(); ++i) {
            mws_transfer_operation_info op = plan_->operation(i);
            if (target != op.target.participant_id || writer != op.source.participant_id) continue;
            auto *byte = reinterpret_cast<unsigned char *>(
                static_cast<std::uintptr_t>(op.target.address + op.target.address_offset));
            *byte ^= 0x01;
            flipped_ = true;
            std::printf("generation %llu: fault injected: one landing byte of %s (%s, written by %s) flipped after "
                        "it landed, before the done is accepted\n",
                        static_cast<unsigned long long>(c_.corrupt), target.c_str(), op.target.fragment_id,
                        writer.c_str());
            return;
        }
        throw std::runtime_error("no operation of " + writer + " into " + target);
    }

    std::map<std::string, std::vector<unsigned char>> served_;
    std::uint64_t served_generation_ = 0, decided_ = 0;
    std::vector<std::unique_ptr<mws::NotifyAcceptor>> acceptors_;
    mws::NotifyRouter router_;  // declared after the acceptors: destroyed before them
    std::size_t refused_ = 0, torn_ = 0;
    bool flipped_ = false;
};

// ---- 4. The trainer ---------------------------------------------------------------------

class Trainer : Side {
public:
    // -- start-up --
    Trainer(const Config &c, const Exchange &x) : Side(c, x, true) {
        adapter_ = std::make_unique<Te::Adapter>(te_, adapter_options());
        engine_ = std::make_unique<mws::TransferEngine>(adapter_->engine());
        sink_ = std::make_unique<mws::Sink>(*engine_);
        // Prepared once: every check, the batches lowered; our buffers are registered.
        mws_live_args args{};
        args.local_pre_registered = 1;
        for (const mws::Binding &b : model_.bindings)
            prepared_.push_back(
                sink_->prepare(*plan_, model_.placement, b, peer_->placement, peer_->binding_ptrs(), &args));
        x_.get("server.ready");  // its acceptors exist
    }

    // -- each update --
    void push(std::uint64_t g) {
        model_.fill_generation(g);  // the optimizer wrote generation g
        std::atomic<int> completed{0};
        std::vector<mws::StepHandle> steps;
        for (const mws::PreparedTransfer &p : prepared_)
            steps.push_back(p.start_step(g, mws::StepNotify{c_.key, true},
                                         [&completed](mws_status) { completed.fetch_add(1); }));
        // The steps run on the library's step driver; the trainer keeps working and
        // looks at them now and then (poll() never blocks, wait_for() blocks at most
        // its timeout and throws mws::Error when the step failed).
        std::uint64_t bytes = 0, other_work = 0;
        for (const mws::StepHandle &h : steps) {
            std::optional<mws_transfer_stats> st;
            while (!(st = h.wait_for(std::chrono::milliseconds(2)))) ++other_work;
            bytes += st->bytes;
            // The step's own report: what the sender knows (its bytes landed).
            for (const auto &t : h.report().targets)
                require(t.verdict == MWS_TARGET_UPDATED && t.weight_generation == g, "the step's report");
        }
        while (completed.load() != static_cast<int>(steps.size())) std::this_thread::yield();
        std::printf("generation %llu: trainer: %zu prepared steps started, %llu bytes pushed (notified, "
                    "content-verified), %llu polls of other work meanwhile\n",
                    static_cast<unsigned long long>(g), steps.size(), static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(other_work));
        // The server decides g before we write g + 1 into its landing buffers.
        const std::string decision = x_.get("decided." + std::to_string(g));
        require(decision == (g == c_.corrupt ? "torn" : "updated"), "the server's decision on generation " +
                                                                          std::to_string(g) + ": " + decision);
    }

    // -- shutdown --
    /// Closes the prepared transfers (they unregister what they registered: nothing
    /// here), drops the library's engine and the adapter; own_ then unregisters our
    /// buffers.
    ~Trainer() {
        try {
            for (const mws::PreparedTransfer &p : prepared_) p.close();
        } catch (const std::exception &e) {
            std::fprintf(stderr, "trainer: close: %s\n", e.what());
        }
        prepared_.clear();
        sink_.reset();
        engine_.reset();
        adapter_.reset();
        try {
            x_.put("trainer.closed", "");
        } catch (...) {
        }
    }

private:
    std::unique_ptr<Te::Adapter> adapter_;
    std::unique_ptr<mws::TransferEngine> engine_;
    std::unique_ptr<mws::Sink> sink_;
    std::vector<mws::PreparedTransfer> prepared_;
};

// ---- 5. The two sides ---------------------------------------------------------------

int run_server(const Config &c, const Exchange &x) {
    std::uint64_t served = 0;
    {
        Server server(c, x);
        server.run();
        served = server.served_generation();
    }
    require(served == c.last(), "serving the last generation");
    std::printf("server: serving generation %llu\n", static_cast<unsigned long long>(served));
    return 0;
}

int run_trainer(const Config &c, const Exchange &x) {
    Trainer trainer(c, x);
    for (std::uint64_t g = c.first_generation; g <= c.last(); ++g) trainer.push(g);
    return 0;
}

// ---- 6. main ------------------------------------------------------------------------

std::string arg(int argc, char **argv, const std::string &name, const std::string &dflt = "") {
    for (int i = 1; i + 1 < argc; ++i)
        if (argv[i] == name) return argv[i + 1];
    return dflt;
}

int run(int argc, char **argv) {
    Config c;
    c.generations = std::strtoull(arg(argc, argv, "--generations", "4").c_str(), nullptr, 10);
    c.corrupt = std::strtoull(arg(argc, argv, "--corrupt", std::to_string(c.first_generation + 2)).c_str(), nullptr, 10);
    require(c.generations >= 1 && (c.corrupt == 0 || (c.corrupt >= c.first_generation && c.corrupt < c.last())),
            "--generations >= 1; --corrupt 0 or a generation before the last");
    const std::string role = arg(argc, argv, "--role");
    const bool both = role.empty();
    std::string tmp;
    if (both) {
        char templ[] = "/tmp/mws-serving-XXXXXX";
        require(mkdtemp(templ) != nullptr, "mkdtemp");
        tmp = c.dir = templ;
    } else {
        c.dir = arg(argc, argv, "--dir");
        require(!c.dir.empty() && (role == "server" || role == "trainer"), "--role server|trainer --dir DIR");
    }
    Exchange x(c.dir, c.timeout);
    std::printf("serving_engine: %s, %s, trainer TP4 x DP2 -> server TP2 x EP2, generations %llu..%llu%s\n", Te::name(),
                both ? "both sides in this process" : ("the " + role).c_str(),
                static_cast<unsigned long long>(c.first_generation), static_cast<unsigned long long>(c.last()),
                c.corrupt != 0 ? (", generation " + std::to_string(c.corrupt) + " corrupted at the target").c_str() : "");
    int rc = 0;
    if (both) {
#ifdef MWS_SERVING_REAL_TE
        throw std::runtime_error("the real engine runs one side per process: --role server|trainer --dir DIR");
#else
        // The server in its own thread (its own process in real life).
        std::exception_ptr server_error;
        std::thread server([&] {
            try {
                run_server(c, x);
            } catch (...) {
                server_error = std::current_exception();
            }
        });
        try {
            rc = run_trainer(c, x);
        } catch (...) {
            server.join();  // it times out waiting for what the trainer no longer sends
            throw;
        }
        server.join();
        if (server_error) std::rethrow_exception(server_error);
#endif
    } else {
        rc = role == "server" ? run_server(c, x) : run_trainer(c, x);
    }
    if (!tmp.empty()) {
        for (const char *f : {"trainer.placement.json", "trainer.card", "server.placement.json", "server.card",
                              "server.ready", "trainer.closed"})
            std::remove((tmp + "/" + f).c_str());
        for (std::uint64_t g = c.first_generation; g <= c.last(); ++g)
            std::remove((tmp + "/decided." + std::to_string(g)).c_str());
        rmdir(tmp.c_str());
    }
    std::printf("serving_engine: OK (%s, %llu generations, %s)\n", both ? "trainer and server" : role.c_str(),
                static_cast<unsigned long long>(c.generations),
                c.corrupt != 0 ? "the corrupted generation caught as Torn and repaired" : "no fault injected");
    return rc;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "serving_engine: %s\n", e.what());
        return 1;
    }
}
