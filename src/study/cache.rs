//! The study cache: one key per stage, one reuse predicate, one timing ledger.
//!
//! Every stage a study computes (a training run, a Gram, a fit, a setting's predictives) is
//! stored under the study's cache directory (`runs/NAME/` by default) together with the `Key`
//! of everything that determines it:
//! - a training run: the whole [`RunConfig`] (through its run id, the hash of its JSON) and the
//!   trainer revision (`run_key`);
//! - a Gram: the run id, every kernel setting and the kernel output version;
//! - a fit or a predictive: its inputs' keys and its own settings.
//!
//! `reusable` is the one predicate that decides whether a stored stage may be reused: the
//! stamp stored with it equals the key of the inputs now. A stage stored as a directory keeps its
//! stamp in `inputs.key` (`stamp`, written after the stage is complete, so a stage interrupted
//! half way is never reused); a stage stored as one JSON file keeps it in its `key` field
//! (`read_keyed`, the same comparison). The `Clock` records each stage's seconds under
//! `stage#key` in `timings.json`, so that a rerun reports the time each reused stage took when
//! it was computed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io;
use crate::train::{self, fnv1a, RunConfig, TrainOptions};
use crate::trajectory::Run;
use crate::uncertainty::record::StageTiming;

/// The hash of everything that determines a stage (16 hex digits of FNV-1a).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Key(String);

impl Key {
    /// The key of `parts`, joined by the unit separator `U+001F`.
    pub(crate) fn of(parts: &[&str]) -> Key {
        Key::of_bytes(parts.join("\u{1f}").as_bytes())
    }
    /// The key of a byte string.
    pub(crate) fn of_bytes(bytes: &[u8]) -> Key {
        Key(format!("{:016x}", fnv1a(bytes)))
    }
    /// The hex digits.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key of a training run: its whole configuration (the run id is the hash of the config's
/// JSON) and the trainer revision.
pub(crate) fn run_key(rc: &RunConfig) -> Key {
    Key::of(&[&rc.run_id(), &train::created_by()])
}

/// The bytes of `x` (little endian), for keys over arrays of inputs.
pub(crate) fn f64_bytes(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

const STAMP: &str = "inputs.key";

/// The one reuse predicate: whether `dir` holds a complete stage computed from inputs with the
/// key `key` (its stamp, `inputs.key`, equals `key`).
pub(crate) fn reusable(dir: &Path, key: &Key) -> bool {
    std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s.trim() == key.as_str())
}

/// Marks `dir` as the complete stage of inputs `key` (call when everything is written).
pub(crate) fn stamp(dir: &Path, key: &Key) -> Result<()> {
    io::write_atomic(&dir.join(STAMP), key.as_str().as_bytes())
}

/// Removes `dir`'s stamp before its stage is recomputed, so that a computation that fails half
/// way never leaves a directory that an older key would accept.
pub(crate) fn unstamp(dir: &Path) -> Result<()> {
    match std::fs::remove_file(dir.join(STAMP)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(dir, e)),
        _ => Ok(()),
    }
}

/// A cached JSON stage `{ "key": …, … }` at `path`, when its key is `key` (the predicate of
/// [`reusable`] for a stage stored as one file).
pub(crate) fn read_keyed<T: serde::de::DeserializeOwned + Keyed>(path: &Path, key: &Key) -> Option<T> {
    read_json::<T>(path).filter(|c| c.key() == key)
}

/// A cached value that carries its inputs' key.
pub(crate) trait Keyed {
    /// The key it was computed for.
    fn key(&self) -> &Key;
}

/// Training runs written before the stamps existed carry their inputs in the manifest: a run
/// directory without `inputs.key` whose manifest records exactly `rc` (run id, the whole config,
/// the trainer revision) gets its stamp. Any difference leaves it unstamped (and retrained).
fn adopt_run(dir: &Path, rc: &RunConfig, key: &Key) -> Result<()> {
    if dir.join(STAMP).exists() {
        return Ok(());
    }
    if train::holds_run(dir, rc) {
        stamp(dir, key)?;
    }
    Ok(())
}

/// Whether the run directory `dir` holds the run of `rc` (stamped, or adopted: [`adopt_run`]).
pub(crate) fn run_reusable(dir: &Path, rc: &RunConfig) -> Result<bool> {
    let key = run_key(rc);
    adopt_run(dir, rc, &key)?;
    Ok(reusable(dir, &key))
}

/// Trains `rc` into `dir` (replacing what is there) and stamps it.
pub fn train(rc: &RunConfig, dir: &Path, base_dir: &Path, progress: bool) -> Result<Run> {
    unstamp(dir)?;
    train::train_to_dir(rc, dir, &TrainOptions { progress, force: true, base_dir: base_dir.to_path_buf(), memory_budget: None })?;
    stamp(dir, &run_key(rc))?;
    Run::open(dir)
}

/// Trains the runs `jobs` (config, directory) that are not reusable, as many at once as the
/// machine has cores: each records on its own one-thread pool ([`train::train_to_dir`]), so every
/// run is bit for bit the run trained alone.
pub(crate) fn train_group(jobs: &[(RunConfig, PathBuf)], base_dir: &Path) -> Result<Vec<Run>> {
    let mut todo = Vec::new();
    for job in jobs {
        if !run_reusable(&job.1, &job.0)? {
            todo.push(job);
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads.min(todo.len()))
            .map(|_| {
                sc.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((rc, dir)) = todo.get(i) else { break Ok(()) };
                        // No progress bars: several runs share the terminal.
                        if let Err(e) = train(rc, dir, base_dir, false) {
                            break Err(e);
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(Error::Backend("a training thread panicked".into())))).collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    jobs.iter().map(|(_, dir)| Run::open(dir)).collect()
}

// ---------------------------------------------------------------------------------------------
// The timing ledger
// ---------------------------------------------------------------------------------------------

#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    stages: BTreeMap<String, StageTiming>,
}

/// The stages of one study run, in order, with the seconds each took (measured now, or recorded
/// in the ledger `timings.json` when it was computed).
pub(crate) struct Clock {
    path: PathBuf,
    ledger: Ledger,
    /// Each stage of this run and whether it was reused.
    pub order: Vec<(StageTiming, bool)>,
    progress: bool,
}

/// The 1-minute load average (NaN where `/proc/loadavg` is not available).
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(f64::NAN)
}

impl Clock {
    /// The ledger of the cache directory `cache`.
    pub(crate) fn open(cache: &Path, progress: bool) -> Self {
        let path = cache.join("timings.json");
        let ledger = read_json(&path).unwrap_or_default();
        Clock { path, ledger, order: Vec::new(), progress }
    }

    /// A stage line on stderr (with progress on).
    pub(crate) fn say(&self, line: &str) {
        if self.progress {
            eprintln!("[study] {line}");
        }
    }

    /// Whether the ledger holds the stage's time for these inputs.
    pub(crate) fn has(&self, stage: &str, key: &Key) -> bool {
        self.ledger.stages.contains_key(&format!("{stage}#{key}"))
    }

    /// Notes a stage reused from the cache, with the time recorded when it was computed.
    ///
    /// # Panics
    /// If the ledger does not hold it (check with [`Clock::has`]).
    pub(crate) fn reuse(&mut self, stage: &str, key: &Key) {
        let t = self.ledger.stages[&format!("{stage}#{key}")].clone();
        self.say(&format!("{stage}: reused ({:.1} s when computed)", t.seconds));
        self.order.push((t, true));
    }

    /// Runs `f` as the stage `stage` for the inputs `key`, recording its time.
    pub(crate) fn run<T>(&mut self, stage: &str, method: &str, key: &Key, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.say(&format!("{stage} ..."));
        let l0 = load_average();
        let t0 = Instant::now();
        let out = f()?;
        let t = StageTiming { stage: stage.into(), method: method.into(), seconds: t0.elapsed().as_secs_f64(), load: [l0, load_average()] };
        self.say(&format!("{stage}: {:.1} s (load {:.1} -> {:.1})", t.seconds, t.load[0], t.load[1]));
        self.record(stage, key, t)?;
        Ok(out)
    }

    /// Records a stage timed by the caller.
    pub(crate) fn record(&mut self, stage: &str, key: &Key, t: StageTiming) -> Result<()> {
        self.ledger.stages.insert(format!("{stage}#{key}"), t.clone());
        self.order.push((t, false));
        write_json(&self.path, &self.ledger)
    }

    /// The runs `jobs` (config, directory) as one stage: reused when every run is
    /// ([`run_reusable`]) and the ledger holds the stage, else the missing ones trained side by
    /// side ([`train_group`]; the stage's seconds are the group's wall time).
    pub(crate) fn train_group(&mut self, stage: &str, method: &str, jobs: &[(RunConfig, PathBuf)], base_dir: &Path) -> Result<Vec<Run>> {
        let keys: Vec<Key> = jobs.iter().map(|(rc, _)| run_key(rc)).collect();
        let key = Key::of(&keys.iter().map(Key::as_str).collect::<Vec<_>>());
        let mut all = true;
        for (rc, dir) in jobs {
            all &= run_reusable(dir, rc)?;
        }
        if all && self.has(stage, &key) {
            self.reuse(stage, &key);
            return jobs.iter().map(|(_, dir)| Run::open(dir)).collect();
        }
        self.run(stage, method, &key, || train_group(jobs, base_dir))
    }

    /// One run as a stage: reused when [`run_reusable`] and the ledger holds the stage.
    pub(crate) fn train(&mut self, stage: &str, method: &str, rc: &RunConfig, dir: &Path, base_dir: &Path, progress: bool) -> Result<Run> {
        let key = run_key(rc);
        if run_reusable(dir, rc)? && self.has(stage, &key) {
            self.reuse(stage, &key);
            return Run::open(dir);
        }
        self.run(stage, method, &key, || train(rc, dir, base_dir, progress))
    }
}

// ---------------------------------------------------------------------------------------------
// Exact JSON
// ---------------------------------------------------------------------------------------------

/// The cache's JSON files hold every float as its bit pattern (`"f64:<16 hex digits>"`):
/// serde_json's default parser can be one ulp off, and a rerun must reproduce the report bit
/// for bit.
fn exact(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => Value::String(format!("f64:{:016x}", n.as_f64().expect("an f64 number").to_bits())),
        Value::Array(a) => Value::Array(a.into_iter().map(exact).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, exact(v))).collect()),
        other => other,
    }
}

fn inexact(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) if s.starts_with("f64:") => {
            u64::from_str_radix(&s[4..], 16).map_or(Value::String(s), |b| serde_json::Number::from_f64(f64::from_bits(b)).map_or(Value::Null, Value::Number))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(inexact).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, inexact(v))).collect()),
        other => other,
    }
}

/// Writes `value` as cache JSON (floats bit-exact).
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let v = serde_json::to_value(value).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
    io::write_json(path, &exact(v))
}

/// Reads cache JSON written by [`write_json`] (None when absent or unreadable).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    serde_json::from_value(inexact(v)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Key::of(&["a", "b"]), Key::of(&["a", "c"]));
        assert!(!reusable(dir.path(), &a), "nothing stored yet");
        stamp(dir.path(), &a).unwrap();
        assert!(reusable(dir.path(), &a));
        assert!(!reusable(dir.path(), &b));
        // The separator keeps the parts apart.
        assert_ne!(Key::of(&["ab", "c"]), Key::of(&["a", "bc"]));
    }

    #[test]
    fn cache_json_is_bit_exact() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        let v = vec![0.1f64 + 0.2, 1.0 / 3.0, f64::MIN_POSITIVE, -2.5e-300];
        write_json(&p, &v).unwrap();
        let back: Vec<f64> = read_json(&p).unwrap();
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), back.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
}
