//! IDX files (the MNIST file format): the `idx` kind for any IDX image set, and MNIST, its preset.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{prep, Dataset, Split, Targets};
use crate::error::{Error, Result};

/// Per-channel mean of the MNIST training pixels (after scaling to `[0, 1]`).
pub(crate) const MNIST_MEAN: f64 = 0.1307;
/// Per-channel standard deviation of the MNIST training pixels (after scaling to `[0, 1]`).
pub(crate) const MNIST_STD: f64 = 0.3081;


/// A parsed IDX array (the MNIST file format, <http://yann.lecun.com/exdb/mnist/>) of unsigned bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxArray {
    /// The dimensions, outermost first (e.g. `[60000, 28, 28]`).
    pub dims: Vec<usize>,
    /// The elements in row-major order.
    ///
    /// # Shapes
    /// `dims`, flattened row-major; `data.len()` equals the product of `dims`.
    pub data: Vec<u8>,
}

fn idx_type_name(t: u8) -> Option<&'static str> {
    match t {
        0x08 => Some("unsigned byte"),
        0x09 => Some("signed byte"),
        0x0B => Some("i16"),
        0x0C => Some("i32"),
        0x0D => Some("f32"),
        0x0E => Some("f64"),
        _ => None,
    }
}

/// Parses the bytes of an IDX file. The header is the magic number `0x00 0x00 TYPE NDIMS`
/// followed by `NDIMS` big-endian `u32` dimensions; the data follow, row-major.
///
/// Only element type `0x08` (unsigned byte) is supported; other types are rejected with a clear
/// message. Checks: at least 4 bytes, zero first two magic bytes, `1 <= NDIMS <= 4`, a complete
/// header, no overflow in the product of the dimensions, and a data length equal to that product
/// exactly (truncated data and trailing bytes are both errors). `path` is only used in error
/// messages ([`Error::Format`]). Never panics.
///
/// # Shapes
/// `bytes`: the whole file. Returns `data` of length `product(dims)`.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    let fail = |msg: String| Err(Error::format(path, msg));
    if bytes.is_empty() {
        return fail("empty file (0 bytes), expected an IDX header".into());
    }
    if bytes.len() < 4 {
        return fail(format!(
            "truncated IDX header: file has {} bytes, the magic number alone needs 4",
            bytes.len()
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        let hint = if bytes[0] == 0x1f && bytes[1] == 0x8b {
            " (this looks gzip-compressed; gunzip it first)"
        } else {
            ""
        };
        return fail(format!(
            "bad IDX magic number: first two bytes must be 0x00 0x00, got 0x{:02x} 0x{:02x}{hint}",
            bytes[0], bytes[1]
        ));
    }
    let ty = bytes[2];
    if ty != 0x08 {
        return match idx_type_name(ty) {
            Some(name) => fail(format!(
                "unsupported IDX element type 0x{ty:02x} ({name}); only 0x08 (unsigned byte) is supported"
            )),
            None => fail(format!(
                "unknown IDX element type 0x{ty:02x}; only 0x08 (unsigned byte) is supported"
            )),
        };
    }
    let ndims = bytes[3] as usize;
    if !(1..=4).contains(&ndims) {
        return fail(format!(
            "unsupported number of IDX dimensions {ndims} (expected 1 to 4)"
        ));
    }
    let header_len = 4 + 4 * ndims;
    if bytes.len() < header_len {
        return fail(format!(
            "truncated IDX header: {ndims} dimensions need a {header_len}-byte header, file has {} bytes",
            bytes.len()
        ));
    }
    let mut dims = Vec::with_capacity(ndims);
    for k in 0..ndims {
        let o = 4 + 4 * k;
        let d = u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        match usize::try_from(d) {
            Ok(d) => dims.push(d),
            Err(_) => return fail(format!("IDX dimension {k} = {d} does not fit in usize")),
        }
    }
    let Some(expected) = dims.iter().try_fold(1usize, |a, &b| a.checked_mul(b)) else {
        return fail(format!(
            "IDX dimensions {dims:?} overflow: their product does not fit in usize"
        ));
    };
    let found = bytes.len() - header_len;
    if found < expected {
        return fail(format!(
            "truncated IDX data: dimensions {dims:?} need {expected} data bytes, found {found}"
        ));
    }
    if found > expected {
        return fail(format!(
            "{} trailing bytes after the IDX data: dimensions {dims:?} need {expected} data bytes, found {found}",
            found - expected
        ));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header_len..].to_vec(),
    })
}

/// Reads and parses an IDX file (see [`parse_idx`]).
///
/// # Shapes
/// Returns `data` of length `product(dims)`.
pub(crate) fn read_idx(path: &Path) -> Result<IdxArray> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_idx(&bytes, path)
}

/// Which MNIST file pair to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnistSplit {
    /// The 60 000 training images (`train-images`, `train-labels`).
    Train,
    /// The 10 000 test images (`t10k-images`, `t10k-labels`).
    Test,
}

impl MnistSplit {
    fn prefix(self) -> &'static str {
        match self {
            MnistSplit::Train => "train",
            MnistSplit::Test => "t10k",
        }
    }
}

const FETCH_HINT: &str = "run `bash data/fetch-mnist.sh` to download MNIST";

fn not_found(path: &Path, what: String) -> Error {
    Error::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{what}; {FETCH_HINT}"),
        ),
    )
}

/// Finds `{prefix}-{kind}.{idxN}-ubyte` or `{prefix}-{kind}-{idxN}-ubyte` in `dir`.
fn find_mnist_file(dir: &Path, split: MnistSplit, kind: &str, idx: &str) -> Result<PathBuf> {
    let p = split.prefix();
    let dotted = dir.join(format!("{p}-{kind}.{idx}-ubyte"));
    let dashed = dir.join(format!("{p}-{kind}-{idx}-ubyte"));
    for cand in [&dotted, &dashed] {
        if cand.is_file() {
            return Ok(cand.clone());
        }
    }
    for gz in [
        format!("{p}-{kind}.{idx}-ubyte.gz"),
        format!("{p}-{kind}-{idx}-ubyte.gz"),
    ] {
        let gz = dir.join(gz);
        if gz.is_file() {
            return Err(Error::format(
                &gz,
                format!("MNIST file is gzip-compressed; gunzip it (or {FETCH_HINT})"),
            ));
        }
    }
    Err(not_found(
        &dotted,
        format!("MNIST file not found (also tried {})", dashed.display()),
    ))
}

/// Loads `count` MNIST images and labels of `split`, starting at image `offset`, from the raw IDX
/// files in `dir`. Both file namings are accepted: `train-images.idx3-ubyte` and
/// `train-images-idx3-ubyte` (likewise `train-labels.idx1-ubyte`, `t10k-images.idx3-ubyte`,
/// `t10k-labels.idx1-ubyte`).
///
/// Checks that the images are 3-D `[n, 28, 28]`, the labels 1-D `[n]` with the same `n`, every
/// label is at most 9, and `offset + count <= n`. Pixels map to `(x/255 − 0.1307)/0.3081` when
/// `normalize`, else to `x/255`. A missing directory or file is an [`Error::Io`] (not found) whose
/// message says to run `bash data/fetch-mnist.sh`.
///
/// # Shapes
/// Returns `(x: [count, 784], labels: [count])`, rows in file order.
pub fn load_mnist(
    dir: &Path,
    split: MnistSplit,
    offset: usize,
    count: usize,
    normalize: bool,
) -> Result<(Vec<f64>, Vec<usize>)> {
    let pair = read_mnist_pair(dir, split)?;
    select_range(&pair, offset, count, &Pixels::mnist(normalize))
}

/// How IDX bytes become features: `b/255` (or `b · scale`), then optionally `(v − mean)/std`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pixels {
    /// `None`: `b/255`; `Some(s)`: `b · s`.
    pub scale: Option<f64>,
    /// A fixed `[mean, std]` applied after scaling (MNIST's `[0.1307, 0.3081]`).
    pub normalize: Option<[f64; 2]>,
}

impl Pixels {
    /// MNIST's mapping: `(b/255 − 0.1307)/0.3081` when `normalize`, else `b/255`.
    pub(crate) fn mnist(normalize: bool) -> Self {
        Pixels { scale: None, normalize: normalize.then_some([MNIST_MEAN, MNIST_STD]) }
    }

    /// Pixel byte → `f64`.
    pub(crate) fn map(&self, b: u8) -> f64 {
        let v = match self.scale {
            None => f64::from(b) / 255.0,
            Some(s) => f64::from(b) * s,
        };
        match self.normalize {
            Some([m, s]) => (v - m) / s,
            None => v,
        }
    }

    fn describe(&self) -> String {
        let v = match self.scale {
            None => "x/255".to_string(),
            Some(s) => format!("x*{s}"),
        };
        match self.normalize {
            Some([m, s]) => format!("pixels ({v} - {m})/{s}"),
            None => format!("pixels {v}"),
        }
    }
}

/// A checked image/label pair: images `[n, H, W]`, labels `[n]`, and the image file's path.
pub(crate) struct IdxPair {
    /// The images, `dims = [n, H, W]`.
    pub images: IdxArray,
    /// The labels, `dims = [n]`.
    pub labels: IdxArray,
    /// The image file (for messages).
    pub image_path: PathBuf,
}

impl IdxPair {
    fn pixels_per_image(&self) -> usize {
        self.images.dims[1] * self.images.dims[2]
    }
}

/// Images `offset..offset + count` of a pair, mapped by `pixels`.
///
/// # Shapes
/// Returns `(x: [count, H·W], labels: [count])`.
fn select_range(pair: &IdxPair, offset: usize, count: usize, pixels: &Pixels) -> Result<(Vec<f64>, Vec<usize>)> {
    let n = pair.images.dims[0];
    let end = match offset.checked_add(count) {
        Some(end) if end <= n => end,
        _ => {
            return Err(Error::Data(format!(
                "requested images {offset}..{} but {} holds only {n}",
                offset as u128 + count as u128,
                pair.image_path.display()
            )))
        }
    };
    let px = pair.pixels_per_image();
    let x: Vec<f64> = pair.images.data[offset * px..end * px]
        .iter()
        .map(|&b| pixels.map(b))
        .collect();
    let y: Vec<usize> = pair.labels.data[offset..end]
        .iter()
        .map(|&l| l as usize)
        .collect();
    Ok((x, y))
}

/// Loads consecutive per-digit selections of MNIST `split` from image `offset` on: selection
/// `s` holds, for every digit 0–9, that digit's images number `c_0 + … + c_{s−1}` to
/// `c_0 + … + c_s − 1` (counting that digit's images from `offset` in file order), where
/// `c = counts`. Rows of each selection stay in file order (digits interleaved as in the file).
/// With `counts = [200, 50]` this is "the first 200 images of each digit, and the next 50".
///
/// Files, checks and pixel mapping as in [`load_mnist`]; an [`Error::Data`] names the first
/// digit with too few images after `offset`.
///
/// # Shapes
/// Returns one `(x: [10·c_s, 784], labels: [10·c_s])` per entry of `counts`.
pub fn load_mnist_per_class(
    dir: &Path,
    split: MnistSplit,
    offset: usize,
    counts: &[usize],
    normalize: bool,
) -> Result<Vec<(Vec<f64>, Vec<usize>)>> {
    let pair = read_mnist_pair(dir, split)?;
    select_per_class(&pair, offset, counts, 10, "digit", &Pixels::mnist(normalize))
}

/// The per-class selections of [`load_mnist_per_class`] for `k` classes (`noun` names a class in
/// messages: "digit", "class").
///
/// # Shapes
/// Returns one `(x: [k·c_s, H·W], labels: [k·c_s])` per entry of `counts`.
fn select_per_class(
    pair: &IdxPair,
    offset: usize,
    counts: &[usize],
    k: usize,
    noun: &str,
    pixels: &Pixels,
) -> Result<Vec<(Vec<f64>, Vec<usize>)>> {
    let (images, labels, img_path) = (&pair.images, &pair.labels, &pair.image_path);
    let n = images.dims[0];
    let need = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).ok_or_else(|| {
        Error::Data(format!("per-{noun} counts {counts:?} overflow"))
    })?;
    // Cumulative ends: selection s takes ranks ends[s-1]..ends[s] of each class.
    let ends: Vec<usize> = counts
        .iter()
        .scan(0usize, |a, &c| {
            *a += c;
            Some(*a)
        })
        .collect();
    let px = pair.pixels_per_image();
    let mut out: Vec<(Vec<f64>, Vec<usize>)> = counts
        .iter()
        .map(|&c| (Vec::with_capacity(k * c * px), Vec::with_capacity(k * c)))
        .collect();
    let mut seen = vec![0usize; k];
    for i in offset.min(n)..n {
        let d = labels.data[i] as usize;
        let rank = seen[d];
        if rank >= need {
            if seen.iter().all(|&s| s >= need) {
                break;
            }
            continue;
        }
        seen[d] += 1;
        let s = ends.iter().position(|&e| rank < e).expect("rank < need = last end");
        out[s].0.extend(images.data[i * px..(i + 1) * px].iter().map(|&b| pixels.map(b)));
        out[s].1.push(d);
    }
    if let Some(d) = (0..k).find(|&d| seen[d] < need) {
        return Err(Error::Data(format!(
            "{} holds only {} images of {noun} {d} from image {offset} on; {need} are needed ({counts:?} per {noun})",
            img_path.display(),
            seen[d]
        )));
    }
    Ok(out)
}

/// Reads and checks an MNIST image/label file pair.
fn read_mnist_pair(dir: &Path, split: MnistSplit) -> Result<IdxPair> {
    if !dir.is_dir() {
        return Err(not_found(dir, "MNIST directory not found".into()));
    }
    let img_path = find_mnist_file(dir, split, "images", "idx3")?;
    let lbl_path = find_mnist_file(dir, split, "labels", "idx1")?;
    read_pair(&img_path, &lbl_path, Some([28, 28]), Some(10))
}

/// Reads and checks an image/label file pair: images 3-D `[n, H, W]` (`[n, 28, 28]` when
/// `size = Some([28, 28])`), labels 1-D `[n]` with the same `n`, every label `< k` when given.
pub(crate) fn read_pair(img_path: &Path, lbl_path: &Path, size: Option<[usize; 2]>, k: Option<usize>) -> Result<IdxPair> {
    let images = read_idx(img_path)?;
    let labels = read_idx(lbl_path)?;
    let shape_ok = images.dims.len() == 3 && size.is_none_or(|[h, w]| images.dims[1] == h && images.dims[2] == w);
    if !shape_ok {
        let want = match size {
            Some([h, w]) => format!("[n, {h}, {w}]"),
            None => "[n, H, W]".into(),
        };
        return Err(Error::format(img_path, format!("images must have dimensions {want}, got {:?}", images.dims)));
    }
    if images.dims[1] == 0 || images.dims[2] == 0 {
        return Err(Error::format(img_path, format!("images have an empty dimension: {:?}", images.dims)));
    }
    if labels.dims.len() != 1 {
        return Err(Error::format(lbl_path, format!("labels must have dimensions [n], got {:?}", labels.dims)));
    }
    let n = images.dims[0];
    if labels.dims[0] != n {
        return Err(Error::ShapeMismatch {
            what: format!(
                "label count of {} vs image count of {}",
                lbl_path.display(),
                img_path.display()
            ),
            expected: vec![n],
            got: vec![labels.dims[0]],
        });
    }
    if let Some(k) = k {
        if let Some((i, &l)) = labels.data.iter().enumerate().find(|(_, &l)| l as usize >= k) {
            return Err(Error::format(lbl_path, format!("label {i} is {l}, not a class in 0..{k}")));
        }
    }
    Ok(IdxPair { images, labels, image_path: img_path.to_path_buf() })
}

// ---------------------------------------------------------------------------------------------
// The `idx` kind
// ---------------------------------------------------------------------------------------------

fn default_n_train() -> usize {
    1000
}
fn default_n_test() -> usize {
    200
}

/// The `[data]` keys of `kind = "idx"`: any IDX image set in MNIST's format (Fashion-MNIST,
/// KMNIST, EMNIST digits, ...), given by its four (uncompressed) files.
///
/// ```toml
/// [data]
/// kind = "idx"
/// train_images = "data/fashion/train-images-idx3-ubyte"
/// train_labels = "data/fashion/train-labels-idx1-ubyte"
/// test_images = "data/fashion/t10k-images-idx3-ubyte"
/// test_labels = "data/fashion/t10k-labels-idx1-ubyte"
/// per_class = 100        # as mnist: the first 100 images of each class, file order
/// standardize = true     # or normalize = [mean, std], fixed
/// ```
///
/// Selection is exactly `mnist`'s (which is this kind with MNIST's files, `num_classes = 10`,
/// `image_size = [28, 28]` and `normalize = [0.1307, 0.3081]`): training images
/// `offset..offset + n_train`, or with `per_class` the first `per_class` images of each class
/// from `offset` on (and `val_per_class` more for a validation split); test images
/// `offset..offset + n_test`. Images keep `image_shape = [1, H, W]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdxConfig {
    /// Training images (`[n, H, W]` unsigned bytes), relative to `base_dir` unless absolute.
    pub train_images: String,
    /// Training labels (`[n]` unsigned bytes).
    pub train_labels: String,
    /// Test images.
    pub test_images: String,
    /// Test labels.
    pub test_labels: String,
    /// Number of training images (default 1000).
    #[serde(default = "default_n_train")]
    pub n_train: usize,
    /// Number of test images (default 200).
    #[serde(default = "default_n_test")]
    pub n_test: usize,
    /// Images skipped at the start of both files (default 0).
    #[serde(default)]
    pub offset: usize,
    /// The first `per_class` images of each class from `offset` on, in file order (then
    /// `n_train` must be left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_class: Option<usize>,
    /// With `per_class`: a validation split of the next `val_per_class` images of each class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_per_class: Option<usize>,
    /// `K` (default: one more than the largest label in the two label files, and then every
    /// class must occur in the training selection). Labels `>= K` are errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_classes: Option<usize>,
    /// Required `[H, W]` of the images (default: whatever the file holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_size: Option<[usize; 2]>,
    /// Pixels `x · scale` (default: `x/255`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// After scaling, `(v − mean)/std` with this fixed `[mean, std]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<[f64; 2]>,
    /// Z-score every pixel with the training selection's statistics (default false).
    #[serde(default)]
    pub standardize: bool,
}

impl IdxConfig {
    /// Checks the keys without reading the files.
    pub(crate) fn validate(&self) -> Result<()> {
        let cfg = |m: String| Err(Error::Config(m));
        for (key, v) in [("train_images", &self.train_images), ("train_labels", &self.train_labels), ("test_images", &self.test_images), ("test_labels", &self.test_labels)] {
            if v.is_empty() {
                return cfg(format!("data.{key} must not be empty"));
            }
        }
        if self.n_train == 0 {
            return cfg("data.n_train must be >= 1, got 0".into());
        }
        if self.n_test == 0 {
            return cfg("data.n_test must be >= 1, got 0".into());
        }
        if self.offset.checked_add(self.n_train.max(self.n_test)).is_none() {
            return cfg("data.offset + data.n_train overflows".into());
        }
        match (self.per_class, self.val_per_class) {
            (None, Some(_)) => return cfg("data.val_per_class needs data.per_class".into()),
            (Some(0), _) => return cfg("data.per_class must be >= 1, got 0".into()),
            (Some(_), Some(0)) => return cfg("data.val_per_class must be >= 1, got 0 (leave it out for no validation split)".into()),
            (Some(pc), v) => {
                if self.n_train != default_n_train() {
                    return cfg(format!("data.n_train = {} and data.per_class = {pc} both select the training set; give one of them", self.n_train));
                }
                if pc.checked_add(v.unwrap_or(0)).is_none_or(|t| t > isize::MAX as usize / (8 * 784 * 256)) {
                    return cfg(format!("data.per_class = {pc} (+ val_per_class = {}) is too large", v.unwrap_or(0)));
                }
            }
            (None, None) => {}
        }
        if self.num_classes == Some(0) || self.num_classes.is_some_and(|k| k > 256) {
            return cfg("data.num_classes must be in 1..=256 (labels are bytes)".into());
        }
        if let Some(s) = self.scale {
            if !(s.is_finite() && s != 0.0) {
                return cfg(format!("data.scale = {s}; it must be a finite, non-zero number"));
            }
        }
        if let Some([m, s]) = self.normalize {
            if !(m.is_finite() && s.is_finite() && s > 0.0) {
                return cfg(format!("data.normalize = [{m}, {s}]; it must be [mean, std] with std > 0"));
            }
        }
        Ok(())
    }

    /// Reads the four files (relative to `base_dir`), selects the images and returns the
    /// (unvalidated) dataset.
    ///
    /// # Shapes
    /// `x_train: [M, H·W]`, `image_shape = [1, H, W]`.
    pub fn load(&self, base_dir: &Path) -> Result<Dataset> {
        self.validate()?;
        let train = read_pair(&base_dir.join(&self.train_images), &base_dir.join(&self.train_labels), self.image_size, self.num_classes)?;
        let test = read_pair(&base_dir.join(&self.test_images), &base_dir.join(&self.test_labels), self.image_size, self.num_classes)?;
        if train.images.dims[1..] != test.images.dims[1..] {
            return Err(Error::format(
                &test.image_path,
                format!("test images are {:?} but training images are {:?}", &test.images.dims[1..], &train.images.dims[1..]),
            ));
        }
        let k = self.num_classes.unwrap_or_else(|| {
            train.labels.data.iter().chain(&test.labels.data).max().map_or(1, |&m| m as usize + 1)
        });
        let mut ds = self.select(&train, &test, k)?;
        if self.num_classes.is_none() {
            let Targets::Labels(l) = &ds.y_train else { unreachable!("idx rows have labels") };
            let present: std::collections::BTreeSet<usize> = l.iter().copied().collect();
            if let Some(c) = (0..k).find(|c| !present.contains(c)) {
                return Err(Error::format(
                    &train.image_path,
                    format!("class {c} has no rows in the training selection (classes are 0..{k}; set data.num_classes to allow missing classes)"),
                ));
            }
        }
        ds.description = format!("idx {}: {}", self.train_images, ds.description);
        ds.name = base_dir
            .join(&self.train_images)
            .parent()
            .and_then(|p| p.file_name())
            .map_or("idx".into(), |s| s.to_string_lossy().to_string());
        prep::Prep { standardize: self.standardize, ..prep::Prep::default() }.apply(&mut ds, &train.image_path)?;
        Ok(ds)
    }

    /// The selection shared with `mnist` (its description format, too).
    fn select(&self, train: &IdxPair, test: &IdxPair, k: usize) -> Result<Dataset> {
        let pixels = Pixels { scale: self.scale, normalize: self.normalize };
        let offset = self.offset;
        let noun = if k == 10 && self.image_size == Some([28, 28]) { "digit" } else { "class" };
        let (x_train, y_train, validation, train_desc) = match self.per_class {
            None => {
                let (x, y) = select_range(train, offset, self.n_train, &pixels)?;
                (x, y, None, format!("train images {offset}..{}", offset + self.n_train))
            }
            Some(pc) => {
                let sel = select_per_class(train, offset, &[pc, self.val_per_class.unwrap_or(0)], k, noun, &pixels)?;
                let mut sel = sel.into_iter();
                let (x, y) = sel.next().expect("one selection per count");
                let val = sel.next().filter(|_| self.val_per_class.is_some());
                let mut desc = format!("train: the first {pc} images of each {noun} from image {offset} (file order)");
                if let Some(v) = self.val_per_class {
                    desc += &format!(", validation: the next {v} of each {noun}");
                }
                let val = val.map(|(x, y)| Split { x, y: Targets::Labels(y) });
                (x, y, val, desc)
            }
        };
        let (x_test, y_test) = select_range(test, offset, self.n_test, &pixels)?;
        let [h, w] = [train.images.dims[1], train.images.dims[2]];
        Ok(Dataset {
            name: "idx".into(),
            description: format!(
                "{train_desc}, test images {offset}..{}, {}",
                offset + self.n_test,
                pixels.describe()
            ),
            dim: h * w,
            image_shape: Some([1, h, w]),
            vocab: None,
            num_outputs: k,
            x_train,
            y_train: Targets::Labels(y_train),
            x_test,
            y_test: Targets::Labels(y_test),
            validation,
        })
    }

    /// `mnist` as a preset of this kind: the four MNIST files found in `dir` (either naming),
    /// 28×28 images, 10 classes, `x/255` optionally normalised with MNIST's mean and std.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mnist(
        dir: &Path,
        path: &str,
        n_train: usize,
        n_test: usize,
        offset: usize,
        normalize: bool,
        per_class: Option<usize>,
        val_per_class: Option<usize>,
    ) -> Result<Dataset> {
        let train = read_mnist_pair(dir, MnistSplit::Train)?;
        let test = read_mnist_pair(dir, MnistSplit::Test)?;
        let cfg = IdxConfig {
            train_images: train.image_path.display().to_string(),
            train_labels: String::new(),
            test_images: test.image_path.display().to_string(),
            test_labels: String::new(),
            n_train,
            n_test,
            offset,
            per_class,
            val_per_class,
            num_classes: Some(10),
            image_size: Some([28, 28]),
            scale: None,
            normalize: Pixels::mnist(normalize).normalize,
            standardize: false,
        };
        let mut ds = cfg.select(&train, &test, 10)?;
        ds.name = "mnist".into();
        ds.description = format!("mnist from {path}, {}", ds.description);
        Ok(ds)
    }
}

#[cfg(test)]
mod tests;
