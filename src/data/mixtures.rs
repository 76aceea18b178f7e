//! The synthetic toys: the EPK paper's Gaussian mixture, the Domingos notebook's 2-D linear toy
//! and the NTK notebook's 1-D regression.
//!
//! Training data use stream 0 of the seeded generator and test data stream 1
//! ([`ChaCha8Rng::set_stream`]), so the test set does not depend on the size of the training set.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::{Dataset, Targets};

/// The class means of the EPK paper's §4.1 mixture in their first two coordinates (the remaining
/// coordinates are 0).
pub(crate) const MIXTURE_MEANS: [[f64; 2]; 3] = [[1.0, 4.0], [4.0, 1.0], [5.0, 5.0]];

/// The two training inputs of the 1-D regression toy.
pub(crate) const REGRESSION1D_X: [f64; 2] = [-3.0, 0.5];
/// The two training targets of the 1-D regression toy.
pub(crate) const REGRESSION1D_Y: [f64; 2] = [2.0, -1.0];

/// Mixture rows: row `i` of `labels` gets mean `MIXTURE_MEANS[label]` plus `std * N(0, I)` noise.
fn mixture_rows(rng: &mut ChaCha8Rng, labels: &[usize], dim: usize, std: f64) -> Vec<f64> {
    let mut x = Vec::with_capacity(labels.len() * dim);
    for &c in labels {
        let mean = MIXTURE_MEANS[c]
            .iter()
            .copied()
            .chain(std::iter::repeat(0.0));
        for m in mean.take(dim) {
            let z: f64 = rng.sample(StandardNormal);
            x.push(m + std * z);
        }
    }
    x
}

pub(super) fn gaussian_mixture(dim: usize, per_class: usize, n_test: usize, std: f64, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let train_labels: Vec<usize> = (0..3)
        .flat_map(|c| std::iter::repeat_n(c, per_class))
        .collect();
    let x_train = mixture_rows(&mut rng, &train_labels, dim, std);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    let test_labels: Vec<usize> = (0..n_test).map(|i| i % 3).collect();
    let x_test = mixture_rows(&mut rng, &test_labels, dim, std);
    Dataset {
        name: "gaussian-mixture".into(),
        description: format!(
            "gaussian mixture d={dim}, {per_class}/class train, {n_test} test, std {std}, seed {seed}"
        ),
        dim,
        image_shape: None,
        vocab: None,
        num_outputs: 3,
        x_train,
        y_train: Targets::Labels(train_labels),
        x_test,
        y_test: Targets::Labels(test_labels),
        validation: None,
    }
}

fn linear_rows(rng: &mut ChaCha8Rng, n: usize) -> (Vec<f64>, Vec<usize>) {
    let mut x = Vec::with_capacity(2 * n);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let a: f64 = rng.sample(StandardNormal);
        let b: f64 = rng.sample(StandardNormal);
        x.push(a);
        x.push(b);
        y.push(usize::from(a + b > 0.0));
    }
    (x, y)
}

pub(super) fn linear_2d(n_train: usize, n_test: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (x_train, y_train) = linear_rows(&mut rng, n_train);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    let (x_test, y_test) = linear_rows(&mut rng, n_test);
    Dataset {
        name: "linear2d".into(),
        description: format!(
            "linear 2-d toy x ~ N(0, I2), label = [x0 + x1 > 0], {n_train} train, {n_test} test, seed {seed}"
        ),
        dim: 2,
        image_shape: None,
        vocab: None,
        num_outputs: 2,
        x_train,
        y_train: Targets::Labels(y_train),
        x_test,
        y_test: Targets::Labels(y_test),
        validation: None,
    }
}

pub(super) fn regression_1d(n_test: usize) -> Dataset {
    let denom = (n_test - 1) as f64;
    let x_test: Vec<f64> = (0..n_test)
        .map(|i| -4.0 + 8.0 * (i as f64) / denom)
        .collect();
    Dataset {
        name: "regression1d".into(),
        description: format!(
            "1-d regression: train x = [-3, 0.5], y = [2, -1]; {n_test} test points evenly spaced on [-4, 4] (targets unknown, stored as 0)"
        ),
        dim: 1,
        image_shape: None,
        vocab: None,
        num_outputs: 1,
        x_train: REGRESSION1D_X.to_vec(),
        y_train: Targets::Values(REGRESSION1D_Y.to_vec()),
        x_test,
        y_test: Targets::Values(vec![0.0; n_test]),
        validation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataConfig;
    use std::path::Path;

    fn mixture(dim: usize, per_class: usize, n_test: usize, std: f64, seed: u64) -> Dataset {
        DataConfig::GaussianMixture {
            dim,
            per_class,
            n_test,
            std,
            seed,
        }
        .load(Path::new("."))
        .unwrap()
    }

    #[test]
    fn gaussian_mixture_statistics() {
        let (dim, per) = (5, 2000);
        let ds = mixture(dim, per, 30, 1.0, 3);
        assert_eq!(
            (ds.n_train(), ds.n_test(), ds.num_outputs),
            (3 * per, 30, 3)
        );
        let Targets::Labels(y) = &ds.y_train else {
            panic!()
        };
        for c in 0..3 {
            assert!(
                y[c * per..(c + 1) * per].iter().all(|&l| l == c),
                "train rows blocked by class"
            );
            let rows = &ds.x_train[c * per * dim..(c + 1) * per * dim];
            let mut want = [0.0; 5];
            want[..2].copy_from_slice(&MIXTURE_MEANS[c]);
            for (j, &w) in want.iter().enumerate() {
                let col: Vec<f64> = rows.iter().skip(j).step_by(dim).copied().collect();
                let m = col.iter().sum::<f64>() / per as f64;
                let s =
                    (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (per - 1) as f64).sqrt();
                assert!((m - w).abs() < 0.1, "class {c} coord {j}: mean {m} vs {w}");
                assert!((s - 1.0).abs() < 0.05, "class {c} coord {j}: std {s}");
            }
        }
        assert_eq!(ds.y_test, Targets::Labels((0..30).map(|i| i % 3).collect()));
        // Noise scales with std.
        let ds2 = mixture(2, 2000, 3, 0.5, 3);
        let col: Vec<f64> = ds2.x_train[..4000].iter().step_by(2).copied().collect();
        let m = col.iter().sum::<f64>() / 2000.0;
        let s = (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 1999.0).sqrt();
        assert!((s - 0.5).abs() < 0.03, "std {s}");
        assert!(ds.description.contains("d=5") && ds.description.contains("seed 3"));
    }

    #[test]
    fn gaussian_mixture_determinism() {
        let a = mixture(4, 10, 9, 1.0, 42);
        let b = mixture(4, 10, 9, 1.0, 42);
        assert_eq!(a, b);
        let c = mixture(4, 10, 9, 1.0, 43);
        assert_ne!(a.x_train, c.x_train);
        assert_ne!(a.x_test, c.x_test);
        // Test set is a separate stream: unaffected by the training-set size, and not a copy of it.
        let d = mixture(4, 20, 9, 1.0, 42);
        assert_eq!(a.x_test, d.x_test);
        assert_ne!(a.x_test[..], a.x_train[..a.x_test.len()]);
        let def = DataConfig::default().load(Path::new(".")).unwrap();
        assert_eq!((def.dim, def.n_train(), def.n_test()), (100, 3000, 200));
        assert_eq!(
            def.description,
            "gaussian mixture d=100, 1000/class train, 200 test, std 1, seed 0"
        );
    }

    #[test]
    fn linear2d_rule() {
        let ds = DataConfig::Linear2d {
            n_train: 500,
            n_test: 300,
            seed: 5,
        }
        .load(Path::new("."))
        .unwrap();
        assert_eq!(
            (ds.dim, ds.num_outputs, ds.n_train(), ds.n_test()),
            (2, 2, 500, 300)
        );
        for (x, y) in [(&ds.x_train, &ds.y_train), (&ds.x_test, &ds.y_test)] {
            let Targets::Labels(y) = y else { panic!() };
            for (p, &l) in x.chunks_exact(2).zip(y) {
                assert_eq!(l, usize::from(p[0] + p[1] > 0.0));
            }
            let ones = y.iter().filter(|&&l| l == 1).count() as f64 / y.len() as f64;
            assert!((ones - 0.5).abs() < 0.1, "fraction of 1s {ones}");
        }
        let def: DataConfig = toml::from_str("kind = \"linear2d\"").unwrap();
        let d = def.load(Path::new(".")).unwrap();
        assert_eq!((d.n_train(), d.n_test()), (20, 100));
        assert_eq!(d, def.load(Path::new(".")).unwrap());
    }

    #[test]
    fn regression1d_values() {
        let ds = DataConfig::Regression1d { n_test: 101 }
            .load(Path::new("."))
            .unwrap();
        assert!(!ds.is_classification());
        assert_eq!((ds.dim, ds.num_outputs), (1, 1));
        assert_eq!(ds.x_train, vec![-3.0, 0.5]);
        assert_eq!(ds.y_train, Targets::Values(vec![2.0, -1.0]));
        assert_eq!(ds.n_test(), 101);
        assert_eq!(ds.x_test[0], -4.0);
        assert_eq!(ds.x_test[50], 0.0);
        assert_eq!(ds.x_test[100], 4.0);
        assert!((ds.x_test[1] - -3.92).abs() < 1e-12);
        assert_eq!(ds.y_test, Targets::Values(vec![0.0; 101]));
        let ds = DataConfig::Regression1d { n_test: 2 }
            .load(Path::new("."))
            .unwrap();
        assert_eq!(ds.x_test, vec![-4.0, 4.0]);
    }


}
