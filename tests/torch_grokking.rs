//! ExPLAIND's grokking transformer recorded as one PyTorch module with its own tensor names
//! (`scripts/grokking_torch.py --record`: model kind `stack`, the layer list and a mapping of the
//! stack's parameter names to `input_emb.weight`, `head{h}_encoder.weight`, …), imported
//! (`pathkernel import --from torch`): the network is PyTorch's (its float64 forward of the
//! recorded weights), the EPK's machine is the network, and a mapping or shapes that do not fit
//! are refused in one line with nothing written.
//!
//! Fixtures: `tests/data/torch-grokking` (float64) and `torch-grokking-f32` (float32), written by
//! `scripts/make_torch_fixture.py --only torch-grokking` (and `torch-grokking-f32`).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::io::SafeFile;
use pathkernel::kernel::{self, KernelKind, Request, Rows, Rule};

/// Exit 2, one line holding every needle, no panic, `run` not created.
fn import_fails(rec: &str, cwd: &Path, needles: &[&str]) {
    let o = Command::new(bin()).args(["import", "--from", "torch", rec, "--out", "run"]).current_dir(cwd).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{rec}: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{rec}: expected `{needle}` in: {err}");
    }
    assert_eq!(err.trim().lines().count(), 1, "{rec}: {err}");
    assert!(!err.contains("panicked"), "{rec}: {err}");
    assert!(!cwd.join("run").exists() && !cwd.join("run.partial").exists(), "{rec}: something was written");
}

/// The module's float64 log-softmax on the held-out pairs at the last state, from the fixture's
/// `logits.safetensors` (`[6, 7]`).
fn pytorch_log_softmax(name: &str) -> Vec<f64> {
    let (shape, mut z) = SafeFile::open(&fixture(name).join("logits.safetensors")).unwrap().f64("logits", None).unwrap();
    assert_eq!(shape, [6, 7]);
    pathkernel::model::log_softmax_rows(&mut z, 7);
    z
}

/// Both fixtures: the import reads the stack and the mapping (the printed module is ours), the
/// replay agrees with the recorded updates, the network at w_N is PyTorch's float64 forward of the
/// recorded weights (to 1e-12), and `kernel --kind epk --strict` gives a machine within 1e-10 of
/// the network with every piece converged.
#[test]
fn grokking_recordings_import_by_name_with_an_exact_epk_machine() {
    for (name, max_rel_replay) in [("torch-grokking", 1e-12), ("torch-grokking-f32", 1e-4)] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        copy_fixture(name, &d.join("rec"));
        let printed = run_ok(&["import", "--from", "torch", "rec", "--out", "run"], d);
        eprintln!("{name}: {printed}");
        assert!(
            printed.contains("Sequential(ScaledEmbedding(7, 8, scale=2.8284271247461903), SelfAttention(8, heads=2, head_dim=4, shared_qkv=True, bias=False, causal=False), LastToken(), Residual(Sequential(Linear(8, 16), ReLU(), Linear(16, 8), ReLU())), Linear(8, 7, bias=False))"),
            "{printed}"
        );
        assert!(printed.contains(if name.ends_with("f32") { "float32" } else { "float64" }), "{printed}");
        let rel: f64 = printed.split("max relative difference ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        assert!(rel <= max_rel_replay, "{name}: replay difference {rel:e}");
        let run = pathkernel::trajectory::Run::open(&d.join("run")).unwrap();
        assert_eq!(run.dataset.vocab, Some(7));
        assert_eq!((run.dataset.n_train(), run.dataset.n_test(), run.manifest.steps), (9, 6, 8));
        assert_eq!(run.manifest.num_params, 520);
        let names = &run.manifest.config["import"]["names"];
        assert_eq!(names["0.weight"], "input_emb.weight");
        assert_eq!(names["1.head2_decoder.weight"], "head2_decoder.weight");
        assert_eq!(names["3.body.2.bias"], "linear2.bias");
        // The states are the recorded tensors under our names.
        let last = run.load_step(8).unwrap();
        let bytes = std::fs::read(d.join("rec/step_00008.safetensors")).unwrap();
        let rec = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (spec, ours) in last.specs.iter().zip(&last.data) {
            let theirs = names[&spec.name].as_str().unwrap();
            let t = rec.tensor(theirs).unwrap();
            let v: Vec<f64> = match t.dtype() {
                safetensors::Dtype::F64 => t.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
                safetensors::Dtype::F32 => t.data().chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
                other => panic!("{theirs}: {other:?}"),
            };
            assert_eq!(t.shape(), spec.shape.as_slice(), "{}", spec.name);
            assert_eq!(&v, ours, "{} <- {theirs}", spec.name);
        }
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
        let e = max_abs_diff(&pytorch_log_softmax(name), &epk.network);
        eprintln!("{name}: network vs PyTorch's float64 forward {e:.3e}");
        assert!(e <= 1e-12, "{name}: network vs PyTorch {e:e}");
        assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-2, "{name}: the outputs must move");
        run_ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--strict", "--out", "k"], d);
        let ex: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("k/exactness.json")).unwrap()).unwrap();
        let err = ex["max_abs_error"].as_f64().unwrap();
        eprintln!("{name}: EPK machine vs network {err:e}");
        assert_eq!(ex["unconverged_pieces"], 0);
        assert!(err <= 1e-10, "{name}: machine vs network {err:e}");
    }
}

/// A mapping that misses a parameter, names an unknown one, uses a recorded name twice or points
/// at a tensor the file does not hold, and a stack whose shapes are not the tensors': each one line,
/// exit 2, nothing written. The recording as the recorder wrote it before it knew the stack (one
/// `GrokkingTransformer` module) is refused naming the module and the remedy.
#[test]
fn mismatched_names_and_shapes_are_one_line_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    copy_fixture("torch-grokking", &d.join("good"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("torch-grokking").join("trajectory.json")).unwrap()).unwrap();
    let variant = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        copy_fixture("torch-grokking", &d.join(name));
        let mut j = json.clone();
        edit(&mut j);
        std::fs::write(d.join(name).join("trajectory.json"), serde_json::to_string(&j).unwrap()).unwrap();
    };
    variant("missing", &|j| {
        j["model"]["names"].as_object_mut().unwrap().remove("3.body.0.bias");
    });
    import_fails("missing", d, &["trajectory.json", "no recorded name for `3.body.0.bias`"]);
    variant("unknown", &|j| j["model"]["names"]["5.weight"] = "extra.weight".into());
    import_fails("unknown", d, &["`5.weight` not a parameter of the stack"]);
    variant("twice", &|j| j["model"]["names"]["4.weight"] = "input_emb.weight".into());
    import_fails("twice", d, &["recorded name used twice: `input_emb.weight`"]);
    variant("absent", &|j| j["model"]["names"]["4.weight"] = "unembed.weight".into());
    import_fails("absent", d, &["step_00000.safetensors", "missing `unembed.weight` [7, 8]", "unexpected `decoder.weight` [7, 8]"]);
    variant("swapped", &|j| {
        j["model"]["names"]["1.head1_encoder.weight"] = "head1_decoder.weight".into();
        j["model"]["names"]["1.head1_decoder.weight"] = "head1_encoder.weight".into();
    });
    import_fails("swapped", d, &["`head1_decoder.weight` has shape [8, 4], expected [4, 8]"]);
    variant("wide", &|j| j["model"]["layers"][3]["residual"][0]["dense"] = 17.into());
    import_fails("wide", d, &["`linear1.weight` has shape [16, 8], expected [17, 8]"]);
    variant("layer", &|j| j["model"]["layers"][2] = "last_tokens".into());
    import_fails("layer", d, &["model.layers[2]", "unknown layer `last_tokens`"]);
    variant("module", &|j| {
        j["model"] = serde_json::json!({"kind": "layers", "input": [4], "modules": [{"type": "GrokkingTransformer", "repr": "GrokkingTransformer()"}]})
    });
    import_fails("module", d, &["GrokkingTransformer()", "model kind `stack`", "pathkernel_stack()"]);
    // The untouched copy imports.
    run_ok(&["import", "--from", "torch", "good", "--out", "run"], d);
}
