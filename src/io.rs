//! Files: atomic writes, safetensors arrays, parquet tables.
//!
//! Every output goes through `write_atomic`: the bytes are written to a temporary file in the
//! destination directory, synced, then renamed over the target, so a reader never sees a
//! half-written file and an interrupted write leaves the previous version intact.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically (temporary file in the same directory, fsync, rename).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// Writes f64 values to `path` as raw little-endian bytes, atomically (as [`write_atomic`]),
/// a block at a time: no copy of the values is held (a study's training Gram is 3.2 GB).
pub(crate) fn write_f64_atomic(path: &Path, values: &[f64]) -> Result<()> {
    write_atomic_with(path, |f| {
        let mut w = std::io::BufWriter::new(f);
        write_le_blocks(&mut w, &mut Vec::new(), values, f64::to_le_bytes)?;
        w.flush()
    })
}

/// The atomic write of [`write_atomic`], the contents written by `fill`.
fn write_atomic_with(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::Config(format!("{} is not a file path", path.display())))?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// Reads `n` f64 values written by [`write_f64_atomic`], a block at a time (errors: another
/// size, I/O).
pub(crate) fn read_f64(path: &Path, n: usize) -> Result<Vec<f64>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if len != 8 * n as u64 {
        return Err(Error::format(path, format!("{len} bytes, expected {} ({n} f64 values)", 8 * n)));
    }
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![0u8; 8 << 20];
    while out.len() < n {
        let take = ((n - out.len()) * 8).min(buf.len());
        f.read_exact(&mut buf[..take]).map_err(|e| Error::io(path, e))?;
        out.extend(buf[..take].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))));
    }
    Ok(out)
}

/// Reads a whole file, naming it in the error.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// Creates a directory and its parents, naming it in the error.
pub fn create_dir_all(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))
}

/// Element data of an array to be stored.
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// 64-bit floats.
    F64(Vec<f64>),
    /// 64-bit signed integers.
    I64(Vec<i64>),
}

impl ArrayData {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            ArrayData::F64(v) => v.len(),
            ArrayData::I64(v) => v.len(),
        }
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A named, shaped array for a safetensors file.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedArray {
    /// Tensor name.
    pub name: String,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Elements, `shape.product()` of them.
    pub data: ArrayData,
}

impl NamedArray {
    /// An f64 array.
    pub fn f64(name: impl Into<String>, shape: Vec<usize>, data: Vec<f64>) -> Self {
        NamedArray { name: name.into(), shape, data: ArrayData::F64(data) }
    }
    /// An i64 array.
    pub fn i64(name: impl Into<String>, shape: Vec<usize>, data: Vec<i64>) -> Self {
        NamedArray { name: name.into(), shape, data: ArrayData::I64(data) }
    }
}

/// Little-endian bytes of 8-byte values, copied in 8-byte chunks (a byte-wise iterator collect
/// took most of the time of writing a Gram).
fn le_bytes<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 8]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() * 8];
    for (dst, &x) in out.chunks_exact_mut(8).zip(v) {
        dst.copy_from_slice(&f(x));
    }
    out
}

/// Serialises arrays (and string metadata) to safetensors bytes, little-endian.
pub(crate) fn safetensors_bytes(arrays: &[NamedArray], metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    let mut raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::with_capacity(arrays.len());
    for a in arrays {
        let n: usize = a.shape.iter().product();
        let (dtype, bytes) = match &a.data {
            ArrayData::F64(v) => (Dtype::F64, le_bytes(v, |x| x.to_le_bytes())),
            ArrayData::I64(v) => (Dtype::I64, le_bytes(v, |x| x.to_le_bytes())),
        };
        let len = a.data.len();
        if len != n {
            return Err(Error::ShapeMismatch { what: format!("array {}", a.name), expected: a.shape.clone(), got: vec![len] });
        }
        raw.push((a.name.clone(), dtype, a.shape.clone(), bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = raw
        .iter()
        .map(|(name, dt, shape, bytes)| {
            TensorView::new(*dt, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Data(format!("safetensors view {name}: {e}")))
        })
        .collect::<Result<_>>()?;
    let bytes = safetensors::serialize(views, &metadata).map_err(|e| Error::Data(format!("safetensors serialisation: {e}")))?;
    Ok(canonical_header(bytes))
}

/// Rewrites a safetensors header with every JSON object's keys sorted, so that equal contents
/// give byte-identical files (the metadata map's iteration order is random per process). The
/// header keeps its length (a permutation of the same compact JSON), so offsets are unchanged.
fn canonical_header(mut bytes: Vec<u8>) -> Vec<u8> {
    fn sorted(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            other => other,
        }
    }
    if bytes.len() < 8 {
        return bytes;
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    if bytes.len() < 8 + n {
        return bytes;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes[8..8 + n]) else {
        return bytes;
    };
    let s = serde_json::to_string(&sorted(v)).expect("a JSON value serialises");
    if s.len() <= n {
        bytes[8..8 + s.len()].copy_from_slice(s.as_bytes());
        bytes[8 + s.len()..8 + n].iter_mut().for_each(|b| *b = b' ');
    }
    bytes
}

/// Writes arrays to a safetensors file atomically, streamed: the header, then each array's
/// little-endian bytes a block at a time, with no copy of the arrays in memory (a full-layout Gram
/// is 3.2 GB; building the file's bytes first cost two such copies in fresh pages). The bytes are the
/// serialiser's, `safetensors_bytes` (tested).
pub fn write_safetensors(path: &Path, arrays: &[NamedArray], metadata: Option<HashMap<String, String>>) -> Result<()> {
    let (header, order) = safetensors_header(arrays, metadata.as_ref())?;
    write_atomic_with(path, |f| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        let mut bytes = Vec::with_capacity(1 << 20);
        for &i in &order {
            match &arrays[i].data {
                ArrayData::F64(v) => write_le_blocks(&mut w, &mut bytes, v, |x| x.to_le_bytes())?,
                ArrayData::I64(v) => write_le_blocks(&mut w, &mut bytes, v, |x| x.to_le_bytes())?,
            }
        }
        w.flush()
    })
}

/// The little-endian bytes of `v` to `w`, 128 Ki values at a time through `bytes`.
fn write_le_blocks<T: Copy>(w: &mut impl Write, bytes: &mut Vec<u8>, v: &[T], f: impl Fn(T) -> [u8; 8]) -> std::io::Result<()> {
    for chunk in v.chunks(1 << 17) {
        bytes.clear();
        chunk.iter().for_each(|&x| bytes.extend_from_slice(&f(x)));
        w.write_all(bytes)?;
    }
    Ok(())
}

/// The canonical safetensors header of `arrays` (as [`safetensors_bytes`] writes it: compact JSON
/// with every object's keys sorted, padded with spaces to a multiple of 8 bytes) and the arrays'
/// order in the file (safetensors' own: by dtype, descending, then by name).
fn safetensors_header(arrays: &[NamedArray], metadata: Option<&HashMap<String, String>>) -> Result<(Vec<u8>, Vec<usize>)> {
    use serde_json::{json, Map, Value};
    let dtype = |a: &NamedArray| match a.data {
        ArrayData::F64(_) => Dtype::F64,
        ArrayData::I64(_) => Dtype::I64,
    };
    let mut order: Vec<usize> = (0..arrays.len()).collect();
    order.sort_by(|&l, &r| dtype(&arrays[r]).cmp(&dtype(&arrays[l])).then(arrays[l].name.cmp(&arrays[r].name)));
    let mut entries: Vec<(String, Value)> = Vec::with_capacity(arrays.len() + 1);
    if let Some(m) = metadata {
        let mut kv: Vec<(&String, &String)> = m.iter().collect();
        kv.sort();
        entries.push(("__metadata__".into(), Value::Object(kv.into_iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<Map<_, _>>())));
    }
    let mut offset = 0usize;
    for &i in &order {
        let a = &arrays[i];
        let len = a.data.len();
        if len != a.shape.iter().product::<usize>() {
            return Err(Error::ShapeMismatch { what: format!("array {}", a.name), expected: a.shape.clone(), got: vec![len] });
        }
        let name = if dtype(a) == Dtype::F64 { "F64" } else { "I64" };
        entries.push((a.name.clone(), json!({ "data_offsets": [offset, offset + 8 * len], "dtype": name, "shape": a.shape })));
        offset += 8 * len;
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if entries.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(Error::Data("safetensors serialisation: two arrays share a name".into()));
    }
    let mut header = serde_json::to_string(&Value::Object(entries.into_iter().collect::<Map<_, _>>())).map_err(|e| Error::Data(format!("safetensors header: {e}")))?.into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    Ok((header, order))
}

/// A parsed safetensors file held in memory, with typed, validated accessors.
pub struct SafeFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl SafeFile {
    /// Reads and parses the header of `path` (errors name the file and the problem).
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = read_file(path)?;
        Self::from_bytes(path, bytes)
    }

    /// Parses in-memory bytes; `path` is used in messages only.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        SafeTensors::deserialize(&bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
        Ok(SafeFile { path: path.to_path_buf(), bytes })
    }

    fn parsed(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("validated in from_bytes")
    }

    /// The file's string metadata (empty when none).
    pub fn metadata(&self) -> HashMap<String, String> {
        SafeTensors::read_metadata(&self.bytes)
            .ok()
            .and_then(|(_, m)| m.metadata().clone())
            .unwrap_or_default()
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.parsed().names().into_iter().cloned().collect();
        v.sort();
        v
    }

    /// Shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        let st = self.parsed();
        let t = st.tensor(name).map_err(|_| Error::format(&self.path, format!("missing tensor `{name}`")))?;
        Ok(t.shape().to_vec())
    }

    fn view_checked(&self, name: &str, dtype: Dtype, shape: Option<&[usize]>) -> Result<(Vec<usize>, Vec<u8>)> {
        let st = self.parsed();
        let t = st.tensor(name).map_err(|_| Error::format(&self.path, format!("missing tensor `{name}`")))?;
        if t.dtype() != dtype {
            return Err(Error::format(&self.path, format!("tensor `{name}` has dtype {:?}, expected {:?}", t.dtype(), dtype)));
        }
        if let Some(s) = shape {
            if t.shape() != s {
                return Err(Error::format(&self.path, format!("tensor `{name}` has shape {:?}, expected {:?}", t.shape(), s)));
            }
        }
        Ok((t.shape().to_vec(), t.data().to_vec()))
    }

    /// Reads an f64 tensor, checking dtype and (when given) shape.
    pub fn f64(&self, name: &str, shape: Option<&[usize]>) -> Result<(Vec<usize>, Vec<f64>)> {
        let (s, b) = self.view_checked(name, Dtype::F64, shape)?;
        Ok((s, b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()))
    }

    /// Reads an i64 tensor, checking dtype and (when given) shape.
    pub fn i64(&self, name: &str, shape: Option<&[usize]>) -> Result<(Vec<usize>, Vec<i64>)> {
        let (s, b) = self.view_checked(name, Dtype::I64, shape)?;
        Ok((s, b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()))
    }
}

/// A column of a table.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    /// Floats.
    F64(Vec<f64>),
    /// Integers.
    I64(Vec<i64>),
    /// Strings.
    Str(Vec<String>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::F64(v) => v.len(),
            Column::I64(v) => v.len(),
            Column::Str(v) => v.len(),
        }
    }
}

/// A simple column table written as parquet (via polars).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Named columns, all of one length.
    pub columns: Vec<(String, Column)>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Table::default()
    }
    /// Adds a column (builder style).
    pub fn with(mut self, name: &str, col: Column) -> Self {
        self.columns.push((name.to_string(), col));
        self
    }
    /// Number of rows (0 when no columns).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |(_, c)| c.len())
    }

    fn to_polars(&self) -> Result<polars::prelude::DataFrame> {
        use polars::prelude::{DataFrame, NamedFrom, Series};
        let n = self.rows();
        let mut cols: Vec<polars::prelude::Column> = Vec::with_capacity(self.columns.len());
        for (name, c) in &self.columns {
            if c.len() != n {
                return Err(Error::ShapeMismatch { what: format!("table column {name}"), expected: vec![n], got: vec![c.len()] });
            }
            let s = match c {
                Column::F64(v) => Series::new(name.as_str().into(), v.as_slice()),
                Column::I64(v) => Series::new(name.as_str().into(), v.as_slice()),
                Column::Str(v) => Series::new(name.as_str().into(), v.iter().map(String::as_str).collect::<Vec<_>>()),
            };
            cols.push(s.into());
        }
        DataFrame::new(n, cols).map_err(|e| Error::Data(format!("table: {e}")))
    }

    /// Writes the table as parquet, atomically.
    pub(crate) fn write_parquet(&self, path: &Path) -> Result<()> {
        use polars::prelude::ParquetWriter;
        let mut df = self.to_polars()?;
        let mut buf: Vec<u8> = Vec::new();
        ParquetWriter::new(&mut buf)
            .finish(&mut df)
            .map_err(|e| Error::Table { path: path.to_path_buf(), msg: e.to_string() })?;
        write_atomic(path, &buf)
    }

    /// Reads a parquet file written by `Table::write_parquet` (f64, i64 and string columns).
    pub fn read_parquet(path: &Path) -> Result<Table> {
        use polars::prelude::{DataType, ParquetReader, SerReader};
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let df = ParquetReader::new(f)
            .finish()
            .map_err(|e| Error::Table { path: path.to_path_buf(), msg: e.to_string() })?;
        let mut t = Table::new();
        for c in df.columns() {
            let name = c.name().to_string();
            let s = c.as_materialized_series();
            let col = match s.dtype() {
                DataType::Float64 => Column::F64(
                    s.f64().map_err(|e| Error::Table { path: path.into(), msg: e.to_string() })?.iter().map(|v| v.unwrap_or(f64::NAN)).collect(),
                ),
                DataType::Int64 => Column::I64(
                    s.i64().map_err(|e| Error::Table { path: path.into(), msg: e.to_string() })?.iter().map(|v| v.unwrap_or(0)).collect(),
                ),
                DataType::String => Column::Str(
                    s.str().map_err(|e| Error::Table { path: path.into(), msg: e.to_string() })?.iter().map(|v| v.unwrap_or("").to_string()).collect(),
                ),
                other => return Err(Error::Table { path: path.into(), msg: format!("column {name} has unsupported type {other}") }),
            };
            t.columns.push((name, col));
        }
        Ok(t)
    }

    /// The f64 column `name`.
    pub fn f64(&self, name: &str) -> Option<&[f64]> {
        self.columns.iter().find(|(n, _)| n == name).and_then(|(_, c)| match c {
            Column::F64(v) => Some(v.as_slice()),
            _ => None,
        })
    }
    /// The i64 column `name`.
    pub fn i64(&self, name: &str) -> Option<&[i64]> {
        self.columns.iter().find(|(n, _)| n == name).and_then(|(_, c)| match c {
            Column::I64(v) => Some(v.as_slice()),
            _ => None,
        })
    }
    /// The string column `name`.
    pub fn str(&self, name: &str) -> Option<&[String]> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, c)| match c {
                Column::Str(v) => Some(v.as_slice()),
                _ => None,
            })
    }
}

/// Writes pretty JSON atomically.
pub(crate) fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut s = serde_json::to_string_pretty(value).map_err(|e| Error::Data(format!("json: {e}")))?;
    s.push('\n');
    write_atomic(path, s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_round_trip_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.safetensors");
        let mut meta = HashMap::new();
        meta.insert("run_id".to_string(), "abc".to_string());
        write_safetensors(
            &p,
            &[NamedArray::f64("w", vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]), NamedArray::i64("y", vec![2], vec![7, -1])],
            Some(meta),
        )
        .unwrap();
        let f = SafeFile::open(&p).unwrap();
        assert_eq!(f.names(), vec!["w", "y"]);
        assert_eq!(f.metadata()["run_id"], "abc");
        assert_eq!(f.f64("w", Some(&[2, 3])).unwrap().1[5], -6.5);
        assert_eq!(f.i64("y", None).unwrap().1, vec![7, -1]);
        assert!(f.f64("w", Some(&[3, 2])).unwrap_err().to_string().contains("shape"));
        assert!(f.f64("y", None).unwrap_err().to_string().contains("dtype"));
        assert!(f.f64("z", None).unwrap_err().to_string().contains("missing tensor"));
        // garbled header
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[10] = b'#';
        std::fs::write(&p, &bytes).unwrap();
        assert!(SafeFile::open(&p).is_err());
        // byte-identical for equal contents, whatever the metadata map's order
        let again = dir.path().join("b.safetensors");
        let mut meta2 = HashMap::new();
        for i in 0..20 {
            meta2.insert(format!("k{i}"), i.to_string());
        }
        let arr = [NamedArray::f64("w", vec![2], vec![1.0, 2.0]), NamedArray::f64("a", vec![1], vec![3.0])];
        let b1 = safetensors_bytes(&arr, Some(meta2.clone())).unwrap();
        let b2 = safetensors_bytes(&arr, Some(meta2.into_iter().collect::<Vec<_>>().into_iter().rev().collect())).unwrap();
        assert_eq!(b1, b2);
        std::fs::write(&again, &b1).unwrap();
        assert_eq!(SafeFile::open(&again).unwrap().metadata()["k7"], "7");
        std::fs::remove_file(&again).unwrap();
        // no temp files left behind
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1);
    }

    /// The streamed writer writes the serialiser's bytes: arrays in any order, both dtypes,
    /// empty and scalar shapes, with and without metadata (empty or not), more than one block.
    #[test]
    fn streamed_safetensors_are_the_serialiser_s_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.safetensors");
        let big: Vec<f64> = (0..300_001).map(|i| (i as f64).sin() * 1e3).collect();
        let sets = [
            vec![NamedArray::f64("w", vec![2], vec![1.0, -2.5]), NamedArray::i64("labels", vec![3], vec![3, -1, 7]), NamedArray::f64("a", vec![1, 1], vec![3.0])],
            vec![NamedArray::f64("gram", vec![300_001], big), NamedArray::i64("z", vec![0], vec![]), NamedArray::f64("b", vec![], vec![0.5])],
            vec![NamedArray::i64("k", vec![2, 2], vec![1, 2, 3, 4]), NamedArray::i64("j", vec![1], vec![9])],
        ];
        let mut meta = HashMap::new();
        meta.insert("key".to_string(), "c413d3f7766d8b5d".to_string());
        meta.insert("a \"quoted\" note".to_string(), "ünïcode, [1, 2]".to_string());
        for arrays in &sets {
            for m in [None, Some(HashMap::new()), Some(meta.clone())] {
                write_safetensors(&p, arrays, m.clone()).unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), safetensors_bytes(arrays, m).unwrap(), "{:?}", arrays.iter().map(|a| &a.name).collect::<Vec<_>>());
            }
        }
        // No arrays: safetensors 0.4.5 writes `{},"__metadata__":{…}}` there, not JSON; the
        // streamed header is JSON, and reads back.
        write_safetensors(&p, &[], Some(meta.clone())).unwrap();
        assert_eq!(SafeFile::open(&p).unwrap().metadata()["key"], "c413d3f7766d8b5d");
        let bad = [NamedArray::f64("w", vec![3], vec![1.0])];
        assert!(write_safetensors(&p, &bad, None).is_err());
    }

    #[test]
    fn parquet_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        let t = Table::new()
            .with("step", Column::I64(vec![0, 1, 2]))
            .with("loss", Column::F64(vec![1.5, 0.5, 0.25]))
            .with("name", Column::Str(vec!["a".into(), "b".into(), "c".into()]));
        t.write_parquet(&p).unwrap();
        let r = Table::read_parquet(&p).unwrap();
        assert_eq!(r, t);
        let bad = Table::new().with("a", Column::I64(vec![1])).with("b", Column::I64(vec![1, 2]));
        assert!(bad.write_parquet(&dir.path().join("bad.parquet")).is_err());
        assert!(!dir.path().join("bad.parquet").exists());
    }
}

/// An output directory written in a staging sibling (`OUT.partial`) and moved into place only
/// when complete, so `OUT` never holds a partial result.
pub(crate) struct StagedDir {
    out: PathBuf,
    staging: PathBuf,
}

impl StagedDir {
    /// Prepares staging for `out`. An existing non-empty `out` is an error unless `force`.
    pub(crate) fn new(out: &Path, force: bool) -> Result<Self> {
        if out.exists() && !force {
            let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
            if !empty {
                return Err(Error::Config(format!("{} already exists; choose another --out or pass --force", out.display())));
            }
        }
        let mut s = out.as_os_str().to_owned();
        s.push(".partial");
        let staging = PathBuf::from(s);
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
        }
        create_dir_all(&staging)?;
        Ok(StagedDir { out: out.to_path_buf(), staging })
    }
    /// Where files are written until [`StagedDir::commit`].
    pub(crate) fn path(&self) -> &Path {
        &self.staging
    }
    /// Moves the staged directory to its final place (replacing an old one).
    pub(crate) fn commit(self) -> Result<PathBuf> {
        if self.out.exists() {
            std::fs::remove_dir_all(&self.out).map_err(|e| Error::io(&self.out, e))?;
        }
        std::fs::rename(&self.staging, &self.out).map_err(|e| Error::io(&self.out, e))?;
        let out = self.out.clone();
        std::mem::forget(self);
        Ok(out)
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        // Not committed: an error happened; leave nothing half-written behind.
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

/// Parses a byte size such as `8G`, `512M`, `100k` or `123456`.
pub(crate) fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1u64 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1u64 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1u64 << 40),
        _ => (t, 1),
    };
    let v: f64 = num.parse().map_err(|_| Error::Config(format!("`{s}` is not a size (e.g. 8G, 512M, 1000000)")))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::Config(format!("`{s}` is not a positive size")));
    }
    Ok((v * mult as f64) as u64)
}
