//! Token sequences from files: `[data] kind = "arrays"` with `vocab` (integer token arrays and
//! labels in a safetensors file) trains ExPLAIND's transformer block as the built-in `modular`
//! data does, with an exact EPK machine; a token outside the vocabulary is one line,
//! exit 2, nothing written.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use pathkernel::io::{write_safetensors, NamedArray};

const CONFIG: &str = include_str!("data/transformer/modular-addition.toml");

/// The modular config with its data replaced by `arrays` from `tokens.safetensors`.
fn arrays_config() -> String {
    let data = "[data]\nkind = \"modular\"\np = 7\nop = \"+\"\ntrain_frac = 0.5\nseed = 0\n";
    assert!(CONFIG.contains(data), "the modular config changed");
    // The classes are the labels' (0..7 here), not the vocabulary's 9 as for `modular`.
    assert!(CONFIG.contains("{ dense = { features = 9, bias = false } }"));
    CONFIG.replace(data, "[data]\nkind = \"arrays\"\npath = \"tokens.safetensors\"\nvocab = 9\n").replace("{ dense = { features = 9, bias = false } }", "{ dense = { features = 7, bias = false } }")
}

/// Writes the rows and labels of `ds` as integer arrays (x `[n, 4]` i64, y `[n]` i64).
fn write_tokens(path: &Path, ds: &pathkernel::data::Dataset, bump: Option<usize>) {
    let ids = |x: &[f64]| x.iter().map(|&v| v as i64).collect::<Vec<i64>>();
    let labels = |y: &pathkernel::data::Targets| match y {
        pathkernel::data::Targets::Labels(l) => l.iter().map(|&c| c as i64).collect::<Vec<i64>>(),
        _ => panic!("labels"),
    };
    let mut x_test = ids(&ds.x_test);
    if let Some(i) = bump {
        x_test[i] = 9;
    }
    let (m, p) = (ds.n_train(), ds.n_test());
    write_safetensors(
        path,
        &[
            NamedArray::i64("x_train", vec![m, 4], ids(&ds.x_train)),
            NamedArray::i64("y_train", vec![m], labels(&ds.y_train)),
            NamedArray::i64("x_test", vec![p, 4], x_test),
            NamedArray::i64("y_test", vec![p], labels(&ds.y_test)),
        ],
        None,
    )
    .unwrap();
}

/// The modular pairs written to a file and read back with `vocab`: the same token rows and labels
/// as `kind = "modular"` gives, seven classes (the labels'), and `kernel --kind epk --strict`
/// within 1e-10 of the network.
#[test]
fn token_arrays_train_the_transformer_as_the_builtin_data_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let native = train(&d.join("native"), "modular", CONFIG);
    write_tokens(&d.join("tokens.safetensors"), &native.dataset, None);
    std::fs::write(d.join("arrays.toml"), arrays_config()).unwrap();
    let o = Command::new(bin()).args(["train", "-q", "--config", "arrays.toml", "--out", "run"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "train: {}", String::from_utf8_lossy(&o.stderr));
    let run = pathkernel::trajectory::Run::open(&d.join("run")).unwrap();
    assert_eq!(run.dataset.vocab, Some(9));
    assert_eq!((run.dataset.x_train.clone(), run.dataset.x_test.clone()), (native.dataset.x_train.clone(), native.dataset.x_test.clone()));
    assert_eq!((run.dataset.y_train.clone(), run.dataset.num_outputs), (native.dataset.y_train.clone(), 7));
    let o = Command::new(bin()).args(["kernel", "-q", "--run", "run", "--kind", "epk", "--strict", "--out", "k"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "kernel: {}", String::from_utf8_lossy(&o.stderr));
    let ex: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("k/exactness.json")).unwrap()).unwrap();
    let err = ex["max_abs_error"].as_f64().unwrap();
    eprintln!("token arrays: EPK machine vs network {err:e}");
    assert!(err <= 1e-10, "{err:e}");
}

/// A token id outside the vocabulary: one line naming the array, row and position, exit 2,
/// no run written.
#[test]
fn a_token_outside_the_vocabulary_is_one_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let native = train(&d.join("native"), "modular", CONFIG);
    write_tokens(&d.join("tokens.safetensors"), &native.dataset, Some(6));
    std::fs::write(d.join("arrays.toml"), arrays_config()).unwrap();
    let o = Command::new(bin()).args(["train", "-q", "--config", "arrays.toml", "--out", "run"]).current_dir(d).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("tokens.safetensors") && err.contains("x_test[1, 2] = 9 is not a token id of the vocabulary 0..9 (data.vocab)"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!d.join("run").exists() && !d.join("run.partial").exists());
}
