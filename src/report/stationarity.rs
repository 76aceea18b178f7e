//! How far a train Gram is from stationary, against an RBF reference on the same points, and
//! its far field along rays leaving the data: `stationarity.json`, `far_field.parquet` and
//! `far_profile.parquet`.

use std::path::Path;

use serde::Serialize;

use super::{block, outputs_minus_bias};
use crate::kernel::Outputs;
use crate::analysis::{self, Profile, StationarityOptions};
use crate::api::{Gram, GpModel, Trained};
use crate::error::Result;
use crate::gp::{self, GpParams};
use crate::io::{self, Column, Table};
use crate::kernel::{Layout, Rule};

/// Summary of `pathkernel stationarity` (`stationarity.json`).
#[derive(Clone, Debug, Serialize)]
pub struct StationaritySummary {
    /// Headline score of the kernel (trace over classes), 1 = stationary.
    pub score: f64,
    /// Per class block.
    pub class_scores: Vec<f64>,
    /// The RBF reference on the same points (length scale = median pairwise distance).
    pub rbf_score: f64,
    /// RBF length scale used.
    pub rbf_length: f64,
    /// Spearman correlation of the kernel's self-value along rays with the distance from the
    /// training data (> 0: grows far away).
    pub far_kernel_spearman: f64,
    /// Spearman correlation of the GP posterior standard deviation along rays with the distance
    /// (< 0: more confident far from the data).
    pub far_std_spearman: f64,
    /// Spearman correlation of the Monte-Carlo standard deviation of the softmax probabilities
    /// along rays with the distance (< 0: probabilities more certain far from the data).
    pub far_prob_std_spearman: f64,
    /// Points along rays.
    pub ray_points: usize,
    /// Quadrature of the far-field kernel.
    pub far_quadrature: String,
}

/// What [`stationarity_report`] computed: the summary and the far-field profiles (binned by the
/// distance to the nearest training point, the same bins for all three).
#[derive(Clone, Debug)]
pub struct StationarityReport {
    /// `stationarity.json`.
    pub summary: StationaritySummary,
    /// The kernel's self-value (mean over classes) along the rays.
    pub kernel: Profile,
    /// The GP's posterior logit standard deviation (mean over classes).
    pub gp_std: Profile,
    /// The Monte-Carlo standard deviation of the softmax probabilities (mean over classes).
    pub prob_std: Profile,
}

/// The stationarity score ([`analysis::stationarity`], 1 = stationary) of the trace over
/// classes of a train × train Gram (`Diag` or `Full` layout) on the run's training points,
/// and of each class block.
///
/// Errors: a Gram whose rows are not the training set, a `Trace` layout, and those of
/// [`analysis::stationarity`].
pub fn kernel_stationarity(net: &Trained, train: &Gram, seed: u64) -> Result<(f64, Vec<f64>)> {
    train.require_train_rows("stationarity")?;
    train.require_layout(Layout::Diag, "per-class stationarity scores")?;
    let (m, _, k) = train.shape();
    let d = train.points().dim;
    let x = &net.run().dataset.x_train;
    let opts = StationarityOptions { seed, ..StationarityOptions::default() };
    let mut trace = vec![0.0; m * m];
    let mut class_scores = Vec::with_capacity(k);
    for c in 0..k {
        let b = block(train, c)?;
        for (t, v) in trace.iter_mut().zip(&b) {
            *t += v;
        }
        class_scores.push(analysis::stationarity(x, &b, m, d, &opts)?.score);
    }
    Ok((analysis::stationarity(x, &trace, m, d, &opts)?.score, class_scores))
}

/// Stationarity of `train`'s class blocks and of their trace ([`analysis::stationarity`]) with an
/// RBF kernel on the same points as the stationary reference, and the far field: the kernel of
/// the same kind at `n_dirs × n_steps` ray points leaving the data (`rule`, test side), its
/// self-value, and the standard deviations of a GP fitted on `train` ([`GpModel`]) there.
/// Writes `stationarity.json`, `far_field.parquet` and `far_profile.parquet` into `out_dir`.
///
/// Errors: those of [`GpModel::fit_targets`], kinds without a self-kernel, and those of the
/// kernel engine and of the ray construction.
pub fn stationarity_report(net: &Trained, train: &Gram, gp_params: &GpParams, rule: Rule, n_dirs: usize, n_steps: usize, growth: f64, seed: u64, out_dir: &Path) -> Result<StationarityReport> {
    train.require_train_rows("stationarity")?;
    train.require_layout(Layout::Diag, "stationarity (per-class scores and the far-field GP)")?;
    let (m, _, k) = train.shape();
    let d = train.points().dim;
    let x = &net.run().dataset.x_train;
    let (score, class_scores) = kernel_stationarity(net, train, seed)?;
    let opts = StationarityOptions { seed, ..StationarityOptions::default() };
    // RBF reference with the median pairwise distance as length scale.
    let mut dists = Vec::new();
    for i in 0..m.min(400) {
        for j in i + 1..m.min(400) {
            dists.push((0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum::<f64>().sqrt());
        }
    }
    // statrs's median: the mean of the two middle distances for an even count, NaN for none.
    let median = statrs::statistics::Median::median(&statrs::statistics::Data::new(dists));
    let rbf_length = if median.is_nan() { 1.0 } else { median.max(1e-12) };
    let rbf: Vec<f64> = (0..m * m)
        .map(|idx| {
            let (i, j) = (idx / m, idx % m);
            let r2: f64 = (0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum();
            (-0.5 * r2 / (rbf_length * rbf_length)).exp()
        })
        .collect();
    let rbf_score = analysis::stationarity(x, &rbf, m, d, &opts)?.score;
    // Far field along rays: the kernel of the same kind at the ray points (test side).
    let (rx, ray, radius) = analysis::ray_points(x, m, d, n_dirs, n_steps, growth, seed)?;
    let r = ray.len();
    let far = net.kernel(train.kind()).inputs(&rx).rule(rule).compute()?;
    let mut self_values = Vec::with_capacity(k);
    let mut k_cross = Vec::with_capacity(k * r * m);
    for c in 0..k {
        self_values.push(far.self_kernel(c)?);
        k_cross.extend(block(&far, c)?);
    }
    let kval: Vec<f64> = (0..r).map(|q| (0..k).map(|c| self_values[c][q]).sum::<f64>() / k as f64).collect();
    let nearest = analysis::nearest_distance(&rx, x, d)?;
    // GP posterior std along the rays (targets: the network's outputs minus the bias). The
    // Monte-Carlo softmax below samples around the GP mean without the bias f_{w_0}(x), as the
    // committed reports do; its spread, not its centre, is what is reported.
    let model = GpModel::fit_targets(train, gp_params, &outputs_minus_bias(net, Outputs::Network)?, true)?;
    let k_diag: Vec<f64> = self_values.concat();
    let post = model.fitted().predict(&k_cross, &k_diag, r)?;
    let std: Vec<f64> = (0..r).map(|q| (0..k).map(|c| post.var[q * k + c].sqrt()).sum::<f64>() / k as f64).collect();
    // Standard deviation of the softmax probabilities (Monte Carlo), the paper's Fig. 5 quantity.
    let mc = gp::mc_softmax(&post, 1000, seed)?;
    let pstd: Vec<f64> = (0..r).map(|q| (0..k).map(|c| mc.std_prob[q * k + c]).sum::<f64>() / k as f64).collect();
    let kp = analysis::profile(&nearest, &kval, 8)?;
    let sp = analysis::profile(&nearest, &std, 8)?;
    let pp = analysis::profile(&nearest, &pstd, 8)?;
    Table::new()
        .with("ray", Column::I64(ray.iter().map(|&v| v as i64).collect()))
        .with("radius", Column::F64(radius))
        .with("nearest_train_distance", Column::F64(nearest))
        .with("kernel_self_value", Column::F64(kval))
        .with("gp_std", Column::F64(std))
        .with("mc_prob_std", Column::F64(pstd))
        .write_parquet(&out_dir.join("far_field.parquet"))?;
    let means = |pr: &Profile| Column::F64(pr.rows.iter().map(|r| r.mean).collect());
    Table::new()
        .with("distance_lo", Column::F64(kp.rows.iter().map(|r| r.lo).collect()))
        .with("distance_hi", Column::F64(kp.rows.iter().map(|r| r.hi).collect()))
        .with("count", Column::I64(kp.rows.iter().map(|r| r.count as i64).collect()))
        .with("kernel_self_value_mean", means(&kp))
        .with("gp_std_mean", means(&sp))
        .with("mc_prob_std_mean", means(&pp))
        .write_parquet(&out_dir.join("far_profile.parquet"))?;
    let summary = StationaritySummary {
        score,
        class_scores,
        rbf_score,
        rbf_length,
        far_kernel_spearman: kp.spearman,
        far_std_spearman: sp.spearman,
        far_prob_std_spearman: pp.spearman,
        ray_points: r,
        far_quadrature: rule.to_string(),
    };
    io::write_json(&out_dir.join("stationarity.json"), &summary)?;
    Ok(StationarityReport { summary, kernel: kp, gp_std: sp, prob_std: pp })
}

/// One setting of [`settings_far_field_report`]: its points' medians and the Spearman
/// correlation of each quantity with the distance to the nearest training image.
#[derive(Clone, Debug, Serialize)]
pub struct SettingFarField {
    /// `clean`, `rot-15` … `rot-180`, `noise`, `inverted`.
    pub setting: String,
    /// Points.
    pub points: usize,
    /// Median distance to the nearest training image.
    pub median_distance: f64,
    /// Median kernel self-value `K(x, x)` (mean over classes).
    pub median_kernel: f64,
    /// Median GP posterior logit standard deviation (mean over classes).
    pub median_gp_std: f64,
    /// Median Monte-Carlo standard deviation of the softmax probabilities (mean over classes).
    pub median_prob_std: f64,
    /// Spearman correlation with the distance, within the setting: kernel self-value.
    pub spearman_kernel: f64,
    /// … GP logit standard deviation.
    pub spearman_gp_std: f64,
    /// … MC probability standard deviation.
    pub spearman_prob_std: f64,
}

/// What [`settings_far_field_report`] computed (`far_settings.json`).
#[derive(Clone, Debug, Serialize)]
pub struct SettingsFarField {
    /// Per setting, in the benchmark's order.
    pub settings: Vec<SettingFarField>,
    /// Spearman correlation with the distance over all points of all settings: kernel
    /// self-value, GP logit std, MC probability std.
    pub pooled_spearman: [f64; 3],
    /// Per setting: the binned profiles (kernel, GP std, MC std) for the charts.
    #[serde(skip)]
    pub profiles: Vec<[Profile; 3]>,
}

fn median(v: &[f64]) -> f64 {
    statrs::statistics::Median::median(&statrs::statistics::Data::new(v.to_vec()))
}

/// The far field on real shifted and out-of-distribution images (the EPK paper's §4.2 claim,
/// "higher kernel values far from the data", tested on data rather than on rays): for each
/// setting of the uncertainty benchmark ([`crate::uncertainty::settings`]: the clean test
/// images, the rotations, uniform noise and inverted images; `points` images each), the
/// kernel rows at the images (`rows_of`), their
/// self-value, the GP fitted on `train` ([`GpModel`], targets: the network's outputs minus the
/// bias) and the Monte-Carlo spread of its softmax probabilities (1 000 samples, `seed`),
/// against the Euclidean distance to the nearest training image. Writes `far_settings.parquet`
/// (one row per point) and `far_settings.json`.
///
/// Errors: a run that is not 28×28 images, and those of the benchmark settings, the kernel
/// engine and [`GpModel::fit_targets`].
///
/// `rows_of(setting, x)` gives the kernel rows of a setting's images: the Gram of `train`'s
/// kind at `x` (test side, class-diagonal blocks), computed or taken from a cache.
pub fn settings_far_field_report(net: &Trained, train: &Gram, gp_params: &GpParams, points: usize, seed: u64, out_dir: &Path, rows_of: &dyn Fn(&str, &[f64]) -> Result<Gram>) -> Result<SettingsFarField> {
    train.require_train_rows("the far field")?;
    train.require_layout(Layout::Diag, "the far-field GP")?;
    let (_, _, k) = train.shape();
    let data = &net.run().dataset;
    let cfg = crate::uncertainty::BenchmarkConfig { shift_points: Some(points), noise_points: Some(points), noise_seed: seed, ..Default::default() };
    let model = GpModel::fit_targets(train, gp_params, &outputs_minus_bias(net, Outputs::Network)?, true)?;
    let mut out = SettingsFarField { settings: Vec::new(), pooled_spearman: [f64::NAN; 3], profiles: Vec::new() };
    let (mut all_d, mut all_k, mut all_s, mut all_p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut table = (Vec::new(), Vec::new());
    for setting in crate::uncertainty::settings(data, &cfg)? {
        let n = setting.info.n.min(points);
        let x = &setting.x[..n * data.dim];
        let rows = rows_of(&setting.info.name, x)?;
        rows.require_layout(Layout::Diag, "the far-field rows")?;
        let self_values = (0..k).map(|c| rows.self_kernel(c)).collect::<Result<Vec<_>>>()?;
        let mut k_cross = Vec::new();
        for c in 0..k {
            k_cross.extend(block(&rows, c)?);
        }
        let post = model.fitted().predict(&k_cross, &self_values.concat(), n)?;
        let mc = gp::mc_softmax(&post, 1000, seed)?;
        let mean_k = |f: &dyn Fn(usize, usize) -> f64| (0..n).map(|q| (0..k).map(|c| f(q, c)).sum::<f64>() / k as f64).collect::<Vec<f64>>();
        let kv = mean_k(&|q, c| self_values[c][q]);
        let sd = mean_k(&|q, c| post.var[q * k + c].sqrt());
        let ps = mean_k(&|q, c| mc.std_prob[q * k + c]);
        let dist = analysis::nearest_distance(x, &data.x_train, data.dim)?;
        let prof = [analysis::profile(&dist, &kv, 6)?, analysis::profile(&dist, &sd, 6)?, analysis::profile(&dist, &ps, 6)?];
        out.settings.push(SettingFarField {
            setting: setting.info.name.clone(),
            points: n,
            median_distance: median(&dist),
            median_kernel: median(&kv),
            median_gp_std: median(&sd),
            median_prob_std: median(&ps),
            spearman_kernel: prof[0].spearman,
            spearman_gp_std: prof[1].spearman,
            spearman_prob_std: prof[2].spearman,
        });
        out.profiles.push(prof);
        table.0.extend(std::iter::repeat(setting.info.name.clone()).take(n));
        table.1.extend(0..n as i64);
        all_d.extend(dist);
        all_k.extend(kv);
        all_s.extend(sd);
        all_p.extend(ps);
    }
    out.pooled_spearman = [analysis::spearman(&all_d, &all_k), analysis::spearman(&all_d, &all_s), analysis::spearman(&all_d, &all_p)];
    Table::new()
        .with("setting", Column::Str(table.0))
        .with("point", Column::I64(table.1))
        .with("nearest_train_distance", Column::F64(all_d))
        .with("kernel_self_value", Column::F64(all_k))
        .with("gp_std", Column::F64(all_s))
        .with("mc_prob_std", Column::F64(all_p))
        .write_parquet(&out_dir.join("far_settings.parquet"))?;
    io::write_json(&out_dir.join("far_settings.json"), &out)?;
    Ok(out)
}
