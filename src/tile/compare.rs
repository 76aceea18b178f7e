//! Comparing two kernel directories array by array (`pathkernel tile compare`): a merged tiled
//! result against the one-process one.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::{SafeFile, Table};

/// The difference of one array (or table column) between two kernel directories.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ArrayDiff {
    /// `gram.safetensors:NAME` or `predictions.parquet:COLUMN`.
    pub name: String,
    /// Elements compared.
    pub len: usize,
    /// max |a − b|.
    pub max_abs: f64,
    /// max |b| (the scale).
    pub scale: f64,
    /// `max_abs / scale` (`max_abs` itself when the scale is 0); NaN when any entry is NaN.
    pub rel: f64,
    /// Whether every entry is bit-identical.
    pub identical: bool,
}

fn diff(name: String, a: &[f64], b: &[f64]) -> ArrayDiff {
    let max_abs = crate::kernel::max_abs_diff(a, b);
    let scale = crate::kernel::max_abs(b);
    let rel = if scale > 0.0 { max_abs / scale } else { max_abs };
    let identical = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    ArrayDiff { name, len: a.len(), max_abs, scale, rel, identical }
}

/// Compares `a/gram.safetensors` with `b/gram.safetensors` (every tensor: same names, shapes
/// and dtypes, then the values) and the float columns of `predictions.parquet` (except
/// `abs_error`, which is `|kernel_machine − network|`: its relative difference measures rounding
/// of an error near zero, and both columns it comes from are compared).
pub fn compare_dirs(a: &Path, b: &Path) -> Result<Vec<ArrayDiff>> {
    let fa = SafeFile::open(&a.join("gram.safetensors"))?;
    let fb = SafeFile::open(&b.join("gram.safetensors"))?;
    if fa.names() != fb.names() {
        return Err(Error::Data(format!("{} holds {:?}, {} holds {:?}", a.display(), fa.names(), b.display(), fb.names())));
    }
    let mut out = Vec::new();
    for name in fa.names() {
        let (sa, sb) = (fa.shape(&name)?, fb.shape(&name)?);
        if sa != sb {
            return Err(Error::ShapeMismatch { what: format!("gram.safetensors:{name}"), expected: sb, got: sa });
        }
        let (va, vb) = match (fa.f64(&name, None), fb.f64(&name, None)) {
            (Ok((_, x)), Ok((_, y))) => (x, y),
            _ => {
                let to_f = |v: Vec<i64>| v.into_iter().map(|x| x as f64).collect::<Vec<f64>>();
                (to_f(fa.i64(&name, None)?.1), to_f(fb.i64(&name, None)?.1))
            }
        };
        out.push(diff(format!("gram.safetensors:{name}"), &va, &vb));
    }
    let ta = Table::read_parquet(&a.join("predictions.parquet"))?;
    let tb = Table::read_parquet(&b.join("predictions.parquet"))?;
    for (col, _) in &tb.columns {
        if col == "abs_error" {
            continue;
        }
        if let (Some(x), Some(y)) = (ta.f64(col), tb.f64(col)) {
            if x.len() != y.len() {
                return Err(Error::ShapeMismatch { what: format!("predictions.parquet:{col}"), expected: vec![y.len()], got: vec![x.len()] });
            }
            out.push(diff(format!("predictions.parquet:{col}"), x, y));
        }
    }
    Ok(out)
}
