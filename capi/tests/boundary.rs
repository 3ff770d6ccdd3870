//! The boundary: status values stable and named, the header's version macros equal
//! to the crate's version, panics caught and reported, error kinds mapped 1:1.

use crate::boundary::*;
use mws::ErrorKind;
use std::ffi::{c_int, CStr};

fn header() -> &'static str {
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../include/mooncake_weight_store.h"))
}

fn header_macro(name: &str) -> u64 {
    let prefix = format!("#define {name} ");
    let line =
        header().lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} missing from the header"));
    line[prefix.len()..].trim().parse().expect("numeric macro")
}

#[test]
fn header_version_macros_match_cargo_version() {
    let major: u64 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u64 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let patch: u64 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
    assert_eq!(header_macro("MWS_VERSION_MAJOR"), major);
    assert_eq!(header_macro("MWS_VERSION_MINOR"), minor);
    assert_eq!(header_macro("MWS_VERSION_PATCH"), patch);
    // SAFETY: `mws_version` returns a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(mws_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn status_values_are_stable_and_named() {
    for (i, s) in mws_status::ALL.iter().enumerate() {
        assert_eq!(*s as usize, i);
        // SAFETY: `mws_status_name` never returns NULL and its names are static and NUL-terminated.
        let name = unsafe { CStr::from_ptr(mws_status_name(*s as c_int)) };
        assert_eq!(name, s.name());
        assert!(header().contains(&format!("{} = {i},", name.to_str().unwrap())));
    }
    // SAFETY: as above.
    let unknown = unsafe { CStr::from_ptr(mws_status_name(-7)) };
    assert_eq!(unknown.to_str().unwrap(), "MWS_UNKNOWN_STATUS");
}

#[test]
fn panic_is_caught_and_reported() {
    assert_eq!(mws_test_panic(), mws_status::MWS_PANIC);
    // SAFETY: `mws_last_error_message` never returns NULL; the message lives until the next call on this thread.
    let msg = unsafe { CStr::from_ptr(mws_last_error_message()) };
    assert!(msg.to_str().unwrap().contains("mws_test_panic"));
}

#[test]
fn error_kinds_map_one_to_one() {
    use std::collections::HashSet;
    let kinds = ErrorKind::ALL;
    let statuses: HashSet<_> = kinds.iter().map(|k| mws_status::from_kind(*k)).collect();
    assert_eq!(statuses.len(), kinds.len());
    for &k in kinds {
        let s = mws_status::from_kind(k);
        assert_eq!(s as i32, k.status_code());
        assert!(!matches!(
            s,
            mws_status::MWS_OK | mws_status::MWS_NULL_ARGUMENT | mws_status::MWS_PANIC | mws_status::MWS_INVALID_UTF8
        ));
        // Status names are the kind names, upper-cased.
        assert_eq!(s.name().to_str().unwrap(), format!("MWS_{}", k.name().to_uppercase()));
    }
}

#[test]
fn header_preamble_lists_every_handle() {
    let h = header();
    let start = h.find(" *  - Handles (").expect("the preamble's handle list");
    let list = &h[start..start + h[start..].find(')').unwrap()];
    let handles: Vec<&str> = h
        .lines()
        .filter_map(|l| l.strip_prefix("typedef struct "))
        .filter_map(|l| l.split_once(' ').filter(|(a, b)| b.trim_end_matches(';') == *a).map(|(a, _)| a))
        .collect();
    assert!(handles.len() >= 15, "{handles:?}");
    for name in handles {
        assert!(list.contains(name), "the header's preamble does not list the handle {name}");
    }
}

/// The C enums whose values the C ABI takes from the core's own numbering
/// (`GuardRelease as u32`, `TerminalState::code`) number their variants alike.
#[test]
fn core_numberings_match_the_c_enums() {
    use crate::{mws_guard_release as g, mws_terminal_state as t};
    use mws::protocol::guards::TerminalState;
    use mws::protocol::transfer::GuardRelease;
    let releases = [
        (GuardRelease::NotPinned, g::MWS_GUARD_NOT_PINNED),
        (GuardRelease::Completed, g::MWS_GUARD_COMPLETED),
        (GuardRelease::FailedDrained, g::MWS_GUARD_FAILED_DRAINED),
        (GuardRelease::Aborted, g::MWS_GUARD_ABORTED),
        (GuardRelease::Pending, g::MWS_GUARD_PENDING),
        (GuardRelease::ReleaseFailed, g::MWS_GUARD_RELEASE_FAILED),
    ];
    for (core, c) in releases {
        assert_eq!(core as u32, c as u32, "{core:?}");
    }
    let states = [
        (TerminalState::Aborted, t::MWS_TERMINAL_ABORTED),
        (TerminalState::Completed, t::MWS_TERMINAL_COMPLETED),
        (TerminalState::FailedDrained, t::MWS_TERMINAL_FAILED_DRAINED),
    ];
    for (core, c) in states {
        assert_eq!(core.code(), c as u32, "{core:?}");
        assert_eq!(TerminalState::from_code(c as u32).unwrap(), core);
    }
}
