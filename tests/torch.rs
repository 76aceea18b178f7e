//! PyTorch interoperability: `export --format torch`, `[model] init` from a PyTorch state_dict,
//! and `import --from torch`. The exported files are read back with the safetensors crate and
//! run through a plain-Rust forward pass written here, independent of the library's.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::model::{Architecture, Body, Params};
use pathkernel::trajectory::Run;
use safetensors::SafeTensors;

/// Runs the binary in `cwd`; returns (status, stdout, stderr).
fn run(args: &[&str], cwd: &Path) -> (i32, String, String) {
    let o = Command::new(bin()).args(args).current_dir(cwd).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn run_ok(args: &[&str], cwd: &Path) -> String {
    let (code, out, err) = run(args, cwd);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// Exit 2, one line naming `needle`, no panic.
fn run_fail(args: &[&str], cwd: &Path, needle: &str) {
    let (code, _, err) = run(args, cwd);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

/// The tensors and metadata of a safetensors file, read with the safetensors crate alone.
fn read_tensors(path: &Path) -> (HashMap<String, (Vec<usize>, Vec<f64>)>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        assert_eq!(v.dtype(), safetensors::Dtype::F64, "{name}");
        let data = v.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        out.insert(name, (v.shape().to_vec(), data));
    }
    let meta = SafeTensors::read_metadata(&bytes).unwrap().1.metadata().clone().unwrap_or_default();
    (out, meta)
}

fn act(kind: &str, z: f64) -> f64 {
    match kind {
        "relu" => z.max(0.0),
        "tanh" => z.tanh(),
        other => panic!("activation {other}"),
    }
}

/// `y = x Wᵀ + b` with plain loops. `x` `[n, i]`, `w` `[o, i]`.
fn linear(x: &[f64], n: usize, w: &(Vec<usize>, Vec<f64>), b: Option<&(Vec<usize>, Vec<f64>)>) -> Vec<f64> {
    let (o, i) = (w.0[0], w.0[1]);
    assert_eq!(x.len(), n * i);
    let mut y = vec![0.0; n * o];
    for r in 0..n {
        for q in 0..o {
            let mut acc = b.map_or(0.0, |b| b.1[q]);
            for j in 0..i {
                acc += x[r * i + j] * w.1[q * i + j];
            }
            y[r * o + q] = acc;
        }
    }
    y
}

/// The `nn.Sequential` an exported file describes, on rows `x`, tensors under `prefix`:
/// MLP `Linear, σ, …, Linear`; CNN `Conv2d, σ, MaxPool2d, Flatten, Linear` (written out here).
fn sequential(t: &HashMap<String, (Vec<usize>, Vec<f64>)>, prefix: &str, arch: &serde_json::Value, x: &[f64]) -> Vec<f64> {
    let a = arch["activation"].as_str().unwrap();
    let body = &arch["body"];
    let get = |name: String| t.get(&format!("{prefix}{name}"));
    if body["kind"] == "mlp" {
        let widths: Vec<usize> = body["widths"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let n = x.len() / widths[0];
        let mut h = x.to_vec();
        for l in 0..widths.len() - 1 {
            let w = get(format!("{}.weight", 2 * l)).unwrap();
            h = linear(&h, n, w, get(format!("{}.bias", 2 * l)));
            if l + 2 < widths.len() {
                h.iter_mut().for_each(|v| *v = act(a, *v));
            }
        }
        return h;
    }
    let u = |k: &str| body[k].as_u64().unwrap() as usize;
    let image: Vec<usize> = body["image"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let (c, h, w) = (image[0], image[1], image[2]);
    let (k, s, p, pool) = (u("kernel"), u("stride"), u("padding"), u("pool"));
    let cw = get("0.weight".into()).unwrap();
    let co = cw.0[0];
    let (ho, wo) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
    let (hp, wp) = (ho / pool, wo / pool);
    let n = x.len() / (c * h * w);
    let mut flat = vec![0.0; n * co * hp * wp];
    for r in 0..n {
        let mut conv = vec![0.0; co * ho * wo];
        for o in 0..co {
            for y in 0..ho {
                for xx in 0..wo {
                    let mut acc = get("0.bias".into()).map_or(0.0, |b| b.1[o]);
                    for ci in 0..c {
                        for i in 0..k {
                            for j in 0..k {
                                let (iy, ix) = ((y * s + i) as isize - p as isize, (xx * s + j) as isize - p as isize);
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                    acc += cw.1[((o * c + ci) * k + i) * k + j] * x[r * c * h * w + (ci * h + iy as usize) * w + ix as usize];
                                }
                            }
                        }
                    }
                    conv[(o * ho + y) * wo + xx] = act(a, acc);
                }
            }
        }
        for o in 0..co {
            for y in 0..hp {
                for xx in 0..wp {
                    let mut m = f64::NEG_INFINITY;
                    for i in 0..pool {
                        for j in 0..pool {
                            m = m.max(conv[(o * ho + y * pool + i) * wo + xx * pool + j]);
                        }
                    }
                    flat[r * co * hp * wp + (o * hp + y) * wp + xx] = m;
                }
            }
        }
    }
    linear(&flat, n, get("4.weight".into()).unwrap(), get("4.bias".into()))
}

/// The logits the exported file's module computes: `net(x)`, minus `init(x)` for zero_output.
fn exported_logits(path: &Path, x: &[f64]) -> (Vec<f64>, HashMap<String, String>) {
    let (t, meta) = read_tensors(path);
    assert_eq!(meta["format"], "pytorch-state-dict");
    let arch: serde_json::Value = serde_json::from_str(&meta["architecture"]).unwrap();
    let mut z = sequential(&t, "", &arch, x);
    if meta["zero_output"] == "true" {
        let z0 = sequential(&t, "init.", &arch, x);
        z.iter_mut().zip(&z0).for_each(|(a, b)| *a -= b);
    }
    (z, meta)
}

fn log_softmax(z: &mut [f64], k: usize) {
    pathkernel::model::log_softmax_rows(z, k);
}

/// Compares the exported state `s` of `run` on `x` with the library's f (log-softmax of the
/// logits) and its raw forward; returns the largest difference.
fn check_export(run: &Run, file: &Path, s: usize, x: &[f64]) -> f64 {
    let arch: &Architecture = &run.manifest.architecture;
    let (mut z, meta) = exported_logits(file, x);
    assert_eq!(meta["step"], s.to_string());
    assert_eq!(meta["run_id"], run.manifest.run_id);
    let back: Architecture = serde_json::from_str(&meta["architecture"]).unwrap();
    assert_eq!(&back, arch);
    let params: Params = run.load_step(s).unwrap();
    let init = run.load_step(0).unwrap();
    // The logits α (g_w − [zero_output] g_{w_0}) from the library's raw forward.
    let g = arch.raw_forward(&params, x);
    let g0 = arch.raw_forward(&init, x);
    let logits: Vec<f64> = g.iter().zip(&g0).map(|(a, b)| arch.alpha * (a - if arch.zero_output { *b } else { 0.0 })).collect();
    let e1 = max_abs_diff(&z, &logits);
    log_softmax(&mut z, arch.outputs());
    let f = arch.forward(&params, Some(&init), x).unwrap();
    let e2 = max_abs_diff(&z, &f);
    assert!(max_abs(&f) > 1e-3);
    e1.max(e2)
}

#[test]
fn export_mlp_with_alpha_and_zero_output_equals_our_forward() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, model_extra) in [("plain", ""), ("scaled", "alpha = 2.5\nzero_output = true\nzero_last = false\n"), ("nobias", "bias = false\nalpha = 0.5\n")] {
        let toml = toy2d("[6, 5]", "tanh", 4, 0.5, 6, 5).replace("activation = \"tanh\"\n", &format!("activation = \"tanh\"\n{model_extra}"));
        let run = train(d, name, &toml);
        let out = format!("{name}.safetensors");
        let printed = run_ok(&["export", "--run", name, "--format", "torch", "--out", &out], d);
        assert!(printed.contains("exported state 4 of 4"), "{printed}");
        let x = [run.dataset.x_test.clone(), run.dataset.x_train.clone()].concat();
        let err = check_export(&run, &d.join(&out), 4, &x);
        eprintln!("{name}: exported network vs ours {err:e}");
        assert!(err <= 1e-12, "{name}: {err:e}");
        run_ok(&["export", "--run", name, "--step", "1", "--format", "torch", "--out", "s1.safetensors", "--force"], d);
        assert!(check_export(&run, &d.join("s1.safetensors"), 1, &x) <= 1e-12);
        // The exported state differs from another state (the comparison can fail).
        let (z4, _) = exported_logits(&d.join(&out), &x);
        let (z1, _) = exported_logits(&d.join("s1.safetensors"), &x);
        assert!(max_abs_diff(&z4, &z1) > 1e-3, "{name}");
    }
}

#[test]
fn export_cnn_equals_our_forward() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("mnist");
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 8, 3);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 8\nn_test = 3\n\n[model]\nkind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npadding = 2\npool = 2\nalpha = 1.5\nzero_last = false\n\n[train]\nlr = 0.3\nsteps = 2\nseed = 2\n",
        data.display().to_string()
    );
    let run = train(d, "cnn", &toml);
    assert!(matches!(run.manifest.architecture.body, Body::Cnn { .. }));
    run_ok(&["export", "--run", "cnn", "--format", "torch", "--out", "cnn.safetensors"], d);
    let (_, meta) = read_tensors(&d.join("cnn.safetensors"));
    assert_eq!(meta["module"], "Sequential(Conv2d(1, 2, 5, stride=2, padding=2), ReLU(), MaxPool2d(2), Flatten(), Linear(98, 10))");
    let x = [run.dataset.x_test.clone(), run.dataset.x_train.clone()].concat();
    let err = check_export(&run, &d.join("cnn.safetensors"), 2, &x);
    eprintln!("cnn: exported network vs ours {err:e}");
    assert!(err <= 1e-12, "{err:e}");
}

#[test]
fn export_rejects_bad_arguments_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train(d, "run", &toy2d("[4]", "relu", 3, 0.5, 4, 2));
    run_fail(&["export", "--run", "nowhere", "--format", "torch", "--out", "m.safetensors"], d, "nowhere");
    run_fail(&["export", "--run", "run", "--step", "4", "--format", "torch", "--out", "m.safetensors"], d, "--step 4 is beyond the last state 3");
    run_fail(&["export", "--run", "run", "--format", "onnx", "--out", "m.safetensors"], d, "--format onnx");
    assert!(!d.join("m.safetensors").exists());
    let leftovers: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.contains("m.safetensors")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "m.safetensors"], d);
    let before = std::fs::read(d.join("m.safetensors")).unwrap();
    run_fail(&["export", "--run", "run", "--step", "0", "--format", "torch", "--out", "m.safetensors"], d, "already exists");
    assert_eq!(std::fs::read(d.join("m.safetensors")).unwrap(), before);
}

fn fixture(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A toy config (3 classes, 2-D, tanh 6-5 MLP) starting from `init`.
fn toy_from(init: &str, steps: usize) -> String {
    toy2d("[6, 5]", "tanh", steps, 0.5, 6, 5).replace("activation = \"tanh\"\n", &format!("activation = \"tanh\"\ninit = {init:?}\n"))
}

#[test]
fn init_from_a_pytorch_state_dict_trains_and_exports_back_to_the_same_network() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The fixture: nn.Sequential(Linear(2, 6), Tanh(), Linear(6, 5), Tanh(), Linear(5, 3)) in
    // float64 with PyTorch's own initialisation (scripts/make_torch_fixture.py).
    std::fs::copy(fixture("torch/init-mlp.safetensors"), d.join("w.safetensors")).unwrap();
    std::fs::write(d.join("c.toml"), toy_from("w.safetensors", 6)).unwrap();
    run_ok(&["train", "-q", "--config", "c.toml", "--out", "run"], d);
    let run = Run::open(&d.join("run")).unwrap();
    // w_0 is the file's, tensor by tensor, and the manifest says where it came from.
    let (t, _) = read_tensors(&d.join("w.safetensors"));
    let w0 = run.load_step(0).unwrap();
    for (s, v) in w0.specs.iter().zip(&w0.data) {
        let l: usize = s.name.split('.').nth(1).unwrap().parse().unwrap();
        let torch_name = format!("{}.{}", 2 * l, s.name.rsplit('.').next().unwrap());
        assert_eq!(&t[&torch_name].1, v, "{}", s.name);
        assert_eq!(t[&torch_name].0, s.shape);
    }
    let rec = run.manifest.init.clone().expect("init recorded");
    assert_eq!(rec.path, "w.safetensors");
    assert_eq!(rec.sha256, sha256_hex(&std::fs::read(d.join("w.safetensors")).unwrap()));
    assert!(!run.manifest.architecture.zero_last);
    let manifest_text = std::fs::read_to_string(d.join("run/manifest.json")).unwrap();
    assert!(manifest_text.contains(&rec.sha256));
    // Trained: the network moved.
    let wn = run.load_step(6).unwrap();
    assert!(max_abs_diff(&wn.flat(), &w0.flat()) > 1e-3);
    // Export the trained state and run it through the plain-Rust Sequential.
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "trained.safetensors"], d);
    let x = [run.dataset.x_test.clone(), run.dataset.x_train.clone()].concat();
    let err = check_export(&run, &d.join("trained.safetensors"), 6, &x);
    eprintln!("init -> train 6 steps -> export: exported network vs ours {err:e}");
    assert!(err <= 1e-12, "{err:e}");
    // And the export starts a new run exactly where the first one ended.
    std::fs::write(d.join("c2.toml"), toy_from("trained.safetensors", 2)).unwrap();
    run_ok(&["train", "-q", "--config", "c2.toml", "--out", "run2"], d);
    let run2 = Run::open(&d.join("run2")).unwrap();
    assert_eq!(run2.load_step(0).unwrap(), wn);
    assert_ne!(run2.manifest.run_id, run.manifest.run_id);
}

#[test]
fn init_mismatches_are_listed_in_one_line_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(fixture("torch/init-mlp.safetensors"), d.join("w.safetensors")).unwrap();
    // A 2-7-3 network: 0.weight, 0.bias and 2.weight do not fit, 2.bias fits, 4.* are extra.
    let text = toy2d("[7]", "tanh", 3, 0.5, 6, 5).replace("activation = \"tanh\"\n", "activation = \"tanh\"\ninit = \"w.safetensors\"\n");
    std::fs::write(d.join("c.toml"), text).unwrap();
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run"], d, "`0.weight` has shape [6, 2], expected [7, 2]");
    let (_, _, err) = run(&["train", "-q", "--config", "c.toml", "--out", "run"], d);
    for needle in ["`0.bias` has shape [6], expected [7]", "`2.weight` has shape [5, 6], expected [3, 7]", "`2.bias` has shape [5], expected [3]", "unexpected `4.bias` [3]", "unexpected `4.weight` [3, 5]", "(6)"] {
        assert!(err.contains(needle), "expected `{needle}` in {err}");
    }
    assert!(!d.join("run").exists() && !d.join("run.partial").exists());
    std::fs::write(d.join("c.toml"), toy_from("missing.safetensors", 2)).unwrap();
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run"], d, "missing.safetensors");
    assert!(!d.join("run").exists() && !d.join("run.partial").exists());
    std::fs::write(d.join("c.toml"), toy_from("", 2)).unwrap();
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run"], d, "model.init is empty");
}

#[test]
fn configs_without_init_serialise_as_before() {
    // Run ids hash the configuration's JSON: `init` must not change it when absent.
    let cfg = pathkernel::train::RunConfig::from_toml(&toy2d("[4]", "relu", 3, 0.5, 4, 2), Path::new("t.toml")).unwrap();
    assert!(cfg.init.is_none());
    let composed = format!(
        "{{\"data\":{},\"model\":{},\"train\":{}}}",
        serde_json::to_string(&cfg.data).unwrap(),
        serde_json::to_string(&cfg.model).unwrap(),
        serde_json::to_string(&cfg.train).unwrap()
    );
    assert_eq!(serde_json::to_string(&cfg).unwrap(), composed);
    let with = pathkernel::train::RunConfig::from_toml(&toy_from("w.safetensors", 3), Path::new("t.toml")).unwrap();
    assert_eq!(with.init.as_deref(), Some(Path::new("w.safetensors")));
    let back: pathkernel::train::RunConfig = serde_json::from_value(serde_json::to_value(&with).unwrap()).unwrap();
    assert_eq!(back, with);
    assert!(serde_json::to_string(&with).unwrap().contains("\"init\":\"w.safetensors\""));
    // Unknown keys in [model] are still refused.
    let bad = toy2d("[4]", "relu", 3, 0.5, 4, 2).replace("activation = \"relu\"\n", "activation = \"relu\"\nwidth = 3\n");
    let e = pathkernel::train::RunConfig::from_toml(&bad, Path::new("t.toml")).unwrap_err().to_string();
    assert!(e.contains("width"), "{e}");
}

/// Copies the committed recording (scripts/record_torch_trajectory.py: a 2-6-2 ReLU MLP, 20 SGD
/// steps of batch 8 on 24 two-moons points) into `dst`.
fn copy_recording(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture("torch-trajectory")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// The figure `max relative difference X` printed by `import`.
fn printed_rel_diff(out: &str) -> f64 {
    let tail = out.split("max relative difference ").nth(1).expect(out);
    tail.split_whitespace().next().unwrap().parse().unwrap()
}

/// The figure `max X ulps of the weights and update` printed by `import`.
fn printed_ulps(out: &str) -> f64 {
    let head = out.split(" ulps of the weights and update").next().expect(out);
    head.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn imported_pytorch_sgd_trajectory_is_a_run_whose_epk_reproduces_the_network() {
    use pathkernel::kernel::{self, KernelKind, Rows, Request, Rule};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_recording(&d.join("rec"));
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "run"], d);
    eprintln!("{printed}");
    let rel = printed_rel_diff(&printed);
    assert!(rel <= 1e-12, "{rel:e}");
    let run = Run::open(&d.join("run")).unwrap();
    let m = &run.manifest;
    assert_eq!(m.steps, 20);
    assert_eq!(m.learning_rates, vec![0.5; 20]);
    assert_eq!(run.dataset.n_train(), 24);
    // The recorded batches are the manifest's (sorted), and every state is the recorded one.
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("rec/trajectory.json")).unwrap()).unwrap();
    let batches = m.batches().expect("sgd batches");
    for (s, b) in batches.iter().enumerate() {
        let mut want: Vec<usize> = rec["batches"][s].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        want.sort_unstable();
        assert_eq!(b, &want, "step {s}");
    }
    let states = run.load_all().unwrap();
    for s in [0, 7, 20] {
        let (t, _) = read_tensors(&d.join(format!("rec/step_{s:05}.safetensors")));
        assert_eq!(states[s].get("layers.1.weight").unwrap(), t["2.weight"].1.as_slice());
        assert_eq!(states[s].get("layers.0.bias").unwrap(), t["0.bias"].1.as_slice());
    }
    assert_eq!(m.init.as_ref().unwrap().sha256, sha256_hex(&std::fs::read(d.join("rec/step_00000.safetensors")).unwrap()));
    // The EPK's kernel machine reproduces the network on the test points.
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let out = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    eprintln!("imported torch SGD run: EPK machine vs network {:e}", out.max_abs_error());
    assert!(out.max_abs_error() <= 1e-10, "{:e}", out.max_abs_error());
    assert!(max_abs_diff(&out.network, &out.bias) > 1e-2, "the outputs must move");
    // The network values are the recorded PyTorch model's: log-softmax of the exported logits.
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "last.safetensors"], d);
    let (mut z, _) = exported_logits(&d.join("last.safetensors"), &pts.x);
    log_softmax(&mut z, 2);
    assert!(max_abs_diff(&z, &out.network) <= 1e-12);
    // The CLI's kernel, gp, svm and attribute accept the run.
    run_ok(&["kernel", "--run", "run", "--out", "k", "-q"], d);
    run_ok(&["kernel", "--run", "run", "--points", "train", "--side", "train", "--out", "kt", "-q"], d);
    run_ok(&["kernel", "--run", "run", "--per-step", "--out", "kp", "-q"], d);
    assert!(run_ok(&["gp", "--run", "run", "--train-kernel", "kt", "--kernel", "k", "--out", "gp"], d).contains("gp: 6 points"));
    assert!(run_ok(&["svm", "--run", "run", "--train-kernel", "kt", "--kernel", "k", "--out", "svm"], d).contains("svm: 6 points"));
    assert!(run_ok(&["attribute", "--run", "run", "--kernel", "kp", "--out", "attr"], d).contains("2 outputs explained"));
}

#[test]
fn import_refuses_broken_recordings_naming_the_step_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fail = |name: &str, needle: &str| {
        run_fail(&["import", "--from", "torch", name, "--out", "run"], d, needle);
        assert!(!d.join("run").exists() && !d.join("run.partial").exists(), "{name}");
    };
    let rewrite = |path: &Path, edit: &dyn Fn(&mut HashMap<String, (Vec<usize>, Vec<f64>)>)| {
        let (mut t, _) = read_tensors(path);
        edit(&mut t);
        let arrays: Vec<_> = t.into_iter().map(|(k, (shape, v))| pathkernel::io::NamedArray::f64(k, shape, v)).collect();
        pathkernel::io::write_safetensors(path, &arrays, None).unwrap();
    };
    // A missing step in the middle.
    copy_recording(&d.join("gap"));
    std::fs::remove_file(d.join("gap/step_00007.safetensors")).unwrap();
    fail("gap", "step 7 is missing");
    // A step beyond the learning rates.
    copy_recording(&d.join("extra"));
    std::fs::copy(d.join("extra/step_00020.safetensors"), d.join("extra/step_00021.safetensors")).unwrap();
    fail("extra", "need step files 0..=20, found 22");
    // A shape that changes.
    copy_recording(&d.join("shape"));
    rewrite(&d.join("shape/step_00005.safetensors"), &|t| t.get_mut("2.weight").unwrap().0 = vec![3, 4]);
    fail("shape", "step 5");
    let (_, _, err) = run(&["import", "--from", "torch", "shape", "--out", "run"], d);
    assert!(err.contains("`2.weight` has shape [3, 4], expected [2, 6]"), "{err}");
    // A tampered update: w_9 moved off the gradient step from w_8.
    copy_recording(&d.join("tampered"));
    rewrite(&d.join("tampered/step_00009.safetensors"), &|t| t.get_mut("0.bias").unwrap().1[2] += 1e-6);
    fail("tampered", "the update of step 8 (w_9 - w_8)");
    // The line gives the absolute, relative and ulps figures and the coordinate.
    let (_, _, err) = run(&["import", "--from", "torch", "tampered", "--out", "run"], d);
    assert!(err.contains("by 1.000e-6 absolute at 0.bias[2]") && err.contains("relative to the update's max-norm") && err.contains("ulps of the weights and update in float64, tolerance 4"), "{err}");
    // ... which a looser tolerance (in ulps) accepts, reporting the difference.
    let printed = run_ok(&["import", "--from", "torch", "tampered", "--out", "loose", "--tolerance", "1e12"], d);
    assert!(printed.contains("float64") && printed.contains("sgd (lr 0.5, batch 8)"), "{printed}");
    let rel = printed_rel_diff(&printed);
    assert!(rel > 1e-8 && rel < 0.1, "{printed}");
    assert!(printed_ulps(&printed) > 1e6, "{printed}");
    assert!(printed.contains("(step 8)") || printed.contains("(step 9)"), "{printed}");
    // A version-1 recording names only plain steps; Adam needs the version-2 hyper-parameters.
    copy_recording(&d.join("adam"));
    let j = std::fs::read_to_string(d.join("adam/trajectory.json")).unwrap().replace("\"optimizer\": \"sgd\"", "\"optimizer\": \"adam\"");
    assert!(j.contains("\"adam\""));
    std::fs::write(d.join("adam/trajectory.json"), j).unwrap();
    fail("adam", "optimizer `adam` is not supported");
    let (_, _, err) = run(&["import", "--from", "torch", "adam", "--out", "run"], d);
    assert!(err.contains("version 2"), "{err}");
    // Other bad arguments.
    fail("nowhere", "nowhere");
    run_fail(&["import", "--from", "jax", "gap", "--out", "run"], d, "--from jax");
    copy_recording(&d.join("ok"));
    std::fs::create_dir_all(d.join("taken")).unwrap();
    std::fs::write(d.join("taken/x"), "keep").unwrap();
    run_fail(&["import", "--from", "torch", "ok", "--out", "taken"], d, "already exists");
    assert_eq!(std::fs::read_to_string(d.join("taken/x")).unwrap(), "keep");
}

/// Writes the recording a PyTorch loop would have made of the native gd run `native` into
/// `rec` (x arrays with the given shapes); returns its trajectory.json.
fn write_recording(native: &Run, rec: &Path, model: serde_json::Value, x_train_shape: Vec<usize>, x_test_shape: Vec<usize>) -> serde_json::Value {
    use pathkernel::data::Targets;
    use pathkernel::io::{write_safetensors, NamedArray};
    use pathkernel::model::torch::torch_specs;
    std::fs::create_dir_all(rec).unwrap();
    let arch = &native.manifest.architecture;
    for s in 0..=native.manifest.steps {
        let p = native.load_step(s).unwrap();
        let arrays: Vec<NamedArray> = torch_specs(arch).into_iter().zip(&p.data).map(|(sp, v)| NamedArray::f64(sp.name, sp.shape, v.clone())).collect();
        write_safetensors(&rec.join(format!("step_{s:05}.safetensors")), &arrays, None).unwrap();
    }
    let ds = &native.dataset;
    let k = ds.num_outputs;
    let y = |name: &str, t: &Targets, n: usize| match t {
        Targets::Labels(y) => NamedArray::i64(name, vec![n], y.iter().map(|&c| c as i64).collect()),
        Targets::Values(v) => NamedArray::f64(name, vec![n, k], v.clone()),
    };
    let loss = if ds.is_classification() { "cross_entropy" } else { "mse" };
    write_safetensors(
        &rec.join("data.safetensors"),
        &[
            NamedArray::f64("x_train", x_train_shape, ds.x_train.clone()),
            y("y_train", &ds.y_train, ds.n_train()),
            NamedArray::f64("x_test", x_test_shape, ds.x_test.clone()),
            y("y_test", &ds.y_test, ds.n_test()),
        ],
        None,
    )
    .unwrap();
    let json = serde_json::json!({
        "format": "pathkernel-torch-trajectory", "version": 1, "model": model,
        "optimizer": "gd", "loss": loss, "learning_rates": native.manifest.learning_rates,
    });
    std::fs::write(rec.join("trajectory.json"), json.to_string()).unwrap();
    json
}

#[test]
fn a_native_mse_regression_run_written_as_a_torch_recording_imports_as_the_same_run() {
    use pathkernel::kernel::{self, KernelKind, Rows, Request, Rule};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let toml = "[data]\nkind = \"regression1d\"\nn_test = 5\n\n[model]\nkind = \"mlp\"\nhidden = [6]\nactivation = \"tanh\"\nzero_last = false\n\n[train]\nlr = 0.05\nsteps = 5\nloss = \"mse\"\n";
    let native = train(d, "native", toml);
    write_recording(&native, &d.join("rec"), serde_json::json!({"kind": "mlp", "activation": "tanh"}), vec![2, 1], vec![5, 1]);
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "imported"], d);
    assert!(printed_rel_diff(&printed) <= 1e-12, "{printed}");
    let imported = Run::open(&d.join("imported")).unwrap();
    assert_eq!(imported.manifest.architecture, native.manifest.architecture);
    assert_eq!(imported.manifest.loss, native.manifest.loss);
    assert_eq!(imported.dataset.y_train, native.dataset.y_train);
    let states = imported.load_all().unwrap();
    assert_eq!(states, native.load_all().unwrap());
    let pts = Rows::Test.resolve(&imported.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let out = kernel::compute(&imported, &states, &pts, &req, &|_, _| {}).unwrap();
    assert!(out.max_abs_error() <= 1e-10, "{:e}", out.max_abs_error());
    assert!(max_abs_diff(&out.network, &out.bias) > 1e-3);
}

#[test]
fn a_native_cnn_gd_run_written_as_a_torch_recording_imports_as_the_same_run() {
    use pathkernel::kernel::{self, KernelKind, Rows, Request, Rule};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("mnist");
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 8, 3);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 8\nn_test = 3\n\n[model]\nkind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npadding = 2\npool = 2\nactivation = \"tanh\"\nzero_last = false\n\n[train]\nlr = 0.3\nsteps = 3\nseed = 2\n",
        data.display().to_string()
    );
    let native = train(d, "native", &toml);
    let arch = &native.manifest.architecture;
    let ds = &native.dataset;
    let rec = d.join("rec");
    let model = serde_json::json!({"kind": "cnn", "activation": "tanh", "image": [1, 28, 28], "stride": 2, "padding": 2, "pool": 2});
    let json = write_recording(&native, &rec, model, vec![8, 1, 28, 28], vec![3, 1, 28, 28]);
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "imported"], d);
    assert!(printed_rel_diff(&printed) <= 1e-12, "{printed}");
    let imported = Run::open(&d.join("imported")).unwrap();
    assert_eq!(&imported.manifest.architecture, arch);
    assert_eq!(imported.manifest.optimizer, native.manifest.optimizer);
    assert_eq!(imported.dataset.x_train, ds.x_train);
    assert_eq!(imported.dataset.image_shape, Some([1, 28, 28]));
    let states = imported.load_all().unwrap();
    assert_eq!(states, native.load_all().unwrap());
    let pts = Rows::Test.resolve(&imported.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let out = kernel::compute(&imported, &states, &pts, &req, &|_, _| {}).unwrap();
    assert!(out.max_abs_error() <= 1e-10, "{:e}", out.max_abs_error());
    // A gd recording with batches, and an MLP description of CNN tensors, are refused.
    let mut bad = json.clone();
    bad["batches"] = serde_json::json!([[0], [1], [2]]);
    std::fs::write(rec.join("trajectory.json"), bad.to_string()).unwrap();
    run_fail(&["import", "--from", "torch", "rec", "--out", "x"], d, "`batches` is only for sgd");
    let mut bad = json.clone();
    bad["model"] = serde_json::json!({"kind": "mlp", "activation": "tanh"});
    std::fs::write(rec.join("trajectory.json"), bad.to_string()).unwrap();
    run_fail(&["import", "--from", "torch", "rec", "--out", "x"], d, "`0.weight` [2, 1, 5, 5]");
    assert!(!d.join("x").exists());
}

/// Copies the committed recording `tests/data/NAME` (scripts/make_torch_fixture.py) into `dst`.
fn copy_fixture(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// `b + Σ_s Σ_i a_{i,s}·K_s(x, x_i) + R + rounding` from the per-step Grams (full layout): the
/// kernel machine assembled from the kernel itself, not from the engine's own sum.
fn machine_from_grams(out: &pathkernel::kernel::KernelOutput) -> Vec<f64> {
    let (p, m, k) = (out.p, out.m, out.k);
    let per = out.per_step.as_ref().expect("per_step");
    let mut f = out.bias.clone();
    for (si, &s) in out.steps.iter().enumerate() {
        let g = &per[si * p * m * k * k..(si + 1) * p * m * k * k];
        for pi in 0..p {
            for i in 0..m {
                for kk in 0..k {
                    for kp in 0..k {
                        f[pi * k + kk] += g[((pi * m + i) * k + kk) * k + kp] * out.a[(s * m + i) * k + kp];
                    }
                }
            }
        }
    }
    for extra in [&out.reg, &out.rounding].into_iter().flatten() {
        f.iter_mut().zip(extra).for_each(|(a, b)| *a += b);
    }
    f
}

/// Imports the fixture `name` into `d/run`, checks the printed replay difference is at most
/// `max_rel`, and computes the EPK on the test points with per-step Grams (`rule`): the machine
/// (engine's and assembled from the Grams) must equal the network to 1e-11 of the output scale.
fn import_and_check_epk(d: &Path, name: &str, max_rel: f64, rule: pathkernel::kernel::Rule) -> (Run, pathkernel::kernel::KernelOutput, String) {
    use pathkernel::kernel::{self, KernelKind, Rows, Request};
    copy_fixture(name, &d.join("rec"));
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "run"], d);
    eprintln!("{name}: {printed}");
    let rel = printed_rel_diff(&printed);
    assert!(rel <= max_rel, "{name}: replay difference {rel:e}");
    assert!(printed_ulps(&printed) <= pathkernel::interop::TOLERANCE_ULPS, "{name}: {printed}");
    let run = Run::open(&d.join("run")).unwrap();
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let out = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(rule).per_step(true), &|_, _| {}).unwrap();
    let scale = max_abs(&out.network).max(1.0);
    let rounding = out.rounding.as_deref().map_or(0.0, max_abs);
    eprintln!("{name}: EPK machine vs network {:.3e} (output scale {scale:.3}), residual term max {rounding:.3e}", out.max_abs_error());
    assert!(out.max_abs_error() <= 1e-11 * scale, "{name}: {:e}", out.max_abs_error());
    let assembled = machine_from_grams(&out);
    assert!(max_abs_diff(&assembled, &out.network) <= 1e-11 * scale, "{name}: Σ a K {:e}", max_abs_diff(&assembled, &out.network));
    assert!(max_abs_diff(&out.network, &out.bias) > 1e-2, "{name}: the outputs must move");
    // The network is the recorded PyTorch model's: log-softmax of the last state's logits.
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "last.safetensors"], d);
    let (mut z, _) = exported_logits(&d.join("last.safetensors"), &pts.x);
    log_softmax(&mut z, out.k);
    assert!(max_abs_diff(&z, &out.network) <= 1e-12);
    (run, out, printed)
}

#[test]
fn imported_pytorch_adamw_run_is_recorded_as_a_native_adamw_run_and_its_epk_machine_is_exact() {
    use pathkernel::kernel::{KernelForm, Rule};
    use pathkernel::trajectory::OptimizerRecord;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (run, out, printed) = import_and_check_epk(d, "torch-adamw", 1e-10, Rule::Auto(1e-12));
    assert!(printed.contains("float64") && printed.contains("adamw (lr 0.02, betas 0.9/0.999, eps 1e-8, batch 8, weight decay 0.05)"), "{printed}");
    let m = &run.manifest;
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("rec/trajectory.json")).unwrap()).unwrap();
    let lrs: Vec<f64> = rec["learning_rates"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(m.learning_rates, lrs);
    assert!(lrs[0] > 10.0 * lrs[39], "the cosine schedule is recorded: {lrs:?}");
    let OptimizerRecord::Adam { beta1, beta2, eps, weight_decay, decoupled_weight_decay, batch_size, recorded_batches: Some(ref b), .. } = m.optimizer else {
        panic!("{:?}", m.optimizer)
    };
    assert_eq!((beta1, beta2, eps, weight_decay, decoupled_weight_decay, batch_size), (0.9, 0.999, 1e-8, 0.05, true, Some(8)));
    assert_eq!(b.len(), 40);
    assert_eq!(m.batches().unwrap(), *b);
    // As a native AdamW run: the preconditioners beside the states, the preconditioned form.
    assert_eq!(run.load_preconditioners().unwrap().unwrap().len(), 40);
    assert_eq!(out.form, KernelForm::Preconditioned);
    assert!(out.reg.is_some() && out.rounding.as_deref().map_or(1.0, max_abs) < 1e-12);
    // The CLI's kernel and a tampered update.
    run_ok(&["kernel", "--run", "run", "--out", "k", "-q"], d);
    let rewrite_bias = |path: &Path| {
        let (mut t, meta) = read_tensors(path);
        t.get_mut("4.bias").unwrap().1[1] += 1e-6;
        let arrays: Vec<_> = t.into_iter().map(|(k, (shape, v))| pathkernel::io::NamedArray::f64(k, shape, v)).collect();
        pathkernel::io::write_safetensors(path, &arrays, Some(meta)).unwrap();
    };
    rewrite_bias(&d.join("rec/step_00012.safetensors"));
    run_fail(&["import", "--from", "torch", "rec", "--out", "bad"], d, "the update of step 11 (w_12 - w_11) differs from the adamw");
    assert!(!d.join("bad").exists());
}

#[test]
fn imported_nesterov_and_dampened_momentum_runs_have_exact_epk_machines() {
    use pathkernel::kernel::{KernelForm, Rule};
    use pathkernel::trajectory::OptimizerRecord;
    let dir = tempfile::tempdir().unwrap();
    let (run, out, _) = import_and_check_epk(dir.path(), "torch-nesterov", 1e-12, Rule::Auto(1e-12));
    assert!(matches!(run.manifest.optimizer, OptimizerRecord::Sgd { momentum: 0.9, nesterov: true, weight_decay: 0.001, dampening: 0.0, batch_size: 8, .. }), "{:?}", run.manifest.optimizer);
    assert_eq!(run.manifest.learning_rates[9..12], [0.2, 0.1, 0.1], "StepLR");
    assert_eq!(out.form, KernelForm::Momentum);
    // The CNN, full batch, momentum with dampening and coupled weight decay.
    let dir = tempfile::tempdir().unwrap();
    let (run, out, _) = import_and_check_epk(dir.path(), "torch-cnn-momentum", 1e-12, Rule::Auto(1e-12));
    assert!(matches!(run.manifest.optimizer, OptimizerRecord::Gd { momentum: 0.8, dampening: 0.3, nesterov: false, weight_decay: 0.001, .. }), "{:?}", run.manifest.optimizer);
    assert_eq!(run.dataset.image_shape, Some([1, 8, 8]));
    assert!(out.reg.is_some());
}

#[test]
fn imported_float32_run_carries_its_rounding_as_a_residual_and_machine_plus_residual_is_the_network() {
    use pathkernel::kernel::Rule;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (run, out, printed) = import_and_check_epk(d, "torch-adamw-f32", 1e-2, Rule::Auto(1e-12));
    assert!(printed.contains("float32"), "{printed}");
    assert!(printed_rel_diff(&printed) > 1e-9, "float32 updates differ from the f64 replay: {printed}");
    assert_eq!(run.manifest.config["import"]["precision"], "float32");
    // The residual is float32 rounding: present, and far below the outputs' motion.
    let residual = max_abs(out.rounding.as_deref().unwrap());
    assert!(residual > 1e-12 && residual < 1e-5, "{residual:e}");
    // A tolerance below its rounding refuses it, naming the step.
    run_fail(&["import", "--from", "torch", "rec", "--out", "strict", "--tolerance", "0.01"], d, "the update of step");
    // Plain float32 SGD steps take the replay too (their residual is carried): a float32 copy
    // of the plain fixture's states is the run they were rounded from.
    let rec = d.join("sgd32");
    copy_recording(&rec);
    for s in 0..=20 {
        let path = rec.join(format!("step_{s:05}.safetensors"));
        let (t, meta) = read_tensors(&path);
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (k, (shape, v)) in t {
            tensors.push((k, shape, v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()));
        }
        write_raw_safetensors(&path, &tensors, safetensors::Dtype::F32, meta);
    }
    let j = std::fs::read_to_string(rec.join("trajectory.json")).unwrap();
    let mut j: serde_json::Value = serde_json::from_str(&j).unwrap();
    j["version"] = 2.into();
    j["dtype"] = "float32".into();
    j["optimizer"] = serde_json::json!({"class": "SGD", "momentum": 0.0, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": false});
    std::fs::write(rec.join("trajectory.json"), j.to_string()).unwrap();
    let printed = run_ok(&["import", "--from", "torch", "sgd32", "--out", "run32"], d);
    assert!(printed.contains("rounded updates"), "{printed}");
    let run = Run::open(&d.join("run32")).unwrap();
    let states = run.load_all().unwrap();
    let pts = pathkernel::kernel::Rows::Test.resolve(&run.dataset).unwrap();
    let req = pathkernel::kernel::Request::new(pathkernel::kernel::KernelKind::Epk).rule(Rule::Auto(1e-12));
    let out = pathkernel::kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    eprintln!("plain sgd in float32: machine vs network {:.3e}, residual {:.3e}", out.max_abs_error(), max_abs(out.rounding.as_deref().unwrap()));
    assert!(out.max_abs_error() <= 1e-11, "{:e}", out.max_abs_error());
}

/// Writes tensors of raw little-endian bytes of one dtype (the test's own safetensors writer,
/// for dtypes `pathkernel::io` does not write).
fn write_raw_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)], dtype: safetensors::Dtype, meta: HashMap<String, String>) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        tensors.iter().map(|(k, shape, bytes)| (k.clone(), safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes).unwrap())).collect();
    let bytes = safetensors::serialize(views, &Some(meta)).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn import_refuses_bad_optimizer_recordings_in_one_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fail = |name: &str, needle: &str| {
        run_fail(&["import", "--from", "torch", name, "--out", "run"], d, needle);
        assert!(!d.join("run").exists() && !d.join("run.partial").exists(), "{name}");
    };
    let edit_json = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        copy_fixture("torch-adamw", &d.join(name));
        let path = d.join(name).join("trajectory.json");
        let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut j);
        std::fs::write(&path, j.to_string()).unwrap();
    };
    // Half precision: a step file in float16, or the recording saying so.
    copy_fixture("torch-adamw", &d.join("half"));
    let path = d.join("half/step_00003.safetensors");
    let (t, meta) = read_tensors(&path);
    let f16 = |x: f64| -> [u8; 2] {
        // float16 by truncating an f32's bits (normal numbers of moderate size, enough here).
        let b = (x as f32).to_bits();
        let (sign, exp, man) = ((b >> 16) & 0x8000, ((b >> 23) & 0xff) as i32 - 127 + 15, (b >> 13) & 0x3ff);
        (if exp <= 0 { sign } else { sign | ((exp as u32) << 10) | man } as u16).to_le_bytes()
    };
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = t.into_iter().map(|(k, (shape, v))| (k, shape, v.iter().flat_map(|x| f16(*x)).collect())).collect();
    write_raw_safetensors(&path, &tensors, safetensors::Dtype::F16, meta);
    fail("half", "half precision (float16/bfloat16) is not supported");
    let (_, _, err) = run(&["import", "--from", "torch", "half", "--out", "run"], d);
    assert!(err.contains("step 3") && err.contains("float32 or float64"), "{err}");
    edit_json("half-json", &|j| j["dtype"] = "float16".into());
    fail("half-json", "half precision");
    // Missing hyper-parameters, all named.
    edit_json("missing", &|j| {
        let o = j["optimizer"].as_object_mut().unwrap();
        o.remove("betas");
        o.remove("eps");
    });
    fail("missing", "optimizer AdamW: missing hyper-parameters betas, eps");
    // amsgrad, with the reason.
    edit_json("amsgrad", &|j| j["optimizer"]["amsgrad"] = true.into());
    fail("amsgrad", "amsgrad = true is not supported: its preconditioner divides by the running maximum");
    // Another hyper-parameter than the one trained: the replay differs at the first step.
    edit_json("beta", &|j| j["optimizer"]["betas"][0] = 0.8.into());
    fail("beta", "the update of step 1 (w_2 - w_1) differs from the adamw");
    edit_json("sgd-as-adam", &|j| j["optimizer"] = serde_json::json!({"class": "SGD", "momentum": 0.9, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": false}));
    fail("sgd-as-adam", "the update of step 0");
    // A learning rate that is not the one used (the schedule matters).
    edit_json("lr", &|j| j["learning_rates"][5] = 0.02.into());
    fail("lr", "the update of step 5 (w_6 - w_5)");
    // Steps missing, or out of order (two step files swapped: their metadata says so).
    copy_fixture("torch-adamw", &d.join("gap"));
    std::fs::remove_file(d.join("gap/step_00017.safetensors")).unwrap();
    fail("gap", "step 17 is missing");
    copy_fixture("torch-adamw", &d.join("order"));
    std::fs::rename(d.join("order/step_00004.safetensors"), d.join("order/tmp")).unwrap();
    std::fs::rename(d.join("order/step_00005.safetensors"), d.join("order/step_00004.safetensors")).unwrap();
    std::fs::rename(d.join("order/tmp"), d.join("order/step_00005.safetensors")).unwrap();
    fail("order", "holds step 5 (its metadata), not step 4: the steps are out of order");
    // Batches that do not fit the updates.
    edit_json("batches", &|j| j["batches"].as_array_mut().unwrap().truncate(39));
    fail("batches", "39 batches for 40 updates");
}

/// `[K, D]` Jacobian of the logits of an exported MLP's last `Linear` (alpha folded in) with
/// respect to its parameters in PyTorch's `parameters_to_vector` order: the weight `[K, h]`
/// row-major, then the bias `[K]`.
fn torch_last_layer_jacobian(phi: &[f64], k: usize, bias: bool) -> nalgebra::DMatrix<f64> {
    let h = phi.len();
    let d = k * h + if bias { k } else { 0 };
    nalgebra::DMatrix::from_fn(k, d, |c, t| {
        if t < k * h {
            if t / h == c {
                phi[t % h]
            } else {
                0.0
            }
        } else if t - k * h == c {
            1.0
        } else {
            0.0
        }
    })
}

#[test]
fn laplace_writes_the_benchmark_fit_equal_to_a_pytorch_order_ggn_of_the_exported_network() {
    use pathkernel::data::Targets;
    use pathkernel::gp::{LaplaceParams, LastLayerLaplace};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, extra) in [("plain", ""), ("scaled", "alpha = 2.5\nzero_last = false\n"), ("nobias", "bias = false\nalpha = 0.5\nzero_last = false\n")] {
        let toml = toy2d("[6, 5]", "tanh", 30, 0.5, 8, 5).replace("activation = \"tanh\"\n", &format!("activation = \"tanh\"\n{extra}"));
        let run = train(d, name, &toml);
        let arch = &run.manifest.architecture;
        let (k, alpha, bias) = (arch.outputs(), arch.alpha, arch.bias);
        let exported = d.join(format!("{name}.safetensors"));
        run_ok(&["export", "--run", name, "--format", "torch", "--out", exported.to_str().unwrap()], d);
        let out = format!("{name}-ll");
        let printed = run_ok(&["laplace", "--run", name, "--out", &out], d);
        assert!(printed.contains("marginal likelihood"), "{printed}");
        let (ll, meta) = read_tensors(&d.join(&out).join("laplace.safetensors"));
        let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join(&out).join("laplace.json")).unwrap()).unwrap();
        let lam: f64 = meta["prior_precision"].parse().unwrap();
        assert_eq!(summary["prior_precision"].as_f64().unwrap(), lam);
        assert_eq!(summary["prior"], "evidence");
        assert_eq!(meta["run_id"], run.manifest.run_id);
        assert_eq!(meta["step"], "30");
        // The benchmark's fit (uncertainty::builtin_methods' call): the same λ and evidence.
        let Targets::Labels(y) = &run.dataset.y_train else { panic!("labels") };
        let (params, init) = (run.load_step(30).unwrap(), run.load_step(0).unwrap());
        let lib = LastLayerLaplace::fit(arch, &params, Some(&init), &run.dataset.x_train, y, &LaplaceParams::default()).unwrap();
        assert_eq!(lib.posterior().prior_precision(), lam, "{name}");
        assert_eq!(summary["log_marginal_likelihood"].as_f64().unwrap(), lib.posterior().evidence());

        // Independently, from the exported nn.Sequential: features φ (the last Linear's
        // inputs), the GGN of the summed cross-entropy in PyTorch's order, the prior λ/α² on the
        // exported (α-folded) parameters.
        let (t, emeta) = read_tensors(&exported);
        let earch: serde_json::Value = serde_json::from_str(&emeta["architecture"]).unwrap();
        let mut trunc = earch.clone();
        let widths = trunc["body"]["widths"].as_array_mut().unwrap();
        widths.pop();
        let h = widths.last().unwrap().as_u64().unwrap() as usize;
        let last = 2 * (widths.len() - 1);
        let features = |x: &[f64]| -> Vec<f64> {
            let mut f = sequential(&t, "", &trunc, x);
            f.iter_mut().for_each(|v| *v = act("tanh", *v));
            f
        };
        let q = h + usize::from(bias);
        let dim = q * k;
        let x = &run.dataset.x_train;
        let m = y.len();
        let (phi, (z, _)) = (features(x), exported_logits(&exported, x));
        let mut ht = nalgebra::DMatrix::<f64>::zeros(dim, dim);
        for i in 0..m {
            let zi = &z[i * k..(i + 1) * k];
            let mx = zi.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = zi.iter().map(|v| (v - mx).exp()).collect();
            let p: Vec<f64> = e.iter().map(|v| v / e.iter().sum::<f64>()).collect();
            let lam_i = nalgebra::DMatrix::from_fn(k, k, |a, b| if a == b { p[a] } else { 0.0 } - p[a] * p[b]);
            let j = torch_last_layer_jacobian(&phi[i * h..(i + 1) * h], k, bias);
            ht += j.transpose() * lam_i * &j;
        }
        let lam_t = lam / (alpha * alpha);
        let prec_t = &ht + nalgebra::DMatrix::identity(dim, dim) * lam_t;
        // Torch index → ours (class-blocked k q + j, the bias at j = h).
        let perm: Vec<usize> = (0..dim).map(|t| if t < k * h { (t / h) * q + t % h } else { (t - k * h) * q + h }).collect();
        let ours = |name: &str, a: usize, b: usize| ll[name].1[perm[a] * dim + perm[b]];
        let scale = prec_t.abs().max();
        for a in 0..dim {
            for b in 0..dim {
                let got = ours("precision", a, b) / (alpha * alpha);
                assert!((got - prec_t[(a, b)]).abs() <= 1e-11 * scale, "{name} precision ({a}, {b}): {got} vs {}", prec_t[(a, b)]);
                assert!((ours("hessian", a, b) / (alpha * alpha) - ht[(a, b)]).abs() <= 1e-11 * scale, "{name} hessian ({a}, {b})");
            }
        }
        for (a, &pa) in perm.iter().enumerate() {
            let w = if a < k * h { t[&format!("{last}.weight")].1[a] } else { t[&format!("{last}.bias")].1[a - k * h] };
            assert!((ll["theta"].1[pa] * alpha - w).abs() <= 1e-15 * w.abs().max(1.0), "{name} θ[{a}]");
        }
        // The logit covariance at the test points: J Σ Jᵀ with Σ = (H + λ/α² I)⁻¹, torch order.
        let sigma = prec_t.clone().try_inverse().unwrap();
        let xt = &run.dataset.x_test;
        let (phi_t, (zt, _)) = (features(xt), exported_logits(&exported, xt));
        let p = xt.len() / 2;
        assert_eq!(ll["cov"].0, vec![p, k, k]);
        assert!(max_abs_diff(&ll["mean"].1, &zt) <= 1e-12, "{name} mean");
        for i in 0..p {
            let j = torch_last_layer_jacobian(&phi_t[i * h..(i + 1) * h], k, bias);
            let c = &j * &sigma * j.transpose();
            for a in 0..k {
                assert!((ll["variance"].1[i * k + a] - c[(a, a)]).abs() <= 1e-9 * c[(a, a)], "{name} variance point {i} class {a}");
                for b in 0..k {
                    assert!((ll["cov"].1[(i * k + a) * k + b] - c[(a, b)]).abs() <= 1e-9 * c.diagonal().max(), "{name} cov point {i} ({a}, {b})");
                }
            }
        }
    }
    // A fixed λ is used as given; other row points.
    run_ok(&["laplace", "--run", "plain", "--prior-precision", "0.25", "--points", "train", "--out", "fixed"], d);
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("fixed/laplace.json")).unwrap()).unwrap();
    assert_eq!((summary["prior"].as_str(), summary["prior_precision"].as_f64(), summary["n_points"].as_u64()), (Some("fixed"), Some(0.25), Some(24)));
    assert!(summary["grid"].is_null());
    // Bad input: one line, nothing written.
    let reg = "[data]\nkind = \"regression1d\"\nn_test = 5\n\n[model]\nkind = \"mlp\"\nhidden = [6]\nactivation = \"tanh\"\nzero_last = false\n\n[train]\nlr = 0.05\nsteps = 3\nloss = \"mse\"\n";
    train(d, "reg", reg);
    run_fail(&["laplace", "--run", "reg", "--out", "x"], d, "needs a classification run");
    run_fail(&["laplace", "--run", "nowhere", "--out", "x"], d, "nowhere");
    run_fail(&["laplace", "--run", "plain", "--prior-precision", "-1", "--out", "x"], d, "prior_precision must be finite and > 0, got -1");
    run_fail(&["laplace", "--run", "plain", "--grid", "1:0:5", "--out", "x"], d, "laplace grid needs finite log10_min < log10_max");
    run_fail(&["laplace", "--run", "plain", "--grid", "-8:8", "--out", "x"], d, "--grid -8:8: expected MIN:MAX:POINTS");
    run_fail(&["laplace", "--run", "plain", "--prior-precision", "1", "--grid", "-8:8:161", "--out", "x"], d, "does not apply with --prior-precision");
    run_fail(&["laplace", "--run", "plain", "--step", "31", "--out", "x"], d, "--step 31 is beyond the last state 30");
    run_fail(&["laplace", "--run", "plain", "--points", "nowhere", "--out", "x"], d, "--points `nowhere`");
    assert!(!d.join("x").exists() && !d.join("x.partial").exists());
    let before = std::fs::read(d.join("fixed/laplace.json")).unwrap();
    run_fail(&["laplace", "--run", "plain", "--out", "fixed"], d, "already exists");
    assert_eq!(std::fs::read(d.join("fixed/laplace.json")).unwrap(), before);
}

/// The recipes beyond plain steps (`tests/data/torch-recipes`, scripts/make_torch_fixture.py):
/// momentum cycled per step, gradient clipping by norm, learning rate 0, vanishing learning
/// rates, Adagrad and centred RMSprop (float32). Each imports within the rounding and its EPK
/// machine is the network.
#[test]
fn imported_recipes_with_cycled_momentum_clipping_zero_lr_adagrad_and_rmsprop_have_exact_epk_machines() {
    use pathkernel::kernel::Rule;
    use pathkernel::trajectory::OptimizerRecord;
    let dir = tempfile::tempdir().unwrap();
    // OneCycleLR's defaults: β1 cycled, lr down to 4e-8 (its last steps are one ulp of the
    // weights, far above 1e-9 of the update), and clip_grad_norm_.
    let (run, out, printed) = import_and_check_epk(&dir.path().join("a"), "torch-recipes/onecycle-clip", 1.0, Rule::Auto(1e-12));
    let OptimizerRecord::Adam { per_step, beta1, .. } = &run.manifest.optimizer else { panic!("{:?}", run.manifest.optimizer) };
    let momenta = per_step.momenta.as_ref().expect("β1 per step");
    assert!(momenta.iter().any(|b| *b < 0.86) && momenta.iter().any(|b| *b > 0.94) && *beta1 == momenta[0], "{momenta:?}");
    let clips = per_step.grad_scales.as_ref().expect("clip factors");
    assert!(clips.iter().any(|c| *c < 1.0), "{clips:?}");
    assert!(run.manifest.learning_rates.iter().cloned().fold(1.0, f64::min) < 1e-6);
    assert!(printed.contains("momentum per step") && printed.contains("gradient clipped by norm"), "{printed}");
    assert!(out.max_abs_error() <= 1e-12, "{:e}", out.max_abs_error());
    // SGD momentum cycled by CyclicLR, clipped.
    let (run, ..) = import_and_check_epk(&dir.path().join("b"), "torch-recipes/cyclic-clip", 1e-9, Rule::Auto(1e-12));
    assert!(matches!(&run.manifest.optimizer, OptimizerRecord::Sgd { per_step, dampening, .. } if per_step.momenta.is_some() && per_step.grad_scales.is_some() && *dampening == 0.1));
    // Adagrad from a warm-up at lr 0: the first step moves the accumulator, not the weights.
    let (run, ..) = import_and_check_epk(&dir.path().join("c"), "torch-recipes/adagrad-warmup", 1e-9, Rule::Auto(1e-12));
    assert_eq!(run.manifest.learning_rates[0], 0.0);
    assert!(matches!(run.manifest.optimizer, OptimizerRecord::Adagrad { lr_decay: 0.01, initial_accumulator_value: 0.1, .. }));
    let s0 = run.load_step(0).unwrap();
    assert_eq!(s0.flat(), run.load_step(1).unwrap().flat(), "lr 0 moves no weight");
    // Centred RMSprop in float32, cosine to lr 0 at the last step.
    let (run, out, printed) = import_and_check_epk(&dir.path().join("d"), "torch-recipes/rmsprop-f32", 1.0, Rule::Auto(1e-12));
    assert!(printed.contains("float32") && printed.contains("rmsprop (lr 0.01, alpha 0.9"), "{printed}");
    assert_eq!(*run.manifest.learning_rates.last().unwrap(), 0.0);
    assert!(out.rounding.as_deref().map_or(0.0, max_abs) > 0.0, "float32 rounding is carried");
}

/// What the replay cannot follow is refused in one line naming why, exit 2, nothing written.
#[test]
fn import_refuses_clipping_by_value_rmsprop_momentum_and_bad_per_step_entries() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let edit = |name: &str, f: &dyn Fn(&mut serde_json::Value)| {
        copy_fixture("torch-recipes/onecycle-clip", &d.join(name));
        let p = d.join(name).join("trajectory.json");
        let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        f(&mut j);
        std::fs::write(&p, j.to_string()).unwrap();
    };
    let fail = |name: &str, needle: &str| {
        run_fail(&["import", "--from", "torch", name, "--out", "run"], d, needle);
        assert!(!d.join("run").exists(), "{name}");
    };
    edit("value", &|j| j["clip"] = serde_json::json!({"kind": "value", "clip_value": 0.05}));
    fail("value", "gradient clipping by value (clip_grad_value_, clip_value 0.05) is not supported");
    edit("rms", &|j| {
        j["optimizer"] = serde_json::json!({"class": "RMSprop", "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.9, "centered": false, "maximize": false});
        j.as_object_mut().unwrap().remove("momenta");
    });
    fail("rms", "RMSprop with momentum = 0.9 is not supported");
    edit("short", &|j| j["momenta"].as_array_mut().unwrap().truncate(3));
    fail("short", "3 momenta for 20 updates");
    edit("factor", &|j| j["clip"]["factors"][4] = 1.5.into());
    fail("factor", "factors[4] = 1.5; a clip factor is in (0, 1]");
    // A clip factor that is not the gradient's: named with both figures.
    edit("wrongclip", &|j| {
        let c = j["clip"]["factors"][7].as_f64().unwrap();
        j["clip"]["factors"][7] = (c * 0.9).into();
    });
    fail("wrongclip", "clip: factors[7]");
    edit("neg", &|j| j["learning_rates"][2] = (-0.1).into());
    fail("neg", "learning_rates[2] = -0.1; it must be a finite number >= 0");
}
