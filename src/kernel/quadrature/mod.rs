//! Quadrature over one training step, `t ∈ [0, 1]`.
//!
//! Rules: `left:T` (the EPK paper's Riemann sum), `midpoint:T` (ExPLAIND), `gauss:T`
//! (Gauss–Legendre), all on the whole step, and `auto:TOL`, the adaptive rule of this crate:
//! split the step at the activation kinks of the network along `w_s(t)` (closed form for the
//! first layer, polynomial roots deeper), integrate each smooth piece with Gauss–Legendre and
//! accept a piece only when its quadrature of `d/dt f_{w_s(t)}(x)` matches the exact change
//! `f(b) − f(a)` (fundamental theorem of calculus) to the tolerance; otherwise raise the order,
//! then bisect.
//!
//! The rules' formulas live here; choosing the nodes of one step for the row points, fixed or
//! adaptive, is `nodes`; one smooth piece of a ReLU network between two kinks, integrated in
//! closed form by the MLP's and the CNN's exact rules, is `piece`; a fixed rule's nodes on a
//! piecewise-polynomial network's pieces, replaced by fewer with the same sum, and product
//! integration of a piece's softmax (the node weights that carry it), are `reduce`.

pub(crate) mod nodes;
pub(crate) mod piece;
pub(crate) mod reduce;

use crate::error::{Error, Result};

/// A quadrature rule for the test-side integral over `t ∈ [0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Left Riemann sum with T points `t_j = j/T`, weights `1/T`.
    Left(usize),
    /// Midpoint rule with T points `t_j = (j + ½)/T`.
    Midpoint(usize),
    /// T-point Gauss–Legendre on `[0, 1]`.
    Gauss(usize),
    /// Adaptive, kink-aware Gauss–Legendre with the requested absolute tolerance on the
    /// kernel machine's output (distributed over steps).
    Auto(f64),
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Left(t) => write!(f, "left:{t}"),
            Rule::Midpoint(t) => write!(f, "midpoint:{t}"),
            Rule::Gauss(t) => write!(f, "gauss:{t}"),
            Rule::Auto(tol) => write!(f, "auto:{tol:e}"),
        }
    }
}

impl std::str::FromStr for Rule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Rule> {
        let bad = || Error::Config(format!("quadrature `{s}`: expected left:T, midpoint:T, gauss:T (T >= 1) or auto:TOL (TOL > 0)"));
        let (kind, arg) = s.split_once(':').ok_or_else(bad)?;
        match kind {
            "left" | "midpoint" | "gauss" => {
                let t: usize = arg.parse().map_err(|_| bad())?;
                if t == 0 || t > 100_000 {
                    return Err(bad());
                }
                Ok(match kind {
                    "left" => Rule::Left(t),
                    "midpoint" => Rule::Midpoint(t),
                    _ => Rule::Gauss(t),
                })
            }
            "auto" => {
                let tol: f64 = arg.parse().map_err(|_| bad())?;
                if !(tol.is_finite() && tol > 0.0) {
                    return Err(bad());
                }
                Ok(Rule::Auto(tol))
            }
            _ => Err(bad()),
        }
    }
}

impl Rule {
    /// Nodes and weights of a fixed rule on `[0, 1]` (`None` for `Auto`).
    pub fn fixed_nodes(&self) -> Option<Vec<(f64, f64)>> {
        match *self {
            Rule::Left(t) => Some((0..t).map(|j| (j as f64 / t as f64, 1.0 / t as f64)).collect()),
            Rule::Midpoint(t) => Some((0..t).map(|j| ((j as f64 + 0.5) / t as f64, 1.0 / t as f64)).collect()),
            Rule::Gauss(t) => Some(gauss_legendre_01(t, 0.0, 1.0)),
            Rule::Auto(_) => None,
        }
    }
}

/// Gauss–Legendre nodes and weights on `[-1, 1]` (Newton on P_n from Chebyshev-like guesses;
/// accurate to a few ulps for n ≤ a few hundred).
pub(crate) fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    assert!(n >= 1, "Gauss–Legendre needs n >= 1");
    let mut out = vec![(0.0, 0.0); n];
    let m = n.div_ceil(2);
    for i in 0..m {
        let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
        let mut dp = 0.0;
        for _ in 0..100 {
            let (p, d) = legendre(n, x);
            dp = d;
            let dx = p / d;
            x -= dx;
            if dx.abs() < 1e-16 {
                break;
            }
        }
        let (_, d) = legendre(n, x);
        if d != 0.0 {
            dp = d;
        }
        let w = 2.0 / ((1.0 - x * x) * dp * dp);
        out[i] = (-x, w);
        out[n - 1 - i] = (x, w);
    }
    if n % 2 == 1 {
        out[n / 2].0 = 0.0;
    }
    out
}

/// (P_n(x), P_n'(x)) by the three-term recurrence.
fn legendre(n: usize, x: f64) -> (f64, f64) {
    let (mut p0, mut p1) = (1.0, x);
    if n == 0 {
        return (1.0, 0.0);
    }
    for k in 2..=n {
        let p2 = ((2 * k - 1) as f64 * x * p1 - (k - 1) as f64 * p0) / k as f64;
        p0 = p1;
        p1 = p2;
    }
    let d = n as f64 * (x * p1 - p0) / (x * x - 1.0);
    (p1, d)
}

/// Gauss–Legendre nodes mapped to `[a, b]`, weights scaled by `b − a` (rules up to order 64
/// are computed once and cached).
pub(crate) fn gauss_legendre_01(n: usize, a: f64, b: f64) -> Vec<(f64, f64)> {
    static CACHE: std::sync::OnceLock<Vec<Vec<(f64, f64)>>> = std::sync::OnceLock::new();
    let h = b - a;
    let map = |&(x, w): &(f64, f64)| (a + 0.5 * h * (x + 1.0), 0.5 * h * w);
    if (1..=64).contains(&n) {
        let table = CACHE.get_or_init(|| (0..=64).map(|k| if k == 0 { Vec::new() } else { gauss_legendre(k) }).collect());
        table[n].iter().map(map).collect()
    } else {
        gauss_legendre(n).iter().map(map).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::{horner, poly_roots_in};

    #[test]
    fn gauss_integrates_polynomials_exactly() {
        for n in 1..=20 {
            let nodes = gauss_legendre_01(n, 0.0, 1.0);
            let wsum: f64 = nodes.iter().map(|p| p.1).sum();
            assert!((wsum - 1.0).abs() < 1e-14, "n={n}");
            for deg in 0..2 * n {
                let q: f64 = nodes.iter().map(|(t, w)| w * t.powi(deg as i32)).sum();
                assert!((q - 1.0 / (deg as f64 + 1.0)).abs() < 1e-14, "n={n} deg={deg}");
            }
            // and not degree 2n (the error is visible for small n)
            if n > 6 {
                continue;
            }
            let q: f64 = nodes.iter().map(|(t, w)| w * t.powi(2 * n as i32)).sum();
            assert!((q - 1.0 / (2.0 * n as f64 + 1.0)).abs() > 1e-12);
        }
    }

    #[test]
    fn fixed_rules() {
        let l = Rule::Left(4).fixed_nodes().unwrap();
        assert_eq!(l[0], (0.0, 0.25));
        assert_eq!(l[3].0, 0.75);
        let m = Rule::Midpoint(2).fixed_nodes().unwrap();
        assert_eq!(m, vec![(0.25, 0.5), (0.75, 0.5)]);
        assert!(Rule::Auto(1e-12).fixed_nodes().is_none());
    }

    #[test]
    fn parse_rules() {
        assert_eq!("left:100".parse::<Rule>().unwrap(), Rule::Left(100));
        assert_eq!("gauss:7".parse::<Rule>().unwrap(), Rule::Gauss(7));
        assert_eq!("auto:1e-12".parse::<Rule>().unwrap(), Rule::Auto(1e-12));
        for bad in ["left", "left:0", "gauss:x", "auto:-1", "auto:nan", "simpson:3", "midpoint:"] {
            assert!(bad.parse::<Rule>().is_err(), "{bad}");
        }
        assert_eq!(Rule::Auto(1e-12).to_string(), "auto:1e-12");
    }

    #[test]
    fn roots() {
        // (u - 0.3)(u - 0.7) = u^2 - u + 0.21
        let r = poly_roots_in(&[0.21, -1.0, 1.0], 0.0, 1.0);
        assert_eq!(r.len(), 2);
        assert!((r[0] - 0.3).abs() < 1e-15 && (r[1] - 0.7).abs() < 1e-15);
        assert_eq!(poly_roots_in(&[0.21, -1.0, 1.0], 0.5, 1.0).len(), 1);
        assert!(poly_roots_in(&[1.0, 0.0, 1.0], 0.0, 1.0).is_empty());
        assert_eq!(poly_roots_in(&[-0.25, 1.0], 0.0, 1.0), vec![0.25]);
        // cubic (u-0.1)(u-0.5)(u-0.9)
        let c = [-0.045, 0.59, -1.5, 1.0];
        let r = poly_roots_in(&c, 0.0, 1.0);
        assert_eq!(r.len(), 3);
        for (a, b) in r.iter().zip([0.1, 0.5, 0.9]) {
            assert!((a - b).abs() < 1e-14, "{a} vs {b}");
        }
        // quartic with two roots in range
        let q = [0.0324, 0.0, -1.01, 0.0, 1.0]; // (u^2-0.01... ) roots ±0.18, ±1
        let r = poly_roots_in(&q, 0.0, 0.5);
        assert_eq!(r.len(), 1);
        assert!((horner(&q, r[0])).abs() < 1e-14);
        assert!(poly_roots_in(&[0.0, 0.0], 0.0, 1.0).is_empty());
    }
}
