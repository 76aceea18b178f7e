//! Training, the trajectory format, and the `train` CLI.

mod common;

use std::process::Command;

use common::*;
use pathkernel::model::net::{LossKind, Objective};
use pathkernel::trajectory::{step_path, Run};

#[test]
fn plain_forward_from_step_files_matches_dfdx() {
    let dir = tempfile::tempdir().unwrap();
    for (name, hidden, act) in [("relu2", "[16, 8]", "relu"), ("tanh1", "[12]", "tanh")] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 25, 0.5, 30, 10));
        let arch = &run.manifest.architecture;
        let labels = match &run.dataset.y_train {
            pathkernel::data::Targets::Labels(y) => y.clone(),
            _ => unreachable!(),
        };
        let init = run.load_step(0).unwrap();
        let obj = Objective::new(dfdx::tensor::Cpu::default(), arch, &run.dataset.x_train, Some(&labels), None, LossKind::CrossEntropy, Some(&init)).unwrap();
        for s in [0, 7, run.manifest.steps] {
            let w = run.load_step(s).unwrap();
            let plain = arch.forward(&w, Some(&init), &run.dataset.x_train).unwrap();
            let autodiff = obj.evaluate(&w).outputs;
            let diff = max_abs_diff(&plain, &autodiff);
            assert!(diff <= 1e-12, "{name} step {s}: {diff:e}");
        }
        // The recorded path is the GD path: w_{s+1} = w_s − ε ∇L(w_s).
        let w3 = run.load_step(3).unwrap();
        let w4 = run.load_step(4).unwrap();
        let g = obj.evaluate(&w3).grad;
        let lr = run.manifest.learning_rates[3];
        let pred: Vec<f64> = w3.flat().iter().zip(g.flat()).map(|(w, g)| w - lr * g).collect();
        assert!(max_abs_diff(&pred, &w4.flat()) <= 1e-15);
    }
}

#[test]
fn trajectory_load_rejects_broken_runs() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "good", &toy2d("[4]", "relu", 5, 0.5, 5, 3));
    let base = run.dir.clone();
    let copy = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(d.join("trajectory")).unwrap();
        for f in ["manifest.json", "dataset.safetensors", "train_log.parquet"] {
            std::fs::copy(base.join(f), d.join(f)).unwrap();
        }
        for s in 0..=5 {
            std::fs::copy(step_path(&base, s), step_path(&d, s)).unwrap();
        }
        d
    };
    // Missing step.
    let d = copy("missing");
    std::fs::remove_file(step_path(&d, 3)).unwrap();
    let e = Run::open(&d).unwrap_err().to_string();
    assert!(e.contains("missing step file for step 3"), "{e}");
    // Garbled step.
    let d = copy("garbled");
    let p = step_path(&d, 2);
    let mut b = std::fs::read(&p).unwrap();
    b.truncate(b.len() / 2);
    std::fs::write(&p, b).unwrap();
    let e = Run::open(&d).unwrap_err().to_string();
    assert!(e.contains("step-000002") && e.contains("not a valid safetensors"), "{e}");
    // A step from another run.
    let other = train(dir.path(), "other", &toy2d("[4]", "relu", 5, 0.25, 5, 3));
    let d = copy("mixed");
    std::fs::copy(step_path(&other.dir, 4), step_path(&d, 4)).unwrap();
    let e = Run::open(&d).unwrap_err().to_string();
    assert!(e.contains("belongs to run"), "{e}");
    // Wrong step number in a file.
    let d = copy("renamed");
    std::fs::copy(step_path(&base, 1), step_path(&d, 2)).unwrap();
    let e = Run::open(&d).unwrap_err().to_string();
    assert!(e.contains("expected 2"), "{e}");
    // Extra step beyond the manifest.
    let d = copy("extra");
    std::fs::copy(step_path(&base, 1), step_path(&d, 6)).unwrap();
    assert!(Run::open(&d).unwrap_err().to_string().contains("beyond"));
    // Garbled manifest.
    let d = copy("manifest");
    std::fs::write(d.join("manifest.json"), "{\"format\": 1").unwrap();
    assert!(Run::open(&d).unwrap_err().to_string().contains("invalid manifest"));
    // An impossible architecture in the manifest (found by fuzzing: it used to panic).
    let d = copy("arch");
    let text = std::fs::read_to_string(d.join("manifest.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["architecture"]["body"] = serde_json::json!({"kind": "cnn", "image": [1, 28, 28], "channels": 1, "kernel": 2, "stride": 3, "padding": 0, "pool": 2, "outputs": 10});
    std::fs::write(d.join("manifest.json"), v.to_string()).unwrap();
    let e = Run::open(&d).unwrap_err().to_string();
    assert!(e.contains("invalid architecture") && e.contains("pool"), "{e}");
    v["architecture"]["body"] = serde_json::json!({"kind": "mlp", "widths": [2]});
    std::fs::write(d.join("manifest.json"), v.to_string()).unwrap();
    assert!(Run::open(&d).unwrap_err().to_string().contains("invalid architecture"));
    // The intact copy still opens.
    assert!(Run::open(&copy("intact")).is_ok());
}

#[test]
fn cli_train_writes_a_run_and_rejects_bad_configs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toy2d("[8]", "relu", 10, 0.5, 10, 6)).unwrap();
    let out = dir.path().join("run");
    let o = Command::new(bin()).args(["train", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("test accuracy"), "{stdout}");
    for f in ["manifest.json", "dataset.safetensors", "train_log.parquet", "trajectory/step-000010.safetensors"] {
        assert!(out.join(f).exists(), "{f}");
    }
    assert!(!dir.path().join("run.partial").exists());
    let log = pathkernel::io::Table::read_parquet(&out.join("train_log.parquet")).unwrap();
    assert_eq!(log.rows(), 11);
    // Refuses to overwrite.
    let o = Command::new(bin()).args(["train", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    // Bad configurations: exit 2, one line, nothing written.
    let cases = [
        ("unknown key", toy2d("[8]", "relu", 10, 0.5, 10, 6).replace("[train]", "[train]\nlearning_rate = 3"), "unknown field"),
        ("zero width", toy2d("[8, 0]", "relu", 10, 0.5, 10, 6), "hidden[1]"),
        ("negative lr", toy2d("[8]", "relu", 10, -0.5, 10, 6), "train.lr"),
        ("wrong type", toy2d("[8]", "relu", 10, 0.5, 10, 6).replace("steps = 10", "steps = \"ten\""), "steps"),
        ("bad activation", toy2d("[8]", "gelu", 10, 0.5, 10, 6), "unknown variant"),
    ];
    for (what, text, needle) in cases {
        std::fs::write(&cfg, text).unwrap();
        let out = dir.path().join(format!("bad-{}", what.replace(' ', "-")));
        let o = Command::new(bin()).args(["train", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(needle), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert!(!out.exists() && !dir.path().join(format!("bad-{}.partial", what.replace(' ', "-"))).exists(), "{what}");
    }
    // Divergence names the step.
    std::fs::write(&cfg, toy2d("[8]", "relu", 10, 1e300, 10, 6)).unwrap();
    let out = dir.path().join("diverged");
    let o = Command::new(bin()).args(["train", "--config"]).arg(&cfg).arg("--out").arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("diverged at step"), "{err}");
    assert!(!out.exists() && !dir.path().join("diverged.partial").exists());
}
