//! The analyses of a long run along its path (`[analysis] windows` and `layer_shares`): the
//! whole run's machine from windows, each window's attribution, the per-step layer shares and
//! the training milestones they are read against.

use std::path::Path;
use std::sync::Mutex;

use super::cache::{reusable, stamp, unstamp, Key};
use super::{shares, windows, StudyKernel};
use crate::api::{Gram, Trained};
use crate::error::{Error, Result};
use crate::io::{self, Column, Table};
use crate::plot::{self, Scale, Series};
use crate::train::TrainLog;

/// Absolute tolerance of each step's split on the outputs (the shares' sum against the
/// network's change).
pub(crate) const SHARES_TOL: f64 = 1e-12;

/// The first steps at which training accuracy reached 0.99 (memorisation) and held-out
/// accuracy reached 0.5, 0.9 and 0.99 (generalisation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Milestones {
    pub memorised: Option<usize>,
    pub half: Option<usize>,
    pub most: Option<usize>,
    pub generalised: Option<usize>,
}

impl Milestones {
    pub(crate) fn of(log: &TrainLog) -> Self {
        let first = |v: &[f64], th: f64| v.iter().position(|&a| a >= th);
        Milestones { memorised: first(&log.acc, 0.99), half: first(&log.test_acc, 0.5), most: first(&log.test_acc, 0.9), generalised: first(&log.test_acc, 0.99) }
    }
    /// Each milestone with its name in the summary and the chart.
    fn named(&self) -> [(&'static str, Option<usize>); 4] {
        [("training accuracy ≥ 0.99", self.memorised), ("held-out ≥ 0.5", self.half), ("held-out ≥ 0.9", self.most), ("held-out ≥ 0.99", self.generalised)]
    }
    /// The phases `(name, [a, b))` of a run of `n` steps: before memorisation, the plateau up
    /// to held-out 0.5, the jump up to held-out 0.9, the late rise up to 0.99, after it (where a
    /// milestone is missing, or not after the one before, the phases it would bound are one).
    pub(crate) fn phases(&self, n: usize) -> Vec<(&'static str, usize, usize)> {
        let mut cuts: Vec<(&'static str, usize)> = vec![("memorisation", 0)];
        for (name, at) in [("plateau", self.memorised), ("jump", self.half), ("late", self.most), ("after", self.generalised)] {
            if let Some(s) = at {
                if s > cuts.last().expect("one").1 && s < n {
                    cuts.push((name, s));
                }
            }
        }
        (0..cuts.len()).map(|i| (cuts[i].0, cuts[i].1, cuts.get(i + 1).map_or(n, |c| c.1))).collect()
    }
    fn line(&self) -> String {
        let s = |v: Option<usize>| v.map_or("never".to_string(), |s| format!("step {s}"));
        self.named().iter().map(|(name, at)| format!("{name} at {}", s(*at))).collect::<Vec<_>>().join(", ")
    }
}

/// A vertical marker series at `x` over `[0, 1]` (an accuracy chart's milestones).
fn marker(label: &str, x: usize) -> Series {
    Series::new(label, vec![x as f64, x as f64], vec![0.0, 1.0])
}

/// Training and held-out accuracy against the step with the milestones marked.
pub(super) fn accuracy_chart(charts: &Path, log: &TrainLog) -> Result<String> {
    let m = Milestones::of(log);
    let steps: Vec<f64> = log.step.iter().map(|&v| v as f64).collect();
    let mut series = vec![Series::new("train", steps.clone(), log.acc.clone()), Series::new("held-out", steps, log.test_acc.clone())];
    for (name, at) in m.named() {
        if let Some(s) = at {
            series.push(marker(&format!("{} (step {s})", name.replace("training accuracy", "train")), s));
        }
    }
    plot::line_chart(&charts.join("grokking.png"), "Accuracy during training (full batch: one step per epoch)", "step", "accuracy (fraction)", &series, Scale::Linear, Scale::Linear)?;
    Ok(format!("- Milestones (`train_log.parquet`): {}; chart `charts/grokking.png`.", m.line()))
}

/// The kernel of each window label with its steps.
fn window_grams<'a>(labels: &[String], kernels: &'a [StudyKernel]) -> Vec<(String, (usize, usize), &'a Gram)> {
    labels
        .iter()
        .map(|l| {
            let k = kernels.iter().find(|k| &k.label == l).expect("validated: a [[kernel]] of this label");
            let [a, b] = k.spec.steps.expect("validated: a window has steps");
            (l.clone(), (a, b), &k.gram)
        })
        .collect()
}

/// `[analysis] windows`: the whole run's machine from the windows and the gaps.
pub(super) fn windows_analysis(net: &Trained, labels: &[String], kernels: &[StudyKernel], out: &Path) -> Result<Vec<String>> {
    let ws = window_grams(labels, kernels);
    let c = windows::compose(net, &ws)?;
    let dir = out.join("analysis");
    io::create_dir_all(&dir)?;
    let stat = |t: &[f64]| (t.iter().map(|v| v.abs()).fold(0.0, f64::max), t.iter().map(|v| v.abs()).sum::<f64>() / t.len().max(1) as f64);
    let mut tab = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in &c.segments {
        let (mx, mean) = stat(&s.term);
        tab.0.push(s.label.clone());
        tab.1.push(s.steps.0 as i64);
        tab.2.push(s.steps.1 as i64);
        tab.3.push(mx);
        tab.4.push(mean);
        tab.5.push(s.window_error.unwrap_or(f64::NAN));
        tab.6.push(s.carried.as_deref().map_or(f64::NAN, |c| stat(c).0));
    }
    Table::new()
        .with("segment", Column::Str(tab.0))
        .with("from_step", Column::I64(tab.1))
        .with("to_step", Column::I64(tab.2))
        .with("max_abs_term", Column::F64(tab.3))
        .with("mean_abs_term", Column::F64(tab.4))
        .with("window_max_abs_error", Column::F64(tab.5))
        .with("max_abs_carried_in", Column::F64(tab.6))
        .write_parquet(&dir.join("windows.parquet"))?;
    let (p, _, k) = ws[0].2.shape();
    let mut notes = vec![format!(
        "- The whole run's kernel machine from windows (`analysis/windows.parquet`): f(w_0) + Σ windows' kernel sums (machine − bias) + Σ gaps' own change f(w_b) − f(w_a), at {p} held-out points × {k} outputs, against the network f(w_N): max |machine − network| = **{:.3e}** ({}).\n",
        c.max_abs_error,
        if c.max_abs_error <= 1e-10 { "within 1e-10" } else { "ABOVE the 1e-10 tolerance" }
    )];
    let carry = c.segments.iter().any(|s| s.carried.is_some());
    if carry {
        notes.push("A window's term includes its **carried-in** term: the change inside the window made by the gradients of the steps before it, which the optimizer's momentum carries in (one exact term, `carry_in = true`; it belongs to no training point of the window and is left out of its attribution).\n".into());
        notes.push("| segment | steps | max abs term | mean abs term | of which carried in (max abs) | window machine max err |".into());
        notes.push("|---|---|---|---|---|---|".into());
    } else {
        notes.push("| segment | steps | max abs term | mean abs term | window machine max err |".into());
        notes.push("|---|---|---|---|---|".into());
    }
    for s in &c.segments {
        let (mx, mean) = stat(&s.term);
        let err = s.window_error.map_or("—".to_string(), |e| format!("{e:.3e}"));
        if carry {
            let cin = s.carried.as_deref().map_or("—".to_string(), |t| format!("{:.3e}", stat(t).0));
            notes.push(format!("| {} | [{}, {}) | {mx:.3e} | {mean:.3e} | {cin} | {err} |", s.label, s.steps.0, s.steps.1));
        } else {
            notes.push(format!("| {} | [{}, {}) | {mx:.3e} | {mean:.3e} | {err} |", s.label, s.steps.0, s.steps.1));
        }
    }
    notes.push(String::new());
    Ok(notes)
}

/// A training point of a token task as the summary shows it: its tokens, the target.
fn describe(x: &[f64], y: usize) -> String {
    let t: Vec<String> = x.iter().map(|v| format!("{v:.0}")).collect();
    format!("[{}] → {y}", t.join(", "))
}

/// Each window's attribution of the chosen held-out points: the training points that support
/// and oppose their target class's output over the window.
pub(super) fn window_attribution(net: &Trained, labels: &[String], kernels: &[StudyKernel], points: &[usize], out: &Path) -> Result<Vec<String>> {
    let ds = &net.run().dataset;
    let (y_train, y_test) = (ds.train_labels()?, ds.test_labels()?);
    let d = ds.dim;
    let mut notes = Vec::new();
    for (label, (a, b), g) in window_grams(labels, kernels) {
        let p = g.shape().0;
        if let Some(&bad) = points.iter().find(|&&q| q >= p) {
            return Err(Error::Config(format!("analysis.attribution_points: {bad} is out of range (`{label}` has {p} row points)")));
        }
        let x = &g.points().x;
        let chosen: Vec<f64> = points.iter().flat_map(|&q| x[q * d..(q + 1) * d].iter().copied()).collect();
        let spec = &kernels.iter().find(|k| k.label == label).expect("validated").spec;
        // a_{i,s} varies by step: the window's per-step Grams. The study keeps them with the
        // window's kernel; for some of its points only they are computed here (with carry_in,
        // the window's steps only: the earlier steps' gradients are one carried-in term of the
        // baseline).
        let whole = points.iter().copied().eq(0..p) && g.output().per_step.is_some() && g.output().layout == crate::kernel::Layout::Full;
        let computed;
        let pg = if whole {
            g
        } else {
            let builder = net.kernel(spec.kind).rule(spec.quadrature).inputs(&chosen).steps(a, b).per_step();
            computed = if spec.carry_in { builder.carry_in() } else { builder }.compute()?;
            &computed
        };
        let (np, m, k) = pg.shape();
        let test_index = |q: usize| if spec.test_points.is_empty() { q } else { spec.test_points[q] };
        let contrib = pg.contributions()?;
        let at_b = net.run().manifest.architecture.forward(&net.states()[b], Some(&net.states()[0]), &chosen)?;
        let idx: Vec<usize> = (0..np).collect();
        let at = crate::attribution::attribute(&contrib, &pg.baseline(), &at_b, &idx, np, m, k, 5)?;
        let residual = at.iter().map(|a| a.residual.abs()).fold(0.0, f64::max);
        let dir = out.join("analysis").join("attribution").join(&label);
        io::create_dir_all(&dir)?;
        let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        notes.push(format!(
            "- Attribution over `{label}` (steps [{a}, {b}), `analysis/attribution/{label}/attribution.parquet`): each chosen held-out point's output for its target class, f(w_{b}) − baseline split over the {m} training points (sums to it to {residual:.1e}); the five strongest supporters (+) and opponents (−), each as its tokens → target: contribution.\n"
        ));
        notes.push("| held-out point | output change | supporters | opponents |".into());
        notes.push("|---|---|---|---|".into());
        for (j, &q) in points.iter().enumerate() {
            let yq = y_test[test_index(q)];
            let att = at.iter().find(|t| t.point == j && t.class == yq).expect("every class attributed");
            let list = |l: &[(usize, f64)]| l.iter().map(|(i, c)| format!("{}: {c:+.2e}", describe(&ds.x_train[i * d..(i + 1) * d], y_train[*i]))).collect::<Vec<_>>().join("; ");
            notes.push(format!("| {} (held-out #{}) | {:+.3e} | {} | {} |", describe(&x[q * d..(q + 1) * d], yq), test_index(q), att.total, list(&att.supporters), list(&att.opponents)));
            for (role, l) in [("supporter", &att.supporters), ("opponent", &att.opponents)] {
                for (r, (i, c)) in l.iter().enumerate() {
                    rows.0.push(test_index(q) as i64);
                    rows.1.push(yq as i64);
                    rows.2.push(role.to_string());
                    rows.3.push(r as i64);
                    rows.4.push(*i as i64);
                    rows.5.push(*c);
                }
            }
        }
        notes.push(String::new());
        Table::new()
            .with("point", Column::I64(rows.0))
            .with("class", Column::I64(rows.1))
            .with("role", Column::Str(rows.2))
            .with("rank", Column::I64(rows.3))
            .with("train_index", Column::I64(rows.4))
            .with("contribution", Column::F64(rows.5))
            .write_parquet(&dir.join("attribution.parquet"))?;
    }
    Ok(notes)
}

/// What one step's split is reduced to: per group the RMS of its share over points and
/// outputs and its share of the change of the mean held-out target log-output; the step's
/// change of that mean, its residual and the outputs' size, nodes and pieces (those kept at
/// rounding, those given up).
#[derive(Clone, Debug, PartialEq)]
struct StepRow {
    rms: Vec<f64>,
    target: Vec<f64>,
    change: f64,
    residual: f64,
    scale: f64,
    nodes: usize,
    pieces: usize,
    at_rounding: usize,
    gave_up: usize,
}

/// `[analysis] layer_shares`: every step split by layer at the held-out points (cached in
/// `cache/layer_shares/`), tables and charts.
pub(super) fn layer_shares_analysis(net: &Trained, log: &TrainLog, cache: &Path, out: &Path, charts: Option<&Path>, progress: bool) -> Result<Vec<String>> {
    let run = net.run();
    let ds = &run.dataset;
    let y = ds.test_labels()?;
    let (p, k, n) = (ds.n_test(), ds.num_outputs, run.manifest.steps);
    if p == 0 {
        return Err(Error::Config("analysis.layer_shares splits the held-out outputs: the run has no test points".into()));
    }
    let ms = Milestones::of(log);
    let phases = ms.phases(n);
    let groups = shares::layer_groups(&run.manifest.architecture, &net.states()[0])?;
    let g = groups.len();
    let key = Key::of_bytes(format!("{}|layer-shares-v2|{SHARES_TOL:e}|{}|{:?}", run.manifest.run_id, run.manifest.created_by, phases).as_bytes());
    let cdir = cache.join("layer_shares");
    let (per_step, phase_sums) = if reusable(&cdir, &key) {
        read_cached(&cdir, g, n, p * k, phases.len())?
    } else {
        unstamp(&cdir)?;
        let bar = crate::progress::Progress::new(progress, n as u64, "layer shares {bar:40} {pos}/{len} steps [{elapsed} < {eta}]");
        let sums = Mutex::new(vec![vec![0.0; g * p * k]; phases.len()]);
        let reduce = |s: usize, sp: &shares::StepSplit| {
            let ph = phases.iter().position(|&(_, a, b)| s >= a && s < b).expect("phases cover the run");
            {
                let mut acc = sums.lock().expect("no panics while held");
                acc[ph].iter_mut().zip(&sp.shares).for_each(|(a, v)| *a += v);
            }
            let pk = p * k;
            StepRow {
                rms: (0..g).map(|gi| (sp.shares[gi * pk..(gi + 1) * pk].iter().map(|v| v * v).sum::<f64>() / pk as f64).sqrt()).collect(),
                target: (0..g).map(|gi| (0..p).map(|i| sp.shares[gi * pk + i * k + y[i]]).sum::<f64>() / p as f64).collect(),
                change: (0..p).map(|i| sp.change[i * k + y[i]]).sum::<f64>() / p as f64,
                residual: sp.residual,
                scale: sp.scale,
                nodes: sp.nodes,
                pieces: sp.pieces,
                at_rounding: sp.at_rounding,
                gave_up: sp.gave_up,
            }
        };
        let tick = |done: usize| bar.set_position(done as u64);
        let (_, rows) = shares::run_shares(net, &ds.x_test, SHARES_TOL, &reduce, &tick)?;
        bar.finish_and_clear();
        let sums = sums.into_inner().expect("no panics while held");
        write_cached(&cdir, &rows, &sums, g)?;
        stamp(&cdir, &key)?;
        (rows, sums)
    };
    // The report's tables.
    let dir = out.join("analysis");
    io::create_dir_all(&dir)?;
    let names: Vec<String> = groups.iter().map(|(l, _)| l.clone()).collect();
    let (mut st, mut gr, mut rms, mut tg) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (s, r) in per_step.iter().enumerate() {
        for gi in 0..g {
            st.push(s as i64);
            gr.push(names[gi].clone());
            rms.push(r.rms[gi]);
            tg.push(r.target[gi]);
        }
    }
    Table::new()
        .with("step", Column::I64(st))
        .with("layer", Column::Str(gr))
        .with("rms_share", Column::F64(rms))
        .with("target_share", Column::F64(tg))
        .write_parquet(&dir.join("layer_shares.parquet"))?;
    Table::new()
        .with("step", Column::I64((0..n as i64).collect()))
        .with("target_change", Column::F64(per_step.iter().map(|r| r.change).collect()))
        .with("residual", Column::F64(per_step.iter().map(|r| r.residual).collect()))
        .with("max_abs_output", Column::F64(per_step.iter().map(|r| r.scale).collect()))
        .with("nodes", Column::I64(per_step.iter().map(|r| r.nodes as i64).collect()))
        .with("pieces", Column::I64(per_step.iter().map(|r| r.pieces as i64).collect()))
        .with("pieces_at_rounding", Column::I64(per_step.iter().map(|r| r.at_rounding as i64).collect()))
        .with("pieces_given_up", Column::I64(per_step.iter().map(|r| r.gave_up as i64).collect()))
        .write_parquet(&dir.join("layer_shares_steps.parquet"))?;
    let worst = per_step.iter().map(|r| r.residual).fold(0.0, f64::max);
    let worst_rel = per_step.iter().map(|r| r.residual / r.scale.max(f64::MIN_POSITIVE)).fold(0.0, f64::max);
    let nodes = per_step.iter().map(|r| r.nodes).sum::<usize>() as f64 / n.max(1) as f64;
    let split = per_step.iter().filter(|r| r.pieces > 1).count();
    let rounded: usize = per_step.iter().map(|r| r.at_rounding).sum();
    let rounded_steps = per_step.iter().filter(|r| r.at_rounding > 0).count();
    let gave_up: usize = per_step.iter().map(|r| r.gave_up).sum();
    let gave_up_steps: Vec<usize> = per_step.iter().enumerate().filter(|(_, r)| r.gave_up > 0).map(|(s, _)| s).collect();
    let verdict = if gave_up == 0 {
        format!(
            "met: every piece passed its check (a miss ≤ {SHARES_TOL:e} × its length, or ≤ {} ulps of the outputs' size, the rounding of f(b) − f(a)), {rounded} pieces in {rounded_steps} steps at rounding (a miss ≤ {} ulps of the outputs that halving did not reduce)",
            shares::ROUNDING_ULPS,
            shares::ROUNDING_ZONE
        )
    } else {
        let shown: Vec<String> = gave_up_steps.iter().take(8).map(usize::to_string).collect();
        format!("MISSED: {gave_up} pieces in {} steps (steps {}{}) still failed their check after {} bisections", gave_up_steps.len(), shown.join(", "), if gave_up_steps.len() > 8 { ", …" } else { "" }, shares::MAX_DEPTH)
    };
    if gave_up > 0 {
        eprintln!("warning: layer shares: {verdict}");
    }
    let mut notes = vec![format!(
        "- Layer shares at every step ({n} steps, {p} held-out points × {k} outputs; `analysis/layer_shares.parquet`, `analysis/layer_shares_steps.parquet`): each top-level layer's ∫₀¹ ∇_g f·Δw_g dt, Gauss–Legendre order 4 per piece, {nodes:.2} nodes per step on average ({split} steps split at kinks or bisected); the shares sum to the network's own change over each step to **{worst:.2e}** at most, **{worst_rel:.1e}** of the outputs' size (max |f| at the step's ends; {verdict}).\n"
    )];
    // The phase table: the change of the mean held-out target log-output, and the RMS over
    // points and outputs of each layer's summed share.
    let pk = p * k;
    notes.push(format!("Per phase ({}): each layer's share of the change of the mean held-out log-probability of the target class (the signed split, summing to the network's change), and in brackets the RMS over held-out points and outputs of its summed share.\n", ms.line()));
    let mut head = "| layer |".to_string();
    let mut rule = "|---|".to_string();
    for (name, a, b) in &phases {
        head.push_str(&format!(" {name} [{a}, {b}) |"));
        rule.push_str("---|");
    }
    notes.push(head);
    notes.push(rule);
    for (gi, name) in names.iter().enumerate() {
        let mut row = format!("| {name} |");
        for (ph, (_, a, b)) in phases.iter().enumerate() {
            let t: f64 = per_step[*a..*b].iter().map(|r| r.target[gi]).sum();
            let v = &phase_sums[ph][gi * pk..(gi + 1) * pk];
            let r = (v.iter().map(|x| x * x).sum::<f64>() / pk as f64).sqrt();
            row.push_str(&format!(" {t:+.3} ({r:.3}) |"));
        }
        notes.push(row);
    }
    let mut row = "| network |".to_string();
    for (ph, (_, a, b)) in phases.iter().enumerate() {
        let t: f64 = per_step[*a..*b].iter().map(|r| r.change).sum();
        let tot: Vec<f64> = (0..pk).map(|j| (0..g).map(|gi| phase_sums[ph][gi * pk + j]).sum()).collect();
        let r = (tot.iter().map(|x| x * x).sum::<f64>() / pk as f64).sqrt();
        row.push_str(&format!(" {t:+.3} ({r:.3}) |"));
    }
    notes.push(row);
    notes.push(String::new());
    if let Some(charts) = charts {
        let steps: Vec<f64> = (0..n).map(|s| s as f64).collect();
        let series: Vec<Series> = (0..g).map(|gi| Series::new(names[gi].clone(), steps.clone(), per_step.iter().map(|r| r.rms[gi]).collect())).collect();
        plot::line_chart(&charts.join("layer_shares.png"), "Each layer's share of the step's change of the held-out outputs (RMS)", "step", "RMS over held-out points and outputs", &series, Scale::Linear, Scale::Log)?;
        let mut series: Vec<Series> = (0..g)
            .map(|gi| {
                let mut c = 0.0;
                Series::new(names[gi].clone(), steps.clone(), per_step.iter().map(|r| { c += r.target[gi]; c }).collect())
            })
            .collect();
        let mut c = 0.0;
        series.push(Series::new("network (sum)", steps.clone(), per_step.iter().map(|r| { c += r.change; c }).collect()));
        plot::line_chart(&charts.join("layer_shares_cumulative.png"), "Change of the mean held-out log p(target) since step 0, by layer", "step", "cumulative change", &series, Scale::Linear, Scale::Linear)?;
        notes.push("- Charts: `charts/layer_shares.png` (per step, log scale), `charts/layer_shares_cumulative.png` (cumulative, the layers summing to the network).".into());
    }
    Ok(notes)
}

fn write_cached(dir: &Path, rows: &[StepRow], sums: &[Vec<f64>], g: usize) -> Result<()> {
    io::create_dir_all(dir)?;
    let flat = |f: &dyn Fn(&StepRow) -> Vec<f64>| rows.iter().flat_map(f).collect::<Vec<f64>>();
    io::write_safetensors(
        &dir.join("layer_shares.safetensors"),
        &[
            io::NamedArray::f64("rms", vec![rows.len(), g], flat(&|r| r.rms.clone())),
            io::NamedArray::f64("target", vec![rows.len(), g], flat(&|r| r.target.clone())),
            io::NamedArray::f64("step", vec![rows.len(), 7], flat(&|r| vec![r.change, r.residual, r.scale, r.nodes as f64, r.pieces as f64, r.at_rounding as f64, r.gave_up as f64])),
            io::NamedArray::f64("phase_sums", vec![sums.len(), sums.first().map_or(0, Vec::len)], sums.concat()),
        ],
        None,
    )
}

fn read_cached(dir: &Path, g: usize, n: usize, pk: usize, phases: usize) -> Result<(Vec<StepRow>, Vec<Vec<f64>>)> {
    let path = dir.join("layer_shares.safetensors");
    let f = io::SafeFile::open(&path)?;
    let get = |name: &str, len: usize| -> Result<Vec<f64>> {
        let (_, v) = f.f64(name, None)?;
        if v.len() != len {
            return Err(Error::format(&path, format!("`{name}` has {} values, expected {len}", v.len())));
        }
        Ok(v)
    };
    let (rms, target, step, sums) = (get("rms", n * g)?, get("target", n * g)?, get("step", n * 7)?, get("phase_sums", phases * g * pk)?);
    let rows = (0..n)
        .map(|s| StepRow {
            rms: rms[s * g..(s + 1) * g].to_vec(),
            target: target[s * g..(s + 1) * g].to_vec(),
            change: step[s * 7],
            residual: step[s * 7 + 1],
            scale: step[s * 7 + 2],
            nodes: step[s * 7 + 3] as usize,
            pieces: step[s * 7 + 4] as usize,
            at_rounding: step[s * 7 + 5] as usize,
            gave_up: step[s * 7 + 6] as usize,
        })
        .collect();
    Ok((rows, sums.chunks(g * pk).map(<[f64]>::to_vec).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log whose accuracies are given per step (loss and norms unused).
    fn log(acc: &[f64], test_acc: &[f64]) -> TrainLog {
        let n = acc.len();
        TrainLog { step: (0..n as i64).collect(), loss: vec![0.0; n], acc: acc.to_vec(), test_acc: test_acc.to_vec(), grad_norm: vec![0.0; n], weight_norm: vec![0.0; n] }
    }

    /// The phases follow the first crossings of 0.99 (training), then 0.5, 0.9 and 0.99 (held
    /// out); a milestone never reached, or reached at the same step as the one before it,
    /// leaves the phases it would bound as one, and the phases always cover `[0, n)`.
    #[test]
    fn phases_follow_the_milestones() {
        let acc = [0.1, 0.5, 0.995, 1.0, 1.0, 1.0, 1.0, 1.0];
        let grokked = log(&acc, &[0.0, 0.1, 0.2, 0.3, 0.6, 0.8, 0.95, 0.99]);
        let m = Milestones::of(&grokked);
        assert_eq!((m.memorised, m.half, m.most, m.generalised), (Some(2), Some(4), Some(6), Some(7)));
        assert_eq!(m.phases(8), vec![("memorisation", 0, 2), ("plateau", 2, 4), ("jump", 4, 6), ("late", 6, 7), ("after", 7, 8)]);
        assert!(m.line().contains("held-out ≥ 0.9 at step 6") && m.line().contains("held-out ≥ 0.99 at step 7"), "{}", m.line());
        // Held out never at 0.99, and 0.5 and 0.9 crossed at the same step.
        let levelled = log(&acc, &[0.0, 0.1, 0.2, 0.3, 0.92, 0.95, 0.96, 0.96]);
        let m = Milestones::of(&levelled);
        assert_eq!(m.phases(8), vec![("memorisation", 0, 2), ("plateau", 2, 4), ("jump", 4, 8)]);
        assert!(m.line().ends_with("held-out ≥ 0.99 at never"), "{}", m.line());
        // A milestone at or after the run's end bounds nothing.
        assert_eq!(m.phases(4), vec![("memorisation", 0, 2), ("plateau", 2, 4)]);
    }
}
