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
    /// CRC-32C of every 1 MiB block of the payload, computed from the source bytes
    /// during upload (`plan::integrity`); `None` when not computed (device sources,
    /// receipts rebuilt from a plan). Commit writes the revision's integrity record
    /// only when every receipt has them.
    pub block_checksums: Option<Vec<u32>>,
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
                block_checksums: None,
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
        if let Some(sums) = &r.block_checksums {
            out.push(',');
            let hex: String = sums.iter().map(|c| format!("{c:08x}")).collect();
            write_kv_str(&mut out, "block_crc32c", &hex);
        }
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
            let with_sums = r.contains("block_crc32c");
            let keys: &[&str] = if with_sums {
                &["block_crc32c", "fragment_id", "object_key", "worker_id"]
            } else {
                &["fragment_id", "object_key", "worker_id"]
            };
            r.expect_keys(keys, || "upload receipt schema fields do not match contract".into())?;
            let block_checksums = if with_sums {
                let hex = json::req_str(r.get("block_crc32c"), "block_crc32c")?;
                if hex.len() % 8 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return invalid("upload receipt block_crc32c must be 8 hex digits per block");
                }
                Some(
                    (0..hex.len() / 8).map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).expect("hex")).collect(),
                )
            } else {
                None
            };
            Ok(UploadReceipt {
                fragment_id: json::req_str(r.get("fragment_id"), "fragment_id")?,
                object_key: json::req_str(r.get("object_key"), "object_key")?,
                worker_id: json::req_str(r.get("worker_id"), "worker_id")?,
                block_checksums,
            })
        })
        .collect()
}
