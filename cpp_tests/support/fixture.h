/* fixture.h: reads the runtime-binding JSON form of the conformance fixtures into the
 * C API's structs (compiles as C11 and C++17). Test code only. */
#ifndef MWS_TESTS_FIXTURE_H
#define MWS_TESTS_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"
#include "mini_json.h"

#define FIXTURE_MAX_DIMS 16

/* Storage for one runtime fragment's arrays (the strings stay in the mj_value). */
typedef struct fixture_fragment {
    mws_runtime_fragment f;
    uint64_t shape[FIXTURE_MAX_DIMS];
    uint64_t strides[FIXTURE_MAX_DIMS];
} fixture_fragment;

static inline int fixture_u64_array(const mj_value *a, uint64_t *out, size_t *len) {
    size_t k;
    if (a == NULL || a->kind != MJ_ARRAY || a->count > FIXTURE_MAX_DIMS) {
        return 0;
    }
    for (k = 0; k < a->count; k++) {
        out[k] = a->items[k]->u64;
    }
    *len = a->count;
    return 1;
}

/* Fills `out` from a fixture runtime fragment object; 0 if malformed. The memory kind
 * follows the device name: "cuda:N" is device N, anything else is host memory. */
static inline int fixture_fragment_from_json(const mj_value *j, fixture_fragment *out) {
    const char *device = mj_str(j, "device");
    memset(out, 0, sizeof *out);
    out->f.placement_fragment_id = mj_str(j, "placement_fragment_id");
    out->f.fragment_id = mj_str(j, "fragment_id");
    out->f.address = (const void *)(uintptr_t)mj_u64(j, "address");
    out->f.nbytes = mj_u64(j, "nbytes");
    out->f.worker_id = mj_str(j, "worker_id");
    out->f.endpoint = mj_str(j, "endpoint");
    out->f.device = device;
    out->f.itemsize = mj_u64(j, "itemsize");
    if (!fixture_u64_array(mj_get(j, "local_shape"), out->shape, &out->f.local_shape_len) ||
        !fixture_u64_array(mj_get(j, "strides_bytes"), out->strides, &out->f.strides_bytes_len)) {
        return 0;
    }
    out->f.local_shape = out->shape;
    out->f.strides_bytes = out->strides;
    out->f.storage_address = (const void *)(uintptr_t)mj_u64(j, "storage_address");
    out->f.storage_nbytes = mj_u64(j, "storage_nbytes");
    out->f.storage_offset_bytes = mj_u64(j, "storage_offset_bytes");
    if (device != NULL && strncmp(device, "cuda:", 5) == 0) {
        out->f.memory_kind = MWS_MEMORY_DEVICE;
        out->f.device_ordinal = (uint32_t)strtoul(device + 5, NULL, 10);
    } else {
        out->f.memory_kind = MWS_MEMORY_HOST;
    }
    return 1;
}

/* Fills `out` from a fixture binding object (strings borrowed from `j`). */
static inline void fixture_binding_options_from_json(const mj_value *j, mws_binding_options *out) {
    memset(out, 0, sizeof *out);
    out->resource_id = mj_str(j, "resource_id");
    out->revision = mj_str(j, "revision");
    out->placement_id = mj_str(j, "placement_id");
    out->placement_digest = mj_str(j, "placement_digest");
    out->participant_id = mj_str(j, "participant_id");
    out->instance_id = mj_str(j, "instance_id");
    out->lease_id = mj_str(j, "lease_id");
    out->lease_generation = mj_u64(j, "generation");
}

#endif /* MWS_TESTS_FIXTURE_H */
