//! Row-major GEMM on slices through faer (parallel over the global rayon pool when large).

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

fn par_for(m: usize, n: usize, k: usize) -> Par {
    if (m as f64) * (n as f64) * (k as f64) > 2.0e6 {
        Par::rayon(0)
    } else {
        Par::Seq
    }
}

/// `C = β·C + α·op(A)·op(B)` on row-major slices, `op` = transpose when the flag is set; `β`
/// is 0 or 1 (`accumulate`). The one GEMM on slices: [`gemm_abt`] and [`gemm_ab`] are its two
/// common cases.
///
/// # Shapes
/// `op(A)` `[m, k]`, `op(B)` `[k, n]`, `c` `[m, n]`; `a` is stored `[m, k]` (or `[k, m]` when
/// transposed), `b` `[k, n]` (or `[n, k]`).
///
/// # Panics
/// When a slice length does not match its shape (a programmer error).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(c: &mut [f64], a: &[f64], ta: bool, b: &[f64], tb: bool, (m, n, k): (usize, usize, usize), alpha: f64, accumulate: bool) {
    assert_eq!(a.len(), m * k, "A has the wrong size");
    assert_eq!(b.len(), k * n, "B has the wrong size");
    assert_eq!(c.len(), m * n, "C has the wrong size");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.iter_mut().for_each(|v| *v = 0.0);
        }
        return;
    }
    let lhs = if ta { MatRef::from_row_major_slice(a, k, m).transpose() } else { MatRef::from_row_major_slice(a, m, k) };
    let rhs = if tb { MatRef::from_row_major_slice(b, n, k).transpose() } else { MatRef::from_row_major_slice(b, k, n) };
    let dst = MatMut::from_row_major_slice_mut(c, m, n);
    let beta = if accumulate { Accum::Add } else { Accum::Replace };
    matmul(dst, beta, lhs, rhs, alpha, par_for(m, n, k));
}

/// `C = β·C + α·A·Bᵀ` with row-major `A [m, k]`, `B [n, k]`, `C [m, n]`; `β` is 0 or 1
/// (`accumulate`).
///
/// # Shapes
/// `a` `[m, k]`, `b` `[n, k]`, `c` `[m, n]`.
pub(crate) fn gemm_abt(c: &mut [f64], a: &[f64], b: &[f64], m: usize, n: usize, k: usize, alpha: f64, accumulate: bool) {
    gemm(c, a, false, b, true, (m, n, k), alpha, accumulate);
}

/// `C = A·Bᵀ` with the rows of `A` and `B` read from every `lda`-th and `ldb`-th number: the
/// first `k` columns of wider row-major arrays (a partly filled buffer).
///
/// # Shapes
/// `a` `[m, lda]`, `b` `[n, ldb]` (`k ≤ lda, ldb`), `c` `[m, n]`.
pub(crate) fn gemm_abt_prefix(c: &mut [f64], a: &[f64], lda: usize, b: &[f64], ldb: usize, m: usize, n: usize, k: usize) {
    assert!(k <= lda && k <= ldb, "the prefix is wider than the rows");
    assert_eq!(a.len(), m * lda, "A has the wrong size");
    assert_eq!(b.len(), n * ldb, "B has the wrong size");
    assert_eq!(c.len(), m * n, "C has the wrong size");
    if m == 0 || n == 0 {
        return;
    }
    let dst = MatMut::from_row_major_slice_mut(c, m, n);
    if k == 0 {
        let mut dst = dst;
        dst.fill(0.0);
        return;
    }
    let lhs = MatRef::from_row_major_slice_with_stride(&a[..(m - 1) * lda + k], m, k, lda);
    let rhs = MatRef::from_row_major_slice_with_stride(&b[..(n - 1) * ldb + k], n, k, ldb).transpose();
    matmul(dst, Accum::Replace, lhs, rhs, 1.0, par_for(m, n, k));
}

/// `C += α·A·Bᵀ` on row-major matrices whose rows are every `ldc`-th, `lda`-th and `ldb`-th
/// number of their slices (every K-th row of a `[(p, c), ·]` array: one class's rows, read and
/// written in place instead of gathered into copies).
///
/// # Shapes
/// `a` holds `m` rows of `k` at stride `lda`, `b` `n` rows of `k` at stride `ldb`, `c` `m` rows
/// of `n` at stride `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_abt_strided_add(c: &mut [f64], ldc: usize, a: &[f64], lda: usize, b: &[f64], ldb: usize, m: usize, n: usize, k: usize, alpha: f64) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(k <= lda && k <= ldb && n <= ldc, "rows wider than their stride");
    let lhs = MatRef::from_row_major_slice_with_stride(&a[..(m - 1) * lda + k], m, k, lda);
    let rhs = MatRef::from_row_major_slice_with_stride(&b[..(n - 1) * ldb + k], n, k, ldb).transpose();
    // The transpose of a column-major view: faer 0.24.4's `from_row_major_slice_with_stride_mut`
    // builds its view with the strides swapped (row stride 1) and writes out of bounds.
    let dst = MatMut::from_column_major_slice_with_stride_mut(&mut c[..(m - 1) * ldc + n], n, m, ldc).transpose_mut();
    matmul(dst, Accum::Add, lhs, rhs, alpha, par_for(m, n, k));
}

/// `C = β·C + α·A·B` with row-major `A [m, k]`, `B [k, n]`, `C [m, n]`.
///
/// # Shapes
/// `a` `[m, k]`, `b` `[k, n]`, `c` `[m, n]`.
pub(crate) fn gemm_ab(c: &mut [f64], a: &[f64], b: &[f64], m: usize, n: usize, k: usize, alpha: f64, accumulate: bool) {
    gemm(c, a, false, b, false, (m, n, k), alpha, accumulate);
}

/// faer's f64 GEMM rate on an `n × n` by `n × n` product, GFLOP/s (fastest of `repeat`).
pub(crate) fn gemm_rate(n: usize, repeat: usize) -> f64 {
    let a: Vec<f64> = (0..n * n).map(|i| ((i % 97) as f64 - 48.0) / 97.0).collect();
    let b: Vec<f64> = (0..n * n).map(|i| ((i % 89) as f64 - 44.0) / 89.0).collect();
    let mut c = vec![0.0; n * n];
    let mut best = f64::INFINITY;
    for _ in 0..repeat.max(1) {
        let t0 = std::time::Instant::now();
        gemm_abt(&mut c, &a, &b, n, n, n, 1.0, false);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (n as f64).powi(3) / best * 1e-9
}

/// Real roots of the polynomial `Σ_j c_j u^j` strictly inside `(lo, hi)`, sorted.
///
/// Degree ≤ 2 in closed form (numerically stable quadratic formula); higher degrees by
/// isolating monotone intervals between the roots of the derivative, then bisection.
pub(crate) fn poly_roots_in(c: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let mut deg = c.len();
    let scale = c.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if scale == 0.0 {
        return Vec::new();
    }
    while deg > 0 && c[deg - 1].abs() <= 1e-15 * scale {
        deg -= 1;
    }
    let c = &c[..deg];
    let mut roots = match deg {
        0 | 1 => Vec::new(),
        2 => vec![-c[0] / c[1]],
        3 => {
            let (a, b, cc) = (c[2], c[1], c[0]);
            let disc = b * b - 4.0 * a * cc;
            if disc < 0.0 {
                Vec::new()
            } else {
                let q = -0.5 * (b + b.signum() * disc.sqrt());
                let mut r = Vec::new();
                if q != 0.0 {
                    r.push(q / a);
                    r.push(cc / q);
                } else {
                    r.push(0.0);
                }
                r
            }
        }
        _ => {
            let d: Vec<f64> = (1..deg).map(|j| j as f64 * c[j]).collect();
            let mut cuts = vec![lo];
            cuts.extend(poly_roots_in(&d, lo, hi));
            cuts.push(hi);
            let mut r = Vec::new();
            for w in cuts.windows(2) {
                let (mut a, mut b) = (w[0], w[1]);
                let (mut fa, fb) = (horner(c, a), horner(c, b));
                if fa == 0.0 || fb == 0.0 || fa.signum() == fb.signum() {
                    continue;
                }
                for _ in 0..200 {
                    let m = 0.5 * (a + b);
                    if m <= a || m >= b {
                        break;
                    }
                    let fm = horner(c, m);
                    if fm.signum() == fa.signum() {
                        a = m;
                        fa = fm;
                    } else {
                        b = m;
                    }
                }
                r.push(0.5 * (a + b));
            }
            r
        }
    };
    let margin = 1e-13 * (hi - lo).abs().max(1e-300);
    roots.retain(|r| r.is_finite() && *r > lo + margin && *r < hi - margin);
    roots.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    roots
}

/// Evaluates `Σ_j c_j u^j`.
pub(crate) fn horner(c: &[f64], u: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, v| acc * u + v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every K-th row of three arrays, multiplied in place, equals gathering them and
    /// multiplying the copies; the rows in between are untouched.
    #[test]
    fn strided_gemm_equals_gathered_rows() {
        let (m, n, k, kk) = (4, 3, 5, 3);
        let a: Vec<f64> = (0..m * kk * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..n * kk * k).map(|i| (i as f64 * 0.11).cos()).collect();
        let mut c: Vec<f64> = (0..m * kk * n).map(|i| i as f64).collect();
        let before = c.clone();
        for cls in 0..kk {
            gemm_abt_strided_add(&mut c[cls * n..], kk * n, &a[cls * k..], kk * k, &b[cls * k..], kk * k, m, n, k, 0.5);
        }
        for r in 0..m * kk {
            let cls = r % kk;
            for j in 0..n {
                let want: f64 = before[r * n + j] + 0.5 * (0..k).map(|q| a[r * k + q] * b[(j * kk + cls) * k + q]).sum::<f64>();
                assert!((c[r * n + j] - want).abs() < 1e-14, "({r}, {j})");
            }
        }
    }

    #[test]
    fn gemm_matches_loops() {
        let (m, n, k) = (5, 4, 3);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..n * k).map(|i| (i as f64 * 0.11).cos()).collect();
        let mut c = vec![1.0; m * n];
        gemm_abt(&mut c, &a, &b, m, n, k, 2.0, true);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum();
                assert!((c[i * n + j] - (1.0 + 2.0 * s)).abs() < 1e-14);
            }
        }
        // The first 2 of 3 columns.
        let mut cp = vec![0.0; m * n];
        gemm_abt_prefix(&mut cp, &a, k, &b, k, m, n, 2);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..2).map(|l| a[i * k + l] * b[j * k + l]).sum();
                assert!((cp[i * n + j] - s).abs() < 1e-14);
            }
        }
        let bt: Vec<f64> = (0..k * n).map(|idx| b[(idx % n) * k + idx / n]).collect();
        let mut c2 = vec![0.0; m * n];
        gemm_ab(&mut c2, &a, &bt, m, n, k, 1.0, false);
        for i in 0..m * n {
            assert!((c2[i] - (c[i] - 1.0) / 2.0).abs() < 1e-14);
        }
    }
}
