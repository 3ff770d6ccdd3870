//! Acceptance tests, section B (wire format), items 82–100 of `acceptance.md`,
//! including the byte-exact worked examples of `wire-format.md` §2–§10.

#[path = "common/builders.rs"]
mod builders;

use builders::*;
use mooncake_weight_store::runtime::fence_binding_digest;
use mooncake_weight_store::*;
use serde_json::json;

// ---------------------------------------------------------------------------
// 82–99
// ---------------------------------------------------------------------------

#[test]
fn acc_082_placement_round_trip_is_stable_and_address_free() {
    let p = f_place();
    assert_eq!(p.placement_id(), F_PLACEMENT_ID);
    assert_eq!(p.digest(), F_DIGEST);
    let text = p.to_json();
    assert_eq!(text, f_place().to_json());
    let back = Placement::from_json(text.as_bytes()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.digest(), p.digest());
    assert_eq!(back.to_json(), text);
    for forbidden in ["address", "endpoint", "worker_id", "instance_id", "\"generation\":", "lease_id", "owner"] {
        assert!(!text.contains(forbidden), "placement JSON contains {forbidden}");
    }
}

#[test]
fn acc_083_pipeline_stage_is_canonical_and_round_trips() {
    let f = PlacementFragment::new(PlacementFragmentSpec { pipeline_stage_id: Some(3), ..f_fragment_spec() }).unwrap();
    let p = flat(f_topology(), vec![f_desc()], vec![f]).unwrap();
    let text = p.to_json();
    assert!(text.contains("\"pipeline_stage_id\":3"));
    let back = Placement::from_json(text.as_bytes()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.fragments().next().unwrap().pipeline_stage_id(), Some(3));
    assert_ne!(p.placement_id(), F_PLACEMENT_ID);
    assert!(!f_place().to_json().contains("pipeline_stage_id"));
}

#[test]
fn acc_084_digest_is_independent_of_inventory_order() {
    let a = tensor("a", &[8], 1, &[split(Tp, 0)]);
    let b = tensor("b", &[8], 1, &[repl(Tp)]);
    let ranks = [tp(0), tp(1)];
    let fragments = vec![rows(&a, 0, 4, tp(0)), rows(&a, 4, 4, tp(1)), whole(&b, tp(0)), whole(&b, tp(1))];
    let forward = flat(topo(1, 1, 1, 2, &ranks), vec![a.clone(), b.clone()], fragments.clone()).unwrap();
    let reverse = flat(topo(1, 1, 1, 2, &[tp(1), tp(0)]), vec![b, a], fragments.into_iter().rev().collect()).unwrap();
    assert_eq!(forward, reverse);
    assert_eq!(forward.to_json(), reverse.to_json());
    assert_eq!(forward.digest(), reverse.digest());
    assert_eq!(forward.placement_id(), reverse.placement_id());
}

#[test]
fn acc_085_weight_generation_changes_placement_identity() {
    let (g1, g2) = (f_place_gen(1), f_place_gen(2));
    assert_ne!(g1.placement_id(), g2.placement_id());
    assert_ne!(g1.digest(), g2.digest());
    assert_eq!(Placement::from_json(g2.to_json().as_bytes()).unwrap().weight_generation(), 2);
}

#[test]
fn acc_086_placement_uses_shard_dims_only() {
    let text = f_place().to_json();
    assert!(text.contains("\"shard_dims\":[0]"));
    assert!(!text.contains("partition_dim"));
}

#[test]
fn acc_087_placement_json_top_level_is_strict() {
    expect_invalid(
        edited_f_place(|v| {
            v.as_object_mut().unwrap().remove("revision");
        }),
        "schema fields",
    );
    expect_invalid(edited_f_place(|v| v["future_semantics"] = json!(1)), "schema fields");
    let text = f_place().to_json().replace("\"resource_id\":\"model\"", "\"resource_id\":NaN");
    expect_invalid(Placement::from_json(text.as_bytes()), "non-finite");
}

#[test]
fn acc_088_placement_json_nested_schema_is_strict() {
    type Edit = fn(&mut serde_json::Value);
    fn remove(v: &mut serde_json::Value, key: &str) {
        v.as_object_mut().unwrap().remove(key).expect("key present");
    }
    let edits: Vec<(&str, Edit)> = vec![
        ("tensor -", |v| remove(&mut v["tensors"][0], "dtype")),
        ("tensor +", |v| v["tensors"][0]["extra"] = json!(1)),
        ("topology -", |v| remove(&mut v["topology"], "tp_size")),
        ("topology +", |v| v["topology"]["extra"] = json!(1)),
        ("participant -", |v| remove(&mut v["topology"]["participants"][0], "rank")),
        ("participant +", |v| v["topology"]["participants"][0]["extra"] = json!(1)),
        ("participant rank -", |v| remove(&mut v["topology"]["participants"][0]["rank"], "ep")),
        ("participant rank +", |v| v["topology"]["participants"][0]["rank"]["xp"] = json!(0)),
        ("axis -", |v| remove(&mut v["tensors"][0]["parallel_axes"][0], "dim")),
        ("axis +", |v| v["tensors"][0]["parallel_axes"][0]["extra"] = json!(1)),
        ("part -", |v| remove(&mut v["parts"][0], "rank")),
        ("part +", |v| v["parts"][0]["extra"] = json!(1)),
        ("part rank -", |v| remove(&mut v["parts"][0]["rank"], "tp")),
        ("part rank +", |v| v["parts"][0]["rank"]["xp"] = json!(0)),
        ("fragment -", |v| remove(&mut v["parts"][0]["fragments"][0], "aliases")),
        ("fragment +", |v| v["parts"][0]["fragments"][0]["extra"] = json!(1)),
        ("fragment rank -", |v| remove(&mut v["parts"][0]["fragments"][0]["rank"], "pp")),
        ("fragment rank +", |v| v["parts"][0]["fragments"][0]["rank"]["xp"] = json!(0)),
    ];
    for (what, edit) in edits {
        let e = edited_f_place(edit).expect_err(what);
        assert!(e.message().contains("schema"), "{what}: {e}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}

#[test]
fn acc_089_legacy_and_framework_aliases_are_rejected() {
    expect_invalid(
        edited_f_place(|v| {
            let id = v.as_object_mut().unwrap().remove("resource_id").unwrap();
            v["model_id"] = id;
        }),
        "schema fields",
    );
    expect_invalid(edited_f_place(|v| v["tensors"][0]["partition_dim"] = json!(0)), "schema fields");
    expect_invalid(
        edited_f_place(|v| {
            let t = v["tensors"][0].as_object_mut().unwrap();
            let dims = t.remove("shard_dims").unwrap();
            t.insert("split_dim".into(), dims);
        }),
        "schema fields",
    );
    expect_invalid(
        edited_f_place(|v| {
            let a = v["tensors"][0]["parallel_axes"][0].as_object_mut().unwrap();
            let dim = a.remove("dim").unwrap();
            a.insert("split_dim".into(), dim);
        }),
        "schema fields",
    );
}

#[test]
fn acc_090_invalid_documents_are_rejected() {
    expect_invalid(Placement::from_json(b"not-json"), "not valid JSON");
    expect_invalid(Placement::from_json(b"[]"), "JSON object");
    expect_invalid(Placement::from_json(b"\"placement\""), "JSON object");
}

#[test]
fn acc_091_duplicate_object_keys_are_rejected() {
    let text = f_place().to_json().replacen('{', "{\"resource_id\":\"model\",", 1);
    expect_invalid(Placement::from_json(text.as_bytes()), "duplicate JSON field");
}

#[test]
fn acc_092_unreferenced_tensor_in_json_is_rejected() {
    let extra = serde_json::from_str::<serde_json::Value>(&f_place().to_json().replace(F_TENSOR, "zz.unreferenced"))
        .unwrap()["tensors"][0]
        .clone();
    let e = expect_invalid(edited_f_place(|v| v["tensors"].as_array_mut().unwrap().push(extra)), "unreferenced tensor");
    assert!(e.message().contains("zz.unreferenced"));
}

#[test]
fn acc_093_invalid_aliases_are_rejected() {
    for bad in [json!("alias"), json!({"alias": 1}), json!(["alias", "alias"])] {
        expect_invalid(edited_f_place(|v| v["parts"][0]["fragments"][0]["aliases"] = bad.clone()), "aliases");
    }
}

#[test]
fn acc_094_wrong_container_types_are_rejected() {
    type Edit = fn(&mut serde_json::Value);
    let edits: Vec<(&str, Edit)> = vec![
        ("tensors", |v| v["tensors"] = json!({})),
        ("participants", |v| v["topology"]["participants"] = json!({})),
        ("parts", |v| v["parts"] = json!(1)),
        ("fragments", |v| v["parts"][0]["fragments"] = json!(1)),
        ("global_shape", |v| v["tensors"][0]["global_shape"] = json!(8)),
        ("shard_dims", |v| v["tensors"][0]["shard_dims"] = json!("0")),
        ("parallel_axes", |v| v["tensors"][0]["parallel_axes"] = json!({})),
        ("global_offset", |v| v["parts"][0]["fragments"][0]["global_offset"] = json!(0)),
        ("local_shape", |v| v["parts"][0]["fragments"][0]["local_shape"] = json!(null)),
        ("placement rank", |v| v["parts"][0]["fragments"][0]["rank"] = json!([])),
    ];
    for (field, edit) in edits {
        let e = edited_f_place(edit).expect_err(field);
        assert!(e.message().contains(field), "{field}: {e}");
    }
}

#[test]
fn acc_095_placement_id_must_match_content() {
    expect_invalid(edited_f_place(|v| v["placement_id"] = json!("opaque-placement-id")), "canonical logical content");
    let p = f_place();
    let r = Placement::from_parts(PlacementSpec {
        resource_id: p.resource_id().into(),
        revision: p.revision().into(),
        weight_generation: p.weight_generation(),
        placement_set_id: p.placement_set_id().into(),
        topology: p.topology().clone(),
        parts: p.parts().to_vec(),
        placement_id: Some("opaque-placement-id".into()),
    });
    expect_invalid(r, "canonical logical content");
}

#[test]
fn acc_096_semantics_and_sizes_participate_in_identity() {
    let one = |axes: &[ParallelAxis], tp_size: u64| {
        let t = tensor("w", &[4, 4], 2, axes);
        flat(topo(1, 1, 1, tp_size, &[tp(0)]), vec![t.clone()], vec![whole(&t, tp(0))]).unwrap()
    };
    let pairs = [
        (one(&[split(Tp, 0)], 1), one(&[split(Ep, 0)], 1)),
        (one(&[repl(Tp)], 1), one(&[repl(Tp)], 2)),
        (one(&[repl(Tp)], 1), one(&[own(Tp)], 1)),
    ];
    for (a, b) in pairs {
        assert_ne!(a.placement_id(), b.placement_id());
        assert_ne!(a.digest(), b.digest());
    }
}

#[test]
fn acc_097_manifest_round_trip_is_stable_and_address_free() {
    let p = f_place_gen(42);
    let b = f_bind_with(&p, vec![f_rt_spec()]).unwrap();
    let options = fixed_options("default", "weights", "0123456789abcdef0123456789abcdef", "2026-07-17T00:00:00Z");
    let m = plan_upload(&p, &[b], &options).unwrap().manifest().clone();
    assert_eq!(m.weight_generation(), 42);
    let text = m.to_json();
    assert_eq!(text, m.to_json());
    assert_eq!(StoredManifest::from_json(text.as_bytes()).unwrap(), m);
    assert!(!text.contains("4096"));
    assert!(!text.contains("address"));
}

#[test]
fn acc_098_manifest_round_trip_preserves_descriptors() {
    let ep_tp = tensor("experts", &[2, 4, 2], 1, &[split(Ep, 0), split(Tp, 1)]);
    let single = tensor("single", &[8], 1, &[split(Tp, 0)]);
    let pp_tp = tensor("pp_tp", &[8], 1, &[own(Pp), split(Tp, 0)]);
    let fragments = vec![
        stored("e", "experts", &[0, 0, 0], &[2, 4, 2], 16, "e", 0),
        stored("s", "single", &[0], &[8], 8, "s", 0),
        stored("p", "pp_tp", &[0], &[8], 8, "p", 0),
    ];
    let m = manifest(vec![ep_tp, single, pp_tp], fragments).unwrap();
    let text = m.to_json();
    let back = StoredManifest::from_json(text.as_bytes()).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.tensors()[0].shard_dims(), &[0, 1]);
    assert_eq!(back.tensors()[1].shard_dims(), &[0]);
    assert_eq!(back.tensors()[2].parallel_axes(), &[own(Pp), split(Tp, 0)]);
    assert!(text.contains("\"shard_dims\":[0,1]"));
    assert!(text.contains("\"shard_dims\":[0]"));
    assert!(text.contains(
        r#""parallel_axes":[{"kind":"pp","semantics":"ownership"},{"dim":0,"kind":"tp","semantics":"split"}]"#
    ));
}

#[test]
fn acc_099_manifest_json_is_strict() {
    expect_invalid(StoredManifest::from_json(br#"{"model_id":NaN}"#), "non-finite");
    expect_invalid(StoredManifest::from_json(b"[]"), "JSON object");
    expect_invalid(edited_w5(|v| v["tensors"][0]["global_shape"] = json!([8.0])), "integer");
    expect_invalid(
        edited_w5(|v| {
            v.as_object_mut().unwrap().remove("revision");
        }),
        "schema",
    );
    expect_invalid(edited_w5(|v| v["extra"] = json!(1)), "schema");
}

// ---------------------------------------------------------------------------
// 100: the worked examples of wire-format.md, byte-exact
// ---------------------------------------------------------------------------

const W1_JSON: &str = r#"{"parts":[{"fragments":[{"aliases":[],"global_offset":[0,0],"local_shape":[4,4],"nbytes":32,"placement_fragment_id":"placement-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0},"tensor_id":"layers.2.experts.3.w1"}],"participant_id":"worker-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0}}],"placement_id":"sha256:618f22d9994d8d327a7afd97f3cfcf1f6680a337d71ea3a8162a7827ed0346db","placement_set_id":"placement-set-7","resource_id":"model","resource_kind":"model_weight","revision":"revision","tensors":[{"dtype":"bfloat16","expert_id":3,"global_shape":[4,4],"itemsize":2,"layer_id":2,"layout_fingerprint":"test:qwen:bf16:v1","parallel_axes":[{"dim":0,"kind":"tp","semantics":"split"}],"shard_dims":[0],"tensor_id":"layers.2.experts.3.w1"}],"topology":{"dp_size":1,"ep_size":1,"participants":[{"participant_id":"worker-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0}}],"pp_size":1,"topology_id":"sha256:017d6c66843ba96ccd39ed1b118b7635fee56677a41dc3d39c48b7bb3ccccdf4","tp_size":1},"weight_generation":7}"#;

const W1_ID_INPUT: &str = r#"{"parts":[{"fragments":[{"aliases":[],"global_offset":[0,0],"local_shape":[4,4],"nbytes":32,"placement_fragment_id":"placement-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0},"tensor_id":"layers.2.experts.3.w1"}],"participant_id":"worker-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0}}],"placement_set_id":"placement-set-7","resource_id":"model","revision":"revision","schema":"complete-weight-placement","tensors":[{"dtype":"bfloat16","expert_id":3,"global_shape":[4,4],"itemsize":2,"layer_id":2,"layout_fingerprint":"test:qwen:bf16:v1","parallel_axes":[{"dim":0,"kind":"tp","semantics":"split"}],"shard_dims":[0],"tensor_id":"layers.2.experts.3.w1"}],"topology":{"dp_size":1,"ep_size":1,"participants":[{"participant_id":"worker-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0}}],"pp_size":1,"topology_id":"sha256:017d6c66843ba96ccd39ed1b118b7635fee56677a41dc3d39c48b7bb3ccccdf4","tp_size":1},"weight_generation":7}"#;

const TOPOLOGY_ID_INPUT: &str = r#"{"dp_size":1,"ep_size":1,"participants":[{"participant_id":"worker-0","rank":{"dp":0,"ep":0,"pp":0,"tp":0}}],"pp_size":1,"schema":"weight-parallel-topology","tp_size":1}"#;

#[test]
fn acc_100_w1_minimal_placement() {
    let p = f_place();
    assert_eq!(p.topology().topology_id(), "sha256:017d6c66843ba96ccd39ed1b118b7635fee56677a41dc3d39c48b7bb3ccccdf4");
    assert_eq!(format!("sha256:{}", sha256_hex(TOPOLOGY_ID_INPUT.as_bytes())), p.topology().topology_id());
    assert_eq!(p.placement_id(), F_PLACEMENT_ID);
    assert_eq!(format!("sha256:{}", sha256_hex(W1_ID_INPUT.as_bytes())), F_PLACEMENT_ID);
    assert_eq!(p.to_json(), W1_JSON);
    assert_eq!(p.digest(), F_DIGEST);
    assert_eq!(sha256_hex(W1_JSON.as_bytes()), F_DIGEST);
    assert_eq!(Placement::from_json_str(W1_JSON).unwrap(), p);
}

#[test]
fn acc_100_w2_derived_fragment_ids() {
    let t = tensor("weight", &[4, 4], 2, &[]);
    let f = frag(&t, &[0, 0], &[4, 4], tp(1));
    assert_eq!(f.placement_fragment_id(), "sha256:73b1b25fe8cf11d48697cfd441a400d57ef84d52583d392c09453b5b79a86035");
    let input = r#"{"aliases":[],"global_offset":[0,0],"local_shape":[4,4],"nbytes":32,"rank":{"dp":0,"ep":0,"pp":0,"tp":1},"schema":"weight-placement-fragment","tensor_id":"weight"}"#;
    assert_eq!(format!("sha256:{}", sha256_hex(input.as_bytes())), f.placement_fragment_id());

    let f = PlacementFragment::new(PlacementFragmentSpec {
        tensor_id: "embed.weight".into(),
        global_offset: vec![0],
        local_shape: vec![8],
        nbytes: 16,
        rank: rank(1, 2, 0, 0),
        pipeline_stage_id: Some(3),
        aliases: vec!["lm_head.weight".into(), "embed.weight".into()],
        placement_fragment_id: None,
    })
    .unwrap();
    assert_eq!(f.placement_fragment_id(), "sha256:cf2ac2c9960c966a2820c647dbe1f0e92ede02bca159b8e02b3a5a6be197c9ef");
    assert_eq!(f.aliases(), &["embed.weight".to_string(), "lm_head.weight".to_string()]);

    let t = tensor("é.weight", &[8], 2, &[]);
    let f = frag(&t, &[0], &[8], tp(0));
    assert_eq!(f.placement_fragment_id(), "sha256:52866fbce246fce8461919d0bcb1a8e5e98e027973b0c6bdd7fba0a64fce1cf1");
    // An explicit id is kept; canonical_id still derives from content.
    let f = PlacementFragment::new(f_fragment_spec()).unwrap();
    assert_eq!(f.placement_fragment_id(), "placement-0");
    assert!(f.canonical_id().starts_with("sha256:"));
}

const W3_MANIFEST: &str = r#"{"created_at":"2026-07-17T12:34:56Z","fragments":[{"aliases":[],"fragment_id":"652411b3554f2cea24728b2e","global_offset":[0],"local_shape":[4],"nbytes":4,"object_key":"weights/default/qwen3.5-0.8b/step-42/7/payload/0123456789abcdef0123456789abcdef/652411b3554f2cea24728b2e","object_offset":0,"tensor_id":"layers.2.experts.3.w1"},{"aliases":[],"fragment_id":"a07304b5313c1799c1c5249f","global_offset":[4],"local_shape":[4],"nbytes":4,"object_key":"weights/default/qwen3.5-0.8b/step-42/7/payload/0123456789abcdef0123456789abcdef/a07304b5313c1799c1c5249f","object_offset":0,"tensor_id":"layers.2.experts.3.w1"}],"group_id":"weights/default/qwen3.5-0.8b/step-42/7","manifest_key":"weights/default/qwen3.5-0.8b/step-42/7/manifest","namespace":"default","resource_id":"qwen3.5-0.8b","resource_kind":"model_weight","revision":"step-42","tensors":[{"dtype":"uint8","expert_id":3,"global_shape":[8],"itemsize":1,"layer_id":2,"layout_fingerprint":"sglang:qwen3.5:uint8:test","parallel_axes":[{"kind":"dp","semantics":"replicated"},{"kind":"pp","semantics":"ownership"},{"kind":"ep","semantics":"ownership"},{"dim":0,"kind":"tp","semantics":"split"}],"shard_dims":[0],"tensor_id":"layers.2.experts.3.w1"}],"weight_generation":7}"#;
const W3_DIGEST: &str = "2d2336a4c82b34a48ec8b5c942196cf7bdd7dca294a6c5047432b30fd721d8a5";

#[test]
fn acc_100_w3_upload_plan_ascii_and_decision_record() {
    let p = s_placement(1, 2, 7);
    let bindings = bind_all(&p, &|_| 1);
    let options = fixed_options("default", "weights", "0123456789abcdef0123456789abcdef", "2026-07-17T12:34:56Z");
    let plan = plan_upload(&p, &bindings, &options).unwrap();
    let m = plan.manifest();
    assert_eq!(m.to_json(), W3_MANIFEST);
    assert_eq!(m.manifest_digest(), W3_DIGEST);
    assert_eq!(sha256_hex(W3_MANIFEST.as_bytes()), W3_DIGEST);
    let ids: Vec<&str> = m.fragments().iter().map(|f| f.fragment_id()).collect();
    assert_eq!(ids, ["652411b3554f2cea24728b2e", "a07304b5313c1799c1c5249f"]);
    assert_eq!(
        plan.transaction_group_id(),
        "weights/default/qwen3.5-0.8b/step-42/7/transactions/0123456789abcdef0123456789abcdef"
    );
    assert_eq!(plan.control_key(), format!("{}/decision", plan.transaction_group_id()));
    // §7 decision record.
    let record = r#"{"decision":"commit","plan_digest":"2d2336a4c82b34a48ec8b5c942196cf7bdd7dca294a6c5047432b30fd721d8a5","record_type":"weight-upload-decision"}"#;
    assert_eq!(plan.decision_record(Decision::Commit), record);
    assert_eq!(Decision::parse_record(record.as_bytes()).unwrap(), (Decision::Commit, W3_DIGEST.to_string()));
    assert_eq!(plan.decision_record(Decision::Abort), record.replace("commit", "abort"));
    expect_invalid(Decision::parse_record(record.replace("weight-upload-decision", "x").as_bytes()), "record_type");
    expect_invalid(Decision::parse_record(record.replace(W3_DIGEST, "abc").as_bytes()), "plan_digest");
    expect_invalid(Decision::parse_record(br#"{"decision":"commit"}"#), "schema fields");
    // The stored manifest decodes back to the same value and digest.
    let back = StoredManifest::from_json(W3_MANIFEST.as_bytes()).unwrap();
    assert_eq!(&back, m);
}

const W4_MANIFEST: &str = r#"{"created_at":"2026-08-01T00:00:00Z","fragments":[{"aliases":[],"fragment_id":"d325b7ae722c445d8cfb19b8","global_offset":[0,0],"local_shape":[2,2],"nbytes":8,"object_key":"ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/payload/fedcba9876543210fedcba9876543210/d325b7ae722c445d8cfb19b8","object_offset":0,"tensor_id":"embed.wé"},{"aliases":[],"fragment_id":"2fc4ce82b689af3b811e3063","global_offset":[0,2],"local_shape":[2,2],"nbytes":8,"object_key":"ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/payload/fedcba9876543210fedcba9876543210/2fc4ce82b689af3b811e3063","object_offset":0,"tensor_id":"embed.wé"}],"group_id":"ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3","manifest_key":"ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/manifest","namespace":"prod/eu","resource_id":"Qwen3.5 0.8B","resource_kind":"model_weight","revision":"step-42+ü","tensors":[{"dtype":"bfloat16","expert_id":null,"global_shape":[2,4],"itemsize":2,"layer_id":null,"layout_fingerprint":"fp:v1","parallel_axes":[{"kind":"dp","semantics":"replicated"},{"dim":1,"kind":"tp","semantics":"split"}],"shard_dims":[1],"tensor_id":"embed.wé"}],"weight_generation":3}"#;

#[test]
fn acc_100_w4_non_ascii_identifiers_and_percent_encoding() {
    let t = TensorDescriptor::new(TensorSpec {
        tensor_id: "embed.wé".into(),
        global_shape: vec![2, 4],
        dtype: "bfloat16".into(),
        itemsize: 2,
        shard_dims: vec![1],
        layout_fingerprint: "fp:v1".into(),
        parallel_axes: vec![repl(Dp), split(Tp, 1)],
        layer_id: None,
        expert_id: None,
    })
    .unwrap();
    let topology = ParallelTopology::new(TopologySpec {
        tp_size: 2,
        pp_size: 1,
        ep_size: 1,
        dp_size: 1,
        participants: vec![
            TopologyParticipant { participant_id: "w0".into(), rank: tp(0) },
            TopologyParticipant { participant_id: "w1".into(), rank: tp(1) },
        ],
        topology_id: None,
    })
    .unwrap();
    assert_eq!(topology.topology_id(), "sha256:3e6812609f7fa8817c3a14120f5dce1a823dd690a7048432738da83a52562288");
    let f0 = frag(&t, &[0, 0], &[2, 2], tp(0));
    let f1 = frag(&t, &[0, 2], &[2, 2], tp(1));
    assert_eq!(f0.placement_fragment_id(), "sha256:a12eb20a8f1a7d3dad995d2ebc3e5b81d0c74b648873f20fb8b00a04c8466b29");
    assert_eq!(f1.placement_fragment_id(), "sha256:45c33750c82756ac9de4fb3a66a97bfde2e9d0abfdd729a8088272dcd6ab4da9");
    let ids = Ids {
        resource_id: "Qwen3.5 0.8B".into(),
        revision: "step-42+ü".into(),
        weight_generation: 3,
        placement_set_id: "src".into(),
    };
    let p = flat_with(&ids, topology, vec![t], vec![f0, f1]).unwrap();
    assert_eq!(p.placement_id(), "sha256:6ab870ea66bdf1bce15eded51e121812f1d0c05e9e88f55a6c907930166e6019");
    assert_eq!(p.digest(), "2aa6524ea2577da29e23bf88c22ffa5bc2a7229f63a3a1b3bf20d94941f2e15c");
    let text = p.to_json();
    assert!(text.is_ascii());
    assert!(text.contains("embed.w\\u00e9") && text.contains("step-42+\\u00fc"));

    let bindings = vec![bind_part(&p, "w0", 1, 0x1000), bind_part(&p, "w1", 1, 0x1000)];
    let options =
        fixed_options("prod/eu", "/ckpt/weights/", "fedcba9876543210fedcba9876543210", "2026-08-01T00:00:00Z");
    let plan = plan_upload(&p, &bindings, &options).unwrap();
    let digest = "f44e98cf4b4b396c834f53ebf5afbafd301a36304f0b3997f011c5fa4b55c9b5";
    assert_eq!(plan.manifest().to_json(), W4_MANIFEST);
    assert_eq!(plan.manifest().manifest_digest(), digest);
    assert_eq!(
        plan.decision_record(Decision::Commit),
        format!(r#"{{"decision":"commit","plan_digest":"{digest}","record_type":"weight-upload-decision"}}"#)
    );
    assert_eq!(
        plan.control_key(),
        "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/transactions/fedcba9876543210fedcba9876543210/decision"
    );
}

const W5_JSON: &str = r#"{"created_at":"c","fragments":[{"aliases":[],"fragment_id":"a","global_offset":[0],"local_shape":[8],"nbytes":8,"object_key":"g/payload/x","object_offset":0,"tensor_id":"w"}],"group_id":"g","manifest_key":"g/manifest","namespace":"n","resource_id":"r","resource_kind":"model_weight","revision":"v","tensors":[{"dtype":"uint8","expert_id":null,"global_shape":[8],"itemsize":1,"layer_id":null,"layout_fingerprint":"f","parallel_axes":[],"shard_dims":[],"tensor_id":"w"}],"weight_generation":1}"#;
const W5_DIGEST: &str = "9a843a723870a40cc59563fc22611887ee2dd686c45f145235373ed797a03187";

#[test]
fn acc_100_w5_hand_built_manifest() {
    let m = w5_manifest();
    assert_eq!(m.to_json(), W5_JSON);
    assert_eq!(m.manifest_digest(), W5_DIGEST);
    // Re-encoded with indentation: same value, same digest.
    let pretty = serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(W5_JSON).unwrap()).unwrap();
    assert_ne!(pretty, W5_JSON);
    let back = StoredManifest::from_json(pretty.as_bytes()).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.manifest_digest(), W5_DIGEST);
    // A UTF-8 BOM decodes from bytes but not from text.
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(W5_JSON.as_bytes());
    assert_eq!(StoredManifest::from_json(&bom).unwrap().manifest_digest(), W5_DIGEST);
    let text = format!("\u{feff}{W5_JSON}");
    assert!(StoredManifest::from_json_str(&text).is_err());
    assert_eq!(StoredManifest::from_json_str(W5_JSON).unwrap(), m);
}

#[test]
fn acc_100_stored_fragment_id_and_percent_encoding_tables() {
    for (tensor, offset, shape, id) in [
        ("layers.2.experts.3.w1", &[0u64][..], &[4u64][..], "652411b3554f2cea24728b2e"),
        ("layers.2.experts.3.w1", &[4], &[4], "a07304b5313c1799c1c5249f"),
        ("layers.0.experts.w1", &[1, 0, 0], &[1, 6, 8], "4469de153fb6cdc02d5e7a34"),
        ("w", &[0, 4], &[2, 2], "7210467c2ebf0ceaa3b3a690"),
        ("é", &[0], &[8], "89d720904257ba46e3d20237"),
    ] {
        assert_eq!(stored_fragment_id(tensor, offset, shape), id);
    }
    for (v, e) in [
        ("default", "default"),
        ("prod/eu", "prod%2Feu"),
        ("Qwen3.5 0.8B", "Qwen3.5%200.8B"),
        ("step-42+ü", "step-42%2B%C3%BC"),
        ("a~b_c.d-e", "a~b_c.d-e"),
        ("%41", "%2541"),
        ("x:y@z", "x%3Ay%40z"),
        ("😀", "%F0%9F%98%80"),
    ] {
        assert_eq!(encode_key_segment(v), e);
    }
    let k = KeyLayout::new("/ckpt/weights/", "prod/eu", "Qwen3.5 0.8B", "step-42+ü", 3).unwrap();
    assert_eq!(k.group_id(), "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3");
    assert_eq!(k.manifest_key(), "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/manifest");
}

#[test]
fn acc_100_allocation_fence_binding_digest() {
    let f = RuntimeFragment::new(f_rt_spec()).unwrap();
    let text = r#"[{"address":4096,"device":"cuda:0","endpoint":"worker-0:12345","fragment_id":"runtime-0","itemsize":2,"local_shape":[4,4],"nbytes":32,"placement_fragment_id":"placement-0","storage_address":4096,"storage_nbytes":32,"storage_offset_bytes":0,"strides_bytes":[8,2],"worker_id":"worker-0"}]"#;
    let digest = "e9706a2bb8b1bfaf1dd35e1785aaee268807c7de479a55781341e50004bd8916";
    assert_eq!(sha256_hex(text.as_bytes()), digest);
    assert_eq!(fence_binding_digest(&[&f]), digest);
    // Sorted by runtime fragment id: input order does not matter.
    let g = RuntimeFragment::new(RuntimeFragmentSpec { fragment_id: "runtime-1".into(), ..f_rt_spec() }).unwrap();
    assert_eq!(fence_binding_digest(&[&f, &g]), fence_binding_digest(&[&g, &f]));
    assert_ne!(fence_binding_digest(&[&f, &g]), digest);
}
