//! The benchmark's random training subsets (which are held out to tune hyper-parameters, which
//! evaluate) and its seeded label noise.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `count` subsets of `⌊fraction·M⌋` distinct training indices each; the first `tuning` of them
/// choose hyper-parameters, the rest evaluate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subsets {
    /// Training-set size M.
    pub m: usize,
    /// Fraction kept.
    pub fraction: f64,
    /// Seed: subset `s` is a shuffle of `0..M` by stream `s` of `ChaCha8Rng::seed_from_u64(seed)`.
    pub seed: u64,
    /// Sorted members of each subset.
    pub members: Vec<Vec<usize>>,
    /// How many (the first ones) are for tuning.
    pub tuning: usize,
}

impl Subsets {
    /// Draws the subsets.
    ///
    /// Errors: a fraction outside (0, 1], fewer than 3 evaluation subsets.
    pub fn draw(m: usize, count: usize, fraction: f64, tuning: usize, seed: u64) -> Result<Subsets> {
        if !(fraction > 0.0 && fraction <= 1.0) || count < tuning + 3 || m == 0 {
            return Err(Error::Config(format!("subsets: need 0 < fraction <= 1 and at least 3 evaluation subsets (fraction {fraction}, {count} subsets, {tuning} tuning)")));
        }
        let size = ((fraction * m as f64).floor() as usize).max(1);
        let members = (0..count)
            .map(|s| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(s as u64);
                let mut idx: Vec<usize> = (0..m).collect();
                idx.shuffle(&mut rng);
                let mut v = idx[..size].to_vec();
                v.sort_unstable();
                v
            })
            .collect();
        Ok(Subsets { m, fraction, seed, members, tuning })
    }
    /// Indices of the tuning subsets.
    pub fn tuning_ids(&self) -> Vec<usize> {
        (0..self.tuning).collect()
    }
    /// Indices of the evaluation subsets.
    pub fn evaluation_ids(&self) -> Vec<usize> {
        (self.tuning..self.members.len()).collect()
    }
}

/// Flips `round(fraction·M)` labels chosen by `seed`, each to a uniformly drawn other class.
/// Returns the noisy labels and which points were flipped.
///
/// # Shapes
/// `labels [M]` → `([M], [M])`.
pub fn flip_labels(labels: &[usize], k: usize, fraction: f64, seed: u64) -> (Vec<usize>, Vec<bool>) {
    let m = labels.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut idx: Vec<usize> = (0..m).collect();
    idx.shuffle(&mut rng);
    let n = (fraction * m as f64).round() as usize;
    let mut noisy = labels.to_vec();
    let mut flipped = vec![false; m];
    for &i in &idx[..n.min(m)] {
        noisy[i] = (labels[i] + 1 + rng.gen_range(0..k - 1)) % k;
        flipped[i] = true;
    }
    (noisy, flipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_are_seeded_halves_and_labels_flip_to_other_classes() {
        let s = Subsets::draw(101, 12, 0.5, 4, 9).unwrap();
        assert_eq!(s, Subsets::draw(101, 12, 0.5, 4, 9).unwrap());
        assert!(s.members.iter().all(|v| v.len() == 50 && v.windows(2).all(|w| w[0] < w[1]) && v[49] < 101));
        assert_ne!(s.members[0], s.members[1]);
        assert_eq!((s.tuning_ids().len(), s.evaluation_ids()), (4, (4..12).collect::<Vec<_>>()));
        let labels: Vec<usize> = (0..200).map(|i| i % 10).collect();
        let (noisy, flipped) = flip_labels(&labels, 10, 0.1, 0);
        assert_eq!(flipped.iter().filter(|&&b| b).count(), 20);
        for i in 0..200 {
            assert_eq!(noisy[i] != labels[i], flipped[i]);
        }
        assert!(Subsets::draw(10, 5, 0.5, 3, 0).is_err());
    }
}
