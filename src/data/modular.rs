//! Modular arithmetic `a ∘ b mod p` as token sequences, in ExPLAIND's layout (the grokking
//! task of `scripts/grokking_torch.py`).
//!
//! Each example is the four token ids `[a, p, b, p + 1]` (token `p` is the operator, `p + 1` is
//! `=`) with the class `(a ∘ b) mod p`; the vocabulary is `0..p + 2` and so are the classes
//! (`K = p + 2`: the network's logits range over every token, as ExPLAIND's unembedding does; the
//! labels are all `< p`). For a commutative operation (`+`, `*`) every unordered pair appears once
//! with the larger residue first (`a ≥ b`, ExPLAIND's order: p(p+1)/2 examples); for `-` every
//! ordered pair (p² examples). A seeded permutation (ChaCha8) takes `round(train_frac · N)` of
//! them for training, the rest are the test set; both keep the enumeration's order.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{Dataset, Targets};
use crate::error::{Error, Result};

/// The operation `∘` of `a ∘ b mod p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModOp {
    /// `a + b mod p`.
    #[serde(rename = "+")]
    Add,
    /// `a − b mod p`.
    #[serde(rename = "-")]
    Sub,
    /// `a · b mod p`.
    #[serde(rename = "*")]
    Mul,
}

impl ModOp {
    fn apply(self, a: usize, b: usize, p: usize) -> usize {
        match self {
            ModOp::Add => (a + b) % p,
            ModOp::Sub => (a + p - b) % p,
            ModOp::Mul => (a * b) % p,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            ModOp::Add => "+",
            ModOp::Sub => "-",
            ModOp::Mul => "*",
        }
    }

    fn commutative(self) -> bool {
        !matches!(self, ModOp::Sub)
    }
}

/// The largest modulus accepted (p² examples of 4 tokens stay far below memory limits).
const MAX_P: usize = 1 << 12;

/// The `(a, b)` pairs in enumeration order: `a ≥ b` for a commutative operation, all ordered
/// pairs for `-`.
fn pairs(p: usize, op: ModOp) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for b in 0..p {
        for a in 0..p {
            if !op.commutative() || a >= b {
                v.push((a, b));
            }
        }
    }
    v
}

/// Checks `p`, `train_frac` and that both splits are non-empty; returns the number of training
/// examples.
pub(crate) fn validate(p: usize, op: ModOp, train_frac: f64) -> Result<usize> {
    if !(2..=MAX_P).contains(&p) {
        return Err(Error::Config(format!("data.p must be between 2 and {MAX_P}, got {p}")));
    }
    if !(train_frac.is_finite() && train_frac > 0.0 && train_frac < 1.0) {
        return Err(Error::Config(format!("data.train_frac must be in (0, 1), got {train_frac}")));
    }
    let n = pairs(p, op).len();
    let n_train = (train_frac * n as f64).round() as usize;
    if n_train == 0 || n_train >= n {
        return Err(Error::Config(format!("data.train_frac = {train_frac} gives {n_train} of the {n} examples of p = {p} for training; both splits need one")));
    }
    Ok(n_train)
}

/// The dataset: rows `[a, p, b, p + 1]` (`dim = 4`, `vocab = p + 2`), labels `(a ∘ b) mod p`,
/// `K = p + 2`.
///
/// # Shapes
/// `x_train: [M, 4]`, `x_test: [N − M, 4]` token ids; labels `[M]`, `[N − M]`.
pub(crate) fn modular(p: usize, op: ModOp, train_frac: f64, seed: u64) -> Result<Dataset> {
    let n_train = validate(p, op, train_frac)?;
    let all = pairs(p, op);
    let mut perm: Vec<usize> = (0..all.len()).collect();
    perm.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let (mut tr, mut te) = (perm[..n_train].to_vec(), perm[n_train..].to_vec());
    tr.sort_unstable();
    te.sort_unstable();
    let rows = |idx: &[usize]| -> (Vec<f64>, Vec<usize>) {
        let mut x = Vec::with_capacity(4 * idx.len());
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            let (a, b) = all[i];
            x.extend([a as f64, p as f64, b as f64, (p + 1) as f64]);
            y.push(op.apply(a, b, p));
        }
        (x, y)
    };
    let ((x_train, y_train), (x_test, y_test)) = (rows(&tr), rows(&te));
    let description = format!(
        "a {} b mod {p} as tokens [a, {p}, b, {}], {} train / {} test of {} pairs, seed {seed}",
        op.symbol(),
        p + 1,
        tr.len(),
        te.len(),
        all.len()
    );
    let mut ds = Dataset::from_arrays("modular", description, 4, p + 2, x_train, Targets::Labels(y_train), x_test, Targets::Labels(y_test))?;
    ds.vocab = Some(p + 2);
    ds.validate()?;
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example is `[a, p, b, p + 1]` with its label, each pair appears exactly once over the
    /// two splits (unordered for `+` and `*`, ordered for `-`), the split sizes follow
    /// `train_frac`, and the seed changes the split.
    #[test]
    fn examples_are_explainds_layout_and_cover_every_pair_once() {
        for (op, n) in [(ModOp::Add, 28), (ModOp::Mul, 28), (ModOp::Sub, 49)] {
            let ds = modular(7, op, 0.5, 3).unwrap();
            assert_eq!((ds.dim, ds.vocab, ds.num_outputs), (4, Some(9), 9));
            assert_eq!(ds.n_train() + ds.n_test(), n);
            assert_eq!(ds.n_train(), (0.5 * n as f64).round() as usize);
            let mut seen = std::collections::BTreeSet::new();
            for (x, y) in [(&ds.x_train, ds.train_labels().unwrap()), (&ds.x_test, ds.test_labels().unwrap())] {
                for (r, &label) in x.chunks_exact(4).zip(y) {
                    let (a, b) = (r[0] as usize, r[2] as usize);
                    assert_eq!((r[1], r[3]), (7.0, 8.0));
                    let want = match op {
                        ModOp::Add => (a + b) % 7,
                        ModOp::Sub => (7 + a - b) % 7,
                        ModOp::Mul => (a * b) % 7,
                    };
                    assert_eq!(label, want, "{op:?} {a} {b}");
                    if op.commutative() {
                        assert!(a >= b, "the larger residue first: {a} {b}");
                    }
                    assert!(seen.insert((a, b)), "{op:?}: ({a}, {b}) twice");
                }
            }
            assert_eq!(seen.len(), n);
        }
        let (a, b) = (modular(7, ModOp::Add, 0.5, 3).unwrap(), modular(7, ModOp::Add, 0.5, 4).unwrap());
        assert_ne!(a.x_train, b.x_train);
        assert_eq!(a, modular(7, ModOp::Add, 0.5, 3).unwrap());
    }

    #[test]
    fn bad_settings_are_one_line_config_errors() {
        for (p, frac, needle) in [(1, 0.5, "data.p"), (7, 0.0, "train_frac"), (7, 1.0, "train_frac"), (2, 0.1, "both splits"), (7, f64::NAN, "train_frac")] {
            let e = modular(p, ModOp::Add, frac, 0).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            let msg = e.to_string();
            assert!(msg.contains(needle) && !msg.contains('\n'), "{msg}");
        }
    }
}
