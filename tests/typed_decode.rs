//! The typed fast path of `Placement::from_json` and `StoredManifest::from_json`
//! (serde visitors straight into fragments) must decode exactly what the `Value`
//! path decodes, and every document it declines must still get the precise
//! contract error of the `Value` path.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::*;

fn sample_placement() -> Placement {
    let defs = model_tensors(2, 16, 2);
    build_placement("source", Layout { tp: 2, pp: 2, ep: 2, dp: 2 }, &defs, 1)
}

fn sample_manifest(p: &Placement) -> StoredManifest {
    let bindings = HostModel::new(p.clone(), false, "trainer", 1).make_bindings("trainer", 1);
    let options = UploadOptions {
        transaction_id: Some("00000000000000000000000062656e63".into()),
        created_at: Some("2025-01-01T00:00:00Z".into()),
        ..UploadOptions::default()
    };
    plan_upload(p, &bindings, &options).unwrap().manifest().clone()
}

/// Rewrites the first occurrence of `from` in `json` (which must exist).
fn edit(json: &str, from: &str, to: &str) -> String {
    assert!(json.contains(from), "{from} not in document");
    json.replacen(from, to, 1)
}

/// The same document through the `Value` path only: a key spelled with an escape
/// (`\u0074` = `t`) makes the fast path decline.
fn slow(json: &str, key: &str) -> String {
    let escaped = format!("\"\\u0074{}\":", &key[1..]);
    edit(json, &format!("\"{key}\":"), &escaped)
}

#[test]
fn placement_fast_and_value_paths_agree() {
    let p = sample_placement();
    let json = p.to_json();
    let fast = Placement::from_json(json.as_bytes()).unwrap();
    let value = Placement::from_json(slow(&json, "tensor_id").as_bytes()).unwrap();
    assert_eq!(fast, p);
    assert_eq!(value, p);
    assert_eq!(fast.to_json(), json);
    assert_eq!(Placement::from_json_str(&json).unwrap(), p);
    // A BOM is fine for bytes, an error for text.
    let bom = format!("\u{feff}{json}");
    assert_eq!(Placement::from_json(bom.as_bytes()).unwrap(), p);
    assert!(Placement::from_json_str(&bom).is_err());
    // Fragments share their tensor's id after decoding (fragments of one tensor
    // compare equal and the placement reports the same tensors).
    assert_eq!(fast.tensors().len(), p.tensors().len());
}

#[test]
fn placement_declined_documents_get_precise_errors() {
    let json = sample_placement().to_json();
    let cases = [
        (edit(&json, "\"nbytes\":", "\"nbytes\":1,\"nbytes\":"), "duplicate JSON field: nbytes"),
        (edit(&json, "\"aliases\":[]", "\"aliases\":[],\"extra\":1"), "has an invalid schema"),
        (edit(&json, "\"local_shape\":[", "\"local_shape\":[0,"), "local_shape must be at least"),
        (edit(&json, "\"rank\":{\"dp\":0", "\"rank\":{\"dp\":0.0"), "rank dp must be an integer"),
        (edit(&json, "\"tensor_id\":\"", "\"tensor_id\":\"nope."), "unknown tensor_id"),
        (edit(&json, "\"placement_fragment_id\":\"sha256:", "\"placement_fragment_id\":\"sha256:0"), "placement_id"),
        (edit(&json, "\"weight_generation\":1", "\"weight_generation\":NaN"), "non-finite JSON number"),
        (format!("{json} x"), "not valid JSON"),
    ];
    for (doc, needle) in cases {
        let fast = Placement::from_json(doc.as_bytes()).unwrap_err();
        assert!(fast.message().contains(needle), "{needle}: got {fast}");
    }
    // nbytes as a float: the fast path declines, the Value path names the rule.
    let doc = float_at(&json, "\"nbytes\":");
    let e = Placement::from_json(doc.as_bytes()).unwrap_err();
    assert!(e.message().contains("nbytes must be an integer"), "{e}");
}

/// Replaces the integer after the first `key` with the same value written as a float.
fn float_at(json: &str, key: &str) -> String {
    let at = json.find(key).expect("key") + key.len();
    let end = at + json[at..].find(|c: char| !c.is_ascii_digit()).expect("end");
    format!("{}{}.0{}", &json[..at], &json[at..end], &json[end..])
}

#[test]
fn manifest_fast_and_value_paths_agree() {
    let m = sample_manifest(&sample_placement());
    let json = m.to_json();
    let fast = StoredManifest::from_json(json.as_bytes()).unwrap();
    let value = StoredManifest::from_json(slow(&json, "tensor_id").as_bytes()).unwrap();
    assert_eq!(fast, m);
    assert_eq!(value, m);
    assert_eq!(fast.manifest_digest(), m.manifest_digest());
    assert_eq!(StoredManifest::from_json_str(&json).unwrap(), m);
}

#[test]
fn manifest_declined_documents_get_precise_errors() {
    let json = sample_manifest(&sample_placement()).to_json();
    let cases = [
        (edit(&json, "\"nbytes\":", "\"nbytes\":1,\"nbytes\":"), "duplicate JSON field: nbytes"),
        (edit(&json, "\"aliases\":[]", "\"aliases\":[],\"extra\":1"), "stored fragment schema fields do not match"),
        (float_at(&json, "\"object_offset\":"), "stored fragment object_offset must be an integer"),
        (edit(&json, "\"tensor_id\":\"", "\"tensor_id\":\"nope."), "unknown tensor_id"),
        (edit(&json, "\"created_at\":\"", "\"created_at\":\"\",\"x\":\""), "schema fields do not match contract"),
    ];
    for (doc, needle) in cases {
        let e = StoredManifest::from_json(doc.as_bytes()).unwrap_err();
        assert!(e.message().contains(needle), "{needle}: got {e}");
    }
}

fn sample_plan(p: &Placement) -> UploadPlan {
    let bindings = HostModel::new(p.clone(), false, "trainer", 1).make_bindings("trainer", 1);
    let options = UploadOptions {
        transaction_id: Some("00000000000000000000000062656e63".into()),
        created_at: Some("2025-01-01T00:00:00Z".into()),
        ..UploadOptions::default()
    };
    plan_upload(p, &bindings, &options).unwrap()
}

#[test]
fn upload_plan_transport_fast_and_value_paths_agree() {
    let p = sample_placement();
    let plan = sample_plan(&p);
    let text = plan_to_json(&plan);
    // As written: the typed path (manifest before operations).
    let fast = plan_from_json(text.as_bytes()).unwrap();
    assert_eq!(fast, plan);
    // A key with an escape is declined by the typed path: the value path decodes
    // the same plan.
    let escaped = edit(&text, "\"control_key\":", "\"control\\u005fkey\":");
    assert_eq!(plan_from_json(escaped.as_bytes()).unwrap(), plan);
    // Operations before the manifest: also the value path, same plan.
    let ops_at = text.find(",\"operations\":[").unwrap();
    let tail_at = text.find("],\"source_placement_digest\"").unwrap();
    let manifest_at = text.find("\"manifest\":").unwrap();
    let reordered = format!(
        "{}{},{}{}",
        &text[..manifest_at],
        &text[ops_at + 1..tail_at + 1],
        &text[manifest_at..ops_at],
        &text[tail_at + 1..]
    );
    assert_ne!(reordered, text);
    assert_eq!(plan_from_json(reordered.as_bytes()).unwrap(), plan);
}

#[test]
fn upload_plan_transport_declined_documents_get_precise_errors() {
    let p = sample_placement();
    let plan = sample_plan(&p);
    let text = plan_to_json(&plan);
    let cases = [
        // An operation naming no manifest fragment.
        (
            edit(&text, "\"target_fragment_id\":\"", "\"target_fragment_id\":\"x"),
            "upload plan operations and manifest differ",
        ),
        // An operation with an extra member.
        (
            edit(&text, "{\"source_generation\":", "{\"extra\":1,\"source_generation\":"),
            "upload operation 0 schema fields do not match contract",
        ),
        // A duplicate top-level key.
        (edit(&text, "{\"control_key\":", "{\"format\":\"x\",\"control_key\":"), "duplicate JSON field: format"),
        // A wrong format.
        (
            edit(&text, "\"format\":\"mooncake-weight-store/upload-plan/v1\"", "\"format\":\"v0\""),
            "upload plan format must be mooncake-weight-store/upload-plan/v1",
        ),
        // A manifest that breaks its own rules.
        (
            edit(&text, "\"resource_kind\":\"model_weight\"", "\"resource_kind\":\"other\""),
            "resource_kind must be model_weight",
        ),
    ];
    for (doc, expected) in cases {
        let err = plan_from_json(doc.as_bytes()).unwrap_err();
        assert!(err.message().contains(expected), "{expected}: got {}", err.message());
    }
}
