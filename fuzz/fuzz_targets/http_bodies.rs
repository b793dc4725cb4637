#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kraft::fuzzing::http_bodies(data));
