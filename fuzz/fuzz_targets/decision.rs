//! Fuzz target `decision`: see `mws_fuzz::decision` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::decision(data));
