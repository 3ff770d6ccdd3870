//! Fuzz target `upload_plan`: see `mws_fuzz::upload_plan` (decode, then the round-trip properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mws_fuzz::upload_plan(data));
