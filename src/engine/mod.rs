//! The transfer-engine contract (`live-transfer.md` §4, `docs/mooncake/TRANSFER-ENGINE.md`):
//! what the live-transfer executors of [`crate::protocol::transfer`] call to move
//! bytes between registered memory of running instances. The engine layer knows
//! memory regions, endpoints and bytes; nothing about models or plans.
//!
//! * [`TransferEngine`]: register / unregister memory, synchronous batch read and
//!   write (the published wheel's legacy API), optional ticketed submission with
//!   status and drain, and an engine identity.
//! * [`TransferBatch`] / [`TransferBatchRange`]: validated batches (`live-transfer.md`
//!   §6.2), built by the executors.
//! * [`local::LocalEngine`]: the embedded engine (memcpy between memory registered
//!   in one process).
//!
//! A C process plugs in its own engine (for example Mooncake's `TransferEngine`)
//! through `mws_transfer_engine_vtable` (`capi/src/callbacks/engine.rs`).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod local;

pub use crate::runtime::MemoryRegion;

/// Direction of a batch: the reader pulls (READ), the sink pushes (WRITE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Local = target, remote = source.
    Read,
    /// Local = source, remote = target.
    Write,
}

impl Direction {
    /// `READ` or `WRITE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Read => "READ",
            Direction::Write => "WRITE",
        }
    }
}

/// A ticket's completion status (`live-transfer.md` §4).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CompletionStatus {
    /// Every operation of the batch finished successfully.
    Completed,
    /// The batch failed and no operation can still touch memory.
    FailedDrained,
    /// The engine cannot tell yet; DMA may still touch memory.
    CompletionUnknown,
    /// Any other terminal status name (treated as a known failure).
    Other(String),
}

impl CompletionStatus {
    /// `COMPLETED`, `FAILED_DRAINED`, `COMPLETION_UNKNOWN` or the other name.
    pub fn name(&self) -> &str {
        match self {
            CompletionStatus::Completed => "COMPLETED",
            CompletionStatus::FailedDrained => "FAILED_DRAINED",
            CompletionStatus::CompletionUnknown => "COMPLETION_UNKNOWN",
            CompletionStatus::Other(s) => s,
        }
    }
    /// Integer statuses: 0 / -1 / -2 -> completed / failed-drained / unknown;
    /// any other value is `Other("<value>")`.
    pub fn from_code(code: i32) -> Self {
        match code {
            0 => CompletionStatus::Completed,
            -1 => CompletionStatus::FailedDrained,
            -2 => CompletionStatus::CompletionUnknown,
            other => CompletionStatus::Other(other.to_string()),
        }
    }
}

/// An engine call that did not return a status: it failed (the reference's
/// "raises"), or it was interrupted (cancellation; the reference's
/// `KeyboardInterrupt`/`SystemExit`, `live-transfer.md` §12.1 Note).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineCallError {
    /// What happened (never an address).
    pub message: String,
    /// True for an interruption rather than a failure.
    pub interrupted: bool,
}

impl EngineCallError {
    /// A failure.
    pub fn failed(message: impl Into<String>) -> Self {
        EngineCallError { message: message.into(), interrupted: false }
    }
    /// An interruption.
    pub fn interrupted(message: impl Into<String>) -> Self {
        EngineCallError { message: message.into(), interrupted: true }
    }
}

impl std::fmt::Display for EngineCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Result of an engine call that returns a status code (0 = ok).
pub type EngineResult<T> = std::result::Result<T, EngineCallError>;

/// A handle on one submitted batch (ticketed submission). Thread-safe; dropped
/// when the transfer is no longer tracked.
pub trait TransferTicket: Send + Sync {
    /// The current status without waiting.
    fn status(&self) -> EngineResult<CompletionStatus>;
    /// Waits up to `timeout_ms` for a terminal status and returns the status then.
    fn drain(&self, timeout_ms: u64) -> EngineResult<CompletionStatus>;
}

/// A transfer engine (`live-transfer.md` §4). Implementations must be thread-safe
/// and must not panic; every method reports failures through its result.
pub trait TransferEngine: Send + Sync {
    /// The engine identity (> 0): two handles of one native engine report the same
    /// value, a restarted engine a new one. Every fence of the executors (pending
    /// transfers, active submissions) is keyed by it.
    fn identity(&self) -> std::result::Result<u64, String>;

    /// Registers `region` (a whole allocation) for transfers; returns 0 on success
    /// or a non-zero engine code.
    ///
    /// # Safety
    /// `region` must stay valid for reads and writes (of its memory kind) until it
    /// is unregistered: engines may move bytes into and out of it at any time.
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32>;

    /// Unregisters the region registered at `address`; returns 0 or a code.
    fn unregister_memory(&self, address: u64) -> EngineResult<i32>;

    /// Legacy synchronous batch (`batch_transfer_sync_{read,write}`): returns 0 when
    /// every operation completed; any other value (or an error) leaves completion
    /// unknown.
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32>;

    /// Ticketed submission (`batch_transfer_sync_{read,write}_with_ticket`), when the
    /// engine supports it (`None` = not supported; the executors fall back to
    /// [`Self::batch_transfer_sync`]).
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let _ = batch;
        None
    }

    /// Ticketed scatter submission of the batch's ranges
    /// (`scatter_transfer_sync_{read,write}_with_ticket`: per range the local and
    /// remote allocation base and capacity, and per segment the offsets and sizes;
    /// see [`TransferBatch::local_ranges`]). Preferred over
    /// [`Self::submit_with_ticket`] when supported (`None` = not supported).
    fn submit_ranges_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let _ = batch;
        None
    }

    /// Every region registered with the engine now, whoever registered it, when the
    /// engine can list them (`None`: it cannot; the embedded engine can).
    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        None
    }

    /// Delivers a notification to the engine at `endpoint` (Mooncake's
    /// `sendNotifyByName(endpoint, {name, message})`): returns 0 once the peer
    /// acknowledged it, or a non-zero engine code. `None` = the engine cannot send
    /// notifications (the default). Used by the notify hook
    /// ([`crate::protocol::transfer::notify`]); never called with an empty endpoint.
    fn send_notify(&self, endpoint: &str, name: &str, message: &[u8]) -> Option<EngineResult<i32>> {
        let _ = (endpoint, name, message);
        None
    }

    /// The device copy engine through which the library itself reads and writes this
    /// engine's device buffers on the host (the content checksums of verified steps,
    /// the staging of delta steps: [`crate::protocol::transfer::device_bytes`]);
    /// `None` (the default): those refuse device memory (`Unsupported`). The engine's
    /// own transfers never go through it unless the engine says so (the embedded
    /// engine moves its device ranges through the one it was made with, and returns
    /// it here).
    fn device_engine(&self) -> Option<std::sync::Arc<dyn crate::device::DeviceEngine>> {
        None
    }
}

/// One range of a batch as a scatter call sees it (local and remote sides in the
/// engine's order: READ local = target, WRITE local = source).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterRange<'a> {
    /// Local allocation base.
    pub local_base: u64,
    /// Local allocation capacity.
    pub local_capacity: u64,
    /// Remote allocation base.
    pub remote_base: u64,
    /// Remote allocation capacity.
    pub remote_capacity: u64,
    /// Per segment: local offsets.
    pub local_offsets: &'a [u64],
    /// Per segment: remote offsets.
    pub remote_offsets: &'a [u64],
    /// Per segment: sizes.
    pub sizes: &'a [u64],
}

/// One operation-run of a batch (`TransferBatchRange`): segments of one region on
/// one pair of allocations, as offsets from the allocation bases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferBatchRange {
    /// Source allocation base.
    pub source_base_address: u64,
    /// Source allocation size.
    pub source_capacity: u64,
    /// Target allocation base.
    pub target_base_address: u64,
    /// Target allocation size.
    pub target_capacity: u64,
    /// Per segment: offset in the source allocation.
    pub source_offsets: Vec<u64>,
    /// Per segment: offset in the target allocation.
    pub target_offsets: Vec<u64>,
    /// Per segment: length.
    pub sizes: Vec<u64>,
}

fn contract(msg: impl Into<String>) -> crate::Error {
    crate::Error::invalid(msg)
}

impl TransferBatchRange {
    /// Checks the invariants of `live-transfer.md` §6.2 (contract errors):
    /// `transfer range <name> is invalid`, `transfer range <side> allocation
    /// overflows`, `transfer range fragments must be non-empty and aligned`,
    /// `transfer range size is invalid`, `transfer range exceeds <side> allocation bounds`.
    pub fn validate(&self) -> crate::Result<()> {
        for (name, v) in [
            ("source_base_address", self.source_base_address),
            ("source_capacity", self.source_capacity),
            ("target_base_address", self.target_base_address),
            ("target_capacity", self.target_capacity),
        ] {
            if v == 0 {
                return Err(contract(format!("transfer range {name} is invalid")));
            }
        }
        if self.source_capacity > u64::MAX - self.source_base_address {
            return Err(contract("transfer range source allocation overflows"));
        }
        if self.target_capacity > u64::MAX - self.target_base_address {
            return Err(contract("transfer range target allocation overflows"));
        }
        let n = self.sizes.len();
        if n == 0 || self.source_offsets.len() != n || self.target_offsets.len() != n {
            return Err(contract("transfer range fragments must be non-empty and aligned"));
        }
        // One branch-free pass (it vectorizes); the first failing segment is looked
        // for only when there is one.
        let (sc, tc) = (self.source_capacity, self.target_capacity);
        let segments = self.sizes.iter().zip(&self.source_offsets).zip(&self.target_offsets);
        let bad = segments.fold(false, |bad, ((&size, &so), &to)| {
            bad | (size == 0) | (so > sc) | (size > sc.wrapping_sub(so)) | (to > tc) | (size > tc.wrapping_sub(to))
        });
        if !bad {
            return Ok(());
        }
        for i in 0..n {
            let size = self.sizes[i];
            if size == 0 {
                return Err(contract("transfer range size is invalid"));
            }
            for (side, off, cap) in [("source", self.source_offsets[i], sc), ("target", self.target_offsets[i], tc)] {
                if off > cap || size > cap - off {
                    return Err(contract(format!("transfer range exceeds {side} allocation bounds")));
                }
            }
        }
        Ok(())
    }
}

/// A validated batch for one endpoint (`TransferBatch.from_ranges`): the ranges
/// and their flattened absolute addresses (base + offset), flattened on first use
/// (engines that take ranges never pay for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferBatch {
    endpoint: String,
    direction: Direction,
    ranges: Vec<TransferBatchRange>,
    flat: std::sync::OnceLock<Flat>,
    operation_count: u64,
    nbytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Flat {
    source: Vec<u64>,
    target: Vec<u64>,
    sizes: Vec<u64>,
}

impl TransferBatch {
    /// Validates `ranges` (`transfer endpoint must be a non-empty string`,
    /// `transfer batch ranges must be non-empty and aligned`, the range rules of
    /// [`TransferBatchRange::validate`]).
    pub fn from_ranges(
        endpoint: &str,
        direction: Direction,
        ranges: Vec<TransferBatchRange>,
    ) -> crate::Result<TransferBatch> {
        if endpoint.is_empty() {
            return Err(contract("transfer endpoint must be a non-empty string"));
        }
        if ranges.is_empty() {
            return Err(contract("transfer batch ranges must be non-empty and aligned"));
        }
        let mut nbytes = 0u64;
        let mut operation_count = 0u64;
        for r in &ranges {
            r.validate()?;
            operation_count += r.sizes.len() as u64;
            // Saturating, as a sum of non-negative terms: the exact sum, capped.
            let sum: u128 = r.sizes.iter().map(|&n| u128::from(n)).sum();
            nbytes = u64::try_from(u128::from(nbytes) + sum).unwrap_or(u64::MAX);
        }
        Ok(TransferBatch {
            endpoint: endpoint.to_string(),
            direction,
            ranges,
            flat: std::sync::OnceLock::new(),
            operation_count,
            nbytes,
        })
    }

    fn flat(&self) -> &Flat {
        self.flat.get_or_init(|| {
            let n = self.operation_count as usize;
            let mut f =
                Flat { source: Vec::with_capacity(n), target: Vec::with_capacity(n), sizes: Vec::with_capacity(n) };
            for r in &self.ranges {
                f.source.extend(r.source_offsets.iter().map(|o| r.source_base_address + o));
                f.target.extend(r.target_offsets.iter().map(|o| r.target_base_address + o));
                f.sizes.extend_from_slice(&r.sizes);
            }
            f
        })
    }

    /// The remote endpoint (TE segment name).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
    /// Direction.
    pub fn direction(&self) -> Direction {
        self.direction
    }
    /// The ranges.
    pub fn ranges(&self) -> &[TransferBatchRange] {
        &self.ranges
    }
    /// Absolute source addresses, one per operation.
    pub fn source_addresses(&self) -> &[u64] {
        &self.flat().source
    }
    /// Absolute target addresses, one per operation.
    pub fn target_addresses(&self) -> &[u64] {
        &self.flat().target
    }
    /// Local addresses in the engine's argument order (READ: targets, WRITE: sources).
    pub fn local_addresses(&self) -> &[u64] {
        match self.direction {
            Direction::Read => self.target_addresses(),
            Direction::Write => self.source_addresses(),
        }
    }
    /// Remote addresses (READ: sources, WRITE: targets).
    pub fn remote_addresses(&self) -> &[u64] {
        match self.direction {
            Direction::Read => self.source_addresses(),
            Direction::Write => self.target_addresses(),
        }
    }
    /// The ranges in the engine's local/remote order.
    pub fn local_ranges(&self) -> impl Iterator<Item = ScatterRange<'_>> + '_ {
        let read = self.direction == Direction::Read;
        self.ranges.iter().map(move |r| {
            let (s, t) = (
                (r.source_base_address, r.source_capacity, r.source_offsets.as_slice()),
                (r.target_base_address, r.target_capacity, r.target_offsets.as_slice()),
            );
            let (l, m) = if read { (t, s) } else { (s, t) };
            ScatterRange {
                local_base: l.0,
                local_capacity: l.1,
                remote_base: m.0,
                remote_capacity: m.1,
                local_offsets: l.2,
                remote_offsets: m.2,
                sizes: &r.sizes,
            }
        })
    }
    /// Sizes, one per operation.
    pub fn sizes(&self) -> &[u64] {
        &self.flat().sizes
    }
    /// Number of operations (`len(sizes)`).
    pub fn operation_count(&self) -> u64 {
        self.operation_count
    }
    /// Sum of sizes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
}
