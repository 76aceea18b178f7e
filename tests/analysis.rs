//! Uncertainty and analysis on the kernel, end to end through the CLI on the 2-D toy:
//! GP posterior, SVM refit, attribution sums, stationarity (EPK not stationary, RBF stationary).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::api::{Gram, Trained};

fn ok(args: &[&str], cwd: &Path) -> String {
    let o = Command::new(bin()).args(args).current_dir(cwd).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn analyses_on_the_2d_toy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), toy2d("[16]", "relu", 40, 0.5, 20, 15)).unwrap();
    ok(&["train", "-q", "--config", "c.toml", "--out", "run"], d);
    ok(&["kernel", "-q", "--run", "run", "--points", "train", "--side", "train", "--out", "ktrain"], d);
    ok(&["kernel", "-q", "--run", "run", "--points", "test", "--out", "ktest"], d);

    // GP: the posterior in gp.safetensors equals a direct solve from its own stored inputs.
    ok(&["gp", "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--fit-hyper", "--out", "gp"], d);
    let f = pathkernel::io::SafeFile::open(&d.join("gp/gp.safetensors")).unwrap();
    let (ks, k_train) = f.f64("k_train", None).unwrap();
    let (_, k_cross) = f.f64("k_cross", None).unwrap();
    let (_, k_diag) = f.f64("k_test_diag", None).unwrap();
    let (_, targets) = f.f64("targets", None).unwrap();
    let (_, noise) = f.f64("noise", None).unwrap();
    let (_, scale) = f.f64("output_scale", None).unwrap();
    let (_, jitter) = f.f64("jitter", None).unwrap();
    let (_, mean) = f.f64("mean", None).unwrap();
    let (_, var) = f.f64("var", None).unwrap();
    let (kk, m) = (ks[0], ks[1]);
    let p = k_diag.len() / kk;
    let bias = pathkernel::io::SafeFile::open(&d.join("ktest/gram.safetensors")).unwrap().f64("bias", None).unwrap().1;
    for c in 0..kk {
        let s = scale[c];
        let a = nalgebra::DMatrix::from_fn(m, m, |i, j| s * k_train[(c * m + i) * m + j] + if i == j { noise[c] + jitter[c] } else { 0.0 });
        let y = nalgebra::DVector::from_fn(m, |i, _| targets[i * kk + c]);
        let lu = a.clone().lu();
        let alpha = lu.solve(&y).unwrap();
        for pi in 0..p {
            let ks_v = nalgebra::DVector::from_fn(m, |i, _| s * k_cross[(c * p + pi) * m + i]);
            let mu = ks_v.dot(&alpha) + bias[pi * kk + c];
            let v = s * k_diag[c * p + pi] - ks_v.dot(&lu.solve(&ks_v).unwrap());
            let scale_m = 1.0 + mu.abs();
            assert!((mu - mean[pi * kk + c]).abs() <= 1e-8 * scale_m, "mean {c} {pi}: {mu} vs {}", mean[pi * kk + c]);
            assert!((v - var[pi * kk + c]).abs() <= 1e-8 * (s * k_diag[c * p + pi]), "var {c} {pi}");
            assert!(var[pi * kk + c] >= 0.0 && var[pi * kk + c] <= s * k_diag[c * p + pi] * (1.0 + 1e-12));
        }
    }
    let g = json(&d.join("gp/gp.json"));
    assert!(g["agreement_with_network"].as_f64().unwrap() > 0.8, "{g}");

    // SVM refit.
    ok(&["svm", "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--out", "svm"], d);
    let s = json(&d.join("svm/svm.json"));
    assert!(s["accuracy"].as_f64().unwrap() > 0.6, "{s}");
    assert_eq!(s["support"].as_array().unwrap().len(), 3);

    // Attribution: contributions sum to the network output minus the bias.
    ok(&["attribute", "--run", "run", "--kernel", "ktest", "--points", "0,3,7", "--top", "5", "--out", "att"], d);
    let a = json(&d.join("att/attribution.json"));
    assert!(a["max_abs_residual"].as_f64().unwrap() <= 1e-10, "{a}");
    assert_eq!(a["attributions"].as_array().unwrap().len(), 9);
    let t = pathkernel::io::Table::read_parquet(&d.join("att/attribution.parquet")).unwrap();
    assert!(t.rows() > 0);

    // Stationarity: the EPK is far from stationary, the RBF on the same points is stationary.
    ok(&["stationarity", "--run", "run", "--train-kernel", "ktrain", "--dirs", "6", "--ray-steps", "5", "--out", "st"], d);
    let st = json(&d.join("st/stationarity.json"));
    assert!(st["rbf_score"].as_f64().unwrap() >= 0.95, "{st}");
    assert!(st["score"].as_f64().unwrap() <= 0.6, "{st}");

    // Library view: the train kernel is square and symmetric per class block.
    let net = Trained::open(d.join("run")).unwrap();
    let g = Gram::open(d.join("ktrain"), &net).unwrap();
    g.require_train_rows("the check").unwrap();
    let b = g.class_block(1).unwrap();
    let n = g.shape().1;
    for i in 0..n {
        for j in 0..n {
            assert!((b[(i, j)] - b[(j, i)]).abs() <= 1e-10 * b[(i, i)].abs().max(1.0));
        }
    }
}

#[test]
fn analyses_reject_wrong_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), toy2d("[6]", "relu", 5, 0.5, 6, 4)).unwrap();
    ok(&["train", "-q", "--config", "c.toml", "--out", "run"], d);
    ok(&["kernel", "-q", "--run", "run", "--points", "test", "--out", "ktest"], d);
    ok(&["kernel", "-q", "--run", "run", "--points", "train", "--side", "train", "--out", "ktrain"], d);
    std::fs::write(d.join("c2.toml"), toy2d("[6]", "relu", 5, 0.25, 6, 4)).unwrap();
    ok(&["train", "-q", "--config", "c2.toml", "--out", "run2"], d);
    let fail = |args: &[&str], needle: &str| {
        let o = Command::new(bin()).args(args).current_dir(d).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        let out = args.iter().position(|a| *a == "--out").map(|i| args[i + 1]).unwrap();
        assert!(!d.join(out).exists(), "{args:?} left output");
    };
    fail(&["gp", "--run", "run", "--train-kernel", "ktest", "--kernel", "ktest", "--out", "o1"], "is not a train×train kernel");
    fail(&["svm", "--run", "run", "--train-kernel", "ktest", "--kernel", "ktest", "--out", "o2"], "is not a train×train kernel");
    fail(&["gp", "--run", "run2", "--train-kernel", "ktest", "--kernel", "ktest", "--out", "o3"], "computed for run");
    fail(&["attribute", "--run", "run", "--kernel", "ktest", "--points", "99", "--out", "o4"], "out of range");
    fail(&["attribute", "--run", "run", "--kernel", "ktest", "--points", "a,b", "--out", "o5"], "expected indices");
    fail(&["gp", "--run", "run", "--train-kernel", "nowhere", "--kernel", "ktest", "--out", "o6"], "nowhere");
    fail(&["stationarity", "--run", "run", "--train-kernel", "ktest", "--growth", "0.5", "--out", "o7"], "--growth");
    fail(&["svm", "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--c=-1", "--out", "o8"], "C must be finite and > 0");
    fail(&["gp", "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--noise=-1", "--out", "o9"], "noise");
    fail(&["gp", "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--targets", "dreams", "--out", "o10"], "--targets dreams");
}
