//! What the grokking study needs, on ExPLAIND's block at a toy size (`a + b mod 7`, AdamW with
//! weight decay): the initial scale of the parameters, the whole run's machine put together
//! from windows and gaps (against the plain every-step EPK), and every step's split by layer
//! (against the network's own change and a finite-difference reference).

mod common;

use common::*;
use pathkernel::api::Trained;
use pathkernel::study::{shares, windows};

const CONFIG: &str = include_str!("data/transformer/modular-addition.toml");

fn trained(dir: &std::path::Path, extra_model: &str, steps: usize) -> Trained {
    trained_with(dir, extra_model, steps, "relu")
}

fn trained_with(dir: &std::path::Path, extra_model: &str, steps: usize, activation: &str) -> Trained {
    let toml = CONFIG.replace("zero_last = false", &format!("zero_last = false\n{extra_model}")).replace("steps = 12", &format!("steps = {steps}")).replace("\"relu\"", &format!("\"{activation}\""));
    Trained::train_toml(&toml, dir.join("run")).unwrap()
}

/// `init_scale` multiplies every initial parameter (the seeded initialisation as it is
/// otherwise); a non-positive scale is a one-line configuration error.
#[test]
fn init_scale_multiplies_every_initial_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let plain = trained(&dir.path().join("a"), "", 1);
    let scaled = trained(&dir.path().join("b"), "init_scale = 0.1", 1);
    let (w, v) = (&plain.states()[0], &scaled.states()[0]);
    assert_eq!(w.specs, v.specs);
    let mut nonzero = 0;
    for (a, b) in w.data.iter().flatten().zip(v.data.iter().flatten()) {
        assert_eq!(*b, 0.1 * a, "every parameter times 0.1");
        nonzero += usize::from(*a != 0.0);
    }
    assert!(nonzero > 100, "the initialisation has nonzero parameters");
    for bad in ["0", "-1", "nan"] {
        let toml = CONFIG.replace("zero_last = false", &format!("zero_last = false\ninit_scale = {bad}"));
        let err = Trained::train_toml(&toml, dir.path().join("bad")).unwrap_err().to_string();
        assert!(err.contains("init_scale") && !err.contains('\n'), "{bad}: {err}");
    }
}

/// Windows of the EPK with the gaps' own changes give the machine of the whole run: equal to the
/// plain every-step EPK's machine to 1e-12, and both equal to the network.
#[test]
fn windows_and_gaps_equal_the_every_step_machine() {
    let dir = tempfile::tempdir().unwrap();
    let net = trained(dir.path(), "", 10);
    let all = net.epk().compute().unwrap();
    let w1 = net.epk().steps(2, 4).compute().unwrap();
    let w2 = net.epk().steps(6, 9).compute().unwrap();
    let c = windows::compose(&net, &[("w1".into(), (2, 4), &w1), ("w2".into(), (6, 9), &w2)]).unwrap();
    let labels: Vec<(&str, (usize, usize))> = c.segments.iter().map(|s| (s.label.as_str(), s.steps)).collect();
    assert_eq!(labels, [("gap", (0, 2)), ("w1", (2, 4)), ("gap", (4, 6)), ("w2", (6, 9)), ("gap", (9, 10))]);
    let (p, _, k) = all.shape();
    let m = all.machine();
    let every: Vec<f64> = (0..p).flat_map(|i| (0..k).map(move |j| (i, j))).map(|(i, j)| m[(i, j)]).collect();
    let d = max_abs_diff(&c.machine, &every);
    eprintln!("windows + gaps vs every-step EPK: {d:e}; vs network {:e}; every-step vs network {:e}", c.max_abs_error, all.max_abs_error());
    assert!(d <= 1e-12, "composed vs every-step machine {d:e}");
    assert!(c.max_abs_error <= 1e-12 && all.max_abs_error() <= 1e-12);
    assert!(max_abs(&c.segments[1].term) > 1e-4, "the window's term is not trivial");
    // Out of order, overlapping or beyond the run: one-line errors.
    for bad in [vec![("w2".to_string(), (6, 9), &w2), ("w1".to_string(), (2, 4), &w1)], vec![("w1".to_string(), (2, 11), &w1)]] {
        let e = windows::compose(&net, &bad).unwrap_err().to_string();
        assert!(e.contains("window") && !e.contains('\n'), "{e}");
    }
}

/// A window whose earlier steps are one carried-in term (`carry_in`) against the same window
/// whose earlier steps are steps of its Gram (the full replay, the slow obvious reference), on
/// the AdamW block: the same machine (and both the network, 1e-12); the window's per-step Grams
/// are the reference's for the window's steps; `a` is zero before the window; and the
/// carried-in term is the reference's sum over the earlier steps of `Σ_i a_{i,r}·K_r` (1e-12
/// relative), formed from its per-step Grams. The windows put together with carried-in terms
/// give the whole run's machine.
#[test]
fn carried_in_window_equals_the_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let net = trained(dir.path(), "", 10);
    let (a, b) = (4, 7);
    let full = net.epk().steps(a, b).per_step().compute().unwrap();
    let own = net.epk().steps(a, b).per_step().carry_in().compute().unwrap();
    let (fo, oo) = (full.output(), own.output());
    let (p, m, k) = own.shape();
    assert_eq!(fo.steps, (0..b).collect::<Vec<_>>(), "the reference's Gram holds every step from 0");
    assert_eq!(oo.steps, (a..b).collect::<Vec<_>>(), "the carried-in window's Gram holds its own steps");
    assert!(fo.carried.is_none());
    let carried = oo.carried.as_ref().expect("a carried-in term");
    assert!(max_abs(carried) > 1e-6, "the carried-in term is not trivial: {:e}", max_abs(carried));
    // The same machine, equal to the network.
    let rel = |x: &[f64], y: &[f64]| max_abs_diff(x, y) / max_abs(y).max(1e-300);
    assert!(max_abs_diff(&oo.machine, &fo.machine) <= 1e-12, "machines {:e}", max_abs_diff(&oo.machine, &fo.machine));
    assert!(own.max_abs_error() <= 1e-12 && full.max_abs_error() <= 1e-12, "{:e} {:e}", own.max_abs_error(), full.max_abs_error());
    // The window's per-step Grams are the reference's last b − a.
    let per = p * m * k * k;
    let (fps, ops) = (fo.per_step.as_ref().unwrap(), oo.per_step.as_ref().unwrap());
    assert_eq!(ops.len(), (b - a) * per);
    assert!(rel(ops, &fps[a * per..]) <= 1e-12, "per-step Grams {:e}", rel(ops, &fps[a * per..]));
    assert!(rel(&oo.gram, &fps[a * per..].chunks_exact(per).fold(vec![0.0; per], |mut s, g| { s.iter_mut().zip(g).for_each(|(x, y)| *x += y); s })) <= 1e-12);
    assert!(oo.a[..a * m * k].iter().all(|&v| v == 0.0), "no coefficients before the window");
    assert!(rel(&oo.a[a * m * k..b * m * k], &fo.a[a * m * k..b * m * k]) <= 1e-12);
    // Σ_i a_{i,r}·K_r[p, c, i, ·] of the reference's steps in [from, to).
    let terms = |from: usize, to: usize| -> Vec<f64> {
        let mut t = vec![0.0; p * k];
        for r in from..to {
            for (pi, row) in t.chunks_exact_mut(k).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    for i in 0..m {
                        for c2 in 0..k {
                            *v += fo.a[(r * m + i) * k + c2] * fps[r * per + ((pi * m + i) * k + c) * k + c2];
                        }
                    }
                }
            }
        }
        t
    };
    // The reference's own check of the slow sum: all its steps are its machine less its baseline.
    let base = pathkernel::attribution::baseline(fo);
    let change: Vec<f64> = fo.machine.iter().zip(&base).map(|(x, y)| x - y).collect();
    assert!(rel(&terms(0, b), &change) <= 1e-12, "the slow sum over every step {:e}", rel(&terms(0, b), &change));
    let before = terms(0, a);
    assert!(rel(carried, &before) <= 1e-12, "carried-in term vs the earlier steps' kernel terms {:e}", rel(carried, &before));
    // Put together with the gaps, a carried-in window still gives the whole run.
    let c = windows::compose(&net, &[("w".into(), (a, b), &own)]).unwrap();
    assert!(c.max_abs_error <= 1e-12, "{:e}", c.max_abs_error);
    assert_eq!(c.segments[1].carried.as_deref(), Some(&carried[..]));
    // Not with the per-layer split (one term, not split by layer).
    let e = net.epk().steps(a, b).carry_in().per_layer().compute().unwrap_err().to_string();
    assert!(e.contains("carried-in") && !e.contains('\n'), "{e}");
}

/// The per-step Grams a request is sized for are the steps it keeps: a budget that holds the
/// window's own 3 per-step Grams (and far fewer than the 10 of the run) admits the carried-in
/// window, and refuses the full replay, which keeps the 7 from step 0.
#[test]
fn per_step_memory_is_sized_for_the_steps_kept() {
    let dir = tempfile::tempdir().unwrap();
    let net = trained(dir.path(), "", 10);
    let (a, b) = (4, 7);
    let x = &net.run().dataset.x_test[..2 * 4];
    let own = net.epk().inputs(x).steps(a, b).per_step().carry_in().compute().unwrap();
    let (p, m, k) = own.shape();
    let g = (p * m * k * k * 8) as u64;
    // What the carried-in window needs, from its refusal at 1 byte; the full replay keeps 4
    // per-step Grams more.
    // (Each estimate on the way refuses in turn: the outputs, then the recursion's work.)
    let need = |carry: bool| -> u64 {
        let mut budget = 1;
        for _ in 0..8 {
            let b = net.epk().inputs(x).steps(a, b).per_step().memory_budget(budget);
            match if carry { b.carry_in() } else { b }.compute() {
                Err(pathkernel::Error::OutOfMemoryBudget { needed_bytes, .. }) => budget = needed_bytes,
                Ok(_) => return budget,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no budget found");
    };
    let (own_need, full_need) = (need(true), need(false));
    assert!(full_need >= own_need + 4 * g, "{own_need} {full_need} {g}");
    let budget = own_need;
    net.epk().inputs(x).steps(a, b).per_step().carry_in().memory_budget(budget).compute().unwrap();
    let e = net.epk().inputs(x).steps(a, b).per_step().memory_budget(budget).compute().unwrap_err().to_string();
    assert!(e.contains("per-step"), "{e}");
}

/// A tolerance below the rounding of the check (1e-17, under one ulp of the outputs) ends at
/// pieces at rounding instead of halving every piece down to the depth limit (2^40 pieces a
/// point): a bounded number of nodes, and the shares still sum to the step's change to rounding.
#[test]
fn layer_shares_stop_at_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let net = trained(dir.path(), "init_scale = 0.5", 4);
    let (run, states) = (net.run(), net.states());
    let arch = &run.manifest.architecture;
    let groups = shares::layer_groups(arch, &states[0]).unwrap();
    let p = run.dataset.n_test();
    for s in 0..4 {
        let sp = shares::split_step(arch, &states[0], &states[s], &states[s + 1], &run.dataset.x_test, &groups, 1e-17).unwrap();
        eprintln!("step {s}: {} nodes, {} pieces, residual {:e}", sp.nodes, sp.pieces, sp.residual);
        assert!(sp.nodes <= 4 * 200 * p, "step {s}: {} nodes for {p} points", sp.nodes);
        assert!(sp.residual <= 1e-12, "step {s}: {:e}", sp.residual);
        // Every piece passed its check or was kept at rounding; none gave up, and the outputs'
        // size the rounding is relative to is the largest |f| at the step's ends.
        assert_eq!(sp.gave_up, 0, "step {s}");
        let f: Vec<f64> = [s, s + 1].iter().flat_map(|&i| arch.forward(&states[i], Some(&states[0]), &run.dataset.x_test).unwrap()).collect();
        // (f at the step's end is taken at w_s + 1·(w_{s+1} − w_s), equal to w_{s+1} to rounding.)
        let scale = f.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!((sp.scale - scale).abs() <= 1e-12 * scale, "step {s}: {} vs {scale}", sp.scale);
    }
}

/// Each step's layer shares sum to the network's own change over the step (1e-12), on the
/// ReLU block (whose steps cross kinks) and on the same block with GELU; on the smooth one each
/// share also equals a slow reference: the central finite difference of f along that layer's
/// step at 16 Gauss–Legendre nodes (h = 1e-4: to 1e-8 relative; measured ~1e-12 absolute).
#[test]
fn layer_shares_sum_to_the_step_and_match_finite_differences() {
    let dir = tempfile::tempdir().unwrap();
    let relu = trained(&dir.path().join("relu"), "init_scale = 0.5", 12);
    let (run, states) = (relu.run(), relu.states());
    let arch = &run.manifest.architecture;
    let groups = shares::layer_groups(arch, &states[0]).unwrap();
    let (mut worst, mut pieces) = (0.0f64, 0);
    for s in 0..12 {
        let sp = shares::split_step(arch, &states[0], &states[s], &states[s + 1], &run.dataset.x_test, &groups, 1e-12).unwrap();
        worst = worst.max(sp.residual);
        pieces += sp.pieces;
    }
    eprintln!("ReLU block: Σ shares vs change {worst:e} over 12 steps, {pieces} pieces");
    assert!(worst <= 1e-12, "{worst:e}");
    let net = trained_with(&dir.path().join("gelu"), "init_scale = 0.5", 4, "gelu");
    let (run, states) = (net.run(), net.states());
    let arch = &run.manifest.architecture;
    let groups = shares::layer_groups(arch, &states[0]).unwrap();
    let names: Vec<&str> = groups.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(names.len(), 4, "embedding, attention, residual MLP, unembedding: {names:?}");
    assert!(names[0].contains("embedding") && names[1].contains("attention") && names[2].contains("residual") && names[3].contains("dense"), "{names:?}");
    let x = &run.dataset.x_test;
    let (k, p) = (run.dataset.num_outputs, run.dataset.n_test());
    for s in 0..4 {
        let sp = shares::split_step(arch, &states[0], &states[s], &states[s + 1], x, &groups, 1e-12).unwrap();
        let fa = arch.forward(&states[s], Some(&states[0]), x).unwrap();
        let fb = arch.forward(&states[s + 1], Some(&states[0]), x).unwrap();
        let change: Vec<f64> = fb.iter().zip(&fa).map(|(b, a)| b - a).collect();
        assert!(max_abs_diff(&change, &sp.change) <= 1e-15);
        let sum: Vec<f64> = (0..p * k).map(|j| (0..groups.len()).map(|g| sp.shares[g * p * k + j]).sum()).collect();
        let d = max_abs_diff(&sum, &change);
        assert!(d <= 1e-12 && sp.residual <= 1e-12, "step {s}: Σ shares vs change {d:e} (reported {:e})", sp.residual);
        // The reference: f(w(t) ± hΔw_g) at 16 Gauss–Legendre nodes.
        let h = 1e-4;
        let (nodes, weights) = gauss_legendre_16();
        for (g, (_, idx)) in groups.iter().enumerate() {
            let mut reference = vec![0.0; p * k];
            for (t, wt) in nodes.iter().zip(&weights) {
                let at = |u: f64| {
                    let mut w = states[s].clone();
                    for (i, (a, b)) in w.data.iter_mut().zip(&states[s + 1].data).enumerate() {
                        let own = idx.contains(&i);
                        for (v, n) in a.iter_mut().zip(b) {
                            let dv = n - *v;
                            *v += t * dv + if own { u * dv } else { 0.0 };
                        }
                    }
                    arch.forward(&w, Some(&states[0]), x).unwrap()
                };
                let (up, dn) = (at(h), at(-h));
                reference.iter_mut().zip(up.iter().zip(&dn)).for_each(|(r, (a, b))| *r += wt * (a - b) / (2.0 * h));
            }
            let share = &sp.shares[g * p * k..(g + 1) * p * k];
            let d = max_abs_diff(share, &reference);
            eprintln!("step {s}, {}: share vs finite differences {d:e} (share up to {:e})", groups[g].0, max_abs(share));
            assert!(d <= 1e-8 * max_abs(&reference).max(1e-3), "step {s}, layer {g}: {d:e} against {:e}", max_abs(&reference));
            assert!(max_abs(share) > 0.0);
        }
    }
}

/// Gauss–Legendre nodes and weights on [0, 1], 16 points (Golub–Welsch by Newton on P_16).
fn gauss_legendre_16() -> (Vec<f64>, Vec<f64>) {
    let n = 16;
    let (mut x, mut w) = (Vec::new(), Vec::new());
    for i in 0..n {
        let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
        let mut dp = 0.0;
        for _ in 0..100 {
            let (mut p0, mut p1) = (1.0, z);
            for j in 2..=n {
                let p2 = ((2 * j - 1) as f64 * z * p1 - (j - 1) as f64 * p0) / j as f64;
                p0 = p1;
                p1 = p2;
            }
            dp = n as f64 * (z * p1 - p0) / (z * z - 1.0);
            let dz = p1 / dp;
            z -= dz;
            if dz.abs() < 1e-16 {
                break;
            }
        }
        x.push(0.5 * (z + 1.0));
        w.push(1.0 / ((1.0 - z * z) * dp * dp));
    }
    (x, w)
}

/// A study's window attribution: a window whose every row point is attributed reuses the
/// window's own kernel (its per-step Grams kept with it in the cache); one attributed at some of
/// its points computes them for those points alone. Both give the same supporters and
/// opponents with the same contributions (to 1e-12 of the largest).
#[test]
fn window_attribution_reuses_the_window_s_kernel() {
    use pathkernel::io::Table;
    use pathkernel::study::{self, StudyOptions};
    let dir = tempfile::tempdir().unwrap();
    let window = |label: &str, a: usize, b: usize| format!("[[kernel]]\nkind = \"epk\"\nlabel = \"{label}\"\nsteps = [{a}, {b}]\ntest_points = [0, 1, 2]\ncarry_in = true\n\n");
    // Each study's attribution tables of held-out point 1, per window: (role, rank, training point, contribution).
    let run = |name: &str, points: &str| -> Vec<Vec<(String, i64, i64, f64)>> {
        let text = format!("name = \"{name}\"\n{CONFIG}\n{}{}[analysis]\ncharts = false\nwindows = [\"w1\", \"w2\"]\nattribution_points = [{points}]\n", window("w1", 2, 5), window("w2", 7, 10));
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let opts = StudyOptions { out: Some(dir.path().join(name)), cache: Some(dir.path().join(format!("{name}-cache"))), base_dir: ".".into(), progress: false, command: "test".into() };
        study::run(&file, &opts).unwrap();
        ["w1", "w2"]
            .iter()
            .map(|w| {
                let t = Table::read_parquet(&dir.path().join(name).join(format!("analysis/attribution/{w}/attribution.parquet"))).unwrap();
                let (pt, role, rank, idx, c) = (t.i64("point").unwrap(), t.str("role").unwrap(), t.i64("rank").unwrap(), t.i64("train_index").unwrap(), t.f64("contribution").unwrap());
                (0..pt.len()).filter(|&r| pt[r] == 1).map(|r| (role[r].clone(), rank[r], idx[r], c[r])).collect()
            })
            .collect()
    };
    let (all, one) = (run("all", "0, 1, 2"), run("one", "1"));
    for (w, (a, o)) in all.iter().zip(&one).enumerate() {
        assert!(!a.is_empty() && a.len() == o.len(), "window {w}: {} vs {} rows", a.len(), o.len());
        let scale = a.iter().map(|r| r.3.abs()).fold(0.0, f64::max);
        for (x, y) in a.iter().zip(o) {
            assert_eq!((&x.0, x.1, x.2), (&y.0, y.1, y.2), "window {w}: the same training points in the same order");
            assert!((x.3 - y.3).abs() <= 1e-12 * scale, "window {w}: {} vs {}", x.3, y.3);
        }
    }
    // The window attributed at all its points keeps its per-step Grams in the cache; the other's
    // kernel does not (its attribution computed its own).
    let has_steps = |name: &str| {
        let net = Trained::open(dir.path().join(format!("{name}-cache/run"))).unwrap();
        pathkernel::api::Gram::open(dir.path().join(format!("{name}-cache/kernels/w1")), &net).unwrap().output().per_step.is_some()
    };
    assert!(has_steps("all") && !has_steps("one"));
}
