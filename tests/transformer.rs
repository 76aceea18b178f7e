//! A transformer end to end: ExPLAIND's grokking block (embedding scaled by √d, heads with a
//! shared query/key/value projection, the last position read out, a residual ReLU MLP, the
//! unembedding) on `a + b mod 7`, trained with AdamW and weight decay by `pathkernel train`, and
//! the EPK's kernel machine equal to the network (`pathkernel kernel --kind epk`); the same block
//! recorded in PyTorch, imported (`pathkernel import --from torch`) and exported back.

mod common;

use std::process::Command;

use common::*;
use pathkernel::kernel::{self, KernelKind, Layout, Request, Rows, Rule};

const CONFIG: &str = include_str!("data/transformer/modular-addition.toml");

/// `pathkernel train` then `pathkernel kernel --kind epk --strict`: the machine reproduces the
/// network to 1e-10 on the held-out pairs (read back from `exactness.json`), every piece of the
/// adaptive rule converged, and the network moved.
#[test]
fn explaind_block_epk_reproduces_the_network_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("modular.toml"), CONFIG).unwrap();
    let o = Command::new(bin()).args(["train", "-q", "--config", "modular.toml", "--out", "run"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "train: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(bin()).args(["kernel", "-q", "--run", "run", "--kind", "epk", "--strict", "--out", "k"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "kernel: {}", String::from_utf8_lossy(&o.stderr));
    let ex: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("k/exactness.json")).unwrap()).unwrap();
    let err = ex["max_abs_error"].as_f64().unwrap();
    eprintln!("transformer EPK (cli): max |machine − network| {err:e}, {} unconverged pieces, evaluations {}", ex["unconverged_pieces"], ex["evaluations_per_step"]);
    assert_eq!(ex["shape"], serde_json::json!([14, 14, 9]), "14 held-out pairs, 14 training pairs, 9 outputs");
    assert_eq!(ex["unconverged_pieces"], 0);
    assert!(err <= 1e-10, "machine vs network {err:e}");
    let run = pathkernel::trajectory::Run::open(&d.join("run")).unwrap();
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-2, "the network barely moved");
}

/// The structured stack path (each layer's backward pass) equals the generic dfdx path
/// (per-sample autodiff Jacobians) through `compute()`: EPK, DPK and NTK Grams and machines.
#[test]
fn explaind_block_fast_path_equals_generic_path() {
    let dir = tempfile::tempdir().unwrap();
    let toml = CONFIG.replace("steps = 12", "steps = 3");
    let run = train(dir.path(), "tf", &toml);
    let states = run.load_all().unwrap();
    for (kind, rule, points, layout) in [
        (KernelKind::Epk, Rule::Gauss(3), Rows::Test, Layout::Full),
        (KernelKind::Dpk, Rule::Gauss(1), Rows::Train, Layout::Diag),
        (KernelKind::Ntk, Rule::Gauss(1), Rows::Test, Layout::Full),
    ] {
        let pts = points.resolve(&run.dataset).unwrap();
        let req = Request::new(kind).rule(rule).layout(layout);
        let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic].map(|path| kernel::compute(&run, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
        let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
        eprintln!("transformer {kind} {layout}: fast vs generic {rel:e}");
        assert!(rel <= 1e-12, "{kind} {layout}: Gram relative difference {rel:e}");
        let rel = max_abs_diff(&fast.machine, &slow.machine) / max_abs(&slow.machine);
        assert!(rel <= 1e-12, "{kind}: kernel machine relative difference {rel:e}");
    }
}

/// A PyTorch recording of the same block (`torch_model`'s `ScaledEmbedding`, `SelfAttention`,
/// `LastToken`; AdamW, float64; `tests/data/torch-transformer-adamw`, written by
/// `scripts/make_torch_fixture.py`) imported as a run: the recorded updates are AdamW's replayed
/// here, the network is PyTorch's (its logits at the last state), the EPK's machine is the
/// network, and the export of the last state is the recorded `state_dict`, tensor for tensor.
#[test]
fn pytorch_transformer_recording_imports_with_an_exact_epk_machine() {
    use pathkernel::io::SafeFile;
    use pathkernel::model::Params;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch-transformer-adamw");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("rec")).unwrap();
    for e in std::fs::read_dir(&fixture).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.join("rec").join(p.file_name().unwrap())).unwrap();
    }
    let o = Command::new(bin()).args(["import", "--from", "torch", "rec", "--out", "run"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "import: {}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{printed}");
    assert!(printed.contains("Sequential(ScaledEmbedding(9, 8, scale=2.8284271247461903), SelfAttention(8, heads=2, head_dim=4, shared_qkv=True, bias=False, causal=False), LastToken(), "), "{printed}");
    let rel: f64 = printed.split("max relative difference ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(rel <= 1e-12, "replay difference {rel:e}");
    let run = pathkernel::trajectory::Run::open(&d.join("run")).unwrap();
    assert_eq!(run.dataset.vocab, Some(9));
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    let scale = max_abs(&epk.network).max(1.0);
    eprintln!("torch transformer: EPK max |machine − network| {:e} (output scale {scale:.3})", epk.max_abs_error());
    assert!(epk.max_abs_error() <= 1e-10 * scale, "{:e}", epk.max_abs_error());
    assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-2, "the outputs must move");
    let (shape, mut z) = SafeFile::open(&fixture.join("logits.safetensors")).unwrap().f64("logits", None).unwrap();
    assert_eq!(shape, [14, 9]);
    pathkernel::model::log_softmax_rows(&mut z, 9);
    let e = max_abs_diff(&z, &epk.network);
    eprintln!("torch transformer: network vs PyTorch's {e:.3e}");
    assert!(e <= 1e-12 * scale, "{e:e}");
    let o = Command::new(bin()).args(["export", "--run", "run", "--format", "torch", "--out", "last.safetensors"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "export: {}", String::from_utf8_lossy(&o.stderr));
    let params_of = |path: &std::path::Path| {
        let f = SafeFile::open(path).unwrap();
        let specs = run.manifest.architecture.param_specs();
        let data = specs.iter().map(|s| f.f64(&s.name, Some(&s.shape)).unwrap().1).collect();
        Params { specs, data }
    };
    assert_eq!(params_of(&d.join("last.safetensors")), params_of(&d.join("rec/step_00010.safetensors")));
}

/// A pre-norm transformer block whose MLP runs at every position (`dense` on the sequence, its
/// per-sample gradient formed; a position-wise projection shortcut), read out by the mean over
/// positions, trained by AdamW: the EPK machine equals the network (strict, every piece
/// converged), and the structured path equals the generic dfdx path for the EPK and the NTK.
#[test]
fn position_wise_block_is_exact_and_equals_the_generic_path() {
    let dir = tempfile::tempdir().unwrap();
    let layers = r#"layers = [
  { embedding = { vocab = 9, dim = 8, positions = true } },
  { residual = ["layer_norm", { self_attention = { heads = 2, causal = true } }] },
  { residual = ["layer_norm", { dense = 12 }, "relu", { dense = 6 }, "gelu"] },
  "mean_tokens",
  { dense = { features = 9, bias = false } },
]"#;
    let start = CONFIG.find("layers = [").unwrap();
    let end = start + CONFIG[start..].find("\n]").unwrap() + 2;
    let toml = format!("{}{layers}{}", &CONFIG[..start], &CONFIG[end..]).replace("steps = 12", "steps = 6");
    let run = train(dir.path(), "pw", &toml);
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    let err = max_abs_diff(&epk.machine, &epk.network);
    eprintln!("position-wise block EPK: machine vs network {err:e}");
    assert!(err <= 1e-11 && max_abs_diff(&epk.network, &epk.bias) > 1e-3, "machine vs network {err:e}");
    for (kind, rule) in [(KernelKind::Epk, Rule::Gauss(3)), (KernelKind::Ntk, Rule::Gauss(1))] {
        let req = Request::new(kind).rule(rule);
        let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic].map(|path| kernel::compute(&run, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
        let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
        eprintln!("position-wise block {kind}: fast vs generic {rel:e}");
        assert!(rel <= 1e-12, "{kind}: Gram relative difference {rel:e}");
    }
}
