//! Shared by the fuzz targets: an opt-in triage mode that lets a campaign continue past panics
//! already reported.
//!
//! By default every panic aborts (libfuzzer-sys's hook) and libFuzzer saves the input under
//! `artifacts/<target>/`. With `PATHKERNEL_FUZZ_IGNORE="src/model/mod.rs:235,accum.rs:204"` (a
//! comma-separated list of substrings of a panic's `file:line:col` location), panics at those
//! locations are swallowed instead (the input counts as uninteresting), so the fuzzer can look for
//! *other* bugs; any other panic still aborts. Never set it for a final campaign.

use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

fn ignore_list() -> &'static [String] {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    LIST.get_or_init(|| {
        let list: Vec<String> = std::env::var("PATHKERNEL_FUZZ_IGNORE")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if !list.is_empty() {
            eprintln!("PATHKERNEL_FUZZ_IGNORE: ignoring panics at {list:?}");
            let previous = panic::take_hook();
            panic::set_hook(Box::new(move |info| {
                let at = info.location().map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column())).unwrap_or_default();
                if ignore_list().iter().any(|s| at.contains(s.as_str())) {
                    return; // unwinds to `guarded`, which drops the input
                }
                previous(info); // libfuzzer-sys's hook: print and abort
            }));
        }
        list
    })
}

/// Runs `f`; in triage mode a panic at an ignored location returns `None` instead of aborting.
pub fn guarded<R>(f: impl FnOnce() -> R) -> Option<R> {
    if ignore_list().is_empty() {
        return Some(f());
    }
    panic::catch_unwind(AssertUnwindSafe(f)).ok()
}
