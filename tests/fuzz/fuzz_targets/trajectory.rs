#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = pathkernel::data::parse_idx(data, Path::new("fuzz.idx"));
});
