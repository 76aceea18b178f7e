//! PyTorch's own `nn.MultiheadAttention` in and out: a pre-norm transformer block whose attention
//! is `torch_model.MHSelfAttention` (an `nn.MultiheadAttention` held as `attn`, used as causal
//! self-attention with biases), recorded under AdamW with a warm-up and cosine schedule
//! (`tests/data/torch-mha-adamw`) and imported as the layer `self_attention` with
//! `layout = "packed"`, whose tensors are PyTorch's (`attn.in_proj_weight`, …): the replay is
//! AdamW's, the states are the recorded tensors under the same names, the network is PyTorch's,
//! the EPK's machine is the network and the export is the recorded `state_dict`; the round trip
//! PyTorch → `[model] init` → train → export → PyTorch (`tests/data/torch-mha`); and the refusals
//! of what the layer cannot express. The fixtures are written by `scripts/make_torch_fixture.py
//! --only torch-mha-adamw`.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::io::SafeFile;
use pathkernel::kernel::{self, KernelKind, Request, Rows, Rule};
use pathkernel::model::Params;
use pathkernel::trajectory::Run;

/// The tensors of an exported (or recorded) file as the run's parameters, by the names of
/// `run`'s architecture (PyTorch's).
fn params_of(run: &Run, path: &Path) -> Params {
    let f = SafeFile::open(path).unwrap();
    let specs = run.manifest.architecture.param_specs();
    let data = specs.iter().map(|s| f.f64(&s.name, Some(&s.shape)).unwrap().1).collect();
    Params { specs, data }
}

/// `logits` `[14, 7]` of a fixture file, as log-softmax rows (our f).
fn pytorch_log_softmax(rel: &str) -> Vec<f64> {
    let (shape, mut z) = SafeFile::open(&fixture(rel)).unwrap().f64("logits", None).unwrap();
    assert_eq!(shape, [14, 7]);
    pathkernel::model::log_softmax_rows(&mut z, 7);
    z
}

/// The number after `key` in the import's summary line.
fn figure(printed: &str, key: &str) -> f64 {
    printed.split(key).nth(1).unwrap().split_whitespace().next().unwrap().trim_end_matches(',').parse().unwrap()
}

#[test]
fn multihead_attention_adamw_recording_imports_with_pytorchs_names_and_an_exact_epk_machine() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_fixture("torch-mha-adamw", &d.join("rec"));
    let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "run"], d);
    eprintln!("{printed}");
    assert!(
        printed.contains("Residual(Sequential(LayerNorm(6), MHSelfAttention(6, num_heads=2, bias=True, causal=True))), LastToken(), Residual(Sequential(LayerNorm(6), Linear(6, 12), ReLU(), Linear(12, 6))), Linear(6, 7))"),
        "{printed}"
    );
    // AdamW's updates replayed within the default tolerance (the key biases, whose gradient is
    // rounding, carry it over Adam's ε: the check's unit includes the update's sensitivity to the
    // gradient's rounding, `interop::step_check`).
    let ulps: f64 = printed.split(" ulps of the weights").next().unwrap().rsplit("max ").next().unwrap().parse().unwrap();
    let abs = figure(&printed, "max absolute ");
    assert!(ulps <= 4.0 && abs <= 1e-10, "replay: {ulps} ulps, {abs:e} absolute");
    let run = Run::open(&d.join("run")).unwrap();
    assert_eq!((run.dataset.vocab, run.dataset.n_train(), run.dataset.n_test(), run.manifest.steps), (Some(9), 14, 14, 30));
    // The schedule: warm-up then cosine decay, as the optimizer used it.
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture("torch-mha-adamw/trajectory.json")).unwrap()).unwrap();
    let lrs: Vec<f64> = json["learning_rates"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!(lrs[0] < lrs[3] && lrs[3] > lrs[29] && lrs[29] < 1e-4, "{lrs:?}");
    // PyTorch's names, tensor for tensor: the states are the recorded state_dicts.
    let specs = run.manifest.architecture.param_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    for n in ["1.body.1.attn.in_proj_weight", "1.body.1.attn.in_proj_bias", "1.body.1.attn.out_proj.weight", "1.body.1.attn.out_proj.bias"] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    for s in [0, 17, 30] {
        assert_eq!(run.load_step(s).unwrap(), params_of(&run, &d.join(format!("rec/step_{s:05}.safetensors"))), "step {s}");
    }
    // The network at w_N is PyTorch's, and the EPK's machine is the network.
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    let e = max_abs_diff(&pytorch_log_softmax("torch-mha-adamw/logits.safetensors"), &epk.network);
    eprintln!("torch-mha-adamw: network vs PyTorch's {e:.3e}; EPK machine vs network {:.3e}", epk.max_abs_error());
    assert!(e <= 1e-12, "network vs PyTorch {e:e}");
    assert!(epk.max_abs_error() <= 1e-10, "machine vs network {:e}", epk.max_abs_error());
    assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-2, "the outputs must move");
    // The structured NTK against the generic autodiff path on the packed layer.
    let req = Request::new(KernelKind::Ntk).rule(Rule::Gauss(1));
    let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic].map(|p| kernel::compute(&run, &states, &pts, &req.clone().path(p), &|_, _| {}).unwrap());
    let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
    eprintln!("torch-mha-adamw: NTK fast vs generic {rel:.3e}");
    assert!(rel <= 1e-12, "{rel:e}");
    // Exported back, the last state is the recorded state_dict, tensor for tensor.
    run_ok(&["export", "--run", "run", "--format", "torch", "--out", "last.safetensors"], d);
    assert_eq!(params_of(&run, &d.join("last.safetensors")), params_of(&run, &d.join("rec/step_00030.safetensors")));
}

#[test]
fn pytorch_init_trained_here_and_exported_loads_into_nn_multiheadattention_as_our_network() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_fixture("torch-mha-adamw", &d.join("rec"));
    std::fs::copy(fixture("torch-mha/roundtrip.toml"), d.join("roundtrip.toml")).unwrap();
    run_ok(&["train", "-q", "--config", "roundtrip.toml", "--out", "run"], d);
    let run = Run::open(&d.join("run")).unwrap();
    // w_0 is PyTorch's initialisation, tensor for tensor.
    assert_eq!(run.load_step(0).unwrap(), params_of(&run, &d.join("rec/step_00000.safetensors")));
    let printed = run_ok(&["export", "--run", "run", "--format", "torch", "--out", "trained.safetensors"], d);
    assert!(printed.contains("MHSelfAttention(6, num_heads=2, bias=True, causal=True)"), "{printed}");
    let exported = params_of(&run, &d.join("trained.safetensors"));
    assert_eq!(exported, run.load_step(12).unwrap());
    // PyTorch's forward of the same export (torch_model.load: load_state_dict into
    // MHSelfAttention's nn.MultiheadAttention; made by the fixture script) is our network.
    let ours = run.manifest.architecture.raw_forward(&exported, &run.dataset.x_test);
    let (shape, torch) = SafeFile::open(&fixture("torch-mha/roundtrip-logits.safetensors")).unwrap().f64("logits", None).unwrap();
    assert_eq!(shape, [14, 7]);
    let e = max_abs_diff(&ours, &torch) / max_abs(&torch).max(1.0);
    eprintln!("round trip PyTorch (nn.MultiheadAttention) -> init -> train -> export -> PyTorch: logits relative difference {e:.3e}");
    assert!(e <= 1e-12, "{e:e}");
    assert!(max_abs_diff(&ours, &run.manifest.architecture.raw_forward(&run.load_step(0).unwrap(), &run.dataset.x_test)) > 1e-2, "trained");
}

/// Exit 2, one line holding `needle`, no panic, nothing written.
fn import_fails(rec: &str, cwd: &Path, needle: &str) {
    let o = Command::new(bin()).args(["import", "--from", "torch", rec, "--out", "run"]).current_dir(cwd).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{rec}: {err}");
    assert!(err.contains(needle), "{rec}: expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{rec}: {err}");
    assert!(!err.contains("panicked"), "{rec}: {err}");
    assert!(!cwd.join("run").exists() && !cwd.join("run.partial").exists(), "{rec}: something was written");
}

/// The recording with its attention module (`model.modules[1].body[1]`) edited, or replaced.
fn edited(cwd: &Path, name: &str, edit: &dyn Fn(&mut serde_json::Value)) {
    copy_fixture("torch-mha-adamw", &cwd.join(name));
    let path = cwd.join(name).join("trajectory.json");
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut j["model"]["modules"][1]["body"][1]);
    std::fs::write(&path, j.to_string()).unwrap();
}

#[test]
fn import_refuses_what_packed_attention_cannot_express_naming_module_and_attribute() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let at = "model.modules[1].body[1] MHSelfAttention(6, num_heads=2, bias=True, causal=True): ";
    for (name, key, value, why) in [
        ("kdim", "kdim", json!(4), "kdim = 4: keys and values of another width than the queries are not self-attention"),
        ("vdim", "vdim", json!(3), "vdim = 3: keys and values of another width"),
        ("bias-kv", "add_bias_kv", json!(true), "add_bias_kv = true: learned key/value biases appended to the sequence are not supported"),
        ("zero-attn", "add_zero_attn", json!(true), "add_zero_attn = true: a zero key/value position appended to the sequence is not supported"),
        ("dropout", "dropout", json!(0.1), "dropout = 0.1 in training mode: its random mask changes the network at every step"),
    ] {
        edited(d, name, &|m| m[key] = value.clone());
        import_fails(name, d, &format!("{at}{why}"));
    }
    // A module of another width than the sequence the stack gives it.
    edited(d, "width", &|m| {
        for key in ["embed_dim", "kdim", "vdim"] {
            m[key] = json!(8);
        }
    });
    import_fails("width", d, &format!("{at}embed_dim = 8, but its input is [4, 6] (a sequence) per sample"));
    // nn.MultiheadAttention itself as a child: not self-attention as a layer of a Sequential.
    edited(d, "bare", &|m| *m = json!({"type": "MultiheadAttention", "repr": "MultiheadAttention(6, num_heads=2)", "embed_dim": 6, "num_heads": 2}));
    import_fails("bare", d, "model.modules[1].body[1] MultiheadAttention(6, num_heads=2): nn.MultiheadAttention takes (query, key, value) and returns (output, weights)");
    // Evaluation-mode dropout and batch_first = False are the same function: the block imports.
    edited(d, "eval", &|m| {
        m["dropout"] = json!(0.1);
        m["training"] = json!(false);
        m["batch_first"] = json!(false);
    });
    run_ok(&["import", "--from", "torch", "eval", "--out", "run"], d);
}

/// The Python that has torch: `PATHKERNEL_TORCH_PYTHON` (default `python3`).
fn torch_python() -> String {
    std::env::var("PATHKERNEL_TORCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Live against PyTorch: stacks with packed attention trained here (no biases and three heads;
/// biases, causal and inside a residual), exported, and run by `scripts/torch_model.py` (the
/// export loaded into `MHSelfAttention`'s `nn.MultiheadAttention`) on the kernel's rows: PyTorch's
/// f equals ours.
#[test]
#[ignore = "needs a Python with torch, numpy and pyarrow: PATHKERNEL_TORCH_PYTHON (default python3)"]
fn export_of_packed_attention_runs_in_pytorch_as_our_network() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/torch_model.py");
    for (name, attention) in [
        ("plain", r#"{ self_attention = { heads = 3, layout = "packed" } }"#),
        ("block", r#"{ residual = ["layer_norm", { self_attention = { heads = 2, bias = true, causal = true, layout = "packed" } }] }"#),
    ] {
        let toml = format!(
            "[data]\nkind = \"modular\"\np = 5\ntrain_frac = 0.5\nseed = 1\n\n[model]\nkind = \"layers\"\nzero_last = false\nlayers = [{{ embedding = {{ vocab = 7, dim = 6 }} }}, {attention}, \"last_token\", {{ dense = 7 }}]\n\n[train]\noptimizer = \"adamw\"\nlr = 0.02\nsteps = 5\nseed = 2\n"
        );
        std::fs::write(d.join(format!("{name}.toml")), toml).unwrap();
        run_ok(&["train", "-q", "--config", &format!("{name}.toml"), "--out", name], d);
        run_ok(&["export", "--run", name, "--format", "torch", "--out", &format!("{name}.safetensors")], d);
        run_ok(&["kernel", "-q", "--run", name, "--kind", "ntk", "--out", &format!("{name}-k")], d);
        let o = Command::new(torch_python()).arg(&script).arg(d.join(format!("{name}.safetensors"))).arg(d.join(format!("{name}-k"))).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{name}: {out} {}", String::from_utf8_lossy(&o.stderr));
        let e: f64 = out.split("max |torch f - pathkernel f| = ").nth(1).unwrap().trim().parse().unwrap();
        eprintln!("{name}: PyTorch's forward of the export vs ours {e:.3e}");
        assert!(e <= 1e-12, "{name}: {e:e}");
    }
}
