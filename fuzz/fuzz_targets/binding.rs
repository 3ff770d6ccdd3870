//! Fuzz target `binding`: see `mws_fuzz::binding` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::binding(data));
