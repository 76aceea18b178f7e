//! The fast retrainer: full-batch gradient descent on the mean cross-entropy over a subset of
//! the training set, from a given `w_0`, for a one-hidden-layer ReLU MLP ([`Mlp1`]) on faer GEMMs.
//! It replaces the crate's dfdx training (the slow, obvious path it is tested against) for the 50
//! subset retrainings and the ensemble, where only final weights are needed.

use crate::attribution::mlp::Mlp1;
use crate::linalg::gemm;
use crate::error::{Error, Result};

/// Plain gradient descent `w ← w − ε ∇L_S(w)`, `L_S = −(1/|S|) Σ_{i∈S} log p_{y_i}(x_i)`, for
/// `steps` steps from `w0`. Returns the final network.
///
/// # Shapes
/// `x [n, d]` and `labels [n]` are the training rows actually used (the subset, gathered).
///
/// Errors: a label out of range, an empty subset, and [`Error::Diverged`] when the loss stops
/// being finite (naming the step).
pub fn gd(w0: &Mlp1, x: &[f64], labels: &[usize], lr: f64, steps: usize) -> Result<Mlp1> {
    let (d, k) = (w0.d, w0.k);
    let n = labels.len();
    if n == 0 || x.len() != n * d {
        return Err(Error::ShapeMismatch { what: "retrain: subset rows".into(), expected: vec![n, d], got: vec![x.len()] });
    }
    if let Some(&bad) = labels.iter().find(|&&y| y >= k) {
        return Err(Error::Data(format!("retrain: label {bad} is out of range for {k} classes")));
    }
    let nnz = x.iter().filter(|v| **v != 0.0).count();
    if (nnz as f64) < 0.4 * x.len() as f64 {
        gd_loop(w0, &Inputs::Sparse(Csr::new(x, d)), labels, lr, steps)
    } else {
        gd_loop(w0, &Inputs::Dense(x), labels, lr, steps)
    }
}

/// Rows in compressed sparse row form (MNIST pixels are about 80 % zeros).
///
/// # Shapes
/// `n` rows of `d` columns: `ptr [n + 1]`, `idx`, `val` `[nnz]`.
struct Csr {
    ptr: Vec<usize>,
    idx: Vec<usize>,
    val: Vec<f64>,
    d: usize,
}

impl Csr {
    fn new(x: &[f64], d: usize) -> Csr {
        let mut c = Csr { ptr: vec![0], idx: vec![], val: vec![], d };
        for row in x.chunks_exact(d) {
            for (b, &v) in row.iter().enumerate() {
                if v != 0.0 {
                    c.idx.push(b);
                    c.val.push(v);
                }
            }
            c.ptr.push(c.idx.len());
        }
        c
    }
    /// `out[i, :] = Σ_b x_ib · wt[b, :]`. # Shapes `wt [d, h]`, `out [n, h]`.
    fn times(&self, wt: &[f64], h: usize, out: &mut [f64]) {
        use rayon::prelude::*;
        out.par_chunks_mut(h).enumerate().for_each(|(i, o)| {
            o.iter_mut().for_each(|v| *v = 0.0);
            for q in self.ptr[i]..self.ptr[i + 1] {
                let (b, v) = (self.idx[q], self.val[q]);
                o.iter_mut().zip(&wt[b * h..(b + 1) * h]).for_each(|(a, w)| *a += v * w);
            }
        });
    }
    /// `Xᵀ g`: `out[b, :] = Σ_i x_ib · g[i, :]`. # Shapes `g [n, h]`, `out [d, h]`.
    fn t_times(&self, g: &[f64], h: usize) -> Vec<f64> {
        use rayon::prelude::*;
        let n = self.ptr.len() - 1;
        let parts = rayon::current_num_threads().max(1);
        let per = n.div_ceil(parts);
        (0..parts)
            .into_par_iter()
            .map(|t| {
                let mut acc = vec![0.0; self.d * h];
                for i in t * per..((t + 1) * per).min(n) {
                    let gi = &g[i * h..(i + 1) * h];
                    for q in self.ptr[i]..self.ptr[i + 1] {
                        let (b, v) = (self.idx[q], self.val[q]);
                        acc[b * h..(b + 1) * h].iter_mut().zip(gi).for_each(|(a, x)| *a += v * x);
                    }
                }
                acc
            })
            .reduce(|| vec![0.0; self.d * h], |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            })
    }
}

enum Inputs<'a> {
    Dense(&'a [f64]),
    Sparse(Csr),
}

fn gd_loop(w0: &Mlp1, x: &Inputs, labels: &[usize], lr: f64, steps: usize) -> Result<Mlp1> {
    let (d, h, k) = (w0.d, w0.h, w0.k);
    let n = labels.len();
    let mut w = w0.clone();
    // The sparse path keeps W1ᵀ [d, h] so that each input column's weights are contiguous.
    let mut w1t: Vec<f64> = (0..d * h).map(|q| w.w1[(q % h) * d + q / h]).collect();
    let inv_n = 1.0 / n as f64;
    let (mut gw1, mut gw2) = (vec![0.0; h * d], vec![0.0; k * h]);
    let mut dh = vec![0.0; n * h];
    let mut pre = vec![0.0; n * h];
    for step in 0..steps {
        match x {
            Inputs::Dense(x) => gemm(&mut pre, x, false, &w.w1, true, (n, h, d), 1.0, false),
            Inputs::Sparse(c) => c.times(&w1t, h, &mut pre),
        }
        for row in pre.chunks_exact_mut(h) {
            row.iter_mut().zip(&w.b1).for_each(|(v, b)| *v += b);
        }
        let hid: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let mut logp = vec![0.0; n * k];
        gemm(&mut logp, &hid, false, &w.w2, true, (n, k, h), 1.0, false);
        for row in logp.chunks_exact_mut(k) {
            row.iter_mut().zip(&w.b2).for_each(|(v, b)| *v += b);
        }
        crate::model::log_softmax_rows(&mut logp, k);
        // dL/dz = (softmax(z) − e_y) / n.
        let mut dz: Vec<f64> = logp.iter().map(|lp| lp.exp() * inv_n).collect();
        let mut loss = 0.0;
        for (i, &y) in labels.iter().enumerate() {
            dz[i * k + y] -= inv_n;
            loss -= logp[i * k + y] * inv_n;
        }
        if !loss.is_finite() {
            return Err(Error::Diverged { step, loss, what: "the retraining loss".into() });
        }
        gemm(&mut gw2, &dz, true, &hid, false, (k, h, n), 1.0, false);
        let gb2: Vec<f64> = (0..k).map(|c| (0..n).map(|i| dz[i * k + c]).sum()).collect();
        gemm(&mut dh, &dz, false, &w.w2, false, (n, h, k), 1.0, false);
        dh.iter_mut().zip(&pre).for_each(|(g, &p)| {
            if p <= 0.0 {
                *g = 0.0
            }
        });
        let gb1: Vec<f64> = (0..h).map(|j| (0..n).map(|i| dh[i * h + j]).sum()).collect();
        match x {
            Inputs::Dense(x) => {
                gemm(&mut gw1, &dh, true, x, false, (h, d, n), 1.0, false);
                w.w1.iter_mut().zip(&gw1).for_each(|(v, g)| *v -= lr * g);
            }
            Inputs::Sparse(c) => {
                let g1t = c.t_times(&dh, h);
                w1t.iter_mut().zip(&g1t).for_each(|(v, g)| *v -= lr * g);
            }
        }
        w.b1.iter_mut().zip(&gb1).for_each(|(v, g)| *v -= lr * g);
        w.w2.iter_mut().zip(&gw2).for_each(|(v, g)| *v -= lr * g);
        w.b2.iter_mut().zip(&gb2).for_each(|(v, g)| *v -= lr * g);
    }
    if let Inputs::Sparse(_) = x {
        w.w1 = (0..h * d).map(|q| w1t[(q % d) * h + q / d]).collect();
    }
    Ok(w)
}

/// Gathers rows `idx` of `x` (`[n, d]`) and their labels.
///
/// # Shapes
/// `x [n, d]`, `labels [n]` → `([|idx|, d], [|idx|])`.
pub fn gather(x: &[f64], labels: &[usize], d: usize, idx: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let mut xs = Vec::with_capacity(idx.len() * d);
    for &i in idx {
        xs.extend_from_slice(&x[i * d..(i + 1) * d]);
    }
    (xs, idx.iter().map(|&i| labels[i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::mlp::small_arch;
    use crate::model::net::{LossKind, Objective};

    /// dfdx's gradients of the same objective, stepped by hand: the slow obvious path (dense
    /// inputs, and inputs 80 % zeros, which take the sparse path).
    #[test]
    fn gd_matches_dfdx_gradient_descent_on_a_subset() {
        for sparse in [false, true] {
            check_against_dfdx(sparse);
        }
    }

    fn check_against_dfdx(sparse: bool) {
        let arch = small_arch(6, 9, 4);
        let w0 = arch.init(11);
        let n = 30;
        let x: Vec<f64> = (0..n * 6)
            .map(|i| if sparse && i % 5 != 0 { 0.0 } else { ((i * 7 % 13) as f64 * 0.37).sin() })
            .collect();
        let labels: Vec<usize> = (0..n).map(|i| (i * 5 + i / 3) % 4).collect();
        let idx: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
        let (xs, ys) = gather(&x, &labels, 6, &idx);
        let (lr, steps) = (0.5, 40);
        let fast = gd(&Mlp1::from_params(&arch, &w0).unwrap(), &xs, &ys, lr, steps).unwrap();
        let obj = Objective::new(dfdx::tensor::Cpu::default(), &arch, &xs, Some(&ys), None, LossKind::CrossEntropy, None).unwrap();
        let mut w = w0.clone();
        for _ in 0..steps {
            let g = obj.evaluate(&w).grad;
            for (t, gt) in w.data.iter_mut().zip(&g.data) {
                t.iter_mut().zip(gt).for_each(|(v, g)| *v -= lr * g);
            }
        }
        let (a, b) = (fast.flat(), w.flat());
        let rel = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / b.iter().map(|v| v.abs()).fold(0.0, f64::max);
        assert!(rel < 1e-12, "relative difference {rel:e}");
    }
}
