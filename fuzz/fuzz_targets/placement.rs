//! Fuzz target `placement`: see `mws_fuzz::placement` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::placement(data));
