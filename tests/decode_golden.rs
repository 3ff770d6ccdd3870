//! The decoders of the three large documents (placement JSON, stored manifest
//! JSON, upload plan transport) against a recorded oracle: thousands of edited
//! documents (every member's value replaced by values of every JSON type, members
//! removed, repeated, renamed, escaped, added; pairs of faults, so that the order
//! in which faults are reported is pinned too; the top-level members in reverse
//! order) and what the decoders made of each: the exact error message or a digest
//! of the decoded value.
//!
//! `tests/fixtures/decode_golden.txt` was recorded from the two-decoder
//! implementation (a strict `Value` tree decoder behind a typed fast path) that
//! the one-pass decoders replaced; it pins their byte-level acceptance and every
//! message. Re-record only on a deliberate contract change:
//! `MWS_RECORD_GOLDEN=1 cargo test --test decode_golden`.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::*;
use std::fmt::Write as _;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/decode_golden.txt");

fn sample_placement() -> Placement {
    let defs = model_tensors(1, 8, 2);
    build_placement("source", Layout { tp: 2, pp: 1, ep: 2, dp: 1 }, &defs, 1)
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

/// The end of the JSON value starting at `at` (a minimal scanner: the documents
/// are valid JSON).
fn value_end(s: &[u8], at: usize) -> usize {
    let mut i = at;
    match s[i] {
        b'"' => {
            i += 1;
            while s[i] != b'"' {
                i += if s[i] == b'\\' { 2 } else { 1 };
            }
            i + 1
        }
        b'{' | b'[' => {
            let mut depth = 0;
            loop {
                match s[i] {
                    b'"' => {
                        i = value_end(s, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            while i < s.len() && !matches!(s[i], b',' | b'}' | b']') {
                i += 1;
            }
            i
        }
    }
}

/// A member of the document: where its key starts, where its value starts and ends.
#[derive(Clone, Copy)]
struct Member {
    key_at: usize,
    value_at: usize,
    value_end: usize,
}

/// The first and the last member named `key`.
fn members(doc: &str, key: &str) -> Vec<Member> {
    let pat = format!("\"{key}\":");
    let all: Vec<usize> = doc.match_indices(&pat).map(|(i, _)| i).collect();
    let mut picks: Vec<usize> = Vec::new();
    for i in [all.first(), all.last()].into_iter().flatten() {
        if !picks.contains(i) {
            picks.push(*i);
        }
    }
    picks
        .into_iter()
        .map(|key_at| {
            let value_at = key_at + pat.len();
            Member { key_at, value_at, value_end: value_end(doc.as_bytes(), value_at) }
        })
        .collect()
}

/// Every key of the document (sorted, unique).
fn keys(doc: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(doc).unwrap();
    fn walk(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    walk(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(&v, &mut out);
    out.into_iter().collect()
}

const VALUES: &[&str] = &[
    "null",
    "true",
    "0",
    "1",
    "-1",
    "-0",
    "2.0",
    "1.5",
    "1e400",
    "18446744073709551616",
    "\"\"",
    "\"x\"",
    "\"\\u0041\"",
    "[]",
    "[0]",
    "[-1]",
    "[1.0]",
    "[\"a\"]",
    "[0,\"a\"]",
    "{}",
    "{\"a\":1}",
    "{\"a\":1,\"a\":2}",
    "NaN",
];

/// Edits of one member: `(name, edited document)`.
fn member_edits(doc: &str, key: &str, m: Member) -> Vec<(String, String)> {
    let (head, value, tail) = (&doc[..m.key_at], &doc[m.value_at..m.value_end], &doc[m.value_end..]);
    let mut out = Vec::new();
    for v in VALUES {
        out.push((format!("{key}@{}={v}", m.key_at), format!("{head}\"{key}\":{v}{tail}")));
    }
    // The member removed (with its comma).
    let removed = if let Some(t) = tail.strip_prefix(',') {
        format!("{head}{t}")
    } else {
        format!("{}{tail}", head.strip_suffix(',').unwrap_or(head))
    };
    out.push((format!("{key}@{}:removed", m.key_at), removed));
    out.push((format!("{key}@{}:repeated", m.key_at), format!("{head}\"{key}\":{value},\"{key}\":{value}{tail}")));
    out.push((format!("{key}@{}:extra", m.key_at), format!("{head}\"zz\":1,\"{key}\":{value}{tail}")));
    let escaped = format!("\\u{:04x}{}", key.as_bytes()[0], &key[1..]);
    out.push((format!("{key}@{}:escaped", m.key_at), format!("{head}\"{escaped}\":{value}{tail}")));
    out.push((format!("{key}@{}:renamed", m.key_at), format!("{head}\"{key}x\":{value}{tail}")));
    if value.starts_with('"') && value.len() > 2 {
        let esc = format!("\"\\u{:04x}{}", value.as_bytes()[1], &value[2..]);
        out.push((format!("{key}@{}:escaped-value", m.key_at), format!("{head}\"{key}\":{esc}{tail}")));
    }
    if value.starts_with('[') && value.len() > 2 {
        out.push((format!("{key}@{}:first-null", m.key_at), format!("{head}\"{key}\":[null,{}{tail}", &value[1..])));
        out.push((
            format!("{key}@{}:last-zero", m.key_at),
            format!("{head}\"{key}\":{},0]{tail}", &value[..value.len() - 1]),
        ));
    }
    out
}

/// The top-level members in reverse order.
fn reversed(doc: &str) -> String {
    let s = doc.as_bytes();
    let mut i = 1;
    let mut parts = Vec::new();
    while s[i] != b'}' {
        let key_end = value_end(s, i);
        let end = value_end(s, key_end + 1);
        parts.push(&doc[i..end]);
        i = if s[end] == b',' { end + 1 } else { end };
    }
    parts.reverse();
    format!("{{{}}}", parts.join(","))
}

/// Every edited document of `doc`.
fn cases(doc: &str) -> Vec<(String, String)> {
    let mut out = vec![("original".to_string(), doc.to_string())];
    let mut faults = Vec::new();
    for key in keys(doc) {
        for m in members(doc, &key) {
            let edits = member_edits(doc, &key, m);
            out.extend(edits);
        }
        // The first member of each key takes part in the pairs.
        if let Some(m) = members(doc, &key).first() {
            faults.push((format!("{key}@{}", m.key_at), *m));
        }
    }
    // Pairs of faults (the later one applied first, so offsets hold): which is reported.
    for (i, (na, a)) in faults.iter().enumerate() {
        for (nb, b) in faults.iter().skip(i + 1) {
            let (first, second) = if a.key_at < b.key_at { (a, b) } else { (b, a) };
            if first.value_end > second.key_at {
                continue; // nested
            }
            let mut d = doc.to_string();
            d.replace_range(second.value_at..second.value_end, "null");
            d.replace_range(first.value_at..first.value_end, "null");
            out.push((format!("pair {na}+{nb}"), d));
        }
    }
    let rev = reversed(doc);
    out.push(("reversed".into(), rev.clone()));
    for key in keys(&rev) {
        for m in members(&rev, &key).into_iter().take(1) {
            for (name, d) in
                member_edits(&rev, &key, m).into_iter().filter(|(n, _)| n.ends_with("=null") || n.ends_with(":extra"))
            {
                out.push((format!("reversed {name}"), d));
            }
        }
    }
    let mut faults: Vec<(String, String)> = Vec::new();
    for (name, d) in [
        ("bom", format!("\u{feff}{doc}")),
        ("trailing", format!("{doc} x")),
        ("array", format!("[{doc}]")),
        ("empty", String::new()),
        ("cut-half", doc[..doc.len() / 2].to_string()),
        ("cut-end", doc[..doc.len() - 1].to_string()),
        ("nan-after-error", format!("{}NaN", &doc[..doc.len() - 1])),
    ] {
        faults.push((name.to_string(), d));
    }
    out.extend(faults);
    out
}

fn outcome<T>(r: Result<T>, ok: impl FnOnce(&T) -> String) -> String {
    match r {
        Ok(v) => format!("ok {}", ok(&v)),
        Err(e) => format!("err {:?}: {}", e.kind(), e.message()),
    }
}

/// One outcome when every entry point agrees, else all of them.
fn same_or_all(outcomes: &[String]) -> String {
    if outcomes.iter().all(|o| *o == outcomes[0]) {
        outcomes[0].clone()
    } else {
        outcomes.join(" | ")
    }
}

fn record() -> String {
    let p = sample_placement();
    let plan = sample_plan(&p);
    let docs = [("placement", p.to_json()), ("manifest", plan.manifest().to_json()), ("plan", plan_to_json(&plan))];
    let mut out = String::new();
    for (what, doc) in &docs {
        for (name, d) in cases(doc) {
            let r = match *what {
                "placement" => {
                    let bytes = outcome(Placement::from_json(d.as_bytes()), |p| sha256_hex(p.to_json().as_bytes()));
                    let text = outcome(Placement::from_json_str(&d), |p| sha256_hex(p.to_json().as_bytes()));
                    let value = outcome(
                        json::parse_text(&d, "placement manifest").and_then(|v| Placement::from_json_value(&v)),
                        |p| sha256_hex(p.to_json().as_bytes()),
                    );
                    same_or_all(&[bytes, text, value])
                }
                "manifest" => {
                    let bytes = outcome(StoredManifest::from_json(d.as_bytes()), |m| m.manifest_digest().to_string());
                    let text = outcome(StoredManifest::from_json_str(&d), |m| m.manifest_digest().to_string());
                    same_or_all(&[bytes, text])
                }
                // (A plan holds host addresses, which differ between runs: its
                // outcome is whether it re-encodes to the edited text.)
                _ => outcome(plan_from_json(d.as_bytes()), |p| {
                    if plan_to_json(p) == d { "canonical" } else { "not canonical" }.to_string()
                }),
            };
            writeln!(out, "{what} {name}\t{r}").unwrap();
        }
    }
    out
}

#[test]
fn decoders_match_the_recorded_oracle() {
    let got = record();
    if std::env::var_os("MWS_RECORD_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap();
    let mut diffs = 0;
    for (g, w) in got.lines().zip(want.lines()) {
        if g != w {
            diffs += 1;
            if diffs <= 20 {
                eprintln!("want: {w}\n got: {g}\n");
            }
        }
    }
    assert_eq!(got.lines().count(), want.lines().count(), "case count");
    assert_eq!(diffs, 0, "{diffs} cases differ from the oracle");
}
