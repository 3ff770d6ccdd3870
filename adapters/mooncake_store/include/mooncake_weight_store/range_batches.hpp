// range_batches.hpp: the store vtable's ranged reads (mws_range_item) in the shape of
// Mooncake's RealClient::get_into_ranges, and its results back per item. Header-only
// and free of Mooncake's headers: the store adapter and the stand-in example
// (examples/mooncake_store_vtable.cpp) both use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mooncake_weight_store.h"

namespace mws {
namespace mooncake_store {

/// Range items grouped buffer-major: buffers in order of first appearance, then keys in
/// order of first appearance within a buffer; each (buffer, key) keeps its items' order.
/// `ptrs`, `keys`, `dsts`, `srcs` and `sizes` are get_into_ranges' arguments.
struct RangeBatches {
    std::vector<void *> ptrs;
    std::vector<std::vector<std::string>> keys;
    std::vector<std::vector<std::vector<std::size_t>>> dsts, srcs, sizes;
    /// The item index of each range: items[b][k][r].
    std::vector<std::vector<std::vector<std::size_t>>> items;

    /// Groups `n` items; an item of device memory, or whose destination lies before its
    /// buffer, gets `invalid` in `results` and is left out.
    static RangeBatches of(const mws_range_item *in, std::size_t n, std::int64_t *results, std::int64_t invalid) {
        RangeBatches rb;
        std::map<std::uint64_t, std::size_t> buffer_at;
        std::map<std::pair<std::size_t, std::string>, std::size_t> key_at;
        std::vector<std::uint64_t> bases;
        for (std::size_t i = 0; i < n; ++i) {
            const mws_range_item &it = in[i];
            if (it.memory_kind != MWS_MEMORY_HOST || it.dest_address < it.buffer_address) {
                results[i] = invalid;
                continue;
            }
            auto b = buffer_at.emplace(it.buffer_address, bases.size());
            if (b.second) {
                bases.push_back(it.buffer_address);
                rb.ptrs.push_back(reinterpret_cast<void *>(static_cast<std::uintptr_t>(it.buffer_address)));
                for (auto *v : {&rb.dsts, &rb.srcs, &rb.sizes, &rb.items}) v->emplace_back();
                rb.keys.emplace_back();
            }
            std::size_t bi = b.first->second;
            std::string key(it.key.ptr == nullptr ? "" : it.key.ptr, it.key.len);
            auto k = key_at.emplace(std::make_pair(bi, key), rb.keys[bi].size());
            if (k.second) {
                rb.keys[bi].push_back(key);
                for (auto *v : {&rb.dsts, &rb.srcs, &rb.sizes, &rb.items}) (*v)[bi].emplace_back();
            }
            std::size_t ki = k.first->second;
            rb.dsts[bi][ki].push_back(static_cast<std::size_t>(it.dest_address - bases[bi]));
            rb.srcs[bi][ki].push_back(static_cast<std::size_t>(it.object_offset));
            rb.sizes[bi][ki].push_back(static_cast<std::size_t>(it.len));
            rb.items[bi][ki].push_back(i);
        }
        return rb;
    }

    /// Writes get_into_ranges' answer `out` (out[b][k][r]) back to the items' `results`,
    /// each through `code`; a range the answer lacks gets `missing`.
    template <class Out, class Code>
    void scatter(const Out &out, std::int64_t *results, Code code, std::int64_t missing) const {
        for (std::size_t b = 0; b < items.size(); ++b)
            for (std::size_t k = 0; k < items[b].size(); ++k)
                for (std::size_t r = 0; r < items[b][k].size(); ++r) {
                    bool have = b < out.size() && k < out[b].size() && r < out[b][k].size();
                    results[items[b][k][r]] = have ? code(static_cast<std::int64_t>(out[b][k][r])) : missing;
                }
    }
};

}  // namespace mooncake_store
}  // namespace mws
