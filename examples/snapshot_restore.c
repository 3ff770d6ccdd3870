/* snapshot_restore.c: snapshot a small sharded model and restore it into another
 * layout, through the C API only.
 *
 *   snapshot_restore_c [--reuse] [STORE_DIR]
 *
 * A three-tensor model (bf16) is held by a trainer in TP=2: one fragment per tensor
 * and rank in one host allocation per rank. The program builds the placement with the
 * library's placement builder, snapshots the trainer's buffers into a directory store
 * (STORE_DIR, default a fresh directory under /tmp) through a writer, then restores the
 * published manifest into a serving layout with TP=4 and checks every byte. Exits
 * non-zero on any failure.
 *
 * STORE_DIR must be missing or empty; a directory store of an earlier run there is
 * replaced only with --reuse; anything else is refused untouched. At the end only what
 * the run created is removed (the store's entries; STORE_DIR itself if the run created
 * it). */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"

/* ---- the model ---------------------------------------------------------------- */
typedef struct tensor_def {
    const char *id;    /* sorted by id (the canonical order) */
    size_t ndim;       /* 1 or 2 */
    uint64_t shape[2];
    int split;         /* TP split dimension, -1: replicated on every TP rank */
} tensor_def;

static const tensor_def TENSORS[] = {
    {"model.embed_tokens.weight", 2, {256, 64}, 0},
    {"model.layers.0.input_layernorm.weight", 1, {64, 0}, -1},
    {"model.layers.0.self_attn.o_proj.weight", 2, {64, 64}, 1},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])
#define ITEMSIZE 2
#define MAX_TP 8

/* Expected content: a hash of (tensor, linear element index, byte). */
static unsigned char expected_byte(size_t tensor, uint64_t element, uint64_t byte) {
    uint64_t x = ((uint64_t)(tensor + 1) << 48 ^ (element * ITEMSIZE + byte)) * 0x9E3779B97F4A7C15ull;
    return (unsigned char)(x >> 56);
}

/* One fragment of one tensor on one TP rank, at `offset` in its rank's allocation. */
typedef struct fragment {
    size_t tensor;
    char pfid[128];       /* placement fragment id */
    char runtime_id[128]; /* runtime fragment id */
    uint64_t goffset[2], shape[2], strides[2], nbytes;
    size_t offset;
} fragment;

/* A layout (TP only here): per rank, its fragments and one host allocation. */
typedef struct layout {
    uint64_t tp;
    char participant[MAX_TP][48];
    fragment frags[MAX_TP][N_TENSORS];
    unsigned char *buffer[MAX_TP];
    size_t buffer_size[MAX_TP];
    mws_placement *placement;
    mws_binding *bindings[MAX_TP];
} layout;

static int fail(const char *what, mws_status st) {
    fprintf(stderr, "%s failed: %s: %s\n", what, mws_status_name(st), mws_last_error_message());
    return 1;
}

/* ---- placement + buffers + bindings of a TP layout ------------------------------- */
static const char RESOURCE[] = "demo-model", REVISION[] = "rev-1";

/* Builds the placement through the library's placement builder: the canonical JSON
 * and the sha256 ids are the library's, nothing is hashed here. */
static int build_placement(layout *l, const char *set, mws_placement **out) {
    mws_placement_builder_options o = {0};
    mws_placement_builder *b = NULL;
    mws_status st;
    uint64_t r;
    size_t t;
    o.resource_id = RESOURCE;
    o.revision = REVISION;
    o.weight_generation = 1;
    o.placement_set_id = set;
    o.tp_size = l->tp;
    o.pp_size = o.ep_size = o.dp_size = 1;
    if ((st = mws_placement_builder_new(&o, &b)) != MWS_OK) return fail("mws_placement_builder_new", st);
    for (r = 0; r < l->tp && st == MWS_OK; r++) {
        mws_rank rank = {0, 0, 0, r};
        st = mws_placement_builder_add_participant(b, l->participant[r], &rank);
    }
    for (t = 0; t < N_TENSORS && st == MWS_OK; t++) {
        mws_parallel_axis axes[2] = {{MWS_AXIS_DP, MWS_AXIS_REPLICATED, 0}, {MWS_AXIS_TP, MWS_AXIS_REPLICATED, 0}};
        mws_tensor_spec spec = {0};
        if (TENSORS[t].split >= 0) axes[1].semantics = MWS_AXIS_SPLIT, axes[1].dim = (uint64_t)TENSORS[t].split;
        spec.tensor_id = TENSORS[t].id;
        spec.global_shape = TENSORS[t].shape;
        spec.ndim = TENSORS[t].ndim;
        spec.dtype = "bfloat16";
        spec.itemsize = ITEMSIZE;
        spec.layout_fingerprint = "demo:row-major:v1";
        spec.axes = axes;
        spec.axis_count = 2;
        st = mws_placement_builder_add_tensor(b, &spec);
    }
    for (r = 0; r < l->tp && st == MWS_OK; r++) {
        for (t = 0; t < N_TENSORS && st == MWS_OK; t++) {
            const fragment *f = &l->frags[r][t];
            mws_fragment_spec spec = {0};
            spec.participant_id = l->participant[r];
            spec.tensor_id = TENSORS[t].id;
            spec.global_offset = f->goffset;
            spec.local_shape = f->shape;
            spec.ndim = TENSORS[t].ndim;
            spec.placement_fragment_id = f->pfid;
            st = mws_placement_builder_add_fragment(b, &spec, NULL, NULL);
        }
    }
    if (st == MWS_OK) st = mws_placement_builder_build(b, out);
    mws_placement_builder_free(b);
    return st == MWS_OK ? 0 : fail("mws_placement_builder", st);
}

/* Lays out `tp` ranks, parses the placement, allocates and binds the buffers (filled
 * with the expected contents when `fill`, else with 0xA5). */
static int layout_init(layout *l, uint64_t tp, const char *set, int fill, const char *instance) {
    uint64_t r;
    size_t t, d;
    mws_status st;
    memset(l, 0, sizeof *l);
    l->tp = tp;
    for (r = 0; r < tp; r++) {
        snprintf(l->participant[r], sizeof l->participant[r], "w-d0-p0-e0-t%llu", (unsigned long long)r);
        for (t = 0; t < N_TENSORS; t++) {
            fragment *f = &l->frags[r][t];
            f->tensor = t;
            f->nbytes = ITEMSIZE;
            for (d = 0; d < TENSORS[t].ndim; d++) {
                f->shape[d] = TENSORS[t].shape[d];
                f->goffset[d] = 0;
                if ((int)d == TENSORS[t].split) {
                    f->shape[d] /= tp;
                    f->goffset[d] = r * f->shape[d];
                }
                f->nbytes *= f->shape[d];
            }
            f->strides[TENSORS[t].ndim - 1] = ITEMSIZE; /* row-major */
            if (TENSORS[t].ndim == 2) f->strides[0] = f->shape[1] * ITEMSIZE;
            if (snprintf(f->pfid, sizeof f->pfid, "f:%s@%s", TENSORS[t].id, l->participant[r]) >= (int)sizeof f->pfid ||
                snprintf(f->runtime_id, sizeof f->runtime_id, "%s:%s:%zu", instance, l->participant[r], t) >=
                    (int)sizeof f->runtime_id)
                return 1; /* an id too long for this example's fixed buffers */
            f->offset = l->buffer_size[r];
            l->buffer_size[r] += (size_t)(f->nbytes + 63) / 64 * 64;
        }
    }
    if (build_placement(l, set, &l->placement) != 0) return 1;

    for (r = 0; r < tp; r++) {
        mws_binding_options o;
        char lease[64];
        l->buffer[r] = (unsigned char *)malloc(l->buffer_size[r]);
        if (l->buffer[r] == NULL) return 1;
        memset(l->buffer[r], 0xA5, l->buffer_size[r]);
        snprintf(lease, sizeof lease, "%s-lease-1", instance);
        o.resource_id = RESOURCE;
        o.revision = REVISION;
        o.placement_id = mws_placement_id(l->placement, NULL);
        o.placement_digest = mws_placement_digest(l->placement, NULL);
        o.participant_id = l->participant[r];
        o.instance_id = instance;
        o.lease_id = lease;
        o.lease_generation = 1;
        if ((st = mws_binding_new(&o, &l->bindings[r])) != MWS_OK) return fail("mws_binding_new", st);
        for (t = 0; t < N_TENSORS; t++) {
            fragment *f = &l->frags[r][t];
            mws_runtime_fragment rf;
            memset(&rf, 0, sizeof rf);
            if (fill) { /* row-major box of the tensor: element (i, j) is global (i + o0, j + o1) */
                uint64_t rows = TENSORS[t].ndim == 2 ? f->shape[0] : 1, cols = f->shape[TENSORS[t].ndim - 1];
                uint64_t gcols = TENSORS[t].shape[TENSORS[t].ndim - 1], i, j, b;
                unsigned char *p = l->buffer[r] + f->offset;
                for (i = 0; i < rows; i++)
                    for (j = 0; j < cols; j++)
                        for (b = 0; b < ITEMSIZE; b++) {
                            uint64_t row = TENSORS[t].ndim == 2 ? i + f->goffset[0] : 0;
                            uint64_t col = j + f->goffset[TENSORS[t].ndim - 1];
                            *p++ = expected_byte(t, row * gcols + col, b);
                        }
            }
            rf.placement_fragment_id = f->pfid;
            rf.fragment_id = f->runtime_id;
            rf.address = l->buffer[r] + f->offset;
            rf.nbytes = f->nbytes;
            rf.worker_id = l->participant[r];
            rf.endpoint = "localhost:17000";
            rf.device = "cpu";
            rf.itemsize = ITEMSIZE;
            rf.local_shape = f->shape;
            rf.local_shape_len = TENSORS[t].ndim;
            rf.strides_bytes = f->strides;
            rf.strides_bytes_len = TENSORS[t].ndim;
            rf.storage_address = l->buffer[r];
            rf.storage_nbytes = l->buffer_size[r];
            rf.storage_offset_bytes = f->offset;
            rf.memory_kind = MWS_MEMORY_HOST;
            if ((st = mws_binding_add_fragment(l->bindings[r], &rf)) != MWS_OK) return fail("add_fragment", st);
        }
    }
    return 0;
}

/* Checks every byte of every fragment; returns the number of bytes checked, 0 on a
 * difference. */
static uint64_t layout_verify(const layout *l) {
    uint64_t r, checked = 0;
    size_t t;
    for (r = 0; r < l->tp; r++)
        for (t = 0; t < N_TENSORS; t++) {
            const fragment *f = &l->frags[r][t];
            uint64_t rows = TENSORS[t].ndim == 2 ? f->shape[0] : 1, cols = f->shape[TENSORS[t].ndim - 1];
            uint64_t gcols = TENSORS[t].shape[TENSORS[t].ndim - 1], i, j, b;
            const unsigned char *p = l->buffer[r] + f->offset;
            for (i = 0; i < rows; i++)
                for (j = 0; j < cols; j++)
                    for (b = 0; b < ITEMSIZE; b++) {
                        uint64_t row = TENSORS[t].ndim == 2 ? i + f->goffset[0] : 0;
                        uint64_t col = j + f->goffset[TENSORS[t].ndim - 1];
                        if (*p++ != expected_byte(t, row * gcols + col, b)) {
                            fprintf(stderr, "byte differs: %s %s\n", l->participant[r], TENSORS[t].id);
                            return 0;
                        }
                    }
            checked += f->nbytes;
        }
    return checked;
}

/* Frees what layout_init made (idempotent: the handles are reset to NULL). */
static void layout_free(layout *l) {
    uint64_t r;
    for (r = 0; r < l->tp; r++) {
        mws_binding_free(l->bindings[r]); /* NULL is fine */
        l->bindings[r] = NULL;
        free(l->buffer[r]);
        l->buffer[r] = NULL;
    }
    mws_placement_free(l->placement);
    l->placement = NULL;
}

/* ---- the snapshot adapter: the framework side of a writer ------------------------ */
/* The "framework tensor" handed to mws_writer_write_tensor is a `fragment *`. */
static int32_t export_source(void *ctx, const mws_snapshot_descriptor *descriptor, const mws_placement **placement,
                             const mws_binding *const **bindings, size_t *count) {
    layout *l = (layout *)ctx;
    (void)descriptor;
    *placement = l->placement;
    *bindings = (const mws_binding *const *)l->bindings;
    *count = (size_t)l->tp;
    return 0;
}

static int32_t resolve_fragment_ids(void *ctx, const char *tensor_id, void *tensor, const char *const **ids,
                                    size_t *count) {
    static const char *one[1]; /* valid until write_tensor returns: enough */
    const fragment *f = (const fragment *)tensor;
    (void)ctx;
    if (strcmp(TENSORS[f->tensor].id, tensor_id) != 0) return -1;
    one[0] = f->pfid;
    *ids = one;
    *count = 1;
    return 0;
}

static const fragment *find_fragment(const layout *l, const char *pfid) {
    uint64_t r;
    size_t t;
    for (r = 0; r < l->tp; r++)
        for (t = 0; t < N_TENSORS; t++)
            if (strcmp(l->frags[r][t].pfid, pfid) == 0) return &l->frags[r][t];
    return NULL;
}

/* Snapshot: begin a writer, write every tensor fragment its plan expects (a trainer
 * calls this as its tensors become final), commit. */
static int snapshot(const mws_store *store, layout *src, mws_stored_manifest **manifest) {
    mws_snapshot_descriptor desc = {RESOURCE, REVISION, 1, "default"};
    mws_snapshot_adapter_vtable vt;
    mws_writer *writer = NULL;
    mws_upload_plan *plan = NULL;
    mws_status st;
    size_t i, n;
    int rc = 1;
    memset(&vt, 0, sizeof vt);
    vt.size = sizeof vt;
    vt.version = MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION;
    vt.export_source = export_source;
    vt.resolve_fragment_ids = resolve_fragment_ids;
    if ((st = mws_writer_new(store, &desc, &vt, src, NULL, &writer)) != MWS_OK) return fail("mws_writer_new", st);
    if ((st = mws_writer_upload_plan(writer, &plan)) != MWS_OK) {
        fail("mws_writer_upload_plan", st);
        goto done;
    }
    /* The plan stores one replica: write exactly the fragments it copies. */
    n = mws_upload_plan_operation_count(plan);
    for (i = 0; i < n; i++) {
        mws_upload_operation op;
        const fragment *f;
        if ((st = mws_upload_plan_operation(plan, i, &op)) != MWS_OK) {
            fail("mws_upload_plan_operation", st);
            goto done;
        }
        f = find_fragment(src, op.source_placement_fragment_id);
        if (f == NULL) goto done;
        if ((st = mws_writer_write_tensor(writer, TENSORS[f->tensor].id, (void *)f, NULL)) != MWS_OK) {
            fail("mws_writer_write_tensor", st);
            goto done;
        }
    }
    if ((st = mws_writer_commit(writer, manifest)) != MWS_OK) {
        fail("mws_writer_commit", st);
        goto done;
    }
    rc = 0;
done:
    mws_upload_plan_free(plan);
    mws_writer_free(writer); /* aborts the snapshot if it was not committed */
    return rc;
}

/* Restore: plan the regions from the stored manifest into the target buffers, then
 * each participant loads its part (in a real job: each rank, concurrently). */
static int restore(const mws_store *store, const mws_stored_manifest *manifest, layout *dst) {
    mws_load_plan *plan = NULL;
    mws_load_stats total = {0};
    mws_status st;
    uint64_t r;
    int rc = 1;
    st = mws_load_plan_new(manifest, dst->placement, (const mws_binding *const *)dst->bindings, (size_t)dst->tp, NULL,
                           &plan);
    if (st != MWS_OK) return fail("mws_load_plan_new", st);
    for (r = 0; r < dst->tp; r++) {
        mws_load_stats s;
        if ((st = mws_store_load(store, plan, dst->bindings[r], NULL, &s)) != MWS_OK) {
            fail("mws_store_load", st);
            goto done;
        }
        total.regions += s.regions, total.ranges += s.ranges, total.bytes += s.bytes;
    }
    printf("restored      %zu regions, %llu ranged reads, %llu bytes into TP=%llu\n", mws_load_plan_region_count(plan),
           (unsigned long long)total.ranges, (unsigned long long)total.bytes, (unsigned long long)dst->tp);
    rc = total.bytes == mws_load_plan_total_bytes(plan) ? 0 : 1;
done:
    mws_load_plan_free(plan);
    return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The marker file a directory store writes at its root (src/store/directory.rs). */
static const char STORE_MARKER[] = "MOONCAKE_WEIGHT_STORE";
static const char STORE_MARKER_TEXT[] = "mooncake-weight-store directory store, layout 1\n";

static int marker_ok(const char *path) {
    char buf[128];
    size_t n;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 0;
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return n == strlen(STORE_MARKER_TEXT) && memcmp(buf, STORE_MARKER_TEXT, n) == 0;
}

/* 1 when `dir` is recognisably a directory store of this library (the marker with its
 * exact content, objects/ and tmp/ directories, nothing else), 0 when not, -1 when it
 * cannot be read. Sets *empty when it holds nothing. */
static int inspect_dir(const char *dir, int *empty) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int seen = 0, other = 0, n = 0;
    if (d == NULL) return -1;
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        n++;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0) {
            other = 1;
        } else if ((strcmp(e->d_name, "objects") == 0 || strcmp(e->d_name, "tmp") == 0) && S_ISDIR(st.st_mode)) {
            seen++;
        } else if (strcmp(e->d_name, STORE_MARKER) == 0 && S_ISREG(st.st_mode) && marker_ok(path)) {
            seen++;
        } else {
            other = 1;
        }
    }
    closedir(d);
    *empty = n == 0;
    return !other && seen == 3;
}

/* Removes the entries a directory store made at `dir`: objects/, tmp/ (links inside
 * removed, never followed) and the marker. */
static void remove_store_entries(const char *dir) {
    static const char *const sub[] = {"objects", "tmp"};
    char path[4096];
    size_t i;
    for (i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, sub[i]);
        if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) perror(path);
    }
    snprintf(path, sizeof path, "%s/%s", dir, STORE_MARKER);
    if (remove(path) != 0) perror(path);
}

/* Decides whether `dir` may be used (see the top of the file); sets *created when the
 * run will create it. Returns 0, or -1 (refused, nothing touched). */
static int prepare_store_dir(const char *dir, int reuse, int *created) {
    struct stat st;
    int empty = 0, store;
    *created = 0;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT) {
            *created = 1;
            return 0;
        }
        perror(dir);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "refusing to use %s: not a directory\n", dir);
        return -1;
    }
    store = inspect_dir(dir, &empty);
    if (store < 0) {
        perror(dir);
        return -1;
    }
    if (empty) return 0;
    if (!store) {
        fprintf(stderr,
                "refusing to use %s: it is not empty and not a directory store made by this library "
                "(nothing was changed; pass an empty or missing directory)\n",
                dir);
        return -1;
    }
    if (!reuse) {
        fprintf(stderr, "refusing to use %s: it holds a directory store (of an earlier run?); pass --reuse to replace it\n",
                dir);
        return -1;
    }
    remove_store_entries(dir);
    return 0;
}

int main(int argc, char **argv) {
    char tmpl[] = "/tmp/mws-snapshot-restore-c-XXXXXX";
    int argi = 1, reuse = 0, created = 0, empty = 0;
    const char *dir;
    mws_store *store = NULL;
    mws_stored_manifest *written = NULL, *manifest = NULL;
    layout *src = (layout *)calloc(1, sizeof *src), *dst = (layout *)calloc(1, sizeof *dst);
    uint64_t checked;
    mws_status st;
    int rc = 1, store_opened = 0;
    if (argc > argi && strcmp(argv[argi], "--reuse") == 0) reuse = 1, argi++;
    if (argc > argi) {
        dir = argv[argi];
        if (prepare_store_dir(dir, reuse, &created) != 0) {
            free(src), free(dst);
            return 2;
        }
    } else {
        dir = mkdtemp(tmpl); /* created by this run */
        created = 1;
    }
    if (dir == NULL || src == NULL || dst == NULL) {
        free(src), free(dst);
        return 1;
    }

    if ((st = mws_store_open_dir(dir, NULL, &store)) != MWS_OK) {
        fail("mws_store_open_dir", st);
        goto done;
    }
    store_opened = 1;
    /* Trainer: TP=2, buffers hold the weights. */
    if (layout_init(src, 2, "trainer-tp2", 1, "trainer") != 0) goto done;
    if (snapshot(store, src, &written) != 0) goto done;
    printf("snapshot      %zu tensors, %zu stored fragments, %llu bytes, manifest %s\n",
           mws_stored_manifest_tensor_count(written), mws_stored_manifest_fragment_count(written),
           (unsigned long long)mws_stored_manifest_total_bytes(written), mws_stored_manifest_digest(written, NULL));
    layout_free(src); /* the trainer may go away: the snapshot is in the store */

    /* Server: TP=4, reads the published manifest back by its key. */
    if ((st = mws_stored_manifest_from_store(store, mws_stored_manifest_key(written, NULL), &manifest)) != MWS_OK) {
        fail("mws_stored_manifest_from_store", st);
        goto done;
    }
    if (layout_init(dst, 4, "serving-tp4", 0, "serving") != 0) goto done;
    if (restore(store, manifest, dst) != 0) goto done;
    checked = layout_verify(dst);
    if (checked == 0) goto done;
    printf("verified      %llu bytes: OK\n", (unsigned long long)checked);
    rc = 0;
done:
    layout_free(src);
    layout_free(dst);
    mws_stored_manifest_free(manifest);
    mws_stored_manifest_free(written);
    mws_store_free(store);
    free(src);
    free(dst);
    if (store_opened && inspect_dir(dir, &empty) == 1) {
        remove_store_entries(dir); /* only what the run made */
        if (created) remove(dir);
    }
    return rc;
}
