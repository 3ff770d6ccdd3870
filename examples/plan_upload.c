/* plan_upload.c: plan a weight upload through the C API.
 *
 *   plan_upload_c [PLACEMENT.json]
 *
 * Parses a placement (the file given, or a small embedded TP=2 sample), binds every
 * fragment of every participant to a malloc'ed host buffer, plans the upload and
 * prints the plan. Planning is pure: no byte is copied and no store is contacted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"

/* A TP=2 placement of one bf16 tensor [8, 4] split on dim 0. */
static const char SAMPLE_PLACEMENT[] =
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

#define MAX_DIMS 16

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0) {
        n = ftell(f);
    }
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = (char *)malloc((size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (f != NULL) {
        fclose(f);
    }
    *len = (size_t)(n < 0 ? 0 : n);
    return buf;
}

static int fail(const char *what, mws_status st) {
    fprintf(stderr, "%s failed: %s: %s\n", what, mws_status_name(st), mws_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    char *file_json = NULL;
    const char *json = SAMPLE_PLACEMENT;
    size_t json_len = sizeof SAMPLE_PLACEMENT - 1;
    size_t n_fragments = 0, n_bindings = 0, i;
    const char *current = NULL;
    mws_placement *placement = NULL;
    mws_binding **bindings = NULL;
    void **buffers = NULL;
    mws_upload_plan *plan = NULL;
    mws_upload_options options;
    mws_status st;
    int rc = 1;

    if (argc > 1) {
        if ((file_json = read_file(argv[1], &json_len)) == NULL) {
            fprintf(stderr, "cannot read %s\n", argv[1]);
            return 1;
        }
        json = file_json;
    }

    /* 1. Parse and validate the placement (the library copies what it needs). */
    if ((st = mws_placement_from_json(json, json_len, &placement)) != MWS_OK) {
        rc = fail("mws_placement_from_json", st);
        goto out;
    }
    printf("placement %s\n  %zu participants, %zu tensors, %zu fragments\n", mws_placement_id(placement, NULL),
           mws_placement_participant_count(placement), mws_placement_tensor_count(placement),
           mws_placement_fragment_count(placement));

    /* 2. One binding per participant, one malloc'ed host buffer per fragment.
     *    Fragments are listed grouped by participant. */
    n_fragments = mws_placement_fragment_count(placement);
    bindings = (mws_binding **)calloc(n_fragments + 1, sizeof *bindings);
    buffers = (void **)calloc(n_fragments + 1, sizeof *buffers);
    if (bindings == NULL || buffers == NULL) {
        goto out;
    }
    for (i = 0; i < n_fragments; i++) {
        mws_placement_fragment_info info;
        mws_runtime_fragment f;
        uint64_t strides[MAX_DIMS];
        char fragment_id[256];
        size_t d;

        if ((st = mws_placement_fragment(placement, i, &info)) != MWS_OK) {
            rc = fail("mws_placement_fragment", st);
            goto out;
        }
        if (current == NULL || strcmp(current, info.participant_id) != 0) {
            mws_binding_options o;
            memset(&o, 0, sizeof o);
            o.resource_id = mws_placement_resource_id(placement, NULL);
            o.revision = mws_placement_revision(placement, NULL);
            o.placement_id = mws_placement_id(placement, NULL);
            o.placement_digest = mws_placement_digest(placement, NULL);
            o.participant_id = info.participant_id;
            o.instance_id = info.participant_id; /* one engine process per participant */
            o.lease_id = "example-lease";
            o.lease_generation = mws_placement_weight_generation(placement);
            if ((st = mws_binding_new(&o, &bindings[n_bindings])) != MWS_OK) {
                rc = fail("mws_binding_new", st);
                goto out;
            }
            n_bindings++;
            current = info.participant_id; /* borrowed from the placement */
        }
        if (info.ndim == 0 || info.ndim > MAX_DIMS) {
            fprintf(stderr, "unsupported rank %zu\n", info.ndim);
            goto out;
        }
        buffers[i] = calloc(1, (size_t)info.nbytes);
        if (buffers[i] == NULL) {
            goto out;
        }
        /* Contiguous row-major strides, in bytes. */
        strides[info.ndim - 1] = info.itemsize;
        for (d = info.ndim - 1; d > 0; d--) {
            strides[d - 1] = strides[d] * info.local_shape[d];
        }
        snprintf(fragment_id, sizeof fragment_id, "%s:rt%zu", info.participant_id, i);
        memset(&f, 0, sizeof f);
        f.placement_fragment_id = info.placement_fragment_id;
        f.fragment_id = fragment_id; /* copied by the library */
        f.address = buffers[i];
        f.nbytes = info.nbytes;
        f.worker_id = info.participant_id;
        f.endpoint = "localhost:17000";
        f.device = "cpu";
        f.itemsize = info.itemsize;
        f.local_shape = info.local_shape;
        f.local_shape_len = info.ndim;
        f.strides_bytes = strides;
        f.strides_bytes_len = info.ndim;
        f.storage_address = buffers[i];
        f.storage_nbytes = info.nbytes;
        f.storage_offset_bytes = 0;
        f.memory_kind = MWS_MEMORY_HOST;
        if ((st = mws_binding_add_fragment(bindings[n_bindings - 1], &f)) != MWS_OK) {
            rc = fail("mws_binding_add_fragment", st);
            goto out;
        }
    }

    /* 3. Plan. A fixed transaction id and time make the output reproducible; pass
     *    NULL options for a random transaction id and the current time. */
    memset(&options, 0, sizeof options);
    options.store_namespace = "default";
    options.key_prefix = "weights";
    options.transaction_id = "de644a8d8f23b7ea0895fc8cad62451c";
    options.created_at = "2025-03-14T15:09:26Z";
    if ((st = mws_upload_plan_new(placement, (const mws_binding *const *)bindings, n_bindings, &options, &plan)) !=
        MWS_OK) {
        rc = fail("mws_upload_plan_new", st);
        goto out;
    }

    /* 4. Print the plan. */
    printf("manifest digest %s\n  manifest key %s\n  control key  %s\n", mws_upload_plan_manifest_digest(plan, NULL),
           mws_upload_plan_manifest_key(plan, NULL), mws_upload_plan_control_key(plan, NULL));
    for (i = 0; i < mws_upload_plan_operation_count(plan); i++) {
        mws_upload_operation op;
        if (mws_upload_plan_operation(plan, i, &op) == MWS_OK) {
            printf("  op %zu: %s (%s) -> %s [%llu bytes]\n", i, op.source_fragment_id, op.source_participant_id,
                   op.object_key, (unsigned long long)op.nbytes);
        }
    }
    rc = 0;
out:
    mws_upload_plan_free(plan);
    for (i = 0; i < n_bindings; i++) {
        mws_binding_free(bindings[i]);
    }
    for (i = 0; buffers != NULL && i < n_fragments; i++) {
        free(buffers[i]);
    }
    free(bindings);
    free(buffers);
    mws_placement_free(placement);
    free(file_json);
    return rc;
}
