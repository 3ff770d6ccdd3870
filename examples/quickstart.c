/* quickstart.c: the C quick start (docs/C-QUICKSTART.md), a complete program.
 *
 *   quickstart_c [STORE_DIR]
 *
 * A trainer holds one bf16 tensor [8, 6] in TP=2 (rows split); it snapshots it into a
 * store (the embedded memory store, or a directory store at STORE_DIR, which must be
 * missing or empty), then a server with TP=3 (columns split) restores it and checks
 * every byte. Exits 0 on success. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        mws_status st_ = (call);                                                                      \
        if (st_ != MWS_OK) {                                                                          \
            fprintf(stderr, "%s failed: %s: %s\n", #call, mws_status_name(st_), mws_last_error_message()); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

#define ROWS 8
#define COLS 6
#define ITEMSIZE 2
static const char *TENSOR = "model.layers.0.mlp.down_proj.weight";

/* A layout: TP ranks, each holding the box [row0, row0+rows) x [col0, col0+cols). */
typedef struct {
    uint64_t tp;
    char participant[4][32];
    char pfid[4][80]; /* placement fragment ids, from the builder */
    uint64_t offset[4][2], shape[4][2];
    unsigned char *buffer[4];
    mws_placement *placement;
    mws_binding *binding[4];
} layout;

/* Builds the placement (TP split on `dim`) and binds each rank to a fresh buffer. */
static void make_layout(layout *l, uint64_t tp, uint64_t dim, const char *set_id, const char *instance) {
    mws_placement_builder_options o = {"quickstart-model", "rev-1", 1, set_id, tp, 1, 1, 1};
    mws_placement_builder *b = NULL;
    CHECK(mws_placement_builder_new(&o, &b));
    uint64_t gshape[2] = {ROWS, COLS};
    mws_parallel_axis axes[2] = {{MWS_AXIS_DP, MWS_AXIS_REPLICATED, 0}, {MWS_AXIS_TP, MWS_AXIS_SPLIT, dim}};
    mws_tensor_spec t = {TENSOR, gshape, 2, "bfloat16", ITEMSIZE, "quickstart:row-major:v1", axes, 2, NULL, NULL};
    CHECK(mws_placement_builder_add_tensor(b, &t));
    l->tp = tp;
    for (uint64_t r = 0; r < tp; r++) {
        mws_rank rank = {0, 0, 0, r};
        snprintf(l->participant[r], sizeof l->participant[r], "%s-tp%llu", instance, (unsigned long long)r);
        CHECK(mws_placement_builder_add_participant(b, l->participant[r], &rank));
        uint64_t part = gshape[dim] / tp;
        l->offset[r][0] = dim == 0 ? r * part : 0;
        l->offset[r][1] = dim == 1 ? r * part : 0;
        l->shape[r][0] = dim == 0 ? part : ROWS;
        l->shape[r][1] = dim == 1 ? part : COLS;
        mws_fragment_spec f = {l->participant[r], TENSOR, l->offset[r], l->shape[r], 2, NULL, NULL, 0, NULL};
        const char *id = NULL;
        CHECK(mws_placement_builder_add_fragment(b, &f, &id, NULL));
        snprintf(l->pfid[r], sizeof l->pfid[r], "%s", id); /* id is borrowed from the builder */
    }
    CHECK(mws_placement_builder_build(b, &l->placement));
    mws_placement_builder_free(b);

    for (uint64_t r = 0; r < tp; r++) {
        uint64_t nbytes = l->shape[r][0] * l->shape[r][1] * ITEMSIZE;
        uint64_t strides[2] = {l->shape[r][1] * ITEMSIZE, ITEMSIZE}; /* row-major */
        l->buffer[r] = calloc(1, nbytes); /* must outlive every upload or load of the binding */
        mws_binding_options bo = {
            mws_placement_resource_id(l->placement, NULL), mws_placement_revision(l->placement, NULL),
            mws_placement_id(l->placement, NULL),          mws_placement_digest(l->placement, NULL),
            l->participant[r],                             l->participant[r], /* instance id */
            "lease-1",                                     1,                 /* generation */
        };
        CHECK(mws_binding_new(&bo, &l->binding[r]));
        mws_runtime_fragment rf = {
            .placement_fragment_id = l->pfid[r], .fragment_id = l->participant[r],
            .address = l->buffer[r], .nbytes = nbytes,
            .worker_id = "worker-0", .endpoint = "localhost", .device = "cpu", .itemsize = ITEMSIZE,
            .local_shape = l->shape[r], .local_shape_len = 2, .strides_bytes = strides, .strides_bytes_len = 2,
            .storage_address = l->buffer[r], .storage_nbytes = nbytes, .memory_kind = MWS_MEMORY_HOST,
        };
        CHECK(mws_binding_add_fragment(l->binding[r], &rf));
    }
}

static void free_layout(layout *l) {
    for (uint64_t r = 0; r < l->tp; r++) {
        mws_binding_free(l->binding[r]);
        free(l->buffer[r]);
    }
    mws_placement_free(l->placement);
}

/* The value of global element (i, j), byte k: what the trainer writes. */
static unsigned char value(uint64_t i, uint64_t j, uint64_t k) { return (unsigned char)(i * 31 + j * 7 + k); }

static void on_progress(void *ctx, const mws_progress *p) {
    printf("  %s: %llu/%llu bytes, %llu/%llu items\n", (const char *)ctx, (unsigned long long)p->bytes_done,
           (unsigned long long)p->bytes_total, (unsigned long long)p->items_done, (unsigned long long)p->items_total);
}

int main(int argc, char **argv) {
    mws_store *store = NULL;
    if (argc > 1) {
        CHECK(mws_store_open_dir(argv[1], NULL, &store)); /* NULL options: the defaults */
    } else {
        CHECK(mws_store_open_memory(NULL, &store));
    }

    /* 1. The trainer: TP=2, rows split; fill its buffers. */
    layout src;
    make_layout(&src, 2, 0, "trainer-tp2", "trainer");
    for (uint64_t r = 0; r < src.tp; r++)
        for (uint64_t i = 0; i < src.shape[r][0]; i++)
            for (uint64_t j = 0; j < src.shape[r][1]; j++)
                for (uint64_t k = 0; k < ITEMSIZE; k++)
                    src.buffer[r][(i * src.shape[r][1] + j) * ITEMSIZE + k] =
                        value(src.offset[r][0] + i, src.offset[r][1] + j, k);

    /* 2. Snapshot: plan, then an upload transaction (no I/O yet) uploads each
     *    participant (here all from one process) and commits once. */
    mws_upload_plan *plan = NULL;
    CHECK(mws_upload_plan_new(src.placement, (const mws_binding *const *)src.binding, src.tp, NULL, &plan));
    mws_transaction *tx = NULL;
    CHECK(mws_transaction_new(store, plan, &tx));
    mws_io_args up = {0};
    up.progress = on_progress;
    up.progress_ctx = "upload";
    mws_status st = MWS_OK;
    for (uint64_t r = 0; st == MWS_OK && r < src.tp; r++)
        st = mws_transaction_upload(tx, src.placement, src.binding[r], &up);
    mws_stored_manifest *manifest = NULL;
    if (st == MWS_OK) st = mws_transaction_commit(tx, &manifest);
    if (st != MWS_OK && !mws_transaction_commit_decision_may_exist(tx))
        mws_transaction_abort(tx); /* discard; else retry the commit, or finalize */
    mws_transaction_free(tx);      /* never aborts: recovery is explicit */
    CHECK(st);
    printf("committed %s (%zu fragments)\n", mws_stored_manifest_key(manifest, NULL),
           mws_stored_manifest_fragment_count(manifest));

    /* 3. The server: TP=3, columns split; restore into its buffers and check them. */
    layout dst;
    make_layout(&dst, 3, 1, "server-tp3", "server");
    mws_load_plan *load = NULL;
    CHECK(mws_load_plan_new(manifest, dst.placement, (const mws_binding *const *)dst.binding, dst.tp, NULL, &load));
    size_t wrong = 0;
    for (uint64_t r = 0; r < dst.tp; r++) {
        /* A registration lease pins and registers the rank's buffers once for many
         * loads (here one); exactly the fragments the load touches. */
        const char *ids[1] = {dst.participant[r]};
        mws_registration_lease *lease = NULL;
        CHECK(mws_registration_lease_new(store, dst.binding[r], ids, 1, MWS_LEASE_TARGET,
                                         NULL /* static guard, or an mws_guard_vtable */, NULL, NULL, &lease));
        mws_io_args down = {0};
        down.lease = lease; /* the guard fields are then ignored */
        down.progress = on_progress;
        down.progress_ctx = "restore";
        mws_load_stats stats;
        CHECK(mws_store_load(store, load, dst.binding[r], &down, &stats)); /* nothing registered per call */
        CHECK(mws_registration_lease_close(lease, MWS_TERMINAL_COMPLETED)); /* unregisters; idempotent */
        mws_registration_lease_free(lease);
        for (uint64_t i = 0; i < dst.shape[r][0]; i++)
            for (uint64_t j = 0; j < dst.shape[r][1]; j++)
                for (uint64_t k = 0; k < ITEMSIZE; k++)
                    wrong += dst.buffer[r][(i * dst.shape[r][1] + j) * ITEMSIZE + k] !=
                             value(dst.offset[r][0] + i, dst.offset[r][1] + j, k);
    }
    printf("restored into TP=3: %s\n", wrong == 0 ? "every byte matches" : "MISMATCH");

    mws_load_plan_free(load);
    mws_stored_manifest_free(manifest);
    mws_upload_plan_free(plan);
    free_layout(&dst);
    free_layout(&src);
    mws_store_free(store);
    return wrong == 0 ? 0 : 1;
}
