/* sample.h: test helpers shared by the C and C++ tests (compiles as C11 and C++17).
 *
 * MWS_SAMPLE_PLACEMENT_JSON is the placement of conformance case 014 (TP=2, one 2-D
 * bf16 tensor [8, 4] split on dim 0). sample_bind() builds a runtime binding for one
 * participant through the public API only, binding each of its fragments to a slice
 * of a caller-provided host buffer. */
#ifndef MWS_TESTS_SAMPLE_H
#define MWS_TESTS_SAMPLE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"

#define MWS_SAMPLE_PLACEMENT_ID "sha256:cabe1ad0eee61a901c0f83f2d89a7815f4a4fa647feec6ae4309f6086b6da8ac"
#define MWS_SAMPLE_PLACEMENT_DIGEST "25d857d5f6fa06bfe6a08bf0ec1b93954c09ea153ff20cc3168cb0348cdfbe03"
#define MWS_SAMPLE_TOPOLOGY_ID "sha256:c6c933912144915393c0c11187e25447738938b0bd4b44e28ca291298121e8ea"
#define MWS_SAMPLE_TRANSACTION_ID "de644a8d8f23b7ea0895fc8cad62451c"
#define MWS_SAMPLE_CREATED_AT "2025-03-14T15:09:26Z"
#define MWS_SAMPLE_MANIFEST_DIGEST "31a219d04fbb5c8d821d2ade664d7c277dc13b7d13c5c385b07d0e5580144bf3"
#define MWS_SAMPLE_P0 "rank-d0-p0-e0-t0"
#define MWS_SAMPLE_P1 "rank-d0-p0-e0-t1"

static const char MWS_SAMPLE_PLACEMENT_JSON[] =
    "{\"parts\":[{\"fragments\":[{\"aliases\":[],\"global_offset\":[0,0],\"local_shape\":[4,4],\"nbytes\":3"
    "2,\"placement_fragment_id\":\"sha256:0d6d6e1f48414d495aac3125087eaf76e0b574ef0b3b2a5a4e4ec781"
    "a0b1b225\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0},\"tensor_id\":\"model.layers.0.mlp.down_proj.w"
    "eight\"}],\"participant_id\":\"rank-d0-p0-e0-t0\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0}},{\"fragm"
    "ents\":[{\"aliases\":[],\"global_offset\":[4,0],\"local_shape\":[4,4],\"nbytes\":32,\"placement_frag"
    "ment_id\":\"sha256:6e784bd2304958a1cff065a922dd3ccf3bc4a543e460c639529c89f7208bc552\",\"rank\":"
    "{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1},\"tensor_id\":\"model.layers.0.mlp.down_proj.weight\"}],\"partici"
    "pant_id\":\"rank-d0-p0-e0-t1\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1}}],\"placement_id\":\"sha256:"
    "cabe1ad0eee61a901c0f83f2d89a7815f4a4fa647feec6ae4309f6086b6da8ac\",\"placement_set_id\":\"fixt"
    "ure-set\",\"resource_id\":\"fixture-model\",\"resource_kind\":\"model_weight\",\"revision\":\"rev-1\",\""
    "tensors\":[{\"dtype\":\"bfloat16\",\"expert_id\":null,\"global_shape\":[8,4],\"itemsize\":2,\"layer_id"
    "\":0,\"layout_fingerprint\":\"fixture:logical-contiguous:v1\",\"parallel_axes\":[{\"kind\":\"dp\",\"se"
    "mantics\":\"replicated\"},{\"dim\":0,\"kind\":\"tp\",\"semantics\":\"split\"}],\"shard_dims\":[0],\"tensor"
    "_id\":\"model.layers.0.mlp.down_proj.weight\"}],\"topology\":{\"dp_size\":1,\"ep_size\":1,\"particip"
    "ants\":[{\"participant_id\":\"rank-d0-p0-e0-t0\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":0}},{\"partic"
    "ipant_id\":\"rank-d0-p0-e0-t1\",\"rank\":{\"dp\":0,\"ep\":0,\"pp\":0,\"tp\":1}}],\"pp_size\":1,\"topology_"
    "id\":\"sha256:c6c933912144915393c0c11187e25447738938b0bd4b44e28ca291298121e8ea\",\"tp_size\":2}"
    ",\"weight_generation\":1}"
;

/* Binds every fragment of `participant_id`'s part to consecutive slices of the
 * allocation at `address` (contiguous row-major) in memory `memory_kind` (an
 * mws_memory_kind value; device memory of device `ordinal`, named "cuda:<ordinal>",
 * for example a fenced device's). Returns the first failing status. */
static inline mws_status sample_bind_memory(const mws_placement *placement, const char *participant_id,
                                            uint64_t generation, uint64_t address, size_t buffer_len,
                                            uint32_t memory_kind, uint32_t ordinal, mws_binding **out) {
    mws_binding_options o;
    mws_binding *b = NULL;
    mws_status st;
    size_t i, n = mws_placement_fragment_count(placement), offset = 0, k = 0;
    char lease[256];
    char device[32];
    snprintf(lease, sizeof lease, "%s-lease-g%llu", participant_id, (unsigned long long)generation);
    if (memory_kind == MWS_MEMORY_DEVICE) {
        snprintf(device, sizeof device, "cuda:%u", (unsigned)ordinal);
    } else {
        snprintf(device, sizeof device, "cpu");
    }
    memset(&o, 0, sizeof o);
    o.resource_id = mws_placement_resource_id(placement, NULL);
    o.revision = mws_placement_revision(placement, NULL);
    o.placement_id = mws_placement_id(placement, NULL);
    o.placement_digest = mws_placement_digest(placement, NULL);
    o.participant_id = participant_id;
    o.instance_id = participant_id;
    o.lease_id = lease;
    o.lease_generation = generation;
    st = mws_binding_new(&o, &b);
    if (st != MWS_OK) {
        return st;
    }
    for (i = 0; i < n; i++) {
        mws_placement_fragment_info info;
        mws_runtime_fragment f;
        uint64_t strides[16];
        char fragment_id[256];
        size_t d;
        st = mws_placement_fragment(placement, i, &info);
        if (st != MWS_OK) {
            break;
        }
        if (strcmp(info.participant_id, participant_id) != 0) {
            continue;
        }
        if (info.ndim > 16 || offset + info.nbytes > buffer_len) {
            st = MWS_INVALID_ARGUMENT;
            break;
        }
        for (d = info.ndim; d > 0; d--) {
            strides[d - 1] = d == info.ndim ? info.itemsize : strides[d] * info.local_shape[d];
        }
        snprintf(fragment_id, sizeof fragment_id, "%s:rt%u", participant_id, (unsigned)k++);
        memset(&f, 0, sizeof f);
        f.placement_fragment_id = info.placement_fragment_id;
        f.fragment_id = fragment_id;
        f.address = (const void *)(uintptr_t)(address + offset);
        f.nbytes = info.nbytes;
        f.worker_id = participant_id;
        f.endpoint = "localhost:17000";
        f.device = device;
        f.itemsize = info.itemsize;
        f.local_shape = info.local_shape;
        f.local_shape_len = info.ndim;
        f.strides_bytes = strides;
        f.strides_bytes_len = info.ndim;
        f.storage_address = (const void *)(uintptr_t)address;
        f.storage_nbytes = buffer_len;
        f.storage_offset_bytes = offset;
        f.memory_kind = memory_kind;
        f.device_ordinal = memory_kind == MWS_MEMORY_DEVICE ? ordinal : 0;
        st = mws_binding_add_fragment(b, &f);
        if (st != MWS_OK) {
            break;
        }
        offset += (size_t)info.nbytes;
    }
    if (st != MWS_OK) {
        mws_binding_free(b);
        return st;
    }
    *out = b;
    return MWS_OK;
}

/* Binds every fragment of `participant_id`'s part to consecutive slices of `buffer`
 * (host memory, contiguous row-major). Returns the first failing status. */
static inline mws_status sample_bind(const mws_placement *placement, const char *participant_id, uint64_t generation,
                                     unsigned char *buffer, size_t buffer_len, mws_binding **out) {
    return sample_bind_memory(placement, participant_id, generation, (uint64_t)(uintptr_t)buffer, buffer_len,
                              MWS_MEMORY_HOST, 0, out);
}

#endif /* MWS_TESTS_SAMPLE_H */
