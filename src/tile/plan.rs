//! The plan: how a kernel job splits into tiles (row blocks × column blocks × step ranges),
//! written to `OUT/plan.json` before anything is computed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kernel::{self, KernelForm, KernelKind, Layout, Points, Rows, Request, Rule, Side};
use crate::model::Params;
use crate::trajectory::Run;

use super::crc::crc32_f64;

/// Format name of `plan.json`.
pub(crate) const PLAN_FORMAT: &str = "pathkernel-tile-plan";
/// Current plan format version (2: column blocks).
pub(crate) const PLAN_VERSION: u32 = 2;

/// How many tiles were asked for (`--tiles`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiling {
    /// `--tiles N`: N row blocks (at most one per row point); with fewer row points than N and
    /// separable steps, the remaining factor as step ranges (see the [module docs](super)).
    Count(usize),
    /// `--tiles RxCxS`: R row blocks × C column blocks (training points) × S step ranges
    /// (`RxS`: C = 1).
    Grid {
        /// Row blocks R.
        rows: usize,
        /// Column blocks C.
        cols: usize,
        /// Step ranges S.
        steps: usize,
    },
}

impl std::str::FromStr for Tiling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Config(format!("--tiles `{s}`: expected N, RxS (row blocks x step ranges) or RxCxS (row blocks x column blocks x step ranges) with positive integers"));
        let pos = |t: &str| t.trim().parse::<usize>().ok().filter(|&v| v > 0).ok_or_else(bad);
        let parts: Vec<&str> = s.split(['x', 'X']).collect();
        match parts[..] {
            [n] => Ok(Tiling::Count(pos(n)?)),
            [r, st] => Ok(Tiling::Grid { rows: pos(r)?, cols: 1, steps: pos(st)? }),
            [r, c, st] => Ok(Tiling::Grid { rows: pos(r)?, cols: pos(c)?, steps: pos(st)? }),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Tiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Tiling::Count(n) => write!(f, "{n}"),
            Tiling::Grid { rows, cols: 1, steps } => write!(f, "{rows}x{steps}"),
            Tiling::Grid { rows, cols, steps } => write!(f, "{rows}x{cols}x{steps}"),
        }
    }
}

/// The kernel request of a plan, as stored in `plan.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// Kernel kind.
    pub kind: KernelKind,
    /// Quadrature rule (`auto:1e-12`, `gauss:16`, …).
    pub quadrature: String,
    /// Side of the row points.
    pub side: Side,
    /// NTK: the state S.
    pub ntk_step: Option<usize>,
    /// Per-step Grams kept.
    pub per_step: bool,
    /// The steps `[A, B)` summed as requested (`None`: all).
    pub steps: Option<[usize; 2]>,
    /// Which blocks of the Gram are computed.
    pub layout: Layout,
    /// The row points (`--points`: test, train, class-means, grid:N).
    pub points: String,
    /// CRC-32 of the row points `[P, d]` as little-endian f64 (checked by every tile).
    pub points_crc32: String,
}

impl PlanRequest {
    /// The quadrature rule.
    pub fn rule(&self) -> Result<Rule> {
        self.quadrature.parse()
    }

    /// The engine's request for steps `[a, b)` (`None`: the plan's own range), in the plan's
    /// layout.
    pub(crate) fn kernel_request(&self, steps: Option<[usize; 2]>) -> Result<Request> {
        Ok(Request::new(self.kind)
            .rule(self.rule()?)
            .side(self.side)
            .ntk_step(self.ntk_step)
            .per_step(self.per_step)
            .steps(steps.or(self.steps).map(|[a, b]| (a, b)))
            .layout(self.layout))
    }
}

/// One tile: a block of row points against a block of training points over a range of steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TileEntry {
    /// Index (`(row_block · col_blocks + col_block) · step_ranges + step_range`).
    pub index: usize,
    /// Row block b.
    pub row_block: usize,
    /// Column block c.
    pub col_block: usize,
    /// Step range r.
    pub step_range: usize,
    /// Row points `[lo, hi)`.
    pub rows: [usize; 2],
    /// Training points (the Gram's columns) `[lo, hi)`.
    pub cols: [usize; 2],
    /// Steps `[lo, hi)`.
    pub steps: [usize; 2],
    /// The tile's file, relative to the plan directory.
    pub file: String,
    /// Bytes of the tile's arrays (its file, up to the header).
    pub output_bytes: u64,
    /// Estimated peak memory of `tile run` for this tile: the engine's estimate for its rows and
    /// columns (`kernel::engine::blocked::plan_columns`) plus the states `w_0 … w_N` it loads.
    pub estimated_peak_bytes: u64,
    /// Estimated seconds, extrapolated from the pilot (a rough figure: the auto rule's cost
    /// varies by step and point).
    pub estimated_seconds: Option<f64>,
}

/// The pilot timed at plan time to estimate each tile's seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pilot {
    /// Row points used (spread over the rows).
    pub rows: usize,
    /// The steps timed (one step each; NTK: the whole request).
    pub steps: Vec<usize>,
    /// Seconds per step that do not depend on the rows (training-side factors).
    pub fixed_seconds_per_step: f64,
    /// Seconds per step and row point.
    pub row_seconds_per_step: f64,
}

/// A tiled kernel job (`OUT/plan.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// `pathkernel-tile-plan`.
    pub format: String,
    /// Plan format version.
    pub version: u32,
    /// Hash of the request, the run id, the shape and the tiles' ranges (16 hex digits).
    pub plan_id: String,
    /// The run's id.
    pub run_id: String,
    /// The run directory (absolute).
    pub run_dir: PathBuf,
    /// What is computed.
    pub request: PlanRequest,
    /// Row points P.
    pub p: usize,
    /// Training points M.
    pub m: usize,
    /// Outputs K.
    pub k: usize,
    /// The run's steps N.
    pub n_steps: usize,
    /// The kernel form of the run's optimizer.
    pub form: KernelForm,
    /// Row blocks R.
    pub row_blocks: usize,
    /// Rows per block (the last block may be smaller).
    pub block_rows: usize,
    /// Column blocks C (blocks of training points).
    pub col_blocks: usize,
    /// Training points per column block (the last block may be smaller).
    pub block_cols: usize,
    /// The S step ranges `[lo, hi)`, in summation order.
    pub step_ranges: Vec<[usize; 2]>,
    /// How the tile count was chosen.
    pub split: String,
    /// `--memory` in bytes: every tile's estimated peak fits it.
    pub memory_budget: u64,
    /// Bytes of the merged output's arrays.
    pub merged_output_bytes: u64,
    /// The pilot behind the time estimates (absent when none was run).
    pub pilot: Option<Pilot>,
    /// The tiles, by index.
    pub tiles: Vec<TileEntry>,
    /// `pathkernel <version>`.
    pub created_by: String,
}

/// What a plan is made from.
pub struct PlanInput<'a> {
    /// The run.
    pub run: &'a Run,
    /// Its states `w_0 … w_N` (for the pilot).
    pub states: &'a [Params],
    /// `--points` as given (test, train, class-means, grid:N).
    pub points: &'a str,
    /// What to compute (its `steps` is the whole job's range; its layout the Gram's).
    pub req: &'a Request,
    /// Memory budget per tile, bytes.
    pub memory_budget: u64,
    /// How many tiles.
    pub tiling: Tiling,
    /// Time a pilot to estimate each tile's seconds.
    pub pilot: bool,
}

/// Whether a run's steps can be split into ranges that are computed apart and summed: plain
/// gradient steps (GD/SGD, with or without weight decay) and a path kernel. Momentum and Adam
/// carry state from step to step (their `K_r` sums the future steps' features), and the NTK is
/// one kernel at one state, so they are split by rows only.
pub(crate) fn steps_separable(form: KernelForm, kind: KernelKind) -> bool {
    matches!(form, KernelForm::Gradient | KernelForm::GradientWithDecay) && kind != KernelKind::Ntk
}

/// Plans a tiled kernel job (see the [module docs](super) for the rule).
///
/// Errors: invalid steps, a step split the run does not admit, more row blocks than row
/// points or column blocks than training points, a tile that does not fit the budget even with
/// one row point and one training point, and any error of the pilot computation (the request
/// is checked by computing it on a few rows).
pub fn make_plan(input: &PlanInput<'_>) -> Result<Plan> {
    let run = input.run;
    let manifest = &run.manifest;
    let req = input.req;
    let spec: Rows = input.points.parse()?;
    let points = spec.resolve(&run.dataset)?;
    let (p, m, k, n) = (points.len(), run.dataset.n_train(), manifest.architecture.outputs(), manifest.steps);
    if p == 0 {
        return Err(Error::Data("no row points".into()));
    }
    let (lo, hi) = checked_steps(req, n)?;
    let form = KernelForm::of(&crate::optim::UpdateRule::of(&manifest.optimizer));
    let separable = steps_separable(form, req.kind);
    let len = hi - lo;
    let (rows, cols, steps, mut split) = wanted_tiling(input, form, separable, p, m, len)?;
    let req_tile = req.clone().steps(Some((lo, hi)));
    let (rows, block_rows, cols, block_cols) = fit_budget(input, &req_tile, p, m, (rows, cols), &mut split)?;
    let bounds: Vec<usize> = (0..=steps).map(|j| lo + j * len / steps).collect();
    let step_ranges: Vec<[usize; 2]> = bounds.windows(2).map(|w| [w[0], w[1]]).collect();

    let pilot = if input.pilot { Some(run_pilot(input, &points, separable, (lo, hi))?) } else { None };
    // Column blocks of plain gradient steps carry their per-step predicted and actual changes.
    let shares = cols > 1 && form == KernelForm::Gradient;
    let blocks = Blocks { p, m, k, rows, block_rows, cols, block_cols };
    let tiles = tile_entries(input, &req_tile, &blocks, &step_ranges, shares, pilot.as_ref())?;
    let run_dir = std::fs::canonicalize(&run.dir).map_err(|e| Error::io(&run.dir, e))?;
    let mut plan = Plan {
        format: PLAN_FORMAT.into(),
        version: PLAN_VERSION,
        plan_id: String::new(),
        run_id: manifest.run_id.clone(),
        run_dir,
        request: PlanRequest {
            kind: req.kind,
            quadrature: req.rule.to_string(),
            side: req.side,
            ntk_step: req.ntk_step,
            per_step: req.per_step,
            steps: req.steps.map(|(a, b)| [a, b]),
            layout: input.req.layout,
            points: input.points.to_string(),
            points_crc32: format!("{:08x}", crc32_f64(&points.x)),
        },
        p,
        m,
        k,
        n_steps: n,
        form,
        row_blocks: rows,
        block_rows,
        col_blocks: cols,
        block_cols,
        step_ranges,
        split,
        memory_budget: input.memory_budget,
        merged_output_bytes: kernel::output_bytes_in(input.req.layout, p, m, k, n, req.per_step),
        pilot,
        tiles,
        created_by: format!("pathkernel {}", env!("CARGO_PKG_VERSION")),
    };
    plan.plan_id = plan.compute_id();
    Ok(plan)
}

/// The request's step range `[lo, hi)` of a run of `n` steps, checked (with the NTK's state).
fn checked_steps(req: &Request, n: usize) -> Result<(usize, usize)> {
    let (lo, hi) = req.steps.unwrap_or((0, n));
    if lo >= hi || hi > n {
        return Err(Error::Config(format!("--steps {lo}:{hi}: need 0 <= A < B <= {n}")));
    }
    if req.kind == KernelKind::Ntk && req.ntk_step.is_some_and(|s| s > n) {
        return Err(Error::Config(format!("--step {} is beyond the last state {n}", req.ntk_step.unwrap_or(0))));
    }
    Ok((lo, hi))
}

/// Why the steps of this request cannot be split into ranges.
fn why_not_separable(input: &PlanInput<'_>, form: KernelForm) -> String {
    if input.req.kind == KernelKind::Ntk {
        "the NTK is one kernel at one state".to_string()
    } else {
        format!("this run's optimizer ({}) couples its steps (kernel form {form})", input.run.manifest.optimizer)
    }
}

/// The tiling asked for, before the budget: row blocks, column blocks, step ranges and how the
/// count was chosen. `--tiles N` takes row blocks (one per row point at most), then step ranges
/// where the steps separate; a grid is checked against the points and steps.
fn wanted_tiling(input: &PlanInput<'_>, form: KernelForm, separable: bool, p: usize, m: usize, len: usize) -> Result<(usize, usize, usize, String)> {
    Ok(match input.tiling {
        Tiling::Count(t) => {
            let r = t.min(p);
            let s = if separable { t.div_ceil(r).min(len) } else { 1 };
            let how = if s > 1 {
                format!("--tiles {t}: {r} row blocks (one per row point) x {s} step ranges")
            } else if t > p {
                format!("--tiles {t}: {r} row blocks (one per row point; steps not split: {})", why_not_separable(input, form))
            } else {
                format!("--tiles {t}: {r} row blocks")
            };
            (r, 1, s, how)
        }
        Tiling::Grid { rows, cols, steps } => {
            let t = input.tiling;
            if steps > 1 && !separable {
                let rest = if cols > 1 { format!("{rows}x{cols}x1") } else { format!("{rows}x1") };
                return Err(Error::Config(format!(
                    "--tiles {t}: step ranges need plain gradient steps (GD/SGD, with or without weight decay) and a path kernel; {}: use row and column tiles only (--tiles N or {rest})",
                    why_not_separable(input, form)
                )));
            }
            if steps > len {
                return Err(Error::Config(format!("--tiles {t}: {steps} step ranges for {len} steps")));
            }
            if rows > p {
                return Err(Error::Config(format!("--tiles {t}: {rows} row blocks for {p} row points")));
            }
            if cols > m {
                return Err(Error::Config(format!("--tiles {t}: {cols} column blocks for {m} training points")));
            }
            let how = if cols > 1 {
                format!("--tiles {t}: {rows} row blocks x {cols} column blocks x {steps} step ranges")
            } else {
                format!("--tiles {t}: {rows} row blocks x {steps} step ranges")
            };
            (rows, cols, steps, how)
        }
    })
}

/// Estimated peak bytes of a tile of `br` row points and `bc` training points, with the
/// states it loads.
fn tile_peak(input: &PlanInput<'_>, req_tile: &Request, br: usize, bc: usize) -> Result<u64> {
    let (manifest, m) = (&input.run.manifest, input.run.dataset.n_train());
    Ok(kernel::engine::blocked::plan_columns(manifest, br, bc, m, req_tile, u64::MAX)?.estimated_peak() + states_bytes(input.run))
}

/// Whether a tile of `br` row points and `bc` training points fits `--memory` in one block.
fn tile_fits(input: &PlanInput<'_>, req_tile: &Request, br: usize, bc: usize) -> bool {
    let (manifest, m) = (&input.run.manifest, input.run.dataset.n_train());
    kernel::engine::blocked::plan_columns(manifest, br, bc, m, req_tile, input.memory_budget)
        .is_ok_and(|bp| bp.blocks == 1 && bp.estimated_peak() + states_bytes(input.run) <= input.memory_budget)
}

/// Grows the wanted `(rows, cols)` blocks until one tile fits the budget and evens them out;
/// returns `(rows, block_rows, cols, block_cols)` and says what changed in `split`.
///
/// The column blocks grow while a tile of one row point does not fit (the training side, a
/// and the loss gradients scale with the columns), the row blocks otherwise.
fn fit_budget(input: &PlanInput<'_>, req_tile: &Request, p: usize, m: usize, (wanted_rows, wanted_cols): (usize, usize), split: &mut String) -> Result<(usize, usize, usize, usize)> {
    let (mut rows, mut cols) = (wanted_rows, wanted_cols);
    let fits = |br: usize, bc: usize| tile_fits(input, req_tile, br, bc);
    loop {
        let (br, bc) = (p.div_ceil(rows), m.div_ceil(cols));
        if fits(br, bc) {
            break;
        }
        if bc > 1 && !fits(1, bc) {
            cols = m.div_ceil(bc - 1);
        } else if br > 1 {
            rows = p.div_ceil(br - 1);
        } else {
            return Err(Error::OutOfMemoryBudget {
                what: format!("one tile of one row point and {bc} training points (plus the {} states it loads)", input.run.manifest.steps + 1),
                needed_bytes: tile_peak(input, req_tile, 1, bc)?,
                budget_bytes: input.memory_budget,
                hint: "raise --memory".into(),
            });
        }
    }
    let block_rows = p.div_ceil(rows);
    let rows = p.div_ceil(block_rows);
    let block_cols = m.div_ceil(cols);
    let cols = m.div_ceil(block_cols);
    if cols > wanted_cols {
        split.push_str(&format!("; grown to {cols} column blocks of {block_cols} training points so that a tile of one row point fits --memory"));
    } else if cols < wanted_cols {
        split.push_str(&format!("; {cols} even column blocks of {block_cols} training points"));
    }
    if rows > wanted_rows {
        split.push_str(&format!("; grown to {rows} row blocks of {block_rows} points so that each tile fits --memory"));
    } else if rows < wanted_rows {
        split.push_str(&format!("; {rows} even row blocks of {block_rows} points"));
    }
    Ok((rows, block_rows, cols, block_cols))
}

/// The job's shape as the budget left it: `rows` blocks of `block_rows` of the P row points,
/// `cols` blocks of `block_cols` of the M training points.
struct Blocks {
    p: usize,
    m: usize,
    k: usize,
    rows: usize,
    block_rows: usize,
    cols: usize,
    block_cols: usize,
}

/// The tiles, by index (row block, then column block, then step range), each with its output
/// bytes, estimated peak and, with a pilot, estimated seconds.
fn tile_entries(input: &PlanInput<'_>, req_tile: &Request, bl: &Blocks, step_ranges: &[[usize; 2]], shares: bool, pilot: Option<&Pilot>) -> Result<Vec<TileEntry>> {
    let req = input.req;
    let (p, m, k) = (bl.p, bl.m, bl.k);
    let (rows, block_rows, cols, block_cols) = (bl.rows, bl.block_rows, bl.cols, bl.block_cols);
    let steps = step_ranges.len();
    let per_pair = input.req.layout.per_pair(k) as u64;
    let mut tiles = Vec::with_capacity(rows * cols * steps);
    for b in 0..rows {
        let r0 = b * block_rows;
        let r1 = ((b + 1) * block_rows).min(p);
        let pt = (r1 - r0) as u64;
        for c in 0..cols {
            let c0 = c * block_cols;
            let c1 = ((c + 1) * block_cols).min(m);
            let mc = (c1 - c0) as u64;
            let peak = tile_peak(input, req_tile, r1 - r0, c1 - c0)?;
            for (r, st) in step_ranges.iter().enumerate() {
                let s_len = (st[1] - st[0]) as u64;
                let gram = pt * mc * per_pair * 8;
                let a = if b == 0 { s_len * mc * k as u64 * 8 } else { 0 };
                let records = if req.kind == KernelKind::Ntk { 1 } else { s_len };
                let steps_arrays = if shares { 2 * records * pt * k as u64 * 8 } else { 0 };
                let output_bytes = gram * (1 + if req.per_step { s_len } else { 0 }) + pt * (k * k) as u64 * 8 + 7 * pt * k as u64 * 8 + a + 10 * s_len * 8 + steps_arrays;
                // The training side scales with the columns; the rows' quadrature does not.
                let seconds = pilot.map(|pl| {
                    let steps_cost = if req.kind == KernelKind::Ntk { 1.0 } else { s_len as f64 };
                    steps_cost * (pl.fixed_seconds_per_step * mc as f64 / m as f64 + pt as f64 * pl.row_seconds_per_step)
                });
                let index = (b * cols + c) * steps + r;
                tiles.push(TileEntry {
                    index,
                    row_block: b,
                    col_block: c,
                    step_range: r,
                    rows: [r0, r1],
                    cols: [c0, c1],
                    steps: *st,
                    file: format!("tiles/tile-{index:06}.safetensors"),
                    output_bytes,
                    estimated_peak_bytes: peak,
                    estimated_seconds: seconds,
                });
            }
        }
    }
    Ok(tiles)
}

/// Bytes of the states `w_0 … w_N` a tile loads.
fn states_bytes(run: &Run) -> u64 {
    (run.manifest.steps as u64 + 1) * run.manifest.num_params as u64 * 8
}

/// Times the request on one row and on up to 8 rows spread over the points, one step at a
/// time at up to three steps (start, middle, end of the range; one step for coupled runs, the
/// whole request for the NTK), and fits `seconds per step = fixed + rows · per_row`.
fn run_pilot(input: &PlanInput<'_>, points: &Points, separable: bool, (lo, hi): (usize, usize)) -> Result<Pilot> {
    let p = points.len();
    let d = points.dim;
    let q = p.min(8);
    let pick = |idx: &[usize]| Points { x: idx.iter().flat_map(|&i| points.x[i * d..(i + 1) * d].iter().copied()).collect(), dim: d };
    let one = pick(&[0]);
    let many = pick(&(0..q).map(|j| j * p / q).collect::<Vec<_>>());
    let sample: Vec<(usize, usize)> = if input.req.kind == KernelKind::Ntk {
        vec![(lo, hi)]
    } else if separable {
        let mut s = vec![lo, lo + (hi - lo) / 2, hi - 1];
        s.dedup();
        s.into_iter().map(|s| (s, s + 1)).collect()
    } else {
        vec![(lo, lo + 1)]
    };
    let time = |pts: &Points, range: (usize, usize)| -> Result<f64> {
        let req = input.req.clone().steps(Some(range)).memory_budget(u64::MAX).columns(None).block_rows(None);
        let t = Instant::now();
        kernel::compute(input.run, input.states, pts, &req, &|_, _| {})?;
        Ok(t.elapsed().as_secs_f64())
    };
    let (mut fixed, mut per_row) = (0.0, 0.0);
    for &range in &sample {
        let t1 = time(&one, range)?;
        let tq = if q > 1 { time(&many, range)? } else { t1 };
        let row = if q > 1 { ((tq - t1) / (q - 1) as f64).max(0.0) } else { t1 };
        fixed += (t1 - row).max(0.0);
        per_row += row;
    }
    let ns = sample.len() as f64;
    Ok(Pilot { rows: q, steps: sample.iter().map(|r| r.0).collect(), fixed_seconds_per_step: fixed / ns, row_seconds_per_step: per_row / ns })
}

impl Plan {
    /// The plan id: FNV-1a of the canonical JSON of the request, run id, shape, form, crate
    /// version and the tiles' ranges (not of the run's location, the budget or the estimates).
    pub(crate) fn compute_id(&self) -> String {
        #[derive(Serialize)]
        struct IdInput<'a> {
            format: &'a str,
            version: u32,
            created_by: &'a str,
            run_id: &'a str,
            request: &'a PlanRequest,
            shape: [usize; 4],
            form: KernelForm,
            tiles: Vec<([usize; 2], [usize; 2], [usize; 2])>,
        }
        let id = IdInput {
            format: &self.format,
            version: self.version,
            created_by: &self.created_by,
            run_id: &self.run_id,
            request: &self.request,
            shape: [self.p, self.m, self.k, self.n_steps],
            form: self.form,
            tiles: self.tiles.iter().map(|t| (t.rows, t.cols, t.steps)).collect(),
        };
        let json = serde_json::to_string(&id).expect("plan id input serialises");
        format!("{:016x}", crate::train::fnv1a(json.as_bytes()))
    }

    /// Writes `out/plan.json` and an empty `out/tiles/`, staged in `out.partial` and moved into
    /// place, and returns whether it wrote. An `out` that already holds this plan (same id) is
    /// left as it is, tiles included (planning again is a no-op); another non-empty `out` is
    /// refused unless `force` (which replaces it, tiles included).
    pub fn write(&self, out: &Path, force: bool) -> Result<bool> {
        if !force && Plan::read(out).is_ok_and(|old| old.plan_id == self.plan_id) {
            return Ok(false);
        }
        let staged = crate::io::StagedDir::new(out, force)?;
        crate::io::write_json(&staged.path().join("plan.json"), self)?;
        crate::io::create_dir_all(&staged.path().join("tiles"))?;
        staged.commit()?;
        Ok(true)
    }

    /// Reads and checks `out/plan.json`: format, version, that its id matches its contents (an
    /// edited plan is refused) and that its tiles cover the rows and steps once.
    pub fn read(out: &Path) -> Result<Plan> {
        let path = out.join("plan.json");
        if !path.exists() {
            return Err(Error::format(&path, "no plan here (write one with `pathkernel kernel … --tiles N --out DIR`)"));
        }
        let bytes = crate::io::read_file(&path)?;
        let plan: Plan = serde_json::from_slice(&bytes).map_err(|e| Error::format(&path, format!("not a tile plan: {e}")))?;
        if plan.format != PLAN_FORMAT || plan.version != PLAN_VERSION {
            return Err(Error::format(&path, format!("format {} version {}, expected {PLAN_FORMAT} version {PLAN_VERSION}", plan.format, plan.version)));
        }
        if plan.compute_id() != plan.plan_id {
            return Err(Error::format(&path, format!("plan id {} does not match its contents (edited?); plan again with --force", plan.plan_id)));
        }
        plan.check_cover().map_err(|m| Error::format(&path, m))?;
        Ok(plan)
    }

    fn check_cover(&self) -> std::result::Result<(), String> {
        let (c, s) = (self.col_blocks, self.step_ranges.len());
        if self.tiles.len() != self.row_blocks * c * s || s == 0 || c == 0 {
            return Err(format!("{} tiles for {} row blocks x {c} column blocks x {s} step ranges", self.tiles.len(), self.row_blocks));
        }
        for (i, t) in self.tiles.iter().enumerate() {
            let (b, cb, r) = (i / (c * s), i / s % c, i % s);
            let rows = [b * self.block_rows, ((b + 1) * self.block_rows).min(self.p)];
            let cols = [cb * self.block_cols, ((cb + 1) * self.block_cols).min(self.m)];
            if t.index != i || t.row_block != b || t.col_block != cb || t.step_range != r || t.rows != rows || t.cols != cols || t.steps != self.step_ranges[r] || rows[0] >= rows[1] || cols[0] >= cols[1] {
                return Err(format!("tile {i} does not match the plan's row blocks, column blocks and step ranges"));
            }
        }
        let (lo, hi) = self.request.steps.map_or((0, self.n_steps), |[a, b]| (a, b));
        let chained = self.step_ranges.windows(2).all(|w| w[0][1] == w[1][0]);
        if !chained || self.step_ranges[0][0] != lo || self.step_ranges[s - 1][1] != hi || self.block_rows * self.row_blocks < self.p || self.block_cols * c < self.m {
            return Err("the step ranges, row blocks or column blocks do not cover the request".into());
        }
        Ok(())
    }

    /// The tiles of row block `b`: column block by column block, each in step-range order.
    pub(crate) fn row_block_tiles(&self, b: usize) -> &[TileEntry] {
        let n = self.col_blocks * self.step_ranges.len();
        &self.tiles[b * n..(b + 1) * n]
    }

    /// The tiles of row block `b` and column block `c`, in summation order (step ranges).
    pub(crate) fn block_tiles(&self, b: usize, c: usize) -> &[TileEntry] {
        let s = self.step_ranges.len();
        let i = (b * self.col_blocks + c) * s;
        &self.tiles[i..i + s]
    }

    /// The row points, resolved from the run's dataset and checked against the plan's checksum.
    pub fn points(&self, dataset: &crate::data::Dataset) -> Result<Points> {
        let spec: Rows = self.request.points.parse()?;
        let points = spec.resolve(dataset)?;
        let crc = format!("{:08x}", crc32_f64(&points.x));
        if crc != self.request.points_crc32 || points.len() != self.p {
            return Err(Error::Data(format!(
                "the run's {} points ({} of them, CRC-32 {crc}) are not the plan's ({}, {})",
                self.request.points,
                points.len(),
                self.p,
                self.request.points_crc32
            )));
        }
        Ok(points)
    }

    /// Estimated seconds of all tiles together (when a pilot was run).
    pub fn estimated_seconds(&self) -> Option<f64> {
        self.tiles.iter().map(|t| t.estimated_seconds).sum()
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let max_peak = self.tiles.iter().map(|t| t.estimated_peak_bytes).max().unwrap_or(0);
        let max_out = self.tiles.iter().map(|t| t.output_bytes).max().unwrap_or(0);
        writeln!(
            f,
            "plan {}: {} tiles = {} row blocks ({} points each) x {} column blocks ({} training points each) x {} step ranges of the {} {} Gram [{}] ({} layout), run {}",
            self.plan_id,
            self.tiles.len(),
            self.row_blocks,
            self.block_rows,
            self.col_blocks,
            self.block_cols,
            self.step_ranges.len(),
            self.request.kind,
            self.request.quadrature,
            self.request.layout.shape(self.p, self.m, self.k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
            self.request.layout,
            self.run_id
        )?;
        writeln!(f, "split: {}", self.split)?;
        write!(
            f,
            "per tile: estimated peak <= {:.1} MiB (budget {:.1} MiB), file <= {:.1} MiB; merged output {:.1} MiB",
            mib(max_peak),
            mib(self.memory_budget),
            mib(max_out),
            mib(self.merged_output_bytes)
        )?;
        if let Some(total) = self.estimated_seconds() {
            let max = self.tiles.iter().filter_map(|t| t.estimated_seconds).fold(0.0, f64::max);
            write!(f, "; estimated {total:.2} s in all, {max:.2} s for the longest tile (pilot, rough)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_parses() {
        assert_eq!("6".parse::<Tiling>().unwrap(), Tiling::Count(6));
        assert_eq!("2x3".parse::<Tiling>().unwrap(), Tiling::Grid { rows: 2, cols: 1, steps: 3 });
        assert_eq!("2X1".parse::<Tiling>().unwrap(), Tiling::Grid { rows: 2, cols: 1, steps: 1 });
        assert_eq!("2x4x3".parse::<Tiling>().unwrap(), Tiling::Grid { rows: 2, cols: 4, steps: 3 });
        for t in ["6", "2x3", "2x4x3"] {
            assert_eq!(t.parse::<Tiling>().unwrap().to_string(), t);
        }
        for bad in ["0", "x", "2x0", "-1", "2x", "a", "2x0x1", "1x2x3x4", "2xx3"] {
            assert!(bad.parse::<Tiling>().is_err(), "{bad}");
        }
    }
}
