//! Fuzz target `receipts`: see `mws_fuzz::receipts` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::receipts(data));
