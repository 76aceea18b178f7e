//! Gram assembly from structured per-layer factors, without Jacobians.
//!
//! For rows r (test-side quadrature nodes of point p(r), weight w_r) and training points i,
//! one dense layer contributes
//! `G[p, i, k, k'] += Σ_{r∈p} w_r (δ_r[k]·δ_i[k']) (a_r·a_i + [bias])`.
//! Both factors are GEMMs (faer); the product and the scatter to points run over blocks of rows so
//! the temporary `[(B·K), (M·K)]` matrix stays bounded.

use super::linalg::gemm_abt;

/// One layer's factors for a set of rows.
pub struct LayerFactors<'a> {
    /// Input activations `[R, n_in]`.
    pub acts: &'a [f64],
    /// Sensitivities `[R, K, n_out]`.
    pub deltas: &'a [f64],
    /// Input width.
    pub n_in: usize,
    /// Output width.
    pub n_out: usize,
}

/// Bytes of scratch per block (the `[(B·K), (M·K)]` product).
const BLOCK_BYTES: usize = 64 << 20;

/// Adds one layer's contribution to `g` (`[P, M, K, K]`).
///
/// `rows` are weighted by `weight[r]` and scattered to `point[r]`; `train` holds the M training
/// rows' factors. `bias` adds the bias gradient's inner product (`a·a' + 1`).
///
/// # Shapes
/// `g` `[P, M, K, K]`, `point`/`weight` `[R]`.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_layer(
    g: &mut [f64],
    m: usize,
    k: usize,
    point: &[usize],
    weight: &[f64],
    rows: &LayerFactors<'_>,
    train: &LayerFactors<'_>,
    bias: bool,
) {
    let r_total = point.len();
    if r_total == 0 || m == 0 {
        return;
    }
    let (ni, no) = (rows.n_in, rows.n_out);
    let block = (BLOCK_BYTES / 8 / (k * k * m).max(1)).clamp(1, r_total);
    let mut aa = vec![0.0; block * m];
    let mut dd = vec![0.0; block * k * m * k];
    let mk = m * k;
    for start in (0..r_total).step_by(block) {
        let b = block.min(r_total - start);
        let a_blk = &rows.acts[start * ni..(start + b) * ni];
        let d_blk = &rows.deltas[start * k * no..(start + b) * k * no];
        gemm_abt(&mut aa[..b * m], a_blk, train.acts, b, m, ni, 1.0, false);
        gemm_abt(&mut dd[..b * k * mk], d_blk, train.deltas, b * k, mk, no, 1.0, false);
        for rr in 0..b {
            let r = start + rr;
            let w = weight[r];
            if w == 0.0 {
                continue;
            }
            let p = point[r];
            let gp = &mut g[p * m * k * k..(p + 1) * m * k * k];
            let aa_r = &aa[rr * m..(rr + 1) * m];
            for kt in 0..k {
                let dd_row = &dd[(rr * k + kt) * mk..(rr * k + kt + 1) * mk];
                for i in 0..m {
                    let s = w * (aa_r[i] + if bias { 1.0 } else { 0.0 });
                    let gi = &mut gp[(i * k + kt) * k..(i * k + kt + 1) * k];
                    let di = &dd_row[i * k..(i + 1) * k];
                    for ks in 0..k {
                        gi[ks] += s * di[ks];
                    }
                }
            }
        }
    }
}
