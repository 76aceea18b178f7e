//! Fuzzes the IDX (MNIST) parser: `parse_idx` must return `Ok` or `Err`, never panic, and an
//! `Ok` array must hold exactly `product(dims)` bytes.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = pathkernel::data::parse_idx(data, Path::new("fuzz.idx")) {
        assert!((1..=4).contains(&a.dims.len()), "Ok with {} dims", a.dims.len());
        let n = a.dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d));
        assert_eq!(n, Some(a.data.len()), "Ok with dims {:?} but {} data bytes", a.dims, a.data.len());
    }
});
