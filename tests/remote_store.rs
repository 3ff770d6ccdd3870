//! The core's remote-store adapter (`store::remote::RemoteStore`, issue 25 item 2)
//! over a Rust `RemoteCalls` with scripted codes, no C involved: code mapping,
//! transient retries (whole calls and per batch item), contract violations, bounded
//! whole-object reads, and the registered view named by each range read. (The C
//! vtable over the same adapter is tested in `capi/tests/vtable_contract.rs`.)

use mooncake_weight_store::store::remote::{RemoteCalls, RemoteCapabilities, RemotePut, RemoteRange, RemoteStore};
use mooncake_weight_store::store::{ObjectStore, PutFrom, RangeRead, RecordType, StoreCost, WriteConfig};
use mooncake_weight_store::{ErrorKind, MemoryKind, MemoryRegion};
use parking_lot::Mutex;
use std::collections::VecDeque;

/// Scripted codes per call name (popped front; an empty script answers 0), and a log
/// of every call.
#[derive(Default)]
struct Script {
    codes: Mutex<std::collections::HashMap<&'static str, VecDeque<i64>>>,
    log: Mutex<Vec<String>>,
    object: Vec<u8>,
    reported_size: Option<i64>,
}

impl Script {
    fn with(codes: &[(&'static str, &[i64])]) -> Script {
        let s = Script::default();
        for (k, v) in codes {
            s.codes.lock().insert(k, v.iter().copied().collect());
        }
        s
    }
    fn next(&self, op: &'static str, what: String) -> i64 {
        self.log.lock().push(format!("{op} {what}"));
        self.codes.lock().get_mut(op).and_then(VecDeque::pop_front).unwrap_or(0)
    }
    fn calls(&self, op: &str) -> Vec<String> {
        self.log.lock().iter().filter(|l| l.starts_with(&format!("{op} "))).cloned().collect()
    }
}

struct Calls(std::sync::Arc<Script>);

impl RemoteCalls for Calls {
    fn put(&self, key: &str, _: &[u8], _: &str, _: RecordType) -> i64 {
        self.0.next("put", key.into())
    }
    fn upsert(&self, key: &str, _: &[u8], _: &str, _: RecordType) -> i64 {
        self.0.next("upsert", key.into())
    }
    fn get_size(&self, key: &str) -> i64 {
        let c = self.0.next("get_size", key.into());
        if c != 0 {
            return c;
        }
        self.0.reported_size.unwrap_or(self.0.object.len() as i64)
    }
    fn get_into(&self, key: &str, buf: &mut [u8]) -> i64 {
        let c = self.0.next("get_into", format!("{key} cap={}", buf.len()));
        if c != 0 {
            return c;
        }
        if self.0.object.len() > buf.len() {
            return -600;
        }
        buf[..self.0.object.len()].copy_from_slice(&self.0.object);
        self.0.object.len() as i64
    }
    fn exists(&self, key: &str) -> i64 {
        self.0.next("exists", key.into())
    }
    fn remove(&self, key: &str) -> i64 {
        self.0.next("remove", key.into())
    }
    unsafe fn batch_put_from(&self, items: &[RemotePut<'_>], _: RecordType, results: &mut [i32]) -> i32 {
        let keys: Vec<&str> = items.iter().map(|i| i.key).collect();
        let batch = self.0.next("batch_put_from", keys.join(","));
        for (i, r) in results.iter_mut().enumerate() {
            *r = self.0.next("item", keys[i].to_string()) as i32;
        }
        batch as i32
    }
    unsafe fn get_into_ranges(&self, items: &[RemoteRange<'_>], results: &mut [i64]) -> i32 {
        for (i, r) in results.iter_mut().enumerate() {
            let it = &items[i];
            let code =
                self.0.next("range", format!("{} buffer={:#x} dest={:#x}", it.key, it.buffer_address, it.dest.address));
            *r = if code != 0 { code } else { it.dest.len as i64 };
        }
        0
    }
    fn capabilities(&self) -> RemoteCapabilities {
        RemoteCapabilities { buffers: true, ..Default::default() }
    }
    fn register_buffer(&self, region: MemoryRegion) -> i64 {
        self.0.next("register", format!("{:#x}", region.address))
    }
    fn cost(&self) -> Result<Option<StoreCost>, i64> {
        Ok(Some(StoreCost { per_request_ns: 1, per_range_ns: 2, bytes_per_second: 3 }))
    }
}

fn store(script: Script) -> (std::sync::Arc<Script>, RemoteStore) {
    let s = std::sync::Arc::new(script);
    let store = RemoteStore::new(Box::new(Calls(s.clone()))).unwrap();
    (s, store)
}

fn meta() -> WriteConfig<'static> {
    WriteConfig { group_ids: &[], record_type: RecordType::Metadata }
}

#[test]
fn codes_map_to_error_kinds_and_transient_codes_are_retried() {
    let (s, st) = store(Script::with(&[("put", &[-200, -706, 0]), ("exists", &[-704])]));
    assert_eq!(st.cost(), StoreCost { per_request_ns: 1, per_range_ns: 2, bytes_per_second: 3 });
    st.put("k", b"v", &meta()).unwrap();
    assert_eq!(s.calls("put").len(), 3, "two transient codes, then success");
    let e = st.exists("k").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let (_, st) = store(Script::with(&[("put", &[-705]), ("upsert", &[-9]), ("exists", &[2]), ("remove", &[-704])]));
    assert_eq!(st.put("k", b"v", &meta()).unwrap_err().kind(), ErrorKind::AlreadyExists);
    let e = st.upsert("k", b"v", &meta()).unwrap_err();
    assert_eq!((e.kind(), e.message()), (ErrorKind::Store, "store callback upsert failed for k: error code -9"));
    let e = st.exists("k").unwrap_err();
    assert_eq!(
        e.message(),
        "store callback exists returned 2 for k, outside its contract (1 present, 0 absent or a negative error code)"
    );
    st.remove("k").unwrap();
    // A code that stays transient is final after the retries.
    let (s, st) = store(Script::with(&[("remove", &[-200; 20])]));
    assert_eq!(st.remove("k").unwrap_err().message(), "store callback remove failed for k: error code -200");
    assert_eq!(s.calls("remove").len(), 8);
}

#[test]
fn whole_object_reads_are_bounded_before_any_allocation() {
    let small = Script { object: b"manifest".to_vec(), ..Default::default() };
    let (s, st) = store(small);
    assert_eq!(st.get("m").unwrap(), b"manifest");
    assert_eq!(s.calls("get_into").len(), 1, "a small object is read in one call");
    // A reported size far beyond the bound: refused before allocating it.
    let huge = Script { object: vec![7; 300 << 10], reported_size: Some(1 << 60), ..Default::default() };
    let (_, st) = store(huge);
    let e = st.get_limited("m", 1 << 20).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
}

#[test]
fn batch_items_retry_alone_and_ranges_name_their_registered_view() {
    let script = Script::with(&[("item", &[0, -706, 0])]);
    let (s, st) = store(script);
    let buf = [0u8; 64];
    let base = buf.as_ptr() as u64;
    let region = |off: u64, len: u64| MemoryRegion { address: base + off, len, kind: MemoryKind::Host };
    let items = [PutFrom { key: "a", source: region(0, 8) }, PutFrom { key: "b", source: region(8, 8) }];
    let groups = ["g".to_string(), "g".to_string()];
    let cfg = WriteConfig { group_ids: &groups, record_type: RecordType::Payload };
    // SAFETY: the fake reads nothing; `buf` outlives the call.
    let r = unsafe { st.batch_put_from(&items, &cfg) };
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(s.calls("batch_put_from"), vec!["batch_put_from a,b", "batch_put_from b"], "only b is retried");

    st.register_buffer(region(0, 64)).unwrap();
    let reads = [RangeRead { key: "a", object_offset: 0, dest: region(16, 8) }];
    // SAFETY: the fake writes nothing.
    let r = unsafe { st.get_into_ranges(&reads) };
    assert_eq!(r[0].as_ref().unwrap(), &8);
    assert_eq!(s.calls("range"), vec![format!("range a buffer={base:#x} dest={:#x}", base + 16)]);
}
