//! Fuzz target `manifest`: see `mws_fuzz::manifest` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::manifest(data));
