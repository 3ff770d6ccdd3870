// snapshot_restore.cpp: the main job, in C++ through the C ABI (C++17 wrapper).
//
//   snapshot_restore_cpp [--size-mib N] [--dir PATH] [--reuse] [--hidden H] [--threads T]
//
// Fabricates a transformer (a dense first layer, then MoE layers with 8 experts; bf16,
// about N MiB, default 1024) in a trainer layout TP4 x PP2 x EP2 x DP2, snapshots it
// into a directory store (PATH, default under the build tree; it must be missing or
// empty, a directory store of an earlier run is replaced only with --reuse, anything
// else is refused untouched; at the end only what the run created is removed),
// restores it into a serving layout TP2 x EP4, verifies every byte of every target
// fragment, and prints a report. Exits non-zero on any failure.
//
// The model, its placement JSON (with its sha256 ids) and its host buffers come from
// examples/support/mws_model.hpp, which the C++ tests share.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "mooncake_weight_store.hpp"
#include "support/mws_model.hpp"

#ifndef MWS_DEMO_DEFAULT_DIR
#define MWS_DEMO_DEFAULT_DIR "mws-demo-store"
#endif

using namespace mwsmodel;

namespace {

struct Options {
    std::uint64_t size_mib = 1024;
    std::uint64_t hidden = 0;  // 0: chosen from the size
    unsigned threads = 0;      // 0: one per core (at most one per target participant)
    std::string dir = MWS_DEMO_DEFAULT_DIR;
    bool reuse = false;  // --reuse: replace a directory store of an earlier run
    bool keep = false;   // --keep: leave the store in place (inspect it with mws)
};

[[noreturn]] void usage(const char *argv0, int rc) {
    std::fprintf(rc == 0 ? stdout : stderr,
                 "usage: %s [--size-mib N] [--dir PATH] [--reuse] [--keep] [--hidden H] [--threads T]\n"
                 "  --size-mib N  model size in MiB (default 1024)\n"
                 "  --dir PATH    directory store root: missing or empty (default %s); what the run\n"
                 "                creates there is removed at the end\n"
                 "  --reuse       replace a directory store an earlier run left at PATH\n"
                 "  --keep        keep the store at the end (inspect it: mws --dir PATH ls)\n"
                 "  --hidden H    hidden size, a multiple of 64 (default: 1024, smaller for small models)\n"
                 "  --threads T   restore threads (default: one per core)\n",
                 argv0, MWS_DEMO_DEFAULT_DIR);
    std::exit(rc);
}

Options parse(int argc, char **argv) {
    Options o;
    auto number = [&](int &i) -> std::uint64_t {
        if (i + 1 >= argc) usage(argv[0], 2);
        char *end = nullptr;
        unsigned long long v = std::strtoull(argv[++i], &end, 10);
        if (end == argv[i] || *end != '\0' || v == 0) usage(argv[0], 2);
        return v;
    };
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--size-mib") {
            o.size_mib = number(i);
        } else if (a == "--hidden") {
            o.hidden = number(i);
            if (o.hidden % 64 != 0) usage(argv[0], 2);
        } else if (a == "--threads") {
            o.threads = static_cast<unsigned>(number(i));
        } else if (a == "--dir") {
            if (i + 1 >= argc) usage(argv[0], 2);
            o.dir = argv[++i];
        } else if (a == "--reuse") {
            o.reuse = true;
        } else if (a == "--keep") {
            o.keep = true;
        } else if (a == "-h" || a == "--help") {
            usage(argv[0], 0);
        } else {
            usage(argv[0], 2);
        }
    }
    return o;
}

using Clock = std::chrono::steady_clock;

/// A one-line progress bar on stderr, drawn only when stderr is a terminal;
/// thread-safe (restores report from several threads) and throttled to 10 Hz.
class Bar {
public:
    explicit Bar(const char *label) : label_(label), on_(isatty(STDERR_FILENO) == 1) {}
    void draw(std::uint64_t done, std::uint64_t total) {
        if (!on_) return;
        std::lock_guard<std::mutex> g(mu_);
        auto now = Clock::now();
        if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
        last_ = now;
        const double f = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
        const int fill = static_cast<int>(f * 30);
        std::fprintf(stderr, "\r  %-13s [%.*s%*s] %5.1f%%", label_, fill, "##############################", 30 - fill,
                     "", f * 100.0);
        if (done >= total) std::fprintf(stderr, "\r%*s\r", 70, "");  // cleared: the report follows
        std::fflush(stderr);
    }

private:
    const char *label_;
    bool on_;
    std::mutex mu_;
    Clock::time_point last_{};
};
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// The marker file a directory store writes at its root (src/store/directory.rs,
// STORE_MARKER and STORE_MARKER_TEXT).
constexpr const char *kStoreMarker = "MOONCAKE_WEIGHT_STORE";
constexpr const char *kStoreMarkerText = "mooncake-weight-store directory store, layout 1\n";

/// True when `dir` is recognisably a directory store of this library: the marker file
/// (exact content), `objects/` and `tmp/` (real directories), and nothing else.
bool is_store_root(const std::string &dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    int seen = 0;
    for (const auto &e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        const fs::file_status st = e.symlink_status();
        if ((name == "objects" || name == "tmp") && fs::is_directory(st)) {
            ++seen;
        } else if (name == kStoreMarker && fs::is_regular_file(st)) {
            std::FILE *f = std::fopen(e.path().c_str(), "rb");
            if (f == nullptr) return false;
            char buf[128] = {0};
            const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
            std::fclose(f);
            if (std::string(buf, n) != kStoreMarkerText) return false;
            ++seen;
        } else {
            return false;
        }
    }
    return !ec && seen == 3;
}

/// Removes the entries a directory store made at `dir` (links inside are removed, not
/// followed).
void remove_store_entries(const std::string &dir) {
    namespace fs = std::filesystem;
    fs::remove_all(fs::path(dir) / "objects");
    fs::remove_all(fs::path(dir) / "tmp");
    fs::remove(fs::path(dir) / kStoreMarker);
}

/// The store directory of this run: never removes anything the run did not create.
struct StoreDir {
    std::string path;
    bool created = false;  // the run created the directory (so it may remove it)
    bool prepared = false;

    /// Missing: used (created by the store). Empty: used. A directory store of an
    /// earlier run: replaced with --reuse only. Anything else: refused untouched.
    void prepare(const std::string &dir, bool reuse) {
        namespace fs = std::filesystem;
        std::error_code ec;
        path = dir;
        const fs::file_status st = fs::symlink_status(dir, ec);
        if (!fs::exists(st)) {
            created = true;
        } else if (!fs::is_directory(st)) {
            throw std::runtime_error("refusing to use " + dir + ": not a directory");
        } else if (!fs::is_empty(dir)) {
            if (!is_store_root(dir)) {
                throw std::runtime_error("refusing to use " + dir +
                                         ": it is not empty and not a directory store made by this library "
                                         "(nothing was changed; pass an empty or missing directory)");
            }
            if (!reuse) {
                throw std::runtime_error("refusing to use " + dir +
                                         ": it holds a directory store (of an earlier run?); pass --reuse to replace it");
            }
            remove_store_entries(dir);
        }
        prepared = true;
    }

    /// Removes what the run made (nothing if anything else appeared meanwhile).
    void cleanup() const {
        if (!prepared || !is_store_root(path)) return;
        remove_store_entries(path);
        if (created) std::filesystem::remove(path);
    }
};

double gib(std::uint64_t b) { return static_cast<double>(b) / static_cast<double>(1ull << 30); }

std::uint64_t tensor_bytes(const std::vector<TensorDef> &defs) {
    std::uint64_t total = 0;
    for (const auto &d : defs) {
        std::uint64_t n = d.itemsize;
        for (std::uint64_t x : d.shape) n *= x;
        total += n;
    }
    return total;
}

std::uint64_t buffer_bytes(const HostModel &m) {
    std::uint64_t total = 0;
    for (const View &v : m.views) total += v.nbytes;
    return total;
}

void phase(const char *name, double s, std::uint64_t bytes, const char *note) {
    if (bytes == 0) {
        std::printf("  %-13s %8.3f s                       %s\n", name, s, note);
    } else {
        std::printf("  %-13s %8.3f s  %7.2f GB/s  %8.3f GiB  %s\n", name, s, static_cast<double>(bytes) / s / 1e9,
                    gib(bytes), note);
    }
}

int run(const Options &o) {
    // Model: the first layer dense, the others MoE with 8 experts (EP2 and EP4 both
    // divide 8). A MoE layer holds 16 * hidden^2 bf16 values.
    const std::uint64_t experts = 8;
    std::uint64_t hidden = o.hidden != 0 ? o.hidden : 1024;
    auto layers_for = [&](std::uint64_t h) {
        std::uint64_t per_layer = 16 * h * h * 2;
        return std::max<std::uint64_t>(2, ((o.size_mib << 20) + per_layer - 1) / per_layer);
    };
    if (o.hidden == 0) {
        while (hidden > 128 && layers_for(hidden) < 8) hidden /= 2;
    }
    const std::uint64_t layers = layers_for(hidden);
    const std::vector<TensorDef> defs = model_tensors(layers, hidden, experts, /*dense_layers=*/1);
    const Layout trainer{4, 2, 2, 2};  // TP4 x PP2 x EP2 x DP2
    const Layout serving{2, 1, 4, 1};  // TP2 x EP4

    std::printf("mooncake-weight-store %s: snapshot and resharded restore through the C ABI\n",
                std::string(mws::version()).c_str());

    // 1. Fabricate the trainer's model: placement JSON + one host allocation per rank.
    auto t = Clock::now();
    HostModel src(placement_json("trainer-tp4-pp2-ep2-dp2", trainer, defs, 1, "demo-moe", "rev-1"), defs, true,
                  "trainer");
    const double t_fabricate = seconds_since(t);

    // 2. Snapshot into the directory store (writer: tensor by tensor; each rank is
    //    uploaded as soon as it is complete; commit publishes the manifest).
    mws::Store store = mws::Store::open_dir(o.dir);
    t = Clock::now();
    Bar snap_bar("snapshot");
    mws::StoredManifest written =
        snapshot(store, src, "default", [&snap_bar](const mws_progress &p) { snap_bar.draw(p.bytes_done, p.bytes_total); });
    const double t_snapshot = seconds_since(t);
    const std::uint64_t stored_bytes = written.total_bytes();
    const std::size_t src_participants = src.placement.participant_count();
    const std::size_t src_fragments = src.placement.fragment_count();
    const std::uint64_t src_buffer_bytes = buffer_bytes(src);
    const std::string manifest_key(written.key());
    { HostModel gone = std::move(src); }  // the trainer's memory is released before the restore

    // 3. A serving engine reads the manifest back and plans its restore.
    t = Clock::now();
    mws::StoredManifest manifest = store.load_manifest(manifest_key);
    HostModel dst(placement_json("serving-tp2-ep4", serving, defs, 1, "demo-moe", "rev-1"), defs, false, "serving");
    if (o.keep) {  // for `mws plan KEY --target ...` (beside the store, not in it)
        std::ofstream(o.dir + ".serving-placement.json") << dst.placement.to_json();
    }
    mws::LoadPlan plan = mws::LoadPlan::plan(manifest, dst.placement, dst.binding_ptrs());
    const double t_plan = seconds_since(t);

    // 4. Restore: each participant's part, in parallel (the store and plan are
    //    thread-safe; each binding is loaded by one thread).
    unsigned threads = o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
    threads = static_cast<unsigned>(std::min<std::size_t>(threads, dst.bindings.size()));
    std::atomic<std::size_t> next{0};
    std::mutex mu;
    mws_load_stats total{};
    std::exception_ptr failure;
    Bar restore_bar("restore");
    std::atomic<std::uint64_t> restored{0};  // bytes done across every thread's load
    t = Clock::now();
    auto worker = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < dst.bindings.size();) {
            try {
                mws::IoArgs args;
                std::uint64_t seen = 0;  // this call's last report
                args.progress = [&](const mws_progress &p) {
                    std::uint64_t all = restored.fetch_add(p.bytes_done - seen) + (p.bytes_done - seen);
                    seen = p.bytes_done;
                    restore_bar.draw(all, plan.total_bytes());
                };
                mws_load_stats s = store.load(plan, dst.bindings[i], args);
                std::lock_guard<std::mutex> g(mu);
                total.regions += s.regions;
                total.ranges += s.ranges;
                total.requests += s.requests;
                total.bytes += s.bytes;
            } catch (...) {
                std::lock_guard<std::mutex> g(mu);
                if (!failure) failure = std::current_exception();
            }
        }
    };
    std::vector<std::thread> pool;
    for (unsigned k = 0; k < threads; ++k) pool.emplace_back(worker);
    for (auto &th : pool) th.join();
    if (failure) std::rethrow_exception(failure);
    const double t_restore = seconds_since(t);

    // 5. Verify every byte of every target fragment.
    t = Clock::now();
    const std::size_t verified = dst.verify();
    const double t_verify = seconds_since(t);
    if (total.bytes != plan.total_bytes() || verified != buffer_bytes(dst)) {
        std::fprintf(stderr, "error: moved %llu of %llu bytes, verified %zu\n",
                     static_cast<unsigned long long>(total.bytes),
                     static_cast<unsigned long long>(plan.total_bytes()), verified);
        return 1;
    }

    const std::uint64_t model_bytes = tensor_bytes(defs);
    std::printf("  store         directory store at %s\n", o.dir.c_str());
    std::printf("  model         %zu tensors, %.3f GiB bf16: %llu layers (1 dense + %llu MoE x %llu experts), "
                "hidden %llu\n",
                manifest.tensor_count(), gib(model_bytes), static_cast<unsigned long long>(layers),
                static_cast<unsigned long long>(layers - 1), static_cast<unsigned long long>(experts),
                static_cast<unsigned long long>(hidden));
    std::printf("  source        TP4 x PP2 x EP2 x DP2: %zu participants, %zu fragments, %.3f GiB in buffers\n",
                src_participants, src_fragments, gib(src_buffer_bytes));
    std::printf("  stored        %zu fragments (one DP replica), %.3f GiB, manifest %s\n", manifest.fragment_count(),
                gib(stored_bytes), std::string(manifest.digest()).c_str());
    std::printf("  target        TP2 x EP4: %zu participants, %zu fragments, %.3f GiB in buffers\n",
                dst.placement.participant_count(), dst.placement.fragment_count(), gib(buffer_bytes(dst)));
    std::printf("  restore plan  %zu regions; executed as %llu ranged reads in %llu requests (%u threads)\n",
                plan.region_count(), static_cast<unsigned long long>(total.ranges),
                static_cast<unsigned long long>(total.requests), threads);
    phase("fabricate", t_fabricate, src_buffer_bytes, "placement JSON + fill trainer buffers");
    phase("snapshot", t_snapshot, stored_bytes, "writer -> directory store (fsynced), commit");
    phase("plan restore", t_plan, 0, "read manifest, bind target, plan regions");
    phase("restore", t_restore, total.bytes, "ranged reads into the serving buffers");
    phase("verify", t_verify, verified, "every target byte checked");
    std::printf("  OK            %zu bytes verified\n", verified);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    StoreDir store_dir;
    int rc = 1;
    try {
        store_dir.prepare(o.dir, o.reuse);
        rc = run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
    }
    if (o.keep) {
        std::printf("kept the store at %s (inspect it: mws --dir %s ls; the serving layout is in %s.serving-placement.json)\n",
                    o.dir.c_str(), o.dir.c_str(), o.dir.c_str());
        return rc;
    }
    try {
        store_dir.cleanup();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "warning: %s\n", e.what());
    }
    return rc;
}
