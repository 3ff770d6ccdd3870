// callback_engine.hpp: a transfer engine implemented in C callbacks
// (mws_transfer_engine_vtable) for the C++ tests: memcpy between registered buffers, an
// identity a test can change (a restarted engine), legacy batches that can fail, and,
// for the race tests, batches that can be held up or run a one-shot callback first.
// open(true) adds a notify channel: every message lands in `mailbox` (endpoint ->
// messages, in order), as a peer's notify poll would hand them over; `flip_next`
// flips the first target byte of the next batch after it copied (a DMA fault).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include <thread>

#include "mooncake_weight_store.hpp"

struct CallbackEngine {
    std::atomic<std::uint64_t> id{4242};
    std::atomic<int> fail_batches{0};  // non-zero: legacy batches return this code
    std::atomic<std::uint64_t> batches{0};
    // While non-zero, each batch sets `entered`, then sleeps this long before copying.
    std::atomic<std::uint32_t> hold_us{0};
    std::atomic<bool> entered{false};
    // Run once by the next batch with `once_arg` (before it copies), then cleared.
    std::atomic<void (*)(void *)> once{nullptr};
    void *once_arg = nullptr;
    std::mutex mu;
    std::map<std::uint64_t, std::uint64_t> regions;  // address -> length
    std::map<std::string, std::vector<std::string>> mailbox;  // endpoint -> notifications
    std::atomic<bool> flip_next{false};

    bool covered(std::uint64_t a, std::uint64_t n) {
        auto it = regions.upper_bound(a);
        if (it == regions.begin()) return false;
        --it;
        return a + n <= it->first + it->second;
    }
    static CallbackEngine &of(void *ctx) { return *static_cast<CallbackEngine *>(ctx); }
    static std::uint64_t get_engine_id(void *ctx) noexcept { return of(ctx).id.load(); }
    static std::int32_t register_memory(void *ctx, std::uint64_t a, std::uint64_t n, std::int32_t) noexcept {
        CallbackEngine &e = of(ctx);
        std::lock_guard<std::mutex> g(e.mu);
        return e.regions.emplace(a, n).second ? 0 : -2;
    }
    static std::int32_t unregister_memory(void *ctx, std::uint64_t a) noexcept {
        CallbackEngine &e = of(ctx);
        std::lock_guard<std::mutex> g(e.mu);
        return e.regions.erase(a) == 1 ? 0 : -3;
    }
    // Write: local = sources, remote = targets; read: local = targets, remote = sources.
    static std::int32_t copy(void *ctx, bool write, const std::uint64_t *local, const std::uint64_t *remote,
                             const std::uint64_t *sizes, std::size_t n) noexcept {
        CallbackEngine &e = of(ctx);
        e.batches += 1;
        if (void (*f)(void *) = e.once.exchange(nullptr)) f(e.once_arg);
        if (std::uint32_t us = e.hold_us.load()) {
            e.entered.store(true);
            std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        if (int code = e.fail_batches.load()) return code;
        std::lock_guard<std::mutex> g(e.mu);
        for (std::size_t i = 0; i < n; ++i) {
            std::uint64_t src = write ? local[i] : remote[i], dst = write ? remote[i] : local[i];
            if (!e.covered(src, sizes[i]) || !e.covered(dst, sizes[i])) return -1;
        }
        for (std::size_t i = 0; i < n; ++i) {
            std::uint64_t src = write ? local[i] : remote[i], dst = write ? remote[i] : local[i];
            std::memcpy(reinterpret_cast<void *>(static_cast<std::uintptr_t>(dst)),
                        reinterpret_cast<const void *>(static_cast<std::uintptr_t>(src)), sizes[i]);
        }
        if (n > 0 && sizes[0] > 0 && e.flip_next.exchange(false)) {
            *reinterpret_cast<unsigned char *>(static_cast<std::uintptr_t>(write ? remote[0] : local[0])) ^= 0x80;
        }
        return 0;
    }
    static std::int32_t send_notify(void *ctx, mws_bytes endpoint, mws_bytes, mws_bytes message) noexcept {
        CallbackEngine &e = of(ctx);
        try {
            std::lock_guard<std::mutex> g(e.mu);
            e.mailbox[std::string(endpoint.ptr, endpoint.len)].emplace_back(message.ptr, message.len);
            return 0;
        } catch (...) {
            return -1;
        }
    }
    /// The messages delivered to `endpoint`, taken.
    std::vector<std::string> take(const std::string &endpoint) {
        std::lock_guard<std::mutex> g(mu);
        std::vector<std::string> out;
        out.swap(mailbox[endpoint]);
        return out;
    }
    static std::int32_t sync_write(void *ctx, mws_bytes, const std::uint64_t *l, const std::uint64_t *r,
                                   const std::uint64_t *s, std::size_t n) noexcept {
        return copy(ctx, true, l, r, s, n);
    }
    static std::int32_t sync_read(void *ctx, mws_bytes, const std::uint64_t *l, const std::uint64_t *r,
                                  const std::uint64_t *s, std::size_t n) noexcept {
        return copy(ctx, false, l, r, s, n);
    }
    /// With `device`, the library's own reads and writes of device buffers go through
    /// it (mws_transfer_engine_from_vtable_device); this engine's memcpy never reaches
    /// device memory, so only steps that move no device byte through it may run.
    mws::TransferEngine open(bool notify = false, const mws::DeviceEngine *device = nullptr) {
        mws_transfer_engine_vtable vt{};
        vt.size = sizeof vt;
        vt.version = MWS_TRANSFER_ENGINE_VTABLE_VERSION;
        vt.get_engine_id = &get_engine_id;
        vt.register_memory = &register_memory;
        vt.unregister_memory = &unregister_memory;
        vt.batch_transfer_sync_write = &sync_write;
        vt.batch_transfer_sync_read = &sync_read;
        if (notify) vt.send_notify = &send_notify;
        if (device != nullptr) return mws::TransferEngine::from_vtable(vt, this, *device);
        return mws::TransferEngine::from_vtable(vt, this);
    }
};
