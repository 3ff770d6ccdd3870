//! Strided reads of the embedded stores into one destination view are copied merged
//! by destination offset (several regions assembling one target): every read keeps
//! its own result, the bytes equal a region-by-region copy, a failing read writes
//! nothing and does not stop the others, and the batch size query matches the
//! single one.

use std::sync::atomic::{AtomicUsize, Ordering};

use mooncake_weight_store::runtime::MemoryRegion;
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::store::{ObjectStore, RecordType, StridedRead, WriteConfig};
use mooncake_weight_store::{ErrorKind, MemoryKind};

struct TempDir(std::path::PathBuf);
impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "mws-merged-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn object(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

const ROWS: u64 = 64;
/// A target of ROWS rows of 4 column blocks; block `j` of every row comes from
/// object `j` (rows of `W[j]` bytes, stored contiguously).
const W: [u64; 4] = [512, 300, 1024, 8];

fn put_objects(store: &dyn ObjectStore) {
    let cfg = WriteConfig { group_ids: &["g".to_string()], record_type: RecordType::Payload };
    for (j, w) in W.iter().enumerate() {
        store.put(&format!("g/payload/t/o{j}"), &object(j as u8, (ROWS * w) as usize + 64), &cfg).unwrap();
    }
}

/// Reads: object j (offset 64: a page-unaligned start) into column block j.
fn reads<'a>(
    keys: &'a [String],
    dest: MemoryRegion,
    counts: &'a [u64],
    src: &'a [[u64; 1]; 4],
    dst: &'a [u64],
) -> Vec<StridedRead<'a>> {
    (0..4)
        .map(|j| StridedRead {
            key: &keys[j],
            object_offset: 64,
            dest,
            dest_offset: W[..j].iter().sum(),
            inner_bytes: W[j],
            counts,
            src_strides: &src[j],
            dst_strides: dst,
        })
        .collect()
}

fn expected(missing: Option<usize>) -> Vec<u8> {
    let row: u64 = W.iter().sum();
    let mut out = vec![0xA5u8; (ROWS * row) as usize];
    for (j, w) in W.iter().enumerate() {
        if Some(j) == missing {
            continue;
        }
        let o = object(j as u8, (ROWS * w) as usize + 64);
        let col: u64 = W[..j].iter().sum();
        for r in 0..ROWS {
            let d = (r * row + col) as usize;
            let s = (64 + r * w) as usize;
            out[d..d + *w as usize].copy_from_slice(&o[s..s + *w as usize]);
        }
    }
    out
}

fn check(store: &dyn ObjectStore) {
    put_objects(store);
    let row: u64 = W.iter().sum();
    let mut keys: Vec<String> = (0..4).map(|j| format!("g/payload/t/o{j}")).collect();
    let counts = [ROWS];
    let src = [[W[0]], [W[1]], [W[2]], [W[3]]];
    let dst_strides = [row];
    // All four merged into one view.
    let mut buf = vec![0xA5u8; (ROWS * row) as usize];
    let dest = MemoryRegion { address: buf.as_mut_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
    let rs = reads(&keys, dest, &counts, &src, &dst_strides);
    // SAFETY: `buf` is ours and outlives the call.
    let results = unsafe { store.get_into_strided(&rs) };
    for (j, r) in results.iter().enumerate() {
        assert_eq!(*r.as_ref().unwrap(), ROWS * W[j]);
    }
    assert_eq!(buf, expected(None));
    // One missing object: its read fails alone, writes nothing; the others land.
    keys[2] = "g/payload/t/missing".into();
    let mut buf = vec![0xA5u8; (ROWS * row) as usize];
    let dest = MemoryRegion { address: buf.as_mut_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
    let rs = reads(&keys, dest, &counts, &src, &dst_strides);
    // SAFETY: as above.
    let results = unsafe { store.get_into_strided(&rs) };
    assert_eq!(results[2].as_ref().unwrap_err().kind(), ErrorKind::NotFound);
    for j in [0, 1, 3] {
        assert_eq!(*results[j].as_ref().unwrap(), ROWS * W[j]);
    }
    assert_eq!(buf, expected(Some(2)));
    // A read beyond its object fails alone (Integrity), the others land.
    keys[2] = "g/payload/t/o2".into();
    let long = [ROWS + 1];
    let mut buf = vec![0xA5u8; ((ROWS + 1) * row) as usize];
    let dest = MemoryRegion { address: buf.as_mut_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
    let mut rs = reads(&keys, dest, &counts, &src, &dst_strides);
    rs[1].counts = &long;
    // SAFETY: as above.
    let results = unsafe { store.get_into_strided(&rs) };
    assert_eq!(results[1].as_ref().unwrap_err().kind(), ErrorKind::Integrity);
    let mut want = expected(Some(1));
    want.extend(std::iter::repeat_n(0xA5u8, row as usize));
    assert_eq!(buf, want);
}

#[test]
fn memory_store_merges_reads_of_one_view() {
    check(&MemoryStore::new());
}

#[test]
fn directory_store_merges_reads_of_one_view() {
    let d = TempDir::new();
    let store = DirectoryStore::open(&d.0).unwrap();
    check(&store);
    // One thread gives the same bytes.
    store.set_max_threads(1);
    let d2 = TempDir::new();
    check(&DirectoryStore::open(&d2.0).unwrap());
}

/// A long single-segment read (mapped, not `pread`) beyond its object fails with the
/// error of a ranged read, and writes nothing.
#[test]
fn directory_long_single_segment_beyond_object_is_a_range_error() {
    let d = TempDir::new();
    let store = DirectoryStore::open(&d.0).unwrap();
    let cfg = WriteConfig { group_ids: &["g".to_string()], record_type: RecordType::Payload };
    store.put("g/big", &object(1, 300 << 10), &cfg).unwrap();
    let mut buf = vec![0xA5u8; 400 << 10];
    let dest = MemoryRegion { address: buf.as_mut_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
    let read = |off: u64, n: u64| StridedRead {
        key: "g/big",
        object_offset: off,
        dest,
        dest_offset: 0,
        inner_bytes: n,
        counts: &[],
        src_strides: &[],
        dst_strides: &[],
    };
    // SAFETY: `buf` is ours and outlives the call.
    let r = unsafe { store.get_into_strided(&[read(4096, 300 << 10)]) };
    let e = r[0].as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity);
    assert!(e.message().contains("beyond the end of g/big"), "{e}");
    assert!(buf.iter().all(|&b| b == 0xA5));
    // SAFETY: as above.
    let r = unsafe { store.get_into_strided(&[read(100, 200 << 10)]) };
    assert_eq!(*r[0].as_ref().unwrap(), 200 << 10);
    assert_eq!(&buf[..200 << 10], &object(1, 300 << 10)[100..100 + (200 << 10)]);
}

#[test]
fn batch_object_sizes_match_single_queries() {
    let d = TempDir::new();
    let dir = DirectoryStore::open(&d.0).unwrap();
    let mem = MemoryStore::new();
    let stores: [&dyn ObjectStore; 2] = [&dir, &mem];
    for store in stores {
        put_objects(store);
        let keys = ["g/payload/t/o0", "g/payload/t/o1", "g/payload/t/nope", "g/other/o0", "g/payload/t/o3", "../x"];
        let batch = store.object_sizes(&keys);
        assert_eq!(batch.len(), keys.len());
        for (k, b) in keys.iter().zip(batch) {
            match (store.object_size(k), b) {
                (Ok(a), Ok(b)) => assert_eq!(a, b),
                (Err(a), Err(b)) => assert_eq!((a.kind(), a.message()), (b.kind(), b.message())),
                (a, b) => panic!("{k}: {a:?} vs {b:?}"),
            }
        }
    }
}
