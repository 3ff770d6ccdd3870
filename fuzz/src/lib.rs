//! The fuzz targets' bodies, their seed corpora and a small deterministic mutator for
//! the stable smoke run (docs/FUZZING.md).
//!
//! Every target decodes its input with the library's strict decoder; when that
//! succeeds it checks the round-trip properties: encoding the value and decoding the
//! encoding gives the same value, and encoding that again gives the same canonical
//! bytes. Any panic (including a failed property) is a finding. The library is built
//! with its `fuzzing` feature, which lets placement and topology ids that do not match
//! their SHA-256 content through, so inputs reach the validation behind the id checks.

#[path = "../../tests/common/mod.rs"]
mod common;

use mooncake_weight_store::protocol::{receipts_from_json, receipts_to_json, UploadReceipt};
use mooncake_weight_store::{binding_from_json, binding_to_json, plan_from_json, plan_to_json};
use mooncake_weight_store::{plan_upload, Decision, Placement, StoredManifest, UploadOptions};
use serde_json::Value as J;
use std::path::Path;

/// The fuzz targets, by name (the names of `fuzz_targets/*.rs`).
pub const TARGETS: [&str; 6] = ["placement", "manifest", "binding", "upload_plan", "receipts", "decision"];

/// Runs target `name` on `data`.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "placement" => placement(data),
        "manifest" => manifest(data),
        "binding" => binding(data),
        "upload_plan" => upload_plan(data),
        "receipts" => receipts(data),
        "decision" => decision(data),
        _ => panic!("unknown fuzz target {name}"),
    }
}

/// Decode, encode, decode: same value; encode again: same bytes.
fn round_trip<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    what: &str,
    data: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, E>,
    encode: impl Fn(&T) -> String,
) {
    let Ok(v) = decode(data) else { return };
    let text = encode(&v);
    let again = decode(text.as_bytes())
        .unwrap_or_else(|e| panic!("{what}: the canonical encoding of a decoded value does not decode: {e:?}"));
    assert_eq!(again, v, "{what}: decode(encode(v)) != v");
    assert_eq!(encode(&again), text, "{what}: the canonical bytes are not stable");
}

/// Placement JSON (`Placement::from_json` / `to_json`).
pub fn placement(data: &[u8]) {
    round_trip("placement", data, Placement::from_json, |p| p.to_json());
}

/// Stored manifest JSON (`StoredManifest::from_json` / `to_json`).
pub fn manifest(data: &[u8]) {
    round_trip("manifest", data, StoredManifest::from_json, |m| m.to_json());
}

/// Runtime binding transport JSON (`binding_from_json` / `binding_to_json`).
pub fn binding(data: &[u8]) {
    round_trip("binding", data, binding_from_json, binding_to_json);
}

/// Upload plan transport JSON (`plan_from_json` / `plan_to_json`).
pub fn upload_plan(data: &[u8]) {
    round_trip("upload plan", data, plan_from_json, plan_to_json);
}

/// Upload receipts transport JSON (`receipts_from_json` / `receipts_to_json`).
pub fn receipts(data: &[u8]) {
    round_trip("receipts", data, receipts_from_json, |r| receipts_to_json(r));
}

/// The upload decision record (`Decision::parse_record` / `Decision::record`).
pub fn decision(data: &[u8]) {
    round_trip("decision", data, Decision::parse_record, |(d, digest)| d.record(digest));
}

// ---- seeds ---------------------------------------------------------------------------

fn text_of(v: &J) -> Option<Vec<u8>> {
    match v {
        J::Null => None,
        J::String(s) => Some(s.clone().into_bytes()),
        other => Some(serde_json::to_vec(other).expect("JSON value")),
    }
}

/// The seed inputs of every target, built from the conformance fixtures in `dir`
/// (`tests/fixtures/conformance` and its `transfer/` subfolder): the documents the
/// fixtures hold (placements, manifests, decision records), and, for each successful
/// upload fixture, the transport encodings of its bindings, upload plan and receipts
/// (and an abort record). Returns `(target, name, bytes)`.
pub fn seeds(dir: &Path) -> Vec<(&'static str, String, Vec<u8>)> {
    let mut files: Vec<_> = Vec::new();
    for d in [dir.to_path_buf(), dir.join("transfer")] {
        if let Ok(rd) = std::fs::read_dir(&d) {
            files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")));
        }
    }
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read(&path) else { continue };
        let Ok(fx) = serde_json::from_slice::<J>(&text) else { continue };
        let (inputs, expected) = (&fx["inputs"], &fx["expected"]);
        let mut add = |target: &'static str, tag: &str, v: Option<Vec<u8>>| {
            if let Some(bytes) = v {
                out.push((target, format!("{stem}-{tag}"), bytes));
            }
        };
        for (k, tag) in
            [("placement", "placement"), ("placement_json", "placement-json"), ("target_placement", "target")]
        {
            add("placement", tag, text_of(&inputs[k]));
        }
        if fx["kind"] == "placement" {
            add("placement", "canonical", text_of(&expected["canonical_json"]));
        }
        add("manifest", "stored", text_of(&inputs["stored_manifest"]));
        if fx["kind"] == "manifest" {
            add("manifest", "canonical", text_of(&expected["canonical_json"]));
        }
        add("manifest", "upload", text_of(&expected["manifest_json"]));
        add("decision", "commit", text_of(&expected["decision_commit_record"]));
        if let Some(bindings) = inputs["bindings"].as_array() {
            for (i, b) in bindings.iter().enumerate() {
                add("binding", &format!("fixture-form-{i}"), text_of(b));
            }
        }
        if fx["kind"] != "upload" || expected.get("error").is_some() {
            continue;
        }
        let Ok(placement) = common::placement_from_fixture(inputs, "placement") else { continue };
        let Some(bindings) = inputs["bindings"]
            .as_array()
            .and_then(|a| a.iter().map(|b| common::binding_from_fixture(b).ok()).collect::<Option<Vec<_>>>())
        else {
            continue;
        };
        for (i, b) in bindings.iter().enumerate() {
            add("binding", &format!("transport-{i}"), Some(binding_to_json(b).into_bytes()));
        }
        let s = |k: &str| inputs[k].as_str().map(str::to_string);
        let options = UploadOptions {
            namespace: s("namespace").unwrap_or_default(),
            key_prefix: s("key_prefix").unwrap_or_default(),
            transaction_id: s("transaction_id"),
            created_at: s("created_at"),
        };
        let Ok(plan) = plan_upload(&placement, &bindings, &options) else { continue };
        add("upload_plan", "plan", Some(plan_to_json(&plan).into_bytes()));
        add("receipts", "receipts", Some(receipts_to_json(&UploadReceipt::all_for(&plan)).into_bytes()));
        add("decision", "abort", Some(plan.decision_record(Decision::Abort).into_bytes()));
    }
    out
}

// ---- a deterministic mutator (stable smoke run) --------------------------------------

/// A xorshift64* generator.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Interesting replacement tokens for JSON decoders.
const TOKENS: [&[u8]; 16] = [
    b"0",
    b"-1",
    b"1e309",
    b"18446744073709551616",
    b"9007199254740993",
    b"null",
    b"true",
    b"\"\"",
    b"[]",
    b"{}",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"NaN",
    b",",
    b"\"a/../b\"",
    b"1.5",
];

/// One mutation of `input`, drawing from `rng` (and splicing from `other`).
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            3 if !v.is_empty() => {
                // Replace a digit run (sizes, offsets, ranks) with a token.
                let digits: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_ascii_digit()).collect();
                if let Some(&i) = digits.get(rng.below(digits.len())) {
                    let mut j = i;
                    while j < v.len() && v[j].is_ascii_digit() {
                        j += 1;
                    }
                    let t = TOKENS[rng.below(5)];
                    v.splice(i..j, t.iter().copied());
                }
            }
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let n = rng.below(64).min(other.len() - from);
                v.splice(at..at, other[from..from + n].iter().copied());
            }
            5 => v.truncate(at),
            _ if !v.is_empty() => {
                // Duplicate a chunk (duplicate keys, repeated list items).
                let start = rng.below(v.len());
                let n = (1 + rng.below(48)).min(v.len() - start);
                let chunk = v[start..start + n].to_vec();
                v.splice(at..at, chunk);
            }
            _ => {}
        }
    }
    v
}
