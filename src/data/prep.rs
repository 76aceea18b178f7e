//! Preprocessing the file-backed kinds share (`table`, `arrays`, `idx`): checks that name the file,
//! class labels from numbers, a stratified split, training-set subsetting, scaling and
//! standardisation.
//!
//! Order, for every kind: split → subset the training split (`per_class` or `n_train`) → `scale`
//! → `standardize` (statistics of the training split after subsetting, applied to every split).

use std::collections::BTreeSet;
use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{Dataset, Split, Targets};
use crate::error::{Error, Result};

/// What the target column or array holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Class labels: non-negative integers `0..K` (or strings, for tables), `K` = number of classes.
    #[default]
    Classification,
    /// Real-valued targets (`K` = number of target columns).
    Regression,
}

/// The preprocessing keys every file-backed kind takes (each kind spells them out in its own
/// config, so that unknown keys stay errors).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Prep {
    /// Multiply every feature by this (e.g. `1/255`) before standardising.
    pub scale: Option<f64>,
    /// Z-score every feature with the training split's mean and standard deviation (population,
    /// `ddof = 0`; a constant feature is only centred), applied to every split.
    pub standardize: bool,
    /// Keep `per_class` training rows of each class (classification only).
    pub per_class: Option<usize>,
    /// Keep `n_train` training rows.
    pub n_train: Option<usize>,
    /// Choose the kept rows by a seeded shuffle (kept rows stay in file order); `None`: the first
    /// rows in file order.
    pub subset_seed: Option<u64>,
}

impl Prep {
    /// Checks the values, naming the key (`data.scale`, ...).
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(s) = self.scale {
            if !(s.is_finite() && s != 0.0) {
                return Err(Error::Config(format!("data.scale = {s}; it must be a finite, non-zero number")));
            }
        }
        match (self.per_class, self.n_train) {
            (Some(_), Some(_)) => {
                return Err(Error::Config("data.per_class and data.n_train both select the training set; give one of them".into()))
            }
            (Some(0), _) => return Err(Error::Config("data.per_class must be >= 1, got 0".into())),
            (_, Some(0)) => return Err(Error::Config("data.n_train must be >= 1, got 0".into())),
            _ => {}
        }
        if self.subset_seed.is_some() && self.per_class.is_none() && self.n_train.is_none() {
            return Err(Error::Config("data.subset_seed needs data.per_class or data.n_train".into()));
        }
        Ok(())
    }

    /// Applies subsetting, scaling and standardisation to `ds` (rows of `ds` came from `file`,
    /// named in errors) and appends what was done to its description.
    ///
    /// # Shapes
    /// `ds.x_train: [M, dim]` becomes `[M', dim]` with `M' <= M`; other splits keep their rows.
    pub(crate) fn apply(&self, ds: &mut Dataset, file: &Path) -> Result<()> {
        self.validate()?;
        if self.per_class.is_some() || self.n_train.is_some() {
            let keep = subset(&ds.y_train, ds.n_train(), ds.num_outputs, self.per_class, self.n_train, self.subset_seed, file)?;
            ds.x_train = take_rows(&ds.x_train, ds.dim, &keep);
            ds.y_train = take_targets(&ds.y_train, ds.num_outputs, &keep);
            let how = match self.subset_seed {
                Some(s) => format!("chosen by a shuffle with seed {s}"),
                None => "the first in file order".into(),
            };
            ds.description += &match (self.per_class, self.n_train) {
                (Some(pc), _) => format!(", {pc} training rows per class ({how})"),
                (_, Some(n)) => format!(", {n} training rows ({how})"),
                _ => unreachable!(),
            };
        }
        if let Some(s) = self.scale {
            for_each_x(ds, |v| *v *= s);
            ds.description += &format!(", features x*{s}");
        }
        if self.standardize {
            let st = Standardization::fit(&ds.x_train, ds.dim);
            st.apply(&mut ds.x_train);
            st.apply(&mut ds.x_test);
            if let Some(v) = ds.validation.as_mut() {
                st.apply(&mut v.x);
            }
            ds.description += &format!(", standardized with the training split's mean {} and std {}", fmt_list(&st.mean), fmt_list(&st.std));
        }
        Ok(())
    }
}

fn for_each_x(ds: &mut Dataset, f: impl Fn(&mut f64)) {
    ds.x_train.iter_mut().for_each(&f);
    ds.x_test.iter_mut().for_each(&f);
    if let Some(v) = ds.validation.as_mut() {
        v.x.iter_mut().for_each(&f);
    }
}

/// `[a, b, c]` with 6 significant digits (for descriptions).
pub(super) fn fmt_list(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{}", (x * 1e6).round() / 1e6)).collect();
    format!("[{}]", items.join(", "))
}

/// Per-feature z-scoring statistics of a training split.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Standardization {
    /// Per-feature means. # Shapes `[dim]`.
    pub mean: Vec<f64>,
    /// Per-feature population standard deviations (`ddof = 0`); a constant feature gets 1, so it is
    /// only centred (scikit-learn's `StandardScaler` does the same). # Shapes `[dim]`.
    pub std: Vec<f64>,
}

impl Standardization {
    /// Mean and standard deviation of every column of `x`.
    ///
    /// # Shapes
    /// `x: [n, dim]` with `n >= 1`.
    pub(crate) fn fit(x: &[f64], dim: usize) -> Self {
        let n = (x.len() / dim.max(1)).max(1) as f64;
        let mut mean = vec![0.0; dim];
        for row in x.chunks_exact(dim) {
            mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
        }
        mean.iter_mut().for_each(|m| *m /= n);
        let mut var = vec![0.0; dim];
        for row in x.chunks_exact(dim) {
            var.iter_mut().zip(row.iter().zip(&mean)).for_each(|(s, (v, m))| *s += (v - m) * (v - m));
        }
        let std = var.iter().map(|s| (s / n).sqrt()).map(|s| if s > 0.0 { s } else { 1.0 }).collect();
        Standardization { mean, std }
    }

    /// `x ← (x − mean) / std`, column by column. # Shapes `x: [n, dim]`.
    pub(crate) fn apply(&self, x: &mut [f64]) {
        let dim = self.mean.len();
        for row in x.chunks_exact_mut(dim) {
            for ((v, m), s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
                *v = (*v - m) / s;
            }
        }
    }
}

/// Rows `idx` of `x`. # Shapes `x: [n, dim]` → `[idx.len(), dim]`.
pub(super) fn take_rows(x: &[f64], dim: usize, idx: &[usize]) -> Vec<f64> {
    idx.iter().flat_map(|&i| x[i * dim..(i + 1) * dim].iter().copied()).collect()
}

/// Targets of rows `idx` (`k` outputs per row for values).
pub(super) fn take_targets(y: &Targets, k: usize, idx: &[usize]) -> Targets {
    match y {
        Targets::Labels(l) => Targets::Labels(idx.iter().map(|&i| l[i]).collect()),
        Targets::Values(v) => Targets::Values(take_rows(v, k, idx)),
    }
}

/// Indices (sorted, file order) of the training rows kept by `per_class` or `n_train`.
fn subset(
    y: &Targets,
    n: usize,
    k: usize,
    per_class: Option<usize>,
    n_train: Option<usize>,
    seed: Option<u64>,
    file: &Path,
) -> Result<Vec<usize>> {
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(s) = seed {
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(s));
    }
    let mut keep = match (per_class, y) {
        (Some(_), Targets::Values(_)) => {
            return Err(Error::Config("data.per_class needs class labels (task = \"classification\")".into()))
        }
        (Some(pc), Targets::Labels(l)) => {
            let mut seen = vec![0usize; k];
            let keep: Vec<usize> = order
                .into_iter()
                .filter(|&i| {
                    let ok = seen[l[i]] < pc;
                    seen[l[i]] += usize::from(ok);
                    ok
                })
                .collect();
            if let Some(c) = seen.iter().position(|&s| s < pc) {
                return Err(Error::format(file, format!("the training split holds only {} rows of class {c}; data.per_class = {pc} needs {pc}", seen[c])));
            }
            keep
        }
        (None, _) => {
            let m = n_train.expect("per_class or n_train");
            if m > n {
                return Err(Error::format(file, format!("the training split holds {n} rows; data.n_train = {m} asks for more")));
            }
            order.truncate(m);
            order
        }
    };
    keep.sort_unstable();
    Ok(keep)
}

/// Class labels from numbers: every value must be a non-negative integer. `what` names the
/// column or array in errors (`"column 'y'"`, `"y_train"`).
///
/// # Shapes
/// `v: [n]` → `[n]`.
pub(crate) fn labels_from_f64(v: &[f64], file: &Path, what: &str) -> Result<Vec<usize>> {
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            if x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) {
                Ok(x as usize)
            } else {
                Err(Error::format(
                    file,
                    format!("{what} row {i} is {x}, not a class label (a non-negative integer); for real-valued targets set task = \"regression\""),
                ))
            }
        })
        .collect()
}

/// `K` for labels spread over the splits: one more than the largest label; every class
/// `0..K` must occur in the training split.
pub fn num_classes(train: &[usize], others: &[&[usize]], file: &Path) -> Result<usize> {
    let k = train.iter().chain(others.iter().flat_map(|o| o.iter())).max().map_or(0, |m| m + 1);
    let present: BTreeSet<usize> = train.iter().copied().collect();
    if let Some(c) = (0..k).find(|c| !present.contains(c)) {
        return Err(Error::format(file, format!("class {c} has no rows in the training split (classes are 0..{k})")));
    }
    Ok(k)
}

/// Checks that every value of `x` is finite, naming the file, the split, the row and the feature
/// (`feature(j)` names column `j`).
///
/// # Shapes
/// `x: [n, dim]`.
pub(crate) fn check_finite(x: &[f64], dim: usize, feature: impl Fn(usize) -> String, file: &Path, split: &str) -> Result<()> {
    let dim = dim.max(1);
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::format(
            file,
            format!("{} in feature {} of {split} row {} (features must be finite numbers)", x[i], feature(i % dim), i / dim),
        )),
    }
}

/// Errors naming the file when a split is empty.
pub(crate) fn check_not_empty(n: usize, file: &Path, split: &str) -> Result<()> {
    if n == 0 {
        return Err(Error::format(file, format!("the {split} split is empty")));
    }
    Ok(())
}

/// Row indices of a seeded split into `(train, val, test)`, each in file order. With labels the
/// split is stratified: each class contributes `round(fraction · n_c)` rows to test and to val,
/// chosen by a shuffle of that class's rows; regression targets are split as one group.
pub(crate) fn fraction_split(labels: Option<&[usize]>, n: usize, test_fraction: f64, val_fraction: f64, seed: u64) -> [Vec<usize>; 3] {
    let groups: Vec<Vec<usize>> = match labels {
        Some(l) => {
            let k = l.iter().max().map_or(0, |m| m + 1);
            let mut g = vec![Vec::new(); k];
            l.iter().enumerate().for_each(|(i, &c)| g[c].push(i));
            g
        }
        None => vec![(0..n).collect()],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out: [Vec<usize>; 3] = Default::default();
    for mut g in groups {
        g.shuffle(&mut rng);
        let n_test = (test_fraction * g.len() as f64).round() as usize;
        let n_val = ((val_fraction * g.len() as f64).round() as usize).min(g.len() - n_test.min(g.len()));
        let n_test = n_test.min(g.len());
        out[2].extend_from_slice(&g[..n_test]);
        out[1].extend_from_slice(&g[n_test..n_test + n_val]);
        out[0].extend_from_slice(&g[n_test + n_val..]);
    }
    out.iter_mut().for_each(|v| v.sort_unstable());
    out
}

/// Assembles a dataset from train/val/test rows (`val` may be empty: no validation split), with
/// no `image_shape`.
///
/// # Shapes
/// `x_*: [n_*, dim]`, `y_*`: `[n_*]` labels or `[n_*, k]` values.
#[allow(clippy::too_many_arguments)]
pub(super) fn assemble(
    name: String,
    description: String,
    dim: usize,
    k: usize,
    train: (Vec<f64>, Targets),
    val: Option<(Vec<f64>, Targets)>,
    test: (Vec<f64>, Targets),
) -> Dataset {
    Dataset {
        name,
        description,
        dim,
        image_shape: None,
        vocab: None,
        num_outputs: k,
        x_train: train.0,
        y_train: train.1,
        x_test: test.0,
        y_test: test.1,
        validation: val.map(|(x, y)| Split { x, y }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("f.csv")
    }

    #[test]
    fn standardization_matches_the_obvious_formula() {
        let x = [1.0, 10.0, 3.0, 10.0, 5.0, 10.0];
        let st = Standardization::fit(&x, 2);
        assert_eq!(st.mean, vec![3.0, 10.0]);
        assert!((st.std[0] - (8.0f64 / 3.0).sqrt()).abs() < 1e-15);
        assert_eq!(st.std[1], 1.0, "a constant feature is only centred");
        let mut y = x.to_vec();
        st.apply(&mut y);
        let col0: Vec<f64> = y.iter().step_by(2).copied().collect();
        assert!(col0.iter().sum::<f64>().abs() < 1e-12);
        assert!((col0.iter().map(|v| v * v).sum::<f64>() / 3.0 - 1.0).abs() < 1e-12);
        assert!(y.iter().skip(1).step_by(2).all(|&v| v == 0.0));
    }

    #[test]
    fn labels_must_be_non_negative_integers() {
        assert_eq!(labels_from_f64(&[0.0, 2.0, 1.0], p(), "column 'y'").unwrap(), vec![0, 2, 1]);
        for bad in [-1.0, 0.5, f64::NAN, f64::INFINITY] {
            let e = labels_from_f64(&[0.0, bad], p(), "column 'y'").unwrap_err().to_string();
            assert!(e.starts_with("f.csv: column 'y' row 1 is") && e.contains("not a class label"), "{e}");
        }
    }

    #[test]
    fn a_class_missing_from_training_is_an_error() {
        assert_eq!(num_classes(&[0, 1, 1], &[&[0]], p()).unwrap(), 2);
        let e = num_classes(&[0, 2], &[&[1]], p()).unwrap_err().to_string();
        assert!(e.contains("class 1 has no rows in the training split"), "{e}");
        let e = num_classes(&[0, 1], &[&[2]], p()).unwrap_err().to_string();
        assert!(e.contains("class 2 has no rows"), "{e}");
    }

    #[test]
    fn stratified_split_against_counting() {
        let labels: Vec<usize> = (0..100).map(|i| usize::from(i % 4 == 0) + usize::from(i % 10 == 0)).collect();
        let [tr, va, te] = fraction_split(Some(&labels), 100, 0.2, 0.1, 3);
        let mut all: Vec<usize> = tr.iter().chain(&va).chain(&te).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>(), "a partition");
        for c in 0..3 {
            let n_c = labels.iter().filter(|&&l| l == c).count() as f64;
            let count = |s: &[usize]| s.iter().filter(|&&i| labels[i] == c).count();
            assert_eq!(count(&te), (0.2 * n_c).round() as usize, "class {c}");
            assert_eq!(count(&va), (0.1 * n_c).round() as usize, "class {c}");
        }
        assert!(tr.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(fraction_split(Some(&labels), 100, 0.2, 0.1, 3), [tr.clone(), va, te]);
        assert_ne!(fraction_split(Some(&labels), 100, 0.2, 0.1, 4)[0], tr);
        let [tr, va, te] = fraction_split(None, 10, 0.3, 0.0, 0);
        assert_eq!((tr.len(), va.len(), te.len()), (7, 0, 3));
    }

    #[test]
    fn subsetting_per_class_and_n_train() {
        let y = Targets::Labels(vec![0, 1, 0, 1, 0, 1, 2, 2]);
        let keep = subset(&y, 8, 3, Some(2), None, None, p()).unwrap();
        assert_eq!(keep, vec![0, 1, 2, 3, 6, 7]);
        let keep = subset(&y, 8, 3, Some(1), None, Some(5), p()).unwrap();
        let Targets::Labels(l) = &y else { unreachable!() };
        let mut classes: Vec<usize> = keep.iter().map(|&i| l[i]).collect();
        classes.sort_unstable();
        assert_eq!(classes, vec![0, 1, 2]);
        assert!(keep.windows(2).all(|w| w[0] < w[1]));
        let e = subset(&y, 8, 3, Some(3), None, None, p()).unwrap_err().to_string();
        assert!(e.contains("only 2 rows of class 2"), "{e}");
        assert_eq!(subset(&y, 8, 3, None, Some(3), None, p()).unwrap(), vec![0, 1, 2]);
        assert!(subset(&y, 8, 3, None, Some(9), None, p()).unwrap_err().to_string().contains("asks for more"));
        let v = Targets::Values(vec![0.0; 8]);
        assert!(subset(&v, 8, 1, Some(1), None, None, p()).is_err());
    }

    #[test]
    fn apply_standardizes_with_training_statistics_only() {
        let mut ds = assemble(
            "t".into(),
            "t".into(),
            1,
            2,
            (vec![2.0, 4.0, 6.0, 8.0], Targets::Labels(vec![0, 1, 0, 1])),
            Some((vec![4.0], Targets::Labels(vec![0]))),
            (vec![100.0], Targets::Labels(vec![1])),
        );
        let prep = Prep { scale: Some(0.5), standardize: true, n_train: Some(2), ..Prep::default() };
        prep.apply(&mut ds, p()).unwrap();
        // Kept rows 2, 4 → scaled 1, 2 → mean 1.5, std 0.5.
        assert_eq!(ds.x_train, vec![-1.0, 1.0]);
        assert_eq!(ds.x_test, vec![(50.0 - 1.5) / 0.5]);
        assert_eq!(ds.validation.as_ref().unwrap().x, vec![(2.0 - 1.5) / 0.5]);
        assert!(ds.description.contains("mean [1.5] and std [0.5]"), "{}", ds.description);
        for (p, needle) in [
            (Prep { scale: Some(0.0), ..Prep::default() }, "data.scale"),
            (Prep { per_class: Some(1), n_train: Some(1), ..Prep::default() }, "give one of them"),
            (Prep { subset_seed: Some(1), ..Prep::default() }, "subset_seed"),
        ] {
            assert!(p.validate().unwrap_err().to_string().contains(needle));
        }
    }

    #[test]
    fn non_finite_features_name_the_feature_and_row() {
        let names = ["a", "b"];
        let name = |j: usize| format!("'{}'", names[j]);
        check_finite(&[1.0, 2.0], 2, name, p(), "train").unwrap();
        let e = check_finite(&[1.0, 2.0, 3.0, f64::NAN], 2, name, p(), "test").unwrap_err().to_string();
        assert_eq!(e, "f.csv: NaN in feature 'b' of test row 1 (features must be finite numbers)");
        let e = check_not_empty(0, p(), "val").unwrap_err().to_string();
        assert_eq!(e, "f.csv: the val split is empty");
    }
}
