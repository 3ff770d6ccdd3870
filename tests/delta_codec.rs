//! The sparse delta codec (`mooncake_weight_store::delta`, issue 47): round trips at
//! every element size and density, the byte format, the wire sizes the issue asks
//! for, and hostile encodings (every one refused with an error, the target untouched,
//! never a panic).

use mooncake_weight_store::delta::{self, EncodeOptions, Header, Kind, HEADER_LEN};
use mooncake_weight_store::ErrorKind;

/// splitmix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next() as u8;
        }
    }
}

/// A random base and a copy of it with `fraction` of its elements changed (each
/// element independently; a changed element differs in at least one byte).
fn pair(rng: &mut Rng, elements: usize, es: usize, fraction: f64) -> (Vec<u8>, Vec<u8>) {
    let mut base = vec![0u8; elements * es];
    rng.fill(&mut base);
    let mut new = base.clone();
    let threshold = (fraction * u64::MAX as f64) as u64;
    for e in 0..elements {
        if fraction >= 1.0 || rng.next() < threshold {
            change(rng, &mut new[e * es..(e + 1) * es]);
        }
    }
    (base, new)
}

/// Changes one element: one random byte of it gets another value.
fn change(rng: &mut Rng, element: &mut [u8]) {
    let i = rng.below(element.len());
    element[i] ^= 1 + rng.below(255) as u8;
}

fn changed(base: &[u8], new: &[u8], es: usize) -> usize {
    base.chunks(es).zip(new.chunks(es)).filter(|(a, b)| a != b).count()
}

/// Encodes, checks the stats, applies to a copy of the base, checks the result.
fn round_trip(base: &[u8], new: &[u8], es: usize) -> delta::EncodeStats {
    let mut wire = vec![0xAB; 3]; // encode appends: earlier bytes are kept
    let stats = delta::encode(base, new, es, &mut wire).unwrap();
    assert_eq!(&wire[..3], &[0xAB; 3]);
    let wire = &wire[3..];
    assert_eq!(stats.encoded_bytes, wire.len());
    assert_eq!(stats.changed_elements, changed(base, new, es), "es {es}");
    let header = Header::read(wire).unwrap();
    assert_eq!(header.element_size, es);
    assert_eq!(header.region_len, new.len() as u64);
    assert_eq!(header.encoded_len(), Some(wire.len() as u64));
    assert_eq!(header.kind == Kind::Whole, stats.whole);
    let mut target = base.to_vec();
    let applied = delta::apply(wire, &mut target, es).unwrap();
    assert!(target == new, "es {es}: apply(encode(base, new)) on base is not new");
    assert_eq!(applied.whole, stats.whole);
    assert_eq!(applied.runs, stats.runs);
    assert_eq!(applied.bytes_written, applied.elements_written * es);
    if stats.whole {
        assert_eq!(applied.bytes_written, new.len());
    } else {
        assert!(applied.elements_written >= stats.changed_elements);
        assert!(wire.len() - HEADER_LEN <= new.len() / 2, "a sparse body over the default threshold");
    }
    // Deterministic: the same arguments give the same bytes.
    let mut again = Vec::new();
    delta::encode(base, new, es, &mut again).unwrap();
    assert_eq!(again, wire);
    stats
}

#[test]
fn round_trip_every_element_size_and_density() {
    let mut rng = Rng(1);
    for es in [1, 2, 4, 8, 16] {
        // Not a whole number of 64-byte blocks: the tail path runs too.
        let elements = 20_000 + 64 / es.min(64) - 1;
        for fraction in [0.0, 0.0001, 0.01, 0.03, 0.10, 0.50, 1.0] {
            let (base, new) = pair(&mut rng, elements, es, fraction);
            let stats = round_trip(&base, &new, es);
            if fraction == 0.0 {
                assert_eq!((stats.changed_elements, stats.runs, stats.whole), (0, 0, false));
                assert_eq!(stats.encoded_bytes, HEADER_LEN);
            }
            if fraction >= 0.5 {
                assert!(stats.whole, "es {es} at {fraction}: {stats:?}");
            }
            if fraction <= 0.03 {
                assert!(!stats.whole, "es {es} at {fraction}: {stats:?}");
            }
        }
    }
}

#[test]
fn runs_first_and_last_elements_small_and_empty_regions() {
    let mut rng = Rng(2);
    for es in [1, 2, 4, 8, 16] {
        for elements in [0, 1, 2, 3, 31, 32, 33, 64, 65, 1000] {
            let mut base = vec![0u8; elements * es];
            rng.fill(&mut base);
            let patterns: [&[usize]; 6] = [
                &[],
                &[0],
                &[elements.saturating_sub(1)],
                &[0, elements.saturating_sub(1)],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                &[3, 4, 5, 9, 11, 12, 40, 41, 42, 43, 44, 63, 64, 65, 66],
            ];
            for changes in patterns {
                let mut changes: Vec<usize> = changes.iter().copied().filter(|&e| e < elements).collect();
                changes.dedup();
                let mut new = base.clone();
                for e in changes {
                    change(&mut rng, &mut new[e * es..(e + 1) * es]);
                }
                round_trip(&base, &new, es);
            }
            // Every element changed: sent whole.
            let mut new = base.clone();
            for e in new.chunks_mut(es) {
                e[0] ^= 0x5a;
            }
            assert!(round_trip(&base, &new, es).whole || elements == 0);
            // The first half changed: one long run when the threshold allows it.
            let mut new = base.clone();
            for e in new.chunks_mut(es).take(elements / 2) {
                e[es - 1] ^= 0xa5;
            }
            round_trip(&base, &new, es);
            let mut wire = Vec::new();
            let stats =
                delta::encode_with(&base, &new, es, EncodeOptions { whole_above_percent: 100 }, &mut wire).unwrap();
            if elements >= 4 {
                assert_eq!((stats.whole, stats.runs), (false, 1), "es {es}, {elements} elements");
            }
            let mut target = base.clone();
            delta::apply(&wire, &mut target, es).unwrap();
            assert_eq!(target, new);
        }
    }
}

#[test]
fn the_byte_format() {
    // bf16, 32 elements; elements 1, 2 and 6 change.
    let base = [0u8; 64];
    let mut new = base;
    new[2..6].copy_from_slice(&[1, 2, 3, 4]);
    new[12..14].copy_from_slice(&[5, 6]);
    let mut wire = Vec::new();
    let stats = delta::encode(&base, &new, 2, &mut wire).unwrap();
    let mut expected = b"MWSD".to_vec();
    expected.extend_from_slice(&[1, 2, 0, 0]); // version, element size, sparse, reserved
    expected.extend_from_slice(&64u64.to_le_bytes()); // region length
    expected.extend_from_slice(&10u64.to_le_bytes()); // body length
    expected.extend_from_slice(&[1, 2, 1, 2, 3, 4]); // gap 1, 2 elements, values
    expected.extend_from_slice(&[3, 1, 5, 6]); // gap 3 (elements 3-5), 1 element
    assert_eq!(wire, expected);
    assert_eq!(stats, delta::EncodeStats { changed_elements: 3, runs: 2, encoded_bytes: 34, whole: false });

    // Byte elements: one unchanged element between two changes joins their runs.
    let base = [0u8; 32];
    let mut new = base;
    new[..6].copy_from_slice(&[9, 0, 8, 0, 0, 7]);
    let mut wire = Vec::new();
    let stats = delta::encode(&base, &new, 1, &mut wire).unwrap();
    assert_eq!(&wire[HEADER_LEN..], &[0, 3, 9, 0, 8, 2, 1, 7]);
    assert_eq!((stats.changed_elements, stats.runs), (3, 2));

    // Whole: the header, then the region.
    let base = [0u8; 4];
    let new = [1u8, 2, 3, 4];
    let mut wire = Vec::new();
    let stats = delta::encode(&base, &new, 4, &mut wire).unwrap();
    assert!(stats.whole);
    assert_eq!(wire[6], 1);
    assert_eq!(&wire[16..24], &4u64.to_le_bytes());
    assert_eq!(&wire[HEADER_LEN..], &new);

    // A gap of 200 takes a two-byte varint.
    let base = vec![0u8; 202];
    let mut new = base.clone();
    new[200] = 1;
    let mut wire = Vec::new();
    delta::encode(&base, &new, 1, &mut wire).unwrap();
    assert_eq!(&wire[HEADER_LEN..], &[0xc8, 0x01, 1, 1]);
}

/// The sparse body by the format's rules, element by element (`docs/DELTA.md`): a
/// run starts at a changed element and takes the next element while it changed, or,
/// for byte elements, the next two when only the first of them is unchanged.
fn reference_body(base: &[u8], new: &[u8], es: usize) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let n = new.len() / es;
    let changed = |e: usize| e < n && base[e * es..(e + 1) * es] != new[e * es..(e + 1) * es];
    let (mut body, mut cursor, mut e) = (Vec::new(), 0, 0);
    while e < n {
        if !changed(e) {
            e += 1;
            continue;
        }
        let mut end = e + 1;
        loop {
            if changed(end) {
                end += 1;
            } else if es == 1 && changed(end + 1) {
                end += 2;
            } else {
                break;
            }
        }
        varint(&mut body, (e - cursor) as u64);
        varint(&mut body, (end - e) as u64);
        body.extend_from_slice(&new[e * es..end * es]);
        cursor = end;
        e = end;
    }
    body
}

#[test]
fn runs_are_the_same_whatever_their_place_in_the_region() {
    // The encoder works in 1 KiB chunks; runs across chunk boundaries, joins of byte
    // elements across them, and long gaps must not show in the output.
    let mut rng = Rng(10);
    for round in 0..300 {
        let es = [1, 2, 4, 8, 16][round % 5];
        let elements = 1 + rng.below(20_000 / es);
        let mut base = vec![0u8; elements * es];
        rng.fill(&mut base);
        let mut new = base.clone();
        for _ in 0..rng.below(12) {
            let longest = [3, 40, 3000][rng.below(3)];
            let (at, len) = (rng.below(elements), 1 + rng.below(longest));
            for e in at..(at + len).min(elements) {
                change(&mut rng, &mut new[e * es..(e + 1) * es]);
            }
        }
        // Changes on both sides of chunk boundaries, one and two elements apart.
        for b in (1024 / es..elements).step_by(1024 / es) {
            for off in [-2i64, -1, 0, 1] {
                if rng.below(3) == 0 {
                    let e = (b as i64 + off).clamp(0, elements as i64 - 1) as usize;
                    change(&mut rng, &mut new[e * es..(e + 1) * es]);
                }
            }
        }
        let mut wire = Vec::new();
        let stats = delta::encode_with(&base, &new, es, EncodeOptions { whole_above_percent: 100 }, &mut wire).unwrap();
        let body = reference_body(&base, &new, es);
        if body.len() > new.len() {
            assert!(stats.whole);
            continue;
        }
        assert!(!stats.whole);
        assert!(wire[HEADER_LEN..] == body[..], "round {round}, es {es}, {elements} elements");
        let mut target = base.clone();
        delta::apply(&wire, &mut target, es).unwrap();
        assert!(target == new);
    }
}

#[test]
fn whole_threshold_options() {
    let mut rng = Rng(3);
    let (base, new) = pair(&mut rng, 4096, 2, 0.2);
    // 20% of bf16 elements as runs of ~1: about 4 bytes each, ~40% of the region.
    let sparse_len = {
        let mut w = Vec::new();
        let s = delta::encode_with(&base, &new, 2, EncodeOptions { whole_above_percent: 100 }, &mut w).unwrap();
        assert!(!s.whole);
        w.len() - HEADER_LEN
    };
    let percent = (sparse_len * 100 / new.len()) as u8;
    for (p, whole) in [(0, true), (percent - 1, true), (percent + 1, false), (100, false)] {
        let mut w = Vec::new();
        let s = delta::encode_with(&base, &new, 2, EncodeOptions { whole_above_percent: p }, &mut w).unwrap();
        assert_eq!(s.whole, whole, "whole_above_percent {p} (sparse body is {percent}%)");
        assert_eq!(s.changed_elements, changed(&base, &new, 2));
        let mut t = base.clone();
        delta::apply(&w, &mut t, 2).unwrap();
        assert_eq!(t, new);
    }
    // 0%: no change is still a sparse encoding of no runs.
    let mut w = Vec::new();
    let s = delta::encode_with(&base, &base, 2, EncodeOptions { whole_above_percent: 0 }, &mut w).unwrap();
    assert!(!s.whole && w.len() == HEADER_LEN);
    let e = delta::encode_with(&base, &new, 2, EncodeOptions { whole_above_percent: 101 }, &mut w).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn encode_refuses_mismatched_arguments() {
    let mut out = vec![1, 2, 3];
    for (base, new, es) in [
        (vec![0u8; 8], vec![0u8; 16], 2), // lengths differ
        (vec![0u8; 9], vec![0u8; 9], 3),  // element size
        (vec![0u8; 8], vec![0u8; 8], 0),
        (vec![0u8; 64], vec![0u8; 64], 32),
        (vec![0u8; 10], vec![0u8; 10], 4), // not whole elements
    ] {
        let e = delta::encode(&base, &new, es, &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(out, [1, 2, 3], "nothing appended on error");
    }
}

#[test]
fn applied_to_another_base_the_result_is_not_new() {
    let mut rng = Rng(4);
    let (base, new) = pair(&mut rng, 10_000, 2, 0.03);
    let mut wire = Vec::new();
    delta::encode(&base, &new, 2, &mut wire).unwrap();
    let mut other = base.clone();
    let moved = [17usize, 5000, 9999];
    for &e in &moved {
        other[e * 2] ^= 0xff; // the target drifted from the base at three elements
    }
    let mut target = other.clone();
    delta::apply(&wire, &mut target, 2).unwrap();
    for e in 0..10_000 {
        let (t, n, o) = (&target[e * 2..e * 2 + 2], &new[e * 2..e * 2 + 2], &other[e * 2..e * 2 + 2]);
        if base[e * 2..e * 2 + 2] != *n {
            assert_eq!(t, n, "a changed element is written whatever the target held");
        } else {
            assert_eq!(t, o, "an unchanged element is left as the target held it");
        }
    }
    // Drifted elements that the step did not change stay drifted: only a checksum of
    // the result can tell the protocol.
    assert!(moved.iter().any(|&e| target[e * 2..e * 2 + 2] != new[e * 2..e * 2 + 2]));
    assert_ne!(target, new);
}

#[test]
fn source_moves_its_base_with_the_same_encoding() {
    let mut rng = Rng(5);
    let (mut base, new) = pair(&mut rng, 50_000, 4, 0.01);
    let mut target = base.clone();
    for step in 0..4 {
        let mut next = new.clone();
        for _ in 0..200 {
            let e = rng.below(50_000);
            change(&mut rng, &mut next[e * 4..e * 4 + 4]);
        }
        let mut wire = Vec::new();
        delta::encode(&base, &next, 4, &mut wire).unwrap();
        delta::apply(&wire, &mut target, 4).unwrap();
        delta::apply(&wire, &mut base, 4).unwrap(); // accepted: base := new
        assert_eq!(target, next, "step {step}");
        assert_eq!(base, next, "step {step}");
    }
}

#[test]
fn wire_size_at_1_and_3_percent_bf16() {
    let mut rng = Rng(6);
    let elements = 2 << 20; // 4 MiB of bf16
    for (fraction, at_most) in [(0.01, 20), (0.03, 10)] {
        let (base, new) = pair(&mut rng, elements, 2, fraction);
        let mut wire = Vec::new();
        let stats = delta::encode(&base, &new, 2, &mut wire).unwrap();
        assert!(!stats.whole);
        assert!(
            wire.len() * at_most <= new.len(),
            "{}% density: {} bytes on the wire for a {}-byte region (more than 1/{at_most})",
            fraction * 100.0,
            wire.len(),
            new.len()
        );
    }
}

#[test]
fn concatenated_encodings_split_by_their_headers() {
    let mut rng = Rng(7);
    let regions: Vec<(Vec<u8>, Vec<u8>, usize)> = [1, 2, 8, 16]
        .iter()
        .map(|&es| {
            let (b, n) = pair(&mut rng, 700, es, 0.05);
            (b, n, es)
        })
        .collect();
    let mut wire = Vec::new();
    for (b, n, es) in &regions {
        delta::encode(b, n, *es, &mut wire).unwrap();
    }
    let mut rest = &wire[..];
    for (b, n, es) in &regions {
        let h = Header::read(rest).unwrap();
        let len = h.encoded_len().unwrap() as usize;
        let mut t = b.clone();
        delta::apply(&rest[..len], &mut t, *es).unwrap();
        assert_eq!(&t, n);
        rest = &rest[len..];
    }
    assert!(rest.is_empty());
    // Two encodings at once are not one: the body length disagrees.
    let (b, _, es) = &regions[0];
    let mut t = b.clone();
    assert!(delta::apply(&wire, &mut t, *es).is_err());
    assert_eq!(&t, b);
}

/// Applies `wire` to a copy of `base` that sits between guard bytes; asserts an
/// error, the target untouched, the guards intact, and returns the message.
fn refused(wire: &[u8], base: &[u8], es: usize) -> String {
    let mut buf = vec![0xEEu8; base.len() + 128];
    buf[64..64 + base.len()].copy_from_slice(base);
    let e = delta::apply(wire, &mut buf[64..64 + base.len()], es).expect_err("a malformed encoding is refused");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(&buf[64..64 + base.len()], base, "a refused encoding wrote to the target: {e}");
    assert!(buf[..64].iter().chain(&buf[64 + base.len()..]).all(|&b| b == 0xEE));
    e.message().to_string()
}

/// A sparse encoding of a `len`-byte region with the given raw body.
fn raw(es: u8, len: u64, body: &[u8]) -> Vec<u8> {
    let mut w = b"MWSD".to_vec();
    w.extend_from_slice(&[1, es, 0, 0]);
    w.extend_from_slice(&len.to_le_bytes());
    w.extend_from_slice(&(body.len() as u64).to_le_bytes());
    w.extend_from_slice(body);
    w
}

#[test]
fn hostile_headers_are_refused() {
    let mut rng = Rng(8);
    let (base, new) = pair(&mut rng, 256, 2, 0.05);
    let mut wire = Vec::new();
    delta::encode(&base, &new, 2, &mut wire).unwrap();
    // Truncated at every byte position, and one byte too long.
    for cut in 0..wire.len() {
        refused(&wire[..cut], &base, 2);
    }
    let mut longer = wire.clone();
    longer.push(0);
    assert!(refused(&longer, &base, 2).contains("body"));
    let edit = |at: usize, v: u8| {
        let mut w = wire.clone();
        w[at] = v;
        w
    };
    assert!(refused(&edit(0, b'X'), &base, 2).contains("magic"));
    assert!(refused(&edit(4, 2), &base, 2).contains("version"));
    assert!(refused(&edit(4, 0), &base, 2).contains("version"));
    assert!(refused(&edit(5, 3), &base, 2).contains("element size"));
    assert!(refused(&edit(5, 4), &base, 2).contains("element size"));
    assert!(refused(&edit(6, 2), &base, 2).contains("kind"));
    assert!(refused(&edit(6, 1), &base, 2).contains("whole"));
    assert!(refused(&edit(7, 1), &base, 2).contains("reserved"));
    assert!(refused(&edit(8, 2), &base, 2).contains("region"));
    // The caller's element size and region disagree with the header.
    assert!(refused(&wire, &base, 4).contains("element size"));
    assert!(refused(&wire, &base[..510], 2).contains("512-byte region"));
    // Region length not whole elements; huge lengths.
    assert!(refused(&raw(4, 6, &[]), &base[..6], 4).contains("multiple"));
    let mut w = raw(2, 512, &[]);
    w[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(refused(&w, &base, 2).contains("body"));
    assert_eq!(Header::read(&w).unwrap().encoded_len(), None);
    let mut w = raw(2, 512, &[]);
    w[8..16].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    refused(&w, &base, 2);
}

#[test]
fn hostile_runs_are_refused() {
    let base = vec![0x11u8; 64]; // 32 bf16 elements
    let cases: &[(&[u8], &str)] = &[
        (&[32, 1, 0, 0], "past"),                                                   // gap to element 32
        (&[0, 33], "past"),                                                         // 33 elements
        (&[31, 2, 0, 0, 0, 0], "past"),                                             // ends after the last
        (&[0, 0], "0 elements"),                                                    // empty run
        (&[0, 1, 9], "values"),                                                     // half an element
        (&[0, 2, 9, 9], "values"),                                                  // one of two
        (&[0x80], "truncated"),                                                     // varint cut
        (&[0, 0x81], "truncated"),                                                  //
        (&[0x80, 0x00, 1, 0, 0], "minimally"),                                      // overlong 0
        (&[0, 0x81, 0x00, 0, 0], "minimally"),                                      //
        (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1], "past"), // u64::MAX gap
        (&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], "past"), // u64::MAX run
        (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], "overflows"),
        (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], "overflows"),
        (&[0, 1, 7, 7, 30, 1, 7, 7, 0, 1, 7, 7], "past"), // a third past the end
    ];
    for (body, what) in cases {
        let msg = refused(&raw(2, 64, body), &base, 2);
        assert!(msg.contains(what), "{body:?}: {msg}");
        assert!(msg.contains("byte"), "{body:?}: the message names a byte offset: {msg}");
    }
    // A gap that would overflow usize arithmetic next to the cursor (after one run).
    let mut body = vec![5, 1, 1, 1];
    body.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1, 0, 0]);
    refused(&raw(2, 64, &body), &base, 2);
    // Runs that touch (gap 0 after a run) are accepted: positions cannot go backwards.
    let mut t = base.clone();
    let s = delta::apply(&raw(2, 64, &[0, 1, 1, 1, 0, 1, 2, 2]), &mut t, 2).unwrap();
    assert_eq!((s.runs, s.elements_written), (2, 2));
    assert_eq!(&t[..4], &[1, 1, 2, 2]);
}

#[test]
fn fuzzed_encodings_never_panic_nor_write_outside() {
    let mut rng = Rng(9);
    let mut seeds = Vec::new();
    for es in [1usize, 2, 4, 8, 16] {
        for fraction in [0.0, 0.02, 0.3, 0.9] {
            let (base, new) = pair(&mut rng, 300, es, fraction);
            let mut wire = Vec::new();
            delta::encode(&base, &new, es, &mut wire).unwrap();
            seeds.push((base, new, es, wire));
        }
    }
    let (mut ok, mut err) = (0, 0);
    for round in 0..40_000 {
        let (base, new, es, wire) = &seeds[round % seeds.len()];
        let mut w = wire.clone();
        match rng.below(4) {
            0 | 1 => {
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(w.len());
                    w[i] ^= 1 << rng.below(8);
                }
            }
            2 => {
                // Rewrite a body byte with a random one (favours varint edge cases).
                if w.len() > HEADER_LEN {
                    let i = HEADER_LEN + rng.below(w.len() - HEADER_LEN);
                    w[i] = rng.next() as u8;
                }
            }
            _ => {
                w.truncate(rng.below(w.len() + 1));
                w.extend((0..rng.below(4)).map(|_| rng.next() as u8));
            }
        }
        let mut buf = vec![0xEEu8; base.len() + 64];
        buf[32..32 + base.len()].copy_from_slice(base);
        match delta::apply(&w, &mut buf[32..32 + base.len()], *es) {
            Ok(_) => {
                ok += 1;
                // Whatever it wrote, only elements of new or of the encoding's values;
                // an unmodified encoding gives new.
                if w == *wire {
                    assert_eq!(&buf[32..32 + base.len()], &new[..]);
                }
            }
            Err(e) => {
                err += 1;
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                assert_eq!(&buf[32..32 + base.len()], &base[..], "a refused encoding wrote: {e}");
            }
        }
        assert!(buf[..32].iter().chain(&buf[32 + base.len()..]).all(|&b| b == 0xEE), "a write outside the target");
    }
    assert!(ok > 1000 && err > 1000, "the fuzz loop reaches both outcomes: {ok} applied, {err} refused");
}
