//! PNG figures for the reports (the EPK paper's Figs. 2–8) and the notebooks.
//!
//! Plotting never computes: every chart takes ready-made data and renders one PNG image, a
//! [`Chart`] value that can be saved ([`Chart::save`], atomic) or shown inline in an evcxr
//! notebook ([`Chart::evcxr_display`]). The functions that take a path first (`line_chart`,
//! `scatter_chart`, [`heatmaps`], `point_value_panels`, [`matrix`]) render and save in one
//! call.
//!
//! Shapes are drawn with `plotters` (bitmap backend). Text is rasterised with `ab_glyph` from
//! DejaVu Sans embedded in the binary (`data/fonts/DejaVuSans.ttf`, license in
//! `data/fonts/LICENSE-DejaVu.txt`), so no system font library is needed. The font is also
//! registered with plotters' `ab_glyph` backend (it measures text while laying out a chart), but
//! all visible text goes through this module's own text layer: plotters 0.3.7's `ab_glyph`
//! renderer drops each glyph's left side bearing, which spaces letters unevenly.
//!
//! One concept per file: text layout and number formatting (`text.rs`), axes and ranges
//! (`axis.rs`), colours and colour maps (`colour.rs`), markers, colour bars, legends and titles
//! (`marks.rs`), and the chart families: line and scatter charts (`xy.rs`), heatmap and
//! point-value panels (`panels.rs`), matrices (`matrix.rs`).
//!
//! Invalid input (no series, mismatched lengths, nothing finite to draw, degenerate grids)
//! is reported as [`Error::Data`]; these functions never panic on data.

mod axis;
mod colour;
mod marks;
mod matrix;
mod panels;
mod range;
mod text;
mod uq;
mod xy;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

use image::ImageEncoder;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

pub use matrix::matrix;
pub use panels::heatmaps;
pub(crate) use panels::point_value_panels;
pub use uq::{BarSeries, ImageTile, ReliabilityPanel};
pub use xy::{LineChart, ScatterChart};
pub(crate) use xy::{line_chart, scatter_chart};

use axis::Axis1;
use text::Txt;

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

    /// A series from a label and any two sequences of values: arrays, slices, iterators, or a
    /// `faer` column's `.iter()` (`gram.network().col(0).iter()`).
    ///
    /// # Example
    ///
    /// ```
    /// use pathkernel::api::*;
    /// let m = from_nalgebra(&DMatrix::from_row_slice(3, 2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    /// let s = Series::xy("col 0 vs col 1", m.col(0).iter(), m.col(1).iter());
    /// assert_eq!(s, Series::new("col 0 vs col 1", vec![1.0, 3.0, 5.0], vec![2.0, 4.0, 6.0]));
    /// ```
    pub fn xy<X, Y>(label: impl Into<String>, x: X, y: Y) -> Self
    where
        X: IntoIterator,
        X::Item: std::borrow::Borrow<f64>,
        Y: IntoIterator,
        Y::Item: std::borrow::Borrow<f64>,
    {
        use std::borrow::Borrow;
        Series::new(label, x.into_iter().map(|v| *v.borrow()).collect(), y.into_iter().map(|v| *v.borrow()).collect())
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

impl Overlay {
    /// Points coloured by class: abscissae, ordinates (any sequences of values, e.g. a `faer`
    /// column's `.iter()`) and one class per point.
    ///
    /// # Example
    ///
    /// ```
    /// use pathkernel::api::*;
    /// let o = Overlay::points([0.0, 1.0], [2.0, 3.0], &[1, 0]);
    /// assert_eq!((o.x, o.y, o.class, o.value), (vec![0.0, 1.0], vec![2.0, 3.0], vec![1, 0], None));
    /// ```
    pub fn points<X, Y>(x: X, y: Y, class: &[usize]) -> Self
    where
        X: IntoIterator,
        X::Item: std::borrow::Borrow<f64>,
        Y: IntoIterator,
        Y::Item: std::borrow::Borrow<f64>,
    {
        let s = Series::xy("", x, y);
        Overlay { x: s.x, y: s.y, class: class.to_vec(), value: None }
    }
}

/// One panel of [`Chart::heatmaps`]: a titled grid with its own colour bar label.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Panel title (what is shown).
    pub title: String,
    /// The values.
    pub grid: Grid2d,
    /// Label of the panel's colour bar (the quantity and its unit).
    pub colorbar_label: String,
}

impl Heatmap {
    /// A panel from its title, grid and colour bar label.
    pub fn new(title: impl Into<String>, grid: Grid2d, colorbar_label: impl Into<String>) -> Self {
        Heatmap {
            title: title.into(),
            grid,
            colorbar_label: colorbar_label.into(),
        }
    }
}

/// A rendered chart: a PNG image and its size in pixels.
///
/// Returned by the chart constructors ([`LineChart::draw`], [`ScatterChart::draw`], [`Chart::heatmaps`],
/// [`Chart::point_value_panels`], [`Chart::matrix`]). In an evcxr notebook a `Chart` that is a
/// cell's value is shown inline ([`Chart::evcxr_display`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Chart {
    png: Vec<u8>,
    width: u32,
    height: u32,
}

impl Chart {
    /// The PNG file's bytes.
    pub fn png(&self) -> &[u8] {
        &self.png
    }

    /// The PNG file's bytes, by value.
    pub fn into_png(self) -> Vec<u8> {
        self.png
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Writes the PNG to `path` atomically (a temporary file in the same directory renamed over
    /// `path`; a failed write leaves no temporary file behind).
    ///
    /// # Errors
    /// [`Error::Io`] naming `path` when the directory does not exist or the write fails.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::write_atomic(path, &self.png)
    }

    /// evcxr's inline display: prints the PNG as `EVCXR_BEGIN_CONTENT image/png`, base64,
    /// `EVCXR_END_CONTENT` on stdout (evcxr calls this for a cell whose value is a `Chart`).
    pub fn evcxr_display(&self) {
        println!("{}", self.evcxr_content());
    }

    /// The text [`Chart::evcxr_display`] prints.
    fn evcxr_content(&self) -> String {
        use base64::Engine;
        format!(
            "EVCXR_BEGIN_CONTENT image/png\n{}\nEVCXR_END_CONTENT",
            base64::engine::general_purpose::STANDARD.encode(&self.png)
        )
    }

    /// Renders `(w, h)` pixels with `draw` in memory and encodes them as PNG (with the encoder
    /// and settings plotters uses for files). `who` names the chart in errors.
    fn render(
        who: &str,
        (w, h): (u32, u32),
        draw: impl FnOnce(&Area, &Txt) -> Drawn,
    ) -> Result<Chart> {
        let txt = Txt::new()?;
        let mut buf = vec![255u8; (w as usize) * (h as usize) * 3];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            let res: Drawn = (|| {
                root.fill(&WHITE)?;
                draw(&root, &txt)?;
                root.present()?;
                Ok(())
            })();
            res.map_err(|e| Error::Data(format!("{who}: rendering failed: {e}")))?;
        }
        txt.rasterize(&mut buf, w, h);
        #[cfg(test)]
        LAST_RENDER.with(|l| *l.borrow_mut() = buf.clone());
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&buf, w, h, image::ColorType::Rgb8)
            .map_err(|e| Error::Data(format!("{who}: PNG encoding failed: {e}")))?;
        Ok(Chart {
            png,
            width: w,
            height: h,
        })
    }
}

impl fmt::Debug for Chart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chart")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("png_bytes", &self.png.len())
            .finish()
    }
}

impl fmt::Display for Chart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}×{} PNG chart ({} bytes)",
            self.width,
            self.height,
            self.png.len()
        )
    }
}

/// How a chart built from values names itself in errors.
fn chart_name(title: &str) -> String {
    if title.is_empty() {
        "chart".into()
    } else {
        format!("chart '{title}'")
    }
}

/// How a chart written to `path` names itself in errors (the path, as before charts were values).
fn path_name(path: &Path) -> String {
    path.display().to_string()
}

// ---------------------------------------------------------------------------------------------
// Layout constants and drawing types
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
/// Extra height of each further line of that legend band.
const FOOTER_LINE_H: u32 = 28;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Ctx<'a> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<Axis1, Axis1>>;
type Plot<'a> = DrawingArea<BitMapBackend<'a>, Cartesian2d<Axis1, Axis1>>;
type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

#[cfg(test)]
thread_local! {
    /// The last RGB buffer rendered on this thread (tests inspect it for non-blankness).
    static LAST_RENDER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
