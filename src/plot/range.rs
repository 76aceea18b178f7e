//! Data ranges, below the axes and the colour maps that both fit them: the finite (min, max) of
//! a set of values, and the widening of a degenerate range.

/// The (min, max) of the finite values; `None` when there is none.
pub(super) fn finite_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// Widens a degenerate range so that it has a positive span.
pub(super) fn widen(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        let d = if lo.abs() > 0.0 { lo.abs() * 0.05 } else { 0.5 };
        (lo - d, hi + d)
    }
}
