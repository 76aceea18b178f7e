//! Analyses of kernel Gram matrices: how far a kernel is from stationary (§4.2, Fig. 3) and how
//! kernel values or GP uncertainty behave far from the training data (Fig. 5). Which training
//! points drive a prediction (Fig. 6) is [`crate::attribution`]'s, with the other attribution
//! methods; it shares the shape checks here.
//!
//! Conventions: a kernel output Gram is `gram [P, M, K, K]` row-major with
//! `gram[((p*M + i)*K + k)*K + k'] = K(x_p, x_i)[k, k']` (`k` the row point's output class, `k'`
//! the training point's). The kernel machine is
//! `f^k(x_p) = bias[p,k] + Σ_i Σ_k' a[i,k'] · gram[p,i,k,k']` with `a [M, K]`; with per-step
//! coefficients it is `bias + Σ_s Σ_i Σ_k' a[s,i,k'] · gram_steps[s,p,i,k,k']`.
//!
//! One file per analysis: `stationarity.rs` (§4.2, Fig. 3) and `farfield.rs` (Fig. 5); the shape
//! checks they share are here. Everything here is pure, single-threaded Rust on slices and deterministic (seeded where
//! random).

mod farfield;
mod stationarity;

pub use farfield::{nearest_distance, profile, ray_points, Profile, ProfileRow};
pub(crate) use farfield::spearman;
pub use stationarity::{stationarity, Stationarity, StationarityOptions};

use statrs::statistics::Statistics;

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// Shape helpers
// ---------------------------------------------------------------------------------------------

/// Product of `dims`, or a configuration error on overflow.
fn numel(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Config(format!("{what}: shape {dims:?} overflows usize")))
}

/// Checks that a flat slice of length `len` holds a tensor of shape `dims`.
pub(crate) fn check_len(what: &str, len: usize, dims: &[usize]) -> Result<()> {
    let n = numel(what, dims)?;
    if len != n {
        return Err(Error::ShapeMismatch {
            what: format!("{what} (flat length of shape {dims:?})"),
            expected: vec![n],
            got: vec![len],
        });
    }
    Ok(())
}

/// First non-finite entry of `v`, as a data error naming `what`.
pub(crate) fn check_finite(what: &str, v: &[f64]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::Data(format!("{what}: non-finite value {} at flat index {i}", v[i]))),
        None => Ok(()),
    }
}


/// Population variance `Σ (v − v̄)² / n` (statrs; NaN for no values).
fn variance(v: &[f64]) -> f64 {
    Statistics::population_variance(v)
}

#[cfg(test)]
mod testutil {
    //! Point sets and Grams the analyses' tests share.
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{stationarity, Stationarity, StationarityOptions};

    pub(super) fn rng(seed: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(seed)
    }
    pub(super) fn uniform(n: usize, d: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
        let mut r = rng(seed);
        (0..n * d).map(|_| r.gen_range(lo..hi)).collect()
    }
    pub(super) fn gram_of(x: &[f64], n: usize, d: usize, f: impl Fn(&[f64], &[f64]) -> f64) -> Vec<f64> {
        let mut g = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                g[i * n + j] = f(&x[i * d..(i + 1) * d], &x[j * d..(j + 1) * d]);
            }
        }
        g
    }
    pub(super) fn sq(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
    }
    pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    pub(super) fn norm(a: &[f64]) -> f64 {
        dot(a, a).sqrt()
    }
    pub(super) fn rbf(l: f64) -> impl Fn(&[f64], &[f64]) -> f64 {
        move |a, b| (-sq(a, b) / (2.0 * l * l)).exp()
    }
    /// Grows with the distance from the origin: (1 + |x||x'|) · exp(−|x − x'|² / s).
    pub(super) fn growing(s: f64) -> impl Fn(&[f64], &[f64]) -> f64 {
        move |a, b| (1.0 + norm(a) * norm(b)) * (-sq(a, b) / s).exp()
    }
    pub(super) fn score(x: &[f64], g: &[f64], n: usize, d: usize) -> Stationarity {
        stationarity(x, g, n, d, &StationarityOptions::default()).unwrap()
    }

}
