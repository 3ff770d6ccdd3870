/* Plain-C tests of the device engine handle (mws_device_engine_*): the fenced test
 * device (memory the host cannot touch: any host access crashes the test), a C vtable
 * engine, the CUDA engine where there is no GPU (MWS_UNSUPPORTED) or, where there is
 * one, copies and a store round trip in CUDA memory (support/cuda_driver.h), and
 * where device engines attach (store options, the embedded transfer engine).
 * Compiled as C11 and again as C++17 (device_engine_test_as_cpp.cpp). No framework:
 * CHECK counts failures.
 *
 * Three checks need the core's device staging (snapshots and restores of device memory
 * through a store's device engine): test_store_round_trip (fenced and CUDA) and
 * test_vtable_engine_staging_through_a_store. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"
#include "support/cuda_driver.h"
#include "support/sample.h"

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    mws_last_error_message());                                                     \
        }                                                                                          \
    } while (0)

#define CHECK_STATUS(call, expected) CHECK((call) == (expected))

static uint64_t addr(const void *p) { return (uint64_t)(uintptr_t)p; }

static int message_has(const char *needle) {
    const char *m = mws_last_error_message();
    return m != NULL && strstr(m, needle) != NULL;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; i++) {
        p[i] = (unsigned char)((i * 131u + seed * 7u + (i >> 8)) % 251u);
    }
}

/* (a) Bytes go host -> device -> device -> host through mws_device_engine_copy only;
 * strided rows are coalesced into one 2-D copy; the counters add up. */
static void test_fenced_round_trip(void) {
    mws_device_engine *dev = NULL;
    mws_device_stats st;
    mws_copy_range r[16];
    uint64_t a = 0, b = 0, copies = 99;
    unsigned char src[4096], back[4096], strided[16 * 128], rows[16 * 64];
    size_t i;
    CHECK_STATUS(mws_device_engine_new_fenced(2, 1 << 20, &dev), MWS_OK);
    if (dev == NULL) {
        return;
    }
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, sizeof src, &a), MWS_OK);
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, sizeof src, &b), MWS_OK);
    CHECK(a != 0 && b != 0 && a % 256 == 0 && b % 256 == 0 && (b >= a + sizeof src || a >= b + sizeof src));
    fill(src, sizeof src, 1);
    memset(back, 0, sizeof back);

    /* Four contiguous quarters: merged into one copy. */
    for (i = 0; i < 4; i++) {
        r[i].source = addr(src) + i * 1024;
        r[i].target = a + i * 1024;
        r[i].len = 1024;
    }
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_HOST_TO_DEVICE, r, 4, &copies), MWS_OK);
    CHECK(copies == 1);
    r[0].source = a;
    r[0].target = b;
    r[0].len = sizeof src;
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_DEVICE_TO_DEVICE, r, 1, NULL), MWS_OK);
    r[0].source = b;
    r[0].target = addr(back);
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_DEVICE_TO_HOST, r, 1, &copies), MWS_OK);
    CHECK(copies == 1);
    CHECK(memcmp(src, back, sizeof src) == 0);

    /* 16 rows of 64 bytes out of 128-byte host rows into dense device rows: one 2-D
     * copy; read back and compared row by row. */
    fill(strided, sizeof strided, 2);
    for (i = 0; i < 16; i++) {
        r[i].source = addr(strided) + i * 128;
        r[i].target = b + i * 64;
        r[i].len = 64;
    }
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_HOST_TO_DEVICE, r, 16, &copies), MWS_OK);
    CHECK(copies == 1);
    r[0].source = b;
    r[0].target = addr(rows);
    r[0].len = sizeof rows;
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_DEVICE_TO_HOST, r, 1, NULL), MWS_OK);
    for (i = 0; i < 16; i++) {
        CHECK(memcmp(rows + i * 64, strided + i * 128, 64) == 0);
    }
    /* The rest of b still holds the first round trip's bytes. */
    r[0].source = b + sizeof rows;
    r[0].target = addr(back);
    r[0].len = sizeof src - sizeof rows;
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_DEVICE_TO_HOST, r, 1, NULL), MWS_OK);
    CHECK(memcmp(back, src + sizeof rows, sizeof src - sizeof rows) == 0);

    /* Nothing to copy: no batch. */
    copies = 99;
    CHECK_STATUS(mws_device_engine_copy(dev, 2, MWS_COPY_HOST_TO_DEVICE, NULL, 0, &copies), MWS_OK);
    CHECK(copies == 0);

    memset(&st, 0xAB, sizeof st);
    CHECK_STATUS(mws_device_engine_stats(dev, &st), MWS_OK);
    CHECK(st.batches == 6 && st.copies == 6);
    CHECK(st.bytes == 3 * sizeof src + 2 * sizeof rows + (sizeof src - sizeof rows));
    CHECK(st.driver_calls >= st.copies);
    mws_device_engine_free(dev);
}

/* What C can get wrong, and what the fenced device refuses before a byte moves. */
static void test_fenced_errors(void) {
    mws_device_engine *dev = NULL;
    mws_device_engine *none = (mws_device_engine *)(uintptr_t)0x1; /* sentinel */
    mws_device_stats st;
    mws_copy_range r;
    uint64_t a = 0, out = 7;
    unsigned char host[64];
    memset(host, 0, sizeof host);
    CHECK_STATUS(mws_device_engine_new_fenced(0, 0, &none), MWS_INVALID_ARGUMENT);
    CHECK(message_has("mws_device_engine_new_fenced"));
    CHECK_STATUS(mws_device_engine_new_fenced(0, 4096, NULL), MWS_NULL_ARGUMENT);
    CHECK(none == (mws_device_engine *)(uintptr_t)0x1);
    CHECK_STATUS(mws_device_engine_new_fenced(0, 8192, &dev), MWS_OK);
    if (dev == NULL) {
        return;
    }
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, 4096, &a), MWS_OK);
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, 1 << 20, &out), MWS_LIMIT_EXCEEDED);
    CHECK(out == 7);
    CHECK_STATUS(mws_device_engine_fenced_alloc(NULL, 64, &out), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, 64, NULL), MWS_NULL_ARGUMENT);

    r.source = addr(host);
    r.target = a;
    r.len = sizeof host;
    CHECK_STATUS(mws_device_engine_copy(dev, 0, 0, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    CHECK(message_has("direction"));
    CHECK_STATUS(mws_device_engine_copy(dev, 0, 4, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_device_engine_copy(dev, 1, MWS_COPY_HOST_TO_DEVICE, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_device_engine_copy(NULL, 0, MWS_COPY_HOST_TO_DEVICE, &r, 1, NULL), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_device_engine_copy(dev, 0, MWS_COPY_HOST_TO_DEVICE, NULL, 1, NULL), MWS_NULL_ARGUMENT);
    /* A device side outside the device, a host side naming device memory. */
    r.target = a + 8192;
    CHECK_STATUS(mws_device_engine_copy(dev, 0, MWS_COPY_HOST_TO_DEVICE, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    r.source = a;
    r.target = a + 64;
    CHECK_STATUS(mws_device_engine_copy(dev, 0, MWS_COPY_HOST_TO_DEVICE, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_device_engine_copy(dev, 0, MWS_COPY_DEVICE_TO_HOST, &r, 1, NULL), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_device_engine_stats(dev, &st), MWS_OK);
    CHECK(st.batches == 0 && st.bytes == 0);
    CHECK_STATUS(mws_device_engine_stats(dev, NULL), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_device_engine_stats(NULL, &st), MWS_NULL_ARGUMENT);
    mws_device_engine_free(dev);
    mws_device_engine_free(NULL);
}

/* ---- a device engine in C callbacks ------------------------------------------------
 * Its "device" is host memory (so the test can look at it); it counts what it is asked
 * and checks the contract: every ticket waited once, staging buffers freed once, before
 * destroy. Counters are atomic (the library may call from several threads). */
typedef struct host_device {
    int64_t submits, waits, pending, ops, rows, staging_allocs, staging_frees, staging_live, destroyed;
    int64_t fail_submit; /* non-zero: submit returns it */
    uint64_t next_ticket;
    int64_t bad_tickets;
    int64_t bad_ops;
} host_device;

static void add(int64_t *p, int64_t v) { __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static int64_t get(int64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

static int32_t hd_submit(void *ctx, uint32_t ordinal, uint32_t direction, const mws_copy_op *ops, size_t n,
                         uint64_t *ticket) {
    host_device *d = (host_device *)ctx;
    size_t i;
    uint64_t row;
    (void)ordinal;
    add(&d->submits, 1);
    if (d->fail_submit != 0) {
        return (int32_t)d->fail_submit;
    }
    if (direction < MWS_COPY_HOST_TO_DEVICE || direction > MWS_COPY_DEVICE_TO_DEVICE) {
        add(&d->bad_ops, 1);
    }
    for (i = 0; i < n; i++) {
        const mws_copy_op *op = &ops[i];
        if (op->width == 0 || op->height == 0 ||
            (op->height > 1 && (op->source_pitch < op->width || op->target_pitch < op->width))) {
            add(&d->bad_ops, 1);
            continue;
        }
        for (row = 0; row < op->height; row++) {
            memmove((void *)(uintptr_t)(op->target + row * op->target_pitch),
                    (const void *)(uintptr_t)(op->source + row * op->source_pitch), (size_t)op->width);
        }
        add(&d->rows, (int64_t)op->height);
    }
    add(&d->ops, (int64_t)n);
    add(&d->pending, 1);
    *ticket = __atomic_add_fetch(&d->next_ticket, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static int32_t hd_wait(void *ctx, uint64_t ticket) {
    host_device *d = (host_device *)ctx;
    add(&d->waits, 1);
    if (ticket == 0 || ticket > __atomic_load_n(&d->next_ticket, __ATOMIC_SEQ_CST)) {
        add(&d->bad_tickets, 1);
        return -1;
    }
    add(&d->pending, -1);
    return 0;
}

static int32_t hd_staging_alloc(void *ctx, uint64_t len, void **out) {
    host_device *d = (host_device *)ctx;
    void *p = malloc((size_t)len);
    if (p == NULL) {
        return -12;
    }
    add(&d->staging_allocs, 1);
    add(&d->staging_live, 1);
    *out = p;
    return 0;
}

static void hd_staging_free(void *ctx, void *buffer, uint64_t len) {
    host_device *d = (host_device *)ctx;
    (void)len;
    add(&d->staging_frees, 1);
    add(&d->staging_live, -1);
    free(buffer);
}

static void hd_destroy(void *ctx) {
    host_device *d = (host_device *)ctx;
    add(&d->destroyed, 1);
}

static mws_device_engine_vtable hd_vtable(int staging) {
    mws_device_engine_vtable vt;
    memset(&vt, 0, sizeof vt);
    vt.size = sizeof vt;
    vt.version = MWS_DEVICE_ENGINE_VTABLE_VERSION;
    vt.submit = hd_submit;
    vt.wait = hd_wait;
    if (staging) {
        vt.staging_alloc = hd_staging_alloc;
        vt.staging_free = hd_staging_free;
    }
    vt.destroy = hd_destroy;
    return vt;
}

static void test_vtable_engine(void) {
    host_device d;
    mws_device_engine_vtable vt;
    mws_device_engine *e = NULL;
    mws_device_engine *none = NULL;
    mws_device_stats st;
    mws_copy_range r[8];
    unsigned char src[8 * 32], dst[8 * 16];
    uint64_t copies = 0, address = 0;
    size_t i;
    memset(&d, 0, sizeof d);

    /* Refused vtables: nothing is called, ctx stays the caller's. */
    vt = hd_vtable(1);
    vt.size = 8;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_INVALID_ARGUMENT);
    CHECK(message_has("size"));
    vt = hd_vtable(1);
    vt.version = MWS_DEVICE_ENGINE_VTABLE_VERSION + 1;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_UNSUPPORTED);
    vt = hd_vtable(1);
    vt.submit = NULL;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_INVALID_ARGUMENT);
    CHECK(message_has("submit"));
    vt = hd_vtable(1);
    vt.wait = NULL;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_INVALID_ARGUMENT);
    vt = hd_vtable(1);
    vt.staging_free = NULL;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_INVALID_ARGUMENT);
    CHECK(message_has("staging"));
    vt = hd_vtable(0);
    vt.staging_alloc = hd_staging_alloc;
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &none), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_device_engine_from_vtable(NULL, &d, &none), MWS_NULL_ARGUMENT);
    vt = hd_vtable(1);
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, NULL), MWS_NULL_ARGUMENT);
    CHECK(none == NULL);
    CHECK(get(&d.destroyed) == 0 && get(&d.submits) == 0);

    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &e), MWS_OK);
    if (e == NULL) {
        return;
    }
    /* 8 rows of 16 bytes out of 32-byte rows: the engine gets one 2-D copy. */
    fill(src, sizeof src, 3);
    memset(dst, 0, sizeof dst);
    for (i = 0; i < 8; i++) {
        r[i].source = addr(src) + i * 32;
        r[i].target = addr(dst) + i * 16;
        r[i].len = 16;
    }
    CHECK_STATUS(mws_device_engine_copy(e, 5, MWS_COPY_HOST_TO_DEVICE, r, 8, &copies), MWS_OK);
    CHECK(copies == 1 && get(&d.ops) == 1 && get(&d.rows) == 8);
    for (i = 0; i < 8; i++) {
        CHECK(memcmp(dst + i * 16, src + i * 32, 16) == 0);
    }
    CHECK_STATUS(mws_device_engine_stats(e, &st), MWS_OK);
    CHECK(st.batches == 1 && st.copies == 1 && st.bytes == sizeof dst && st.driver_calls == 2);

    /* A failing submit is MWS_IO with the code; nothing is pending. */
    d.fail_submit = -77;
    CHECK_STATUS(mws_device_engine_copy(e, 5, MWS_COPY_DEVICE_TO_HOST, r, 1, NULL), MWS_IO);
    CHECK(message_has("-77"));
    d.fail_submit = 0;
    CHECK_STATUS(mws_device_engine_stats(e, &st), MWS_OK);
    CHECK(st.batches == 1);

    /* Not a fenced device. */
    CHECK_STATUS(mws_device_engine_fenced_alloc(e, 64, &address), MWS_INVALID_ARGUMENT);
    CHECK(message_has("fenced"));

    CHECK(get(&d.pending) == 0 && get(&d.waits) == 1 && get(&d.bad_tickets) == 0 && get(&d.bad_ops) == 0);
    CHECK(get(&d.destroyed) == 0);
    mws_device_engine_free(e);
    CHECK(get(&d.destroyed) == 1);
}

/* A store and a transfer engine keep their own reference: the handle is freed first,
 * destroy runs only when the last of them goes. */
static void test_users_keep_the_engine(void) {
    host_device d;
    mws_device_engine_vtable vt = hd_vtable(1);
    mws_device_engine *e = NULL;
    mws_store *store = NULL;
    mws_transfer_engine *te = NULL;
    mws_transfer_engine *none = NULL;
    mws_store_options o;
    memset(&d, 0, sizeof d);
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &e), MWS_OK);
    if (e == NULL) {
        return;
    }
    memset(&o, 0, sizeof o);
    o.device_engine = e;
    CHECK_STATUS(mws_store_open_memory(&o, &store), MWS_OK);
    CHECK_STATUS(mws_transfer_engine_new_local_device(e, &te), MWS_OK);
    CHECK_STATUS(mws_transfer_engine_new_local_device(NULL, &none), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_transfer_engine_new_local_device(e, NULL), MWS_NULL_ARGUMENT);
    CHECK(none == NULL);
    mws_device_engine_free(e);
    CHECK(get(&d.destroyed) == 0);
    mws_store_free(store);
    CHECK(get(&d.destroyed) == 0);
    mws_transfer_engine_free(te);
    CHECK(get(&d.destroyed) == 1);
}

/* The embedded transfer engine registers device memory only with a device engine. */
static void test_transfer_engine_registration(void) {
    mws_device_engine *dev = NULL;
    mws_transfer_engine *plain = NULL;
    mws_transfer_engine *with = NULL;
    uint64_t a = 0;
    mws_engine_resources res;
    CHECK_STATUS(mws_device_engine_new_fenced(0, 1 << 16, &dev), MWS_OK);
    CHECK_STATUS(mws_transfer_engine_new_local(&plain), MWS_OK);
    if (dev == NULL || plain == NULL) {
        goto done;
    }
    CHECK_STATUS(mws_device_engine_fenced_alloc(dev, 4096, &a), MWS_OK);
    CHECK_STATUS(mws_transfer_engine_register_memory(plain, (const void *)(uintptr_t)a, 4096, MWS_MEMORY_DEVICE, 0),
                 MWS_STORE);
    CHECK_STATUS(mws_transfer_engine_new_local_device(dev, &with), MWS_OK);
    CHECK_STATUS(mws_transfer_engine_register_memory(with, (const void *)(uintptr_t)a, 4096, MWS_MEMORY_DEVICE, 0),
                 MWS_OK);
    CHECK_STATUS(mws_transfer_engine_resources(with, &res), MWS_OK);
    CHECK(res.registrations_known == 1 && res.registered_regions == 1 && res.registered_bytes == 4096);
    CHECK_STATUS(mws_transfer_engine_unregister_memory(with, (const void *)(uintptr_t)a), MWS_OK);
done:
    mws_transfer_engine_free(with);
    mws_transfer_engine_free(plain);
    mws_device_engine_free(dev);
}

/* ---- the sample model (TP=2, [8, 4] bf16) on device memory ------------------------- */
typedef struct device_sample {
    mws_placement *placement;
    mws_binding *bindings[2];
    uint64_t address[2];
} device_sample;

/* Binds the sample's two participants to 32 bytes of device memory each, at
 * `address[0]` and `address[1]` (0: a failed allocation). */
static int bind_sample(device_sample *s, const uint64_t address[2]) {
    const char *participants[2] = {MWS_SAMPLE_P0, MWS_SAMPLE_P1};
    size_t i;
    memset(s, 0, sizeof *s);
    if (mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, strlen(MWS_SAMPLE_PLACEMENT_JSON), &s->placement) !=
        MWS_OK) {
        return 0;
    }
    for (i = 0; i < 2; i++) {
        s->address[i] = address[i];
        if (address[i] == 0 || sample_bind_memory(s->placement, participants[i], 1, address[i], 32,
                                                  MWS_MEMORY_DEVICE, 0, &s->bindings[i]) != MWS_OK) {
            return 0;
        }
    }
    return 1;
}

static int bind_sample_fenced(device_sample *s, const mws_device_engine *dev) {
    uint64_t address[2] = {0, 0};
    memset(s, 0, sizeof *s);
    if (mws_device_engine_fenced_alloc(dev, 32, &address[0]) != MWS_OK ||
        mws_device_engine_fenced_alloc(dev, 32, &address[1]) != MWS_OK) {
        return 0;
    }
    return bind_sample(s, address);
}

static void free_sample(device_sample *s) {
    mws_binding_free(s->bindings[0]);
    mws_binding_free(s->bindings[1]);
    mws_placement_free(s->placement);
}

/* Writes `bytes[i]` (32 each) to participant i's device memory (one call per
 * allocation: cuda_round_trip checks batches that span allocations). */
static int put_sample(const mws_device_engine *dev, const device_sample *s, unsigned char bytes[2][32]) {
    mws_copy_range r;
    size_t i;
    int ok = 1;
    for (i = 0; i < 2; i++) {
        r.source = addr(bytes[i]);
        r.target = s->address[i];
        r.len = 32;
        ok = ok && mws_device_engine_copy(dev, 0, MWS_COPY_HOST_TO_DEVICE, &r, 1, NULL) == MWS_OK;
    }
    return ok;
}

static int get_sample(const mws_device_engine *dev, const device_sample *s, unsigned char bytes[2][32]) {
    mws_copy_range r;
    size_t i;
    int ok = 1;
    for (i = 0; i < 2; i++) {
        r.source = s->address[i];
        r.target = addr(bytes[i]);
        r.len = 32;
        ok = ok && mws_device_engine_copy(dev, 0, MWS_COPY_DEVICE_TO_HOST, &r, 1, NULL) == MWS_OK;
    }
    return ok;
}

/* (e) Device memory without a device engine: the store refuses it before any I/O
 * (MWS_UNSUPPORTED), and so does a restore. */
static void test_device_memory_without_engine(void) {
    mws_device_engine *dev = NULL;
    device_sample s;
    mws_store *store = NULL;
    mws_upload_plan *plan = NULL;
    mws_receipts *receipts = NULL;
    mws_upload_operation op;
    const mws_binding *set[2];
    int present = 1;
    size_t i;
    memset(&s, 0, sizeof s);
    CHECK_STATUS(mws_device_engine_new_fenced(0, 1 << 16, &dev), MWS_OK);
    if (dev == NULL || !bind_sample_fenced(&s, dev)) {
        CHECK(0);
        goto done;
    }
    set[0] = s.bindings[0];
    set[1] = s.bindings[1];
    CHECK_STATUS(mws_upload_plan_new(s.placement, set, 2, NULL, &plan), MWS_OK);
    CHECK_STATUS(mws_store_open_memory(NULL, &store), MWS_OK);
    if (plan == NULL || store == NULL) {
        goto done;
    }
    CHECK_STATUS(mws_store_upload(store, plan, s.placement, s.bindings[0], NULL, &receipts), MWS_UNSUPPORTED);
    CHECK(message_has("mws_store_upload"));
    CHECK(receipts == NULL);
    for (i = 0; i < mws_upload_plan_operation_count(plan); i++) {
        CHECK_STATUS(mws_upload_plan_operation(plan, i, &op), MWS_OK);
        CHECK_STATUS(mws_store_exists(store, op.object_key, &present), MWS_OK);
        CHECK(present == 0);
    }
done:
    mws_receipts_free(receipts);
    mws_upload_plan_free(plan);
    mws_store_free(store);
    free_sample(&s);
    mws_device_engine_free(dev);
}

/* Uploads both participants of `s` and commits: the stored manifest (NULL on failure). */
static mws_stored_manifest *snapshot_sample(const mws_store *store, const device_sample *s) {
    mws_upload_plan *plan = NULL;
    mws_receipts *r[2] = {NULL, NULL};
    mws_receipts *all = NULL;
    mws_stored_manifest *m = NULL;
    const mws_binding *set[2];
    const mws_receipts *parts[2];
    set[0] = s->bindings[0];
    set[1] = s->bindings[1];
    CHECK_STATUS(mws_upload_plan_new(s->placement, set, 2, NULL, &plan), MWS_OK);
    if (plan == NULL) {
        return NULL;
    }
    CHECK_STATUS(mws_store_upload(store, plan, s->placement, s->bindings[0], NULL, &r[0]), MWS_OK);
    CHECK_STATUS(mws_store_upload(store, plan, s->placement, s->bindings[1], NULL, &r[1]), MWS_OK);
    if (r[0] != NULL && r[1] != NULL) {
        parts[0] = r[0];
        parts[1] = r[1];
        CHECK_STATUS(mws_receipts_concat(parts, 2, &all), MWS_OK);
        CHECK_STATUS(mws_store_commit(store, plan, all, NULL, &m), MWS_OK);
    }
    mws_receipts_free(all);
    mws_receipts_free(r[0]);
    mws_receipts_free(r[1]);
    mws_upload_plan_free(plan);
    return m;
}

static int restore_sample(const mws_store *store, const mws_stored_manifest *m, const device_sample *s) {
    mws_load_plan *plan = NULL;
    const mws_binding *set[2];
    int ok = 1;
    size_t i;
    set[0] = s->bindings[0];
    set[1] = s->bindings[1];
    CHECK_STATUS(mws_load_plan_new(m, s->placement, set, 2, NULL, &plan), MWS_OK);
    if (plan == NULL) {
        return 0;
    }
    for (i = 0; i < 2; i++) {
        mws_status st = mws_store_load(store, plan, s->bindings[i], NULL, NULL);
        CHECK_STATUS(st, MWS_OK);
        ok = ok && st == MWS_OK;
    }
    mws_load_plan_free(plan);
    return ok;
}

/* A snapshot of device sources and a verified restore into other device targets
 * (`src` and `dst`, bound on `dev`'s device) through a memory store with the device
 * engine `dev` (needs the core's device staging). */
static void test_store_round_trip(const mws_device_engine *dev, device_sample *src, device_sample *dst) {
    mws_store *store = NULL;
    mws_store_options o;
    mws_stored_manifest *m = NULL;
    mws_device_stats before, after;
    unsigned char in[2][32], out[2][32];
    fill(in[0], 32, 4);
    fill(in[1], 32, 5);
    memset(out, 0xA5, sizeof out);
    CHECK(put_sample(dev, src, in));
    CHECK(put_sample(dev, dst, out));
    memset(&o, 0, sizeof o);
    o.device_engine = dev;
    CHECK_STATUS(mws_store_open_memory(&o, &store), MWS_OK);
    if (store == NULL) {
        return;
    }
    CHECK_STATUS(mws_device_engine_stats(dev, &before), MWS_OK);
    m = snapshot_sample(store, src);
    if (m != NULL) {
        CHECK(restore_sample(store, m, dst));
        CHECK_STATUS(mws_device_engine_stats(dev, &after), MWS_OK);
        CHECK(after.batches > before.batches && after.bytes >= before.bytes + 2 * 64);
        memset(out, 0, sizeof out);
        CHECK(get_sample(dev, dst, out));
        CHECK(memcmp(in, out, sizeof in) == 0);
    }
    mws_stored_manifest_free(m);
    mws_store_free(store);
}

static void test_store_round_trip_on_the_fenced_device(void) {
    mws_device_engine *dev = NULL;
    device_sample src, dst;
    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    CHECK_STATUS(mws_device_engine_new_fenced(0, 1 << 16, &dev), MWS_OK);
    if (dev != NULL && bind_sample_fenced(&src, dev) && bind_sample_fenced(&dst, dev)) {
        test_store_round_trip(dev, &src, &dst);
    } else {
        CHECK(0);
    }
    free_sample(&src);
    free_sample(&dst);
    mws_device_engine_free(dev);
}

/* A vtable engine's staging buffers through a store: every staging_alloc is freed
 * once, before destroy, which comes when the store (not the handle) goes. The vtable's
 * "device" is host memory, so sample_bind_memory points at host buffers labelled as
 * device memory (needs the core's device staging). */
static void test_vtable_engine_staging_through_a_store(void) {
    host_device d;
    mws_device_engine_vtable vt = hd_vtable(1);
    mws_device_engine *e = NULL;
    mws_store *store = NULL;
    mws_store_options o;
    mws_placement *p = NULL;
    mws_binding *src[2] = {NULL, NULL}, *dst[2] = {NULL, NULL};
    mws_upload_plan *plan = NULL;
    mws_receipts *r[2] = {NULL, NULL};
    mws_receipts *all = NULL;
    mws_stored_manifest *m = NULL;
    mws_load_plan *lp = NULL;
    const mws_binding *set[2];
    const mws_receipts *parts[2];
    unsigned char in[2][32], out[2][32];
    size_t i;
    memset(&d, 0, sizeof d);
    memset(out, 0, sizeof out);
    fill(in[0], 32, 6);
    fill(in[1], 32, 7);
    CHECK_STATUS(mws_device_engine_from_vtable(&vt, &d, &e), MWS_OK);
    CHECK_STATUS(mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, strlen(MWS_SAMPLE_PLACEMENT_JSON), &p), MWS_OK);
    if (e == NULL || p == NULL) {
        goto done;
    }
    memset(&o, 0, sizeof o);
    o.device_engine = e;
    CHECK_STATUS(mws_store_open_memory(&o, &store), MWS_OK);
    mws_device_engine_free(e);
    e = NULL;
    for (i = 0; i < 2; i++) {
        const char *pid = i == 0 ? MWS_SAMPLE_P0 : MWS_SAMPLE_P1;
        CHECK_STATUS(sample_bind_memory(p, pid, 1, addr(in[i]), 32, MWS_MEMORY_DEVICE, 0, &src[i]), MWS_OK);
        CHECK_STATUS(sample_bind_memory(p, pid, 1, addr(out[i]), 32, MWS_MEMORY_DEVICE, 0, &dst[i]), MWS_OK);
    }
    if (store == NULL || src[0] == NULL || src[1] == NULL || dst[0] == NULL || dst[1] == NULL) {
        goto done;
    }
    set[0] = src[0];
    set[1] = src[1];
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, NULL, &plan), MWS_OK);
    if (plan == NULL) {
        goto done;
    }
    CHECK_STATUS(mws_store_upload(store, plan, p, src[0], NULL, &r[0]), MWS_OK);
    CHECK_STATUS(mws_store_upload(store, plan, p, src[1], NULL, &r[1]), MWS_OK);
    if (r[0] == NULL || r[1] == NULL) {
        goto done;
    }
    parts[0] = r[0];
    parts[1] = r[1];
    CHECK_STATUS(mws_receipts_concat(parts, 2, &all), MWS_OK);
    CHECK_STATUS(mws_store_commit(store, plan, all, NULL, &m), MWS_OK);
    if (m == NULL) {
        goto done;
    }
    set[0] = dst[0];
    set[1] = dst[1];
    CHECK_STATUS(mws_load_plan_new(m, p, set, 2, NULL, &lp), MWS_OK);
    if (lp == NULL) {
        goto done;
    }
    CHECK_STATUS(mws_store_load(store, lp, dst[0], NULL, NULL), MWS_OK);
    CHECK_STATUS(mws_store_load(store, lp, dst[1], NULL, NULL), MWS_OK);
    CHECK(memcmp(in, out, sizeof in) == 0);
    CHECK(get(&d.submits) > 0 && get(&d.pending) == 0 && get(&d.bad_tickets) == 0 && get(&d.bad_ops) == 0);
    CHECK(get(&d.staging_allocs) > 0);
done:
    mws_load_plan_free(lp);
    mws_stored_manifest_free(m);
    mws_receipts_free(all);
    mws_receipts_free(r[0]);
    mws_receipts_free(r[1]);
    mws_upload_plan_free(plan);
    for (i = 0; i < 2; i++) {
        mws_binding_free(src[i]);
        mws_binding_free(dst[i]);
    }
    mws_placement_free(p);
    CHECK(get(&d.destroyed) == 0 || store == NULL);
    mws_store_free(store);
    mws_device_engine_free(e);
    CHECK(get(&d.destroyed) == 1);
    CHECK(get(&d.staging_live) == 0 && get(&d.staging_frees) == get(&d.staging_allocs));
}

/* (a) on a GPU: host -> device -> device -> host through a CUDA engine, strided rows
 * in one 2-D copy. */
static void cuda_round_trip(const mws_device_engine *cuda) {
    enum { N = 1 << 16 };
    unsigned char *src = (unsigned char *)malloc(N), *back = (unsigned char *)calloc(1, N);
    uint64_t a = cuda_alloc(N), b = cuda_alloc(N), copies = 0;
    mws_copy_range r[64];
    mws_device_stats st;
    size_t i;
    CHECK(src != NULL && back != NULL && a != 0 && b != 0);
    if (src == NULL || back == NULL || a == 0 || b == 0) {
        goto done;
    }
    fill(src, N, 8);
    r[0].source = addr(src);
    r[0].target = a;
    r[0].len = N;
    CHECK_STATUS(mws_device_engine_copy(cuda, 0, MWS_COPY_HOST_TO_DEVICE, r, 1, &copies), MWS_OK);
    r[0].source = a;
    r[0].target = b;
    CHECK_STATUS(mws_device_engine_copy(cuda, 0, MWS_COPY_DEVICE_TO_DEVICE, r, 1, NULL), MWS_OK);
    r[0].source = b;
    r[0].target = addr(back);
    CHECK_STATUS(mws_device_engine_copy(cuda, 0, MWS_COPY_DEVICE_TO_HOST, r, 1, NULL), MWS_OK);
    CHECK(memcmp(src, back, N) == 0);
    /* 64 rows of 100 bytes, 1000 bytes apart on the device, into dense host rows. */
    for (i = 0; i < 64; i++) {
        r[i].source = b + 24 + i * 1000;
        r[i].target = addr(back) + i * 100;
        r[i].len = 100;
    }
    memset(back, 0, N);
    {
        mws_status rs = mws_device_engine_copy(cuda, 0, MWS_COPY_DEVICE_TO_HOST, r, 64, &copies);
        printf("device_engine_test: CUDA 2-D copy of 64 strided rows: %s (%s)\n", mws_status_name(rs),
               rs == MWS_OK ? "" : mws_last_error_message());
        CHECK_STATUS(rs, MWS_OK);
    }
    CHECK(copies == 1);
    for (i = 0; i < 64; i++) {
        CHECK(memcmp(back + i * 100, src + 24 + i * 1000, 100) == 0);
    }
    CHECK_STATUS(mws_device_engine_stats(cuda, &st), MWS_OK);
    CHECK(st.batches == 4 && st.copies == 4 && st.bytes == 3 * (uint64_t)N + 6400);
    printf("device_engine_test: CUDA round trip of %d bytes on device 0: %s\n", (int)N,
           memcmp(back, src + 24, 100) == 0 ? "ok" : "MISMATCH");
    /* One batch into two separate allocations of equal length (a tensor per
     * allocation, as PyTorch makes them): every byte lands, whatever the coalescing.
     * (The two ranges fold into one 2-D copy spanning both allocations, which
     * cuMemcpy2DAsync refuses; the batch is then copied range by range.) */
    {
        uint64_t c = cuda_alloc(4096), e = cuda_alloc(4096);
        CHECK(c != 0 && e != 0);
        if (c != 0 && e != 0) {
            mws_status cs;
            r[0].source = addr(src);
            r[0].target = c;
            r[0].len = 4096;
            r[1].source = addr(src) + 8192;
            r[1].target = e;
            r[1].len = 4096;
            copies = 0;
            cs = mws_device_engine_copy(cuda, 0, MWS_COPY_HOST_TO_DEVICE, r, 2, &copies);
            printf("device_engine_test: two allocations in one batch: %s, %llu copies (%s)\n", mws_status_name(cs),
                   (unsigned long long)copies, cs == MWS_OK ? "" : mws_last_error_message());
            CHECK_STATUS(cs, MWS_OK);
            memset(back, 0, 8192);
            r[0].source = c;
            r[0].target = addr(back);
            r[1].source = e;
            r[1].target = addr(back) + 4096;
            CHECK_STATUS(mws_device_engine_copy(cuda, 0, MWS_COPY_DEVICE_TO_HOST, r, 1, NULL), MWS_OK);
            CHECK_STATUS(mws_device_engine_copy(cuda, 0, MWS_COPY_DEVICE_TO_HOST, r + 1, 1, NULL), MWS_OK);
            CHECK(cs != MWS_OK || (memcmp(back, src, 4096) == 0 && memcmp(back + 4096, src + 8192, 4096) == 0));
        }
        cuda_free(c);
        cuda_free(e);
    }
done:
    cuda_free(a);
    cuda_free(b);
    free(src);
    free(back);
}

/* Without a GPU the CUDA engine is MWS_UNSUPPORTED with a message naming the driver;
 * with one: creation (own stream, the legacy default stream), copies, a store round
 * trip in CUDA memory. */
static void test_cuda(void) {
    mws_device_engine *cuda = NULL;
    uint64_t default_stream = 0;
    mws_status st = mws_device_engine_new_cuda(0, NULL, &cuda);
    if (st == MWS_UNSUPPORTED) {
        CHECK(cuda == NULL);
        CHECK(message_has("mws_device_engine_new_cuda"));
        CHECK(message_has("CUDA"));
        CHECK_STATUS(mws_device_engine_new_cuda(0, &default_stream, &cuda), MWS_UNSUPPORTED);
        CHECK(!cuda_driver_open());
        printf("device_engine_test: no CUDA driver here (%s)\n", mws_last_error_message());
    } else {
        mws_device_stats s;
        device_sample src, dst;
        uint64_t a[2], b[2];
        CHECK_STATUS(st, MWS_OK);
        CHECK(cuda_driver_open());
        CHECK_STATUS(mws_device_engine_stats(cuda, &s), MWS_OK);
        CHECK(s.batches == 0);
        /* Not a fenced device. */
        CHECK_STATUS(mws_device_engine_fenced_alloc(cuda, 64, &default_stream), MWS_INVALID_ARGUMENT);
        cuda_round_trip(cuda);
        memset(&src, 0, sizeof src);
        memset(&dst, 0, sizeof dst);
        a[0] = cuda_alloc(32);
        a[1] = cuda_alloc(32);
        b[0] = cuda_alloc(32);
        b[1] = cuda_alloc(32);
        if (bind_sample(&src, a) && bind_sample(&dst, b)) {
            test_store_round_trip(cuda, &src, &dst);
        } else {
            CHECK(0);
        }
        free_sample(&src);
        free_sample(&dst);
        mws_device_engine_free(cuda);
        cuda = NULL;
        default_stream = 0;
        CHECK_STATUS(mws_device_engine_new_cuda(0, &default_stream, &cuda), MWS_OK);
        if (cuda != NULL) {
            cuda_round_trip(cuda);
        }
        mws_device_engine_free(cuda);
        cuda_free(a[0]);
        cuda_free(a[1]);
        cuda_free(b[0]);
        cuda_free(b[1]);
    }
    CHECK_STATUS(mws_device_engine_new_cuda(0, NULL, NULL), MWS_NULL_ARGUMENT);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0); /* what ran before a crash is visible */
    test_fenced_round_trip();
    test_fenced_errors();
    test_cuda();
    test_vtable_engine();
    test_users_keep_the_engine();
    test_transfer_engine_registration();
    test_device_memory_without_engine();
    test_store_round_trip_on_the_fenced_device();
    test_vtable_engine_staging_through_a_store();
    printf("device_engine_test (%s): %d checks, %d failures\n",
#ifdef __cplusplus
           "compiled as C++",
#else
           "compiled as C",
#endif
           checks, failures);
    return failures == 0 ? 0 : 1;
}
