//! Per-example gradients of a scalar output of a one-hidden-layer MLP, held factored.
//!
//! For a direction `u ∈ R^K` in logit space at input `x`, the gradient `g = J(x)ᵀ u` of
//! `uᵀ z(x)` has the blocks `∂W2 = u hᵀ`, `∂b2 = u`, `∂W1 = δ xᵀ`, `∂b1 = δ` with
//! `δ = (W2ᵀ u) ⊙ 1[W1 x + b1 > 0]`, so that
//!
//! `⟨g_i, g_j⟩ = (u_i·u_j)(h_i·h_j + 1) + (δ_i·δ_j)(x_i·x_j + 1)`:
//!
//! every Gram of such gradients (TRAK's unprojected `GGᵀ`, Grad-Dot, the GGN's function-space
//! matrix, the path kernel on scalar outputs) costs three GEMMs instead of `W = 101 770`-long
//! dot products. The gradient of `log p_y` is `u = e_y − p`; of TRAK's `log(p_y/(1 − p_y))` it is
//! `u = (e_y − p)/(1 − p_y)`. [`ScalarGrads::explicit`] writes one gradient out in the crate's
//! parameter order (the tests compare it with dfdx's Jacobian); [`ScalarGrads::project`] applies a
//! seeded Gaussian projection without ever holding all gradients.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use super::mlp::{Forward, Mlp1};
use crate::linalg::gemm;

/// Which direction in logit space defines the scalar output whose gradient is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `log p_y`: `u = e_y − p`.
    LogProb,
    /// TRAK's model output `log(p_y / (1 − p_y))`: `u = (e_y − p)/(1 − p_y)`.
    LogOdds,
}

/// The directions `u` of rows with labels `labels` from their log-probabilities.
///
/// # Shapes
/// `logp [n, K]`, `labels [n]` → `[n, K]`.
pub fn directions(logp: &[f64], labels: &[usize], k: usize, dir: Direction) -> Vec<f64> {
    let mut u = vec![0.0; labels.len() * k];
    for (i, &y) in labels.iter().enumerate() {
        let p: Vec<f64> = logp[i * k..(i + 1) * k].iter().map(|v| v.exp()).collect();
        // 1 − p_y without cancellation: Σ_{c≠y} p_c.
        let rest: f64 = (0..k).filter(|&c| c != y).map(|c| p[c]).sum();
        let scale = match dir {
            Direction::LogProb => 1.0,
            Direction::LogOdds => 1.0 / rest.max(f64::MIN_POSITIVE),
        };
        for c in 0..k {
            u[i * k + c] = scale * (if c == y { 1.0 } else { 0.0 } - p[c]);
        }
    }
    u
}

/// Factored per-example gradients `g_i = J(x_i)ᵀ u_i` at one network.
///
/// # Shapes
/// `n` points: `x [n, d]`, `hid`, `delta [n, h]`, `u [n, K]`.
#[derive(Clone, Debug)]
pub struct ScalarGrads {
    /// Inputs.
    pub x: Vec<f64>,
    /// Hidden activations.
    pub hid: Vec<f64>,
    /// Back-propagated hidden signal `δ = (W2ᵀ u) ⊙ 1[pre > 0]`.
    pub delta: Vec<f64>,
    /// Logit-space directions.
    pub u: Vec<f64>,
    /// `(n, d, h, K)`.
    pub dims: (usize, usize, usize, usize),
}

impl ScalarGrads {
    /// Gradients of `u_iᵀ z(x_i)` at `net` (with `fwd = net.forward(x)` already computed).
    ///
    /// # Shapes
    /// `x [n, d]`, `u [n, K]`.
    pub fn new(net: &Mlp1, x: &[f64], fwd: &Forward, u: Vec<f64>) -> ScalarGrads {
        let (d, h, k) = (net.d, net.h, net.k);
        let n = x.len() / d;
        assert_eq!(u.len(), n * k, "u must be [n, K]");
        let mut delta = vec![0.0; n * h];
        gemm(&mut delta, &u, false, &net.w2, false, (n, h, k), 1.0, false);
        delta.iter_mut().zip(&fwd.pre).for_each(|(v, &p)| {
            if p <= 0.0 {
                *v = 0.0
            }
        });
        ScalarGrads { x: x.to_vec(), hid: fwd.hid.clone(), delta, u, dims: (n, d, h, k) }
    }

    /// The same points with each repeated `r` times and new directions `u` (`[n·r, K]`, point
    /// `i`'s copies at rows `i·r … i·r + r − 1`): the rows of the GGN's factor `Z`.
    pub fn repeated(net: &Mlp1, x: &[f64], fwd: &Forward, r: usize, u: Vec<f64>) -> ScalarGrads {
        let (d, h) = (net.d, net.h);
        let n = x.len() / d;
        let rep = |v: &[f64], w: usize| -> Vec<f64> { (0..n * r).flat_map(|q| v[(q / r) * w..(q / r + 1) * w].iter().copied()).collect() };
        let pre = rep(&fwd.pre, h);
        let f = Forward { pre, hid: rep(&fwd.hid, h), logits: vec![], logp: vec![] };
        ScalarGrads::new(net, &rep(x, d), &f, u)
    }

    /// The points `rows` only (in that order).
    pub fn select(&self, rows: &[usize]) -> ScalarGrads {
        let (_, d, h, k) = self.dims;
        let pick = |v: &[f64], w: usize| -> Vec<f64> { rows.iter().flat_map(|&i| v[i * w..(i + 1) * w].iter().copied()).collect() };
        ScalarGrads { x: pick(&self.x, d), hid: pick(&self.hid, h), delta: pick(&self.delta, h), u: pick(&self.u, k), dims: (rows.len(), d, h, k) }
    }

    /// Number of points n.
    pub fn len(&self) -> usize {
        self.dims.0
    }
    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.dims.0 == 0
    }

    /// `⟨g_i, g'_j⟩` for every pair. # Shapes `[n, n']`.
    pub fn gram(&self, other: &ScalarGrads) -> Vec<f64> {
        let m = other.dims.0;
        let mut out = vec![0.0; self.dims.0 * m];
        self.gram_rows(other, None, &mut |i, row| out[i * m..(i + 1) * m].copy_from_slice(row));
        out
    }

    /// [`ScalarGrads::gram`] row by row into `sink(i, row_i)` (`row_i [n']`), 512 rows of work
    /// at a time, with the input products `x_i·x'_j` from `xx` when given (a Gram of repeated
    /// points, or one taken at many states of the same inputs, computes them once).
    pub fn gram_rows(&self, other: &ScalarGrads, xx: Option<&dyn Fn(usize, usize) -> f64>, sink: &mut dyn FnMut(usize, &[f64])) {
        let (n, d, h, k) = self.dims;
        let m = other.dims.0;
        let block = 512;
        let mut r0 = 0;
        while r0 < n {
            let r1 = (r0 + block).min(n);
            let b = r1 - r0;
            let mut uu = vec![0.0; b * m];
            gemm(&mut uu, &self.u[r0 * k..r1 * k], false, &other.u, true, (b, m, k), 1.0, false);
            let mut hh = vec![0.0; b * m];
            gemm(&mut hh, &self.hid[r0 * h..r1 * h], false, &other.hid, true, (b, m, h), 1.0, false);
            let mut dd = vec![0.0; b * m];
            gemm(&mut dd, &self.delta[r0 * h..r1 * h], false, &other.delta, true, (b, m, h), 1.0, false);
            let mut xv = vec![0.0; b * m];
            match xx {
                Some(f) => xv.iter_mut().enumerate().for_each(|(q, v)| *v = f(r0 + q / m, q % m)),
                None => gemm(&mut xv, &self.x[r0 * d..r1 * d], false, &other.x, true, (b, m, d), 1.0, false),
            }
            for r in 0..b {
                let row: Vec<f64> = (r * m..(r + 1) * m).map(|q| uu[q] * (hh[q] + 1.0) + dd[q] * (xv[q] + 1.0)).collect();
                sink(r0 + r, &row);
            }
            r0 = r1;
        }
    }

    /// `‖g_i‖²` for every point. # Shapes `[n]`.
    pub fn sq_norms(&self) -> Vec<f64> {
        let (n, d, h, k) = self.dims;
        let dot = |v: &[f64], w: usize, i: usize| v[i * w..(i + 1) * w].iter().map(|a| a * a).sum::<f64>();
        (0..n).map(|i| dot(&self.u, k, i) * (dot(&self.hid, h, i) + 1.0) + dot(&self.delta, h, i) * (dot(&self.x, d, i) + 1.0)).collect()
    }

    /// Gradient `i` written out in the crate's parameter order `[W1, b1, W2, b2]`. # Shapes `[W]`.
    pub fn explicit(&self, i: usize) -> Vec<f64> {
        let (_, d, h, k) = self.dims;
        let (x, hid, del, u) = (&self.x[i * d..(i + 1) * d], &self.hid[i * h..(i + 1) * h], &self.delta[i * h..(i + 1) * h], &self.u[i * k..(i + 1) * k]);
        let mut g = Vec::with_capacity(h * (d + 1) + k * (h + 1));
        for a in 0..h {
            g.extend(x.iter().map(|xb| del[a] * xb));
        }
        g.extend_from_slice(del);
        for c in 0..k {
            g.extend(hid.iter().map(|hj| u[c] * hj));
        }
        g.extend_from_slice(u);
        g
    }

    /// Projected features `Φ = G P` for a [`Projection`]. # Shapes `[n, D]`.
    ///
    /// The Gaussian projection's rows are generated block by block (one seeded ChaCha8 stream
    /// per block: each hidden unit's `W1` row, `b1`, `W2`, `b2`), so the result does not depend on
    /// how the work is chunked, and a projection of dimension `d` is the first `d` columns of one
    /// of dimension `D ≥ d` ([`gaussian_block`]).
    pub fn project(&self, proj: Projection) -> Vec<f64> {
        let (n, _, h, k) = self.dims;
        match proj {
            Projection::Identity => (0..n).flat_map(|i| self.explicit(i)).collect(),
            Projection::Gaussian { seed, dim } => {
                let mut phi = vec![0.0; n * dim];
                let nnz = self.x.iter().filter(|v| **v != 0.0).count();
                if (nnz as f64) < 0.4 * self.x.len() as f64 {
                    self.project_w1_sparse(seed, dim, &mut phi);
                } else {
                    self.project_w1_dense(seed, dim, &mut phi);
                }
                // b1: Δ P_b1; W2: the rows u_c h_j; b2: U P_b2.
                let p = gaussian_block(seed, h as u64, h, dim);
                gemm(&mut phi, &self.delta, false, &p, false, (n, dim, h), 1.0, true);
                let mut g = vec![0.0; n * k * h];
                for i in 0..n {
                    for c in 0..k {
                        let uc = self.u[i * k + c];
                        g[(i * k + c) * h..(i * k + c + 1) * h].iter_mut().zip(&self.hid[i * h..(i + 1) * h]).for_each(|(v, hj)| *v = uc * hj);
                    }
                }
                let p = gaussian_block(seed, h as u64 + 1, k * h, dim);
                gemm(&mut phi, &g, false, &p, false, (n, dim, k * h), 1.0, true);
                let p = gaussian_block(seed, h as u64 + 2, k, dim);
                gemm(&mut phi, &self.u, false, &p, false, (n, dim, k), 1.0, true);
                phi
            }
        }
    }
}

impl ScalarGrads {
    /// The `W1` block of `G P`, a chunk of hidden units at a time: `G_chunk [n, c·d] ·
    /// P_chunk [c·d, D]`.
    fn project_w1_dense(&self, seed: u64, dim: usize, phi: &mut [f64]) {
        let (n, d, h, _) = self.dims;
        let chunk = 8usize;
        let mut a0 = 0;
        while a0 < h {
            let c = chunk.min(h - a0);
            let mut g = vec![0.0; n * c * d];
            for i in 0..n {
                let x = &self.x[i * d..(i + 1) * d];
                for a in 0..c {
                    let da = self.delta[i * h + a0 + a];
                    let dst = &mut g[(i * c + a) * d..(i * c + a + 1) * d];
                    dst.iter_mut().zip(x).for_each(|(v, xb)| *v = da * xb);
                }
            }
            let p: Vec<f64> = (0..c).flat_map(|a| gaussian_block(seed, (a0 + a) as u64, d, dim)).collect();
            gemm(phi, &g, false, &p, false, (n, dim, c * d), 1.0, true);
            a0 += c;
        }
    }

    /// The `W1` block of `G P` for sparse inputs, one input coordinate `b` at a time over the
    /// points where `x_b ≠ 0`: `Φ[i] += x_ib · δ_i P_b` with `P_b [h, D]` the rows `(a, b)`.
    fn project_w1_sparse(&self, seed: u64, dim: usize, phi: &mut [f64]) {
        let (n, d, h, _) = self.dims;
        let mut cols: Vec<Vec<(usize, f64)>> = vec![Vec::new(); d];
        for i in 0..n {
            for b in 0..d {
                let v = self.x[i * d + b];
                if v != 0.0 {
                    cols[b].push((i, v));
                }
            }
        }
        for (b, rows) in cols.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let pb: Vec<f64> = (0..h).flat_map(|a| gaussian_row(seed, a as u64, b, dim)).collect();
            let g: Vec<f64> = rows.iter().flat_map(|&(i, v)| self.delta[i * h..(i + 1) * h].iter().map(move |dl| v * dl)).collect();
            let mut t = vec![0.0; rows.len() * dim];
            gemm(&mut t, &g, false, &pb, false, (rows.len(), dim, h), 1.0, false);
            for (r, &(i, _)) in rows.iter().enumerate() {
                phi[i * dim..(i + 1) * dim].iter_mut().zip(&t[r * dim..(r + 1) * dim]).for_each(|(a, v)| *a += v);
            }
        }
    }
}

/// A random projection of the parameter space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// No projection: `Φ = G` (`D = W`), for tests on small networks.
    Identity,
    /// Entries i.i.d. `N(0, 1)` (no `1/√D`: every ridge here is relative to the Gram's mean
    /// eigenvalue, so the scale cancels), seeded.
    Gaussian {
        /// Seed.
        seed: u64,
        /// Dimension D.
        dim: usize,
    },
}

/// Rows `[rows, dim]` of the Gaussian projection for parameter block `block` ([`gaussian_row`]).
pub fn gaussian_block(seed: u64, block: u64, rows: usize, dim: usize) -> Vec<f64> {
    (0..rows).flat_map(|r| gaussian_row(seed, block, r, dim)).collect()
}

/// Row `row` of parameter block `block` of the Gaussian projection: the first `dim` numbers of
/// stream `block·2³² + row` of `ChaCha8Rng::seed_from_u64(seed)`, so a prefix never depends
/// on `dim` and any row can be generated alone.
///
/// # Panics
/// When `dim > 4096` (the benchmark's grid stops at 2 048).
pub fn gaussian_row(seed: u64, block: u64, row: usize, dim: usize) -> Vec<f64> {
    assert!(dim <= 4096, "projection dimension {dim} > 4096");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(block << 32 | row as u64);
    (0..dim).map(|_| StandardNormal.sample(&mut rng)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::mlp::small_arch;
    use crate::model::net::jacobian;

    fn setup() -> (crate::model::Architecture, crate::model::Params, Vec<f64>, Vec<usize>) {
        let arch = small_arch(5, 6, 3);
        let mut p = arch.init(4);
        p.data[2].iter_mut().enumerate().for_each(|(i, v)| *v += 0.1 * (i as f64).cos()); // a non-trivial W2
        let x: Vec<f64> = (0..7 * 5).map(|i| ((i as f64) * 0.53).sin()).collect();
        let y = vec![0, 1, 2, 1, 0, 2, 2];
        (arch, p, x, y)
    }

    /// `explicit` is `J(x)ᵀ u` with dfdx's Jacobian, and `gram` is the dot product of explicit
    /// gradients.
    #[test]
    fn factored_gradients_match_dfdx_jacobians() {
        let (arch, p, x, y) = setup();
        let net = Mlp1::from_params(&arch, &p).unwrap();
        let fwd = net.forward(&x);
        for dir in [Direction::LogProb, Direction::LogOdds] {
            let g = ScalarGrads::new(&net, &x, &fwd, directions(&fwd.logp, &y, 3, dir));
            let w = net.numel();
            for i in 0..7 {
                // dfdx's Jacobian of the log-softmax outputs; u = e_y − p for LogProb is the
                // logit direction whose pull-back equals ∇ log p_y = J_logpᵀ e_y.
                let j = jacobian(&dfdx::tensor::Cpu::default(), &arch, &p, None, &x[i * 5..(i + 1) * 5]).unwrap();
                let scale = match dir {
                    Direction::LogProb => 1.0,
                    Direction::LogOdds => 1.0 / (1.0 - fwd.logp[i * 3 + y[i]].exp()),
                };
                let want: Vec<f64> = (0..w).map(|q| scale * j[y[i] * w + q]).collect();
                let got = g.explicit(i);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
                }
            }
            let gram = g.gram(&g);
            let norms = g.sq_norms();
            for i in 0..7 {
                for jj in 0..7 {
                    let want: f64 = g.explicit(i).iter().zip(g.explicit(jj)).map(|(a, b)| a * b).sum();
                    assert!((gram[i * 7 + jj] - want).abs() < 1e-12 * (1.0 + want.abs()));
                }
                assert!((norms[i] - gram[i * 7 + i]).abs() < 1e-12 * (1.0 + norms[i]));
            }
        }
    }

    /// The chunked Gaussian projection equals `G P` with `P` written out from the same blocks,
    /// and a smaller dimension is a prefix of a larger one.
    #[test]
    fn projection_is_g_times_p_and_nested() {
        let (arch, p, x, y) = setup();
        check_projection(&arch, &p, &x, &y);
        // Inputs mostly zero take the sparse path.
        let xs: Vec<f64> = x.iter().enumerate().map(|(i, v)| if i % 4 == 0 { *v } else { 0.0 }).collect();
        check_projection(&arch, &p, &xs, &y);
    }

    fn check_projection(arch: &crate::model::Architecture, p: &crate::model::Params, x: &[f64], y: &[usize]) {
        let (x, y) = (x.to_vec(), y.to_vec());
        let net = Mlp1::from_params(arch, p).unwrap();
        let fwd = net.forward(&x);
        let g = ScalarGrads::new(&net, &x, &fwd, directions(&fwd.logp, &y, 3, Direction::LogOdds));
        let (dim, seed) = (9, 5);
        let pm: Vec<f64> = (0..net.h)
            .flat_map(|a| gaussian_block(seed, a as u64, net.d, dim))
            .chain(gaussian_block(seed, net.h as u64, net.h, dim))
            .chain(gaussian_block(seed, net.h as u64 + 1, net.k * net.h, dim))
            .chain(gaussian_block(seed, net.h as u64 + 2, net.k, dim))
            .collect();
        let gx = g.project(Projection::Identity);
        let mut want = vec![0.0; 7 * dim];
        gemm(&mut want, &gx, false, &pm, false, (7, dim, net.numel()), 1.0, false);
        let got = g.project(Projection::Gaussian { seed, dim });
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12 * (1.0 + b.abs()));
        }
        let small = g.project(Projection::Gaussian { seed, dim: 4 });
        for i in 0..7 {
            assert_eq!(&small[i * 4..(i + 1) * 4], &got[i * dim..i * dim + 4]);
        }
    }
}
