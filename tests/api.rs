//! The notebook front door (`pathkernel::api`): its views and estimators against the flat
//! arrays and the lower-level functions they replace.

use pathkernel::api::*;
use pathkernel::gp;

const TOY: &str = r#"
[data]
kind = "gaussian-mixture"
dim = 2
per_class = 12
n_test = 7
seed = 3

[model]
kind = "mlp"
hidden = [8]
activation = "relu"

[train]
lr = 0.5
steps = 12
"#;

fn trained() -> (tempfile::TempDir, Trained) {
    let dir = tempfile::tempdir().unwrap();
    let net = Trained::train_toml(TOY, dir.path().join("run")).unwrap();
    (dir, net)
}

#[test]
fn views_are_the_flat_arrays() {
    let (_d, net) = trained();
    let full = net.epk().compute().unwrap();
    let diag = net.epk().layout(Layout::Diag).compute().unwrap();
    let (p, m, k) = full.shape();
    assert_eq!((p, m, k), (7, 36, 3));
    assert!(full.max_abs_error() < 1e-11, "{full}");
    let g = &full.output().gram;
    for c in 0..k {
        let bf = full.class_block(c).unwrap();
        let bd = diag.class_block(c).unwrap();
        for q in 0..p {
            for i in 0..m {
                let want = g[((q * m + i) * k + c) * k + c];
                assert_eq!(bf[(q, i)], want);
                assert!((bd[(q, i)] - want).abs() <= 1e-12 * want.abs().max(1.0));
            }
        }
    }
    let pr = full.pair(2, 5).unwrap();
    for a in 0..k {
        for b in 0..k {
            assert_eq!(pr[(a, b)], g[((2 * m + 5) * k + a) * k + b]);
        }
    }
    let tr = full.trace();
    for q in 0..p {
        for i in 0..m {
            let want: f64 = (0..k).map(|c| g[((q * m + i) * k + c) * k + c]).sum();
            assert!((tr[(q, i)] - want).abs() <= 1e-12 * want.abs().max(1.0));
        }
    }
    // The wrong layout or index is an error, not a panic or an empty view.
    assert!(diag.pair(0, 0).is_err());
    assert!(full.class_block(k).is_err());
    assert!(full.pair(p, 0).is_err());
    let trace = net.epk().layout(Layout::Trace).compute().unwrap();
    assert!(trace.class_block(0).unwrap_err().to_string().contains("diag"));
}

#[test]
fn nalgebra_round_trip() {
    let (_d, net) = trained();
    let g = net.ntk().layout(Layout::Diag).compute().unwrap();
    let b = g.class_block(1).unwrap();
    let n = b.to_nalgebra();
    assert_eq!((n.nrows(), n.ncols()), (b.nrows(), b.ncols()));
    for i in 0..b.nrows() {
        for j in 0..b.ncols() {
            assert_eq!(n[(i, j)], b[(i, j)]);
        }
    }
    let back = from_nalgebra(&n);
    assert_eq!(back.as_ref(), b);
    assert_eq!(back.to_nalgebra(), n);
}

#[test]
fn gp_on_grams_equals_the_flat_gp() {
    let (_d, net) = trained();
    let train = net.epk().train_side().layout(Layout::Diag).compute().unwrap();
    let rows = net.epk().layout(Layout::Diag).compute().unwrap();
    let model = GpModel::fit(&train).unwrap();
    let pred = model.predict(&rows).unwrap();
    // The same by hand on flat arrays.
    let (m, _, k) = train.shape();
    let p = rows.shape().0;
    let tg = &train.output().gram;
    let mut blocks = Vec::new();
    for c in 0..k {
        for i in 0..m {
            for j in 0..m {
                blocks.push(0.5 * (tg[(i * m + j) * k + c] + tg[(j * m + i) * k + c]));
            }
        }
    }
    let out = train.output();
    let targets: Vec<f64> = out.network.iter().zip(&out.bias).map(|(f, b)| f - b).collect();
    let fitted = GpParams::new().fit_hyper(true).fit(&blocks, &targets, m, k).unwrap();
    let rg = &rows.output().gram;
    let dg = rows.output().diag.as_ref().unwrap();
    let mut cross = Vec::new();
    let mut sd = Vec::new();
    for c in 0..k {
        cross.extend((0..p * m).map(|idx| rg[idx * k + c]));
        sd.extend((0..p).map(|q| dg[(q * k + c) * k + c]));
    }
    let mut want = fitted.predict(&cross, &sd, p).unwrap();
    for (v, b) in want.mean.iter_mut().zip(&rows.output().bias) {
        *v += b;
    }
    assert_eq!(pred.posterior, want);
    let mc = pred.mc_softmax(200, 1).unwrap();
    assert_eq!(mc, gp::mc_softmax(&want, 200, 1).unwrap());
    assert!(model.to_string().contains("noise"));
    // Test rows are not a training Gram; an NTK Gram is not the EPK the GP was fitted on.
    assert!(GpModel::fit(&rows).is_err());
    let ntk = net.ntk().layout(Layout::Diag).compute().unwrap();
    assert!(model.predict(&ntk).is_err());
}

#[test]
fn svm_and_attribution_on_grams() {
    let (_d, net) = trained();
    let train = net.epk().train_side().layout(Layout::Diag).compute().unwrap();
    let rows = net.epk().compute().unwrap();
    let labels = match &net.run().dataset.y_train {
        pathkernel::data::Targets::Labels(y) => y.clone(),
        _ => unreachable!(),
    };
    // The labels come from the run the Gram belongs to: the same model as with them given.
    assert_eq!(train.train_labels().unwrap(), &labels[..]);
    let svm = SvmModel::fit(&train, &SvmParams::new()).unwrap();
    let pred = svm.predict(&rows).unwrap();
    assert_eq!(pred.len(), rows.shape().0);
    let given = SvmModel::fit_labels(&train, &labels, &SvmParams::new()).unwrap();
    assert_eq!(given.predict(&rows).unwrap(), pred);
    assert_eq!(given.decision(&rows).unwrap(), svm.decision(&rows).unwrap());
    let at = rows.attribute(&[0, 3], 4).unwrap();
    assert_eq!(at.items.len(), 2 * 3);
    for a in &at.items {
        assert!(a.residual.abs() < 1e-11, "residual {}", a.residual);
        assert!(a.supporters.len() <= 4);
    }
    assert!(at.to_string().contains("residual"));
    // Attribution needs the off-diagonal blocks.
    assert!(train.attribute(&[0], 3).is_err());
    assert!(rows.attribute(&[99], 3).is_err());
}

#[test]
fn save_and_open_round_trip() {
    let (d, net) = trained();
    let g = net.epk().layout(Layout::Diag).compute().unwrap();
    let dir = d.path().join("gram");
    g.save(&dir).unwrap();
    assert!(!d.path().join("gram.partial").exists());
    let back = Gram::open(&dir, &net).unwrap();
    assert_eq!(back.shape(), g.shape());
    assert_eq!(back.layout(), Layout::Diag);
    assert_eq!(back.kind(), g.kind());
    assert_eq!(back.rows(), &Rows::Test);
    assert_eq!(back.output().gram, g.output().gram);
    assert_eq!(back.output().machine, g.output().machine);
    assert_eq!(back.output().records.len(), g.output().records.len());
    assert_eq!(back.max_abs_error(), g.max_abs_error());
    assert_eq!(back.class_block(2).unwrap(), g.class_block(2).unwrap());
    // Display is a table naming what the Gram is.
    let shown = back.to_string();
    assert!(shown.contains("epk") && shown.contains("diag") && shown.contains("max |kernel machine − network|"), "{shown}");
    // A missing file is an error, not empty records.
    let broken = d.path().join("broken");
    g.save(&broken).unwrap();
    std::fs::remove_file(broken.join("steps.parquet")).unwrap();
    assert!(Gram::open(&broken, &net).unwrap_err().to_string().contains("steps.parquet"));
    // A Gram of another run is refused.
    let other = Trained::train_toml(&TOY.replace("seed = 3", "seed = 4"), d.path().join("other")).unwrap();
    assert!(Gram::open(&dir, &other).is_err());
}

/// Rewrites `DIR/gram.safetensors` with its arrays unchanged and its metadata edited by `edit`.
fn rewrite_gram_metadata(dir: &std::path::Path, edit: impl FnOnce(&mut std::collections::HashMap<String, String>)) {
    use pathkernel::io::{write_safetensors, NamedArray, SafeFile};
    let path = dir.join("gram.safetensors");
    let f = SafeFile::open(&path).unwrap();
    let mut meta = f.metadata();
    let arrays: Vec<NamedArray> = f
        .names()
        .into_iter()
        .map(|name| match f.f64(&name, None) {
            Ok((shape, v)) => NamedArray::f64(name, shape, v),
            Err(_) => {
                let (shape, v) = f.i64(&name, None).unwrap();
                NamedArray::i64(name, shape, v)
            }
        })
        .collect();
    edit(&mut meta);
    drop(f);
    write_safetensors(&path, &arrays, Some(meta)).unwrap();
}

#[test]
fn gram_files_record_their_rows_and_older_files_still_open() {
    let (d, net) = trained();
    // A saved grid Gram reopens as a grid: the file records its rows.
    let g = net.epk().grid(5).compute().unwrap();
    let dir = d.path().join("grid");
    g.save(&dir).unwrap();
    let back = Gram::open(&dir, &net).unwrap();
    assert_eq!(back.rows(), &Rows::Grid(5));
    let values: Vec<f64> = (0..25).map(f64::from).collect();
    assert_eq!(back.on_grid(values.clone()).unwrap().values, g.on_grid(values.clone()).unwrap().values);
    assert_eq!(back.output().gram, g.output().gram);
    // A version-2 file (no `rows`, no `format_version`: what pathkernel wrote before) opens
    // with its rows taken from its points, as before.
    rewrite_gram_metadata(&dir, |m| {
        m.remove("rows");
        m.remove("format_version");
    });
    let old = Gram::open(&dir, &net).unwrap();
    assert_eq!(old.rows(), &Rows::Inputs);
    assert_eq!(old.output().gram, g.output().gram);
    let test_dir = d.path().join("test");
    net.epk().compute().unwrap().save(&test_dir).unwrap();
    rewrite_gram_metadata(&test_dir, |m| {
        m.remove("rows");
        m.remove("format_version");
    });
    assert_eq!(Gram::open(&test_dir, &net).unwrap().rows(), &Rows::Test);
    // A version this build cannot read is one clear line.
    rewrite_gram_metadata(&dir, |m| {
        m.insert("format_version".into(), "99".into());
    });
    let e = Gram::open(&dir, &net).unwrap_err().to_string();
    assert!(e.contains("version 99") && e.contains("reads versions 2 to 3") && !e.contains('\n'), "{e}");
    // Rows read and write one text form.
    for r in [Rows::Test, Rows::Train, Rows::Grid(40), Rows::ClassMeans, Rows::Inputs] {
        assert_eq!(r.to_string().parse::<Rows>().unwrap(), r);
    }
    assert!("grid:1".parse::<Rows>().is_err() && "grid 4".parse::<Rows>().is_err());
}

#[test]
fn explicit_inputs_and_bad_inputs() {
    let (_d, net) = trained();
    let x = vec![0.1, -0.2, 0.5, 0.5, 2.0, -1.0];
    let g = net.epk().inputs(&x).compute().unwrap();
    assert_eq!(g.shape().0, 3);
    assert_eq!(g.rows(), &Rows::Inputs);
    assert!(g.max_abs_error() < 1e-11);
    assert_eq!(net.network(&x).unwrap().len(), 9);
    assert!(net.epk().inputs(&x[..5]).compute().is_err());
    assert!(net.network(&x[..5]).is_err());
    let acc = net.test_accuracy().unwrap();
    assert!((0.0..=1.0).contains(&acc));
}

/// Function-space Laplace through the notebook API: the `full` and `diag` layouts of the same
/// Gram give the same predictive; the model refuses Grams not on the logits, rows of another
/// kernel, and a regression run; its δ by the evidence is the library's.
#[test]
fn function_space_laplace_on_grams() {
    let (_dir, net) = trained();
    let train = net.epk().train_side().logits().layout(Layout::Diag).compute().unwrap();
    let train_full = net.epk().train_side().logits().compute().unwrap();
    let rows = net.epk().logits().layout(Layout::Diag).compute().unwrap();
    let rows_full = net.epk().logits().compute().unwrap();
    for c in [Curvature::ClassDiagonal, Curvature::Full] {
        let a = FslModel::fit(&net, &train, c, Prior::Evidence).unwrap();
        let b = FslModel::fit(&net, &train_full, c, Prior::Evidence).unwrap();
        assert!((a.delta() / b.delta() - 1.0).abs() < 1e-9, "δ {} vs {}", a.delta(), b.delta());
        let (pa, pb) = (a.predict(&net, &rows).unwrap(), b.predict(&net, &rows_full).unwrap());
        let diff = pa.probit().iter().zip(pb.probit()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(diff < 1e-9, "{c}: diag vs full layout {diff:e}");
        assert!(pa.variance().iter().all(|v| *v >= 0.0) && pa.variance().iter().any(|v| *v > 0.0));
        // The mean is the network's logits.
        assert_eq!(&pa.posterior().mean, &rows.output().network);
        let labels: Vec<usize> = (0..rows.shape().0).map(|q| pa.probit()[q * 3..q * 3 + 3].iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0).collect();
        let cal = pa.calibrate(&labels).unwrap();
        assert!(cal.temperature > 0.0 && cal.val_nll.is_finite());
        assert_eq!(pa.probit_calibrated(&cal).len(), pa.probit().len());
    }
    let fsl = FslModel::fit(&net, &train, Curvature::Full, Prior::Fixed(2.0)).unwrap();
    assert_eq!(fsl.delta(), 2.0);
    // Refused: log-softmax outputs, test-side rows as the training Gram, another kernel's rows.
    let logsm = net.epk().train_side().layout(Layout::Diag).compute().unwrap();
    let e = FslModel::fit(&net, &logsm, Curvature::Full, Prior::Evidence).unwrap_err().to_string();
    assert!(e.contains("not on the logits"), "{e}");
    assert!(FslModel::fit(&net, &rows, Curvature::Full, Prior::Evidence).is_err());
    let ntk_rows = net.ntk().logits().layout(Layout::Diag).compute().unwrap();
    let e = fsl.predict(&net, &ntk_rows).unwrap_err().to_string();
    assert!(e.contains("cannot predict"), "{e}");
}
