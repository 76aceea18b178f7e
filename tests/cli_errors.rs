//! Bad input through the CLI: exit status 2, a one-line message, and no output created or changed.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn run_fail(args: &[&str], cwd: &Path, needle: &str) {
    let o = Command::new(bin()).args(args).current_dir(cwd).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir).into_iter().map(|p| p.strip_prefix(dir).unwrap().display().to_string()).collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn kernel_rejects_bad_arguments_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = d.join("c.toml");
    std::fs::write(&cfg, toy2d("[6]", "relu", 5, 0.5, 6, 4)).unwrap();
    let o = Command::new(bin()).args(["train", "-q", "--config", "c.toml", "--out", "run"]).current_dir(d).output().unwrap();
    assert!(o.status.success());
    let before = listing(d);
    let k = |extra: &[&str], needle: &str| {
        let mut args = vec!["kernel", "--run", "run", "--out", "kout"];
        args.extend_from_slice(extra);
        run_fail(&args, d, needle);
        assert_eq!(listing(d), before, "{extra:?} changed the directory");
    };
    k(&["--kind", "rbf"], "kernel kind `rbf`");
    k(&["--quadrature", "simpson:4"], "quadrature `simpson:4`");
    k(&["--quadrature", "auto:0"], "quadrature `auto:0`");
    k(&["--points", "grid:1"], "--points `grid:1`");
    k(&["--points", "everything"], "--points `everything`");
    k(&["--side", "middle"], "--side middle");
    k(&["--steps", "4:2"], "--steps `4:2`");
    k(&["--steps", "0:99"], "--steps 0:99");
    k(&["--kind", "epk", "--step", "2"], "--step only applies");
    k(&["--kind", "ntk", "--step", "99"], "beyond the last state");
    k(&["--per-step", "--memory", "1k"], "bytes, over the budget");
    k(&["--memory", "lots"], "is not a size");
    k(&["--outputs", "probs"], "outputs `probs`");
    k(&["--path", "closed"], "--path closed: expected fast, nodes or generic");
    k(&["--path", "generic"], "the generic reference takes a fixed rule");
    k(&["--path", "nodes", "--tiles", "2"], "--path is not available with --tiles");
    k(&["--layout", "diag", "--blocks", "trace"], "cannot be used multiple times");
    k(&["--no-such-option"], "unexpected argument");
    k(
        &["--outputs", "logits", "--tiles", "2"],
        "not available with --tiles",
    );
    k(
        &["--per-layer", "--tiles", "2"],
        "--per-layer is not available with --tiles",
    );
    run_fail(
        &["kernel", "--run", "nowhere", "--out", "kout"],
        d,
        "nowhere",
    );
    // The path kernel runs: on the logits by the closed form (or the stack engine's nodes with
    // --path nodes), on the log-softmax outputs and with a fixed rule by the layer stack's path.
    for extra in [&["--outputs", "logits"][..], &["--outputs", "logits", "--path", "nodes"], &[], &["--outputs", "logits", "--quadrature", "gauss:4"]] {
        let mut args = vec!["kernel", "-q", "--run", "run", "--kind", "path", "--out", "pout"];
        args.extend_from_slice(extra);
        let o = Command::new(bin()).args(&args).current_dir(d).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(d.join("pout/gram.safetensors").is_file());
        std::fs::remove_dir_all(d.join("pout")).unwrap();
    }
    assert_eq!(listing(d), before);
    // A tolerance no computation meets: a warning, exit 0; with --strict one line, exit 2, and
    // the outputs kept for inspection.
    let o = Command::new(bin()).args(["kernel", "-q", "--run", "run", "--quadrature", "auto:1e-300", "--out", "sout"]).current_dir(d).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.starts_with("warning: the epk kernel's rule auto:1e-300 missed its tolerance") && err.trim().lines().count() == 1, "{err}");
    std::fs::remove_dir_all(d.join("sout")).unwrap();
    run_fail(&["kernel", "-q", "--run", "run", "--quadrature", "auto:1e-300", "--strict", "--out", "sout"], d, "missed its tolerance: max |machine - network|");
    assert!(d.join("sout/exactness.json").is_file());
    std::fs::remove_dir_all(d.join("sout")).unwrap();
    let o = Command::new(bin()).args(["kernel", "-q", "--run", "run", "--strict", "--out", "sout"]).current_dir(d).output().unwrap();
    assert!(o.status.success() && o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_dir_all(d.join("sout")).unwrap();
    assert_eq!(listing(d), before);
    // A run with a missing step and one with a garbled dataset.
    std::fs::remove_file(d.join("run/trajectory/step-000003.safetensors")).unwrap();
    let before = listing(d);
    run_fail(&["kernel", "--run", "run", "--out", "kout"], d, "missing step file for step 3");
    assert_eq!(listing(d), before);
}

#[test]
fn kernel_rejects_grid_points_on_high_dimensional_data_and_corrupt_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = toy2d("[6]", "relu", 3, 0.5, 6, 4).replace("dim = 2", "dim = 5");
    std::fs::write(d.join("c.toml"), text).unwrap();
    assert!(Command::new(bin()).args(["train", "-q", "--config", "c.toml", "--out", "run"]).current_dir(d).status().unwrap().success());
    run_fail(&["kernel", "--run", "run", "--points", "grid:10", "--out", "kout"], d, "needs 2-D data");
    assert!(!d.join("kout").exists() && !d.join("kout.partial").exists());
    // Out-of-range label inside dataset.safetensors (a hand-edited file).
    let p = d.join("run/dataset.safetensors");
    let mut f = pathkernel::io::SafeFile::open(&p).unwrap();
    let (_, x_train) = f.f64("x_train", None).unwrap();
    let (_, mut y_train) = f.i64("y_train", None).unwrap();
    let (_, x_test) = f.f64("x_test", None).unwrap();
    let (_, y_test) = f.i64("y_test", None).unwrap();
    let meta = f.metadata();
    y_train[0] = 7;
    let m = y_train.len();
    let pn = y_test.len();
    pathkernel::io::write_safetensors(
        &p,
        &[
            pathkernel::io::NamedArray::f64("x_train", vec![m, 5], x_train.clone()),
            pathkernel::io::NamedArray::i64("y_train", vec![m], y_train),
            pathkernel::io::NamedArray::f64("x_test", vec![pn, 5], x_test.clone()),
            pathkernel::io::NamedArray::i64("y_test", vec![pn], y_test.clone()),
        ],
        Some(meta.clone()),
    )
    .unwrap();
    run_fail(&["kernel", "--run", "run", "--out", "kout"], d, "y_train[0] = 7");
    // Test points of the wrong dimension.
    pathkernel::io::write_safetensors(
        &p,
        &[
            pathkernel::io::NamedArray::f64("x_train", vec![m, 5], x_train),
            pathkernel::io::NamedArray::i64("y_train", vec![m], vec![0; m]),
            pathkernel::io::NamedArray::f64("x_test", vec![pn, 4], x_test[..pn * 4].to_vec()),
            pathkernel::io::NamedArray::i64("y_test", vec![pn], y_test),
        ],
        Some(meta),
    )
    .unwrap();
    run_fail(&["kernel", "--run", "run", "--out", "kout"], d, "x_test");
    f = pathkernel::io::SafeFile::open(&p).unwrap();
    assert_eq!(f.shape("x_test").unwrap(), vec![pn, 4]);
    assert!(!d.join("kout").exists() && !d.join("kout.partial").exists());
}

#[test]
fn train_rejects_bad_data_configs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = toy2d("[6]", "relu", 3, 0.5, 6, 4);
    for (what, text, needle) in [
        ("empty", base.replace("per_class = 6", "per_class = 0"), "per_class"),
        ("nan std", base.replace("seed = 3", "seed = 3\nstd = nan"), "std"),
        ("dim 1", base.replace("dim = 2", "dim = 1"), "dim"),
        ("unknown data kind", base.replace("gaussian-mixture", "spirals"), "unknown variant"),
        ("steps 0", base.replace("steps = 3", "steps = 0"), "train.steps = 0"),
        ("alpha 0", base.replace("activation = \"relu\"", "activation = \"relu\"\nalpha = 0.0"), "model.alpha"),
        ("mse on labels", base.replace("seed = 7", "seed = 7\nloss = \"mse\""), "regression dataset"),
        ("cnn on vectors", base.replace("kind = \"mlp\"", "kind = \"cnn\"").replace("hidden = [6]\n", ""), "needs image data"),
        ("missing train", base.split("[train]").next().unwrap().to_string(), "train"),
        ("huge width", base.replace("hidden = [6]", "hidden = [4294967296, 4294967296]"), "above the limit"),
    ] {
        std::fs::write(d.join("c.toml"), text).unwrap();
        run_fail(&["train", "--config", "c.toml", "--out", "run"], d, needle);
        assert!(!d.join("run").exists() && !d.join("run.partial").exists(), "{what}");
    }
    run_fail(&["train", "--config", "missing.toml", "--out", "run"], d, "missing.toml");
    // MNIST without the files says how to get them.
    std::fs::write(d.join("m.toml"), "[data]\nkind = \"mnist\"\n[model]\nkind = \"cnn\"\n[train]\nlr = 0.1\nsteps = 2\n").unwrap();
    run_fail(&["train", "--config", "m.toml", "--out", "run"], d, "fetch-mnist.sh");
}

#[test]
fn study_rejects_bad_files_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = format!("name = \"s\"\n{}\n[[kernel]]\nkind = \"epk\"\n", toy2d("[4]", "relu", 3, 0.5, 5, 3));
    for (text, needle) in [
        (base.replace("name = \"s\"", "name = \"../escape\""), "plain, non-empty folder name"),
        (base.replace("kind = \"epk\"", "kind = \"epk\"\nquadrature = \"trapezoid:3\""), "quadrature `trapezoid:3`"),
        (base.replace("kind = \"epk\"", "kind = \"epk\"\nflavour = 1"), "unknown field"),
        (format!("{base}[[kernel]]\nkind = \"epk\"\n"), "share the label"),
        (format!("{base}[analysis]\ngp = \"yes\"\n"), "gp"),
        (format!("{base}[sweep]\nhidden = []\n"), "sweep.hidden is empty"),
    ] {
        std::fs::write(d.join("s.toml"), text).unwrap();
        run_fail(&["study", "run", "s.toml", "--out", "rep", "--cache", "cache"], d, needle);
        assert!(!d.join("rep").exists() && !d.join("rep.partial").exists());
    }
    run_fail(&["study", "run", "missing.toml"], d, "missing.toml");
}

#[test]
fn resource_guards_refuse_training_and_fits_with_an_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), toy2d("[6]", "relu", 5, 0.5, 6, 4)).unwrap();
    let before = listing(d);
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run", "--memory", "1k"], d, "over the budget");
    assert_eq!(listing(d), before, "a refused training run must leave nothing behind");
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run", "--set", "train.optimizer"], d, "SECTION.KEY=VALUE");
    run_fail(&["train", "-q", "--config", "c.toml", "--out", "run", "--set", "train.optimizer=adamw", "--set", "train.momentum=0.9"], d, "train.momentum");
    assert_eq!(listing(d), before);
    let ok = |args: &[&str]| {
        let o = Command::new(bin()).args(args).current_dir(d).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    ok(&["train", "-q", "--config", "c.toml", "--out", "run"]);
    ok(&["kernel", "--run", "run", "--kind", "epk", "--points", "train", "--side", "train", "--out", "ktrain"]);
    ok(&["kernel", "--run", "run", "--kind", "epk", "--out", "ktest"]);
    let before = listing(d);
    for fit in ["gp", "svm"] {
        run_fail(&[fit, "--run", "run", "--train-kernel", "ktrain", "--kernel", "ktest", "--memory", "10k", "--out", "fit"], d, "over the budget");
        assert_eq!(listing(d), before, "{fit}: a refused fit must leave nothing behind");
    }
    // A momentum run's kernel is not symmetric: GP and SVM refuse it instead of symmetrising it.
    ok(&["train", "-q", "--config", "c.toml", "--out", "mom", "--set", "train.momentum=0.9"]);
    ok(&["kernel", "--run", "mom", "--kind", "epk", "--points", "train", "--side", "train", "--out", "mtrain"]);
    ok(&["kernel", "--run", "mom", "--kind", "epk", "--out", "mtest"]);
    let before = listing(d);
    run_fail(&["gp", "--run", "mom", "--train-kernel", "mtrain", "--kernel", "mtest", "--out", "fit"], d, "not a symmetric kernel");
    run_fail(&["kernel", "--run", "mom", "--kind", "chen", "--out", "kc"], d, "defined for plain gradient steps");
    assert_eq!(listing(d), before);
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), toy2d("[6]", "relu", 5, 0.5, 40, 4)).unwrap();
    let mut child = Command::new(bin())
        .args(["train", "-q", "--config", "c.toml", "--out", "run"])
        .current_dir(d)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the summary is printed (`pathkernel … | head -0`).
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(141), "{err}");
    // The run was written in full before the summary.
    assert!(d.join("run/manifest.json").exists());
}

/// `.npy` v1 bytes of little-endian `f64` values (numpy's header layout).
fn npy_f8(shape: &[usize], v: &[f64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if shape.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut h = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {tuple}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    b
}

#[test]
fn train_rejects_bad_tables_arrays_and_idx_files_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |data: &str, needle: &str| {
        let text = format!("[data]\n{data}\n[model]\nkind = \"mlp\"\nhidden = [4]\n[train]\nlr = 0.1\nsteps = 2\n");
        std::fs::write(d.join("c.toml"), text).unwrap();
        run_fail(&["train", "-q", "--config", "c.toml", "--out", "run"], d, needle);
        assert!(!d.join("run").exists() && !d.join("run.partial").exists(), "{data}");
    };
    // A good table first: it trains.
    let mut csv = String::from("a,b,y,split\n");
    for i in 0..12 {
        let split = ["train", "train", "val", "test"][i % 4];
        csv += &format!("{},{},{},{split}\n", i as f64 * 0.5, 10 - i as i64, ["x", "y", "z"][i % 3]);
    }
    std::fs::write(d.join("t.csv"), &csv).unwrap();
    let table = "kind = \"table\"\npath = \"t.csv\"\nlabel = \"y\"\nsplit = \"split\"";
    std::fs::write(d.join("ok.toml"), format!("[data]\n{table}\nstandardize = true\n[model]\nkind = \"mlp\"\nhidden = [4]\n[train]\nlr = 0.1\nsteps = 2\n")).unwrap();
    let o = Command::new(bin()).args(["train", "-q", "--config", "ok.toml", "--out", "good"]).current_dir(d).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest = std::fs::read_to_string(d.join("good/manifest.json")).unwrap();
    assert!(manifest.contains("classes ['x', 'y', 'z'] -> 0..2") && manifest.contains("standardized with the training split's mean"), "{manifest}");
    // Missing file, missing column, NaN, a label that is not a class, a bad split value, an
    // empty split, a class missing from the training split.
    run("kind = \"table\"\npath = \"absent.csv\"\nlabel = \"y\"\nsplit = \"split\"", "absent.csv");
    run(&table.replace("label = \"y\"", "label = \"target\""), "t.csv: no label column 'target'");
    std::fs::write(d.join("nan.csv"), csv.replacen("0.5,9", "nan,9", 1)).unwrap();
    run(&table.replace("t.csv", "nan.csv"), "nan.csv: NaN in feature 'a'");
    let frac: Vec<String> = csv
        .lines()
        .enumerate()
        .map(|(i, l)| if i == 0 { l.to_string() } else { l.replace(",x,", ",0.5,").replace(",y,", ",1,").replace(",z,", ",2,") })
        .collect();
    std::fs::write(d.join("frac.csv"), frac.join("\n")).unwrap();
    run(&table.replace("t.csv", "frac.csv"), "frac.csv: label column 'y' row 0 is 0.5, not a class label");
    std::fs::write(d.join("split.csv"), csv.replacen(",test", ",holdout", 1)).unwrap();
    run(&table.replace("t.csv", "split.csv"), "split column 'split' row 3 is 'holdout'");
    std::fs::write(d.join("empty.csv"), csv.replace(",test", ",val")).unwrap();
    run(&table.replace("t.csv", "empty.csv"), "empty.csv: the test split is empty");
    std::fs::write(d.join("cls.csv"), "a,y,split\n1,p,train\n2,p,train\n3,q,test\n").unwrap();
    run(&table.replace("t.csv", "cls.csv"), "cls.csv: class 1 has no rows in the training split");
    // Arrays: x and y of different lengths.
    std::fs::create_dir(d.join("arr")).unwrap();
    for (name, shape, v) in [
        ("x_train", vec![4, 2], vec![0.0; 8]),
        ("y_train", vec![3], vec![0.0, 1.0, 0.0]),
        ("x_test", vec![2, 2], vec![0.0; 4]),
        ("y_test", vec![2], vec![0.0, 1.0]),
    ] {
        std::fs::write(d.join("arr").join(format!("{name}.npy")), npy_f8(&shape, &v)).unwrap();
    }
    run("kind = \"arrays\"\npath = \"arr\"", "x_train has 4 rows but y_train has 3");
    // IDX: a missing file.
    run(
        "kind = \"idx\"\ntrain_images = \"f/train-images\"\ntrain_labels = \"f/train-labels\"\ntest_images = \"f/t-images\"\ntest_labels = \"f/t-labels\"",
        "f/train-images",
    );
}

/// Bad layer stacks: refused when the configuration is read, one line naming the layer (and why
/// for batch norm and dropout), exit 2, nothing written.
#[test]
fn train_rejects_bad_layer_stacks_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 6\nn_test = 4\nseed = 3\n";
    let before = listing(d);
    for (i, (layers, needle)) in [
        (r#"[{ dense = 8 }, "batch_norm", "relu", { dense = 3 }]"#, "model.layers[1]: batch norm is not supported: in training mode a point's output depends on the other points of its batch"),
        (r#"[{ dense = 8 }, "relu", "dropout", { dense = 3 }]"#, "model.layers[2]: dropout is not supported"),
        (r#"[{ conv2d = { channels = 4, kernel = 3 } }, "flatten", { dense = 3 }]"#, "model.layers[0] conv2d(4, k3, s1, p0): needs a [C, H, W] map, got [2]"),
        (r#"[{ dense = 8 }, "relu", { dense = 5 }]"#, "the last layer gives [5] per sample; the data needs [3]"),
        (r#"[{ dense = 8 }, "swish", { dense = 3 }]"#, "model.layers[1]: unknown layer `swish`"),
        (r#"[{ dense = { features = 8, bais = true } }, { dense = 3 }]"#, "model.layers[0]: dense has no option `bais`"),
        (r#"[{ residual = [{ dense = 4 }, "relu"] }, { max_pool2d = 2 }, { dense = 3 }]"#, "model.layers[1] max_pool2d(2, s2): needs a [C, H, W] map, got [4]"),
        (r#"[]"#, "model.layers is empty"),
        (r#"["tanh"]"#, "model.layers: the stack has no parameters"),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = format!("bad{i}.toml");
        std::fs::write(d.join(&cfg), format!("{data}\n[model]\nkind = \"layers\"\nlayers = {layers}\n\n[train]\nlr = 0.1\nsteps = 2\n")).unwrap();
        let mut now = before.clone();
        now.push(cfg.clone());
        now.sort();
        run_fail(&["train", "-q", "--config", &cfg, "--out", "run"], d, needle);
        assert_eq!(listing(d), now, "{layers} wrote something");
        std::fs::remove_file(d.join(&cfg)).unwrap();
    }
    // An image stack: the flatten a dense layer needs after a map.
    let mnist = d.join("mnist");
    std::fs::create_dir_all(&mnist).unwrap();
    fake_mnist(&mnist, 4, 2);
    let before = listing(d);
    std::fs::write(
        d.join("img.toml"),
        format!("[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 4\nn_test = 2\n\n[model]\nkind = \"layers\"\nlayers = [{{ conv2d = {{ channels = 2, kernel = 5 }} }}, {{ dense = 10 }}]\n\n[train]\nlr = 0.1\nsteps = 1\n", mnist.to_str().unwrap()),
    )
    .unwrap();
    run_fail(&["train", "-q", "--config", "img.toml", "--out", "run"], d, "model.layers[1] dense(10): needs a flat input or a sequence of feature vectors, got the map [2, 24, 24]: add \"flatten\" before it");
    let mut now = before;
    now.push("img.toml".into());
    now.sort();
    assert_eq!(listing(d), now);
}
