//! The `arrays` kind: named arrays `x_train`, `y_train`, `x_test`, `y_test` (and optionally
//! `x_val`, `y_val`) from a `.safetensors` file, an `.npz` archive or a directory of `.npy` files.
//!
//! ```toml
//! [data]
//! kind = "arrays"
//! path = "data/mine.npz"    # or mine.safetensors, or a directory holding x_train.npy, ...
//! scale = 0.00392156862745098
//! ```
//!
//! `x` is `[n, d]`, or images `[n, H, W]` (one channel) or `[n, C, H, W]`, which keep their
//! `[C, H, W]` shape for the CNN. `y` is `[n]` class labels `0..K` (any integer or float dtype
//! holding non-negative integers), or with `task = "regression"` `[n]` or `[n, K]` targets.
//!
//! With `vocab = V` the rows are sequences of token ids: `x` is `[n, T]`, every entry an integer
//! in `0..V` (any dtype holding exact integers; a token outside the vocabulary is one error naming
//! the array, row and position), read by a stack that starts with an `embedding` of `vocab = V`
//! (`[model] kind = "layers"`); `scale` and `standardize` do not apply to token ids and are
//! refused with it.
//!
//! ```toml
//! [data]
//! kind = "arrays"
//! path = "data/sequences.safetensors"   # x_train [n, T] token ids, y_train [n] labels, ...
//! vocab = 33
//! ```
//!
//! The `.npy` reader is deliberately strict: format versions 1 and 2, C order, and the dtypes
//! `<f8`, `<f4`, `<i8`, `<i4` and `|u1` only. An `.npz` must be uncompressed (`np.savez`, not
//! `np.savez_compressed`): no zip/deflate library is in the dependency tree, so the archive is read
//! by the small stored-entry reader below (with CRC-32 checks) and a compressed entry is refused
//! with a message saying so. Safetensors files may hold `F64`, `F32`, `I64`, `I32` or `U8` tensors.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::prep::{self, check_finite, check_not_empty, labels_from_f64, num_classes, Prep, Task};
use super::{Dataset, Targets};
use crate::error::{Error, Result};

/// The `[data]` keys of `kind = "arrays"` (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArraysConfig {
    /// A `.safetensors` file, an `.npz` archive, or a directory of `.npy` files, relative to the
    /// `base_dir` given to [`super::DataConfig::load`] unless absolute.
    pub path: String,
    /// Classification (default) or regression.
    #[serde(default)]
    pub task: Task,
    /// Multiply every feature by this (e.g. `1/255` for bytes) before standardising.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Z-score features with the training split's statistics (default false).
    #[serde(default)]
    pub standardize: bool,
    /// Keep this many training rows of each class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_class: Option<usize>,
    /// Keep this many training rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_train: Option<usize>,
    /// Choose the kept training rows by a seeded shuffle (default: the first ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset_seed: Option<u64>,
    /// Rows are sequences of token ids in `0..vocab` (`x` `[n, T]`), not features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
}

/// An array read from a file, converted to `f64`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NdArray {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The stored dtype, in numpy's notation (`"<f8"`, `"|u1"`, ...).
    pub dtype: String,
    /// Elements in C (row-major) order. # Shapes `shape`, flattened.
    pub data: Vec<f64>,
}

impl ArraysConfig {
    fn prep(&self) -> Prep {
        Prep {
            scale: self.scale,
            standardize: self.standardize,
            per_class: self.per_class,
            n_train: self.n_train,
            subset_seed: self.subset_seed,
        }
    }

    /// Checks the keys without reading the files.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.path.is_empty() {
            return Err(Error::Config("data.path must not be empty".into()));
        }
        if self.per_class.is_some() && self.task == Task::Regression {
            return Err(Error::Config("data.per_class needs task = \"classification\"".into()));
        }
        if let Some(v) = self.vocab {
            if v == 0 {
                return Err(Error::Config("data.vocab must be at least 1".into()));
            }
            if self.scale.is_some() || self.standardize {
                return Err(Error::Config("data.scale and data.standardize do not apply to token ids (data.vocab is set): remove them".into()));
            }
        }
        self.prep().validate()
    }

    /// Reads the arrays, checks them, preprocesses them and returns the (unvalidated) dataset.
    pub fn load(&self, base_dir: &Path) -> Result<Dataset> {
        self.validate()?;
        let file = base_dir.join(&self.path);
        let source = Source::open(&file)?;
        let get = |name: &str| source.get(name);
        let need = |name: &str| get(name)?.ok_or_else(|| Error::format(&file, format!("no array `{name}` ({})", source.expect_hint())));
        let (x_train, y_train, x_test, y_test) = (need("x_train")?, need("y_train")?, need("x_test")?, need("y_test")?);
        let val = match (get("x_val")?, get("y_val")?) {
            (Some(x), Some(y)) => Some((x, y)),
            (None, None) => None,
            (Some(_), None) => return Err(Error::format(&file, "x_val is present but y_val is not")),
            (None, Some(_)) => return Err(Error::format(&file, "y_val is present but x_val is not")),
        };
        // Row shape shared by every x.
        let row = row_shape(&x_train, "x_train", &file)?;
        if let (Some(v), false) = (self.vocab, row.len() == 1) {
            return Err(Error::format(&file, format!("x_train has shape {:?}; with data.vocab = {v} the rows are token sequences [n, T]", x_train.shape)));
        }
        let image_shape = match row.as_slice() {
            _ if self.vocab.is_some() => None,
            [h, w] => Some([1, *h, *w]),
            [c, h, w] => Some([*c, *h, *w]),
            _ => None,
        };
        let dim: usize = row.iter().product();
        let mut splits = vec![("train", x_train, y_train), ("test", x_test, y_test)];
        if let Some((x, y)) = val {
            splits.push(("val", x, y));
        }
        let mut parts: Vec<(Vec<f64>, Vec<f64>, usize)> = Vec::new(); // (x, y, y columns)
        for (split, x, y) in splits {
            let xr = row_shape(&x, &format!("x_{split}"), &file)?;
            if xr != row {
                return Err(Error::format(&file, format!("x_{split} rows have shape {xr:?} but x_train rows have {row:?}")));
            }
            let n = x.shape[0];
            check_not_empty(n, &file, split)?;
            let ky = match (y.shape.as_slice(), self.task) {
                ([m], _) if *m == n => 1,
                ([m, k], Task::Regression) if *m == n && *k >= 1 => *k,
                ([m] | [m, _], _) if *m != n => {
                    return Err(Error::format(&file, format!("x_{split} has {n} rows but y_{split} has {m} (shapes {:?} and {:?})", x.shape, y.shape)))
                }
                (s, Task::Classification) => {
                    return Err(Error::format(&file, format!("y_{split} has shape {s:?}; class labels must be 1-D [{n}] (for [n, K] targets set task = \"regression\")")))
                }
                (s, Task::Regression) => return Err(Error::format(&file, format!("y_{split} has shape {s:?}; targets must be [{n}] or [{n}, K]"))),
            };
            check_finite(&x.data, dim, |j| format!("{j} ({})", index_in(&row, j)), &file, &format!("x_{split}"))?;
            if let Some(v) = self.vocab {
                check_tokens(&x.data, dim, v, &file, &format!("x_{split}"))?;
            }
            parts.push((x.data, y.data, ky));
        }
        let kys: Vec<usize> = parts.iter().map(|p| p.2).collect();
        if kys.iter().any(|&k| k != kys[0]) {
            return Err(Error::format(&file, format!("the y arrays have different numbers of columns {kys:?}")));
        }
        let split_names = ["train", "test", "val"];
        let (targets, k): (Vec<Targets>, usize) = match self.task {
            Task::Classification => {
                let labels: Vec<Vec<usize>> = parts
                    .iter()
                    .zip(split_names)
                    .map(|(p, s)| labels_from_f64(&p.1, &file, &format!("y_{s}")))
                    .collect::<Result<_>>()?;
                let others: Vec<&[usize]> = labels[1..].iter().map(Vec::as_slice).collect();
                let k = num_classes(&labels[0], &others, &file)?;
                (labels.into_iter().map(Targets::Labels).collect(), k)
            }
            Task::Regression => {
                for (p, s) in parts.iter().zip(split_names) {
                    if let Some(i) = p.1.iter().position(|t| !t.is_finite()) {
                        return Err(Error::format(&file, format!("{} in y_{s} row {} (targets must be finite numbers)", p.1[i], i / p.2)));
                    }
                }
                (parts.iter().map(|p| Targets::Values(p.1.clone())).collect(), kys[0])
            }
        };
        let mut t = targets.into_iter();
        let mut xs = parts.into_iter().map(|p| p.0);
        let train = (xs.next().expect("train"), t.next().expect("train"));
        let test = (xs.next().expect("test"), t.next().expect("test"));
        let val = xs.next().zip(t.next());
        let n = |p: &(Vec<f64>, Targets)| p.0.len() / dim.max(1);
        let name = file.file_stem().map_or("arrays".into(), |s| s.to_string_lossy().to_string());
        let desc = format!(
            "arrays from {} ({}): rows {row:?}, {} {}, {} train, {} val, {} test rows",
            self.path,
            source.kind(),
            k,
            if self.task == Task::Classification { "classes" } else { "targets" },
            n(&train),
            val.as_ref().map_or(0, n),
            n(&test)
        );
        let desc = match self.vocab {
            Some(v) => format!("{desc}; token ids of a vocabulary of {v}"),
            None => desc,
        };
        let mut ds = prep::assemble(name, desc, dim, k, train, val, test);
        ds.image_shape = image_shape;
        ds.vocab = self.vocab;
        self.prep().apply(&mut ds, &file)?;
        Ok(ds)
    }
}

/// Checks that every entry of `x` (rows of `t` tokens) is an integer token id in `0..vocab`;
/// the first one that is not is named by array, row and position.
fn check_tokens(x: &[f64], t: usize, vocab: usize, file: &Path, name: &str) -> Result<()> {
    match x.iter().position(|&v| !(v >= 0.0 && v < vocab as f64 && v.fract() == 0.0)) {
        None => Ok(()),
        Some(i) => Err(Error::format(file, format!("{name}[{}, {}] = {} is not a token id of the vocabulary 0..{vocab} (data.vocab)", i / t, i % t, x[i]))),
    }
}

/// The shape of one row of `x`: `[d]`, `[H, W]` or `[C, H, W]`, none of them zero.
fn row_shape(x: &NdArray, name: &str, file: &Path) -> Result<Vec<usize>> {
    if !(2..=4).contains(&x.shape.len()) || x.shape[1..].contains(&0) {
        return Err(Error::format(file, format!("{name} has shape {:?}; expected [n, d], [n, H, W] or [n, C, H, W]", x.shape)));
    }
    Ok(x.shape[1..].to_vec())
}

/// Multi-index of flat feature `j` in a row of shape `row` (for messages).
fn index_in(row: &[usize], mut j: usize) -> String {
    let mut idx = vec![0; row.len()];
    for (a, &d) in row.iter().enumerate().rev() {
        idx[a] = j % d;
        j /= d;
    }
    format!("{idx:?}")
}

/// Where the arrays come from.
enum Source {
    Dir(std::path::PathBuf),
    Npz { path: std::path::PathBuf, entries: Vec<(String, Vec<u8>)> },
    Safetensors(std::path::PathBuf, Vec<u8>),
}

impl Source {
    fn open(path: &Path) -> Result<Source> {
        if path.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("npz") | Some("safetensors") => {}
            _ if !path.exists() => {
                return Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory")))
            }
            _ => return Err(Error::format(path, "arrays must be a .safetensors file, an .npz archive or a directory of .npy files")),
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        if ext.as_deref() == Some("npz") {
            let entries = read_stored_zip(&bytes, path)?;
            Ok(Source::Npz { path: path.to_path_buf(), entries })
        } else {
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
            Ok(Source::Safetensors(path.to_path_buf(), bytes))
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Source::Dir(_) => "npy directory",
            Source::Npz { .. } => "npz",
            Source::Safetensors(..) => "safetensors",
        }
    }

    fn expect_hint(&self) -> &'static str {
        match self {
            Source::Dir(_) => "expected x_train.npy, y_train.npy, x_test.npy, y_test.npy in the directory",
            Source::Npz { .. } => "expected entries x_train.npy, y_train.npy, x_test.npy, y_test.npy",
            Source::Safetensors(..) => "expected tensors x_train, y_train, x_test, y_test",
        }
    }

    /// Array `name`, or `None` when the source has none by that name.
    fn get(&self, name: &str) -> Result<Option<NdArray>> {
        match self {
            Source::Dir(dir) => {
                let p = dir.join(format!("{name}.npy"));
                if !p.exists() {
                    return Ok(None);
                }
                let bytes = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
                parse_npy(&bytes, &p).map(Some)
            }
            Source::Npz { path, entries } => {
                let want = format!("{name}.npy");
                match entries.iter().find(|(n, _)| *n == want) {
                    None => Ok(None),
                    Some((_, b)) => parse_npy(b, &path.join(&want)).map(Some),
                }
            }
            Source::Safetensors(path, bytes) => {
                let st = safetensors::SafeTensors::deserialize(bytes).expect("validated in open");
                match st.tensor(name) {
                    Err(_) => Ok(None),
                    Ok(t) => safetensor_array(&t, name, path).map(Some),
                }
            }
        }
    }
}

fn safetensor_array(t: &safetensors::tensor::TensorView<'_>, name: &str, path: &Path) -> Result<NdArray> {
    use safetensors::tensor::Dtype;
    let (dtype, data) = match t.dtype() {
        Dtype::F64 => ("<f8", decode(t.data(), "<f8")),
        Dtype::F32 => ("<f4", decode(t.data(), "<f4")),
        Dtype::I64 => ("<i8", decode(t.data(), "<i8")),
        Dtype::I32 => ("<i4", decode(t.data(), "<i4")),
        Dtype::U8 => ("|u1", decode(t.data(), "|u1")),
        other => return Err(Error::format(path, format!("tensor `{name}` has dtype {other:?}; supported: F64, F32, I64, I32, U8"))),
    };
    Ok(NdArray { shape: t.shape().to_vec(), dtype: dtype.into(), data })
}

/// Little-endian elements of a supported dtype to `f64` (`bytes.len()` a multiple of the size).
fn decode(bytes: &[u8], dtype: &str) -> Vec<f64> {
    match dtype {
        "<f8" => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect(),
        "<f4" => bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().expect("4")))).collect(),
        "<i8" => bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8")) as f64).collect(),
        "<i4" => bytes.chunks_exact(4).map(|c| f64::from(i32::from_le_bytes(c.try_into().expect("4")))).collect(),
        "|u1" => bytes.iter().map(|&b| f64::from(b)).collect(),
        _ => unreachable!("dtype checked by the caller"),
    }
}

fn item_size(dtype: &str) -> Option<usize> {
    match dtype {
        "<f8" | "<i8" => Some(8),
        "<f4" | "<i4" => Some(4),
        "|u1" => Some(1),
        _ => None,
    }
}

/// Parses the bytes of an `.npy` file (format versions 1 and 2): the magic `\x93NUMPY`, the
/// version, the header length (`u16` for v1, `u32` for v2, little-endian), a Python dict literal
/// `{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }`, then the data.
///
/// Strict: the dtypes `<f8`, `<f4`, `<i8`, `<i4`, `|u1` only, C order only, and a data length
/// equal to the shape's product times the item size (truncated data and trailing bytes are both
/// errors). Never panics; `path` is used in messages only.
///
/// # Shapes
/// Returns `data` of length `product(shape)`.
pub(crate) fn parse_npy(bytes: &[u8], path: &Path) -> Result<NdArray> {
    let fail = |m: String| Err(Error::format(path, m));
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return fail("not an .npy file (no \\x93NUMPY magic)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        2 => return fail("truncated .npy header".into()),
        _ => return fail(format!(".npy format version {major}.{minor} is not supported (only 1.0 and 2.0)")),
    };
    let Some(header) = bytes.get(start..start.saturating_add(hlen)) else {
        return fail(format!("truncated .npy header: {hlen} bytes announced, {} present", bytes.len() - start));
    };
    let header = std::str::from_utf8(header).map_err(|_| Error::format(path, "the .npy header is not ASCII"))?;
    let dict = parse_header(header).map_err(|m| Error::format(path, format!("bad .npy header {:?}: {m}", header.trim_end())))?;
    let (descr, fortran, shape) = dict;
    let Some(size) = item_size(&descr) else {
        let why = if descr.starts_with('>') { " (big-endian)" } else { "" };
        return fail(format!("unsupported .npy dtype '{descr}'{why}; supported: <f8, <f4, <i8, <i4, |u1"));
    };
    if fortran {
        return fail("Fortran-order .npy arrays are not supported (save a C-contiguous array: np.ascontiguousarray)".into());
    }
    let data = &bytes[start + hlen..];
    let Some(need) = shape.iter().try_fold(size, |a, &d| a.checked_mul(d)) else {
        return fail(format!("shape {shape:?} overflows"));
    };
    if data.len() != need {
        return fail(format!("shape {shape:?} of '{descr}' needs {need} data bytes, found {}", data.len()));
    }
    Ok(NdArray { shape, dtype: descr.clone(), data: decode(data, &descr) })
}

/// Parses `{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }` (keys in any order,
/// optional trailing comma, padding spaces and a final newline).
fn parse_header(h: &str) -> std::result::Result<(String, bool, Vec<usize>), String> {
    let s = h.trim_end_matches(['\n', ' ', '\0']).trim();
    let inner = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')).ok_or("not a dict literal")?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or("expected a quoted key")?;
        let after = after.trim_start().strip_prefix(':').ok_or("expected ':'")?.trim_start();
        rest = match key {
            "descr" => {
                let (v, a) = quoted(after).ok_or("descr must be a quoted string (structured dtypes are not supported)")?;
                descr = Some(v.to_string());
                a
            }
            "fortran_order" => {
                let (v, a) = if let Some(a) = after.strip_prefix("False") {
                    (false, a)
                } else if let Some(a) = after.strip_prefix("True") {
                    (true, a)
                } else {
                    return Err("fortran_order must be True or False".into());
                };
                fortran = Some(v);
                a
            }
            "shape" => {
                let body = after.strip_prefix('(').ok_or("shape must be a tuple")?;
                let close = body.find(')').ok_or("unclosed shape tuple")?;
                let dims = body[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(|t| t.trim_end_matches('L').parse::<usize>().map_err(|_| format!("shape entry '{t}' is not a size")))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                shape = Some(dims);
                &body[close + 1..]
            }
            other => return Err(format!("unexpected key '{other}'")),
        }
        .trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok((descr.ok_or("no 'descr'")?, fortran.ok_or("no 'fortran_order'")?, shape.ok_or("no 'shape'")?))
}

/// `'text'` or `"text"` at the start of `s`: the text and the rest.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let end = s[1..].find(q)?;
    Some((&s[1..1 + end], &s[end + 2..]))
}

/// CRC-32 (IEEE, as zip uses).
fn crc32(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| (0..8).fold(n, |c, _| if c & 1 == 1 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 }))
        .collect();
    !bytes.iter().fold(!0u32, |c, &b| table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

fn le16(b: &[u8], o: usize) -> Option<usize> {
    b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize)
}
fn le32(b: &[u8], o: usize) -> Option<u64> {
    b.get(o..o + 4).map(|s| u64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]])))
}
fn le64(b: &[u8], o: usize) -> Option<u64> {
    b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().expect("8")))
}

/// The entries of a zip archive whose entries are all stored (method 0, as `np.savez` writes
/// them; zip64 size fields, which numpy forces, are understood). Compressed or encrypted entries,
/// multi-disk archives and a bad CRC-32 are errors naming the archive. Never panics.
///
/// Returns `(name, bytes)` per entry, in central-directory order.
pub(crate) fn read_stored_zip(b: &[u8], path: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let bad = |m: &str| Error::format(path, format!("not a readable .npz (zip) archive: {m}"));
    // End of central directory: 22 bytes plus a comment of up to 65 535 bytes.
    let lo = b.len().saturating_sub(22 + 65_535);
    let eocd = (lo..=b.len().saturating_sub(22)).rev().find(|&i| b.len() >= 22 && b[i..i + 4] == [0x50, 0x4b, 0x05, 0x06]).ok_or_else(|| bad("no end-of-central-directory record"))?;
    if le16(b, eocd + 4) != Some(0) || le16(b, eocd + 6) != Some(0) {
        return Err(bad("multi-disk archives are not supported"));
    }
    let count = le16(b, eocd + 10).ok_or_else(|| bad("truncated"))?;
    let cd_off = le32(b, eocd + 16).ok_or_else(|| bad("truncated"))?;
    if count == 0xFFFF || cd_off == 0xFFFF_FFFF {
        return Err(bad("zip64 archives (over 65 535 entries or 4 GiB) are not supported"));
    }
    let mut at = cd_off as usize;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if le32(b, at) != Some(0x0201_4b50) {
            return Err(bad("bad central-directory entry"));
        }
        let field = |o: usize| le16(b, at + o).ok_or_else(|| bad("truncated central directory"));
        let flags = field(8)?;
        let method = field(10)?;
        let crc = le32(b, at + 16).ok_or_else(|| bad("truncated"))? as u32;
        let mut csize = le32(b, at + 20).ok_or_else(|| bad("truncated"))?;
        let mut usize_ = le32(b, at + 24).ok_or_else(|| bad("truncated"))?;
        let (nlen, xlen, clen) = (field(28)?, field(30)?, field(32)?);
        let mut local = le32(b, at + 42).ok_or_else(|| bad("truncated"))?;
        let name_bytes = b.get(at + 46..at + 46 + nlen).ok_or_else(|| bad("truncated entry name"))?;
        let name = String::from_utf8_lossy(name_bytes).to_string();
        // Zip64 extra field (id 1): the 8-byte values of the fields that are 0xFFFFFFFF, in order.
        let extra = b.get(at + 46 + nlen..at + 46 + nlen + xlen).ok_or_else(|| bad("truncated extra field"))?;
        let mut e = 0;
        while e + 4 <= extra.len() {
            let (id, len) = (le16(extra, e).unwrap_or(0), le16(extra, e + 2).unwrap_or(0));
            if id == 1 {
                let mut v = e + 4;
                for f in [&mut usize_, &mut csize, &mut local] {
                    if *f == 0xFFFF_FFFF {
                        *f = le64(extra, v).ok_or_else(|| bad("truncated zip64 field"))?;
                        v += 8;
                    }
                }
            }
            e += 4 + len;
        }
        if flags & 1 != 0 {
            return Err(Error::format(path, format!("entry {name} is encrypted")));
        }
        if method != 0 {
            let how = if method == 8 { "deflate-compressed (np.savez_compressed)" } else { "compressed" };
            return Err(Error::format(
                path,
                format!("entry {name} is {how}; only uncompressed .npz archives are read (save with np.savez, or use a directory of .npy files)"),
            ));
        }
        if csize != usize_ {
            return Err(bad("a stored entry's sizes differ"));
        }
        let l = local as usize;
        if le32(b, l) != Some(0x0403_4b50) {
            return Err(bad("bad local header"));
        }
        let (ln, lx) = (le16(b, l + 26).ok_or_else(|| bad("truncated"))?, le16(b, l + 28).ok_or_else(|| bad("truncated"))?);
        let start = l + 30 + ln + lx;
        let data = start.checked_add(csize as usize).and_then(|end| b.get(start..end)).ok_or_else(|| bad(&format!("entry {name} is truncated")))?;
        if crc32(data) != crc {
            return Err(Error::format(path, format!("entry {name} fails its CRC-32 check (corrupt archive)")));
        }
        out.push((name, data.to_vec()));
        at += 46 + nlen + xlen + clen;
    }
    Ok(out)
}

/// Test helpers that write `.npy` bytes and stored zip archives as numpy does.
#[cfg(test)]
pub(crate) mod write {
    use super::crc32;

    /// `.npy` v1 bytes of `data` (raw little-endian elements) with numpy's header layout (padded
    /// with spaces to a multiple of 64 bytes, ending in a newline).
    pub fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let tuple = if shape.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
        npy_with(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}"), data)
    }

    /// `.npy` v1 bytes with the header dict `dict` (padded as numpy pads it).
    pub fn npy_with(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut h = dict.to_string();
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(data);
        b
    }

    /// `f64` elements as little-endian bytes.
    pub fn f8(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A zip of stored entries with zip64 local extra fields, as numpy's `savez` writes (Python's
    /// zipfile with `force_zip64=True`); `method` 8 marks an entry deflated (its bytes left as
    /// they are) to exercise the refusal.
    pub fn zip(entries: &[(&str, Vec<u8>)], method: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let mut cd = Vec::new();
        for (name, data) in entries {
            let off = out.len() as u32;
            let crc = crc32(data);
            let head = |sig: u32, central: bool| {
                let mut h = sig.to_le_bytes().to_vec();
                if central {
                    h.extend_from_slice(&45u16.to_le_bytes());
                }
                h.extend_from_slice(&45u16.to_le_bytes());
                h.extend_from_slice(&0u16.to_le_bytes());
                h.extend_from_slice(&method.to_le_bytes());
                h.extend_from_slice(&[0; 4]);
                h.extend_from_slice(&crc.to_le_bytes());
                h
            };
            let mut l = head(0x0403_4b50, false);
            l.extend_from_slice(&u32::MAX.to_le_bytes());
            l.extend_from_slice(&u32::MAX.to_le_bytes());
            l.extend_from_slice(&(name.len() as u16).to_le_bytes());
            l.extend_from_slice(&20u16.to_le_bytes());
            l.extend_from_slice(name.as_bytes());
            l.extend_from_slice(&1u16.to_le_bytes());
            l.extend_from_slice(&16u16.to_le_bytes());
            l.extend_from_slice(&(data.len() as u64).to_le_bytes());
            l.extend_from_slice(&(data.len() as u64).to_le_bytes());
            out.extend(l);
            out.extend_from_slice(data);
            let mut c = head(0x0201_4b50, true);
            c.extend_from_slice(&(data.len() as u32).to_le_bytes());
            c.extend_from_slice(&(data.len() as u32).to_le_bytes());
            c.extend_from_slice(&(name.len() as u16).to_le_bytes());
            c.extend_from_slice(&[0; 12]);
            c.extend_from_slice(&off.to_le_bytes());
            c.extend_from_slice(name.as_bytes());
            cd.extend(c);
        }
        let cd_off = out.len() as u32;
        out.extend_from_slice(&cd);
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
        out.extend_from_slice(&cd_off.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::write::*;
    use super::*;
    use crate::data::DataConfig;
    use crate::io::{write_safetensors, NamedArray};
    use rand::{Rng, SeedableRng};

    fn p() -> &'static Path {
        Path::new("a.npy")
    }

    #[test]
    fn npy_dtypes_and_header_forms() {
        let a = parse_npy(&npy("<f8", &[2, 3], &f8(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.5])), p()).unwrap();
        assert_eq!((a.shape.clone(), a.data[5], a.dtype.as_str()), (vec![2, 3], 6.5, "<f8"));
        let f4: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(parse_npy(&npy("<f4", &[2], &f4), p()).unwrap().data, vec![1.5, -2.0]);
        let i8: Vec<u8> = [7i64, -3].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(parse_npy(&npy("<i8", &[2], &i8), p()).unwrap().data, vec![7.0, -3.0]);
        let i4: Vec<u8> = [9i32, 0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(parse_npy(&npy("<i4", &[2, 1], &i4), p()).unwrap().data, vec![9.0, 0.0]);
        assert_eq!(parse_npy(&npy("|u1", &[3], &[0, 128, 255]), p()).unwrap().data, vec![0.0, 128.0, 255.0]);
        // Version 2 header, keys reordered, double quotes, scalar shape.
        let h = "{\"shape\": (), 'fortran_order': False, 'descr': '<f8'}\n";
        let mut b = b"\x93NUMPY\x02\x00".to_vec();
        b.extend_from_slice(&(h.len() as u32).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&f8(&[4.0]));
        let a = parse_npy(&b, p()).unwrap();
        assert_eq!((a.shape.len(), a.data.clone()), (0, vec![4.0]));
    }

    #[test]
    fn npy_refusals() {
        let e = |b: &[u8]| parse_npy(b, p()).unwrap_err().to_string();
        assert!(e(&npy(">f8", &[1], &[0; 8])).contains("'>f8' (big-endian)"));
        assert!(e(&npy("<f2", &[1], &[0; 2])).contains("unsupported .npy dtype '<f2'"));
        assert!(e(&npy("<c16", &[1], &[0; 16])).contains("'<c16'"));
        let f = npy_with("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }", &[0; 32]);
        assert!(e(&f).contains("Fortran-order"), "{}", e(&f));
        let f = npy_with("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (1,), }", &[0; 8]);
        assert!(e(&f).contains("structured dtypes are not supported"), "{}", e(&f));
        let f = npy_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), 'extra': 1}", &[0; 32]);
        assert!(e(&f).contains("unexpected key 'extra'"), "{}", e(&f));
        assert!(e(&npy("<f8", &[2, 2], &[0; 31])).contains("needs 32 data bytes, found 31"));
        assert!(e(&npy("<f8", &[1], &[0; 9])).contains("found 9"));
        assert!(e(b"PK\x03\x04 not npy").contains("no \\x93NUMPY magic"));
        let mut v3 = npy("<f8", &[1], &[0; 8]);
        v3[6] = 3;
        assert!(e(&v3).contains("version 3.0"));
        assert!(e(&npy("<f8", &[1], &[0; 8])[..20]).contains("truncated .npy header"));
        // Random bytes never panic.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let good = npy("<i4", &[2, 2], &[1; 16]);
        for _ in 0..5000 {
            let mut b = good.clone();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            b.truncate(rng.gen_range(0..=b.len()));
            if let Ok(a) = parse_npy(&b, p()) {
                assert_eq!(a.data.len(), a.shape.iter().product::<usize>());
            }
            let _ = read_stored_zip(&b, p());
        }
    }

    #[test]
    fn zip_reader_and_crc() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926, "the standard check value");
        let z = zip(&[("a.npy", vec![1, 2, 3]), ("b.npy", vec![])], 0);
        let e = read_stored_zip(&z, p()).unwrap();
        assert_eq!(e, vec![("a.npy".to_string(), vec![1, 2, 3]), ("b.npy".to_string(), vec![])]);
        let mut corrupt = z.clone();
        let at = corrupt.windows(3).position(|w| w == [1, 2, 3]).unwrap();
        corrupt[at] = 9;
        assert!(read_stored_zip(&corrupt, p()).unwrap_err().to_string().contains("CRC-32"));
        let d = zip(&[("x_train.npy", vec![1])], 8);
        let m = read_stored_zip(&d, Path::new("d.npz")).unwrap_err().to_string();
        assert!(m.starts_with("d.npz: entry x_train.npy is deflate-compressed (np.savez_compressed)"), "{m}");
        assert!(read_stored_zip(b"hello", p()).unwrap_err().to_string().contains("end-of-central-directory"));
        for k in 0..z.len() {
            let _ = read_stored_zip(&z[..k], p());
        }
    }

    /// Token rows (`vocab`): read as given with the vocabulary set, integer dtypes and floats
    /// holding integers alike; a token outside the vocabulary, a fraction, rows that are not
    /// `[n, T]`, and `scale` / `standardize` with it are refused, each naming the place.
    #[test]
    fn token_rows_with_a_vocabulary() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, x_test: Vec<f64>, shape: Vec<usize>| {
            let path = dir.path().join(name);
            let tokens: Vec<i64> = vec![0, 5, 1, 6, 2, 5, 3, 6, 4, 5, 0, 6];
            write_safetensors(
                &path,
                &[
                    NamedArray::i64("x_train", vec![3, 4], tokens),
                    NamedArray::i64("y_train", vec![3], vec![1, 0, 2]),
                    NamedArray::f64("x_test", shape, x_test),
                    NamedArray::i64("y_test", vec![1], vec![2]),
                ],
                None,
            )
            .unwrap();
        };
        let cfg = |name: &str, extra: &str| -> DataConfig { toml::from_str(&format!("kind = \"arrays\"\npath = \"{name}\"\nvocab = 7\n{extra}")).unwrap() };
        write("ok.safetensors", vec![2.0, 5.0, 0.0, 6.0], vec![1, 4]);
        let ds = cfg("ok.safetensors", "").load(dir.path()).unwrap();
        assert_eq!((ds.dim, ds.vocab, ds.image_shape, ds.num_outputs), (4, Some(7), None, 3));
        assert_eq!(ds.x_train, vec![0.0, 5.0, 1.0, 6.0, 2.0, 5.0, 3.0, 6.0, 4.0, 5.0, 0.0, 6.0]);
        assert_eq!(ds.x_test, vec![2.0, 5.0, 0.0, 6.0]);
        write("big.safetensors", vec![2.0, 5.0, 7.0, 6.0], vec![1, 4]);
        let e = cfg("big.safetensors", "").load(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("x_test[0, 2] = 7 is not a token id of the vocabulary 0..7 (data.vocab)"), "{e}");
        write("frac.safetensors", vec![2.0, 5.5, 0.0, 6.0], vec![1, 4]);
        let e = cfg("frac.safetensors", "").load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("x_test[0, 1] = 5.5 is not a token id"), "{e}");
        write("neg.safetensors", vec![-1.0, 5.0, 0.0, 6.0], vec![1, 4]);
        assert!(cfg("neg.safetensors", "").load(dir.path()).unwrap_err().to_string().contains("x_test[0, 0] = -1 is not a token id"));
        write("img.safetensors", vec![2.0, 5.0, 0.0, 6.0], vec![1, 2, 2]);
        let bad: DataConfig = toml::from_str("kind = \"arrays\"\npath = \"img.safetensors\"\nvocab = 7").unwrap();
        let e = bad.load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("x_test rows have shape [2, 2] but x_train rows have [4]"), "{e}");
        assert!(cfg("ok.safetensors", "standardize = true").validate().unwrap_err().to_string().contains("do not apply to token ids"));
        assert!(cfg("ok.safetensors", "scale = 0.5").validate().unwrap_err().to_string().contains("do not apply to token ids"));
        let zero: DataConfig = toml::from_str("kind = \"arrays\"\npath = \"ok.safetensors\"\nvocab = 0").unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("data.vocab must be at least 1"));
        // Without the vocabulary the same file is plain features.
        let plain: DataConfig = toml::from_str("kind = \"arrays\"\npath = \"ok.safetensors\"").unwrap();
        assert_eq!(plain.load(dir.path()).unwrap().vocab, None);
    }

    /// Archives written by CPython's zipfile as numpy's `savez` writes them (zip64 local extra
    /// fields; `tests/data/arrays/make_golden.py`), read back value for value.
    #[test]
    fn golden_npz_from_python_zipfile() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arrays");
        let c: DataConfig = toml::from_str(&format!("kind = \"arrays\"\npath = \"{}\"", dir.join("golden.npz").display())).unwrap();
        let ds = c.load(Path::new(".")).unwrap();
        ds.validate().unwrap();
        assert_eq!(ds.x_train, vec![0.5, -1.0, 2.25, 3.0, -0.125, 8.0, 1e-3, 7.5]);
        assert_eq!(ds.y_train, Targets::Labels(vec![0, 1, 2, 1]));
        assert_eq!(ds.x_test, vec![1.5, -2.0, 0.25, 4.0]);
        assert_eq!(ds.y_test, Targets::Labels(vec![2, 0]));
        assert_eq!((ds.dim, ds.num_outputs, ds.image_shape), (2, 3, None));
        let e = read_stored_zip(&std::fs::read(dir.join("golden_deflated.npz")).unwrap(), Path::new("g.npz")).unwrap_err().to_string();
        assert!(e.contains("deflate-compressed (np.savez_compressed)"), "{e}");
    }

    /// Three classes, images [n, 1, 2, 3] of bytes: row i of split s has every pixel 10 s + i.
    /// `(dtype, name, shape, raw bytes)` of one array.
    type Raw = (&'static str, String, Vec<usize>, Vec<u8>);

    fn image_arrays(n: [usize; 3]) -> Vec<Raw> {
        let mut v = Vec::new();
        for (s, split) in ["train", "test", "val"].iter().enumerate() {
            let x: Vec<u8> = (0..n[s]).flat_map(|i| std::iter::repeat_n((10 * s + i) as u8, 6)).collect();
            let y: Vec<u8> = (0..n[s]).map(|i| (i % 3) as u8).collect();
            v.push(("|u1", format!("x_{split}"), vec![n[s], 1, 2, 3], x));
            v.push(("|u1", format!("y_{split}"), vec![n[s]], y));
        }
        v
    }

    fn check_images(ds: &Dataset) {
        ds.validate().unwrap();
        assert_eq!((ds.dim, ds.image_shape, ds.num_outputs), (6, Some([1, 2, 3]), 3));
        assert_eq!((ds.n_train(), ds.n_test(), ds.n_val()), (6, 3, 3));
        let s = 1.0 / 255.0;
        assert_eq!(ds.x_train[6 * 4], 4.0 * s);
        assert_eq!(ds.x_test[6 * 2 + 5], 12.0 * s);
        assert_eq!(ds.validation.as_ref().unwrap().x[6], 21.0 * s);
        assert_eq!(ds.y_train, Targets::Labels(vec![0, 1, 2, 0, 1, 2]));
    }

    fn cfg(path: &str, extra: &str) -> DataConfig {
        toml::from_str(&format!("kind = \"arrays\"\npath = \"{path}\"\nscale = {:?}\n{extra}", 1.0 / 255.0)).unwrap()
    }

    #[test]
    fn npy_directory_npz_and_safetensors_give_one_dataset() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let arrays = image_arrays([6, 3, 3]);
        std::fs::create_dir(d.join("npy")).unwrap();
        for (dt, name, shape, data) in &arrays {
            std::fs::write(d.join(format!("npy/{name}.npy")), npy(dt, shape, data)).unwrap();
        }
        let a = cfg("npy", "").load(d).unwrap();
        check_images(&a);
        assert!(a.description.contains("npy directory"), "{}", a.description);
        let names: Vec<String> = arrays.iter().map(|a| format!("{}.npy", a.1)).collect();
        let entries: Vec<(&str, Vec<u8>)> = arrays.iter().zip(&names).map(|((dt, _, s, b), n)| (n.as_str(), npy(dt, s, b))).collect();
        std::fs::write(d.join("a.npz"), zip(&entries, 0)).unwrap();
        let b = cfg("a.npz", "").load(d).unwrap();
        check_images(&b);
        let named: Vec<NamedArray> = arrays
            .iter()
            .map(|(_, n, s, b)| NamedArray::f64(n.clone(), s.clone(), b.iter().map(|&v| f64::from(v)).collect()))
            .collect();
        write_safetensors(&d.join("a.safetensors"), &named, None).unwrap();
        let c = cfg("a.safetensors", "").load(d).unwrap();
        check_images(&c);
        assert_eq!((a.x_train == b.x_train, b.x_train == c.x_train, a.y_test == c.y_test), (true, true, true));
        // 3-D x: one channel.
        let dir2 = tempfile::tempdir().unwrap();
        for (dt, name, shape, data) in &arrays {
            let shape = if name.starts_with('x') { vec![shape[0], 2, 3] } else { shape.clone() };
            std::fs::write(dir2.path().join(format!("{name}.npy")), npy(dt, &shape, data)).unwrap();
        }
        let e = cfg(".", "per_class = 1\nstandardize = true").load(dir2.path()).unwrap();
        assert_eq!((e.image_shape, e.n_train()), (Some([1, 2, 3]), 3));
    }

    #[test]
    fn regression_arrays_2d_targets() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (s, n) in [("train", 4), ("test", 2)] {
            let x: Vec<f64> = (0..n * 3).map(|v| v as f64).collect();
            let y: Vec<f64> = (0..n * 2).map(|v| v as f64 * 0.5).collect();
            std::fs::write(d.join(format!("x_{s}.npy")), npy("<f8", &[n, 3], &f8(&x))).unwrap();
            std::fs::write(d.join(format!("y_{s}.npy")), npy("<f8", &[n, 2], &f8(&y))).unwrap();
        }
        let c: DataConfig = toml::from_str("kind = \"arrays\"\npath = \".\"\ntask = \"regression\"").unwrap();
        let ds = c.load(d).unwrap();
        ds.validate().unwrap();
        assert_eq!((ds.dim, ds.num_outputs, ds.image_shape, ds.n_train()), (3, 2, None, 4));
        assert_eq!(ds.y_test, Targets::Values(vec![0.0, 0.5, 1.0, 1.5]));
        // The same [n, 2] targets as class labels are refused.
        let e = toml::from_str::<DataConfig>("kind = \"arrays\"\npath = \".\"").unwrap().load(d).unwrap_err().to_string();
        assert!(e.contains("y_train has shape [4, 2]; class labels must be 1-D"), "{e}");
    }

    #[test]
    fn bad_arrays_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // `edit(name, shape, bytes, dtype)` changes one array before it is written (an emptied
        // shape leaves the file out).
        type Edit<'a> = &'a dyn Fn(&str, &mut Vec<usize>, &mut Vec<u8>, &mut String);
        let write_all = |sub: &str, edit: Edit| {
            let p = d.join(sub);
            std::fs::create_dir_all(&p).unwrap();
            for (dt, name, shape, data) in image_arrays([6, 3, 3]) {
                let (mut shape, mut data, mut dt) = (shape, data, dt.to_string());
                edit(&name, &mut shape, &mut data, &mut dt);
                if !shape.is_empty() {
                    std::fs::write(p.join(format!("{name}.npy")), npy(&dt, &shape, &data)).unwrap();
                }
            }
            cfg(sub, "").load(d).map(|_| ()).unwrap_err().to_string()
        };
        // Missing file / array.
        let e = cfg("nothing.npz", "").load(d).unwrap_err().to_string();
        assert!(e.contains("nothing.npz") && e.contains("No such file"), "{e}");
        let e = write_all("no_y_test", &|n, s, _, _| if n == "y_test" { s.clear() });
        assert!(e.contains("no_y_test: no array `y_test`"), "{e}");
        let e = write_all("half_val", &|n, s, _, _| if n == "y_val" { s.clear() });
        assert!(e.contains("x_val is present but y_val is not"), "{e}");
        // Mismatched lengths.
        let e = write_all("len", &|n, s, data, _| {
            if n == "y_train" {
                s[0] = 5;
                data.truncate(5);
            }
        });
        assert!(e.contains("x_train has 6 rows but y_train has 5"), "{e}");
        let e = write_all("rows", &|n, s, data, _| {
            if n == "x_test" {
                s[3] = 2;
                data.truncate(12);
            }
        });
        assert!(e.contains("x_test rows have shape [1, 2, 2] but x_train rows have [1, 2, 3]"), "{e}");
        // NaN in features.
        let e = write_all("nan", &|n, _, data, dt| {
            if n == "x_train" {
                *dt = "<f8".into();
                let mut v: Vec<f64> = data.iter().map(|&b| f64::from(b)).collect();
                v[8] = f64::NAN;
                *data = f8(&v);
            }
        });
        assert!(e.contains("NaN in feature 2 ([0, 0, 2]) of x_train row 1"), "{e}");
        // Labels that are not classes.
        let e = write_all("frac", &|n, _, data, dt| {
            if n == "y_test" {
                *dt = "<f8".into();
                *data = f8(&[0.0, 1.5, 2.0]);
            }
        });
        assert!(e.contains("y_test row 1 is 1.5, not a class label"), "{e}");
        let e = write_all("neg", &|n, _, data, dt| {
            if n == "y_train" {
                *dt = "<i8".into();
                *data = [0i64, 1, -2, 0, 1, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
            }
        });
        assert!(e.contains("y_train row 2 is -2"), "{e}");
        // An empty split and a class missing from the training split.
        let e = write_all("empty", &|n, s, data, _| {
            if n.ends_with("_val") {
                s[0] = 0;
                data.clear();
            }
        });
        assert!(e.contains("the val split is empty"), "{e}");
        let e = write_all("missing_class", &|n, _, data, _| {
            if n == "y_train" {
                *data = vec![0, 1, 0, 1, 0, 1];
            }
        });
        assert!(e.contains("class 2 has no rows in the training split"), "{e}");
        // Compressed npz.
        let entries: Vec<(&str, Vec<u8>)> = vec![("x_train.npy", npy("|u1", &[1, 1], &[0]))];
        std::fs::write(d.join("c.npz"), zip(&entries, 8)).unwrap();
        let e = cfg("c.npz", "").load(d).unwrap_err().to_string();
        assert!(e.contains("c.npz: entry x_train.npy is deflate-compressed"), "{e}");
        // Unknown extension.
        std::fs::write(d.join("x.h5"), "x").unwrap();
        assert!(cfg("x.h5", "").load(d).unwrap_err().to_string().contains(".safetensors file, an .npz"));
        // A safetensors dtype outside the list.
        let st = safetensors::serialize([("x_train", safetensors::tensor::TensorView::new(safetensors::tensor::Dtype::F16, vec![1, 1], &[0, 0]).unwrap())], &None).unwrap();
        std::fs::write(d.join("h.safetensors"), st).unwrap();
        let e = cfg("h.safetensors", "").load(d).unwrap_err().to_string();
        assert!(e.contains("tensor `x_train` has dtype F16"), "{e}");
    }
}
