//! `pathkernel tile run | merge | status | slurm | compare` (plans are written by
//! `pathkernel kernel … --tiles N`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kernel::Request;
use crate::model::Params;
use crate::tile::{self, Plan, RunOutcome, TileProblem, TileState, Tiling};
use crate::trajectory::Run;

/// Compute, merge and schedule the tiles of a tiled kernel job.
#[derive(clap::Args, Debug)]
#[command(long_about = "A tiled kernel job: `pathkernel kernel ... --tiles N --out OUT` writes OUT/plan.json (row blocks x column blocks x step ranges, \
estimated memory and time per tile) and computes nothing; `tile run OUT --index I` computes tile I into OUT/tiles/ (skipped when \
already complete and valid); `tile merge OUT` checks every tile and writes OUT/merged/ exactly as `pathkernel kernel` writes its \
output; `tile slurm OUT [--submit]` writes (and submits) a Slurm job array and the merge job.")]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Compute one tile (or all with --all) and write it atomically.
    Run(RunArgs),
    /// Check every tile and merge them into OUT/merged/.
    Merge(MergeArgs),
    /// Show which tiles are complete, missing or damaged.
    Status(StatusArgs),
    /// Write OUT/slurm/array.sbatch and merge.sbatch; submit them with --submit.
    Slurm(SlurmArgs),
    /// Compare two kernel directories array by array (max relative difference).
    Compare(CompareArgs),
}

/// `tile run`
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The plan directory (written by `pathkernel kernel ... --tiles N --out OUT`).
    out: PathBuf,
    /// The tile to compute (0-based; a Slurm array passes $SLURM_ARRAY_TASK_ID).
    #[arg(long, value_name = "I", required_unless_present = "all", conflicts_with = "all")]
    index: Option<usize>,
    /// Compute every tile not yet complete, one after the other.
    #[arg(long)]
    all: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// `tile merge`
#[derive(clap::Args, Debug)]
struct MergeArgs {
    /// The plan directory.
    out: PathBuf,
    /// Replace an existing OUT/merged (only after the merge succeeded).
    #[arg(long)]
    force: bool,
    /// Memory for the merge (the merged output is held in memory), e.g. 8G.
    #[arg(long, default_value = "8G", value_name = "SIZE")]
    memory: String,
    /// Exit with status 2 when the merged kernel's adaptive rule missed its tolerance (the
    /// merged outputs are still written, for inspection); without it the miss is a warning.
    #[arg(long)]
    strict: bool,
}

/// `tile status`
#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// The plan directory.
    out: PathBuf,
    /// Also verify every tile's checksum (reads all tiles).
    #[arg(long)]
    verify: bool,
}

/// `tile slurm`
#[derive(clap::Args, Debug)]
struct SlurmArgs {
    /// The plan directory.
    out: PathBuf,
    /// Submit with sbatch: the array, then the merge with --dependency=afterok:<array job>.
    #[arg(long)]
    submit: bool,
    /// At most K array tasks at once (--array=0-(N-1)%K).
    #[arg(long, value_name = "K")]
    max_parallel: Option<usize>,
    /// Slurm partition.
    #[arg(long, value_name = "P")]
    partition: Option<String>,
    /// Time limit per task, e.g. 30:00.
    #[arg(long, value_name = "T")]
    time: Option<String>,
    /// Memory per task, e.g. 4G (the plan's estimate is written into the script as a comment).
    #[arg(long, value_name = "M")]
    mem: Option<String>,
    /// Any further #SBATCH option, e.g. --sbatch=--account=proj (repeatable).
    #[arg(long = "sbatch", value_name = "OPTION", allow_hyphen_values = true)]
    extra: Vec<String>,
}

/// `tile compare`
#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// A kernel directory (e.g. OUT/merged).
    a: PathBuf,
    /// The reference kernel directory (e.g. the one-process `pathkernel kernel` output).
    b: PathBuf,
    /// Fail (exit 2) when any array's max |a - b| / max |b| exceeds this.
    #[arg(long, default_value_t = 1e-13)]
    tol: f64,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    match a.command {
        Sub::Run(a) => run(a),
        Sub::Merge(a) => merge(a),
        Sub::Status(a) => status(a),
        Sub::Slurm(a) => slurm(a),
        Sub::Compare(a) => compare(a),
    }
}

/// `pathkernel kernel … --tiles T`: plans the job and writes `OUT/plan.json`.
pub fn plan(run: &Run, states: &[Params], points: &str, req: &Request, budget: u64, tiles: &str, out: &Path, force: bool) -> Result<()> {
    let tiling: Tiling = tiles.parse()?;
    let plan = tile::make_plan(&tile::PlanInput { run, states, points, req, memory_budget: budget, tiling, pilot: true })?;
    let written = plan.write(out, force)?;
    println!("{plan}");
    let n = plan.tiles.len();
    let o = out.display();
    if written {
        println!("wrote {o}/plan.json; next: `pathkernel tile run {o} --index I` for I in 0..{n} (or `tile slurm {o} --submit`), then `pathkernel tile merge {o}`");
    } else {
        println!("{o} already holds this plan: left as it is, with its tiles");
    }
    Ok(())
}

fn bar(quiet: bool, label: &str) -> indicatif::ProgressBar {
    if !quiet && std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(indicatif::ProgressStyle::with_template(&format!("{label} {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]")).expect("valid template"));
        b
    } else {
        indicatif::ProgressBar::hidden()
    }
}

fn run_one(out: &Path, index: usize, quiet: bool) -> Result<()> {
    let b = bar(quiet, &format!("tile {index}"));
    let progress = |done: usize, total: usize| {
        b.set_length(total as u64);
        b.set_position(done as u64);
    };
    let outcome = tile::run_tile(out, index, &progress)?;
    b.finish_and_clear();
    match outcome {
        RunOutcome::AlreadyComplete(p) => println!("tile {index}: already complete ({})", p.display()),
        RunOutcome::Computed { path, seconds, replaced } => {
            if let Some(why) = replaced {
                eprintln!("tile {index}: replaced a damaged file ({why})");
            }
            println!("tile {index}: computed in {seconds:.2} s, wrote {}", path.display());
        }
    }
    Ok(())
}

fn run(a: RunArgs) -> Result<()> {
    match a.index {
        Some(i) => run_one(&a.out, i, a.quiet),
        None => {
            let plan = Plan::read(&a.out)?;
            for i in 0..plan.tiles.len() {
                run_one(&a.out, i, a.quiet)?;
            }
            Ok(())
        }
    }
}

fn merge(a: MergeArgs) -> Result<()> {
    let budget = crate::io::parse_bytes(&a.memory)?;
    let (dir, o) = tile::merge(&a.out, a.force, budget)?;
    println!("{o}");
    println!("wrote {}", dir.display());
    if let Some(miss) = o.inexactness() {
        if a.strict {
            return Err(Error::Numerical(format!("{miss} (--strict; the merged outputs are in {})", dir.display())));
        }
        eprintln!("warning: {miss} (exactness.json; --strict makes this an error)");
    }
    Ok(())
}

fn status(a: StatusArgs) -> Result<()> {
    let plan = Plan::read(&a.out)?;
    println!("{plan}");
    let states = tile::tile_states(&a.out, &plan, a.verify);
    let mut missing = Vec::new();
    let mut bad = 0;
    for (i, s) in states.iter().enumerate() {
        match s {
            TileState::Complete => {}
            TileState::Problem(TileProblem::Missing) => missing.push(i),
            TileState::Problem(p) => {
                bad += 1;
                let why = match p {
                    TileProblem::Damaged(m) | TileProblem::Foreign(m) => m.as_str(),
                    TileProblem::Missing => "",
                };
                println!("tile {i}: {why}");
            }
        }
    }
    let done = states.len() - missing.len() - bad;
    println!(
        "{done} of {} tiles complete{}, {} missing{}, {bad} unusable; merged: {}",
        states.len(),
        if a.verify { " (checksums verified)" } else { "" },
        missing.len(),
        if missing.is_empty() { String::new() } else { format!(" ({})", missing.iter().take(20).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")) },
        if tile::merged_dir(&a.out).join("gram.safetensors").exists() { "yes" } else { "no" }
    );
    Ok(())
}

fn slurm(a: SlurmArgs) -> Result<()> {
    let binary = std::env::current_exe().map_err(|e| Error::Config(format!("cannot find this binary's path: {e}")))?;
    let binary = std::fs::canonicalize(&binary).unwrap_or(binary);
    let opts = tile::SlurmOptions { binary, max_parallel: a.max_parallel, partition: a.partition, time: a.time, mem: a.mem, extra: a.extra };
    let scripts = tile::write_scripts(&a.out, &opts)?;
    println!("wrote {} (--array={}) and {}", scripts.array.display(), scripts.array_spec, scripts.merge.display());
    if a.submit {
        let sub = tile::submit(&a.out, &scripts)?;
        match &sub.array_job {
            Some(id) => println!("submitted array job {id} ({} tasks) and merge job {} (after the array succeeds)", scripts.tasks.len(), sub.merge_job),
            None => println!("every tile is complete: submitted merge job {} only", sub.merge_job),
        }
    }
    Ok(())
}

fn compare(a: CompareArgs) -> Result<()> {
    if a.tol.is_nan() || a.tol < 0.0 {
        return Err(Error::Config(format!("--tol {}: expected a non-negative number", a.tol)));
    }
    let diffs = tile::compare_dirs(&a.a, &a.b)?;
    let mut worst: Option<&tile::ArrayDiff> = None;
    for d in &diffs {
        println!("{:<40} {:>10} values  max |a-b| {:.3e}  scale {:.3e}  relative {:.3e}{}", d.name, d.len, d.max_abs, d.scale, d.rel, if d.identical { "  (bit-identical)" } else { "" });
        // NaN is the worst of all.
        if worst.is_none_or(|w| !w.rel.is_nan() && (d.rel.is_nan() || d.rel > w.rel)) {
            worst = Some(d);
        }
    }
    let all_identical = diffs.iter().all(|d| d.identical);
    match worst {
        Some(w) if w.rel.is_nan() || w.rel > a.tol => Err(Error::Numerical(format!("{} vs {}: {} differs by {:e} relative (tolerance {:e})", a.a.display(), a.b.display(), w.name, w.rel, a.tol))),
        Some(w) => {
            println!("max relative difference {:.3e} ({}) <= {:e}{}", w.rel, w.name, a.tol, if all_identical { "; all arrays bit-identical" } else { "" });
            Ok(())
        }
        None => Err(Error::Data("nothing to compare".into())),
    }
}
