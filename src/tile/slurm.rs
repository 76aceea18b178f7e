//! Slurm job arrays for a plan: one array task per tile, and a merge job that runs after the
//! whole array succeeded.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::error::{Error, Result};

use super::exec::{tile_states, TileState};
use super::plan::Plan;

/// What goes into the batch scripts.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlurmOptions {
    /// The pathkernel binary the tasks run (absolute; `tile slurm` uses its own).
    pub binary: PathBuf,
    /// At most this many array tasks at once (`--array=…%K`).
    pub max_parallel: Option<usize>,
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time` (e.g. `30:00`).
    pub time: Option<String>,
    /// `--mem` per task (e.g. `4G`).
    pub mem: Option<String>,
    /// Further `#SBATCH` options, verbatim (e.g. `--account=proj`).
    pub extra: Vec<String>,
}

/// The scripts written.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlurmScripts {
    /// `OUT/slurm/array.sbatch`.
    pub array: PathBuf,
    /// `OUT/slurm/merge.sbatch`.
    pub merge: PathBuf,
    /// The tiles the array runs: those not yet complete (all of them on a fresh plan).
    pub tasks: Vec<usize>,
    /// The `--array` value.
    pub array_spec: String,
}

/// Job ids of a submission.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Submitted {
    /// The array job (`None` when every tile was already complete).
    pub array_job: Option<String>,
    /// The merge job (`--dependency=afterok:<array job>`).
    pub merge_job: String,
}

/// `0-3,5,7-9`: the indices as ranges.
fn ranges(ix: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ix.len() {
        let mut j = i;
        while j + 1 < ix.len() && ix[j + 1] == ix[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { ix[i].to_string() } else { format!("{}-{}", ix[i], ix[j]) });
        i = j + 1;
    }
    parts.join(",")
}

fn check_word(what: &str, v: &str) -> Result<()> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"`$\\;&|<>".contains(c)) {
        return Err(Error::Config(format!("{what} `{v}`: expected one word without quotes, spaces or shell characters")));
    }
    Ok(())
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// Writes `OUT/slurm/array.sbatch` (one task per tile not yet complete; each runs
/// `pathkernel tile run OUT --index $SLURM_ARRAY_TASK_ID`) and `OUT/slurm/merge.sbatch`
/// (`pathkernel tile merge OUT`), and creates `OUT/slurm/logs/` for their output.
pub(crate) fn write_scripts(out: &Path, opts: &SlurmOptions) -> Result<SlurmScripts> {
    let plan = Plan::read(out)?;
    let out = std::fs::canonicalize(out).map_err(|e| Error::io(out, e))?;
    let shown = out.display().to_string();
    if shown.chars().any(|c| c.is_whitespace() || "'\"%".contains(c)) {
        return Err(Error::Config(format!("{shown}: Slurm scripts need a plan directory without spaces, quotes or % in its path")));
    }
    for (what, v) in [("--partition", &opts.partition), ("--time", &opts.time), ("--mem", &opts.mem)] {
        if let Some(v) = v {
            check_word(what, v)?;
        }
    }
    for e in &opts.extra {
        check_word("--sbatch", e)?;
        if !e.starts_with('-') {
            return Err(Error::Config(format!("--sbatch `{e}`: expected an sbatch option such as --account=NAME")));
        }
    }
    if opts.max_parallel == Some(0) {
        return Err(Error::Config("--max-parallel 0: expected at least 1".into()));
    }
    if !opts.binary.is_absolute() {
        return Err(Error::Config(format!("{}: the binary path must be absolute", opts.binary.display())));
    }
    let n = plan.tiles.len();
    let todo: Vec<usize> = tile_states(&out, &plan, false).iter().enumerate().filter(|(_, s)| **s != TileState::Complete).map(|(i, _)| i).collect();
    let tasks = if todo.is_empty() { (0..n).collect() } else { todo.clone() };
    let mut spec = if tasks.len() == n { format!("0-{}", n - 1) } else { ranges(&tasks) };
    if let Some(k) = opts.max_parallel {
        spec.push_str(&format!("%{k}"));
    }
    let dir = out.join("slurm");
    crate::io::create_dir_all(&dir.join("logs"))?;
    let id8 = &plan.plan_id[..8.min(plan.plan_id.len())];
    let mut common = vec!["#SBATCH --ntasks=1".to_string(), format!("#SBATCH --chdir={shown}")];
    if let Some(v) = &opts.partition {
        common.push(format!("#SBATCH --partition={v}"));
    }
    if let Some(v) = &opts.time {
        common.push(format!("#SBATCH --time={v}"));
    }
    if let Some(v) = &opts.mem {
        common.push(format!("#SBATCH --mem={v}"));
    }
    common.extend(opts.extra.iter().map(|e| format!("#SBATCH {e}")));
    let common = common.join("\n");
    let mib = |b: u64| b.div_ceil(1 << 20);
    let peak = plan.tiles.iter().map(|t| t.estimated_peak_bytes).max().unwrap_or(0);
    let longest = plan.tiles.iter().filter_map(|t| t.estimated_seconds).fold(0.0, f64::max);
    let bin = quote(&opts.binary);
    let q_out = quote(&out);
    let array = format!(
        "#!/bin/bash\n\
# pathkernel tiles: plan {id} of {shown}, {n} tiles ({r} row blocks x {s} step ranges).\n\
# One array task per tile; a task whose tile is already complete and valid does nothing.\n\
# Estimated per tile: peak {peak} MiB (pass --mem to request it), longest about {longest:.0} s (pilot).\n\
#SBATCH --job-name=pk-tiles-{id8}\n\
#SBATCH --array={spec}\n\
#SBATCH --output={shown}/slurm/logs/tile-%a.out\n\
{common}\n\
set -eu\n\
exec {bin} tile run {q_out} --index \"$SLURM_ARRAY_TASK_ID\" --quiet\n",
        id = plan.plan_id,
        r = plan.row_blocks,
        s = plan.step_ranges.len(),
        peak = mib(peak),
    );
    let merge = format!(
        "#!/bin/bash\n\
# pathkernel tiles: merge plan {id} of {shown} into {shown}/merged (after the array job succeeded).\n\
# The merged output needs about {merged} MiB in memory.\n\
#SBATCH --job-name=pk-merge-{id8}\n\
#SBATCH --output={shown}/slurm/logs/merge.out\n\
{common}\n\
set -eu\n\
exec {bin} tile merge {q_out}\n",
        id = plan.plan_id,
        merged = mib(plan.merged_output_bytes),
    );
    let array_path = dir.join("array.sbatch");
    let merge_path = dir.join("merge.sbatch");
    crate::io::write_atomic(&array_path, array.as_bytes())?;
    crate::io::write_atomic(&merge_path, merge.as_bytes())?;
    let tasks = if todo.is_empty() { Vec::new() } else { tasks };
    Ok(SlurmScripts { array: array_path, merge: merge_path, tasks, array_spec: spec })
}

fn sbatch(args: &[&str]) -> Result<String> {
    let o = Command::new("sbatch").args(args).output().map_err(|e| Error::Config(format!("cannot run sbatch ({e}); is Slurm installed and on PATH?")))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr).trim().replace('\n', " ");
        return Err(Error::Config(format!("sbatch {} failed ({}): {err}", args.join(" "), o.status)));
    }
    let s = String::from_utf8_lossy(&o.stdout);
    let id = s.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(Error::Config(format!("sbatch {} printed `{}`, not a job id", args.join(" "), s.trim())));
    }
    Ok(id)
}

/// Submits the scripts with `sbatch --parsable`: the array (unless every tile is complete),
/// then the merge with `--dependency=afterok:<array job>` (cancelled if the array fails), and
/// records the ids in `OUT/slurm/jobs.json`.
pub fn submit(out: &Path, scripts: &SlurmScripts) -> Result<Submitted> {
    let array = scripts.array.display().to_string();
    let merge = scripts.merge.display().to_string();
    let array_job = if scripts.tasks.is_empty() { None } else { Some(sbatch(&["--parsable", &array])?) };
    let merge_job = match &array_job {
        Some(id) => sbatch(&["--parsable", &format!("--dependency=afterok:{id}"), "--kill-on-invalid-dep=yes", &merge])?,
        None => sbatch(&["--parsable", &merge])?,
    };
    let sub = Submitted { array_job, merge_job };
    crate::io::write_json(&out.join("slurm").join("jobs.json"), &sub)?;
    Ok(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3]), "0-3");
        assert_eq!(ranges(&[0, 2, 3, 4, 7]), "0,2-4,7");
        assert_eq!(ranges(&[5]), "5");
    }
}
