//! The tile file: a safetensors file whose data section carries a CRC-32, written atomically.
//!
//! The layout is described in the [module docs](super). This file holds the writer (streamed,
//! no copy of the arrays), the reader (length, header, checksum and plan checks, in that order)
//! and the conversion between a tile and the [`KernelOutput`] of its rows and steps.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::SafeFile;
use crate::kernel::{ColumnShare, KernelForm, KernelKind, KernelOutput, Layout, Rule, Side, StepRecord};

use super::crc::{crc32, for_le_chunks, Crc32};
use super::plan::{Plan, TileEntry};

/// Format name in every tile's metadata.
pub(crate) const TILE_FORMAT: &str = "pathkernel-tile";
/// Current tile format version (2: column blocks).
pub(crate) const TILE_VERSION: u32 = 2;

// ---------------------------------------------------------------------------------------------
// Writing.

/// Element data of an array to write: f64 borrowed (the Grams are not copied), i64 owned (small).
enum Data<'a> {
    F64(&'a [f64]),
    I64(Vec<i64>),
}

struct Array<'a> {
    name: String,
    shape: Vec<usize>,
    data: Data<'a>,
}

impl Array<'_> {
    fn bytes(&self) -> usize {
        8 * match &self.data {
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }
    fn each_chunk(&self, f: &mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
        match &self.data {
            Data::F64(v) => for_le_chunks(v, f),
            Data::I64(v) => {
                let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                f(&b)
            }
        }
    }
}

fn f64a<'a>(name: &str, shape: Vec<usize>, v: &'a [f64]) -> Array<'a> {
    Array { name: name.to_string(), shape, data: Data::F64(v) }
}

fn i64a(name: &str, v: Vec<i64>) -> Array<'static> {
    Array { name: name.to_string(), shape: vec![v.len()], data: Data::I64(v) }
}

/// The record fields stored per step (`records.<field>`), f64 ones first.
const RECORD_F64: [&str; 7] = ["max_abs_error", "mean_abs_error", "max_abs_change", "mean_evaluations", "mean_jvp_evaluations", "mean_pieces", "dpk_cosine_error"];
const RECORD_I64: [&str; 3] = ["step", "max_evaluations", "unconverged_pieces"];

fn record_f64(r: &StepRecord, field: &str) -> f64 {
    match field {
        "max_abs_error" => r.max_abs_error,
        "mean_abs_error" => r.mean_abs_error,
        "max_abs_change" => r.max_abs_change,
        "mean_evaluations" => r.mean_evaluations,
        "mean_jvp_evaluations" => r.mean_jvp_evaluations,
        "mean_pieces" => r.mean_pieces,
        "dpk_cosine_error" => r.dpk_cosine_error,
        _ => unreachable!("unknown record field {field}"),
    }
}

fn record_i64(r: &StepRecord, field: &str) -> i64 {
    match field {
        "step" => r.step as i64,
        "max_evaluations" => r.max_evaluations as i64,
        "unconverged_pieces" => r.unconverged_pieces as i64,
        _ => unreachable!("unknown record field {field}"),
    }
}

/// The path of tile `index` in the plan directory `out`.
pub fn tile_path(out: &Path, index: usize) -> PathBuf {
    out.join("tiles").join(format!("tile-{index:06}.safetensors"))
}

/// The rows of `a` `[N, M, K]` a tile stores: the smallest step range that holds the tile's own
/// steps and every non-zero row (momentum runs carry `a` below the requested range).
pub(crate) fn a_support(a: &[f64], mk: usize, steps: [usize; 2]) -> [usize; 2] {
    let n = a.len() / mk.max(1);
    let nonzero = |s: usize| a[s * mk..(s + 1) * mk].iter().any(|v| *v != 0.0);
    let lo = (0..n).find(|&s| nonzero(s)).map_or(steps[0], |s| s.min(steps[0]));
    let hi = (0..n).rev().find(|&s| nonzero(s)).map_or(steps[1], |s| (s + 1).max(steps[1]));
    [lo, hi.min(n).max(lo)]
}

/// Writes the tile `entry` of `plan` from the kernel output of its rows, columns and steps, atomically
/// (a temporary file in `tiles/`, synced, renamed). `with_a`: store `a` (row block 0 only).
pub(crate) fn write_tile(out_dir: &Path, plan: &Plan, entry: &TileEntry, o: &KernelOutput, with_a: bool) -> Result<PathBuf> {
    let (p, m, k) = (o.p, o.m, o.k);
    let mut arrays: Vec<Array<'_>> = vec![
        f64a("gram", o.layout.shape(p, m, k), &o.gram),
        f64a("bias", vec![p, k], &o.bias),
        f64a("network", vec![p, k], &o.network),
        f64a("machine", vec![p, k], &o.machine),
        i64a("steps", o.steps.iter().map(|&s| s as i64).collect()),
    ];
    let seconds = [o.seconds];
    arrays.push(f64a("seconds", vec![1], &seconds));
    if let Some(ps) = &o.per_step {
        let mut shape = vec![ps.len() / o.gram.len().max(1)];
        shape.extend(o.layout.shape(p, m, k));
        arrays.push(f64a("gram_steps", shape, ps));
    }
    if let Some(d) = &o.diag {
        arrays.push(f64a("diag", vec![p, k, k], d));
    }
    if let Some(s) = &o.single_machine {
        arrays.push(f64a("single_machine", vec![p, k], s));
    }
    if let Some(r) = &o.reg {
        arrays.push(f64a("reg", vec![p, k], r));
    }
    if let Some(r) = &o.rounding {
        arrays.push(f64a("rounding", vec![p, k], r));
    }
    if let Some(c) = &o.carried {
        arrays.push(f64a("carried", vec![p, k], c));
    }
    if let Some(c) = &o.columns {
        let s_n = o.records.len();
        if let (Some(pred), Some(actual)) = (&c.step_pred, &c.step_actual) {
            arrays.push(f64a("step_pred", vec![s_n, p, k], pred));
            arrays.push(f64a("step_actual", vec![s_n, p, k], actual));
        }
    }
    let residual;
    if let Some(r) = o.decomposition_residual {
        residual = [r];
        arrays.push(f64a("decomposition_residual", vec![1], &residual));
    }
    let a_range = a_support(&o.a, m * k, entry.steps);
    if with_a {
        arrays.push(f64a("a", vec![a_range[1] - a_range[0], m, k], &o.a[a_range[0] * m * k..a_range[1] * m * k]));
    }
    let rec_f: Vec<Vec<f64>> = RECORD_F64.iter().map(|f| o.records.iter().map(|r| record_f64(r, f)).collect()).collect();
    for (f, v) in RECORD_F64.iter().zip(&rec_f) {
        arrays.push(f64a(&format!("records.{f}"), vec![v.len()], v));
    }
    for f in RECORD_I64 {
        arrays.push(i64a(&format!("records.{f}"), o.records.iter().map(|r| record_i64(r, f)).collect()));
    }
    for a in &arrays {
        let n: usize = a.shape.iter().product();
        if a.bytes() != 8 * n {
            return Err(Error::ShapeMismatch { what: format!("tile array {}", a.name), expected: a.shape.clone(), got: vec![a.bytes() / 8] });
        }
    }
    arrays.sort_by(|x, y| x.name.cmp(&y.name));

    let mut meta: BTreeMap<String, String> = BTreeMap::new();
    meta.insert("format".into(), TILE_FORMAT.into());
    meta.insert("version".into(), TILE_VERSION.to_string());
    meta.insert("plan_id".into(), plan.plan_id.clone());
    meta.insert("run_id".into(), plan.run_id.clone());
    meta.insert("index".into(), entry.index.to_string());
    meta.insert("row_lo".into(), entry.rows[0].to_string());
    meta.insert("row_hi".into(), entry.rows[1].to_string());
    meta.insert("col_lo".into(), entry.cols[0].to_string());
    meta.insert("col_hi".into(), entry.cols[1].to_string());
    meta.insert("step_lo".into(), entry.steps[0].to_string());
    meta.insert("step_hi".into(), entry.steps[1].to_string());
    meta.insert("kind".into(), o.kind.to_string());
    meta.insert("quadrature".into(), o.rule.to_string());
    meta.insert("side".into(), enum_str(&o.side));
    meta.insert("integrated".into(), o.integrated.to_string());
    meta.insert("layout".into(), o.layout.to_string());
    meta.insert("form".into(), o.form.to_string());
    meta.insert("shape".into(), format!("{p},{m},{k}"));
    if with_a {
        meta.insert("a_step_lo".into(), a_range[0].to_string());
    }
    if let Some(c) = &o.columns {
        meta.insert("machine".into(), if c.machine_whole { "whole" } else { "share" }.into());
    }
    let mut crc = Crc32::new();
    for a in &arrays {
        a.each_chunk(&mut |b| {
            crc.update(b);
            Ok(())
        })
        .expect("no error from the checksum");
    }
    meta.insert("crc32".into(), format!("{:08x}", crc.finish()));

    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(&meta).map_err(|e| Error::Data(format!("tile header: {e}")))?);
    let mut offset = 0usize;
    for a in &arrays {
        let dtype = match a.data {
            Data::F64(_) => "F64",
            Data::I64(_) => "I64",
        };
        header.insert(a.name.clone(), serde_json::json!({"dtype": dtype, "shape": a.shape, "data_offsets": [offset, offset + a.bytes()]}));
        offset += a.bytes();
    }
    let mut hbytes = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(|e| Error::Data(format!("tile header: {e}")))?;
    hbytes.resize(hbytes.len().div_ceil(8) * 8, b' ');

    let path = tile_path(out_dir, entry.index);
    let dir = path.parent().expect("tiles/ parent").to_path_buf();
    crate::io::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".tile-{:06}.safetensors.tmp-{}", entry.index, std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let f = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        w.write_all(&(hbytes.len() as u64).to_le_bytes())?;
        w.write_all(&hbytes)?;
        for a in &arrays {
            a.each_chunk(&mut |b| w.write_all(b))?;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&path, e));
    }
    Ok(path)
}

fn enum_str<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

fn enum_from<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

// ---------------------------------------------------------------------------------------------
// Reading and validation.

/// Why a tile file cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum TileProblem {
    /// No file.
    Missing,
    /// Truncated, garbled or failing its checksum: safe to replace.
    Damaged(String),
    /// A valid tile of another plan, run or index: never overwritten silently.
    Foreign(String),
}

impl TileProblem {
    /// The problem as a message about `path`.
    pub fn error(&self, path: &Path, index: usize, out: &Path) -> Error {
        let msg = match self {
            TileProblem::Missing => format!("tile {index} is missing; run `pathkernel tile run {} --index {index}`", out.display()),
            TileProblem::Damaged(m) => format!("{m}; `pathkernel tile run {} --index {index}` recomputes it", out.display()),
            TileProblem::Foreign(m) => m.clone(),
        };
        Error::format(path, msg)
    }
}

/// A tile's header, read without its data.
#[derive(Clone, Debug)]
pub(crate) struct TileHeader {
    /// The `__metadata__` strings.
    pub meta: BTreeMap<String, String>,
    /// Bytes of the header (after the 8-byte length).
    pub header_len: usize,
}

fn parse_header(bytes: &[u8], file_len: u64) -> std::result::Result<TileHeader, TileProblem> {
    let damaged = |m: String| TileProblem::Damaged(m);
    if bytes.len() < 8 {
        return Err(damaged(format!("truncated: {file_len} bytes, not even a header length")));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > 100 << 20 || 8 + n > file_len {
        return Err(damaged(format!("truncated or not a tile: header of {n} bytes in a file of {file_len} bytes")));
    }
    let n = n as usize;
    if bytes.len() < 8 + n {
        return Err(damaged("truncated header".into()));
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).map_err(|e| damaged(format!("garbled header ({e})")))?;
    let obj = v.as_object().ok_or_else(|| damaged("garbled header (not an object)".into()))?;
    let meta: BTreeMap<String, String> = obj
        .get("__metadata__")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .ok_or_else(|| damaged("not a tile (no string metadata)".into()))?;
    let mut data_len = 0usize;
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let end = t.get("data_offsets").and_then(|o| o.get(1)).and_then(|e| e.as_u64()).ok_or_else(|| damaged(format!("garbled header (tensor {name})")))?;
        data_len = data_len.max(end as usize);
    }
    let expected = 8 + n as u64 + data_len as u64;
    if file_len != expected {
        return Err(damaged(format!("truncated or extended: {file_len} bytes, its header describes {expected}")));
    }
    Ok(TileHeader { meta, header_len: n })
}

/// Reads and checks a tile's header only (length, format, plan, run, index, ranges): cheap, for
/// a first pass over many tiles. The checksum is verified by [`read_tile`].
pub(crate) fn read_header(path: &Path, plan: &Plan, entry: &TileEntry) -> std::result::Result<TileHeader, TileProblem> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TileProblem::Missing),
        Err(e) => return Err(TileProblem::Damaged(format!("unreadable ({e})"))),
    };
    let len = f.metadata().map(|m| m.len()).map_err(|e| TileProblem::Damaged(format!("unreadable ({e})")))?;
    let mut head = [0u8; 8];
    if len < 8 || f.read_exact(&mut head).is_err() {
        return Err(TileProblem::Damaged(format!("truncated: {len} bytes")));
    }
    let n = u64::from_le_bytes(head);
    if n > 100 << 20 || 8 + n > len {
        return Err(TileProblem::Damaged(format!("truncated or not a tile: header of {n} bytes in a file of {len} bytes")));
    }
    let mut bytes = vec![0u8; 8 + n as usize];
    bytes[..8].copy_from_slice(&head);
    f.read_exact(&mut bytes[8..]).map_err(|e| TileProblem::Damaged(format!("unreadable header ({e})")))?;
    let h = parse_header(&bytes, len)?;
    check_meta(&h.meta, plan, entry)?;
    Ok(h)
}

fn check_meta(meta: &BTreeMap<String, String>, plan: &Plan, entry: &TileEntry) -> std::result::Result<(), TileProblem> {
    let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("");
    if get("format") != TILE_FORMAT {
        return Err(TileProblem::Damaged(format!("not a tile (format `{}`)", get("format"))));
    }
    if get("version") != TILE_VERSION.to_string() {
        return Err(TileProblem::Foreign(format!("tile format version {} (this pathkernel reads {TILE_VERSION})", get("version"))));
    }
    if get("run_id") != plan.run_id {
        return Err(TileProblem::Foreign(format!("belongs to run {}, not to this plan's run {}", get("run_id"), plan.run_id)));
    }
    if get("plan_id") != plan.plan_id {
        return Err(TileProblem::Foreign(format!("belongs to plan {}, not to this plan {}", get("plan_id"), plan.plan_id)));
    }
    let want = [
        ("index", entry.index.to_string()),
        ("row_lo", entry.rows[0].to_string()),
        ("row_hi", entry.rows[1].to_string()),
        ("col_lo", entry.cols[0].to_string()),
        ("col_hi", entry.cols[1].to_string()),
        ("step_lo", entry.steps[0].to_string()),
        ("step_hi", entry.steps[1].to_string()),
    ];
    for (key, v) in want {
        if get(key) != v {
            return Err(TileProblem::Foreign(format!(
                "is tile {} (rows {}..{}, columns {}..{}, steps {}..{}) of this plan, not tile {} (metadata `{key}` = `{}`)",
                get("index"),
                get("row_lo"),
                get("row_hi"),
                get("col_lo"),
                get("col_hi"),
                get("step_lo"),
                get("step_hi"),
                entry.index,
                get(key)
            )));
        }
    }
    Ok(())
}

/// A tile read back: the kernel output of its rows, columns and steps (`a` empty) and its slice
/// of `a`.
#[derive(Clone, Debug)]
pub struct Tile {
    /// The output of rows `entry.rows` against columns `entry.cols` over steps `entry.steps`
    /// (its `a` is empty; a [`ColumnShare`] when the plan has several column blocks).
    pub out: KernelOutput,
    /// `(first step, a[first step .. first step + len] [len, M_c, K])` in row block 0's tiles.
    pub a: Option<(usize, Vec<f64>)>,
}

/// Reads tile `entry` of `plan` from `path` and checks everything: length, header, checksum of
/// the data, plan, run, index, ranges, the request it was computed for, shapes and dtypes.
pub fn read_tile(path: &Path, plan: &Plan, entry: &TileEntry) -> std::result::Result<Tile, TileProblem> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TileProblem::Missing),
        Err(e) => return Err(TileProblem::Damaged(format!("unreadable ({e})"))),
    };
    let h = parse_header(&bytes, bytes.len() as u64)?;
    check_meta(&h.meta, plan, entry)?;
    let stored = h.meta.get("crc32").cloned().unwrap_or_default();
    let got = format!("{:08x}", crc32(&bytes[8 + h.header_len..]));
    if stored != got {
        return Err(TileProblem::Damaged(format!("corrupted: the data's CRC-32 is {got}, the header says {stored}")));
    }
    decode(path, bytes, &h.meta, plan, entry).map_err(|e| TileProblem::Damaged(format!("inconsistent tile ({e})")))
}

fn decode(path: &Path, bytes: Vec<u8>, meta: &BTreeMap<String, String>, plan: &Plan, entry: &TileEntry) -> Result<Tile> {
    let f = SafeFile::from_bytes(path, bytes)?;
    let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("");
    let bad = |what: &str| Error::format(path, format!("metadata `{what}` = `{}` does not match the plan", get(what)));
    let req = &plan.request;
    let kind: KernelKind = get("kind").parse().map_err(|_| bad("kind"))?;
    let rule: Rule = get("quadrature").parse().map_err(|_| bad("quadrature"))?;
    let side: Side = enum_from(get("side")).ok_or_else(|| bad("side"))?;
    let layout: Layout = get("layout").parse().map_err(|_| bad("layout"))?;
    let form: KernelForm = enum_from(get("form")).ok_or_else(|| bad("form"))?;
    if kind != req.kind {
        return Err(bad("kind"));
    }
    if rule != req.rule()? {
        return Err(bad("quadrature"));
    }
    if side != req.side {
        return Err(bad("side"));
    }
    if layout != req.layout {
        return Err(bad("layout"));
    }
    if form != plan.form {
        return Err(bad("form"));
    }
    let (p, m, k) = (entry.rows[1] - entry.rows[0], entry.cols[1] - entry.cols[0], plan.k);
    if get("shape") != format!("{p},{m},{k}") {
        return Err(bad("shape"));
    }
    let f64s = |name: &str, shape: &[usize]| f.f64(name, Some(shape)).map(|(_, v)| v);
    let opt = |name: &str, shape: &[usize]| -> Result<Option<Vec<f64>>> {
        if f.names().iter().any(|n| n == name) {
            f64s(name, shape).map(Some)
        } else {
            Ok(None)
        }
    };
    let gram = f64s("gram", &layout.shape(p, m, k))?;
    let steps: Vec<usize> = f.i64("steps", None)?.1.into_iter().map(|s| s as usize).collect();
    let per_step = if req.per_step {
        let mut shape = vec![steps.len()];
        shape.extend(layout.shape(p, m, k));
        Some(f64s("gram_steps", &shape)?)
    } else {
        None
    };
    let s_n = f.shape("records.step")?.first().copied().unwrap_or(0);
    let mut records = vec![StepRecord::default(); s_n];
    for field in RECORD_F64 {
        let v = f64s(&format!("records.{field}"), &[s_n])?;
        for (r, x) in records.iter_mut().zip(v) {
            match field {
                "max_abs_error" => r.max_abs_error = x,
                "mean_abs_error" => r.mean_abs_error = x,
                "max_abs_change" => r.max_abs_change = x,
                "mean_evaluations" => r.mean_evaluations = x,
                "mean_jvp_evaluations" => r.mean_jvp_evaluations = x,
                "mean_pieces" => r.mean_pieces = x,
                _ => r.dpk_cosine_error = x,
            }
        }
    }
    for field in RECORD_I64 {
        let (_, v) = f.i64(&format!("records.{field}"), Some(&[s_n]))?;
        for (r, x) in records.iter_mut().zip(v) {
            match field {
                "step" => r.step = x as usize,
                "max_evaluations" => r.max_evaluations = x as usize,
                _ => r.unconverged_pieces = x as usize,
            }
        }
    }
    let a = if f.names().iter().any(|n| n == "a") {
        let lo: usize = get("a_step_lo").parse().map_err(|_| bad("a_step_lo"))?;
        let shape = f.shape("a")?;
        if shape.len() != 3 || shape[1] != m || shape[2] != k || lo + shape[0] > plan.n_steps {
            return Err(Error::format(path, format!("array `a` has shape {shape:?} from step {lo}")));
        }
        Some((lo, f64s("a", &shape)?))
    } else {
        None
    };
    let columns = if plan.col_blocks > 1 {
        let step_pred = opt("step_pred", &[s_n, p, k])?;
        let step_actual = opt("step_actual", &[s_n, p, k])?;
        if step_pred.is_some() != step_actual.is_some() {
            return Err(Error::format(path, "holds only one of step_pred and step_actual"));
        }
        let machine_whole = match get("machine") {
            "whole" => true,
            "share" => false,
            _ => return Err(bad("machine")),
        };
        Some(ColumnShare { range: (entry.cols[0], entry.cols[1]), of: plan.m, machine_whole, step_pred, step_actual })
    } else {
        None
    };
    let out = KernelOutput {
        columns,
        kind,
        rule,
        side,
        integrated: get("integrated") == "true",
        p,
        m,
        k,
        steps,
        layout,
        contraction: Default::default(),
        gram,
        per_step,
        diag: opt("diag", &[p, k, k])?,
        a: Vec::new(),
        bias: f64s("bias", &[p, k])?,
        network: f64s("network", &[p, k])?,
        machine: f64s("machine", &[p, k])?,
        single_machine: opt("single_machine", &[p, k])?,
        records,
        seconds: f64s("seconds", &[1])?[0],
        form,
        reg: opt("reg", &[p, k])?,
        decomposition_residual: opt("decomposition_residual", &[1])?.map(|v| v[0]),
        rounding: opt("rounding", &[p, k])?,
        carried: opt("carried", &[p, k])?,
        layers: None,
    };
    Ok(Tile { out, a })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_support_covers_the_range_and_nonzero_rows() {
        let mk = 2;
        let mut a = vec![0.0; 5 * mk];
        a[2 * mk] = 1.0;
        assert_eq!(a_support(&a, mk, [2, 4]), [2, 4]);
        a[0] = -0.5;
        assert_eq!(a_support(&a, mk, [2, 4]), [0, 4]);
        assert_eq!(a_support(&[0.0; 10], mk, [1, 3]), [1, 3]);
    }
}
