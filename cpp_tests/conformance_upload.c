/* C consumer: plans the upload of a conformance "upload" fixture (read at run time,
 * path in argv[1]) through the C API and compares the plan with the fixture's
 * expectations: manifest bytes and digest, every key, the commit record, operations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_weight_store.h"
#include "support/fixture.h"
#include "support/mini_json.h"

static int failures = 0;

static void expect_str(const char *what, const char *actual, const char *expected) {
    if (actual == NULL || expected == NULL || strcmp(actual, expected) != 0) {
        failures++;
        fprintf(stderr, "mismatch in %s:\n  actual:   %s\n  expected: %s\n", what, actual ? actual : "(null)",
                expected ? expected : "(null)");
    }
}

static void expect_u64(const char *what, uint64_t actual, uint64_t expected) {
    if (actual != expected) {
        failures++;
        fprintf(stderr, "mismatch in %s: %llu != %llu\n", what, (unsigned long long)actual,
                (unsigned long long)expected);
    }
}

static int fail(const char *what) {
    fprintf(stderr, "%s failed: %s\n", what, mws_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    size_t len = 0, i, n;
    char *text;
    mj_value *doc;
    const mj_value *inputs, *expected, *jbindings, *placement_json, *ops;
    mws_placement *placement = NULL;
    mws_binding **bindings;
    mws_upload_options options;
    mws_upload_plan *plan = NULL;
    int rc = 1;

    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE.json\n", argv[0]);
        return 2;
    }
    text = mj_read_file(argv[1], &len);
    if (text == NULL) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    doc = mj_parse(text, len);
    inputs = mj_get(doc, "inputs");
    expected = mj_get(doc, "expected");
    placement_json = mj_get(inputs, "placement");
    jbindings = mj_get(inputs, "bindings");
    if (doc == NULL || placement_json == NULL || jbindings == NULL || jbindings->kind != MJ_ARRAY || expected == NULL) {
        fprintf(stderr, "%s is not an upload fixture\n", argv[1]);
        mj_free(doc);
        free(text);
        return 2;
    }

    /* The placement is handed to the library verbatim (its span in the file). */
    if (mws_placement_from_json(text + placement_json->begin, placement_json->end - placement_json->begin,
                                &placement) != MWS_OK) {
        rc = fail("mws_placement_from_json");
        goto out;
    }
    n = jbindings->count;
    bindings = (mws_binding **)calloc(n, sizeof *bindings);
    for (i = 0; i < n; i++) {
        const mj_value *jb = jbindings->items[i];
        const mj_value *frags = mj_get(jb, "fragments");
        mws_binding_options o;
        size_t k;
        fixture_binding_options_from_json(jb, &o);
        if (mws_binding_new(&o, &bindings[i]) != MWS_OK) {
            rc = fail("mws_binding_new");
            goto free_bindings;
        }
        for (k = 0; frags != NULL && k < frags->count; k++) {
            fixture_fragment f;
            if (!fixture_fragment_from_json(frags->items[k], &f) ||
                mws_binding_add_fragment(bindings[i], &f.f) != MWS_OK) {
                rc = fail("mws_binding_add_fragment");
                goto free_bindings;
            }
        }
    }

    memset(&options, 0, sizeof options);
    options.store_namespace = mj_str(inputs, "namespace");
    options.key_prefix = mj_str(inputs, "key_prefix");
    options.transaction_id = mj_str(inputs, "transaction_id");
    options.created_at = mj_str(inputs, "created_at");
    if (mws_upload_plan_new(placement, (const mws_binding *const *)bindings, n, &options, &plan) != MWS_OK) {
        rc = fail("mws_upload_plan_new");
        goto free_bindings;
    }

    expect_str("manifest_digest", mws_upload_plan_manifest_digest(plan, NULL), mj_str(expected, "manifest_digest"));
    expect_str("manifest_json", mws_upload_plan_manifest_json(plan, NULL), mj_str(expected, "manifest_json"));
    expect_str("group_id", mws_upload_plan_group_id(plan, NULL), mj_str(expected, "group_id"));
    expect_str("manifest_key", mws_upload_plan_manifest_key(plan, NULL), mj_str(expected, "manifest_key"));
    expect_str("transaction_group_id", mws_upload_plan_transaction_group_id(plan, NULL),
               mj_str(expected, "transaction_group_id"));
    expect_str("control_key", mws_upload_plan_control_key(plan, NULL), mj_str(expected, "control_key"));
    expect_str("source_placement_id", mws_upload_plan_source_placement_id(plan, NULL),
               mj_str(expected, "source_placement_id"));
    expect_str("source_placement_digest", mws_upload_plan_source_placement_digest(plan, NULL),
               mj_str(expected, "source_placement_digest"));
    expect_str("decision_commit_record", mws_upload_plan_commit_record(plan, NULL),
               mj_str(expected, "decision_commit_record"));
    ops = mj_get(expected, "operations");
    expect_u64("operation count", mws_upload_plan_operation_count(plan), ops ? ops->count : 0);
    for (i = 0; ops != NULL && i < ops->count && i < mws_upload_plan_operation_count(plan); i++) {
        const mj_value *e = ops->items[i];
        mws_upload_operation op;
        if (mws_upload_plan_operation(plan, i, &op) != MWS_OK) {
            rc = fail("mws_upload_plan_operation");
            goto free_plan;
        }
        expect_str("source_participant_id", op.source_participant_id, mj_str(e, "source_participant_id"));
        expect_str("source_instance_id", op.source_instance_id, mj_str(e, "source_instance_id"));
        expect_str("source_lease_id", op.source_lease_id, mj_str(e, "source_lease_id"));
        expect_u64("source_generation", op.source_lease_generation, mj_u64(e, "source_generation"));
        expect_str("source_fragment_id", op.source_fragment_id, mj_str(e, "source_fragment_id"));
        expect_str("source_worker_id", op.source_worker_id, mj_str(e, "source_worker_id"));
        expect_str("source_placement_fragment_id", op.source_placement_fragment_id,
                   mj_str(e, "source_placement_fragment_id"));
        expect_str("target_fragment_id", op.target_fragment_id, mj_str(e, "target_fragment_id"));
        expect_str("object_key", op.object_key, mj_str(e, "object_key"));
        expect_u64("nbytes", op.nbytes, mj_u64(e, "nbytes"));
    }
    rc = failures == 0 ? 0 : 1;
    printf("%s: manifest digest %s (%s)\n", argv[1], mws_upload_plan_manifest_digest(plan, NULL),
           rc == 0 ? "matches" : "MISMATCH");
free_plan:
    mws_upload_plan_free(plan);
free_bindings:
    for (i = 0; i < n; i++) {
        mws_binding_free(bindings[i]);
    }
    free(bindings);
out:
    mws_placement_free(placement);
    mj_free(doc);
    free(text);
    return rc;
}
