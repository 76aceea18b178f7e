//! PNG figures for the reports (the EPK paper's Figs. 2–8 and the notebooks).
//!
//! Plotting never computes: every function takes ready-made data and writes one PNG.
//!
//! Shapes are drawn with `plotters` (bitmap backend). Text is rasterised with `ab_glyph` from
//! DejaVu Sans embedded in the binary (`data/fonts/DejaVuSans.ttf`, license in
//! `data/fonts/LICENSE-DejaVu.txt`), so no system font library is needed. The font is also
//! registered with plotters' `ab_glyph` backend (it measures text while laying out a chart), but
//! all visible text goes through this module's own text layer: plotters 0.3.7's `ab_glyph`
//! renderer drops each glyph's left side bearing, which spaces letters unevenly.
//!
//! Files are written atomically: the image is rendered in memory, encoded to a temporary file
//! in the target directory (`.NAME.tmp-PID-N.png`) and renamed over the target; a failed write
//! leaves no temporary file behind.
//!
//! Invalid input (no series, mismatched lengths, nothing finite to draw, degenerate grids)
//! is reported as [`Error::Data`]; these functions never panic on data.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// Public data types
// ---------------------------------------------------------------------------------------------

/// A named line/point series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend entry (an empty label keeps the series out of the legend).
    pub label: String,
    /// Abscissae.
    pub x: Vec<f64>,
    /// Ordinates; must have the same length as `x`.
    pub y: Vec<f64>,
}

impl Series {
    /// A series from a label and its points.
    pub fn new(label: impl Into<String>, x: Vec<f64>, y: Vec<f64>) -> Self {
        Series {
            label: label.into(),
            x,
            y,
        }
    }
}

/// Axis scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear axis.
    Linear,
    /// Base-10 logarithmic axis; non-positive values are skipped.
    Log,
}

/// A regular 2-D grid of values: `values[iy * nx + ix]` at `x = x0 + ix*(x1-x0)/(nx-1)`,
/// `y = y0 + iy*(y1-y0)/(ny-1)`.
///
/// Needs `nx, ny >= 2`, finite `x0 < x1`, `y0 < y1` and `values.len() == nx * ny`.
/// Each value fills the cell centred on its grid point; non-finite values are drawn grey.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid2d {
    /// Number of grid columns (x direction).
    pub nx: usize,
    /// Number of grid rows (y direction).
    pub ny: usize,
    /// x of the first column.
    pub x0: f64,
    /// x of the last column.
    pub x1: f64,
    /// y of the first row.
    pub y0: f64,
    /// y of the last row.
    pub y1: f64,
    /// Row-major values, `values[iy * nx + ix]`.
    pub values: Vec<f64>,
}

/// Labelled 2-D points drawn over a heatmap (class → marker colour and shape), optionally with a
/// per-point value instead of a class colour.
///
/// All vectors must have the same length. Points with non-finite coordinates are skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    /// Point abscissae.
    pub x: Vec<f64>,
    /// Point ordinates.
    pub y: Vec<f64>,
    /// Class of each point (selects the marker shape, and the colour when `value` is `None`).
    pub class: Vec<usize>,
    /// Optional per-point value that colours the marker instead of the class.
    pub value: Option<Vec<f64>>,
}

// ---------------------------------------------------------------------------------------------
// Layout constants and palettes
// ---------------------------------------------------------------------------------------------

const TITLE_PX: f32 = 22.0;
const PANEL_TITLE_PX: f32 = 17.0;
const DESC_PX: f32 = 16.0;
const TICK_PX: f32 = 14.0;
const CBAR_TICK_PX: f32 = 13.0;
const LEGEND_PX: f32 = 15.0;

const CHART_W: u32 = 900;
const CHART_H: u32 = 600;
const PANEL_W: u32 = 450;
const PANEL_H: u32 = 420;
/// Width of a panel's colour bar column (bar + tick labels + rotated label).
const CBAR_W: u32 = 112;
const MATRIX_W: u32 = 900;
const MATRIX_H: u32 = 780;
/// Height of the figure title band.
const TITLE_H: u32 = 44;
/// Height of a panel's title band.
const PANEL_TITLE_H: u32 = 30;
/// Height of the legend band below panel figures.
const FOOTER_H: u32 = 36;

/// matplotlib's "tab10" categorical palette.
const TAB10: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Viridis control points (matplotlib), evenly spaced on [0, 1].
const VIRIDIS: [RGBColor; 9] = [
    RGBColor(68, 1, 84),
    RGBColor(71, 45, 123),
    RGBColor(59, 82, 139),
    RGBColor(44, 114, 142),
    RGBColor(33, 145, 140),
    RGBColor(40, 174, 128),
    RGBColor(94, 201, 98),
    RGBColor(173, 220, 48),
    RGBColor(253, 231, 37),
];

/// ColorBrewer RdBu (11 classes), reversed: blue (negative) → white (0) → red (positive).
const RDBU_R: [RGBColor; 11] = [
    RGBColor(5, 48, 97),
    RGBColor(33, 102, 172),
    RGBColor(67, 147, 195),
    RGBColor(146, 197, 222),
    RGBColor(209, 229, 240),
    RGBColor(247, 247, 247),
    RGBColor(253, 219, 199),
    RGBColor(244, 165, 130),
    RGBColor(214, 96, 77),
    RGBColor(178, 24, 43),
    RGBColor(103, 0, 31),
];

const NAN_GREY: RGBColor = RGBColor(200, 200, 200);
const INK: RGBColor = RGBColor(0, 0, 0);
const AXIS_INK: RGBColor = RGBColor(51, 51, 51);
const GRID_BOLD: RGBAColor = RGBAColor(0, 0, 0, 0.13);
const GRID_LIGHT: RGBAColor = RGBAColor(0, 0, 0, 0.05);

// ---------------------------------------------------------------------------------------------
// Font, text layer, file output
// ---------------------------------------------------------------------------------------------

static FONT_BYTES: &[u8] = include_bytes!("../data/fonts/DejaVuSans.ttf");
static FACE: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The embedded font, parsed and registered with plotters once per process.
fn face() -> Result<&'static FontRef<'static>> {
    FACE.get_or_init(|| {
        let ok =
            plotters::style::register_font("sans-serif", FontStyle::Normal, FONT_BYTES).is_ok();
        FontRef::try_from_slice(FONT_BYTES).ok().filter(|_| ok)
    })
    .as_ref()
    .ok_or_else(|| Error::Data("the embedded DejaVu Sans font could not be parsed".into()))
}

/// Horizontal anchor of a text, in the text's own frame (before rotation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum H {
    Left,
    Center,
    Right,
}

/// Vertical anchor of a text, in the text's own frame (before rotation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum V {
    Top,
    /// The middle of the capital height (visually centred for labels and numbers).
    Center,
}

/// One queued text, anchored at absolute image pixel `at`.
struct TextCmd {
    s: String,
    at: (i32, i32),
    px: f32,
    color: RGBColor,
    h: H,
    v: V,
    /// Rotated by 90° counter-clockwise (reads bottom to top).
    up: bool,
}

/// Texts queued while plotters draws the shapes; rasterised on top at the end.
struct Txt {
    face: &'static FontRef<'static>,
    cmds: RefCell<Vec<TextCmd>>,
}

/// Width and height (ascent − descent) in pixels of `s` at size `px`.
fn measure(face: &FontRef<'static>, s: &str, px: f32) -> (f32, f32) {
    let f = face.as_scaled(PxScale::from(px));
    let mut w = 0.0;
    let mut prev = None;
    for c in s.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            w += f.kern(p, id);
        }
        w += f.h_advance(id);
        prev = Some(id);
    }
    (w, f.ascent() - f.descent())
}

impl Txt {
    fn measure(&self, s: &str, px: f32) -> (f32, f32) {
        measure(self.face, s, px)
    }

    fn width(&self, s: &str, px: f32) -> i32 {
        self.measure(s, px).0.ceil() as i32
    }

    /// The largest size ≤ `px` (down to 9 px) at which `s` fits in `max_w` pixels.
    fn fit(&self, s: &str, px: f32, max_w: i32) -> f32 {
        let w = self.measure(s, px).0;
        if w <= max_w as f32 || w <= 0.0 {
            px
        } else {
            (px * max_w.max(1) as f32 / w).floor().max(9.0)
        }
    }

    /// Queues `s` at `at`, a position relative to `area`.
    #[allow(clippy::too_many_arguments)]
    fn put(&self, area: &Area, s: &str, at: (i32, i32), px: f32, h: H, v: V, up: bool) {
        self.put_color(area, s, at, px, INK, h, v, up);
    }

    #[allow(clippy::too_many_arguments)]
    fn put_color(
        &self,
        area: &Area,
        s: &str,
        at: (i32, i32),
        px: f32,
        color: RGBColor,
        h: H,
        v: V,
        up: bool,
    ) {
        let (bx, by) = area.get_base_pixel();
        self.put_abs(s, (bx + at.0, by + at.1), px, color, h, v, up);
    }

    #[allow(clippy::too_many_arguments)]
    fn put_abs(&self, s: &str, at: (i32, i32), px: f32, color: RGBColor, h: H, v: V, up: bool) {
        if s.is_empty() {
            return;
        }
        self.cmds.borrow_mut().push(TextCmd {
            s: s.to_string(),
            at,
            px,
            color,
            h,
            v,
            up,
        });
    }

    /// Rasterises all queued texts into an RGB buffer of width `w` and height `h`.
    fn rasterize(&self, buf: &mut [u8], w: u32, h: u32) {
        let cap = |f: &PxScaleFontRef| {
            let id = f.glyph_id('H');
            f.outline_glyph(id.with_scale_and_position(f.scale(), ab_glyph::point(0.0, 0.0)))
                .map(|o| -o.px_bounds().min.y)
                .unwrap_or(f.ascent() * 0.75)
        };
        for cmd in self.cmds.borrow().iter() {
            let f = self.face.as_scaled(PxScale::from(cmd.px));
            let (tw, _) = self.measure(&cmd.s, cmd.px);
            let ox = match cmd.h {
                H::Left => 0.0,
                H::Center => -tw / 2.0,
                H::Right => -tw,
            };
            let base = match cmd.v {
                V::Top => f.ascent(),
                V::Center => cap(&f) / 2.0,
            };
            let mut x = ox;
            let mut prev = None;
            for c in cmd.s.chars() {
                let id = f.glyph_id(c);
                if let Some(p) = prev {
                    x += f.kern(p, id);
                }
                let g = id.with_scale_and_position(f.scale(), ab_glyph::point(x, base));
                x += f.h_advance(id);
                prev = Some(id);
                let Some(o) = f.outline_glyph(g) else {
                    continue;
                };
                let b = o.px_bounds();
                o.draw(|gx, gy, cov| {
                    let (dx, dy) = (b.min.x as i32 + gx as i32, b.min.y as i32 + gy as i32);
                    let (dx, dy) = if cmd.up { (dy, -dx) } else { (dx, dy) };
                    let (px, py) = (cmd.at.0 + dx, cmd.at.1 + dy);
                    if px < 0 || py < 0 || px as u32 >= w || py as u32 >= h {
                        return;
                    }
                    let a = cov.clamp(0.0, 1.0) as f64;
                    let i = (py as usize * w as usize + px as usize) * 3;
                    let blend =
                        |old: u8, new: u8| (old as f64 * (1.0 - a) + new as f64 * a).round() as u8;
                    buf[i] = blend(buf[i], cmd.color.0);
                    buf[i + 1] = blend(buf[i + 1], cmd.color.1);
                    buf[i + 2] = blend(buf[i + 2], cmd.color.2);
                });
            }
        }
    }
}

type PxScaleFontRef<'a> = ab_glyph::PxScaleFont<&'a FontRef<'static>>;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Chart<'a> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<Axis1, Axis1>>;
type Plot<'a> = DrawingArea<BitMapBackend<'a>, Cartesian2d<Axis1, Axis1>>;
type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

#[cfg(test)]
thread_local! {
    /// The last RGB buffer rendered on this thread (tests inspect it for non-blankness).
    static LAST_RENDER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Renders `(w, h)` pixels with `draw` in memory, then writes the PNG atomically to `path`.
fn render(path: &Path, (w, h): (u32, u32), draw: impl FnOnce(&Area, &Txt) -> Drawn) -> Result<()> {
    let txt = Txt {
        face: face()?,
        cmds: RefCell::new(Vec::new()),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Data(format!("{}: not a file path", path.display())))?
        .to_string_lossy()
        .into_owned();
    let dir: PathBuf = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "parent directory does not exist",
            ),
        ));
    }

    let mut buf = vec![255u8; (w as usize) * (h as usize) * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        let res: Drawn = (|| {
            root.fill(&WHITE)?;
            draw(&root, &txt)?;
            root.present()?;
            Ok(())
        })();
        res.map_err(|e| Error::Data(format!("{}: rendering failed: {e}", path.display())))?;
    }
    txt.rasterize(&mut buf, w, h);
    #[cfg(test)]
    LAST_RENDER.with(|l| *l.borrow_mut() = buf.clone());

    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{file_name}.tmp-{}-{n}.png", std::process::id()));
    let written = {
        let mut backend = BitMapBackend::new(&tmp, (w, h));
        backend
            .blit_bitmap((0, 0), (w, h), &buf)
            .and_then(|_| backend.present())
            .map_err(|e| encode_error(path, &e))
        // `backend` drops here; its drop only retries the save when `present` failed.
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// Maps an encoder error to `Error::Io` when an I/O error is at its root, else `Error::Data`.
fn encode_error(path: &Path, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Error::io(path, std::io::Error::new(io.kind(), e.to_string()));
        }
        cur = err.source();
    }
    let msg = e.to_string();
    if msg.contains("IoError") || msg.contains("IOError") {
        return Error::io(path, std::io::Error::other(msg));
    }
    Error::Data(format!("{}: PNG encoding failed: {msg}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Colours and number formatting
// ---------------------------------------------------------------------------------------------

fn mix(a: RGBColor, b: RGBColor, t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let f = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * t).round() as u8;
    RGBColor(f(a.0, b.0), f(a.1, b.1), f(a.2, b.2))
}

fn interp(stops: &[RGBColor], t: f64) -> RGBColor {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let s = t * (stops.len() - 1) as f64;
    let i = (s.floor() as usize).min(stops.len() - 2);
    mix(stops[i], stops[i + 1], s - i as f64)
}

fn class_color(c: usize) -> RGBColor {
    TAB10[c % TAB10.len()]
}

/// Light version of a class colour for decision-region backgrounds.
fn light_class(c: usize) -> RGBColor {
    mix(class_color(c), WHITE, 0.72)
}

fn luminance(c: RGBColor) -> f64 {
    (0.299 * c.0 as f64 + 0.587 * c.1 as f64 + 0.114 * c.2 as f64) / 255.0
}

/// A value → colour mapping with its range.
#[derive(Clone, Copy)]
enum Cmap {
    /// Viridis on [lo, hi].
    Viridis(f64, f64),
    /// Diverging RdBu_r on [-m, m], white at 0.
    Diverging(f64),
}

impl Cmap {
    fn range(&self) -> (f64, f64) {
        match *self {
            Cmap::Viridis(lo, hi) => (lo, hi),
            Cmap::Diverging(m) => (-m, m),
        }
    }
    fn color(&self, v: f64) -> RGBColor {
        if !v.is_finite() {
            return NAN_GREY;
        }
        let (lo, hi) = self.range();
        let t = (v - lo) / (hi - lo);
        match self {
            Cmap::Viridis(..) => interp(&VIRIDIS, t),
            Cmap::Diverging(_) => interp(&RDBU_R, t),
        }
    }
    /// Viridis over the finite range of `values` (widened when constant).
    fn viridis_for(values: impl Iterator<Item = f64>) -> Option<Cmap> {
        let (lo, hi) = finite_range(values)?;
        let (lo, hi) = widen(lo, hi);
        Some(Cmap::Viridis(lo, hi))
    }
    /// Diverging, symmetric around 0, over the largest finite |value|.
    fn diverging_for(values: impl Iterator<Item = f64>) -> Option<Cmap> {
        let m = values
            .filter(|v| v.is_finite())
            .map(f64::abs)
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))?;
        Some(Cmap::Diverging(if m > 0.0 { m } else { 1.0 }))
    }
}

fn finite_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// Widens a degenerate range so that it has a positive span.
fn widen(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        let d = if lo.abs() > 0.0 { lo.abs() * 0.05 } else { 0.5 };
        (lo - d, hi + d)
    }
}

/// Formats a number compactly (≤ 5 significant digits, scientific when very small or large).
fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        let s = format!("{v:.2e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        return format!("{}e{exp}", trim_zeros(mant));
    }
    let mag = a.log10().floor() as i32;
    let decimals = (4 - mag).clamp(0, 6) as usize;
    trim_zeros(&format!("{v:.decimals$}"))
}

fn trim_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// Cell-value formatter for a matrix whose largest |value| is `maxabs`: a fixed number of
/// decimals (three significant digits of the largest value), scientific for extreme scales.
fn cell_formatter(maxabs: f64) -> impl Fn(f64) -> String {
    let sci = !(maxabs == 0.0 || (1e-2..1e4).contains(&maxabs));
    let decimals = if maxabs > 0.0 {
        (2 - maxabs.log10().floor() as i32).clamp(0, 4) as usize
    } else {
        2
    };
    move |v: f64| {
        if !v.is_finite() {
            format!("{v}")
        } else if sci {
            if v == 0.0 {
                "0".into()
            } else {
                format!("{v:.1e}")
            }
        } else {
            let s = format!("{v:.decimals$}");
            // Avoid "-0.00".
            if s.trim_start_matches('-')
                .chars()
                .all(|c| c == '0' || c == '.')
            {
                s.trim_start_matches('-').to_string()
            } else {
                s
            }
        }
    }
}

fn superscript(n: i64) -> String {
    n.to_string()
        .chars()
        .map(|c| match c {
            '-' => '⁻',
            '0' => '⁰',
            '1' => '¹',
            '2' => '²',
            '3' => '³',
            '4' => '⁴',
            '5' => '⁵',
            '6' => '⁶',
            '7' => '⁷',
            '8' => '⁸',
            '9' => '⁹',
            c => c,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Axes
// ---------------------------------------------------------------------------------------------

/// A linear f64 coordinate with caller-chosen tick (bold) and grid (light) positions.
#[derive(Clone)]
struct Axis1 {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    light: Vec<f64>,
}

impl Ranged for Axis1 {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let len = limit.1 - limit.0;
        if self.hi == self.lo || len == 0 {
            return limit.0 + len / 2;
        }
        let t = ((*v - self.lo) / (self.hi - self.lo)).clamp(-1e4, 1e4);
        limit.0 + (len as f64 * t + 1e-3).floor() as i32
    }
    fn key_points<K: KeyPointHint>(&self, hint: K) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.clone()
        }
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// One plotted axis: range, ticks and labels in plot space (log10 of the data for log axes).
struct Axis {
    log: bool,
    /// Log axis whose decade labels are all written as powers of ten.
    sup: bool,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    light: Vec<f64>,
}

impl Axis {
    fn label(&self, t: f64) -> String {
        if self.log {
            let r = t.round();
            if (t - r).abs() < 1e-9 {
                let k = r as i64;
                if !self.sup && (-2..=3).contains(&k) {
                    fmt_num(10f64.powi(k as i32))
                } else {
                    format!("10{}", superscript(k))
                }
            } else {
                fmt_num(10f64.powf(t))
            }
        } else if t.abs() < (self.hi - self.lo).abs() * 1e-9 {
            "0".into()
        } else {
            fmt_num(t)
        }
    }

    /// A linear axis over [lo, hi] (data units), padded by `pad` of the span on both sides.
    fn linear(lo: f64, hi: f64, pad: f64, target_ticks: usize) -> Axis {
        // Keep spans finite even for values near ±f64::MAX.
        const BIG: f64 = f64::MAX / 8.0;
        let (lo, hi) = widen(lo.clamp(-BIG, BIG), hi.clamp(-BIG, BIG));
        let p = (hi - lo) * pad;
        let (lo, hi) = ((lo - p).max(-2.0 * BIG), (hi + p).min(2.0 * BIG));
        let step = nice_step((hi - lo) / target_ticks.max(2) as f64);
        let multiples = |step: f64| -> Vec<f64> {
            let (first, last) = ((lo / step).ceil(), (hi / step).floor());
            if !(first.is_finite() && last.is_finite()) || last - first > 200.0 || last < first {
                return vec![];
            }
            let (first, last) = (first as i64, last as i64);
            (first..=last)
                .map(|k| if k == 0 { 0.0 } else { k as f64 * step })
                .collect()
        };
        Axis {
            log: false,
            sup: false,
            lo,
            hi,
            ticks: multiples(step),
            light: multiples(step / 2.0),
        }
    }

    /// A log10 axis covering [lo, hi] (data units, both > 0).
    fn log(lo: f64, hi: f64) -> Axis {
        let (a, b) = (lo.log10(), hi.log10());
        let (lo_t, hi_t) = if b - a >= 2.0 {
            let p = (b - a) * 0.03;
            (a - p, b + p)
        } else {
            // Less than two decades: show whole decades so that labelled ticks exist.
            let (f, c) = (a.floor(), b.ceil());
            if c - f < 1.0 {
                (f - 1.0, c + 1.0)
            } else {
                (f, c)
            }
        };
        let decades = hi_t - lo_t;
        let stride = ((decades / 8.0).ceil() as i64).max(1);
        let (kf, kl) = (lo_t.ceil() as i64, hi_t.floor() as i64);
        let mut ticks: Vec<f64> = (kf..=kl)
            .filter(|k| k.rem_euclid(stride) == 0)
            .map(|k| k as f64)
            .collect();
        let mut light: Vec<f64> = (kf..=kl).map(|k| k as f64).collect();
        if stride == 1 && decades <= 6.0 {
            for k in (kf - 1)..=kl {
                for m in 2..=9 {
                    let t = k as f64 + (m as f64).log10();
                    if t >= lo_t && t <= hi_t {
                        light.push(t);
                        // Label 2× and 5× when few decades are shown.
                        if decades <= 2.0 && (m == 2 || m == 5) {
                            ticks.push(t);
                        }
                    }
                }
            }
        }
        ticks.sort_by(f64::total_cmp);
        let sup = ticks
            .iter()
            .any(|t| t.fract() == 0.0 && !(-2.0..=3.0).contains(t));
        Axis {
            log: true,
            sup,
            lo: lo_t,
            hi: hi_t,
            ticks,
            light,
        }
    }

    /// An axis fitted to the drawable values in `values`.
    fn fit(values: impl Iterator<Item = f64>, scale: Scale, pad: f64) -> Option<Axis> {
        match scale {
            Scale::Linear => {
                let (lo, hi) = finite_range(values)?;
                Some(Axis::linear(lo, hi, pad, 8))
            }
            Scale::Log => {
                let (lo, hi) = finite_range(values.filter(|v| *v > 0.0))?;
                Some(Axis::log(lo, hi))
            }
        }
    }

    fn coord(&self) -> Axis1 {
        Axis1 {
            lo: self.lo,
            hi: self.hi,
            ticks: self.ticks.clone(),
            light: self.light.clone(),
        }
    }

    /// Widest tick label in pixels.
    fn label_w(&self, txt: &Txt, px: f32) -> i32 {
        self.ticks
            .iter()
            .map(|t| txt.width(&self.label(*t), px))
            .max()
            .unwrap_or(0)
    }
}

/// Plot-space value of a data value; `None` when it cannot be drawn.
fn tf(log: bool, v: f64) -> Option<f64> {
    if !v.is_finite() {
        None
    } else if log {
        (v > 0.0).then(|| v.log10())
    } else {
        Some(v)
    }
}

fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Builds a chart on `area` with grid lines, tick marks and tick/axis labels.
#[allow(clippy::too_many_arguments)]
fn build_chart<'a>(
    area: &Area<'a>,
    txt: &Txt,
    xa: &Axis,
    ya: &Axis,
    x_desc: &str,
    y_desc: &str,
    top: u32,
    right: u32,
) -> std::result::Result<Chart<'a>, Box<dyn std::error::Error>> {
    let tick_h = txt.measure("0", TICK_PX).1.ceil() as u32;
    let y_area = ya.label_w(txt, TICK_PX) as u32
        + 12
        + if y_desc.is_empty() {
            0
        } else {
            DESC_PX as u32 + 14
        };
    let x_area = tick_h
        + 12
        + if x_desc.is_empty() {
            0
        } else {
            DESC_PX as u32 + 12
        };
    let mut chart = ChartBuilder::on(area)
        .margin_top(top)
        .margin_right(right)
        .margin_left(4)
        .margin_bottom(4)
        .x_label_area_size(x_area)
        .y_label_area_size(y_area)
        .build_cartesian_2d(xa.coord(), ya.coord())?;
    let blank = |_: &f64| String::new();
    chart
        .configure_mesh()
        .x_label_formatter(&blank)
        .y_label_formatter(&blank)
        .bold_line_style(GRID_BOLD)
        .light_line_style(GRID_LIGHT)
        .axis_style(AXIS_INK)
        .set_all_tick_mark_size(5)
        .draw()?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    for t in &xa.ticks {
        let (px, _) = chart.backend_coord(&(*t, ya.lo));
        txt.put_abs(
            &xa.label(*t),
            (px, yr.end + 7),
            TICK_PX,
            INK,
            H::Center,
            V::Top,
            false,
        );
    }
    for t in &ya.ticks {
        let (_, py) = chart.backend_coord(&(xa.lo, *t));
        txt.put_abs(
            &ya.label(*t),
            (xr.start - 8, py),
            TICK_PX,
            INK,
            H::Right,
            V::Center,
            false,
        );
    }
    let xmid = (xr.start + xr.end) / 2;
    let ymid = (yr.start + yr.end) / 2;
    let xpx = txt.fit(x_desc, DESC_PX, xr.end - xr.start);
    txt.put_abs(
        x_desc,
        (xmid, yr.end + 7 + tick_h as i32 + 10),
        xpx,
        INK,
        H::Center,
        V::Top,
        false,
    );
    let (bx, _) = area.get_base_pixel();
    let ypx = txt.fit(y_desc, DESC_PX, yr.end - yr.start);
    txt.put_abs(
        y_desc,
        (bx + 4 + (DESC_PX as i32) / 2, ymid),
        ypx,
        INK,
        H::Center,
        V::Center,
        true,
    );
    Ok(chart)
}

// ---------------------------------------------------------------------------------------------
// Markers, colour bars, legends
// ---------------------------------------------------------------------------------------------

/// Marker outline for `shape` (0 circle, 1 triangle, 2 square, 3 diamond, 4 inverted triangle)
/// as pixel offsets; `None` for the circle.
fn marker_polygon(shape: usize, r: i32) -> Option<Vec<(i32, i32)>> {
    let rr = r + 1;
    match shape % 5 {
        0 => None,
        1 => Some(vec![(0, -rr), (rr, rr * 3 / 4), (-rr, rr * 3 / 4)]),
        2 => Some(vec![(-r, -r), (r, -r), (r, r), (-r, r)]),
        3 => Some(vec![(0, -rr), (rr, 0), (0, rr), (-rr, 0)]),
        _ => Some(vec![(0, rr), (rr, -rr * 3 / 4), (-rr, -rr * 3 / 4)]),
    }
}

/// Draws a marker centred on the plot point `p`.
fn draw_marker(
    pa: &Plot,
    p: (f64, f64),
    shape: usize,
    r: i32,
    fill: RGBColor,
    edge: RGBColor,
) -> Drawn {
    let fs = ShapeStyle::from(&fill).filled();
    let es = ShapeStyle::from(&edge).stroke_width(1);
    match marker_polygon(shape, r) {
        None => {
            pa.draw(&(EmptyElement::at(p) + Circle::new((0, 0), r, fs)))?;
            pa.draw(&(EmptyElement::at(p) + Circle::new((0, 0), r, es)))?;
        }
        Some(pts) => {
            let mut closed = pts.clone();
            closed.push(pts[0]);
            pa.draw(&(EmptyElement::at(p) + Polygon::new(pts, fs)))?;
            pa.draw(&(EmptyElement::at(p) + PathElement::new(closed, es)))?;
        }
    }
    Ok(())
}

/// Draws a marker in pixel coordinates of a plain area (legends).
fn legend_marker(
    a: &Area,
    (x, y): (i32, i32),
    shape: usize,
    r: i32,
    fill: RGBColor,
    edge: RGBColor,
) -> Drawn {
    let fs = ShapeStyle::from(&fill).filled();
    let es = ShapeStyle::from(&edge).stroke_width(1);
    match marker_polygon(shape, r) {
        None => {
            a.draw(&Circle::new((x, y), r, fs))?;
            a.draw(&Circle::new((x, y), r, es))?;
        }
        Some(pts) => {
            let pts: Vec<(i32, i32)> = pts.into_iter().map(|(dx, dy)| (x + dx, y + dy)).collect();
            let mut closed = pts.clone();
            closed.push(pts[0]);
            a.draw(&Polygon::new(pts, fs))?;
            a.draw(&PathElement::new(closed, es))?;
        }
    }
    Ok(())
}

/// Draws a cross of half-size `r` with a white halo, centred on pixel `(x, y)` of `a`.
fn cross_px(a: &Area, (x, y): (i32, i32), r: i32) -> Drawn {
    for (w, c) in [(6, WHITE), (3, BLACK)] {
        let s = c.stroke_width(w);
        a.draw(&PathElement::new(vec![(x - r, y - r), (x + r, y + r)], s))?;
        a.draw(&PathElement::new(vec![(x - r, y + r), (x + r, y - r)], s))?;
    }
    Ok(())
}

/// Draws a cross (test point mark) at the plot point `p`.
fn draw_cross(pa: &Plot, p: (f64, f64), r: i32) -> Drawn {
    for (w, c) in [(6, WHITE), (3, BLACK)] {
        let s = c.stroke_width(w);
        pa.draw(&(EmptyElement::at(p) + PathElement::new(vec![(-r, -r), (r, r)], s)))?;
        pa.draw(&(EmptyElement::at(p) + PathElement::new(vec![(-r, r), (r, -r)], s)))?;
    }
    Ok(())
}

/// Draws a vertical colour bar in `area` spanning the absolute pixel rows `rows`, with tick
/// labels and a rotated `label` to its right.
fn draw_colorbar(
    area: &Area,
    txt: &Txt,
    cmap: Cmap,
    label: &str,
    rows: std::ops::Range<i32>,
) -> Drawn {
    let (lo, hi) = cmap.range();
    let ax = Axis::linear(lo, hi, 0.0, 6);
    let (_, by) = area.get_base_pixel();
    let (y0, y1) = (rows.start - by, rows.end - by);
    if y1 - y0 < 4 {
        return Ok(());
    }
    let (x0, x1) = (10, 28);
    let y_of = |v: f64| y1 - ((v - lo) / (hi - lo) * (y1 - y0) as f64).round() as i32;
    for y in y0..y1 {
        let v = lo + (hi - lo) * ((y1 - y) as f64 - 0.5) / (y1 - y0) as f64;
        area.draw(&Rectangle::new(
            [(x0, y), (x1, y + 1)],
            cmap.color(v).filled(),
        ))?;
    }
    area.draw(&Rectangle::new([(x0, y0), (x1, y1)], AXIS_INK))?;
    for t in &ax.ticks {
        let y = y_of(*t);
        area.draw(&PathElement::new(vec![(x1, y), (x1 + 4, y)], AXIS_INK))?;
        txt.put(
            area,
            &ax.label(*t),
            (x1 + 7, y),
            CBAR_TICK_PX,
            H::Left,
            V::Center,
            false,
        );
    }
    let lx = x1 + 7 + ax.label_w(txt, CBAR_TICK_PX) + 8 + DESC_PX as i32 / 2;
    let px = txt.fit(label, DESC_PX, y1 - y0);
    txt.put(
        area,
        label,
        (lx, (y0 + y1) / 2),
        px,
        H::Center,
        V::Center,
        true,
    );
    Ok(())
}

/// Legend entry: label, colour, and a kind used by the caller's key drawer.
type Entry = (String, RGBColor, usize);

/// Draws legend entries top-down in `area` starting at pixel row `top`; `key` draws the key
/// centred on the given pixel.
fn draw_legend(
    area: &Area,
    txt: &Txt,
    entries: &[Entry],
    top: i32,
    key: impl Fn(&Area, (i32, i32), RGBColor, usize) -> Drawn,
) -> Drawn {
    let row = LEGEND_PX as i32 + 10;
    let (w, _) = area.dim_in_pixel();
    for (i, (label, color, kind)) in entries.iter().enumerate() {
        let y = top + i as i32 * row;
        key(area, (22, y), *color, *kind)?;
        let px = txt.fit(label, LEGEND_PX, w as i32 - 48);
        txt.put(area, label, (44, y), px, H::Left, V::Center, false);
    }
    Ok(())
}

/// Width of a legend column for these labels (capped at a third of a chart).
fn legend_w(txt: &Txt, labels: &[&str]) -> u32 {
    let w = labels
        .iter()
        .map(|l| txt.width(l, LEGEND_PX))
        .max()
        .unwrap_or(0) as u32
        + 56;
    w.min(CHART_W / 3)
}

/// Draws the figure title centred in the top band of `root`; returns the area below it.
fn titled<'a>(root: &Area<'a>, txt: &Txt, title: &str) -> Area<'a> {
    if title.is_empty() {
        let (_, rest) = root.split_vertically(8);
        return rest;
    }
    let (w, _) = root.dim_in_pixel();
    let px = txt.fit(title, TITLE_PX, w as i32 - 20);
    txt.put(
        root,
        title,
        (w as i32 / 2, TITLE_H as i32 / 2),
        px,
        H::Center,
        V::Center,
        false,
    );
    let (_, rest) = root.split_vertically(TITLE_H);
    rest
}

fn check_series(path: &Path, what: &str, series: &[Series]) -> Result<()> {
    if series.is_empty() {
        return Err(Error::Data(format!(
            "{}: {what} needs at least one series",
            path.display()
        )));
    }
    for s in series {
        if s.x.len() != s.y.len() {
            return Err(Error::Data(format!(
                "{}: series '{}' has {} x values but {} y values",
                path.display(),
                s.label,
                s.x.len(),
                s.y.len()
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Line and scatter charts
// ---------------------------------------------------------------------------------------------

/// Line chart (several series, legend, axis labels with units given by the caller, optional log
/// axes; non-finite points skipped; for log axes non-positive values skipped).
///
/// A skipped point breaks the line; isolated points and short series (≤ 40 drawable points)
/// are also drawn as markers. The legend sits in a column to the right of the plot, never over
/// the data; series with an empty label are left out of it. Writes a 900×600 PNG.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_scale: Scale,
    y_scale: Scale,
) -> Result<()> {
    check_series(path, "line_chart", series)?;
    let (xlog, ylog) = (x_scale == Scale::Log, y_scale == Scale::Log);
    // Plot-space points per series, `None` where a point cannot be drawn.
    let pts: Vec<Vec<Option<(f64, f64)>>> = series
        .iter()
        .map(|s| {
            s.x.iter()
                .zip(&s.y)
                .map(|(&x, &y)| Some((tf(xlog, x)?, tf(ylog, y)?)))
                .collect()
        })
        .collect();
    if pts.iter().flatten().all(Option::is_none) {
        return Err(Error::Data(format!(
            "{}: line_chart has no drawable point (all non-finite{})",
            path.display(),
            if xlog || ylog {
                " or non-positive on a log axis"
            } else {
                ""
            }
        )));
    }
    let back = |log: bool, t: f64| if log { 10f64.powf(t) } else { t };
    let drawable = || pts.iter().flatten().flatten();
    let xa = Axis::fit(drawable().map(|p| back(xlog, p.0)), x_scale, 0.02)
        .ok_or_else(|| Error::Data(format!("{}: line_chart: no x range", path.display())))?;
    let ya = Axis::fit(drawable().map(|p| back(ylog, p.1)), y_scale, 0.05)
        .ok_or_else(|| Error::Data(format!("{}: line_chart: no y range", path.display())))?;
    let entries: Vec<Entry> = series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.label.is_empty())
        .map(|(i, s)| (s.label.clone(), TAB10[i % TAB10.len()], i))
        .collect();

    render(path, (CHART_W, CHART_H), |root, txt| {
        let body = titled(root, txt, title);
        let labels: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let lw = if labels.is_empty() {
            0
        } else {
            legend_w(txt, &labels)
        };
        let (plot_area, legend_area) = body.split_horizontally(CHART_W - lw);
        let chart = build_chart(&plot_area, txt, &xa, &ya, x_label, y_label, 6, 20)?;
        let pa = chart.plotting_area();
        for (i, sp) in pts.iter().enumerate() {
            let color = TAB10[i % TAB10.len()];
            let style = color.stroke_width(2);
            let mut run: Vec<(f64, f64)> = Vec::new();
            let flush = |run: &mut Vec<(f64, f64)>| -> Drawn {
                if run.len() >= 2 {
                    pa.draw(&PathElement::new(std::mem::take(run), style))?;
                } else if let Some(p) = run.pop() {
                    pa.draw(&Circle::new(p, 3, color.filled()))?;
                }
                Ok(())
            };
            for p in sp {
                match p {
                    Some(p) => run.push(*p),
                    None => flush(&mut run)?,
                }
            }
            flush(&mut run)?;
            if sp.iter().flatten().count() <= 40 {
                for p in sp.iter().flatten() {
                    pa.draw(&Circle::new(*p, 3, color.filled()))?;
                }
            }
        }
        let (_, yr) = pa.get_pixel_range();
        let (_, ly) = legend_area.get_base_pixel();
        draw_legend(
            &legend_area,
            txt,
            &entries,
            yr.start - ly + 10,
            |a, (x, y), c, _| {
                a.draw(&PathElement::new(
                    vec![(x - 14, y), (x + 14, y)],
                    c.stroke_width(3),
                ))?;
                Ok(())
            },
        )
    })
}

/// Scatter chart of several series, optional y = x diagonal (kernel machine vs network, Fig. 4),
/// legend.
///
/// With `diagonal`, both axes share one range so that the dashed grey y = x line is the 45°
/// diagonal of the data range. Non-finite points are skipped. Series get distinct colours and
/// marker shapes; the legend sits to the right of the plot. Writes a 900×600 PNG.
pub fn scatter_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    diagonal: bool,
) -> Result<()> {
    check_series(path, "scatter_chart", series)?;
    let pts: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|s| {
            s.x.iter()
                .zip(&s.y)
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(&x, &y)| (x, y))
                .collect()
        })
        .collect();
    let all = || pts.iter().flatten();
    let (Some(xr), Some(yr)) = (
        finite_range(all().map(|p| p.0)),
        finite_range(all().map(|p| p.1)),
    ) else {
        return Err(Error::Data(format!(
            "{}: scatter_chart has no finite point",
            path.display()
        )));
    };
    let (xa, ya) = if diagonal {
        let (lo, hi) = (xr.0.min(yr.0), xr.1.max(yr.1));
        (Axis::linear(lo, hi, 0.04, 8), Axis::linear(lo, hi, 0.04, 8))
    } else {
        (
            Axis::linear(xr.0, xr.1, 0.04, 8),
            Axis::linear(yr.0, yr.1, 0.05, 8),
        )
    };
    let n_total: usize = pts.iter().map(Vec::len).sum();
    let radius = if n_total > 2000 { 2 } else { 4 };
    let mut entries: Vec<Entry> = series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.label.is_empty())
        .map(|(i, s)| (s.label.clone(), TAB10[i % TAB10.len()], i))
        .collect();
    if diagonal {
        entries.push(("y = x".into(), RGBColor(90, 90, 90), usize::MAX));
    }

    render(path, (CHART_W, CHART_H), |root, txt| {
        let body = titled(root, txt, title);
        let labels: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let lw = if labels.is_empty() {
            0
        } else {
            legend_w(txt, &labels)
        };
        let (plot_area, legend_area) = body.split_horizontally(CHART_W - lw);
        let mut chart = build_chart(&plot_area, txt, &xa, &ya, x_label, y_label, 6, 20)?;
        if diagonal {
            let (a, b) = (xa.lo.max(ya.lo), xa.hi.min(ya.hi));
            chart.draw_series(DashedLineSeries::new(
                vec![(a, a), (b, b)],
                8,
                6,
                RGBColor(90, 90, 90).stroke_width(2),
            ))?;
        }
        let pa = chart.plotting_area();
        for (i, sp) in pts.iter().enumerate() {
            let color = TAB10[i % TAB10.len()];
            for p in sp {
                draw_marker(pa, *p, i, radius, color, mix(color, BLACK, 0.45))?;
            }
        }
        let (_, yr) = pa.get_pixel_range();
        let (_, ly) = legend_area.get_base_pixel();
        draw_legend(
            &legend_area,
            txt,
            &entries,
            yr.start - ly + 10,
            |a, (x, y), c, kind| {
                if kind == usize::MAX {
                    for k in 0..3 {
                        let x0 = x - 14 + k * 11;
                        a.draw(&PathElement::new(
                            vec![(x0, y), (x0 + 6, y)],
                            c.stroke_width(2),
                        ))?;
                    }
                    Ok(())
                } else {
                    legend_marker(a, (x, y), kind, 5, c, mix(c, BLACK, 0.45))
                }
            },
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Heatmaps and point-value panels
// ---------------------------------------------------------------------------------------------

fn check_grid(path: &Path, name: &str, g: &Grid2d) -> Result<()> {
    let bad = |m: String| {
        Err(Error::Data(format!(
            "{}: grid '{name}': {m}",
            path.display()
        )))
    };
    if g.nx < 2 || g.ny < 2 {
        return bad(format!("needs at least 2×2 points, got {}×{}", g.nx, g.ny));
    }
    if g.nx.checked_mul(g.ny) != Some(g.values.len()) {
        return bad(format!(
            "{}×{} grid but {} values",
            g.nx,
            g.ny,
            g.values.len()
        ));
    }
    if !(g.x0.is_finite() && g.x1.is_finite() && g.y0.is_finite() && g.y1.is_finite()) {
        return bad("non-finite extent".into());
    }
    if g.x1 <= g.x0 || g.y1 <= g.y0 {
        return bad(format!(
            "empty extent x {}..{}, y {}..{}",
            g.x0, g.x1, g.y0, g.y1
        ));
    }
    Ok(())
}

fn check_overlay(path: &Path, name: &str, o: &Overlay) -> Result<()> {
    let n = o.x.len();
    let vlen = o.value.as_ref().map_or(n, Vec::len);
    if o.y.len() != n || o.class.len() != n || vlen != n {
        return Err(Error::Data(format!(
            "{}: overlay {name}: lengths differ (x {}, y {}, class {}, value {})",
            path.display(),
            n,
            o.y.len(),
            o.class.len(),
            vlen
        )));
    }
    Ok(())
}

impl Grid2d {
    fn dx(&self) -> f64 {
        (self.x1 - self.x0) / (self.nx - 1) as f64
    }
    fn dy(&self) -> f64 {
        (self.y1 - self.y0) / (self.ny - 1) as f64
    }
    /// Extent of the cells (cell centres at the grid points): (x min, x max, y min, y max).
    fn cell_extent(&self) -> (f64, f64, f64, f64) {
        let (hx, hy) = (self.dx() / 2.0, self.dy() / 2.0);
        (self.x0 - hx, self.x1 + hx, self.y0 - hy, self.y1 + hy)
    }
    fn draw(&self, pa: &Plot, color: impl Fn(f64) -> RGBColor) -> Drawn {
        let (dx, dy) = (self.dx(), self.dy());
        let (ex0, _, ey0, _) = self.cell_extent();
        for iy in 0..self.ny {
            for ix in 0..self.nx {
                let v = self.values[iy * self.nx + ix];
                let a = (ex0 + ix as f64 * dx, ey0 + iy as f64 * dy);
                let b = (ex0 + (ix + 1) as f64 * dx, ey0 + (iy + 1) as f64 * dy);
                pa.draw(&Rectangle::new([a, b], color(v).filled()))?;
            }
        }
        Ok(())
    }
}

/// Column/row layout for `n` panels: one row up to 4 panels, else a near-square grid.
fn panel_layout(n: usize) -> (usize, usize) {
    let cols = if n <= 4 {
        n
    } else {
        (n as f64).sqrt().ceil() as usize
    };
    (cols, n.div_ceil(cols))
}

fn union(a: Option<(f64, f64)>, b: Option<(f64, f64)>) -> Option<(f64, f64)> {
    match (a, b) {
        (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
        (a, None) => a,
        (None, b) => b,
    }
}

/// A closed interval (min, max).
type Span = (f64, f64);

/// Extent of the finite points, padded by 4 % so edge markers are not clipped.
fn padded_extent(pts: &[(f64, f64)]) -> (Option<Span>, Option<Span>) {
    let pad = |r: Option<(f64, f64)>| {
        r.map(|(a, b)| {
            let (a, b) = widen(a, b);
            let p = (b - a) * 0.04;
            (a - p, b + p)
        })
    };
    (
        pad(finite_range(pts.iter().map(|p| p.0))),
        pad(finite_range(pts.iter().map(|p| p.1))),
    )
}

/// Splits a panel figure into its panel cells (each with title band, plot column and colour
/// bar column) and a footer band.
struct PanelCell<'a> {
    main: Area<'a>,
    cbar: Area<'a>,
}

fn panel_cells<'a>(
    root: &Area<'a>,
    txt: &Txt,
    title: &str,
    names: &[&str],
    rows: usize,
    cols: usize,
) -> (Vec<PanelCell<'a>>, Area<'a>) {
    let body = titled(root, txt, title);
    let (grid_area, footer) = body.split_vertically(rows as u32 * PANEL_H);
    let cells = grid_area.split_evenly((rows, cols));
    let mut out = Vec::with_capacity(names.len());
    for (cell, name) in cells.into_iter().zip(names) {
        let px = txt.fit(name, PANEL_TITLE_PX, PANEL_W as i32 - 12);
        txt.put(
            &cell,
            name,
            (PANEL_W as i32 / 2, PANEL_TITLE_H as i32 / 2 + 2),
            px,
            H::Center,
            V::Center,
            false,
        );
        let (_, body) = cell.split_vertically(PANEL_TITLE_H);
        let (main, cbar) = body.split_horizontally(PANEL_W - CBAR_W);
        out.push(PanelCell { main, cbar });
    }
    (out, footer)
}

/// One footer legend item: a class (with its marker shape) or the test-point cross.
enum FooterItem {
    Class(usize),
    Cross,
}

impl FooterItem {
    fn label(&self) -> String {
        match self {
            FooterItem::Class(c) => format!("class {c}"),
            FooterItem::Cross => "test point".into(),
        }
    }
}

/// Extra height of each further footer line.
const FOOTER_LINE_H: u32 = 28;

/// Greedy line breaking of footer items into lines at most `width` pixels wide; returns the
/// items' widths and the index ranges of the lines.
fn footer_lines(
    face: &FontRef<'static>,
    items: &[FooterItem],
    width: i32,
) -> (Vec<i32>, Vec<std::ops::Range<usize>>) {
    let widths: Vec<i32> = items
        .iter()
        .map(|it| measure(face, &it.label(), LEGEND_PX).0.ceil() as i32 + 52)
        .collect();
    let mut lines = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, w) in widths.iter().enumerate() {
        if i > start && acc + w > width {
            lines.push(start..i);
            start = i;
            acc = 0;
        }
        acc += w;
    }
    if start < items.len() {
        lines.push(start..items.len());
    }
    (widths, lines)
}

/// Height of a footer with these items in a figure `width` pixels wide.
fn footer_height(items: &[FooterItem], width: u32) -> Result<u32> {
    let (_, lines) = footer_lines(face()?, items, width as i32 - 20);
    Ok(match lines.len() {
        0 => 0,
        n => FOOTER_H + FOOTER_LINE_H * (n as u32 - 1),
    })
}

/// Draws a centred legend of classes (marker shapes; optional class-coloured fill and
/// background-shading swatch) and the cross mark, wrapped onto several lines when needed.
fn draw_footer(
    area: &Area,
    txt: &Txt,
    items: &[FooterItem],
    fill_by_class: bool,
    shading: bool,
) -> Drawn {
    let (w, _) = area.dim_in_pixel();
    let (widths, lines) = footer_lines(txt.face, items, w as i32 - 20);
    for (li, line) in lines.into_iter().enumerate() {
        let y = FOOTER_H as i32 / 2 + li as i32 * FOOTER_LINE_H as i32;
        let total: i32 = widths[line.clone()].iter().sum();
        let mut x = (w as i32 - total).max(0) / 2;
        for k in line {
            match &items[k] {
                FooterItem::Cross => cross_px(area, (x + 8, y), 6)?,
                FooterItem::Class(c) => {
                    if shading {
                        area.draw(&Rectangle::new(
                            [(x - 4, y - 11), (x + 20, y + 11)],
                            light_class(*c).filled(),
                        ))?;
                    }
                    let fill = if fill_by_class {
                        class_color(*c)
                    } else {
                        RGBColor(150, 150, 150)
                    };
                    legend_marker(area, (x + 8, y), *c, 5, fill, BLACK)?;
                }
            }
            txt.put(
                area,
                &items[k].label(),
                (x + 26, y),
                LEGEND_PX,
                H::Left,
                V::Center,
                false,
            );
            x += widths[k];
        }
    }
    Ok(())
}

fn distinct(classes: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut c: Vec<usize> = classes.collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// Several heatmap panels side by side (e.g. Fig. 3: one panel per class; Fig. 5: kernel value |
/// MC std), each with its own title and colour bar with a label, a perceptual colormap
/// (viridis), optional overlay.
///
/// Each panel gets its own colour range (finite min..max of its grid). Overlay points are drawn
/// on every panel with a black edge; their shape encodes the class and their fill the class
/// colour, or — when `overlay.value` is given — that value on the panel's own colour scale.
/// With class-coloured points a class legend is drawn below the panels. Up to 4 panels form one
/// row; more form a near-square grid. Each panel is 450×420 pixels, plus a 44-pixel title band
/// and, with a class legend, a 36-pixel legend band (28 pixels more per wrapped line).
pub fn heatmaps(
    path: &Path,
    title: &str,
    panels: &[(String, Grid2d)],
    colorbar_label: &str,
    overlay: Option<&Overlay>,
) -> Result<()> {
    if panels.is_empty() {
        return Err(Error::Data(format!(
            "{}: heatmaps needs at least one panel",
            path.display()
        )));
    }
    let mut cmaps = Vec::with_capacity(panels.len());
    for (name, g) in panels {
        check_grid(path, name, g)?;
        let cm = Cmap::viridis_for(g.values.iter().copied()).ok_or_else(|| {
            Error::Data(format!(
                "{}: grid '{name}' has no finite value",
                path.display()
            ))
        })?;
        cmaps.push(cm);
    }
    if let Some(o) = overlay {
        check_overlay(path, "of heatmaps", o)?;
    }
    let opts: Vec<(f64, f64)> = overlay
        .map(|o| {
            o.x.iter()
                .zip(&o.y)
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(x, y)| (*x, *y))
                .collect()
        })
        .unwrap_or_default();
    let (oxr, oyr) = padded_extent(&opts);
    let items: Vec<FooterItem> = match overlay {
        Some(o) if o.value.is_none() && !opts.is_empty() => distinct(o.class.iter().copied())
            .into_iter()
            .map(FooterItem::Class)
            .collect(),
        _ => vec![],
    };
    let (cols, rows) = panel_layout(panels.len());
    let title_h = if title.is_empty() { 8 } else { TITLE_H };
    let footer_h = footer_height(&items, cols as u32 * PANEL_W)?;
    let size = (
        cols as u32 * PANEL_W,
        title_h + rows as u32 * PANEL_H + footer_h,
    );

    render(path, size, |root, txt| {
        let names: Vec<&str> = panels.iter().map(|p| p.0.as_str()).collect();
        let (cells, footer_area) = panel_cells(root, txt, title, &names, rows, cols);
        for ((cell, (_, g)), cmap) in cells.iter().zip(panels).zip(&cmaps) {
            let (ex0, ex1, ey0, ey1) = g.cell_extent();
            let xr = union(Some((ex0, ex1)), oxr).unwrap_or((ex0, ex1));
            let yr = union(Some((ey0, ey1)), oyr).unwrap_or((ey0, ey1));
            let (xa, ya) = (
                Axis::linear(xr.0, xr.1, 0.0, 5),
                Axis::linear(yr.0, yr.1, 0.0, 5),
            );
            let chart = build_chart(&cell.main, txt, &xa, &ya, "", "", 4, 4)?;
            let pa = chart.plotting_area();
            g.draw(pa, |v| cmap.color(v))?;
            if let Some(o) = overlay {
                for i in 0..o.x.len() {
                    let p = (o.x[i], o.y[i]);
                    if !(p.0.is_finite() && p.1.is_finite()) {
                        continue;
                    }
                    let fill = match &o.value {
                        Some(v) => cmap.color(v[i]),
                        None => class_color(o.class[i]),
                    };
                    draw_marker(pa, p, o.class[i], 4, fill, BLACK)?;
                }
            }
            let (_, rows_px) = pa.get_pixel_range();
            draw_colorbar(&cell.cbar, txt, *cmap, colorbar_label, rows_px)?;
        }
        draw_footer(&footer_area, txt, &items, true, false)
    })
}

/// Fig. 6 style: panels of training points coloured by a per-point value (diverging colormap
/// centred at 0, colour bar), over an optional background grid of classes (decision regions,
/// light colours), one panel per (test point, class); `marks` are extra points (the test points)
/// drawn as crosses.
///
/// Each panel has its own symmetric colour range `[-m, m]`, `m` = largest finite |value| in the
/// panel (blue negative, white 0, red positive); points are drawn in order of increasing |value|
/// so the largest contributions are on top. Marker shapes encode the training class. The
/// background grid's values are class indices (rounded; negative or non-finite → white). When a
/// panel's overlay has no `value`, its points are coloured by class and it gets no colour bar.
/// Up to 4 panels form one row; more form a near-square grid (9 panels → 3×3). Each panel is
/// 450×420 pixels, plus a 44-pixel title band and a 36-pixel legend band of classes and crosses
/// (28 pixels more per wrapped line).
pub fn point_value_panels(
    path: &Path,
    title: &str,
    panels: &[(String, Overlay, Option<Grid2d>)],
    marks: &[(f64, f64)],
    colorbar_label: &str,
) -> Result<()> {
    if panels.is_empty() {
        return Err(Error::Data(format!(
            "{}: point_value_panels needs at least one panel",
            path.display()
        )));
    }
    let mut cmaps: Vec<Option<Cmap>> = Vec::with_capacity(panels.len());
    let mut any_point = false;
    for (name, o, g) in panels {
        check_overlay(path, &format!("'{name}'"), o)?;
        if let Some(g) = g {
            check_grid(path, name, g)?;
        }
        any_point |=
            o.x.iter()
                .zip(&o.y)
                .any(|(x, y)| x.is_finite() && y.is_finite());
        cmaps.push(match &o.value {
            Some(v) => Some(Cmap::diverging_for(v.iter().copied()).ok_or_else(|| {
                Error::Data(format!(
                    "{}: panel '{name}' has no finite value",
                    path.display()
                ))
            })?),
            None => None,
        });
    }
    if !any_point {
        return Err(Error::Data(format!(
            "{}: point_value_panels has no point with finite coordinates",
            path.display()
        )));
    }
    let marks: Vec<(f64, f64)> = marks
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let mut items: Vec<FooterItem> =
        distinct(panels.iter().flat_map(|(_, o, _)| o.class.iter().copied()))
            .into_iter()
            .map(FooterItem::Class)
            .collect();
    if !marks.is_empty() {
        items.push(FooterItem::Cross);
    }
    let shading = panels.iter().any(|(_, _, g)| g.is_some());
    let fill_by_class = cmaps.iter().all(Option::is_none);
    let (cols, rows) = panel_layout(panels.len());
    let title_h = if title.is_empty() { 8 } else { TITLE_H };
    let footer_h = footer_height(&items, cols as u32 * PANEL_W)?;
    let size = (
        cols as u32 * PANEL_W,
        title_h + rows as u32 * PANEL_H + footer_h,
    );

    render(path, size, |root, txt| {
        let names: Vec<&str> = panels.iter().map(|p| p.0.as_str()).collect();
        let (cells, footer_area) = panel_cells(root, txt, title, &names, rows, cols);
        for ((cell, (_, o, g)), cmap) in cells.iter().zip(panels).zip(&cmaps) {
            let pts: Vec<(f64, f64)> =
                o.x.iter()
                    .zip(&o.y)
                    .map(|(x, y)| (*x, *y))
                    .chain(marks.iter().copied())
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect();
            let (mut xr, mut yr) = padded_extent(&pts);
            if let Some(g) = g {
                let (ex0, ex1, ey0, ey1) = g.cell_extent();
                xr = union(xr, Some((ex0, ex1)));
                yr = union(yr, Some((ey0, ey1)));
            }
            let (xr, yr) = (xr.unwrap_or((0.0, 1.0)), yr.unwrap_or((0.0, 1.0)));
            let (xa, ya) = (
                Axis::linear(xr.0, xr.1, 0.0, 5),
                Axis::linear(yr.0, yr.1, 0.0, 5),
            );
            let chart = build_chart(&cell.main, txt, &xa, &ya, "", "", 4, 4)?;
            let pa = chart.plotting_area();
            if let Some(g) = g {
                g.draw(pa, |v| {
                    if v.is_finite() && v > -0.5 {
                        light_class(v.round() as usize)
                    } else {
                        WHITE
                    }
                })?;
            }
            let mut order: Vec<usize> = (0..o.x.len()).collect();
            if let Some(v) = &o.value {
                let key = |i: usize| if v[i].is_finite() { v[i].abs() } else { -1.0 };
                order.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
            }
            for i in order {
                let p = (o.x[i], o.y[i]);
                if !(p.0.is_finite() && p.1.is_finite()) {
                    continue;
                }
                let fill = match (&o.value, cmap) {
                    (Some(v), Some(cm)) => cm.color(v[i]),
                    _ => class_color(o.class[i]),
                };
                draw_marker(pa, p, o.class[i], 4, fill, RGBColor(40, 40, 40))?;
            }
            for m in &marks {
                draw_cross(pa, *m, 7)?;
            }
            if let Some(cm) = cmap {
                let (_, rows_px) = pa.get_pixel_range();
                draw_colorbar(&cell.cbar, txt, *cm, colorbar_label, rows_px)?;
            }
        }
        draw_footer(&footer_area, txt, &items, fill_by_class, shading)
    })
}

// ---------------------------------------------------------------------------------------------
// Matrix
// ---------------------------------------------------------------------------------------------

/// A matrix heatmap with row/column tick labels (gradient-similarity matrix of the Domingos
/// notebook), values printed in cells when small (≤ 12×12).
///
/// `values` is row-major `n × n` with `n = labels.len()`; row 0 is drawn at the top, column 0
/// at the left. The colour map is diverging (RdBu, white at 0, symmetric range) when the finite
/// values have both signs, viridis otherwise; non-finite cells are grey. Column labels are
/// rotated when they do not fit the cell width; with many rows only every k-th label is shown.
/// Writes a 900×780 PNG.
pub fn matrix(
    path: &Path,
    title: &str,
    labels: &[String],
    values: &[f64],
    colorbar_label: &str,
) -> Result<()> {
    let n = labels.len();
    if n == 0 {
        return Err(Error::Data(format!(
            "{}: matrix needs at least one row",
            path.display()
        )));
    }
    if n.checked_mul(n) != Some(values.len()) {
        return Err(Error::Data(format!(
            "{}: matrix has {n} labels but {} values (expected {})",
            path.display(),
            values.len(),
            n.saturating_mul(n)
        )));
    }
    let (lo, hi) = finite_range(values.iter().copied())
        .ok_or_else(|| Error::Data(format!("{}: matrix has no finite value", path.display())))?;
    let cmap = if lo < 0.0 && hi > 0.0 {
        Cmap::Diverging(lo.abs().max(hi))
    } else {
        let (lo, hi) = widen(lo, hi);
        Cmap::Viridis(lo, hi)
    };
    let fmt = cell_formatter(lo.abs().max(hi.abs()));

    render(path, (MATRIX_W, MATRIX_H), |root, txt| {
        let title_h = if title.is_empty() { 12 } else { TITLE_H as i32 };
        if !title.is_empty() {
            let px = txt.fit(title, TITLE_PX, MATRIX_W as i32 - 20);
            txt.put(
                root,
                title,
                (MATRIX_W as i32 / 2, title_h / 2),
                px,
                H::Center,
                V::Center,
                false,
            );
        }
        let lab_px = if n <= 20 { TICK_PX } else { 12.0 };
        let max_lw = labels
            .iter()
            .map(|l| txt.width(l, lab_px))
            .max()
            .unwrap_or(0);
        let left = 12 + max_lw + 8;
        let cbar_w = CBAR_W as i32;
        let avail_w = MATRIX_W as i32 - left - cbar_w - 16;
        // Column labels: horizontal when they fit a cell, else rotated (bottom band grows).
        let cell_guess = (avail_w / n as i32).max(1);
        let rotate = max_lw > cell_guess - 6;
        let bottom = if rotate {
            max_lw + 16
        } else {
            lab_px as i32 + 18
        };
        let avail_h = MATRIX_H as i32 - title_h - bottom - 8;
        let cell = (avail_w.min(avail_h) as f64 / n as f64).max(1e-3);
        let side = (cell * n as f64).round() as i32;
        let x0 = left + (avail_w - side).max(0) / 2;
        let y0 = title_h;
        let edge = |k: usize| (k as f64 * cell).round() as i32;
        for r in 0..n {
            for c in 0..n {
                let col = cmap.color(values[r * n + c]);
                root.draw(&Rectangle::new(
                    [
                        (x0 + edge(c), y0 + edge(r)),
                        (x0 + edge(c + 1), y0 + edge(r + 1)),
                    ],
                    col.filled(),
                ))?;
            }
        }
        root.draw(&Rectangle::new(
            [(x0, y0), (x0 + side, y0 + side)],
            AXIS_INK,
        ))?;
        // Thin out labels so that they never overlap.
        let step = ((lab_px as f64 + 4.0) / cell).ceil().max(1.0) as usize;
        let centre = |k: usize| ((k as f64 + 0.5) * cell).round() as i32;
        for (r, l) in labels.iter().enumerate().step_by(step) {
            txt.put(
                root,
                l,
                (x0 - 7, y0 + centre(r)),
                lab_px,
                H::Right,
                V::Center,
                false,
            );
        }
        for (c, l) in labels
            .iter()
            .enumerate()
            .step_by(if rotate { step } else { 1 })
        {
            let at = (x0 + centre(c), y0 + side + 7);
            if rotate {
                txt.put(root, l, at, lab_px, H::Right, V::Center, true);
            } else {
                txt.put(root, l, at, lab_px, H::Center, V::Top, false);
            }
        }
        if n <= 12 {
            let px = (cell as f32 * 0.24).clamp(10.0, 16.0);
            for r in 0..n {
                for c in 0..n {
                    let v = values[r * n + c];
                    let ink = if luminance(cmap.color(v)) > 0.5 {
                        INK
                    } else {
                        RGBColor(255, 255, 255)
                    };
                    let at = (x0 + centre(c), y0 + centre(r));
                    txt.put_color(root, &fmt(v), at, px, ink, H::Center, V::Center, false);
                }
            }
        }
        let cb = root.clone().shrink((x0 + side + 12, 0), (CBAR_W, MATRIX_H));
        draw_colorbar(&cb, txt, cmap, colorbar_label, y0..y0 + side)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIG: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

    /// Checks signature, IHDR size, no leftover temp files, and a non-blank render.
    fn check_png(path: &Path, w: u32, h: u32) {
        let bytes = std::fs::read(path).expect("png written");
        assert!(
            bytes.len() > 8_000,
            "{} is only {} bytes",
            path.display(),
            bytes.len()
        );
        assert_eq!(bytes[..8], PNG_SIG, "PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR");
        let bw = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let bh = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((bw, bh), (w, h), "pixel size of {}", path.display());
        let dir = path.parent().unwrap();
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!name.contains(".tmp-"), "temp file left behind: {name}");
        }
        let buf = LAST_RENDER.with(|l| l.borrow().clone());
        assert_eq!(buf.len(), (w * h * 3) as usize);
        let mut colors = std::collections::HashSet::new();
        for px in buf.chunks_exact(3) {
            colors.insert((px[0], px[1], px[2]));
            if colors.len() > 64 {
                break;
            }
        }
        assert!(colors.len() > 64, "only {} distinct colours", colors.len());
        // Dump for visual inspection when asked to.
        if let Ok(dir) = std::env::var("PLOT_EXAMPLES_DIR") {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::copy(path, Path::new(&dir).join(path.file_name().unwrap()));
        }
    }

    fn blobs(n: usize) -> Overlay {
        // Three deterministic clusters (a small toy problem like the paper's 2-D data).
        let centres = [(-1.5, -1.0), (1.5, -1.0), (0.0, 1.6)];
        let mut o = Overlay {
            x: vec![],
            y: vec![],
            class: vec![],
            value: None,
        };
        for i in 0..n {
            let c = i % 3;
            let a = i as f64 * 2.399;
            let r = 0.25 + 0.5 * ((i * 7919) % 97) as f64 / 97.0;
            o.x.push(centres[c].0 + r * a.cos());
            o.y.push(centres[c].1 + r * a.sin());
            o.class.push(c);
        }
        o
    }

    fn grid(f: impl Fn(f64, f64) -> f64) -> Grid2d {
        let (nx, ny) = (60, 50);
        let (x0, x1, y0, y1) = (-3.0, 3.0, -2.5, 3.0);
        let mut values = Vec::with_capacity(nx * ny);
        for iy in 0..ny {
            for ix in 0..nx {
                let x = x0 + ix as f64 * (x1 - x0) / (nx - 1) as f64;
                let y = y0 + iy as f64 * (y1 - y0) / (ny - 1) as f64;
                values.push(f(x, y));
            }
        }
        Grid2d {
            nx,
            ny,
            x0,
            x1,
            y0,
            y1,
            values,
        }
    }

    #[test]
    fn number_formatting() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(0.30000000000000004), "0.3");
        assert_eq!(fmt_num(2.5), "2.5");
        assert_eq!(fmt_num(-1200.0), "-1200");
        assert_eq!(fmt_num(1e-5), "1e-5");
        assert_eq!(fmt_num(2.5e6), "2.5e6");
        let f = cell_formatter(1.0);
        assert_eq!(
            (f(0.8), f(-1.0), f(-0.001)),
            ("0.80".into(), "-1.00".into(), "0.00".into())
        );
        let f = cell_formatter(0.5);
        assert_eq!(f(0.12345), "0.123");
        assert_eq!(cell_formatter(2e5)(1.5e5), "1.5e5");
        assert_eq!(superscript(-12), "⁻¹²");
        let ax = Axis::log(1e-6, 1.0);
        assert!(ax.ticks.len() >= 3);
        assert_eq!(ax.label(-6.0), "10⁻⁶");
        assert_eq!(
            ax.label(0.0),
            "10⁰",
            "all decades as powers once one needs it"
        );
        let ax = Axis::log(0.01, 100.0);
        assert_eq!(
            (ax.label(-2.0), ax.label(0.0), ax.label(2.0)),
            ("0.01".into(), "1".into(), "100".into())
        );
        let ax = Axis::log(2.0, 8.0);
        assert!(ax.ticks.len() >= 2, "{:?}", ax.ticks);
        let ax = Axis::linear(0.0, 1.0, 0.0, 8);
        assert!(ax.ticks.contains(&0.0) && ax.ticks.len() >= 5);
    }

    #[test]
    fn line_chart_linear_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let xs: Vec<f64> = (0..200).map(|i| i as f64).collect();
        let mut a = Series::new(
            "EPK − DPK (cosine error)",
            xs.clone(),
            xs.iter().map(|x| (x / 20.0).sin() * 0.1).collect(),
        );
        a.y[50] = f64::NAN;
        let b = Series::new(
            "EPK − NTK",
            xs.clone(),
            xs.iter().map(|x| (x / 35.0).cos() * 0.05 + 0.02).collect(),
        );
        let c = Series::new(
            "short",
            vec![0.0, 50.0, 100.0, 150.0],
            vec![0.0, 0.05, -0.05, 0.1],
        );
        let p = dir.path().join("line_linear.png");
        line_chart(
            &p,
            "Gradient alignment along the training path",
            "training step s",
            "error (rad)",
            &[a, b, c],
            Scale::Linear,
            Scale::Linear,
        )
        .unwrap();
        check_png(&p, CHART_W, CHART_H);

        let steps: Vec<f64> = (1..=500).map(|i| i as f64).collect();
        let loss = Series::new(
            "train loss",
            steps.clone(),
            steps
                .iter()
                .map(|s| 2.0 * (-s / 60.0).exp() + 1e-4)
                .collect(),
        );
        let mut test = Series::new(
            "test loss",
            steps.clone(),
            steps
                .iter()
                .map(|s| 2.2 * (-s / 70.0).exp() + 3e-3)
                .collect(),
        );
        test.y[10] = 0.0; // skipped on a log axis
        test.y[11] = -1.0;
        let p = dir.path().join("line_log.png");
        line_chart(
            &p,
            "Loss",
            "step",
            "loss",
            &[loss.clone(), test],
            Scale::Log,
            Scale::Log,
        )
        .unwrap();
        check_png(&p, CHART_W, CHART_H);

        let p = dir.path().join("line_semilog.png");
        line_chart(
            &p,
            "Narrow log range",
            "step",
            "loss (nats)",
            &[Series::new("", vec![1.0, 2.0, 3.0], vec![2.0, 4.0, 8.0])],
            Scale::Linear,
            Scale::Log,
        )
        .unwrap();
        check_png(&p, CHART_W, CHART_H);
    }

    #[test]
    fn scatter_with_diagonal() {
        let dir = tempfile::tempdir().unwrap();
        let x: Vec<f64> = (0..100)
            .map(|i| ((i * 37) % 100) as f64 / 25.0 - 2.0)
            .collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v + 1e-3 * ((i % 7) as f64 - 3.0))
            .collect();
        let s1 = Series::new("class 1", x.clone(), y.clone());
        let s2 = Series::new(
            "class 2",
            x.iter().map(|v| v * 0.5).collect(),
            y.iter().map(|v| v * 0.5 + 0.3).collect(),
        );
        let p = dir.path().join("scatter.png");
        scatter_chart(
            &p,
            "EPK kernel machine vs network (100 test points)",
            "network output f(x)",
            "kernel machine output",
            &[s1, s2],
            true,
        )
        .unwrap();
        check_png(&p, CHART_W, CHART_H);
    }

    #[test]
    fn heatmap_panels() {
        let dir = tempfile::tempdir().unwrap();
        let o = blobs(90);
        let panels: Vec<(String, Grid2d)> = (0..3)
            .map(|c| {
                let g = grid(|x, y| {
                    let (cx, cy) = [(-1.5, -1.0), (1.5, -1.0), (0.0, 1.6)][c];
                    1.0 / (1.0 + (-(2.0 - ((x - cx).powi(2) + (y - cy).powi(2)))).exp())
                });
                (format!("class {c}"), g)
            })
            .collect();
        let p = dir.path().join("heatmaps3.png");
        heatmaps(
            &p,
            "SVM-updated kernel predictions",
            &panels,
            "P(class)",
            Some(&o),
        )
        .unwrap();
        check_png(&p, 3 * PANEL_W, TITLE_H + PANEL_H + FOOTER_H);

        let mut std_grid = grid(|x, y| 0.05 + 0.01 * (x * x + y * y).sqrt());
        std_grid.values[5] = f64::NAN;
        let kv = grid(|x, y| 1e3 * (x * y).tanh());
        let p = dir.path().join("heatmaps2.png");
        let mut ov = blobs(30);
        ov.value = Some(ov.x.iter().map(|x| 800.0 * x.tanh()).collect());
        heatmaps(
            &p,
            "Kernel value and MC std",
            &[
                ("kernel value".into(), kv),
                ("MC std of softmax".into(), std_grid),
            ],
            "value",
            Some(&ov),
        )
        .unwrap();
        check_png(&p, 2 * PANEL_W, TITLE_H + PANEL_H);
    }

    #[test]
    fn point_value_panels_3x3() {
        let dir = tempfile::tempdir().unwrap();
        let centres = [(-1.5, -1.0), (1.5, -1.0), (0.0, 1.6)];
        let bg = grid(|x, y| {
            let d: Vec<f64> = centres
                .iter()
                .map(|c| (x - c.0).powi(2) + (y - c.1).powi(2))
                .collect();
            (0..3)
                .min_by(|&a, &b| d[a].partial_cmp(&d[b]).unwrap())
                .unwrap() as f64
        });
        let mut panels = Vec::new();
        for (t, centre) in centres.iter().enumerate() {
            for c in 0..3 {
                let mut o = blobs(60);
                o.value = Some(
                    o.x.iter()
                        .zip(&o.y)
                        .map(|(x, y)| {
                            ((x - centre.0) * (c as f64 - 1.0) + y * 0.3) * 10f64.powi(t as i32 - 3)
                        })
                        .collect(),
                );
                panels.push((format!("test point {t}, class {c}"), o, Some(bg.clone())));
            }
        }
        let p = dir.path().join("point_values.png");
        point_value_panels(
            &p,
            "Kernel value of each training point",
            &panels,
            &centres,
            "kernel value",
        )
        .unwrap();
        check_png(&p, 3 * PANEL_W, TITLE_H + 3 * PANEL_H + FOOTER_H);
    }

    #[test]
    fn matrices() {
        let dir = tempfile::tempdir().unwrap();
        let n = 8;
        let labels: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
        let values: Vec<f64> = (0..n * n)
            .map(|k| {
                let (r, c) = (k / n, k % n);
                if r == c {
                    1.0
                } else {
                    ((r * 3 + c * 5) % 11) as f64 / 5.0 - 1.0
                }
            })
            .collect();
        let p = dir.path().join("matrix_small.png");
        matrix(
            &p,
            "Gradient cosine similarity",
            &labels,
            &values,
            "cos ∠(∇f(xᵢ), ∇f(xⱼ))",
        )
        .unwrap();
        check_png(&p, MATRIX_W, MATRIX_H);

        let n = 40;
        let labels: Vec<String> = (0..n).map(|i| format!("train sample {i}")).collect();
        let values: Vec<f64> = (0..n * n)
            .map(|k| ((k / n) as f64 - (k % n) as f64).abs().sqrt())
            .collect();
        let p = dir.path().join("matrix_large.png");
        matrix(&p, "Gram matrix", &labels, &values, "K(xᵢ, xⱼ)").unwrap();
        check_png(&p, MATRIX_W, MATRIX_H);
    }

    #[test]
    fn awkward_but_valid_input_renders() {
        let dir = tempfile::tempdir().unwrap();
        // Extreme magnitudes, a constant series and a single point.
        let p = dir.path().join("extreme.png");
        let s = vec![
            Series::new("huge", vec![-1e308, 1e308], vec![1e308, -1e308]),
            Series::new("constant", vec![0.0, 1.0], vec![5.0, 5.0]),
            Series::new("one point", vec![0.5], vec![0.0]),
        ];
        line_chart(&p, "extreme", "x", "y", &s, Scale::Linear, Scale::Linear).unwrap();
        line_chart(&p, "extreme log", "x", "y", &s, Scale::Log, Scale::Log).unwrap();
        scatter_chart(&p, "extreme", "x", "y", &s, true).unwrap();
        let tiny = Series::new("tiny span", vec![1.0, 1.0 + 1e-12], vec![1e-300, 2e-300]);
        line_chart(
            &p,
            "tiny",
            "x",
            "y",
            std::slice::from_ref(&tiny),
            Scale::Linear,
            Scale::Linear,
        )
        .unwrap();
        line_chart(&p, "tiny", "x", "y", &[tiny], Scale::Linear, Scale::Log).unwrap();
        // A very long title and legend label are shrunk to fit.
        let long = "a very long title ".repeat(8);
        line_chart(
            &p,
            &long,
            &long,
            &long,
            &[Series::new(long.clone(), vec![0.0, 1.0], vec![0.0, 1.0])],
            Scale::Linear,
            Scale::Linear,
        )
        .unwrap();
        check_png(&p, CHART_W, CHART_H);
        // Ten classes in one panel: the class legend wraps onto a second line.
        let o = Overlay {
            x: (0..100).map(|i| (i % 10) as f64).collect(),
            y: (0..100).map(|i| (i / 10) as f64).collect(),
            class: (0..100).map(|i| i % 10).collect(),
            value: None,
        };
        let g = grid(|x, y| x * y);
        let p = dir.path().join("ten_classes.png");
        heatmaps(&p, "ten classes", &[("one panel".into(), g)], "", Some(&o)).unwrap();
        check_png(
            &p,
            PANEL_W,
            TITLE_H + PANEL_H + FOOTER_H + 2 * FOOTER_LINE_H,
        );
        // Constant values, infinite cells, points without values, no marks, no background.
        let gc = Grid2d {
            nx: 2,
            ny: 2,
            x0: 0.0,
            x1: 1.0,
            y0: 0.0,
            y1: 1.0,
            values: vec![3.0, 3.0, f64::INFINITY, 3.0],
        };
        heatmaps(&p, "", &[("constant".into(), gc)], "c", None).unwrap();
        let o2 = Overlay {
            x: vec![0.0, 1.0],
            y: vec![0.0, 1.0],
            class: vec![0, 1],
            value: None,
        };
        point_value_panels(&p, "", &[("no values".into(), o2, None)], &[], "").unwrap();
        // A large matrix with more rows than pixels.
        let n = 900;
        let labels: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let values: Vec<f64> = (0..n * n).map(|k| (k % 7) as f64).collect();
        let p = dir.path().join("matrix_huge.png");
        matrix(&p, "huge", &labels, &values, "").unwrap();
        check_png(&p, MATRIX_W, MATRIX_H);
        let p = dir.path().join("matrix_one.png");
        matrix(&p, "", &["only".into()], &[-2.0], "v").unwrap();
    }

    #[test]
    fn font_has_the_glyphs_we_use() {
        let f = face().unwrap();
        for c in "−∠∇ᵢⱼ⁰¹²³⁴⁵⁶⁷⁸⁹⁻×μσ".chars() {
            assert_ne!(f.glyph_id(c).0, 0, "DejaVu Sans lacks {c:?}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.png");
        let is_data = |r: Result<()>| matches!(r, Err(Error::Data(_)));
        assert!(is_data(line_chart(
            &p,
            "t",
            "x",
            "y",
            &[],
            Scale::Linear,
            Scale::Linear
        )));
        let mismatched = Series::new("a", vec![1.0, 2.0], vec![1.0]);
        assert!(is_data(line_chart(
            &p,
            "t",
            "x",
            "y",
            std::slice::from_ref(&mismatched),
            Scale::Linear,
            Scale::Linear
        )));
        let nan = Series::new("a", vec![f64::NAN, 1.0], vec![1.0, f64::INFINITY]);
        assert!(is_data(line_chart(
            &p,
            "t",
            "x",
            "y",
            std::slice::from_ref(&nan),
            Scale::Linear,
            Scale::Linear
        )));
        let neg = Series::new("a", vec![1.0, 2.0], vec![-1.0, 0.0]);
        assert!(is_data(line_chart(
            &p,
            "t",
            "x",
            "y",
            &[neg],
            Scale::Linear,
            Scale::Log
        )));
        assert!(is_data(scatter_chart(&p, "t", "x", "y", &[nan], true)));
        assert!(is_data(scatter_chart(
            &p,
            "t",
            "x",
            "y",
            &[mismatched],
            false
        )));
        assert!(is_data(heatmaps(&p, "t", &[], "v", None)));
        let g = Grid2d {
            nx: 2,
            ny: 2,
            x0: 0.0,
            x1: 1.0,
            y0: 0.0,
            y1: 1.0,
            values: vec![1.0; 3],
        };
        assert!(is_data(heatmaps(
            &p,
            "t",
            &[("a".into(), g.clone())],
            "v",
            None
        )));
        let g1 = Grid2d {
            nx: 1,
            values: vec![1.0; 2],
            ..g.clone()
        };
        assert!(is_data(heatmaps(&p, "t", &[("a".into(), g1)], "v", None)));
        let gnan = Grid2d {
            values: vec![f64::NAN; 4],
            ..g.clone()
        };
        assert!(is_data(heatmaps(&p, "t", &[("a".into(), gnan)], "v", None)));
        let gok = Grid2d {
            values: vec![1.0; 4],
            ..g.clone()
        };
        let bad_o = Overlay {
            x: vec![0.0],
            y: vec![],
            class: vec![0],
            value: None,
        };
        assert!(is_data(heatmaps(
            &p,
            "t",
            &[("a".into(), gok)],
            "v",
            Some(&bad_o)
        )));
        assert!(is_data(point_value_panels(&p, "t", &[], &[], "v")));
        let o = Overlay {
            x: vec![0.0],
            y: vec![0.0],
            class: vec![0],
            value: Some(vec![f64::NAN]),
        };
        assert!(is_data(point_value_panels(
            &p,
            "t",
            &[("a".into(), o, None)],
            &[],
            "v"
        )));
        assert!(is_data(matrix(&p, "t", &[], &[], "v")));
        assert!(is_data(matrix(
            &p,
            "t",
            &["a".into(), "b".into()],
            &[1.0; 3],
            "v"
        )));
        assert!(is_data(matrix(&p, "t", &["a".into()], &[f64::NAN], "v")));
        assert!(!p.exists());
        // A missing directory is an I/O error naming the path; nothing is left behind.
        let missing = dir.path().join("no/such/dir/x.png");
        let ok = Series::new("a", vec![1.0, 2.0], vec![1.0, 2.0]);
        match line_chart(&missing, "t", "x", "y", &[ok], Scale::Linear, Scale::Linear) {
            Err(Error::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected Io error, got {other:?}"),
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn overwrite_is_atomic_and_repeatable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("again.png");
        let s = Series::new("a", vec![1.0, 2.0, 3.0], vec![3.0, 1.0, 2.0]);
        for _ in 0..2 {
            line_chart(
                &p,
                "twice",
                "x",
                "y",
                std::slice::from_ref(&s),
                Scale::Linear,
                Scale::Linear,
            )
            .unwrap();
        }
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["again.png".to_string()]);
    }
}
