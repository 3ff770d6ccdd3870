//! The fenced device: device memory the host cannot touch, for tests.
//!
//! One shared memory file is mapped twice: once `PROT_NONE` (the device's
//! addresses, what bindings carry; any host load or store through them faults) and
//! once read-write at another address, known only to the device's own engine. The
//! engine translates a device address into the private mapping, so copies through
//! [`DeviceEngine`] work while every host dereference of a device address anywhere
//! else in the process crashes it (SIGSEGV). Tests run every path with device sources
//! and targets on it to prove that no path reads or writes device memory on the host.

use super::{check_ops, CopyDirection, CopyOp, CopyTicket, DeviceEngine, DeviceStats};
use crate::error::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A test device of fixed capacity whose memory faults on any host access; its own
/// [`DeviceEngine`] implementation is the only way in. Thread-safe.
///
/// Driver calls are counted as a real driver's would be: one per copy, plus two per
/// batch (the completion event and its synchronization).
pub struct FencedDevice {
    ordinal: u32,
    /// The `PROT_NONE` mapping: device addresses.
    fenced: u64,
    /// The read-write mapping of the same pages.
    alias: u64,
    capacity: u64,
    /// Next free byte (bump allocation, 256-byte aligned).
    next: Mutex<u64>,
    /// Allocations made: device address -> length. A copy must stay inside one, as
    /// CUDA requires (a copy across two allocations, even adjacent ones, is refused).
    allocations: Mutex<std::collections::BTreeMap<u64, u64>>,
    batches: AtomicU64,
    copies: AtomicU64,
    calls: AtomicU64,
    bytes: AtomicU64,
    /// Results of submitted, not yet waited batches.
    pending: Mutex<std::collections::HashMap<u64, Result<()>>>,
    tickets: AtomicU64,
}

impl std::fmt::Debug for FencedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedDevice").field("ordinal", &self.ordinal).field("capacity", &self.capacity).finish()
    }
}

// SAFETY: the mappings are owned by the device and only reached through `&self`
// methods that translate and bounds-check every address; the counters are atomics.
unsafe impl Send for FencedDevice {}
// SAFETY: as above; copies into the private mapping follow the engine contract
// (callers do not write a batch's targets concurrently).
unsafe impl Sync for FencedDevice {}

fn os_err(what: &str) -> Error {
    Error::new(ErrorKind::Io, format!("fenced device: {what}: {}", std::io::Error::last_os_error()))
}

impl FencedDevice {
    /// A fenced device of `capacity` bytes (rounded up to whole pages) reporting
    /// `ordinal`. Errors: [`ErrorKind::Io`] when the mappings cannot be made,
    /// [`ErrorKind::InvalidArgument`] for a zero capacity.
    pub fn new(ordinal: u32, capacity: u64) -> Result<FencedDevice> {
        if capacity == 0 {
            return Err(Error::invalid("fenced device capacity must be positive"));
        }
        let page = 4096u64;
        let capacity = capacity.div_ceil(page).checked_mul(page).ok_or_else(|| Error::invalid("capacity overflows"))?;
        let len = usize::try_from(capacity).map_err(|_| Error::invalid("capacity overflows"))?;
        // SAFETY: plain system calls on a file descriptor this function owns; the
        // mappings are checked for failure and unmapped in `Drop`.
        unsafe {
            let fd = libc::memfd_create(c"mws-fenced-device".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(os_err("memfd_create"));
            }
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = os_err("ftruncate");
                libc::close(fd);
                return Err(e);
            }
            let fenced = libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_SHARED, fd, 0);
            if fenced == libc::MAP_FAILED {
                let e = os_err("mmap");
                libc::close(fd);
                return Err(e);
            }
            let alias =
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            libc::close(fd);
            if alias == libc::MAP_FAILED {
                let e = os_err("mmap");
                libc::munmap(fenced, len);
                return Err(e);
            }
            Ok(FencedDevice {
                ordinal,
                fenced: fenced as u64,
                alias: alias as u64,
                capacity,
                next: Mutex::new(0),
                allocations: Mutex::new(Default::default()),
                batches: AtomicU64::new(0),
                copies: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                pending: Mutex::new(Default::default()),
                tickets: AtomicU64::new(1),
            })
        }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Total bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// `len` bytes of device memory (256-byte aligned, zeroed, never reused): its
    /// device address. [`ErrorKind::LimitExceeded`] when the device is full.
    pub fn alloc(&self, len: u64) -> Result<u64> {
        let mut next = self.next.lock();
        let start = next.div_ceil(256) * 256;
        match start.checked_add(len.max(1)) {
            Some(end) if end <= self.capacity => {
                *next = end;
                self.allocations.lock().insert(self.fenced + start, len.max(1));
                Ok(self.fenced + start)
            }
            _ => Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "fenced device {} is full: {len} bytes asked, {} left",
                    self.ordinal,
                    self.capacity - start.min(self.capacity)
                ),
            )),
        }
    }

    /// True when `[address, address + len)` is device memory of this device.
    pub fn contains(&self, address: u64, len: u64) -> bool {
        address >= self.fenced && address.checked_add(len).is_some_and(|e| e <= self.fenced + self.capacity)
    }

    /// The private read-write address of device bytes, or an error naming the range
    /// (outside the device, or not inside one allocation).
    fn translate(&self, address: u64, len: u64) -> Result<u64> {
        let allocations = self.allocations.lock();
        let inside = allocations
            .range(..=address)
            .next_back()
            .is_some_and(|(&a, &n)| address.checked_add(len).is_some_and(|e| e <= a + n));
        if self.contains(address, len) && inside {
            Ok(self.alias + (address - self.fenced))
        } else {
            Err(Error::invalid(format!(
                "fenced device {}: {len} bytes at {address:#x} are not inside one allocation of this device",
                self.ordinal
            )))
        }
    }

    /// The two private addresses of one row.
    fn row(&self, direction: CopyDirection, source: u64, target: u64, len: u64) -> Result<(u64, u64)> {
        let s = if direction.source_is_device() { self.translate(source, len)? } else { self.host(source, len)? };
        let t = if direction.target_is_device() { self.translate(target, len)? } else { self.host(target, len)? };
        Ok((s, t))
    }

    /// A host address, refused when it is device memory (a host side that names the
    /// device is a mislabelled binding).
    fn host(&self, address: u64, len: u64) -> Result<u64> {
        let end = address.checked_add(len).ok_or_else(|| Error::invalid("host range overflows"))?;
        if address < self.fenced + self.capacity && end > self.fenced {
            return Err(Error::invalid(format!(
                "fenced device {}: a host side of a copy names device memory at {address:#x}",
                self.ordinal
            )));
        }
        Ok(address)
    }

    /// Runs one batch now (the copies are made at submission).
    fn run(&self, direction: CopyDirection, ops: &[CopyOp]) -> Result<()> {
        check_ops(ops)?;
        // Check every copy before the first byte moves: each side's whole extent (first
        // row to last) inside one allocation of its memory.
        for op in ops {
            let (s_len, t_len) =
                (op.source_end().unwrap_or(u64::MAX) - op.source, op.target_end().unwrap_or(u64::MAX) - op.target);
            if direction.source_is_device() {
                self.translate(op.source, s_len)?;
            } else {
                self.host(op.source, s_len)?;
            }
            if direction.target_is_device() {
                self.translate(op.target, t_len)?;
            } else {
                self.host(op.target, t_len)?;
            }
        }
        for op in ops {
            let mut result = Ok(());
            op.for_each_row(|s, t, n| {
                if result.is_err() {
                    return;
                }
                match self.row(direction, s, t, n) {
                    // SAFETY: both rows were checked above: device rows lie inside the
                    // private mapping, host rows are the caller's (the engine contract
                    // makes them valid for the batch); `copy` allows overlap.
                    Ok((s, t)) => unsafe { std::ptr::copy(s as *const u8, t as *mut u8, n as usize) },
                    Err(e) => result = Err(e),
                }
            });
            result?;
        }
        Ok(())
    }
}

impl Drop for FencedDevice {
    fn drop(&mut self) {
        // SAFETY: the two mappings made in `new`, of `capacity` bytes each, unmapped once.
        unsafe {
            libc::munmap(self.fenced as *mut libc::c_void, self.capacity as usize);
            libc::munmap(self.alias as *mut libc::c_void, self.capacity as usize);
        }
    }
}

impl DeviceEngine for FencedDevice {
    fn name(&self) -> String {
        format!("fenced:{}", self.ordinal)
    }

    unsafe fn submit(&self, ordinal: u32, direction: CopyDirection, ops: &[CopyOp]) -> Result<CopyTicket> {
        if ordinal != self.ordinal {
            return Err(Error::invalid(format!("fenced device {} cannot copy for device {ordinal}", self.ordinal)));
        }
        let result = self.run(direction, ops);
        if result.is_ok() {
            self.batches.fetch_add(1, Ordering::Relaxed);
            self.copies.fetch_add(ops.len() as u64, Ordering::Relaxed);
            self.calls.fetch_add(ops.len() as u64 + 1, Ordering::Relaxed);
            self.bytes.fetch_add(ops.iter().map(CopyOp::bytes).sum(), Ordering::Relaxed);
        }
        result?;
        let t = self.tickets.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(t, Ok(()));
        Ok(CopyTicket(t))
    }

    fn wait(&self, ticket: CopyTicket) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.pending
            .lock()
            .remove(&ticket.0)
            .unwrap_or_else(|| Err(Error::invalid(format!("unknown device copy ticket {}", ticket.0))))
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            batches: self.batches.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
            driver_calls: self.calls.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{copy_ranges, CopyRange};

    #[test]
    fn bytes_go_in_and_come_back_only_through_the_engine() {
        let dev = FencedDevice::new(3, 1 << 16).unwrap();
        let a = dev.alloc(1000).unwrap();
        let b = dev.alloc(1000).unwrap();
        assert_eq!(a % 256, 0);
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut back = vec![0u8; 1000];
        let r = |s: u64, t: u64| [CopyRange { source: s, target: t, len: 1000 }];
        // SAFETY: host buffers owned here; device ranges allocated above.
        unsafe {
            copy_ranges(&dev, 3, CopyDirection::HostToDevice, &r(src.as_ptr() as u64, a)).unwrap();
            copy_ranges(&dev, 3, CopyDirection::DeviceToDevice, &r(a, b)).unwrap();
            copy_ranges(&dev, 3, CopyDirection::DeviceToHost, &r(b, back.as_mut_ptr() as u64)).unwrap();
        }
        assert_eq!(back, src);
        let st = dev.stats();
        assert_eq!((st.batches, st.copies, st.driver_calls, st.bytes), (3, 3, 9, 3000));
    }

    #[test]
    fn a_host_side_naming_device_memory_or_a_device_side_outside_it_is_refused() {
        let dev = FencedDevice::new(0, 4096).unwrap();
        let a = dev.alloc(64).unwrap();
        let host = [0u8; 64];
        let op = |s: u64, t: u64| {
            [CopyOp { source: s, source_pitch: 64, target: t, target_pitch: 64, width: 64, height: 1 }]
        };
        // SAFETY: every call is refused before any byte moves.
        unsafe {
            assert!(dev.submit(0, CopyDirection::HostToDevice, &op(a, a)).is_err());
            assert!(dev
                .submit(0, CopyDirection::HostToDevice, &op(host.as_ptr() as u64, host.as_ptr() as u64))
                .is_err());
            assert!(dev.submit(1, CopyDirection::HostToDevice, &op(host.as_ptr() as u64, a)).is_err());
            assert!(dev.submit(0, CopyDirection::DeviceToDevice, &op(a, a + 8192)).is_err());
        }
        assert!(dev.alloc(1 << 20).is_err());
        assert_eq!(dev.stats().batches, 0);
    }

    #[test]
    fn a_copy_across_two_allocations_is_refused_as_cuda_does() {
        let dev = FencedDevice::new(0, 1 << 16).unwrap();
        let a = dev.alloc(256).unwrap();
        let b = dev.alloc(256).unwrap();
        assert_eq!(b, a + 256, "adjacent allocations");
        let host = [7u8; 512];
        let one = |len: u64| {
            [CopyOp {
                source: host.as_ptr() as u64,
                source_pitch: len,
                target: a,
                target_pitch: len,
                width: len,
                height: 1,
            }]
        };
        // SAFETY: host bytes owned here; device memory allocated above.
        unsafe {
            let t = dev.submit(0, CopyDirection::HostToDevice, &one(256)).unwrap();
            dev.wait(t).unwrap();
            let e = dev.submit(0, CopyDirection::HostToDevice, &one(512)).unwrap_err();
            assert!(e.message().contains("not inside one allocation"), "{e}");
            // copy_ranges copies such a batch range by range after the merged copy fails.
            let two = [
                CopyRange { source: host.as_ptr() as u64, target: a, len: 256 },
                CopyRange { source: host.as_ptr() as u64 + 256, target: b, len: 256 },
            ];
            assert_eq!(copy_ranges(&dev, 0, CopyDirection::HostToDevice, &two).unwrap(), 2);
            let rows = [CopyOp {
                source: host.as_ptr() as u64,
                source_pitch: 16,
                target: a + 128,
                target_pitch: 256,
                width: 16,
                height: 2,
            }];
            assert!(dev.submit(0, CopyDirection::HostToDevice, &rows).is_err(), "rows in two allocations");
        }
    }

    #[test]
    fn a_host_read_of_device_memory_faults() {
        // The fence itself: reading a device address on the host must crash. Run in a
        // child process so the test process survives.
        let dev = FencedDevice::new(0, 4096).unwrap();
        let a = dev.alloc(8).unwrap();
        // SAFETY: fork in a test; the child only reads (and faults) or exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: deliberately invalid: this read must fault.
            let v = unsafe { std::ptr::read_volatile(a as *const u8) };
            // SAFETY: exit without unwinding into the test harness.
            unsafe { libc::_exit(i32::from(v) + 10) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "the read did not fault: status {status}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    }
}
