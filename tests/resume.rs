//! Interrupted training runs resume into exactly the trajectory of an uninterrupted run.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use pathkernel::io::Table;
use pathkernel::trajectory::step_path;

fn same_run(a: &std::path::Path, b: &std::path::Path, steps: usize) {
    for s in 0..=steps {
        let fa = std::fs::read(step_path(a, s)).unwrap();
        let fb = std::fs::read(step_path(b, s)).unwrap();
        assert!(fa == fb, "step {s} differs");
    }
    assert!(!step_path(b, steps + 1).exists());
    assert_eq!(std::fs::read(a.join("manifest.json")).unwrap(), std::fs::read(b.join("manifest.json")).unwrap());
    assert_eq!(std::fs::read(a.join("dataset.safetensors")).unwrap(), std::fs::read(b.join("dataset.safetensors")).unwrap());
    assert_eq!(Table::read_parquet(&a.join("train_log.parquet")).unwrap(), Table::read_parquet(&b.join("train_log.parquet")).unwrap());
}

#[test]
fn simulated_interruption_resumes_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toy2d("[8]", "relu", 40, 0.5, 10, 6)).unwrap();
    let full = dir.path().join("full");
    let o = Command::new(bin()).args(["train", "-q", "--config"]).arg(&cfg).arg("--out").arg(&full).output().unwrap();
    assert!(o.status.success());
    // An interrupted copy: steps 0..=20 recorded, a torn file for step 21, a stray temp file, no log.
    let part = dir.path().join("cut.partial");
    std::fs::create_dir_all(part.join("trajectory")).unwrap();
    for f in ["manifest.json", "dataset.safetensors"] {
        std::fs::copy(full.join(f), part.join(f)).unwrap();
    }
    for s in 0..=20 {
        std::fs::copy(step_path(&full, s), step_path(&part, s)).unwrap();
    }
    let torn = std::fs::read(step_path(&full, 21)).unwrap();
    std::fs::write(step_path(&part, 21), &torn[..torn.len() / 3]).unwrap();
    std::fs::write(part.join("trajectory").join(".step-000022.safetensors.tmp-1"), b"junk").unwrap();
    let cut = dir.path().join("cut");
    // A plain train into the same place refuses and points at --resume.
    let o = Command::new(bin()).args(["train", "-q", "--config"]).arg(&cfg).arg("--out").arg(&cut).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));
    let o = Command::new(bin()).args(["train", "-q", "--resume"]).arg(&cut).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!part.exists());
    same_run(&full, &cut, 40);
    // Nothing left to resume now.
    let o = Command::new(bin()).args(["train", "--resume"]).arg(&cut).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to resume"));
}

#[test]
fn killed_run_resumes_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let steps = 1500;
    std::fs::write(&cfg, toy2d("[32, 16]", "tanh", steps, 0.2, 60, 20)).unwrap();
    let killed = dir.path().join("killed");
    let mut child = Command::new(bin()).args(["train", "-q", "--config"]).arg(&cfg).arg("--out").arg(&killed).spawn().unwrap();
    let part = dir.path().join("killed.partial");
    let t0 = Instant::now();
    while !step_path(&part, 30).exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "training did not start");
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let finished_early = child.try_wait().unwrap().is_some();
    child.kill().ok();
    child.wait().unwrap();
    if !finished_early {
        assert!(part.exists(), "the interrupted run's staging directory is kept");
        assert!(!killed.exists(), "no half-written run in the output directory");
        let o = Command::new(bin()).args(["train", "-q", "--resume"]).arg(&killed).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let full = dir.path().join("full");
    let o = Command::new(bin()).args(["train", "-q", "--config"]).arg(&cfg).arg("--out").arg(&full).output().unwrap();
    assert!(o.status.success());
    same_run(&full, &killed, steps);
}
