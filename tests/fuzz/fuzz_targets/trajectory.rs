//! Fuzzes the trajectory loader: `manifest.json`, a step file and (optionally) `dataset.safetensors`.
//!
//! Input layout: `MANIFEST_JSON SEP STEP_SAFETENSORS [SEP DATASET_SAFETENSORS]` with
//! `SEP = "\n--8<--\n"` (a missing separator means the whole input is the manifest and the step
//! file is empty). Each iteration:
//!
//! 1. `SafeFile::from_bytes` on the step bytes; when it parses, every accessor (`metadata`,
//!    `names`, `shape`, `f64`, `i64`) on every tensor;
//! 2. the manifest bytes are written to `DIR/manifest.json` of a scratch run directory and read
//!    back with `trajectory::read_manifest` (serde_json into `Manifest`, then the format, version,
//!    architecture/parameter, `num_params` and learning-rate checks);
//! 3. when the manifest is accepted, the step bytes are written to
//!    `DIR/trajectory/step-000000.safetensors` and loaded with `trajectory::load_step(DIR, &m, 0)`
//!    (run id, step number, names, shapes, dtypes, finiteness); the dataset bytes, when present,
//!    are written to `DIR/dataset.safetensors` and loaded with `trajectory::read_dataset`.
//!
//! These are exactly the functions `Run::open` chains; none may panic.
#![no_main]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pathkernel::io::SafeFile;
use pathkernel::trajectory;

#[path = "common.rs"]
mod common;

const SEP: &[u8] = b"\n--8<--\n";

fn split(data: &[u8]) -> (&[u8], &[u8], Option<&[u8]>) {
    let find = |d: &[u8]| d.windows(SEP.len()).position(|w| w == SEP);
    let Some(i) = find(data) else { return (data, &[], None) };
    let (manifest, rest) = (&data[..i], &data[i + SEP.len()..]);
    match find(rest) {
        Some(j) => (manifest, &rest[..j], Some(&rest[j + SEP.len()..])),
        None => (manifest, rest, None),
    }
}

/// The scratch run directory of this process: `pathkernel-fuzz-run-PID` on the RAM disk when there
/// is one (every iteration writes up to three files), else in the temp dir. libFuzzer leaves by
/// `exit`, which drops no static, so directories of processes that are gone are removed here.
fn run_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        const PREFIX: &str = "pathkernel-fuzz-run-";
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else { continue };
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let d = base.join(format!("{PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("trajectory")).expect("scratch run directory");
        d
    })
}

fn exercise_safefile(bytes: &[u8]) {
    let Ok(f) = SafeFile::from_bytes(Path::new("fuzz.safetensors"), bytes.to_vec()) else { return };
    let _ = f.metadata();
    for name in f.names() {
        let _ = f.shape(&name);
        let _ = f.f64(&name, None);
        let _ = f.i64(&name, None);
    }
    let _ = f.f64("no such tensor", Some(&[1]));
}

fuzz_target!(|data: &[u8]| {
    common::guarded(|| one(data));
});

fn one(data: &[u8]) {
    let (manifest, step, dataset) = split(data);
    exercise_safefile(step);

    let dir = run_dir();
    std::fs::write(dir.join("manifest.json"), manifest).expect("write manifest");
    let step_file = trajectory::step_path(dir, 0);
    let dataset_file = dir.join("dataset.safetensors");
    let _ = std::fs::remove_file(&step_file);
    let _ = std::fs::remove_file(&dataset_file);

    let Ok(m) = trajectory::read_manifest(dir) else { return };
    std::fs::write(&step_file, step).expect("write step file");
    if let Ok(p) = trajectory::load_step(dir, &m, 0) {
        assert_eq!(p.specs, m.params);
    }
    // Past the last step and a missing file are errors, not panics.
    let _ = trajectory::load_step(dir, &m, m.steps.saturating_add(1));
    if let Some(ds) = dataset {
        std::fs::write(&dataset_file, ds).expect("write dataset");
        let _ = trajectory::read_dataset(&dataset_file, &m);
    }
}
