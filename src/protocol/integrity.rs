//! End-to-end payload integrity (the I/O half; keys, block sums and the record's
//! format are pure, in [`crate::plan::integrity`]).
//!
//! - Upload: `SourceChecksums` computes the CRC-32C of every 1 MiB block of every
//!   host source region while its bytes are written (sources are pinned and not
//!   written during the call, so these are the bytes stored). They travel in the
//!   receipts ([`UploadReceipt::block_checksums`]).
//! - Commit: `write_record` writes the one integrity object of the transaction
//!   (create-only, metadata, in the revision's group) before the commit decision is
//!   claimed, when the store writes records ([`super::StoreLimits::write_integrity`];
//!   off: uploads compute no checksums either) and every receipt carries checksums.
//!   Abort, finalize and lost races remove it like the transaction's payloads
//!   (`removable_key`).
//! - Restore (on by default, [`super::StoreLimits::verify_integrity`]): `prepare`
//!   reads the record once per load call (none: the revision loads unverified, as
//!   the reference wrote it); the weight store keeps the last decoded record and
//!   reuses it while the bytes read are identical (`state::RecordCache`). The restore's
//!   reads are the store's checked reads ([`ObjectStore::get_into_ranges_checked`] / `get_into_strided_checked`): each
//!   returns the CRC-32C of the object bytes it delivered, as runs that never cross a
//!   1 MiB block, computed while the bytes are copied (embedded stores) or from the
//!   host destination right after the read (the contract's default, e.g. remote
//!   stores). They are collected in `Delivered`; `Verifier::check` then runs inside
//!   the pin scope: per touched block, the runs are combined (CRC-32C combine) into
//!   the block's checksum and compared with the record. A block this participant
//!   read only in part (strided reshards read parts of rows) is completed by reading
//!   just its gaps, with their checksums, or, when the store's cost model says one
//!   read of the block is cheaper than a range per gap, by reading the block again.
//!   Blocks delivered without checksums (device memory through a store that cannot
//!   sum it) or by overlapping reads are read again whole into host memory,
//!   checked, and every delivered run is checked against them. Failures are
//!   [`ErrorKind::Integrity`] and name the tensor, the stored fragment's box, the
//!   fragment id and the object (`describe`).
//! - Operators: [`verify_revision`] checks every object of a committed revision
//!   (presence, size, every block) and returns a list of problems (`mws verify`).

use super::receipt::UploadReceipt;
use super::state::{StagingPool, WeightStore};
use crate::crc::Combiner;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{StoredFragment, StoredManifest};
use crate::plan::bound_load::LoadPlan;
use crate::plan::integrity::{
    block_count, block_range, manifest_integrity_key, plan_integrity_key, IntegrityRecord, ObjectChecksums, BLOCK_BYTES,
};
use crate::plan::upload::UploadPlan;
use crate::runtime::MemoryRegion;
use crate::runtime::{MemoryKind, RuntimeFragment};
use crate::store::{ObjectStore, RangeCrc, RangeRead, RecordType, WriteConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Scratch bytes re-read per verification step (whole blocks).
const SCRATCH_BYTES: u64 = 64 << 20;

fn integrity_err(msg: String) -> Error {
    Error::new(ErrorKind::Integrity, msg)
}

/// The block checksums of a set of source fragments, computed by whichever
/// threads call [`SourceChecksums::work`]: one shared queue of 1 MiB blocks, so
/// background helpers and the calling thread (once its puts are done) split the
/// remaining work without waiting for each other.
///
/// Only host fragments are summed (device memory cannot be read without a copy:
/// its entry is `None`). Once [`cancel`](Self::cancel) is called, blocks not yet
/// started are skipped and [`finish`](Self::finish) returns `None` for every
/// fragment not complete.
pub(crate) struct SourceChecksums<'a> {
    frags: &'a [RuntimeFragment],
    /// Flat index of each fragment's first block; `usize::MAX` when not summed.
    first: Vec<usize>,
    /// `(fragment, block)` of every flat block, in fragment order.
    blocks: Vec<(u32, u32)>,
    sums: Vec<AtomicU32>,
    done: AtomicUsize,
    next: AtomicUsize,
    cancelled: AtomicBool,
}

impl<'a> SourceChecksums<'a> {
    /// The queue of every block of every host fragment of `frags`.
    ///
    /// # Safety
    /// Every host fragment's `(address, nbytes)` must be valid for reads and not
    /// written until the last [`work`](Self::work) call returns.
    pub(crate) unsafe fn new(frags: &'a [RuntimeFragment]) -> Self {
        let mut first = Vec::with_capacity(frags.len());
        let mut blocks = Vec::new();
        for (i, f) in frags.iter().enumerate() {
            let summed =
                f.memory() == MemoryKind::Host && usize::try_from(f.nbytes()).is_ok() && i <= u32::MAX as usize;
            let n = block_count(f.nbytes());
            if !summed || n > u64::from(u32::MAX) {
                first.push(usize::MAX);
                continue;
            }
            first.push(blocks.len());
            blocks.extend((0..n as u32).map(|b| (i as u32, b)));
        }
        let sums = (0..blocks.len()).map(|_| AtomicU32::new(0)).collect();
        SourceChecksums {
            frags,
            first,
            blocks,
            sums,
            done: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
        }
    }

    /// Host bytes still to sum, counted in whole blocks (each block as [`BLOCK_BYTES`];
    /// an estimate once other threads work).
    pub(crate) fn bytes(&self) -> u64 {
        self.blocks.len().saturating_sub(self.next.load(Ordering::Relaxed)) as u64 * BLOCK_BYTES
    }

    /// Sums blocks from the shared queue until it is empty or cancelled. Any number
    /// of threads may call it at once.
    pub(crate) fn work(&self) {
        while !self.cancelled.load(Ordering::Relaxed) {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(i, b)) = self.blocks.get(k) else { return };
            let f = &self.frags[i as usize];
            let (start, end) = block_range(u64::from(b), f.nbytes());
            // SAFETY: `new`'s contract: the host region `(address, nbytes)` is valid
            // for reads and unchanged while `work` runs; `[start, end)` lies inside it.
            let block = unsafe {
                std::slice::from_raw_parts((f.address() as *const u8).add(start as usize), (end - start) as usize)
            };
            self.sums[k].store(crate::crc::crc32c(block), Ordering::Relaxed);
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// Stops the queue: blocks not yet started are never summed.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// The checksums per fragment (in `frags` order), once every worker returned:
    /// `None` for device fragments and after a cancel that left blocks unsummed.
    pub(crate) fn finish(self) -> Vec<Option<Vec<u32>>> {
        let complete = self.done.load(Ordering::Acquire) == self.blocks.len();
        self.frags
            .iter()
            .zip(&self.first)
            .map(|(f, &first)| {
                (complete && first != usize::MAX).then(|| {
                    let n = block_count(f.nbytes()) as usize;
                    self.sums[first..first + n].iter().map(|s| s.load(Ordering::Relaxed)).collect()
                })
            })
            .collect()
    }
}

/// Lowers the calling thread to the idle scheduling class (Linux `SCHED_IDLE`): it
/// then runs only on CPU time no other thread wants. For background checksum
/// helpers, so that the store's own threads (woken once per object of a put) are
/// never delayed by them; the thread that waits for the helpers also works the
/// same queue, so a starved helper costs nothing but its share. Best effort: a
/// failure (or another OS) leaves the priority unchanged.
pub(crate) fn lower_to_idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler(0, ..)` changes only the calling thread; the
        // parameter struct is fully initialised (priority 0, required by SCHED_IDLE).
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}

/// The integrity record of `plan` built from `receipts`, or `None` when any
/// operation lacks checksums (or they do not match the payload's size).
fn record_of(plan: &UploadPlan, receipts: &[UploadReceipt]) -> Option<IntegrityRecord> {
    let by_fragment: BTreeMap<&str, &UploadReceipt> = receipts.iter().map(|r| (r.fragment_id.as_str(), r)).collect();
    let mut objects = BTreeMap::new();
    for o in plan.operations() {
        let t = o.target();
        let sums = by_fragment.get(t.fragment_id())?.block_checksums.as_ref()?;
        if t.object_offset() != 0 || sums.len() as u64 != block_count(t.nbytes()) {
            return None;
        }
        objects.insert(
            t.object_key().to_string(),
            ObjectChecksums { fragment_id: t.fragment_id().to_string(), nbytes: t.nbytes(), blocks: sums.clone() },
        );
    }
    Some(IntegrityRecord { plan_digest: plan.plan_digest().to_string(), objects })
}

/// How a stored revision's content compares with an upload's (a commit that lost to
/// it says which, so that a caller knows whether re-saving changed anything).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentMatch {
    /// Same tensors, same fragments, and every 1 MiB block's CRC-32C equal.
    Same,
    /// The tensors, the fragments or some block's checksum differ (the reason).
    Different(String),
    /// Not comparable (the reason: a revision without an integrity record, say).
    Unknown(String),
}

impl ContentMatch {
    /// The clause a conflict message ends with.
    pub fn clause(&self) -> String {
        match self {
            ContentMatch::Same => {
                "the stored revision has the same content (same tensors and fragments, every block's CRC-32C equal); \
                 nothing was changed"
                    .into()
            }
            ContentMatch::Different(why) => format!("the stored revision has different content ({why})"),
            ContentMatch::Unknown(why) => format!("the stored revision's content was not compared ({why})"),
        }
    }
}

/// Compares the content of `persisted` with what `plan` uploaded (`receipts` carry
/// its checksums): tensors, the fragments' tensor boxes, then the checksums of the
/// fragments' payloads read from `persisted`'s integrity record.
pub(crate) fn compare_content(
    ws: &WeightStore,
    plan: &UploadPlan,
    receipts: &[UploadReceipt],
    persisted: &StoredManifest,
) -> ContentMatch {
    let ours = plan.manifest();
    if ours.tensors() != persisted.tensors() {
        return ContentMatch::Different("other tensors".into());
    }
    // Fragments by (tensor, box): the transaction-specific fields (keys, ids) differ.
    let key = |f: &crate::model::StoredFragment| {
        (f.tensor_id().to_string(), f.global_offset().to_vec(), f.local_shape().to_vec())
    };
    let mut a: Vec<_> = ours.fragments().iter().map(|f| (key(f), f.object_key().to_string())).collect();
    let mut b: Vec<_> = persisted.fragments().iter().map(|f| (key(f), f.object_key().to_string())).collect();
    a.sort();
    b.sort();
    if a.len() != b.len() || a.iter().zip(&b).any(|(x, y)| x.0 != y.0) {
        return ContentMatch::Different("the fragments differ".into());
    }
    let Some(mine) = record_of(plan, receipts) else {
        return ContentMatch::Unknown("this upload has no checksums".into());
    };
    let theirs = match read_record(&*ws.store, persisted, ws.limits.max_metadata_bytes) {
        Ok(Some(r)) => r,
        Ok(None) => return ContentMatch::Unknown("the stored revision has no integrity record".into()),
        Err(e) => return ContentMatch::Unknown(format!("its integrity record cannot be read: {}", e.message())),
    };
    for ((k, ours_key), (_, their_key)) in a.iter().zip(&b) {
        match (mine.objects.get(ours_key), theirs.objects.get(their_key)) {
            (Some(x), Some(y)) if x.nbytes == y.nbytes && x.blocks == y.blocks => {}
            (Some(_), Some(_)) => return ContentMatch::Different(format!("the bytes of {} differ", k.0)),
            _ => return ContentMatch::Unknown(format!("no checksums for a fragment of {}", k.0)),
        }
    }
    ContentMatch::Same
}

/// Writes the transaction's integrity record (create-only) before the commit
/// decision is claimed. Nothing is written when the store's
/// [`super::StoreLimits::write_integrity`] is off or a receipt lacks checksums (the
/// revision is then unverified, like one the reference wrote). A record already
/// present with the same bytes (a retried commit) is fine; different bytes fail with
/// [`ErrorKind::Conflict`] before any decision.
pub(crate) fn write_record(ws: &WeightStore, plan: &UploadPlan, receipts: &[UploadReceipt]) -> Result<()> {
    if !ws.limits.write_integrity {
        log::info!("commit {}: no integrity record (write_integrity is off)", plan.manifest().manifest_key());
        return Ok(());
    }
    let Some(record) = record_of(plan, receipts) else {
        log::info!("commit {}: no integrity record (receipts without checksums)", plan.manifest().manifest_key());
        return Ok(());
    };
    let key = plan_integrity_key(plan);
    let bytes = record.to_json();
    let groups = [plan.manifest().group_id().to_string()];
    match ws.store.put(&key, bytes.as_bytes(), &WriteConfig { group_ids: &groups, record_type: RecordType::Metadata }) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let found = ws.store.get_limited(&key, ws.limits.max_metadata_bytes)?;
            if found == bytes.as_bytes() {
                Ok(())
            } else {
                Err(Error::new(ErrorKind::Conflict, format!("integrity record {key} exists with other checksums")))
            }
        }
        Err(e) => Err(Error::new(e.kind(), format!("integrity record put failed: {key}: {}", e.message()))),
    }
}

/// The plan's integrity key, unless `persisted` (the published manifest, if any) is
/// the revision that owns it: what abort, finalize and lost races remove.
pub(crate) fn removable_key(plan: &UploadPlan, persisted: Option<&StoredManifest>) -> Option<String> {
    let key = plan_integrity_key(plan);
    match persisted {
        Some(m) if m == plan.manifest() => None,
        Some(m) if manifest_integrity_key(m).as_deref() == Some(key.as_str()) => None,
        _ => Some(key),
    }
}

/// Reads a revision's integrity record: `Ok(None)` when it has none. Errors: a
/// record that does not decode or belongs to another revision
/// ([`ErrorKind::Integrity`]), store failures (the backend's kind).
pub fn read_record(
    store: &dyn ObjectStore,
    manifest: &StoredManifest,
    max_bytes: u64,
) -> Result<Option<IntegrityRecord>> {
    let Some(key) = manifest_integrity_key(manifest) else { return Ok(None) };
    Ok(read_record_with(store, manifest, &key, max_bytes, |key, bytes| decode_record(key, &bytes))?
        .map(|r| Arc::try_unwrap(r).unwrap_or_else(|r| (*r).clone())))
}

/// [`read_record`] of the record at `key` (the manifest's integrity key), decoding its
/// bytes with `decode` (a cache may answer).
fn read_record_with(
    store: &dyn ObjectStore,
    manifest: &StoredManifest,
    key: &str,
    max_bytes: u64,
    decode: impl FnOnce(&str, Vec<u8>) -> Result<Arc<IntegrityRecord>>,
) -> Result<Option<Arc<IntegrityRecord>>> {
    let bytes = match store.get_limited(key, max_bytes) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::new(e.kind(), format!("integrity record get failed: {key}: {}", e.message()))),
    };
    let record = decode(key, bytes)?;
    if record.plan_digest != manifest.manifest_digest() {
        return Err(integrity_err(format!("integrity record {key} belongs to another revision")));
    }
    Ok(Some(record))
}

fn decode_record(key: &str, bytes: &[u8]) -> Result<Arc<IntegrityRecord>> {
    IntegrityRecord::from_json(bytes)
        .map(Arc::new)
        .map_err(|e| integrity_err(format!("integrity record {key} is corrupt: {}", e.message())))
}

/// How integrity errors name a payload: its tensor, the stored fragment's box (offset
/// and shape in the tensor), the fragment id and the object key.
pub(crate) fn describe(f: &StoredFragment) -> String {
    format!(
        "payload of tensor {} (box offset {:?} shape {:?}, fragment {}, object {})",
        f.tensor_id(),
        f.global_offset(),
        f.local_shape(),
        f.fragment_id(),
        f.object_key()
    )
}

/// The verification state of one restore.
pub(crate) struct Verifier {
    record: Arc<IntegrityRecord>,
}

/// The verifier of a restore by `plan`, or `None` when verification is off
/// ([`super::StoreLimits::verify_integrity`]) or the revision has no record.
pub(crate) fn prepare(ws: &WeightStore, plan: &LoadPlan) -> Result<Option<Verifier>> {
    if !ws.limits.verify_integrity {
        return Ok(None);
    }
    let Some(key) = plan.integrity_key() else { return Ok(None) };
    let record = read_record_with(&*ws.store, plan.manifest(), key, ws.limits.max_metadata_bytes, |key, bytes| {
        ws.integrity_records.get_or_decode(key, bytes, decode_record)
    })?;
    if record.is_none() {
        log::info!("{} has no integrity record: restored unverified", plan.manifest().manifest_key());
    }
    Ok(record.map(|record| Verifier { record }))
}

/// Reads `[start, end)` of `key` into `buf` through the store (in `max_range`
/// pieces, one request).
fn read_span(store: &dyn ObjectStore, key: &str, start: u64, buf: &mut [u8], max_range: u64) -> Result<()> {
    let base = buf.as_mut_ptr() as u64;
    let mut reads = Vec::new();
    let mut c = 0u64;
    let len = buf.len() as u64;
    while c < len {
        let n = max_range.min(len - c);
        reads.push(RangeRead {
            key,
            object_offset: start + c,
            dest: MemoryRegion { address: base + c, len: n, kind: MemoryKind::Host },
        });
        c += n;
    }
    // SAFETY: every destination lies inside `buf`, which we own exclusively.
    let results = unsafe { store.get_into_ranges(&reads) };
    if results.len() != reads.len() {
        return Err(Error::new(ErrorKind::Store, "get_into_ranges returned invalid range count"));
    }
    for (r, res) in reads.iter().zip(results) {
        match res {
            Ok(n) if n == r.dest.len => {}
            Ok(n) => return Err(integrity_err(format!("short read of {key}: expected {}, got {n}", r.dest.len))),
            Err(e) => return Err(Error::new(e.kind(), format!("read of {key} failed: {}", e.message()))),
        }
    }
    Ok(())
}

/// The error of block `b` of a payload whose checksum is `got` where the record says
/// `want`.
fn block_mismatch(what: &str, sums: &ObjectChecksums, b: u64, got: u32, want: u32) -> Error {
    let (s, e) = block_range(b, sums.nbytes);
    integrity_err(format!(
        "{what} fails its integrity check: block {b} (bytes {s}..{e}) has CRC-32C {got:08x}, the integrity record \
         says {want:08x}"
    ))
}

fn check_blocks(what: &str, sums: &ObjectChecksums, first: u64, span_start: u64, buf: &[u8]) -> Result<()> {
    let mut b = first;
    let mut off = 0usize;
    while off < buf.len() {
        let (s, e) = block_range(b, sums.nbytes);
        let n = (e - s) as usize;
        let got = crate::crc::crc32c(&buf[off..off + n]);
        let want = sums.blocks[b as usize];
        if got != want {
            return Err(block_mismatch(what, sums, b, got, want));
        }
        debug_assert_eq!(s, span_start + off as u64);
        off += n;
        b += 1;
    }
    Ok(())
}

/// The record's checksums of `key`; `what` names the object in the error (called only
/// then: naming formats the fragment's box).
fn sums_for<'r>(record: &'r IntegrityRecord, key: &str, what: impl FnOnce() -> String) -> Result<&'r ObjectChecksums> {
    record.objects.get(key).ok_or_else(|| integrity_err(format!("{} has no entry in the integrity record", what())))
}

/// What the reads of one verified restore delivered, per object: the CRC-32C runs the
/// store's checked reads returned ([`ObjectStore::get_into_ranges_checked`]), and the
/// blocks delivered without checksums (device targets through a store that cannot sum
/// device memory), which are verified by reading them again.
#[derive(Default)]
pub(crate) struct Delivered {
    by_key: BTreeMap<String, Touched>,
}

#[derive(Default)]
struct Touched {
    runs: Vec<RangeCrc>,
    unsummed: BTreeSet<u64>,
}

impl Delivered {
    /// Records one checked read item of `key` that delivered `bytes`: its runs must
    /// cover exactly that many bytes (the store contract); without runs, the object
    /// ranges `ranges` calls back are re-read at the end.
    pub(crate) fn add(
        &mut self,
        key: &str,
        bytes: u64,
        crcs: Option<Vec<RangeCrc>>,
        ranges: impl FnOnce(&mut dyn FnMut(u64, u64)) -> Result<()>,
    ) -> Result<()> {
        if !self.by_key.contains_key(key) {
            self.by_key.insert(key.to_string(), Touched::default());
        }
        let t = self.by_key.get_mut(key).expect("inserted above");
        match crcs {
            Some(runs) => {
                let summed: u64 = runs.iter().map(|r| r.len).sum();
                if summed != bytes {
                    return Err(Error::new(
                        ErrorKind::Store,
                        format!("checked read of {key} returned checksums of {summed} bytes, it delivered {bytes}"),
                    ));
                }
                t.runs.extend(runs);
            }
            None => {
                let mut last = u64::MAX;
                ranges(&mut |start, len| {
                    if len == 0 {
                        return;
                    }
                    for b in start / BLOCK_BYTES..=(start + len - 1) / BLOCK_BYTES {
                        if b != last {
                            t.unsummed.insert(b);
                            last = b;
                        }
                    }
                })?;
            }
        }
        Ok(())
    }
}

/// What a verification did (added to the restore's statistics).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Verified {
    /// Bytes of the blocks checked against the record.
    pub(crate) bytes: u64,
    /// Bytes read only for the check: the gaps of partly read blocks and re-read blocks.
    pub(crate) extra_bytes: u64,
}

/// How one block is completed after the restore's reads.
enum Completion {
    /// Read the gaps (object ranges) between the delivered runs, with their checksums.
    Gaps(Vec<(u64, u64)>),
    /// Read the whole block again, check it, and check every delivered run against it.
    Reread,
}

/// One block to complete: the object, the block, its delivered runs (sorted).
struct Pending<'k> {
    key: &'k str,
    block: u64,
    runs: Vec<RangeCrc>,
    how: Completion,
}

/// Modeled cost of summing bytes already in memory (the re-read's checks of runs).
const CRC_BYTES_PER_SECOND: u128 = 10_000_000_000;

/// Limits of the reads the verification adds.
pub(crate) struct CheckLimits {
    pub(crate) max_range_bytes: u64,
    pub(crate) max_ranges_per_request: usize,
}

impl Verifier {
    /// Verifies what a restore delivered against the record: for every block the
    /// restore touched, the checksums of the delivered runs are combined (CRC-32C
    /// combine) into the block's checksum and compared with the record. A block only
    /// partly delivered is completed by reading just its gaps (with their checksums),
    /// or, when that costs more by the store's cost model (many short gaps through a
    /// store that pays per range), by reading the block again. Blocks delivered
    /// without checksums, or by runs that overlap, are read again and checked whole,
    /// and every delivered run is checked against the verified block.
    ///
    /// `sizes`: every object's size, as the store reported it before the reads;
    /// `names`: how errors name an object's payload ([`describe`]).
    pub(crate) fn check(
        &self,
        store: &dyn ObjectStore,
        pool: &StagingPool,
        delivered: Delivered,
        sizes: &BTreeMap<&str, u64>,
        names: &dyn Fn(&str) -> String,
        limits: &CheckLimits,
    ) -> Result<Verified> {
        let mut verified = Verified::default();
        let cost = store.cost();
        let mut combiner = Combiner::default();
        let mut pending: Vec<Pending<'_>> = Vec::new();
        let mut by_key = delivered.by_key;
        for (key, touched) in by_key.iter_mut() {
            let key = key.as_str();
            let sums = sums_for(&self.record, key, || names(key))?;
            let size = sizes.get(key).copied().unwrap_or(sums.nbytes);
            if size != sums.nbytes {
                return Err(integrity_err(format!(
                    "{} holds {size} bytes, the integrity record says {}",
                    names(key),
                    sums.nbytes
                )));
            }
            let mut runs = std::mem::take(&mut touched.runs);
            for r in &runs {
                let last = r.object_offset.checked_add(r.len).filter(|&e| r.len > 0 && e <= sums.nbytes);
                match last {
                    Some(e) if r.object_offset / BLOCK_BYTES == (e - 1) / BLOCK_BYTES => {}
                    _ => {
                        return Err(Error::new(
                            ErrorKind::Store,
                            format!(
                                "checked read of {key} returned a checksum of bytes {}..+{} that is not inside one \
                                 {BLOCK_BYTES}-byte block of the object",
                                r.object_offset, r.len
                            ),
                        ))
                    }
                }
            }
            runs.sort_unstable_by_key(|r| (r.object_offset, r.len));
            let mut blocks: BTreeMap<u64, Vec<RangeCrc>> = BTreeMap::new();
            for r in runs {
                blocks.entry(r.object_offset / BLOCK_BYTES).or_default().push(r);
            }
            for &b in &touched.unsummed {
                blocks.entry(b).or_default();
            }
            for (b, mut runs) in blocks {
                let (start, end) = block_range(b, sums.nbytes);
                verified.bytes += end - start;
                // The same bytes delivered twice (to two targets) must have the same sum.
                let mut dup = None;
                runs.dedup_by(|x, kept| {
                    let same = x.object_offset == kept.object_offset && x.len == kept.len;
                    if same && x.crc != kept.crc {
                        dup = Some(*x);
                    }
                    same
                });
                if let Some(r) = dup {
                    return Err(integrity_err(format!(
                        "{}: bytes {}..{} were delivered twice with different contents",
                        names(key),
                        r.object_offset,
                        r.object_offset + r.len
                    )));
                }
                let overlapping = runs.windows(2).any(|w| w[1].object_offset < w[0].object_offset + w[0].len);
                if touched.unsummed.contains(&b) || overlapping {
                    pending.push(Pending { key, block: b, runs, how: Completion::Reread });
                    continue;
                }
                let mut gaps = Vec::new();
                let mut at = start;
                for r in &runs {
                    if r.object_offset > at {
                        gaps.push((at, r.object_offset - at));
                    }
                    at = r.object_offset + r.len;
                }
                if at < end {
                    gaps.push((at, end - at));
                }
                if gaps.is_empty() {
                    let got = runs.iter().fold(0, |c, r| combiner.combine(c, r.crc, r.len));
                    let want = sums.blocks[b as usize];
                    if got != want {
                        return Err(block_mismatch(&names(key), sums, b, got, want));
                    }
                    continue;
                }
                let gap_bytes: u64 = gaps.iter().map(|g| g.1).sum();
                let pieces = |n: u64| n.div_ceil(limits.max_range_bytes) as u128;
                let gap_ns = gaps.iter().map(|g| pieces(g.1)).sum::<u128>() * cost.per_range_ns as u128
                    + gap_bytes as u128 * 1_000_000_000 / cost.bytes_per_second.max(1) as u128;
                let delivered_bytes = (end - start - gap_bytes) as u128;
                let reread_ns = pieces(end - start) * cost.per_range_ns as u128
                    + (end - start) as u128 * 1_000_000_000 / cost.bytes_per_second.max(1) as u128
                    + delivered_bytes * 1_000_000_000 / CRC_BYTES_PER_SECOND;
                let how = if gap_ns <= reread_ns { Completion::Gaps(gaps) } else { Completion::Reread };
                pending.push(Pending { key, block: b, runs, how });
            }
        }
        if pending.is_empty() {
            return Ok(verified);
        }
        self.complete(store, pool, &pending, names, limits, &mut combiner, &mut verified)?;
        Ok(verified)
    }

    /// Reads what `pending` blocks need (gaps or whole blocks) into a registered
    /// buffer of the weight store's staging pool (registered once per weight store
    /// and reused, like the restores' staging buffers), in batches of at most
    /// [`SCRATCH_BYTES`] and `max_ranges_per_request` ranges, and checks each block.
    #[allow(clippy::too_many_arguments)]
    fn complete(
        &self,
        store: &dyn ObjectStore,
        pool: &StagingPool,
        pending: &[Pending<'_>],
        names: &dyn Fn(&str) -> String,
        limits: &CheckLimits,
        combiner: &mut Combiner,
        verified: &mut Verified,
    ) -> Result<()> {
        // The object ranges each block reads.
        let wants = |p: &Pending<'_>| -> Vec<(u64, u64)> {
            match &p.how {
                Completion::Gaps(g) => g.clone(),
                Completion::Reread => {
                    let sums = &self.record.objects[p.key];
                    let (s, e) = block_range(p.block, sums.nbytes);
                    vec![(s, e - s)]
                }
            }
        };
        let need: u64 = pending.iter().flat_map(&wants).map(|w| w.1).sum();
        // Powers of two from 1 MiB to SCRATCH_BYTES: few sizes ever enter the pool.
        let cap = need.next_power_of_two().clamp(BLOCK_BYTES, SCRATCH_BYTES);
        let buffer = pool.take(store, cap)?;
        let region = buffer.region();
        let cap = region.len;
        let result = (|| -> Result<()> {
            let mut k = 0;
            while k < pending.len() {
                // One batch: whole blocks' wants, within the buffer and the range limit.
                let mut batch: Vec<(usize, Vec<(u64, u64)>, u64)> = Vec::new(); // (pending index, wants, offset)
                let (mut used, mut ranges) = (0u64, 0usize);
                while k < pending.len() {
                    let w = wants(&pending[k]);
                    let bytes: u64 = w.iter().map(|x| x.1).sum();
                    let n: usize = w.iter().map(|x| x.1.div_ceil(limits.max_range_bytes) as usize).sum();
                    if !batch.is_empty() && (used + bytes > cap || ranges + n > limits.max_ranges_per_request) {
                        break;
                    }
                    batch.push((k, w, used));
                    used += bytes;
                    ranges += n;
                    k += 1;
                }
                // SAFETY: the pool lent us this registered buffer alone until
                // `give_back`; every read lands inside it.
                let got = unsafe { self.read_batch(store, pending, &batch, region, limits) }?;
                verified.extra_bytes += used;
                // SAFETY: as above; the store wrote it and returned: `region.len` bytes of
                // plain heap memory, read only from here on.
                let scratch = unsafe { std::slice::from_raw_parts(region.address as *const u8, region.len as usize) };
                for ((i, w, off), crcs) in batch.iter().zip(got) {
                    let p = &pending[*i];
                    let bytes: u64 = w.iter().map(|x| x.1).sum();
                    let buf = &scratch[*off as usize..(*off + bytes) as usize];
                    self.check_completed(p, w, buf, crcs, &names(p.key), combiner)?;
                }
            }
            Ok(())
        })();
        pool.give_back(buffer);
        result
    }

    /// Reads the wants of one batch into `scratch` (each block's ranges back to back
    /// from its offset) with checked reads; returns per block the checksum of each of
    /// its wanted ranges.
    ///
    /// # Safety
    /// `scratch` is host memory registered with the store, ours alone for the call,
    /// and large enough for the batch.
    unsafe fn read_batch(
        &self,
        store: &dyn ObjectStore,
        pending: &[Pending<'_>],
        batch: &[(usize, Vec<(u64, u64)>, u64)],
        scratch: MemoryRegion,
        limits: &CheckLimits,
    ) -> Result<Vec<Vec<u32>>> {
        let base = scratch.address;
        let mut reads: Vec<RangeRead<'_>> = Vec::new();
        let mut owner: Vec<(usize, usize)> = Vec::new(); // (batch index, want index)
        for (bi, (i, wants, off)) in batch.iter().enumerate() {
            let mut at = *off;
            for (wi, &(start, len)) in wants.iter().enumerate() {
                let mut c = 0;
                while c < len {
                    let n = limits.max_range_bytes.min(len - c);
                    reads.push(RangeRead {
                        key: pending[*i].key,
                        object_offset: start + c,
                        dest: MemoryRegion { address: base + at, len: n, kind: MemoryKind::Host },
                    });
                    owner.push((bi, wi));
                    at += n;
                    c += n;
                }
            }
        }
        // SAFETY: every destination lies inside `scratch` (the caller's contract), which
        // nobody else touches during the call.
        let results = unsafe { store.get_into_ranges_checked(&reads, BLOCK_BYTES) };
        if results.len() != reads.len() {
            return Err(Error::new(ErrorKind::Store, "get_into_ranges returned invalid range count"));
        }
        let mut out: Vec<Vec<Option<u32>>> = batch.iter().map(|(_, w, _)| vec![None; w.len()]).collect();
        let mut combiner = Combiner::default();
        for ((r, res), &(bi, wi)) in reads.iter().zip(results).zip(&owner) {
            let what = || pending[batch[bi].0].key;
            let checked = match res {
                Ok(c) if c.bytes == r.dest.len => c,
                Ok(c) => {
                    return Err(integrity_err(format!(
                        "short read of {} for its integrity check: expected {}, got {}",
                        what(),
                        r.dest.len,
                        c.bytes
                    )))
                }
                Err(e) => {
                    return Err(Error::new(
                        e.kind(),
                        format!("read of {} for its integrity check failed: {}", what(), e.message()),
                    ))
                }
            };
            // The checksum of this piece: the store's runs, or the landed bytes.
            let crc = match checked.crcs {
                Some(runs) if runs.iter().map(|x| x.len).sum::<u64>() == r.dest.len => {
                    runs.iter().fold(0, |c, x| combiner.combine(c, x.crc, x.len))
                }
                _ => {
                    // SAFETY: the store filled this range of the scratch buffer (ours,
                    // this function's contract) and returned.
                    let landed =
                        unsafe { std::slice::from_raw_parts(r.dest.address as *const u8, r.dest.len as usize) };
                    crate::crc::crc32c(landed)
                }
            };
            let slot = &mut out[bi][wi];
            *slot = Some(match *slot {
                None => crc,
                Some(prev) => combiner.combine(prev, crc, r.dest.len),
            });
        }
        Ok(out.into_iter().map(|v| v.into_iter().map(|c| c.unwrap_or(0)).collect()).collect())
    }

    /// Checks one completed block: gaps and runs combined in object order, or the
    /// re-read block and every delivered run against it.
    fn check_completed(
        &self,
        p: &Pending<'_>,
        wants: &[(u64, u64)],
        buf: &[u8],
        crcs: Vec<u32>,
        what: &str,
        combiner: &mut Combiner,
    ) -> Result<()> {
        let sums = &self.record.objects[p.key];
        let want = sums.blocks[p.block as usize];
        match &p.how {
            Completion::Gaps(_) => {
                let mut pieces: Vec<(u64, u64, u32)> = p.runs.iter().map(|r| (r.object_offset, r.len, r.crc)).collect();
                pieces.extend(wants.iter().zip(&crcs).map(|(&(s, n), &c)| (s, n, c)));
                pieces.sort_unstable_by_key(|x| x.0);
                let got = pieces.iter().fold(0, |c, &(_, n, x)| combiner.combine(c, x, n));
                if got != want {
                    return Err(block_mismatch(what, sums, p.block, got, want));
                }
            }
            Completion::Reread => {
                let (start, _) = block_range(p.block, sums.nbytes);
                let got = crcs.first().copied().unwrap_or(0);
                if got != want {
                    return Err(block_mismatch(what, sums, p.block, got, want));
                }
                for r in &p.runs {
                    let at = (r.object_offset - start) as usize;
                    let local = crate::crc::crc32c(&buf[at..at + r.len as usize]);
                    if local != r.crc {
                        return Err(integrity_err(format!(
                            "{what} fails its integrity check: bytes {}..{} delivered to the target have CRC-32C \
                             {:08x}, the verified block {} holds {local:08x} there",
                            r.object_offset,
                            r.object_offset + r.len,
                            r.crc,
                            p.block
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One problem [`verify_revision`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Stored fragment id (empty for revision-wide problems).
    pub fragment_id: String,
    /// Object key concerned.
    pub object_key: String,
    /// What is wrong.
    pub message: String,
    /// The error kind (`NotFound`, `Integrity`, ...).
    pub kind: ErrorKind,
}

/// What [`verify_revision`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Objects checked.
    pub objects: usize,
    /// Bytes checked against checksums (0 without an integrity record).
    pub bytes_verified: u64,
    /// True when the revision has an integrity record.
    pub has_record: bool,
    /// Problems; empty when everything holds.
    pub problems: Vec<Problem>,
}

/// Checks every payload of `manifest`: present, exactly the size the manifest (and
/// the integrity record, when there is one) says, and every block's CRC-32C. Reads
/// each object whole in 64 MiB spans. Never fails on a bad payload: problems are
/// listed in the report; `Err` only for a record that cannot be read at all.
/// `progress(bytes_done)` is called after every span.
pub fn verify_revision(
    store: &dyn ObjectStore,
    manifest: &StoredManifest,
    max_metadata_bytes: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let record = match read_record(store, manifest, max_metadata_bytes) {
        Ok(r) => r,
        Err(e) if e.kind() == ErrorKind::Integrity => {
            report.problems.push(Problem {
                fragment_id: String::new(),
                object_key: manifest_integrity_key(manifest).unwrap_or_default(),
                message: e.message().to_string(),
                kind: e.kind(),
            });
            None
        }
        Err(e) => return Err(e),
    };
    report.has_record = record.is_some();
    let mut sizes: BTreeMap<&str, (u64, &StoredFragment)> = BTreeMap::new();
    for f in manifest.fragments() {
        let e = sizes.entry(f.object_key()).or_insert((0, f));
        e.0 = e.0.max(f.object_offset() + f.nbytes());
    }
    let mut scratch = Vec::new();
    let mut done = 0u64;
    for (key, (needed, frag)) in sizes {
        report.objects += 1;
        let fid = frag.fragment_id();
        let what = describe(frag);
        let problem = |kind, message: String| Problem {
            fragment_id: fid.to_string(),
            object_key: key.to_string(),
            message,
            kind,
        };
        let size = match store.object_size(key) {
            Ok(s) => s,
            Err(e) => {
                report.problems.push(problem(e.kind(), format!("{what}: {}", e.message())));
                continue;
            }
        };
        if size != needed {
            report
                .problems
                .push(problem(ErrorKind::Integrity, format!("{what} holds {size} bytes, the manifest says {needed}")));
            continue;
        }
        let Some(record) = &record else { continue };
        let sums = match sums_for(record, key, || what.clone()) {
            Ok(s) => s,
            Err(e) => {
                report.problems.push(problem(e.kind(), e.message().to_string()));
                continue;
            }
        };
        if sums.nbytes != size {
            report.problems.push(problem(
                ErrorKind::Integrity,
                format!("{what} holds {size} bytes, the integrity record says {}", sums.nbytes),
            ));
            continue;
        }
        let mut start = 0u64;
        while start < size {
            let end = (start + SCRATCH_BYTES).min(size);
            scratch.resize((end - start) as usize, 0);
            let r = read_span(store, key, start, &mut scratch, 64 << 20)
                .and_then(|()| check_blocks(&what, sums, start / BLOCK_BYTES, start, &scratch));
            done += end - start;
            progress(done);
            if let Err(e) = r {
                report.problems.push(problem(e.kind(), e.message().to_string()));
                break;
            }
            report.bytes_verified += end - start;
            start = end;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::integrity::block_checksums;
    use crate::runtime::RuntimeFragmentSpec;

    fn fragment(id: &str, bytes: &[u8], memory: MemoryKind) -> RuntimeFragment {
        let address = bytes.as_ptr() as u64;
        RuntimeFragment::new(RuntimeFragmentSpec {
            placement_fragment_id: id.into(),
            fragment_id: id.into(),
            address,
            nbytes: bytes.len() as u64,
            worker_id: "w".into(),
            endpoint: "e".into(),
            device: "cpu".into(),
            itemsize: 1,
            local_shape: vec![bytes.len() as u64],
            strides_bytes: vec![1],
            storage_address: address,
            storage_nbytes: bytes.len() as u64,
            storage_offset_bytes: 0,
            memory,
        })
        .unwrap()
    }

    #[test]
    fn source_checksums_from_several_threads_equal_one_pass() {
        let a: Vec<u8> = (0..(5 * BLOCK_BYTES as usize + 17)).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<u8> = (0..(BLOCK_BYTES as usize)).map(|i| (i % 13) as u8).collect();
        let c = vec![9u8; 3];
        let frags = vec![
            fragment("a", &a, MemoryKind::Host),
            fragment("dev", &b, MemoryKind::Device(0)),
            fragment("b", &b, MemoryKind::Host),
            fragment("c", &c, MemoryKind::Host),
        ];
        // SAFETY: the fragments view live, unchanged vectors for the whole test.
        let sums = unsafe { SourceChecksums::new(&frags) };
        assert_eq!(sums.bytes(), 8 * BLOCK_BYTES, "6 + 1 + 1 host blocks; the device fragment is not read");
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| sums.work());
            }
            sums.work();
        });
        assert_eq!(sums.bytes(), 0);
        let got = sums.finish();
        assert_eq!(got, vec![Some(block_checksums(&a)), None, Some(block_checksums(&b)), Some(block_checksums(&c))]);
        assert_eq!(got[0].as_ref().unwrap().len(), 6);
    }

    #[test]
    fn cancelled_source_checksums_are_never_reported() {
        let a = vec![1u8; 3 * BLOCK_BYTES as usize];
        let frags = vec![fragment("a", &a, MemoryKind::Host)];
        // SAFETY: the fragment views a live, unchanged vector for the whole test.
        let sums = unsafe { SourceChecksums::new(&frags) };
        sums.cancel();
        sums.work();
        assert_eq!(sums.finish(), vec![None]);
    }
}
