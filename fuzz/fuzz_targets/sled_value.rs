#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kraft::fuzzing::sled_value(data));
