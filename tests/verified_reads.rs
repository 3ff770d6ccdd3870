//! Verified reads by default (issue 29): every restore checks the integrity record
//! with checksums computed while the bytes are copied (fused with the copy), on every
//! store; partly read blocks are completed by reading their gaps; integrity errors name the tensor and the
//! stored fragment's box; `verify_integrity: false` opts out. Device targets are
//! staged by the device engine and verified before they reach the device
//! (tests/device_memory.rs).

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::model::StoredManifest;
use mooncake_weight_store::plan::integrity::{manifest_integrity_key, BLOCK_BYTES};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, LoadStats, StaticGuard, StoreLimits, WeightStore};
use mooncake_weight_store::runtime::{RuntimeBindingSpec, RuntimeFragmentSpec};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::store::remote::{RemoteCalls, RemotePut, RemoteRange, RemoteStore};
use mooncake_weight_store::store::{ObjectStore, RecordType, StoreCost, WriteConfig};
use mooncake_weight_store::{ErrorKind, MemoryKind, Result, RuntimeBinding, RuntimeFragment};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const ONE: Layout = Layout { tp: 1, pp: 1, ep: 1, dp: 1 };
const TP2: Layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
const TP4: Layout = Layout { tp: 4, pp: 1, ep: 1, dp: 1 };

/// 1024 hidden, 2-byte items: objects of 1-4 MiB (several 1 MiB blocks each).
fn defs() -> Vec<TensorDef> {
    model_tensors(1, 1024, 0)
}

/// Snapshots a TP2 model into `store` through a default weight store (which verifies).
fn snapshot(store: Arc<dyn ObjectStore>) -> (WeightStore, StoredManifest) {
    let ws = WeightStore::new(store);
    assert!(ws.limits().verify_integrity, "verification is on by default");
    let src = HostModel::new(build_placement("source", TP2, &defs(), 1), true, "t", 1);
    let manifest = src.snapshot_into(&ws).unwrap();
    (ws, manifest)
}

/// The target's bindings with every fragment in memory of `memory` (device
/// "addresses" are the host buffers; the fake hook copies through them).
fn bindings_in(m: &HostModel, memory: MemoryKind) -> Vec<RuntimeBinding> {
    m.make_bindings("serving", 1)
        .into_iter()
        .map(|b| {
            let frags = b
                .fragments()
                .iter()
                .map(|f: &RuntimeFragment| {
                    RuntimeFragment::new(RuntimeFragmentSpec {
                        placement_fragment_id: f.placement_fragment_id().into(),
                        fragment_id: f.fragment_id().into(),
                        address: f.address(),
                        nbytes: f.nbytes(),
                        worker_id: f.worker_id().into(),
                        endpoint: f.endpoint().into(),
                        device: if memory == MemoryKind::Host { "cpu".into() } else { "cuda:0".into() },
                        itemsize: f.itemsize(),
                        local_shape: f.local_shape().to_vec(),
                        strides_bytes: f.strides_bytes().to_vec(),
                        storage_address: f.storage_address(),
                        storage_nbytes: f.storage_nbytes(),
                        storage_offset_bytes: f.storage_offset_bytes(),
                        memory,
                    })
                    .unwrap()
                })
                .collect();
            RuntimeBinding::new(RuntimeBindingSpec {
                resource_id: b.resource_id().into(),
                placement_id: b.placement_id().into(),
                placement_digest: b.placement_digest().into(),
                instance_id: b.instance_id().into(),
                lease_generation: b.lease_generation(),
                lease_id: b.lease_id().into(),
                revision: b.revision().into(),
                participant_id: b.participant_id().into(),
                fragments: frags,
            })
            .unwrap()
        })
        .collect()
}

/// Restores `manifest` into `target` (only the first `parts` participants when
/// given), with targets in `memory`. Returns the summed statistics and the target
/// (its buffers hold what was restored).
fn restore(
    ws: &WeightStore,
    manifest: &StoredManifest,
    target: Layout,
    parts: Option<usize>,
    memory: MemoryKind,
) -> Result<(LoadStats, HostModel)> {
    let manifest = Arc::new(ws.load_manifest(manifest.manifest_key())?);
    let mut dst = HostModel::new(build_placement("target", target, &defs(), 1), false, "serving", 1);
    dst.bindings = bindings_in(&dst, memory);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default())?;
    let mut total = LoadStats::default();
    for b in dst.bindings.iter().take(parts.unwrap_or(usize::MAX)) {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        let s = unsafe { ws.load(&plan, b, args) }?;
        total.bytes += s.bytes;
        total.verified_bytes += s.verified_bytes;
        total.verify_read_bytes += s.verify_read_bytes;
    }
    Ok((total, dst))
}

fn fragment<'a>(m: &'a StoredManifest, tensor: &str) -> &'a mooncake_weight_store::model::StoredFragment {
    m.fragments().iter().find(|s| s.tensor_id() == tensor).unwrap()
}

/// Flips one byte of an object of a memory store (values are immutable: replaced).
fn flip_memory(store: &MemoryStore, key: &str, at: u64) {
    let mut v = store.get(key).unwrap();
    v[at as usize] ^= 0x01;
    store.upsert(key, &v, &WriteConfig { group_ids: &[], record_type: RecordType::Payload }).unwrap();
}

/// Flips one byte of an object file of a directory store, in place (on purpose).
fn flip_directory(store: &DirectoryStore, key: &str, at: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let path = store.object_path(key).unwrap();
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x01]).unwrap();
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("mws-verified-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The message prefix an integrity error of `f` starts with.
fn names(f: &mooncake_weight_store::model::StoredFragment) -> String {
    format!(
        "payload of tensor {} (box offset {:?} shape {:?}, fragment {}, object {})",
        f.tensor_id(),
        f.global_offset(),
        f.local_shape(),
        f.fragment_id(),
        f.object_key()
    )
}

const UP: &str = "model.layers.0.mlp.up_proj.weight";
const O_PROJ: &str = "model.layers.0.self_attn.o_proj.weight";

#[test]
fn default_restore_from_the_memory_store_detects_a_flipped_byte() {
    assert!(StoreLimits::default().verify_integrity);
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let (stats, dst) = restore(&ws, &m, ONE, None, MemoryKind::Host).unwrap();
    dst.verify().unwrap();
    let stored: u64 = m.fragments().iter().map(|f| f.nbytes()).sum();
    assert_eq!(stats.verified_bytes, stored, "every stored block checked");
    assert_eq!(stats.verify_read_bytes, 0, "whole objects read: nothing read again");
    let frag = fragment(&m, UP).clone();
    flip_memory(&mem, frag.object_key(), 3 * BLOCK_BYTES / 2 + 5);
    let e = restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
    assert!(e.message().contains("fails its integrity check: block 1 "), "{e}");
}

#[test]
fn default_restore_from_the_directory_store_detects_a_flipped_byte() {
    let dir = TempDir::new("dir");
    let store = Arc::new(DirectoryStore::open(&dir.0).unwrap());
    let (ws, m) = snapshot(store.clone());
    restore(&ws, &m, ONE, None, MemoryKind::Host).unwrap().1.verify().unwrap();
    restore(&ws, &m, TP4, None, MemoryKind::Host).unwrap().1.verify().unwrap();
    let frag = fragment(&m, UP).clone();
    flip_directory(&store, frag.object_key(), frag.nbytes() - 1);
    for target in [ONE, TP2, TP4] {
        let e = restore(&ws, &m, target, None, MemoryKind::Host).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
        assert!(e.message().contains(&names(&frag)), "{e}");
    }
}

/// The whole message: tensor, box, fragment, object, block, both checksums.
#[test]
fn integrity_errors_name_the_tensor_and_its_box() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let frag = fragment(&m, O_PROJ).clone();
    assert_eq!(frag.local_shape(), [1024, 512]);
    flip_memory(&mem, frag.object_key(), 5);
    let e = restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap();
    let want = format!(
        "payload of tensor {O_PROJ} (box offset {:?} shape [1024, 512], fragment {}, object {}) fails its integrity \
         check: block 0 (bytes 0..1048576) has CRC-32C ",
        frag.global_offset(),
        frag.fragment_id(),
        frag.object_key()
    );
    assert!(e.message().starts_with(&want), "{e}\nwant: {want}");
    assert!(e.message().contains(", the integrity record says "), "{e}");
}

/// o_proj is split on dim 1: a TP4 target reads half of every row of a TP2 shard,
/// so each block is only partly read by one participant: its gaps are read (and
/// only them) to complete the block; a corrupted byte in a gap is found.
#[test]
fn partly_read_blocks_are_completed_by_reading_their_gaps() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    assert_eq!(mem.cost(), StoreCost::LOCAL, "gaps are cheap to read: read them, not the block");
    let (stats, _) = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).unwrap();
    assert!(stats.verify_read_bytes > 0, "{stats:?}");
    assert!(stats.verify_read_bytes < stats.verified_bytes, "only the gaps: {stats:?}");
    assert_eq!(stats.bytes + stats.verify_read_bytes, stats.verified_bytes, "gaps + delivered = blocks: {stats:?}");
    let (_, dst) = restore(&ws, &m, TP4, None, MemoryKind::Host).unwrap();
    dst.verify().unwrap();
    // A byte in the second half of row 7: target 0 never reads it.
    let frag = fragment(&m, O_PROJ).clone();
    let row = frag.local_shape()[1] * 2;
    flip_memory(&mem, frag.object_key(), 7 * row + row - 1);
    let e = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
    assert!(e.message().contains("block 0 "), "{e}");
}

#[test]
fn partly_read_blocks_of_the_directory_store_are_completed_too() {
    let dir = TempDir::new("gaps");
    let store = Arc::new(DirectoryStore::open(&dir.0).unwrap());
    let (ws, m) = snapshot(store.clone());
    let (stats, _) = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).unwrap();
    assert!(stats.verify_read_bytes > 0 && stats.verify_read_bytes < stats.verified_bytes, "{stats:?}");
    let frag = fragment(&m, O_PROJ).clone();
    let row = frag.local_shape()[1] * 2;
    flip_directory(&store, frag.object_key(), 600 * row + row - 2);
    let e = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
}

/// An in-memory remote store (Mooncake's codes, per-range reads that copy): what the
/// C vtable and the Python bridge to Mooncake Store look like to the core.
#[derive(Default)]
struct Remote {
    objects: RwLock<HashMap<String, Vec<u8>>>,
    ranges: AtomicUsize,
}

/// The calls, over a shared [`Remote`] the test keeps to corrupt objects.
struct Shared(Arc<Remote>);

impl std::ops::Deref for Shared {
    type Target = Remote;
    fn deref(&self) -> &Remote {
        &self.0
    }
}

impl RemoteCalls for Shared {
    fn put(&self, key: &str, value: &[u8], _: &str, _: RecordType) -> i64 {
        let mut o = self.objects.write();
        if o.contains_key(key) {
            return -705;
        }
        o.insert(key.into(), value.to_vec());
        0
    }
    fn upsert(&self, key: &str, value: &[u8], _: &str, _: RecordType) -> i64 {
        self.objects.write().insert(key.into(), value.to_vec());
        0
    }
    fn get_size(&self, key: &str) -> i64 {
        self.objects.read().get(key).map_or(-704, |v| v.len() as i64)
    }
    fn get_into(&self, key: &str, buf: &mut [u8]) -> i64 {
        match self.objects.read().get(key) {
            None => -704,
            Some(v) if v.len() > buf.len() => -600,
            Some(v) => {
                buf[..v.len()].copy_from_slice(v);
                v.len() as i64
            }
        }
    }
    fn exists(&self, key: &str) -> i64 {
        i64::from(self.objects.read().contains_key(key))
    }
    fn remove(&self, key: &str) -> i64 {
        self.objects.write().remove(key);
        0
    }
    unsafe fn batch_put_from(&self, items: &[RemotePut<'_>], _: RecordType, results: &mut [i32]) -> i32 {
        for (it, r) in items.iter().zip(results.iter_mut()) {
            // SAFETY: test code: the caller guarantees the sources readable.
            let v =
                unsafe { std::slice::from_raw_parts(it.source.address as usize as *const u8, it.source.len as usize) };
            *r = RemoteCalls::put(self, it.key, v, it.group_id, RecordType::Payload) as i32;
        }
        0
    }
    unsafe fn get_into_ranges(&self, items: &[RemoteRange<'_>], results: &mut [i64]) -> i32 {
        let o = self.objects.read();
        for (it, r) in items.iter().zip(results.iter_mut()) {
            self.ranges.fetch_add(1, Ordering::Relaxed);
            *r = match o.get(it.key) {
                None => -704,
                Some(v) if it.object_offset + it.dest.len > v.len() as u64 => -600,
                Some(v) => {
                    let s = &v[it.object_offset as usize..(it.object_offset + it.dest.len) as usize];
                    // SAFETY: test code: the caller guarantees the destinations writable.
                    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), it.dest.address as usize as *mut u8, s.len()) };
                    it.dest.len as i64
                }
            };
        }
        0
    }
    fn supports_memory(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::Host
    }
}

fn flip_remote(r: &Remote, key: &str, at: u64) {
    r.objects.write().get_mut(key).unwrap()[at as usize] ^= 0x01;
}

/// A remote (vtable-like) store gets the default checked reads: the staged and direct
/// reads are summed after each request; a reshard of half rows re-reads its partly
/// read blocks whole (the cost model prices every gap as a range), and a flipped byte
/// is found either way.
#[test]
fn remote_stores_verify_through_the_default_checked_reads() {
    let remote = Arc::new(Remote::default());
    let store = Arc::new(RemoteStore::new(Box::new(Shared(remote.clone()))).unwrap());
    assert_eq!(store.cost(), StoreCost::REMOTE);
    let (ws, m) = snapshot(store);
    let (stats, dst) = restore(&ws, &m, ONE, None, MemoryKind::Host).unwrap();
    dst.verify().unwrap();
    assert_eq!(stats.verify_read_bytes, 0, "{stats:?}");
    let (stats, _) = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).unwrap();
    assert!(stats.verify_read_bytes > 0, "{stats:?}");
    let before = remote.ranges.load(Ordering::Relaxed);
    restore(&ws, &m, TP4, Some(1), MemoryKind::Host).unwrap();
    let ranges = remote.ranges.load(Ordering::Relaxed) - before;
    assert!(ranges < 200, "partly read blocks cost a range each, not one per gap: {ranges}");
    let frag = fragment(&m, O_PROJ).clone();
    let row = frag.local_shape()[1] * 2;
    flip_remote(&remote, frag.object_key(), 3 * row + row - 1);
    let e = restore(&ws, &m, TP4, Some(1), MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
    let e = restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
}

#[test]
fn a_truncated_object_fails_naming_the_tensor_and_its_box() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let frag = fragment(&m, UP).clone();
    let v = mem.get(frag.object_key()).unwrap();
    let cfg = WriteConfig { group_ids: &[], record_type: RecordType::Payload };
    mem.upsert(frag.object_key(), &v[..v.len() - 1], &cfg).unwrap();
    let e = restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
    // Longer than the record says (the manifest's bounds hold): the record catches it.
    let mut longer = v.clone();
    longer.push(0);
    mem.upsert(frag.object_key(), &longer, &cfg).unwrap();
    let e = restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(
        e.message().contains(&format!("{} holds {} bytes, the integrity record says", names(&frag), v.len() + 1)),
        "{e}"
    );
}

#[test]
fn opting_out_restores_a_corrupted_payload_without_error() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let frag = fragment(&m, UP).clone();
    flip_memory(&mem, frag.object_key(), 1000);
    assert_eq!(restore(&ws, &m, ONE, None, MemoryKind::Host).err().unwrap().kind(), ErrorKind::Integrity);
    let off = WeightStore::new(mem.clone())
        .with_limits(StoreLimits { verify_integrity: false, ..StoreLimits::default() })
        .unwrap();
    let (stats, dst) = restore(&off, &m, ONE, None, MemoryKind::Host).unwrap();
    assert_eq!(stats.verified_bytes, 0);
    let e = dst.verify().unwrap_err();
    assert!(e.message().contains("target bytes differ"), "the corrupted bytes were restored: {e}");
}

/// A revision without an integrity record (the reference's, or an older one)
/// restores unverified by default.
#[test]
fn a_revision_without_a_record_restores_unverified() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    mem.remove(&manifest_integrity_key(&m).unwrap()).unwrap();
    let (stats, dst) = restore(&ws, &m, TP4, None, MemoryKind::Host).unwrap();
    dst.verify().unwrap();
    assert_eq!((stats.verified_bytes, stats.verify_read_bytes), (0, 0));
}

/// A weight store decodes a revision's integrity record once for many restores, but
/// reads it every time: a record that changed between two restores through the same
/// weight store is the one the second restore checks against (here one block
/// checksum altered: the restore fails naming it), and a record removed since leaves
/// the next restore unverified.
#[test]
fn every_restore_checks_the_record_as_it_is_now() {
    use mooncake_weight_store::plan::integrity::IntegrityRecord;
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let key = manifest_integrity_key(&m).unwrap();
    for _ in 0..2 {
        let (stats, dst) = restore(&ws, &m, TP4, None, MemoryKind::Host).unwrap();
        dst.verify().unwrap();
        assert!(stats.verified_bytes > 0);
    }
    let mut record = IntegrityRecord::from_json(&mem.get(&key).unwrap()).unwrap();
    let frag = fragment(&m, UP).clone();
    record.objects.get_mut(frag.object_key()).unwrap().blocks[1] ^= 1;
    let config = WriteConfig { group_ids: &[], record_type: RecordType::Metadata };
    mem.upsert(&key, record.to_json().as_bytes(), &config).unwrap();
    let e = restore(&ws, &m, TP4, None, MemoryKind::Host).err().expect("the altered record is checked");
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(&names(&frag)), "{e}");
    assert!(e.message().contains("fails its integrity check: block 1 "), "{e}");
    mem.remove(&key).unwrap();
    let (stats, dst) = restore(&ws, &m, TP4, None, MemoryKind::Host).unwrap();
    dst.verify().unwrap();
    assert_eq!((stats.verified_bytes, stats.verify_read_bytes), (0, 0), "no record: unverified");
}

/// A plan finds its revision's integrity key once (a restore of many participants
/// asks for it once per participant): the same key as the manifest's, and restores
/// through the plan are verified against the record stored under it.
#[test]
fn a_plan_keeps_its_revisions_integrity_key() {
    let mem = Arc::new(MemoryStore::new());
    let (ws, m) = snapshot(mem.clone());
    let manifest = Arc::new(ws.load_manifest(m.manifest_key()).unwrap());
    let mut dst = HostModel::new(build_placement("target", ONE, &defs(), 1), false, "serving", 1);
    dst.bindings = bindings_in(&dst, MemoryKind::Host);
    let plan = ws.plan_load(manifest.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let key = manifest_integrity_key(&manifest).expect("a snapshot has an integrity record");
    assert_eq!(plan.integrity_key(), Some(key.as_str()));
    assert_eq!(plan.integrity_key(), Some(key.as_str()), "the kept key is the same on later calls");
    let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: dst.buffers outlive the call and nobody else touches them.
    let st = unsafe { ws.load(&plan, &dst.bindings[0], args) }.unwrap();
    assert!(st.verified_bytes > 0, "the restore was checked against the record at that key");
    mem.remove(&key).unwrap();
    let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: as above.
    let st = unsafe { ws.load(&plan, &dst.bindings[0], args) }.unwrap();
    assert_eq!(st.verified_bytes, 0, "without the record the restore is not verified");
}
