//! Upload receipts: proof that one stored fragment's payload was written and is
//! visible, and their JSON transport between the processes of one job.

use crate::error::{invalid, Result};
use crate::json::{self, write_kv_str, Obj, Value};
use crate::plan::upload::UploadPlan;

const RECEIPTS_FORMAT: &str = "mooncake-weight-store/upload-receipts/v1";

/// Proof that one stored fragment's payload was written and is visible.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UploadReceipt {
    /// Stored fragment id.
    pub fragment_id: String,
    /// Object key.
    pub object_key: String,
    /// Worker that held the source.
    pub worker_id: String,
}

impl UploadReceipt {
    /// The receipts of every operation of `plan` (receipts are fully determined by
    /// the plan; a coordinator can rebuild them for recovery).
    pub fn all_for(plan: &UploadPlan) -> Vec<UploadReceipt> {
        plan.operations()
            .iter()
            .map(|o| UploadReceipt {
                fragment_id: o.target().fragment_id().into(),
                object_key: o.target().object_key().into(),
                worker_id: o.source_snapshot().worker_id().into(),
            })
            .collect()
    }
}

/// Encodes receipts for transport.
pub fn receipts_to_json(receipts: &[UploadReceipt]) -> String {
    let mut out = String::from("{\"format\":\"");
    out.push_str(RECEIPTS_FORMAT);
    out.push_str("\",\"receipts\":[");
    for (i, r) in receipts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        write_kv_str(&mut out, "fragment_id", &r.fragment_id);
        out.push(',');
        write_kv_str(&mut out, "object_key", &r.object_key);
        out.push(',');
        write_kv_str(&mut out, "worker_id", &r.worker_id);
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// Decodes receipts (strict); validity for a plan is checked at commit.
pub fn receipts_from_json(bytes: &[u8]) -> Result<Vec<UploadReceipt>> {
    let v = json::parse_bytes(bytes, "upload receipts")?;
    let o = Obj::new(&v, || "upload receipts must be a JSON object".into())?;
    o.expect_keys(&["format", "receipts"], || "upload receipts schema fields do not match contract".into())?;
    if o.get("format") != &Value::Str(RECEIPTS_FORMAT.into()) {
        return invalid(format!("upload receipts format must be {RECEIPTS_FORMAT}"));
    }
    let items = json::req_array(o.get("receipts"), || "upload receipts must be a sequence".into())?;
    items
        .iter()
        .map(|item| {
            let r = Obj::new(item, || "upload receipt must be a JSON object".into())?;
            r.expect_keys(&["fragment_id", "object_key", "worker_id"], || {
                "upload receipt schema fields do not match contract".into()
            })?;
            Ok(UploadReceipt {
                fragment_id: json::req_str(r.get("fragment_id"), "fragment_id")?,
                object_key: json::req_str(r.get("object_key"), "object_key")?,
                worker_id: json::req_str(r.get("worker_id"), "worker_id")?,
            })
        })
        .collect()
}
