//! Store key layout (`wire-format.md` §5–§6): percent-encoding, stored fragment ids
//! and the keys of one weight generation.

use crate::error::{invalid, Result};

/// The store namespace uploads, restores and revision listings use when the caller
/// names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Percent-encodes the UTF-8 bytes of `s`, keeping only `A-Za-z0-9-._~`, with
/// uppercase hex (`/` → `%2F`, space → `%20`, `%` → `%25`).
pub fn encode_key_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[(b >> 4) as usize]));
            out.push(char::from(b"0123456789ABCDEF"[(b & 15) as usize]));
        }
    }
    out
}

fn python_tuple(values: &[u64], out: &mut String) {
    out.push('(');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        crate::json::write_u64(out, *v);
    }
    if values.len() == 1 {
        out.push(',');
    }
    out.push(')');
}

/// The 24-hex stored fragment id: the first 24 hex characters of
/// `SHA-256(tensor_id + "|" + R(global_offset) + "|" + R(local_shape))`, where `R`
/// is the Python tuple text (`(0,)`, `(0, 4)`).
pub fn stored_fragment_id(tensor_id: &str, global_offset: &[u64], local_shape: &[u64]) -> String {
    let mut text = String::with_capacity(tensor_id.len() + 32);
    text.push_str(tensor_id);
    text.push('|');
    python_tuple(global_offset, &mut text);
    text.push('|');
    python_tuple(local_shape, &mut text);
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(24);
    for b in &digest[..12] {
        hex.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        hex.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    hex
}

/// The key prefix every revision of one resource shares:
/// `<prefix>/<enc(ns)>/<enc(resource)>/` (with the trailing `/`, so that a listing of
/// it never reaches a resource whose id merely starts with `resource_id`). Same
/// rules and errors as [`KeyLayout::new`].
pub fn resource_key_prefix(key_prefix: &str, namespace: &str, resource_id: &str) -> Result<String> {
    if namespace.is_empty() {
        return invalid("namespace must be a non-empty string");
    }
    let prefix = key_prefix.trim_matches('/');
    if prefix.is_empty() {
        return invalid("key_prefix must contain a non-empty path segment");
    }
    Ok(format!("{prefix}/{}/{}/", encode_key_segment(namespace), encode_key_segment(resource_id)))
}

/// The key layout of one weight generation: `<prefix>/<enc(ns)>/<enc(resource)>/
/// <enc(revision)>/<generation>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    group_id: String,
}

impl KeyLayout {
    /// Builds the layout. `key_prefix` is stripped of leading and trailing `/` only
    /// (not encoded) and must keep at least one character
    /// (`key_prefix must contain a non-empty path segment`); `namespace` must be
    /// non-empty (`namespace must be a non-empty string`).
    pub fn new(
        key_prefix: &str,
        namespace: &str,
        resource_id: &str,
        revision: &str,
        weight_generation: u64,
    ) -> Result<Self> {
        let mut group_id = resource_key_prefix(key_prefix, namespace, resource_id)?;
        group_id.push_str(&encode_key_segment(revision));
        group_id.push('/');
        crate::json::write_u64(&mut group_id, weight_generation);
        Ok(KeyLayout { group_id })
    }

    /// The group id (base key).
    pub fn group_id(&self) -> &str {
        &self.group_id
    }
    /// `<group>/manifest`.
    pub fn manifest_key(&self) -> String {
        format!("{}/manifest", self.group_id)
    }
    /// `<group>/payload/<transaction_id>/<fragment_id>`.
    pub fn payload_key(&self, transaction_id: &str, fragment_id: &str) -> String {
        let mut key = String::with_capacity(self.group_id.len() + 10 + transaction_id.len() + fragment_id.len());
        key.push_str(&self.group_id);
        key.push_str("/payload/");
        key.push_str(transaction_id);
        key.push('/');
        key.push_str(fragment_id);
        key
    }
    /// `<group>/transactions/<transaction_id>`.
    pub fn transaction_group_id(&self, transaction_id: &str) -> String {
        format!("{}/transactions/{transaction_id}", self.group_id)
    }
    /// `<group>/transactions/<transaction_id>/decision`.
    pub fn control_key(&self, transaction_id: &str) -> String {
        format!("{}/transactions/{transaction_id}/decision", self.group_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acc_100_percent_encoding_table() {
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
    }

    #[test]
    fn acc_100_stored_fragment_id_table() {
        assert_eq!(stored_fragment_id("layers.2.experts.3.w1", &[0], &[4]), "652411b3554f2cea24728b2e");
        assert_eq!(stored_fragment_id("layers.2.experts.3.w1", &[4], &[4]), "a07304b5313c1799c1c5249f");
        assert_eq!(stored_fragment_id("layers.0.experts.w1", &[1, 0, 0], &[1, 6, 8]), "4469de153fb6cdc02d5e7a34");
        assert_eq!(stored_fragment_id("w", &[0, 4], &[2, 2]), "7210467c2ebf0ceaa3b3a690");
        assert_eq!(stored_fragment_id("é", &[0], &[8]), "89d720904257ba46e3d20237");
    }

    #[test]
    fn acc_100_key_layout_example() {
        let k = KeyLayout::new("/ckpt/weights/", "prod/eu", "Qwen3.5 0.8B", "step-42+ü", 3).unwrap();
        assert_eq!(k.group_id(), "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3");
        assert_eq!(k.manifest_key(), "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/manifest");
        assert_eq!(
            k.control_key("fedcba9876543210fedcba9876543210"),
            "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/transactions/fedcba9876543210fedcba9876543210/decision"
        );
        assert_eq!(
            resource_key_prefix("/ckpt/weights/", "prod/eu", "Qwen3.5 0.8B").unwrap(),
            "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/"
        );
        assert!(KeyLayout::new("///", "n", "r", "v", 1).is_err());
        assert!(KeyLayout::new("w", "", "r", "v", 1).is_err());
    }
}
