/* Plain-C tests of the C ABI. Compiled as C11, again as C++17 (c_api_test_as_cpp.cpp),
 * and linked once against the static library. No framework: CHECK counts failures. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"
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

/* The last error is present and names the failing function. */
static int has_message(const char *function) {
    const char *m = mws_last_error_message();
    return m != NULL && strlen(m) > strlen(function) && strncmp(m, function, strlen(function)) == 0;
}

static mws_placement *parse_sample(void) {
    mws_placement *p = NULL;
    CHECK_STATUS(mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, strlen(MWS_SAMPLE_PLACEMENT_JSON), &p), MWS_OK);
    return p;
}

static void test_version_and_status(void) {
    char expected[64];
    snprintf(expected, sizeof expected, "%d.%d.%d", MWS_VERSION_MAJOR, MWS_VERSION_MINOR, MWS_VERSION_PATCH);
    CHECK(strcmp(mws_version(), expected) == 0);
    CHECK(strcmp(mws_status_name(MWS_OK), "MWS_OK") == 0);
    CHECK(strcmp(mws_status_name(MWS_NULL_ARGUMENT), "MWS_NULL_ARGUMENT") == 0);
    CHECK(strcmp(mws_status_name(MWS_INVALID_BINDING), "MWS_INVALID_BINDING") == 0);
    CHECK(strcmp(mws_status_name(MWS_INTEGRITY), "MWS_INTEGRITY") == 0);
    CHECK(strcmp(mws_status_name(12345), "MWS_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(mws_status_name(-1), "MWS_UNKNOWN_STATUS") == 0);
}

static void test_panic_boundary(void) {
    mws_placement *p;
    CHECK_STATUS(mws_test_panic(), MWS_PANIC);
    CHECK(strstr(mws_last_error_message(), "mws_test_panic") != NULL);
    CHECK(strstr(mws_last_error_message(), "panic") != NULL);
    /* The library is still usable afterwards. */
    p = parse_sample();
    CHECK(p != NULL);
    mws_placement_free(p);
}

static void test_placement(void) {
    mws_placement *p = parse_sample();
    mws_placement_fragment_info info;
    size_t len = 0;
    const char *json;
    if (p == NULL) {
        return;
    }
    CHECK(strcmp(mws_placement_id(p, NULL), MWS_SAMPLE_PLACEMENT_ID) == 0);
    CHECK(strcmp(mws_placement_id(p, &len), MWS_SAMPLE_PLACEMENT_ID) == 0 && len == strlen(MWS_SAMPLE_PLACEMENT_ID));
    CHECK(strcmp(mws_placement_digest(p, NULL), MWS_SAMPLE_PLACEMENT_DIGEST) == 0);
    CHECK(strcmp(mws_placement_topology_id(p, NULL), MWS_SAMPLE_TOPOLOGY_ID) == 0);
    CHECK(strcmp(mws_placement_resource_id(p, NULL), "fixture-model") == 0);
    CHECK(strcmp(mws_placement_revision(p, NULL), "rev-1") == 0);
    CHECK(mws_placement_weight_generation(p) == 1);
    CHECK(mws_placement_participant_count(p) == 2);
    CHECK(mws_placement_tensor_count(p) == 1);
    CHECK(mws_placement_fragment_count(p) == 2);
    json = mws_placement_to_json(p, &len);
    CHECK(json != NULL && len == strlen(json) && len > 0 && json[0] == '{');

    /* Round trip: the canonical JSON parses to the same identity. */
    {
        mws_placement *q = NULL;
        CHECK_STATUS(mws_placement_from_json(json, len, &q), MWS_OK);
        CHECK(q != NULL && strcmp(mws_placement_id(q, NULL), MWS_SAMPLE_PLACEMENT_ID) == 0);
        mws_placement_free(q);
    }

    CHECK_STATUS(mws_placement_fragment(p, 1, &info), MWS_OK);
    CHECK(strcmp(info.participant_id, MWS_SAMPLE_P1) == 0);
    CHECK(strcmp(info.tensor_id, "model.layers.0.mlp.down_proj.weight") == 0);
    CHECK(info.ndim == 2 && info.global_offset[0] == 4 && info.global_offset[1] == 0);
    CHECK(info.local_shape[0] == 4 && info.local_shape[1] == 4 && info.nbytes == 32 && info.itemsize == 2);

    memset(&info, 0xAB, sizeof info);
    CHECK_STATUS(mws_placement_fragment(p, 2, &info), MWS_INVALID_ARGUMENT);
    CHECK(has_message("mws_placement_fragment"));
    CHECK(info.nbytes == 0xABABABABABABABABull); /* not written on failure */
    CHECK_STATUS(mws_placement_fragment(p, 0, NULL), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_placement_fragment(NULL, 0, &info), MWS_NULL_ARGUMENT);
    mws_placement_free(p);
}

static void test_placement_invalid(void) {
    mws_placement *p = (mws_placement *)(uintptr_t)0x1; /* sentinel: must stay untouched */
    const char *malformed = "{\"parts\": [";
    const char *dup = "{\"a\":1,\"a\":2}";
    const char bad_utf8[] = "{\"x\":\"\xff\xfe\"}";
    size_t n = strlen(MWS_SAMPLE_PLACEMENT_JSON);

    CHECK_STATUS(mws_placement_from_json(NULL, 10, &p), MWS_NULL_ARGUMENT);
    CHECK(has_message("mws_placement_from_json"));
    CHECK(strstr(mws_last_error_message(), "json") != NULL);
    CHECK_STATUS(mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, n, NULL), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_placement_from_json(malformed, strlen(malformed), &p), MWS_INVALID_ARGUMENT);
    CHECK(has_message("mws_placement_from_json"));
    CHECK_STATUS(mws_placement_from_json(dup, strlen(dup), &p), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_placement_from_json(bad_utf8, sizeof bad_utf8 - 1, &p), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, 0, &p), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_placement_from_json(MWS_SAMPLE_PLACEMENT_JSON, n - 1, &p), MWS_INVALID_ARGUMENT);
    CHECK_STATUS(mws_placement_from_json("", 0, &p), MWS_INVALID_ARGUMENT);
    CHECK(p == (mws_placement *)(uintptr_t)0x1);

    /* Accessors on NULL: NULL / 0 and a message, never a crash. */
    CHECK(mws_placement_id(NULL, NULL) == NULL);
    CHECK(has_message("mws_placement_id"));
    CHECK(mws_placement_to_json(NULL, NULL) == NULL);
    CHECK(mws_placement_fragment_count(NULL) == 0);
    CHECK(mws_placement_weight_generation(NULL) == 0);
    mws_placement_free(NULL);
}

static void test_binding(void) {
    mws_placement *p = parse_sample();
    unsigned char *buf = (unsigned char *)calloc(1, 64);
    mws_binding *b0 = NULL;
    mws_binding *wrong = NULL;
    mws_binding_options o;
    mws_runtime_fragment f;
    mws_placement_fragment_info info;
    uint64_t shape[2] = {4, 4}, strides[2] = {8, 2};
    if (p == NULL || buf == NULL) {
        free(buf);
        mws_placement_free(p);
        return;
    }
    CHECK_STATUS(sample_bind(p, MWS_SAMPLE_P0, 1, buf, 64, &b0), MWS_OK);
    CHECK(mws_binding_fragment_count(b0) == 1);
    CHECK_STATUS(mws_binding_validate(p, b0), MWS_OK);
    CHECK_STATUS(mws_binding_validate(NULL, b0), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_binding_validate(p, NULL), MWS_NULL_ARGUMENT);

    memset(&o, 0, sizeof o);
    o.resource_id = "fixture-model";
    o.revision = "rev-1";
    o.placement_id = MWS_SAMPLE_PLACEMENT_ID;
    o.placement_digest = MWS_SAMPLE_PLACEMENT_DIGEST;
    o.participant_id = MWS_SAMPLE_P0;
    o.instance_id = "i0";
    o.lease_id = NULL; /* missing */
    o.lease_generation = 1;
    CHECK_STATUS(mws_binding_new(&o, &wrong), MWS_NULL_ARGUMENT);
    CHECK(strstr(mws_last_error_message(), "lease_id") != NULL);
    o.lease_id = "lease\xff";
    CHECK_STATUS(mws_binding_new(&o, &wrong), MWS_INVALID_UTF8);
    CHECK(has_message("mws_binding_new"));
    CHECK_STATUS(mws_binding_new(NULL, &wrong), MWS_NULL_ARGUMENT);
    o.lease_id = "lease";
    CHECK_STATUS(mws_binding_new(&o, NULL), MWS_NULL_ARGUMENT);
    CHECK(wrong == NULL);

    /* A binding for participant t0 that lends t1's fragment does not pair. */
    CHECK_STATUS(mws_binding_new(&o, &wrong), MWS_OK);
    CHECK_STATUS(mws_placement_fragment(p, 1, &info), MWS_OK);
    memset(&f, 0, sizeof f);
    f.placement_fragment_id = info.placement_fragment_id;
    f.fragment_id = "t0:rt0";
    f.address = buf;
    f.nbytes = 32;
    f.worker_id = "w0";
    f.endpoint = "localhost:1";
    f.device = "cpu";
    f.itemsize = 2;
    f.local_shape = shape;
    f.local_shape_len = 2;
    f.strides_bytes = strides;
    f.strides_bytes_len = 2;
    f.storage_address = buf;
    f.storage_nbytes = 64;
    f.storage_offset_bytes = 0;
    f.memory_kind = 7; /* not an mws_memory_kind */
    CHECK_STATUS(mws_binding_add_fragment(wrong, &f), MWS_INVALID_ARGUMENT);
    CHECK(strstr(mws_last_error_message(), "memory_kind") != NULL);
    f.memory_kind = MWS_MEMORY_HOST;
    f.local_shape = NULL; /* NULL with a non-zero length */
    CHECK_STATUS(mws_binding_add_fragment(wrong, &f), MWS_NULL_ARGUMENT);
    f.local_shape = shape;
    f.fragment_id = NULL;
    CHECK_STATUS(mws_binding_add_fragment(wrong, &f), MWS_NULL_ARGUMENT);
    f.fragment_id = "t0:rt0";
    CHECK_STATUS(mws_binding_add_fragment(NULL, &f), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_binding_add_fragment(wrong, NULL), MWS_NULL_ARGUMENT);
    CHECK(mws_binding_fragment_count(wrong) == 0);
    CHECK_STATUS(mws_binding_add_fragment(wrong, &f), MWS_OK);
    CHECK(mws_binding_fragment_count(wrong) == 1);
    {
        mws_status st = mws_binding_validate(p, wrong);
        CHECK(st == MWS_INVALID_BINDING || st == MWS_INVALID_ARGUMENT);
        CHECK(has_message("mws_binding_validate"));
    }

    mws_binding_free(wrong);
    mws_binding_free(b0);
    mws_binding_free(NULL);
    mws_placement_free(p);
    free(buf);
}

static void test_plan_upload(void) {
    mws_placement *p = parse_sample();
    unsigned char *buf0 = (unsigned char *)calloc(1, 32);
    unsigned char *buf1 = (unsigned char *)calloc(1, 32);
    mws_binding *b[2] = {NULL, NULL};
    const mws_binding *set[2];
    const mws_binding *with_null[2];
    mws_upload_options opt;
    mws_upload_plan *plan = NULL;
    mws_upload_plan *other = NULL;
    mws_upload_operation op;
    size_t len = 0;
    char addr[32];
    if (p == NULL || buf0 == NULL || buf1 == NULL) {
        goto done;
    }
    CHECK_STATUS(sample_bind(p, MWS_SAMPLE_P0, 1, buf0, 32, &b[0]), MWS_OK);
    CHECK_STATUS(sample_bind(p, MWS_SAMPLE_P1, 1, buf1, 32, &b[1]), MWS_OK);
    set[0] = b[0];
    set[1] = b[1];
    memset(&opt, 0, sizeof opt);
    opt.store_namespace = "default";
    opt.key_prefix = "weights";
    opt.transaction_id = MWS_SAMPLE_TRANSACTION_ID;
    opt.created_at = MWS_SAMPLE_CREATED_AT;
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, &plan), MWS_OK);
    if (plan == NULL) {
        goto done;
    }
    CHECK(strcmp(mws_upload_plan_manifest_digest(plan, NULL), MWS_SAMPLE_MANIFEST_DIGEST) == 0);
    CHECK(strcmp(mws_upload_plan_manifest_key(plan, NULL), "weights/default/fixture-model/rev-1/1/manifest") == 0);
    CHECK(strcmp(mws_upload_plan_group_id(plan, NULL), "weights/default/fixture-model/rev-1/1") == 0);
    CHECK(strcmp(mws_upload_plan_transaction_id(plan, NULL), MWS_SAMPLE_TRANSACTION_ID) == 0);
    CHECK(strcmp(mws_upload_plan_transaction_group_id(plan, NULL),
                 "weights/default/fixture-model/rev-1/1/transactions/" MWS_SAMPLE_TRANSACTION_ID) == 0);
    CHECK(strcmp(mws_upload_plan_control_key(plan, NULL),
                 "weights/default/fixture-model/rev-1/1/transactions/" MWS_SAMPLE_TRANSACTION_ID "/decision") == 0);
    CHECK(strcmp(mws_upload_plan_source_placement_id(plan, NULL), MWS_SAMPLE_PLACEMENT_ID) == 0);
    CHECK(strcmp(mws_upload_plan_source_placement_digest(plan, NULL), MWS_SAMPLE_PLACEMENT_DIGEST) == 0);
    CHECK(strcmp(mws_upload_plan_commit_record(plan, NULL),
                 "{\"decision\":\"commit\",\"plan_digest\":\"" MWS_SAMPLE_MANIFEST_DIGEST
                 "\",\"record_type\":\"weight-upload-decision\"}") == 0);
    CHECK(mws_upload_plan_manifest_json(plan, &len) != NULL && len > 100);
    /* No runtime address in any output string. */
    snprintf(addr, sizeof addr, "%llu", (unsigned long long)(uintptr_t)buf0);
    CHECK(strstr(mws_upload_plan_manifest_json(plan, NULL), addr) == NULL);

    CHECK(mws_upload_plan_operation_count(plan) == 2);
    CHECK_STATUS(mws_upload_plan_operation(plan, 0, &op), MWS_OK);
    CHECK(strcmp(op.source_participant_id, MWS_SAMPLE_P0) == 0);
    CHECK(strcmp(op.source_fragment_id, MWS_SAMPLE_P0 ":rt0") == 0);
    CHECK(strcmp(op.target_fragment_id, "515f4b27b6a1cad7e471983b") == 0);
    CHECK(strcmp(op.object_key, "weights/default/fixture-model/rev-1/1/payload/" MWS_SAMPLE_TRANSACTION_ID
                                "/515f4b27b6a1cad7e471983b") == 0);
    CHECK(op.nbytes == 32 && op.source_lease_generation == 1);
    CHECK_STATUS(mws_upload_plan_operation(plan, 1, &op), MWS_OK);
    CHECK(strcmp(op.target_fragment_id, "b5e06f3b557ff3eae934cd8c") == 0);
    CHECK_STATUS(mws_upload_plan_operation(plan, 2, &op), MWS_INVALID_ARGUMENT);
    CHECK(has_message("mws_upload_plan_operation"));
    CHECK_STATUS(mws_upload_plan_operation(plan, 0, NULL), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_upload_plan_operation(NULL, 0, &op), MWS_NULL_ARGUMENT);

    /* Defaults: NULL options give a random transaction id and "now". */
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, NULL, &other), MWS_OK);
    CHECK(other != NULL && strlen(mws_upload_plan_transaction_id(other, NULL)) == 32);
    CHECK(other != NULL && strcmp(mws_upload_plan_transaction_id(other, NULL), MWS_SAMPLE_TRANSACTION_ID) != 0);
    mws_upload_plan_free(other);
    other = NULL;

    /* Invalid inputs. */
    CHECK(mws_upload_plan_new(p, set, 0, &opt, &other) != MWS_OK);
    CHECK(has_message("mws_upload_plan_new"));
    CHECK_STATUS(mws_upload_plan_new(p, NULL, 2, &opt, &other), MWS_NULL_ARGUMENT);
    with_null[0] = b[0];
    with_null[1] = NULL;
    CHECK_STATUS(mws_upload_plan_new(p, with_null, 2, &opt, &other), MWS_NULL_ARGUMENT);
    CHECK(strstr(mws_last_error_message(), "bindings[1]") != NULL);
    CHECK_STATUS(mws_upload_plan_new(NULL, set, 2, &opt, &other), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, NULL), MWS_NULL_ARGUMENT);
    opt.store_namespace = "";
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, &other), MWS_INVALID_ARGUMENT);
    opt.store_namespace = "default";
    opt.key_prefix = "///";
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, &other), MWS_INVALID_ARGUMENT);
    opt.key_prefix = "weights\xc3";
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, &other), MWS_INVALID_UTF8);
    CHECK(other == NULL);

    CHECK(mws_upload_plan_manifest_json(NULL, NULL) == NULL);
    CHECK(mws_upload_plan_operation_count(NULL) == 0);
    mws_upload_plan_free(NULL);
done:
    mws_upload_plan_free(plan);
    mws_binding_free(b[0]);
    mws_binding_free(b[1]);
    mws_placement_free(p);
    free(buf0);
    free(buf1);
}

/* mws_revision_list: the committed revisions of a resource, without a hand-built key.
 * A plan's manifest published with a raw put stands for a commit (a listing reads
 * manifests only). */
static void test_revisions(void) {
    mws_placement *p = parse_sample();
    unsigned char *buf0 = (unsigned char *)calloc(1, 32);
    unsigned char *buf1 = (unsigned char *)calloc(1, 32);
    mws_binding *b[2] = {NULL, NULL};
    const mws_binding *set[2];
    mws_upload_options opt;
    mws_upload_plan *plan = NULL;
    mws_store *store = NULL;
    mws_revision_list *list = NULL;
    mws_revision_list *none = NULL;
    mws_revision_info info;
    const char *json;
    size_t len = 0;
    if (p == NULL || buf0 == NULL || buf1 == NULL) {
        goto done;
    }
    CHECK_STATUS(sample_bind(p, MWS_SAMPLE_P0, 1, buf0, 32, &b[0]), MWS_OK);
    CHECK_STATUS(sample_bind(p, MWS_SAMPLE_P1, 1, buf1, 32, &b[1]), MWS_OK);
    set[0] = b[0];
    set[1] = b[1];
    memset(&opt, 0, sizeof opt);
    opt.transaction_id = MWS_SAMPLE_TRANSACTION_ID;
    opt.created_at = MWS_SAMPLE_CREATED_AT;
    CHECK_STATUS(mws_upload_plan_new(p, set, 2, &opt, &plan), MWS_OK);
    CHECK_STATUS(mws_store_open_memory(NULL, &store), MWS_OK);
    if (plan == NULL || store == NULL) {
        goto done;
    }
    CHECK_STATUS(mws_revision_list_from_store(store, NULL, "fixture-model", &none), MWS_OK);
    CHECK(mws_revision_list_count(none) == 0);
    mws_revision_list_free(none);
    none = NULL;
    json = mws_upload_plan_manifest_json(plan, &len);
    CHECK_STATUS(mws_store_put(store, mws_upload_plan_manifest_key(plan, NULL), (const uint8_t *)json, len, NULL),
                 MWS_OK);

    CHECK_STATUS(mws_revision_list_from_store(store, NULL, "fixture-model", &list), MWS_OK);
    CHECK(mws_revision_list_count(list) == 1);
    CHECK_STATUS(mws_revision_list_get(list, 0, &info), MWS_OK);
    CHECK(strcmp(info.revision, "rev-1") == 0);
    CHECK(info.weight_generation == 1);
    CHECK(strcmp(info.manifest_key, "weights/default/fixture-model/rev-1/1/manifest") == 0);
    CHECK(strcmp(info.manifest_digest, MWS_SAMPLE_MANIFEST_DIGEST) == 0);
    CHECK(strcmp(info.created_at, MWS_SAMPLE_CREATED_AT) == 0);
    CHECK_STATUS(mws_revision_list_get(list, 1, &info), MWS_INVALID_ARGUMENT);
    CHECK(has_message("mws_revision_list_get"));
    mws_revision_list_free(list);
    list = NULL;

    CHECK_STATUS(mws_revision_list_latest_from_store(store, "default", "fixture-model", &list), MWS_OK);
    CHECK(mws_revision_list_count(list) == 1);
    /* Another namespace, another resource: nothing. */
    CHECK_STATUS(mws_revision_list_latest_from_store(store, "other", "fixture-model", &none), MWS_OK);
    CHECK(mws_revision_list_count(none) == 0);
    mws_revision_list_free(none);
    none = NULL;
    CHECK_STATUS(mws_revision_list_from_store(store, NULL, "fixture", &none), MWS_OK);
    CHECK(mws_revision_list_count(none) == 0);
    mws_revision_list_free(none);
    none = NULL;

    CHECK_STATUS(mws_revision_list_from_store(store, NULL, "", &none), MWS_INVALID_ARGUMENT);
    CHECK(strstr(mws_last_error_message(), "resource_id") != NULL);
    CHECK_STATUS(mws_revision_list_from_store(store, NULL, NULL, &none), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_revision_list_from_store(NULL, NULL, "fixture-model", &none), MWS_NULL_ARGUMENT);
    CHECK_STATUS(mws_revision_list_from_store(store, NULL, "fixture-model", NULL), MWS_NULL_ARGUMENT);
    CHECK(none == NULL);
    CHECK(mws_revision_list_count(NULL) == 0);
    CHECK_STATUS(mws_revision_list_get(NULL, 0, &info), MWS_NULL_ARGUMENT);
    mws_revision_list_free(NULL);
done:
    mws_revision_list_free(list);
    mws_store_free(store);
    mws_upload_plan_free(plan);
    mws_binding_free(b[0]);
    mws_binding_free(b[1]);
    mws_placement_free(p);
    free(buf0);
    free(buf1);
}

/* mws_set_log_callback: records of the installed level reach the callback (an
 * upload plan logs its size at MWS_LOG_INFO); a stricter level and removal stop them. */
typedef struct {
    int count;
    int saw_plan;
    int max_level;
} log_sink;

static void on_log(void *ctx, int32_t level, const char *target, const char *message) {
    log_sink *s = (log_sink *)ctx;
    s->count++;
    if (level > s->max_level) {
        s->max_level = level;
    }
    if (strncmp(message, "upload plan for ", 16) == 0 && strstr(target, "mooncake_weight_store") != NULL) {
        s->saw_plan = 1;
    }
}

static int plan_once(const mws_placement *p) {
    unsigned char *buf0 = (unsigned char *)calloc(1, 32);
    unsigned char *buf1 = (unsigned char *)calloc(1, 32);
    mws_binding *b[2] = {NULL, NULL};
    const mws_binding *set[2];
    mws_upload_plan *plan = NULL;
    int ok = buf0 != NULL && buf1 != NULL && sample_bind(p, MWS_SAMPLE_P0, 1, buf0, 32, &b[0]) == MWS_OK &&
             sample_bind(p, MWS_SAMPLE_P1, 1, buf1, 32, &b[1]) == MWS_OK;
    if (ok) {
        set[0] = b[0];
        set[1] = b[1];
        ok = mws_upload_plan_new(p, set, 2, NULL, &plan) == MWS_OK;
    }
    mws_upload_plan_free(plan);
    mws_binding_free(b[0]);
    mws_binding_free(b[1]);
    free(buf0);
    free(buf1);
    return ok;
}

static void test_log_callback(void) {
    mws_placement *p = parse_sample();
    log_sink sink = {0, 0, 0};
    int before;
    if (p == NULL) {
        return;
    }
    CHECK_STATUS(mws_set_log_callback(9, on_log, &sink), MWS_INVALID_ARGUMENT);
    CHECK(has_message("mws_set_log_callback"));
    CHECK_STATUS(mws_set_log_callback(MWS_LOG_INFO, on_log, &sink), MWS_OK);
    CHECK(plan_once(p));
    CHECK(sink.saw_plan == 1);
    CHECK(sink.max_level <= MWS_LOG_INFO);
    CHECK_STATUS(mws_set_log_callback(MWS_LOG_WARN, on_log, &sink), MWS_OK);
    before = sink.count;
    CHECK(plan_once(p));
    CHECK(sink.count == before);
    CHECK_STATUS(mws_set_log_callback(MWS_LOG_OFF, NULL, NULL), MWS_OK);
    CHECK(plan_once(p));
    CHECK(sink.count == before);
    mws_placement_free(p);
}

int main(void) {
    test_version_and_status();
    test_panic_boundary();
    test_placement();
    test_placement_invalid();
    test_binding();
    test_plan_upload();
    test_revisions();
    test_log_callback();
    printf("c_api_test (%s): %d checks, %d failures\n",
#ifdef __cplusplus
           "compiled as C++",
#else
           "compiled as C",
#endif
           checks, failures);
    return failures == 0 ? 0 : 1;
}
