//! The attribution benchmark's pieces against the crate's own slow paths: the fast retrainer
//! against the recorded dfdx run, the EPK attribution against the network, the factored path
//! Gram against the front door's DPK Gram, TRAK's projected form against its unprojected form,
//! and the whole benchmark end to end on a tiny run (with its cache).

use pathkernel::api::{Layout, Trained};
use pathkernel::datamodels::benchmark::{run, write_tables, AttributionSpec};
use pathkernel::attribution::grads::{directions, Direction, Projection, ScalarGrads};
use pathkernel::attribution::mlp::Mlp1;
use pathkernel::attribution::path::{path_gram, path_rows};
use pathkernel::attribution::ridge::Ridge;
use pathkernel::datamodels::retrain::gd;
use pathkernel::datamodels::{JsonDir, NoCache};
use pathkernel::kernel::KernelKind;

fn tiny_run(dir: &std::path::Path, steps: usize) -> Trained {
    let toml = format!(
        r#"
        [data]
        kind = "gaussian-mixture"
        dim = 5
        per_class = 12
        n_test = 9
        std = 2.0
        [model]
        kind = "mlp"
        hidden = [8]
        zero_last = true
        [train]
        optimizer = "gd"
        lr = 0.5
        steps = {steps}
        seed = 3
        "#
    );
    Trained::train_toml(&toml, dir.join("run")).unwrap()
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn fast_retrainer_reproduces_the_recorded_dfdx_run() {
    let dir = tempfile::tempdir().unwrap();
    let net = tiny_run(dir.path(), 40);
    let arch = &net.run().manifest.architecture;
    let ds = &net.run().dataset;
    let w0 = Mlp1::from_params(arch, &net.states()[0]).unwrap();
    let fast = gd(&w0, &ds.x_train, ds.train_labels().unwrap(), 0.5, 40).unwrap();
    let rel = max_rel(&fast.flat(), &net.states().last().unwrap().flat());
    println!("fast retrainer vs dfdx: max relative difference {rel:e}");
    assert!(rel < 1e-10, "{rel:e}");
}

#[test]
fn epk_attribution_sums_to_the_network_and_the_path_gram_is_the_dpk_gram() {
    let dir = tempfile::tempdir().unwrap();
    let net = tiny_run(dir.path(), 15);
    let ds = &net.run().dataset;
    let (m, k) = (ds.n_train(), ds.num_outputs);
    let y = ds.train_labels().unwrap();
    let yt = ds.test_labels().unwrap();
    let epk = path_rows(net.run(), net.states(), KernelKind::Epk, &ds.x_test, yt, 4, &|_, _| {}).unwrap();
    println!("EPK: max |b + Σ τ − log p_y| = {:e} (outputs up to {})", epk.max_residual, epk.max_output);
    assert!(epk.max_residual < 1e-12 * (1.0 + epk.max_output), "{}", epk.max_residual);
    // τ = (ε/M) G[y_x, y_i] with the kernel rows returned beside it.
    for (t, g) in epk.tau.iter().zip(&epk.kernel) {
        assert!((t - 0.5 / m as f64 * g).abs() < 1e-13 * (1.0 + g.abs()));
    }
    // The same rows of the DPK are not exact: a non-zero residual (this test can fail).
    let dpk = path_rows(net.run(), net.states(), KernelKind::Dpk, &ds.x_test, yt, 9, &|_, _| {}).unwrap();
    assert!(dpk.max_residual > 1e3 * epk.max_residual);
    // The fast DPK rows against the front door's.
    let fast = pathkernel::attribution::path::dpk_rows_fast(net.run(), net.states(), &ds.x_test, yt).unwrap();
    assert!(max_rel(&fast.kernel, &dpk.kernel) < 1e-12 && max_rel(&fast.tau, &dpk.tau) < 1e-12);
    assert!((fast.max_residual - dpk.max_residual).abs() < 1e-12 * (1.0 + dpk.max_residual));
    // The EPK self-kernel from the class-diagonal layout against the full rows at the training points.
    let rows = path_rows(net.run(), net.states(), KernelKind::Epk, &ds.x_train, y, 12, &|_, _| {}).unwrap();
    let selfk = pathkernel::attribution::path::epk_self(net.run(), net.states(), y, 7, &|_, _| {}).unwrap();
    for i in 0..m {
        assert!((selfk[i] - rows.kernel[i * m + i]).abs() < 1e-12 * (1.0 + selfk[i].abs()));
    }
    // The factored train-side path Gram against the front door's DPK Gram on the training points.
    let (g, diag) = path_gram(&net.run().manifest.architecture, net.states(), &ds.x_train, y, true).unwrap();
    let g = g.unwrap();
    let front = net.dpk().train_side().layout(Layout::Full).compute().unwrap();
    for i in 0..m {
        for j in 0..m {
            let want = front.pair(i, j).unwrap()[(y[i], y[j])];
            assert!((g[i * m + j] - want).abs() < 1e-12 * (1.0 + want.abs()), "{i} {j}: {} vs {want}", g[i * m + j]);
        }
        assert!((diag[i] - g[i * m + i]).abs() < 1e-12 * (1.0 + diag[i]));
    }
    assert_eq!(k, 3);
}

#[test]
fn trak_projected_form_is_the_unprojected_form_with_the_identity_and_approaches_it_as_d_grows() {
    let dir = tempfile::tempdir().unwrap();
    let net = tiny_run(dir.path(), 20);
    let arch = &net.run().manifest.architecture;
    let ds = &net.run().dataset;
    let w = Mlp1::from_params(arch, net.states().last().unwrap()).unwrap();
    let (fx, ft) = (w.forward(&ds.x_test), w.forward(&ds.x_train));
    let gx = ScalarGrads::new(&w, &ds.x_test, &fx, directions(&fx.logp, ds.test_labels().unwrap(), 3, Direction::LogOdds));
    let gt = ScalarGrads::new(&w, &ds.x_train, &ft, directions(&ft.logp, ds.train_labels().unwrap(), 3, Direction::LogOdds));
    let m = gt.len();
    let full = Ridge::kernel(&gx.gram(&gt), &gt.gram(&gt), m).unwrap();
    let ident = Ridge::features(&gx.project(Projection::Identity), &gt.project(Projection::Identity), w.numel()).unwrap();
    for lam in [1e-3, 0.1] {
        let (a, b) = (full.apply(lam), ident.apply(lam));
        assert!(max_rel(&b, &a) < 1e-9, "λ {lam}: {:e}", max_rel(&b, &a));
    }
    let err = |dim: usize| {
        let r = Ridge::features(&gx.project(Projection::Gaussian { seed: 1, dim }), &gt.project(Projection::Gaussian { seed: 1, dim }), dim).unwrap();
        max_rel(&r.apply(0.1), &full.apply(0.1))
    };
    let (e64, e4096) = (err(64), err(4096));
    println!("projected vs unprojected TRAK (λ = 0.1): d = 64: {e64:.3}, d = 4096: {e4096:.3}");
    assert!(e4096 < 0.1 && e4096 < e64 / 2.0, "{e64} {e4096}");
}

#[test]
fn trak_for_some_inputs_is_the_explicit_kernel_regression() {
    use pathkernel::api::nalgebra::DMatrix;
    let dir = tempfile::tempdir().unwrap();
    let net = tiny_run(dir.path(), 20);
    let arch = &net.run().manifest.architecture;
    let ds = &net.run().dataset;
    let (x, y) = (&ds.x_test[..2 * ds.dim], &ds.test_labels().unwrap()[..2]);
    let yt = ds.train_labels().unwrap();
    let w = Mlp1::from_params(arch, net.states().last().unwrap()).unwrap();
    let (fx, ft) = (w.forward(x), w.forward(&ds.x_train));
    let gx = ScalarGrads::new(&w, x, &fx, directions(&fx.logp, y, 3, Direction::LogOdds));
    let gt = ScalarGrads::new(&w, &ds.x_train, &ft, directions(&ft.logp, yt, 3, Direction::LogOdds));
    // Every gradient written out: τ = g(x)ᵀGᵀ(GGᵀ + λI)⁻¹ diag(1 − p_i), λ = 0.1 · tr(GGᵀ)/M.
    let (m, n) = (yt.len(), w.numel());
    let rows = |g: &ScalarGrads, count: usize| DMatrix::from_fn(count, n, |i, j| g.explicit(i)[j]);
    let (g, gq) = (rows(&gt, m), rows(&gx, 2));
    let kk = &g * g.transpose();
    let lambda = 0.1 * kk.trace() / m as f64;
    let inv = (kk + DMatrix::<f64>::identity(m, m) * lambda).try_inverse().unwrap();
    let reg = gq * g.transpose() * inv;
    let want: Vec<f64> = (0..2 * m).map(|q| reg[(q / m, q % m)] * (1.0 - ft.logp[(q % m) * 3 + yt[q % m]].exp())).collect();
    let got = pathkernel::api::trak(&net, x, y, None, 0.1, 0).unwrap();
    assert!(max_rel(&got, &want) < 1e-9, "{:e}", max_rel(&got, &want));
    // Projected to a dimension far above the parameter count (75): close to the unprojected form.
    let proj = pathkernel::api::trak(&net, x, y, Some(4096), 0.1, 0).unwrap();
    assert!(max_rel(&proj, &want) < 0.1, "{:e}", max_rel(&proj, &want));
    assert!(pathkernel::api::trak(&net, &x[..3], y, None, 0.1, 0).is_err());
    assert!(pathkernel::api::trak(&net, x, y, Some(8192), 0.1, 0).is_err());
}

#[test]
fn benchmark_runs_end_to_end_and_its_cache_returns_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let net = tiny_run(dir.path(), 20);
    let spec = AttributionSpec {
        subsets: 10,
        tuning_subsets: 3,
        test_points: 6,
        trak_dims: vec![16, 32],
        trak_ridges: vec![0.0, 1e-2],
        representer_ridges: vec![1e-3, 1e-1],
        if_dampings: vec![1e-2, 1e-1],
        ensemble_seeds: vec![3, 4],
        noise_fraction: 0.25,
        bootstrap: 200,
        chunk_rows: 4,
        cg_check_points: 2,
        ggn_tol: 0.0,
        ..AttributionSpec::default()
    };
    let cache = JsonDir(dir.path().join("cache"));
    let r = run(&net, &spec, &cache, &dir.path().join("work"), &|_| {}).unwrap();
    println!("{r}");
    let names: Vec<&str> = r.methods.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(names, ["epk", "tracin", "grad-dot", "epk-rep", "dpk-rep", "ntk-rep", "window-rep", "trak-1", "trak-1-full", "trak-2", "trak-2-full", "if-ggn"]);
    assert!(r.checks.dpk_max_residual > 1e3 * r.checks.epk_max_residual);
    assert!(r.checks.epk_max_residual < 1e-12 * (1.0 + r.checks.epk_max_output));
    assert!(r.checks.retrain_vs_run.unwrap() < 1e-10);
    let (_, _, cg_diff) = r.checks.cg.unwrap();
    assert!(cg_diff < 1e-6, "{cg_diff}");
    assert_eq!(r.methods.iter().find(|m| m.method == "trak-1").unwrap().sweep.len(), 4);
    for m in &r.methods {
        assert!(m.lds.mean.is_finite() && m.lds.lo <= m.lds.mean && m.lds.mean <= m.lds.hi, "{m:?}");
        assert!(m.sweep.iter().any(|p| p.setting == m.chosen && p.tune == m.tune));
        assert!(m.sweep.iter().all(|p| p.tune <= m.tune));
    }
    assert_eq!(r.epk_agreement.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), names[1..]);
    assert!(r.epk_agreement.iter().all(|(_, v)| (-1.0..=1.0).contains(v)));
    assert!(r.noisy.iter().any(|n| n.method == "epk") && r.noisy.iter().all(|n| (0.0..=1.0).contains(&n.auc)));
    // From the cache: the same numbers (retraining, rows and Grams are not recomputed).
    let again = run(&net, &spec, &cache, &dir.path().join("work"), &|_| {}).unwrap();
    assert_eq!(serde_json::to_string(&again.methods.iter().map(|m| (m.lds, m.tune)).collect::<Vec<_>>()).unwrap(), serde_json::to_string(&r.methods.iter().map(|m| (m.lds, m.tune)).collect::<Vec<_>>()).unwrap());
    let out = dir.path().join("report");
    write_tables(&r, &out, &dir.path().join("cache/tau.safetensors")).unwrap();
    assert!(dir.path().join("cache/tau.safetensors").exists() && !out.join("tau.safetensors").exists());
    for f in ["lds.parquet", "sweep.parquet", "noisy.parquet", "result.json", "summary.md", "retrained.safetensors"] {
        assert!(out.join(f).exists(), "{f}");
    }
    let back = pathkernel::io::Table::read_parquet(&out.join("lds.parquet")).unwrap();
    assert_eq!(back.rows(), r.methods.len());
    // Without a cache the same spec gives the same LDS (everything is seeded).
    let fresh = run(&net, &AttributionSpec { noise_fraction: 0.0, ..spec.clone() }, &NoCache, &dir.path().join("work2"), &|_| {}).unwrap();
    assert_eq!(fresh.methods[0].lds, r.methods[0].lds);
}
