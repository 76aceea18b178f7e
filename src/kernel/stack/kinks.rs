//! Kinks of a layer stack along one step: the times `t ∈ (a, b)` where some ReLU's input
//! changes sign or some max-pool window changes its winner.
//!
//! Along `w_s(t) = w_s + tΔw`, with the activation pattern fixed, every layer's output is a
//! polynomial in t: a dense or conv layer maps degree D to D + 1 (`W(t)·p(t)`), ReLU, leaky
//! ReLU and max pooling select or scale polynomials, average pooling, flatten and residual sums
//! are linear. So the pieces are found by a sweep: at the start of a piece, the pattern just
//! after it is read, every ReLU input and every window's difference to its winner is a
//! polynomial, and the piece ends at the smallest root of any of them; the next walk restarts at
//! the layer whose root that was. Where the walk reaches the output, it ends with the piece's
//! outputs as polynomials, which the node search reads instead of running the network
//! ([`pieces`]). Layers that are smooth and not polynomial (tanh, sigmoid, softplus, GELU, SiLU,
//! layer norm, attention) end the walk: kinks behind them are left to the adaptive rule, which
//! locates them by Newton's method where a piece fails.

use crate::model::layers::contract::{Layer, Poly, Sweep};

use super::step::StackStep;

/// Most pieces followed along one step before the search stops (the adaptive rule bisects
/// whatever is left).
const MAX_PIECES: usize = 4096;

/// The kinks of the step's network at one input `x` (`[d]`) inside `(a, b)`, sorted.
pub(crate) fn kinks(step: &StackStep<'_>, x: &[f64], a: f64, b: f64) -> Vec<f64> {
    pieces(step, x, a, b).0
}

/// The kinks of the step's network at one input `x` (`[d]`) inside `(a, b)`, sorted, and, where
/// the sweep walks the whole stack (no smooth layer) and follows every piece, the raw outputs
/// on each piece as the polynomial the walk ends with: piece j, `[kinks[j−1], kinks[j]]`, has
/// `g(t) = Σ_i c_j[i·K + k] t^i` (`[deg + 1, K]`, `kinks.len() + 1` of them).
pub(crate) fn pieces(step: &StackStep<'_>, x: &[f64], a: f64, b: f64) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
    let Some(dw) = step.dir.as_ref() else { return (Vec::new(), None) };
    let (w, nodes) = (&step.state.data, &step.stack.nodes);
    let mut out = Vec::new();
    let mut polys = Some(Vec::new());
    // The walk restarts at the layer whose root ended the last piece: the layers before it keep
    // their pattern, so their output polynomials (`inputs[i]`, node i's input) and their
    // earliest root (`ahead[i]`: the bound node i's walk starts with, and the node it is a
    // root of) are still those of the last walk.
    let mut inputs: Vec<Poly> = Vec::with_capacity(nodes.len());
    let mut ahead: Vec<(f64, Option<usize>)> = Vec::with_capacity(nodes.len());
    let mut restart = 0;
    let mut start = a;
    loop {
        if out.len() >= MAX_PIECES {
            // The rest of the step is one piece only as far as the adaptive rule can tell.
            polys = None;
            break;
        }
        // The pattern just after `start`: read a hair inside the piece (a root closer than that
        // to `start` is left to the adaptive rule).
        let tm = start + (b - start) * 1e-9;
        // A root of the kept layers inside the hair changes their pattern too: walk them again.
        if restart > 0 && ahead[restart].0 <= tm {
            restart = 0;
        }
        let (mut p, (next, mut by)) = if restart == 0 { (Some(Poly { c: x.to_vec(), size: x.len() }), (b, None)) } else { (Some(inputs[restart].clone()), ahead[restart]) };
        inputs.truncate(restart);
        ahead.truncate(restart);
        let mut sw = Sweep { tm, next };
        for (i, n) in nodes.iter().enumerate().skip(restart) {
            let q = p.take().expect("the walk goes on");
            inputs.push(q.clone());
            ahead.push((sw.next, by));
            let before = sw.next;
            p = n.layer.sweep(n.first, w, dw, q, &mut sw);
            if sw.next < before {
                by = Some(i);
            }
            if p.is_none() {
                break;
            }
        }
        match (p, polys.as_mut()) {
            (Some(g), Some(v)) => v.push(g.c),
            _ => polys = None,
        }
        if sw.next >= b {
            break;
        }
        out.push(sw.next);
        start = sw.next;
        restart = by.expect("a root below b is some layer's");
    }
    (out, polys)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::model::layers::sweep_nodes;
    use crate::model::{ModelConfig, OutputKind, Params};

    /// Where `pattern` changes on `[0, 1]`: a scan of 4 000 cells, each change bisected to 1e-13.
    fn pattern_changes<P: PartialEq>(pattern: impl Fn(f64) -> P) -> Vec<f64> {
        let (grid, mut out, mut prev) = (4000, Vec::new(), pattern(0.0));
        for j in 1..=grid {
            let (mut a, mut b) = ((j - 1) as f64 / grid as f64, j as f64 / grid as f64);
            let pb = pattern(b);
            if pb != prev {
                while b - a > 1e-13 {
                    let m = 0.5 * (a + b);
                    if pattern(m) == prev {
                        a = m;
                    } else {
                        b = m;
                    }
                }
                out.push(0.5 * (a + b));
            }
            prev = pb;
        }
        out
    }

    /// The sweep's kinks against a brute-force scan of the activation pattern on a fine grid,
    /// bisected to 1e-13: the same set.
    #[test]
    fn polynomial_walk_equals_the_forward_pass() {
        let text = r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 3 }]"#;
        let cfg: ModelConfig = toml::from_str(text).unwrap();
        let arch = cfg.resolve(64, Some([1, 8, 8]), 3, OutputKind::LogSoftmax).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let w0 = arch.init(1);
        let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect() };
        let step = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        let x: Vec<f64> = (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for &t in &[0.0, 0.3, 0.7] {
            let mut sw = Sweep { tm: t, next: 1.0 };
            let p = sweep_nodes(&step.stack.nodes, &step.state.data, step.dir.as_ref().unwrap(), Poly { c: x.clone(), size: 64 }, &mut sw).unwrap();
            let g: Vec<f64> = (0..3).map(|u| p.at(u, t)).collect();
            let want = step.stack.forward(&step.params_at(t), &x);
            assert!(g.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "t = {t}: {g:?} vs {want:?}");
        }
    }

    #[test]
    fn sweep_finds_every_pattern_change() {
        let text = r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 3 } }, { leaky_relu = 0.1 }, { max_pool2d = { kernel = 2, stride = 1 } }, "flatten", { residual = [{ dense = 6 }, "relu"] }, "relu", { dense = 3 }]"#;
        let cfg: ModelConfig = toml::from_str(text).unwrap();
        let arch = cfg.resolve(64, Some([1, 8, 8]), 3, OutputKind::LogSoftmax).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let w0 = arch.init(1);
        let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect() };
        let step = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        for _ in 0..4 {
            let x: Vec<f64> = (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let found = kinks(&step, &x, 0.0, 1.0);
            // Brute force: the pattern (every ReLU input's sign, every pool's winner — where a
            // ReLU follows the pool, only the winners of windows whose maximum is positive: the
            // others give 0 whichever entry wins).
            let pattern = |t: f64| -> Vec<i64> {
                let p = step.params_at(t);
                let (_, caches) = step.stack.forward_cached(&p, &x);
                let mut v = Vec::new();
                fn walk(cs: &[crate::model::layers::Cache], nodes: &[crate::model::layers::Node], v: &mut Vec<i64>) {
                    use crate::model::layers::{AnyLayer, Cache};
                    for (j, (n, c)) in nodes.iter().zip(cs).enumerate() {
                        match (&n.layer, c) {
                            (AnyLayer::Act(_), Cache::Input(z)) => v.extend(z.iter().map(|z| i64::from(*z > 0.0))),
                            (AnyLayer::MaxPool2d(m), Cache::Arg(a)) if m.relu_after => {
                                let Cache::Input(pooled) = &cs[j + 1] else { panic!("a ReLU follows the pool") };
                                v.extend(a.iter().zip(pooled).map(|(&a, &z)| if z > 0.0 { i64::from(a) } else { -1 }));
                            }
                            (AnyLayer::MaxPool2d(_), Cache::Arg(a)) => v.extend(a.iter().map(|&a| i64::from(a))),
                            (AnyLayer::Residual(r), Cache::Residual(inner, _)) => walk(inner, &r.body, v),
                            _ => {}
                        }
                    }
                }
                walk(&caches, &step.stack.nodes, &mut v);
                v
            };
            let brute = pattern_changes(pattern);
            let missed: Vec<f64> = brute.iter().copied().filter(|b| !found.iter().any(|f| (f - b).abs() < 1e-9)).collect();
            assert!(missed.is_empty(), "found {} kinks, brute force {}; missed {missed:?}", found.len(), brute.len());
            // Each piece's output polynomial (the walk restarted at the layer that ended the
            // last piece) is the network on that piece.
            let (ks, polys) = pieces(&step, &x, 0.0, 1.0);
            let polys = polys.expect("the sweep walks this stack");
            assert_eq!(polys.len(), ks.len() + 1);
            let bounds: Vec<f64> = std::iter::once(0.0).chain(ks.iter().copied()).chain(std::iter::once(1.0)).collect();
            for (j, c) in polys.iter().enumerate() {
                for u in [0.1, 0.5, 0.9] {
                    let t = bounds[j] + u * (bounds[j + 1] - bounds[j]);
                    let want = step.stack.forward(&step.params_at(t), &x);
                    let poly = Poly { c: c.clone(), size: 3 };
                    for (o, w) in want.iter().enumerate() {
                        assert!((poly.at(o, t) - w).abs() <= 1e-12 * w.abs().max(1.0), "piece {j} at {t}: {} vs {w}", poly.at(o, t));
                    }
                }
            }
        }
    }

    /// The stack's walk runs each max-pool ahead of the ReLU written before it, and the sweep
    /// follows `max(0, window)`: its kinks are a subset of the written order's (which also splits
    /// where a non-winning entry crosses zero, or two negative entries swap), and fewer.
    #[test]
    fn a_pool_ahead_of_its_relu_splits_steps_less() {
        use crate::model::layers::{resolve_as_written, Stack};
        use crate::model::Body;
        let text = r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 3 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 3 }]"#;
        let cfg: ModelConfig = toml::from_str(text).unwrap();
        let arch = cfg.resolve(64, Some([1, 8, 8]), 3, OutputKind::LogSoftmax).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let w0 = arch.init(2);
        let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect() };
        let fused = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        let mut written = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        let Body::Layers { input, layers, .. } = &arch.body else { unreachable!("a stack") };
        let mut tensors = 0;
        written.stack = Stack { input: *input, nodes: resolve_as_written(*input, layers, "model.layers", "", &mut tensors).unwrap(), tensors };
        let (mut nf, mut nw) = (0, 0);
        for _ in 0..6 {
            let x: Vec<f64> = (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (kf, kw) = (kinks(&fused, &x, 0.0, 1.0), kinks(&written, &x, 0.0, 1.0));
            assert!(kf.iter().all(|f| kw.iter().any(|w| (f - w).abs() < 1e-9)), "{kf:?} not within {kw:?}");
            (nf, nw) = (nf + kf.len(), nw + kw.len());
        }
        assert!(nf < nw, "{nf} kinks, the written order {nw}");
    }

    /// A max-pool written after a smooth nondecreasing activation (tanh, sigmoid, softplus) runs
    /// ahead of it, so the sweep finds its window switches on the convolution's polynomial
    /// output and walks on to the activation: every stack of this shape has all its kinks
    /// reachable, and the sweep's set equals a brute-force scan of the pool winners (bisected
    /// to 1e-13), both ways.
    #[test]
    fn a_pool_behind_a_smooth_monotone_activation_is_swept() {
        for act in ["tanh", "sigmoid", "softplus"] {
            let text = format!(
                r#"kind = "layers"
zero_last = false
layers = [{{ conv2d = {{ channels = 3, kernel = 3, padding = 1 }} }}, "{act}", {{ max_pool2d = 2 }}, "flatten", {{ dense = 3 }}]"#
            );
            let cfg: ModelConfig = toml::from_str(&text).unwrap();
            let arch = cfg.resolve(64, Some([1, 8, 8]), 3, OutputKind::LogSoftmax).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
            let w0 = arch.init(1);
            let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect() };
            let step = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
            assert!(step.stack.kinks_reachable(), "{act}");
            let mut total = 0;
            for _ in 0..3 {
                let x: Vec<f64> = (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let found = kinks(&step, &x, 0.0, 1.0);
                let winners = |t: f64| -> Vec<u32> {
                    let (_, caches) = step.stack.forward_cached(&step.params_at(t), &x);
                    caches.iter().filter_map(|c| match c {
                        crate::model::layers::Cache::Arg(a) => Some(a.clone()),
                        _ => None,
                    }).flatten().collect()
                };
                let brute = pattern_changes(winners);
                let near = |v: &[f64], t: f64| v.iter().any(|u| (u - t).abs() < 1e-9);
                assert!(brute.iter().all(|&t| near(&found, t)), "{act}: missed; found {found:?}, brute force {brute:?}");
                assert!(found.iter().all(|&t| near(&brute, t)), "{act}: not a switch; found {found:?}, brute force {brute:?}");
                total += found.len();
            }
            assert!(total >= 3, "{act}: only {total} switches in three points");
        }
    }

    /// Behind a smooth layer the sweep stops; `StackStep::locate_kink` finds a ReLU kink by
    /// Newton's method: the located time has that ReLU input at zero to rounding, with opposite
    /// signs 1e-9 before and after, and a bracket without a sign change gives none.
    #[test]
    fn kinks_behind_a_smooth_layer_are_located() {
        let text = r#"kind = "layers"
zero_last = false
layers = [{ dense = 8 }, "gelu", "layer_norm", { dense = 8 }, "relu", { dense = 3 }]"#;
        let cfg: ModelConfig = toml::from_str(text).unwrap();
        let arch = cfg.resolve(4, None, 3, OutputKind::LogSoftmax).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let w0 = arch.init(1);
        let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.8 * rng.gen_range(-1.0..1.0)).collect()).collect() };
        let step = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        assert!(!step.stack.kinks_reachable());
        let relu_inputs = |x: &[f64], t: f64| -> Vec<f64> {
            let (_, caches) = step.stack.forward_cached(&step.params_at(t), x);
            step.stack.nodes.iter().zip(&caches).filter_map(|(n, c)| match (&n.layer, c) {
                (crate::model::layers::AnyLayer::Act(a), crate::model::layers::Cache::Input(z)) if a.act == crate::model::layers::Act::Relu => Some(z.clone()),
                _ => None,
            }).flatten().collect()
        };
        let mut located = 0;
        for _ in 0..20 {
            let x: Vec<f64> = (0..4).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let (a, b) = (0.0, 1.0);
            let (za, zb) = (relu_inputs(&x, a), relu_inputs(&x, b));
            let flips = za.iter().zip(&zb).any(|(p, q)| p * q < 0.0);
            let (t, spent) = step.locate_kink(&x, a, b);
            assert!(spent >= 2);
            match t {
                None => assert!(!flips, "a sign change between a and b was not located"),
                Some(t) => {
                    located += 1;
                    let (lo, hi, at) = (relu_inputs(&x, t - 1e-9), relu_inputs(&x, t + 1e-9), relu_inputs(&x, t));
                    let u = (0..at.len()).find(|&u| lo[u] * hi[u] < 0.0).expect("an input changes sign at the located kink");
                    let scale = za.iter().chain(&zb).fold(0.0f64, |m, v| m.max(v.abs()));
                    assert!(at[u].abs() <= 1e-13 * scale, "input {u} at the kink: {:e}", at[u]);
                }
            }
        }
        assert!(located >= 5, "only {located} of 20 points had a kink to locate");
    }

}
