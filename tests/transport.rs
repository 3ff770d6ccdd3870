//! JSON transport of plans, receipts and bindings between the processes of a job:
//! round trips are exact and every decode re-validates.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::protocol::UploadReceipt;
use mooncake_weight_store::protocol::{receipts_from_json, receipts_to_json};
use mooncake_weight_store::*;
use mooncake_weight_store::{binding_from_json, binding_to_json, plan_from_json, plan_to_json};

#[test]
fn plan_receipts_and_bindings_round_trip() {
    let defs = model_tensors(1, 16, 2);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 2, dp: 2 }, &defs, 1), false, "trainer", 4);
    let plan = plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let text = plan_to_json(&plan);
    assert!(!text.contains("\"owner\""));
    let back = plan_from_json(text.as_bytes()).unwrap();
    assert_eq!(back, plan);
    assert_eq!(plan_to_json(&back), text);

    let receipts = UploadReceipt::all_for(&plan);
    assert_eq!(receipts_from_json(receipts_to_json(&receipts).as_bytes()).unwrap(), receipts);

    for b in &src.bindings {
        assert_eq!(&binding_from_json(binding_to_json(b).as_bytes()).unwrap(), b);
    }
}

#[test]
fn tampered_transport_documents_are_refused() {
    let defs = model_tensors(1, 16, 0);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "trainer", 1);
    let plan = plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let text = plan_to_json(&plan);
    // Another transaction's payload key inside the manifest.
    let forged = text.replacen(plan.transaction_id(), "ffffffffffffffffffffffffffffffff", 1);
    assert!(plan_from_json(forged.as_bytes()).is_err());
    // A control key outside the transaction group.
    let forged = text.replacen("/decision\"", "/decision2\"", 1);
    assert!(plan_from_json(forged.as_bytes()).unwrap_err().message().contains("control key"));
    // Duplicate keys, wrong format.
    assert!(plan_from_json(text.replacen("{", "{\"format\":\"x\",", 1).as_bytes()).is_err());
    assert!(receipts_from_json(b"{\"format\":\"mooncake-weight-store/upload-receipts/v1\",\"receipts\":[{}]}").is_err());
    assert!(binding_from_json(b"[]").is_err());
}
