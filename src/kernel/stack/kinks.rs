//! Kinks of a layer stack along one step: the times `t ∈ (a, b)` where some ReLU's input
//! changes sign or some max-pool window changes its winner.
//!
//! Along `w_s(t) = w_s + tΔw`, with the activation pattern fixed, every layer's output is a
//! polynomial in t: a dense or conv layer maps degree D to D + 1 (`W(t)·p(t)`), ReLU, leaky
//! ReLU and max pooling select or scale polynomials, average pooling, flatten and residual sums
//! are linear. So the pieces are found by a sweep: at the start of a piece, the pattern just
//! after it is read, every ReLU input and every window's difference to its winner is a
//! polynomial, and the piece ends at the smallest root of any of them. Layers that are smooth
//! and not polynomial (tanh, sigmoid, softplus, GELU, SiLU, layer norm) end the search: kinks
//! behind them are left to the adaptive quadrature's bisection.

use crate::kernel::quadrature::poly_roots_in;
use crate::model::layers::{Act, Node, Op};

use super::step::StackStep;

/// Most pieces followed along one step before the search stops (the adaptive rule bisects
/// whatever is left).
const MAX_PIECES: usize = 4096;

/// Coefficients of polynomials in t, `[deg + 1, size]` (coefficient j of unit u at `j·size + u`).
#[derive(Clone)]
struct Poly {
    c: Vec<f64>,
    size: usize,
}

impl Poly {
    fn deg(&self) -> usize {
        self.c.len() / self.size - 1
    }
    fn unit(&self, u: usize) -> Vec<f64> {
        (0..=self.deg()).map(|j| self.c[j * self.size + u]).collect()
    }
    fn at(&self, u: usize, t: f64) -> f64 {
        (0..=self.deg()).rev().fold(0.0, |acc, j| acc * t + self.c[j * self.size + u])
    }
    fn add(mut self, other: &Poly) -> Poly {
        if other.c.len() > self.c.len() {
            self.c.resize(other.c.len(), 0.0);
        }
        self.c.iter_mut().zip(&other.c).for_each(|(a, b)| *a += b);
        self
    }
}

/// The sweep's state: where the pattern is read and the earliest root seen so far.
struct Sweep {
    tm: f64,
    next: f64,
}

impl Sweep {
    fn roots(&mut self, c: &[f64]) {
        if let Some(&r) = poly_roots_in(c, self.tm, self.next).first() {
            self.next = r;
        }
    }
}

/// `W(t)·p(t) + b(t)` for a layer whose map `lin(params, X)` is linear in both (without bias);
/// `b0`, `db` are the bias and its step per output (`[out]`).
fn linear(p: &Poly, out: usize, lin: &dyn Fn(&[f64], &[f64]) -> Vec<f64>, w0: &[f64], dw: &[f64], b0: Option<&[f64]>, db: Option<&[f64]>) -> Poly {
    let deg = p.deg();
    let a0 = lin(w0, &p.c);
    let a1 = lin(dw, &p.c);
    let mut c = vec![0.0; (deg + 2) * out];
    c[..(deg + 1) * out].iter_mut().zip(&a0).for_each(|(x, y)| *x += y);
    c[out..].iter_mut().zip(&a1).for_each(|(x, y)| *x += y);
    if let (Some(b0), Some(db)) = (b0, db) {
        c[..out].iter_mut().zip(b0).for_each(|(x, y)| *x += y);
        c[out..2 * out].iter_mut().zip(db).for_each(|(x, y)| *x += y);
    }
    Poly { c, size: out }
}

/// The polynomial walk through `nodes`; `None` once a smooth non-polynomial layer is reached.
fn walk(nodes: &[Node], w: &[Vec<f64>], dw: &[Vec<f64>], mut p: Poly, sw: &mut Sweep) -> Option<Poly> {
    for n in nodes {
        p = match &n.op {
            Op::Dense(d) => {
                let b = d.bias.then(|| (w[n.first + 1].as_slice(), dw[n.first + 1].as_slice()));
                linear(&p, d.n_out, &|wt, x| d.forward(wt, None, x), &w[n.first], &dw[n.first], b.map(|b| b.0), b.map(|b| b.1))
            }
            Op::Conv(c) => {
                // The bias of channel o at every one of its positions.
                let per_position = |b: &[f64]| -> Vec<f64> { b.iter().flat_map(|&v| std::iter::repeat_n(v, c.positions())).collect() };
                let b = c.bias.then(|| (per_position(&w[n.first + 1]), per_position(&dw[n.first + 1])));
                let out = c.co * c.positions();
                let u = c.patches(&p.c); // once for both W_s and ΔW
                linear(&p, out, &|wt, _| c.apply(&u, wt, None), &w[n.first], &dw[n.first], b.as_ref().map(|b| b.0.as_slice()), b.as_ref().map(|b| b.1.as_slice()))
            }
            Op::Act(a @ (Act::Relu | Act::LeakyRelu(_))) => {
                let slope = if let Act::LeakyRelu(s) = a { *s } else { 0.0 };
                let size = p.size;
                let mut q = p.clone();
                for u in 0..size {
                    let cu = p.unit(u);
                    sw.roots(&cu);
                    if p.at(u, sw.tm) <= 0.0 {
                        for j in 0..=p.deg() {
                            q.c[j * size + u] *= slope;
                        }
                    }
                }
                q
            }
            Op::MaxPool(pl) => {
                let out = pl.c * pl.ho * pl.wo;
                let deg = p.deg();
                let mut c = vec![0.0; (deg + 1) * out];
                let mut o = 0;
                for ch in 0..pl.c {
                    for oy in 0..pl.ho {
                        for ox in 0..pl.wo {
                            let win: Vec<usize> = pl.window(ch, oy, ox).collect();
                            let best = win.iter().copied().fold(usize::MAX, |b, q| if b == usize::MAX || p.at(q, sw.tm) > p.at(b, sw.tm) { q } else { b });
                            let cb = p.unit(best);
                            for &q in &win {
                                if q != best {
                                    let diff: Vec<f64> = p.unit(q).iter().zip(&cb).map(|(a, b)| a - b).collect();
                                    sw.roots(&diff);
                                }
                            }
                            for (j, v) in cb.iter().enumerate() {
                                c[j * out + o] = *v;
                            }
                            o += 1;
                        }
                    }
                }
                Poly { c, size: out }
            }
            Op::AvgPool(pl) => {
                let out = pl.c * pl.ho * pl.wo;
                Poly { c: pl.avg_forward(&p.c), size: out }
            }
            Op::Flatten => p,
            Op::Residual(r) => {
                let body = walk(&r.body, w, dw, p.clone(), sw)?;
                let short = match &r.shortcut {
                    Some(sc) => walk(std::slice::from_ref(sc.as_ref()), w, dw, p, sw)?,
                    None => p,
                };
                body.add(&short)
            }
            Op::Act(_) | Op::Norm(_) => return None,
        };
    }
    Some(p)
}

/// The kinks of the step's network at one input `x` (`[d]`) inside `(a, b)`, sorted.
pub(crate) fn kinks(step: &StackStep<'_>, x: &[f64], a: f64, b: f64) -> Vec<f64> {
    let Some(dw) = step.dir.as_ref() else { return Vec::new() };
    let w = &step.state.data;
    let mut out = Vec::new();
    let mut start = a;
    while out.len() < MAX_PIECES {
        // The pattern just after `start`: read a hair inside the piece (a root closer than that
        // to `start` is left to the adaptive rule).
        let tm = start + (b - start) * 1e-9;
        let mut sw = Sweep { tm, next: b };
        let p = Poly { c: x.to_vec(), size: x.len() };
        walk(&step.stack.nodes, w, dw, p, &mut sw);
        if sw.next >= b {
            break;
        }
        out.push(sw.next);
        start = sw.next;
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::model::{ModelConfig, OutputKind, Params};

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
            let p = walk(&step.stack.nodes, &step.state.data, step.dir.as_ref().unwrap(), Poly { c: x.clone(), size: 64 }, &mut sw).unwrap();
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
            // Brute force: the pattern (every ReLU input's sign, every pool's winner).
            let pattern = |t: f64| -> Vec<i64> {
                let p = step.params_at(t);
                let (_, caches) = step.stack.forward_cached(&p, &x);
                let mut v = Vec::new();
                fn walk(c: &[crate::model::layers::Cache], nodes: &[crate::model::layers::Node], v: &mut Vec<i64>) {
                    for (n, c) in nodes.iter().zip(c) {
                        match (&n.op, c) {
                            (Op::Act(_), crate::model::layers::Cache::Input(z)) => v.extend(z.iter().map(|z| i64::from(*z > 0.0))),
                            (Op::MaxPool(_), crate::model::layers::Cache::Arg(a)) => v.extend(a.iter().map(|&a| a as i64)),
                            (Op::Residual(r), crate::model::layers::Cache::Residual(inner, _)) => walk(inner, &r.body, v),
                            _ => {}
                        }
                    }
                }
                walk(&caches, &step.stack.nodes, &mut v);
                v
            };
            let mut brute = Vec::new();
            let grid = 4000;
            let mut prev = pattern(0.0);
            for j in 1..=grid {
                let (mut a, mut b) = ((j - 1) as f64 / grid as f64, j as f64 / grid as f64);
                let pb = pattern(b);
                if pb != prev {
                    let pa = prev.clone();
                    while b - a > 1e-13 {
                        let m = 0.5 * (a + b);
                        if pattern(m) == pa {
                            a = m;
                        } else {
                            b = m;
                        }
                    }
                    brute.push(0.5 * (a + b));
                }
                prev = pb;
            }
            let missed: Vec<f64> = brute.iter().copied().filter(|b| !found.iter().any(|f| (f - b).abs() < 1e-9)).collect();
            assert!(missed.is_empty(), "found {} kinks, brute force {}; missed {missed:?}", found.len(), brute.len());
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
            step.stack.nodes.iter().zip(&caches).filter_map(|(n, c)| match (&n.op, c) {
                (Op::Act(crate::model::layers::Act::Relu), crate::model::layers::Cache::Input(z)) => Some(z.clone()),
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
