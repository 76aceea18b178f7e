//! PyTorch layer stacks in and out: a recorded `nn.Sequential` of conv, residual, layer norm and
//! GELU layers trained by AdamW on mini-batches, imported from its module structure
//! (`tests/data/torch-stack-adamw`), its EPK machine exact and its network PyTorch's; the round
//! trip PyTorch → `[model] init` → train → export against PyTorch's forward of the export
//! (`tests/data/torch-stack`); and the refusals of what a stack cannot express. The fixtures and
//! the PyTorch outputs are written by `scripts/make_torch_fixture.py`.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::io::SafeFile;
use pathkernel::model::Params;
use pathkernel::trajectory::Run;

/// Exit 2, one line holding `needle`, no panic, `out` not created.
fn import_fails(rec: &str, cwd: &Path, needle: &str) {
    let o = Command::new(bin()).args(["import", "--from", "torch", rec, "--out", "run"]).current_dir(cwd).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{rec}: {err}");
    assert!(err.contains(needle), "{rec}: expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{rec}: {err}");
    assert!(!err.contains("panicked"), "{rec}: {err}");
    assert!(!cwd.join("run").exists() && !cwd.join("run.partial").exists(), "{rec}: something was written");
}

/// `logits` `[P, K]` of a safetensors file written by the fixture script (PyTorch's forward).
fn torch_logits(rel: &str) -> (Vec<usize>, Vec<f64>) {
    SafeFile::open(&fixture(rel)).unwrap().f64("logits", None).unwrap()
}

/// The tensors of an exported (or recorded) file as the run's parameters, by the names of
/// `run`'s architecture (PyTorch's).
fn params_of(run: &Run, path: &Path) -> Params {
    let f = SafeFile::open(path).unwrap();
    let specs = run.manifest.architecture.param_specs();
    let data = specs.iter().map(|s| f.f64(&s.name, Some(&s.shape)).unwrap().1).collect();
    Params { specs, data }
}

#[test]
fn imported_layer_stack_adamw_run_has_an_exact_epk_machine_and_is_pytorchs_network() {
    use pathkernel::kernel::{self, KernelForm, KernelKind, Request, Rows, Rule};
    use pathkernel::model::Body;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_fixture("torch-stack-adamw", &d.join("rec"));
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "run"], d);
    eprintln!("{printed}");
    assert!(printed.contains("Residual(Sequential(Conv2d(4, 6, 3, stride=2, padding=1), GELU()), shortcut=Conv2d(4, 6, 1, stride=2, padding=0))"), "{printed}");
    assert!(printed.contains("ChannelLayerNorm(4)") && printed.contains("LayerNorm(24)"), "{printed}");
    let rel: f64 = printed.split("max relative difference ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(rel <= 1e-12, "replay difference {rel:e}");
    let run = Run::open(&d.join("run")).unwrap();
    assert!(matches!(run.manifest.architecture.body, Body::Layers { .. }));
    assert_eq!(run.dataset.image_shape, Some([1, 8, 8]));
    // The EPK on the test points: machine = network.
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let out = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    let scale = max_abs(&out.network).max(1.0);
    eprintln!("torch-stack-adamw: EPK machine vs network {:.3e} (output scale {scale:.3})", out.max_abs_error());
    assert_eq!(out.form, KernelForm::Preconditioned);
    assert!(out.max_abs_error() <= 1e-11 * scale, "{:e}", out.max_abs_error());
    assert!(max_abs_diff(&out.network, &out.bias) > 1e-2, "the outputs must move");
    // The network is the recorded PyTorch model's: log-softmax of PyTorch's own logits at w_N.
    let (shape, mut z) = torch_logits("torch-stack/recorded-logits.safetensors");
    assert_eq!(shape, [8, 3]);
    pathkernel::model::log_softmax_rows(&mut z, 3);
    let e = max_abs_diff(&z, &out.network);
    eprintln!("torch-stack-adamw: network vs PyTorch's {e:.3e}");
    assert!(e <= 1e-12 * scale, "{e:e}");
    // Exported back, the last state is the recorded state_dict, tensor for tensor.
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "last.safetensors"], d);
    assert_eq!(params_of(&run, &d.join("last.safetensors")), params_of(&run, &d.join("rec/step_00030.safetensors")));
}

#[test]
fn pytorch_init_trained_here_and_exported_runs_in_pytorch_as_our_network() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_fixture("torch-stack-adamw", &d.join("rec"));
    std::fs::copy(fixture("torch-stack/roundtrip.toml"), d.join("roundtrip.toml")).unwrap();
    run_ok(&["train", "-q", "--config", "roundtrip.toml", "--out", "run"], d);
    let run = Run::open(&d.join("run")).unwrap();
    // w_0 is PyTorch's initialisation, tensor for tensor.
    assert_eq!(run.load_step(0).unwrap(), params_of(&run, &d.join("rec/step_00000.safetensors")));
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "trained.safetensors"], d);
    let exported = params_of(&run, &d.join("trained.safetensors"));
    assert_eq!(exported, run.load_step(10).unwrap());
    // PyTorch's forward of the same export (made by the fixture script) is our network.
    let arch = &run.manifest.architecture;
    let ours = arch.raw_forward(&exported, &run.dataset.x_test);
    let (shape, torch) = torch_logits("torch-stack/roundtrip-logits.safetensors");
    assert_eq!(shape, [8, 3]);
    let e = max_abs_diff(&ours, &torch) / max_abs(&torch).max(1.0);
    eprintln!("round trip PyTorch -> init -> train -> export -> PyTorch: logits relative difference {e:.3e}");
    assert!(e <= 1e-12, "{e:e}");
    assert!(max_abs_diff(&ours, &arch.raw_forward(&run.load_step(0).unwrap(), &run.dataset.x_test)) > 1e-2, "trained");
}

/// The fixture copied to `cwd/name` with its `trajectory.json` edited.
fn edited(cwd: &Path, name: &str, edit: &dyn Fn(&mut serde_json::Value)) {
    copy_fixture("torch-stack-adamw", &cwd.join(name));
    let path = cwd.join(name).join("trajectory.json");
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut j);
    std::fs::write(&path, j.to_string()).unwrap();
}

#[test]
fn import_refuses_what_a_stack_cannot_express_naming_the_module() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let modules = |j: &mut serde_json::Value| -> Vec<serde_json::Value> { j["model"]["modules"].as_array().unwrap().clone() };
    // Batch norm, with the reason.
    edited(d, "bn", &|j| {
        let mut m = modules(j);
        m.insert(1, json!({"type": "BatchNorm2d", "repr": "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"}));
        j["model"]["modules"] = m.into();
    });
    import_fails("bn", d, "model.modules[1] BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True): batch norm is not supported: in training mode a point's output depends on the other points of its batch");
    // Dropout in training mode, with the reason.
    edited(d, "dropout", &|j| {
        let mut m = modules(j);
        m.insert(6, json!({"type": "Dropout", "repr": "Dropout(p=0.5, inplace=False)", "p": 0.5, "training": true}));
        j["model"]["modules"] = m.into();
    });
    import_fails("dropout", d, "model.modules[6] Dropout(p=0.5, inplace=False): dropout in training mode is not supported: its random mask");
    // A custom module, inside a residual body.
    edited(d, "custom", &|j| j["model"]["modules"][3]["body"][2] = json!({"type": "MyGate", "repr": "MyGate(width=4)"}));
    import_fails("custom", d, "model.modules[3].body[2] MyGate(width=4): the module `MyGate` is not a layer pathkernel can express");
    // The tanh approximation of GELU is another function.
    edited(d, "gelu", &|j| {
        j["model"]["modules"][4]["body"][1]["approximate"] = "tanh".into();
        j["model"]["modules"][4]["body"][1]["repr"] = "GELU(approximate='tanh')".into();
    });
    import_fails("gelu", d, "GELU(approximate='tanh'): approximate = \"tanh\": only the exact (erf) GELU is supported");
    // A projection residual recorded without its shortcut.
    edited(d, "shortcut", &|j| j["model"]["modules"][4]["shortcut"] = serde_json::Value::Null);
    import_fails("shortcut", d, "model.modules[4] Residual: the body turns [4, 4, 4] into [6, 2, 2]: it needs a projection shortcut");
    // A layer whose recorded input is not what the stack gives it.
    edited(d, "linear", &|j| j["model"]["modules"][7]["in_features"] = 25.into());
    import_fails("linear", d, "model.modules[7] Linear(in_features=24, out_features=3, bias=True): in_features = 25, but its input is [24] per sample");
}

#[test]
fn import_lists_every_state_dict_mismatch_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Step 0 with a tensor missing, one of the wrong shape and one the stack does not have.
    copy_fixture("torch-stack-adamw", &d.join("names"));
    let path = d.join("names/step_00000.safetensors");
    let f = SafeFile::open(&path).unwrap();
    let mut arrays = Vec::new();
    for name in f.names() {
        let (mut shape, v) = f.f64(&name, None).unwrap();
        match name.as_str() {
            "6.bias" => continue,
            "3.body.1.weight" => shape = vec![2, 2],
            _ => {}
        }
        arrays.push(pathkernel::io::NamedArray::f64(name, shape, v));
    }
    arrays.push(pathkernel::io::NamedArray::f64("8.weight", vec![1], vec![0.0]));
    pathkernel::io::write_safetensors(&path, &arrays, Some(f.metadata())).unwrap();
    import_fails("names", d, "(3): ");
    let o = Command::new(bin()).args(["import", "--from", "torch", "names", "--out", "run"]).current_dir(d).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    for needle in ["step 0", "missing `6.bias` [24]", "`3.body.1.weight` has shape [2, 2], expected [4]", "unexpected `8.weight` [1]"] {
        assert!(err.contains(needle), "expected `{needle}` in: {err}");
    }
}

#[test]
fn export_folds_alpha_into_a_stack_only_where_the_output_is_linear_in_the_last_layer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = |layers: &str| {
        toy2d("[4]", "tanh", 3, 0.5, 6, 4).replace(
            "kind = \"mlp\"\nhidden = [4]\nactivation = \"tanh\"\n",
            &format!("kind = \"layers\"\nlayers = {layers}\nalpha = 2.5\nzero_last = false\n"),
        )
    };
    std::fs::write(d.join("lin.toml"), cfg("[{ dense = 5 }, \"gelu\", { dense = 3 }]")).unwrap();
    run_ok(&["train", "-q", "--config", "lin.toml", "--out", "lin"], d);
    run_ok(&["export", "--run", "lin", "--format", "torch", "--out", "lin.safetensors"], d);
    let run = Run::open(&d.join("lin")).unwrap();
    let arch = &run.manifest.architecture;
    let (exported, last) = (params_of(&run, &d.join("lin.safetensors")), run.load_step(3).unwrap());
    // The exported file's network (α folded into `2.*`) gives α·g_w: our logits.
    let z = arch.raw_forward(&exported, &run.dataset.x_test);
    let want: Vec<f64> = arch.raw_forward(&last, &run.dataset.x_test).iter().map(|v| 2.5 * v).collect();
    assert!(max_abs_diff(&z, &want) <= 1e-13 * max_abs(&want), "{:e}", max_abs_diff(&z, &want));
    // Ending in an activation, α cannot be folded: refused in one line, nothing written.
    std::fs::write(d.join("act.toml"), cfg("[{ dense = 5 }, \"gelu\", { dense = 3 }, \"tanh\"]")).unwrap();
    run_ok(&["train", "-q", "--config", "act.toml", "--out", "act"], d);
    let o = Command::new(bin()).args(["export", "--run", "act", "--format", "torch", "--out", "act.safetensors"]).current_dir(d).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("alpha = 2.5 cannot be folded into the last layer of Sequential(Linear(2, 5), GELU(), Linear(5, 3), Tanh())"), "{err}");
    assert_eq!(err.trim().lines().count(), 1);
    assert!(!d.join("act.safetensors").exists());
}
