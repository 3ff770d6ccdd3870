//! SHA-256 of canonical JSON as it is written, without holding the document.
//!
//! A writer (`write_*_with(out, flush)`) appends JSON to a buffer and calls
//! `flush` after each element; [`hash_written`] consumes the buffer in chunks.
//! Small documents are hashed on the calling thread in cache-sized chunks. Large
//! ones (at least [`PIPELINE_MIN_BYTES`] expected) are hashed on a second thread
//! while the caller keeps serializing: full buffers go through a bounded channel
//! in order and come back empty for reuse, so the hashed bytes (and the digest)
//! are exactly those of the sequential path, and at most [`PIPELINE_BUFFERS`]
//! buffers of [`PIPELINE_CHUNK`] bytes exist at a time.

use sha2::{Digest, Sha256};
use std::sync::mpsc;

/// Bytes buffered before they are hashed on the calling thread.
const HASH_CHUNK: usize = 64 * 1024;
/// Expected document size from which hashing moves to a second thread.
pub(crate) const PIPELINE_MIN_BYTES: usize = 8 << 20;
/// Bytes per buffer handed to the hashing thread.
const PIPELINE_CHUNK: usize = 1 << 20;
/// Buffers in flight at most (one filling, the rest queued or being hashed).
const PIPELINE_BUFFERS: usize = 4;

/// The flush callback a chunked writer calls after each element it appends.
pub(crate) type Flush<'a> = dyn FnMut(&mut String) + 'a;

/// How many bytes a chunked writer (see [`hash_written`], [`written_equals`]) has
/// written so far: what its flushes handed on plus what its buffer still holds.
/// The two-thread writers learn where a document's halves meet this way, while
/// the document is hashed or compared. Thread safety: one writer's thread only.
#[derive(Debug, Default)]
pub(crate) struct Position(std::cell::Cell<usize>);

impl Position {
    /// Calls `flush(c)`, counting what it took from `c`.
    pub(crate) fn flush(&self, flush: &mut Flush<'_>, c: &mut String) {
        let before = c.len();
        flush(c);
        self.0.set(self.0.get() + (before - c.len()));
    }

    /// Bytes written so far, `out` being the writer's buffer.
    pub(crate) fn at(&self, out: &str) -> usize {
        self.0.get() + out.len()
    }
}

/// Feeds everything `write` appends to `state` (in order) and returns the state.
///
/// `write(out, flush)` must append its bytes to `out` and may call `flush(out)` at
/// any point (after each element, typically); `flush` takes what is complete and
/// may leave `out` empty. `expected_len` (an estimate of the document's size)
/// chooses the path: from [`PIPELINE_MIN_BYTES`] on, a second thread hashes while
/// `write` runs; should that thread not start, the calling thread hashes. The
/// result is the same either way. Thread safety: `write` runs on the calling
/// thread only.
pub(crate) fn hash_written(
    state: Sha256,
    expected_len: usize,
    write: impl FnOnce(&mut String, &mut Flush<'_>),
) -> Sha256 {
    if expected_len >= PIPELINE_MIN_BYTES {
        hash_pipelined(state, write)
    } else {
        hash_inline(state, write)
    }
}

/// Whether everything `write` appends (see [`hash_written`] for the contract of
/// `write` and `flush`) equals `expected`, byte for byte and in length, without
/// holding the written document: it is compared in cache-sized chunks. A
/// decoder that knows the SHA-256 of its input uses this to reuse that digest
/// for the canonical re-serialization when the two are the same bytes. No
/// errors; thread safety: `write` runs on the calling thread only.
pub(crate) fn written_equals(expected: &[u8], write: impl FnOnce(&mut String, &mut Flush<'_>)) -> bool {
    let mut at = 0usize;
    let mut same = true;
    in_chunks(write, |bytes| {
        // After a difference the rest is not compared (the writer cannot be stopped).
        same = same && expected.get(at..at + bytes.len()) == Some(bytes);
        at += bytes.len();
    });
    same && at == expected.len()
}

/// Runs `write` with a cache-sized buffer and hands `consume` everything it
/// writes, in order, in chunks of about [`HASH_CHUNK`] bytes (the last one
/// possibly shorter or empty).
fn in_chunks(write: impl FnOnce(&mut String, &mut Flush<'_>), mut consume: impl FnMut(&[u8])) {
    let mut chunk = String::with_capacity(HASH_CHUNK + 4096);
    write(&mut chunk, &mut |c: &mut String| {
        if c.len() >= HASH_CHUNK {
            consume(c.as_bytes());
            c.clear();
        }
    });
    consume(chunk.as_bytes());
}

fn hash_inline(mut state: Sha256, write: impl FnOnce(&mut String, &mut Flush<'_>)) -> Sha256 {
    in_chunks(write, |bytes| state.update(bytes));
    state
}

fn hash_pipelined(state: Sha256, write: impl FnOnce(&mut String, &mut Flush<'_>)) -> Sha256 {
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = mpsc::sync_channel::<String>(PIPELINE_BUFFERS - 2);
        let (empty_tx, empty_rx) = mpsc::channel::<String>();
        let fallback = state.clone();
        let hasher = std::thread::Builder::new().name("mws-digest".into()).spawn_scoped(scope, move || {
            let mut state = state;
            for mut buf in full_rx {
                state.update(buf.as_bytes());
                buf.clear();
                // The writer may be done already (and have dropped its receiver).
                let _ = empty_tx.send(buf);
            }
            state
        });
        let hasher = match hasher {
            Ok(h) => h,
            Err(e) => {
                log::debug!("digest: no hashing thread ({e}); hashing on the calling thread");
                return hash_inline(fallback, write);
            }
        };
        let mut allocated = 1;
        let mut cur = String::with_capacity(PIPELINE_CHUNK + 4096);
        // Set if the hashing thread went away (it only could by panicking); the
        // join below then reports it.
        let mut lost = false;
        write(&mut cur, &mut |c: &mut String| {
            if c.len() < PIPELINE_CHUNK || lost {
                return;
            }
            let next = match empty_rx.try_recv() {
                Ok(b) => b,
                Err(_) if allocated < PIPELINE_BUFFERS => {
                    allocated += 1;
                    String::with_capacity(PIPELINE_CHUNK + 4096)
                }
                Err(_) => match empty_rx.recv() {
                    Ok(b) => b,
                    Err(_) => {
                        lost = true;
                        return;
                    }
                },
            };
            let full = std::mem::replace(c, next);
            if full_tx.send(full).is_err() {
                lost = true;
            }
        });
        if !lost && !cur.is_empty() && full_tx.send(cur).is_err() {
            lost = true;
        }
        drop(full_tx);
        match hasher.join() {
            Ok(state) if !lost => state,
            // SHA-256 updates do not panic; should the thread have died anyway, its
            // panic continues here (callers behind the C ABI catch panics).
            Ok(_) => panic!("digest hashing thread stopped early"),
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `n` numbered elements, flushing after each.
    fn elements(n: usize) -> impl FnOnce(&mut String, &mut Flush<'_>) {
        move |out: &mut String, flush: &mut Flush<'_>| {
            out.push('[');
            for i in 0..n {
                if i > 0 {
                    out.push(',');
                }
                out.push_str("{\"element\":");
                out.push_str(&i.to_string());
                out.push_str(",\"padding\":\"");
                out.push_str(&"x".repeat(i % 97));
                out.push_str("\"}");
                flush(out);
            }
            out.push(']');
        }
    }

    fn whole(n: usize) -> String {
        let mut s = String::new();
        elements(n)(&mut s, &mut |_: &mut String| {});
        s
    }

    #[test]
    fn both_paths_hash_exactly_the_written_bytes() {
        for n in [0, 1, 10, 5_000, 300_000] {
            let expected = crate::model::hex_of({
                let mut h = Sha256::new();
                h.update(whole(n).as_bytes());
                h
            });
            let inline = crate::model::hex_of(hash_written(Sha256::new(), 0, elements(n)));
            let piped = crate::model::hex_of(hash_written(Sha256::new(), PIPELINE_MIN_BYTES, elements(n)));
            assert_eq!(inline, expected, "inline, {n} elements");
            assert_eq!(piped, expected, "pipelined, {n} elements");
        }
    }

    #[test]
    fn written_equals_compares_every_byte_and_the_length() {
        for n in [0, 1, 10, 5_000, 300_000] {
            let doc = whole(n);
            assert!(written_equals(doc.as_bytes(), elements(n)), "{n} elements");
            // One more byte, one less, and one changed byte in the first, a middle
            // and the last chunk: each is a difference.
            let mut longer = doc.clone().into_bytes();
            longer.push(b' ');
            assert!(!written_equals(&longer, elements(n)), "longer, {n} elements");
            assert!(!written_equals(&doc.as_bytes()[..doc.len() - 1], elements(n)), "shorter, {n} elements");
            for at in [0, doc.len() / 2, doc.len() - 1] {
                let mut changed = doc.clone().into_bytes();
                changed[at] ^= 1;
                assert!(!written_equals(&changed, elements(n)), "byte {at} of {n} elements");
            }
        }
    }

    #[test]
    fn pipelined_path_continues_a_given_state() {
        let mut start = Sha256::new();
        start.update(b"prefix");
        let got = crate::model::hex_of(hash_written(start, usize::MAX, elements(200_000)));
        let mut h = Sha256::new();
        h.update(b"prefix");
        h.update(whole(200_000).as_bytes());
        assert_eq!(got, crate::model::hex_of(h));
    }
}
