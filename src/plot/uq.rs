//! Charts of the uncertainty benchmark: reliability diagrams, grouped bars (OOD AUROCs) and a
//! grid of small grey-scale images with captions (the test images on which two methods disagree).

use plotters::prelude::*;

use super::axis::{build_chart, Axis};
use super::colour::{mix, AXIS_INK, TAB10};
use super::marks::{draw_legend, legend_w, titled, Entry};
use super::text::{H, V};
use super::{chart_name, Chart, CHART_H, CHART_W, LEGEND_PX, PANEL_TITLE_H, PANEL_TITLE_PX, TICK_PX};
use crate::error::{Error, Result};

/// One panel of [`Chart::reliability`]: a method's reliability diagram.
#[derive(Debug, Clone, PartialEq)]
pub struct ReliabilityPanel {
    /// Panel title (the method, and e.g. its ECE).
    pub title: String,
    /// Bin edges, `B + 1` increasing values in `[0, 1]`.
    pub edges: Vec<f64>,
    /// Accuracy per bin (NaN for an empty bin). `[B]`.
    pub accuracy: Vec<f64>,
    /// Mean confidence per bin (NaN for an empty bin). `[B]`.
    pub confidence: Vec<f64>,
    /// Points per bin. `[B]`.
    pub count: Vec<usize>,
}

/// One series of [`Chart::grouped_bars`]: a value per group (NaN: no bar).
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    /// Legend entry.
    pub label: String,
    /// One value per group.
    pub values: Vec<f64>,
}

/// One tile of [`Chart::image_grid`]: a grey-scale image (0 black … 1 white) and caption lines.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageTile {
    /// Pixels, row-major, `[height, width]`, values in `[0, 1]` (clamped).
    pub pixels: Vec<f64>,
    /// Image width.
    pub width: usize,
    /// Image height.
    pub height: usize,
    /// Caption lines under the image.
    pub caption: Vec<String>,
}

impl ImageTile {
    /// A square tile (`width = height = √len`) from its pixels, row-major, in any sequence
    /// (a slice, a `Vec`, or a `faer` row's `.iter()`: `net.x_test().row(q).iter()`), and its
    /// caption lines.
    ///
    /// # Example
    ///
    /// ```
    /// use pathkernel::api::*;
    /// let t = ImageTile::square([0.0, 0.5, 1.0, 0.25], vec!["a 2 × 2 image".into()]);
    /// assert_eq!((t.width, t.height, t.pixels.len()), (2, 2, 4));
    /// ```
    ///
    /// A pixel count that is not a square gives a `0 × 0` tile holding the pixels, which
    /// [`Chart::image_grid`] refuses with that count.
    pub fn square<I>(pixels: I, caption: Vec<String>) -> ImageTile
    where
        I: IntoIterator,
        I::Item: std::borrow::Borrow<f64>,
    {
        use std::borrow::Borrow;
        let pixels: Vec<f64> = pixels.into_iter().map(|v| *v.borrow()).collect();
        let side = (pixels.len() as f64).sqrt().round() as usize;
        let side = if side * side == pixels.len() { side } else { 0 };
        ImageTile { pixels, width: side, height: side, caption }
    }
}

const REL_W: u32 = 400;
const REL_H: u32 = 400;
/// Colour of the accuracy bars and of the gap to the diagonal.
const BAR: RGBColor = RGBColor(31, 119, 180);
const GAP: RGBColor = RGBColor(214, 39, 40);

impl Chart {
    /// Reliability diagrams, one panel per method (up to 3 per row): for every non-empty bin of
    /// the top-label confidence a blue bar up to the bin's accuracy (dark top line), a
    /// translucent red band from the accuracy to the bin's mean confidence (the gap that the ECE
    /// weighs by the bin's share), a dot at the mean confidence on the dashed diagonal, and the
    /// bin's number of points as a grey bar along the bottom (the largest bin 0.15 high).
    /// 400×400 pixels per panel.
    ///
    /// # Errors
    /// [`Error::Data`] for no panels, or a panel whose vectors do not have `B + 1` / `B` entries.
    pub fn reliability(title: &str, panels: &[ReliabilityPanel]) -> Result<Chart> {
        let who = chart_name(title);
        if panels.is_empty() {
            return Err(Error::Data(format!("{who}: reliability needs at least one panel")));
        }
        for p in panels {
            let b = p.accuracy.len();
            if b == 0 || p.edges.len() != b + 1 || p.confidence.len() != b || p.count.len() != b {
                return Err(Error::Data(format!(
                    "{who}: panel '{}' needs B + 1 edges and B accuracies, confidences and counts (got {}, {}, {}, {})",
                    p.title,
                    p.edges.len(),
                    b,
                    p.confidence.len(),
                    p.count.len()
                )));
            }
        }
        let cols = panels.len().min(3);
        let rows = panels.len().div_ceil(cols);
        let (w, h) = (cols as u32 * REL_W, super::TITLE_H + rows as u32 * (REL_H + PANEL_TITLE_H) + 34);
        Chart::render(&who, (w, h), |root, txt| {
            let body = titled(root, txt, title);
            let (grid, footer) = body.split_vertically(rows as u32 * (REL_H + PANEL_TITLE_H));
            let cells = grid.split_evenly((rows, cols));
            for (cell, p) in cells.iter().zip(panels) {
                let px = txt.fit(&p.title, PANEL_TITLE_PX, REL_W as i32 - 12);
                txt.put(cell, &p.title, (REL_W as i32 / 2, PANEL_TITLE_H as i32 / 2 + 2), px, H::Center, V::Center, false);
                let (_, area) = cell.split_vertically(PANEL_TITLE_H);
                let axis = Axis::linear(0.0, 1.0, 0.0, 6);
                let mut chart = build_chart(&area, txt, &axis, &axis, "confidence (top-label probability)", "accuracy", 6, 16)?;
                let most = p.count.iter().copied().max().unwrap_or(0).max(1) as f64;
                for j in 0..p.accuracy.len() {
                    if p.count[j] == 0 || !p.accuracy[j].is_finite() {
                        continue;
                    }
                    let (lo, hi) = (p.edges[j], p.edges[j + 1]);
                    let pad = (hi - lo) * 0.06;
                    let (a, c) = (p.accuracy[j], p.confidence[j]);
                    chart.draw_series(std::iter::once(Rectangle::new([(lo + pad, 0.0), (hi - pad, a)], mix(BAR, WHITE, 0.15).filled())))?;
                    chart.draw_series(std::iter::once(Rectangle::new([(lo + pad, a.min(c)), (hi - pad, a.max(c))], GAP.mix(0.35).filled())))?;
                    chart.draw_series(std::iter::once(Rectangle::new([(lo + pad, a.min(c)), (hi - pad, a.max(c))], GAP.stroke_width(1))))?;
                    chart.draw_series(std::iter::once(PathElement::new(vec![(lo + pad, a), (hi - pad, a)], mix(BAR, BLACK, 0.5).stroke_width(2))))?;
                    chart.draw_series(std::iter::once(Rectangle::new([(lo + pad, 0.0), (hi - pad, 0.15 * p.count[j] as f64 / most)], RGBColor(110, 110, 110).filled())))?;
                }
                chart.draw_series(DashedLineSeries::new(vec![(0.0, 0.0), (1.0, 1.0)], 8, 6, RGBColor(90, 90, 90).stroke_width(2)))?;
                for j in 0..p.accuracy.len() {
                    if p.count[j] > 0 && p.confidence[j].is_finite() {
                        let c = p.confidence[j];
                        chart.draw_series(std::iter::once(Circle::new((c, c), 3, BLACK.filled())))?;
                    }
                }
            }
            let entries: Vec<Entry> = vec![
                ("accuracy per bin".into(), mix(BAR, WHITE, 0.15), 0),
                ("gap from the accuracy to the mean confidence (dot)".into(), mix(GAP, WHITE, 0.65), 0),
                ("points per bin (largest bin = 0.15)".into(), RGBColor(110, 110, 110), 0),
            ];
            let mut x = 16;
            for (label, colour, _) in &entries {
                footer.draw(&Rectangle::new([(x, 10), (x + 22, 24)], colour.filled()))?;
                txt.put(&footer, label, (x + 30, 17), LEGEND_PX, H::Left, V::Center, false);
                x += 30 + txt.width(label, LEGEND_PX) + 36;
            }
            Ok(())
        })
    }

    /// Grouped bar chart: one group per entry of `groups` along the x axis, one bar per series
    /// with a finite value in each group (side by side, centred; NaN values are left out; colour
    /// per series, legend to the right), the value written upwards in or above each bar. The y
    /// axis spans `y_range`. 900×600 pixels.
    ///
    /// # Errors
    /// [`Error::Data`] for no groups or series, a series with a value count other than the
    /// number of groups, no finite value, or an empty or non-finite `y_range`.
    pub fn grouped_bars(title: &str, y_label: &str, groups: &[String], series: &[BarSeries], y_range: (f64, f64)) -> Result<Chart> {
        let who = chart_name(title);
        if groups.is_empty() || series.is_empty() {
            return Err(Error::Data(format!("{who}: grouped_bars needs at least one group and one series")));
        }
        if let Some(s) = series.iter().find(|s| s.values.len() != groups.len()) {
            return Err(Error::Data(format!("{who}: series '{}' has {} values for {} groups", s.label, s.values.len(), groups.len())));
        }
        if !series.iter().flat_map(|s| &s.values).any(|v| v.is_finite()) {
            return Err(Error::Data(format!("{who}: grouped_bars has no finite value")));
        }
        if !(y_range.0.is_finite() && y_range.1.is_finite() && y_range.0 < y_range.1) {
            return Err(Error::Data(format!("{who}: y range {:?} is empty or not finite", y_range)));
        }
        let entries: Vec<Entry> = series.iter().enumerate().map(|(i, s)| (s.label.clone(), TAB10[i % TAB10.len()], i)).collect();
        let ng = groups.len() as f64;
        Chart::render(&who, (CHART_W, CHART_H), |root, txt| {
            let body = titled(root, txt, title);
            let labels: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
            let lw = legend_w(txt, &labels);
            let (plot_area, legend_area) = body.split_horizontally(CHART_W - lw);
            let mut xa = Axis::linear(0.0, ng, 0.0, 2);
            let ya = Axis::linear(y_range.0, y_range.1, 0.0, 8);
            // No x ticks: the group names are drawn under each group instead.
            xa.ticks.clear();
            let chart = build_chart(&plot_area, txt, &xa, &ya, "", y_label, 6, 20)?;
            let pa = chart.plotting_area();
            // Each group shows its finite bars side by side, centred; a series keeps its colour.
            let most = (0..groups.len()).map(|g| series.iter().filter(|s| s.values[g].is_finite()).count()).max().unwrap_or(1).max(1);
            let width = 0.8 / most as f64;
            let span = y_range.1 - y_range.0;
            for g in 0..groups.len() {
                let present: Vec<usize> = (0..series.len()).filter(|&si| series[si].values[g].is_finite()).collect();
                let left = g as f64 + 0.5 - width * present.len() as f64 / 2.0;
                for (slot, &si) in present.iter().enumerate() {
                    let v = series[si].values[g];
                    let colour = TAB10[si % TAB10.len()];
                    let x0 = left + slot as f64 * width;
                    let top = v.clamp(y_range.0, y_range.1);
                    pa.draw(&Rectangle::new([(x0 + width * 0.04, y_range.0), (x0 + width * 0.96, top)], colour.filled()))?;
                    // The value, written upwards: inside a tall bar (white), above a short one.
                    let (px, py) = chart.backend_coord(&(x0 + width * 0.5, top));
                    let label = format!("{v:.3}");
                    if top - y_range.0 > 0.3 * span {
                        txt.put_abs(&label, (px, py + 6), TICK_PX - 1.0, WHITE, H::Right, V::Center, true);
                    } else {
                        txt.put_abs(&label, (px, py - 6), TICK_PX - 1.0, AXIS_INK, H::Left, V::Center, true);
                    }
                }
            }
            let (_, yr) = pa.get_pixel_range();
            for (g, name) in groups.iter().enumerate() {
                let (px, _) = chart.backend_coord(&(g as f64 + 0.5, y_range.0));
                let size = txt.fit(name, TICK_PX, ((CHART_W - lw) as f64 / ng) as i32 - 8);
                txt.put_abs(name, (px, yr.end + 8), size, super::colour::INK, H::Center, V::Top, false);
            }
            let (_, ly) = legend_area.get_base_pixel();
            draw_legend(&legend_area, txt, &entries, yr.start - ly + 10, |a, (x, y), c, _| {
                a.draw(&Rectangle::new([(x - 10, y - 7), (x + 10, y + 7)], c.filled()))?;
                Ok(())
            })
        })
    }

    /// A grid of grey-scale images (`cols` per row), each drawn at 4 pixels per image pixel (more
    /// for images under 28 pixels a side: at least 112 pixels) with its caption lines underneath.
    ///
    /// # Errors
    /// [`Error::Data`] for no tiles, `cols == 0`, or a tile whose pixel count is not
    /// `width × height` (or is 0).
    pub fn image_grid(title: &str, tiles: &[ImageTile], cols: usize) -> Result<Chart> {
        let who = chart_name(title);
        if tiles.is_empty() || cols == 0 {
            return Err(Error::Data(format!("{who}: image_grid needs at least one tile and one column")));
        }
        if let Some(t) = tiles.iter().find(|t| t.width == 0 || t.height == 0 || t.pixels.len() != t.width * t.height) {
            return Err(Error::Data(format!("{who}: a {}×{} tile has {} pixels", t.width, t.height, t.pixels.len())));
        }
        // 4 screen pixels per image pixel, more for small images (at least 112 px a side: an
        // 8 × 8 image is drawn 14 times larger).
        let side = tiles.iter().map(|t| t.width.max(t.height)).max().unwrap_or(1) as i32;
        let scale = (112 / side).max(4);
        let lines = tiles.iter().map(|t| t.caption.len()).max().unwrap_or(0) as i32;
        let line_h = 17;
        let iw = tiles.iter().map(|t| t.width).max().unwrap_or(0) as i32 * scale;
        let ih = tiles.iter().map(|t| t.height).max().unwrap_or(0) as i32 * scale;
        let cell_w = (iw + 24).max(150);
        let cell_h = ih + 10 + lines * line_h + 14;
        let cols = cols.min(tiles.len());
        let rows = tiles.len().div_ceil(cols);
        let (w, h) = ((cols as i32 * cell_w) as u32, super::TITLE_H + (rows as i32 * cell_h) as u32 + 8);
        Chart::render(&who, (w, h), |root, txt| {
            let body = titled(root, txt, title);
            for (i, t) in tiles.iter().enumerate() {
                let (r, c) = ((i / cols) as i32, (i % cols) as i32);
                let x0 = c * cell_w + (cell_w - t.width as i32 * scale) / 2;
                let y0 = r * cell_h + 4;
                for py in 0..t.height {
                    for px in 0..t.width {
                        let v = t.pixels[py * t.width + px];
                        let g = (255.0 * if v.is_finite() { v.clamp(0.0, 1.0) } else { 0.5 }).round() as u8;
                        let (x, y) = (x0 + px as i32 * scale, y0 + py as i32 * scale);
                        body.draw(&Rectangle::new([(x, y), (x + scale, y + scale)], RGBColor(g, g, g).filled()))?;
                    }
                }
                body.draw(&Rectangle::new([(x0 - 1, y0 - 1), (x0 + t.width as i32 * scale, y0 + t.height as i32 * scale)], AXIS_INK.stroke_width(1)))?;
                for (l, line) in t.caption.iter().enumerate() {
                    let size = txt.fit(line, TICK_PX - 1.0, cell_w - 6);
                    txt.put(&body, line, (c * cell_w + cell_w / 2, y0 + ih + 8 + l as i32 * line_h + line_h / 2), size, H::Center, V::Center, false);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct colours of the last render on this thread (a blank chart has a handful).
    fn colours() -> usize {
        let buf = super::super::LAST_RENDER.with(|l| l.borrow().clone());
        buf.chunks_exact(3).map(|p| (p[0], p[1], p[2])).collect::<std::collections::HashSet<_>>().len()
    }

    fn panel(title: &str, shift: f64) -> ReliabilityPanel {
        let b = 15;
        let edges: Vec<f64> = (0..=b).map(|j| j as f64 / b as f64).collect();
        let confidence: Vec<f64> = (0..b).map(|j| (j as f64 + 0.5) / b as f64).collect();
        let accuracy: Vec<f64> = confidence.iter().map(|c| (c - shift).clamp(0.0, 1.0)).collect();
        let mut count: Vec<usize> = (0..b).map(|j| j * j).collect();
        count[0] = 0;
        let accuracy = accuracy.iter().zip(&count).map(|(a, &n)| if n == 0 { f64::NAN } else { *a }).collect();
        ReliabilityPanel { title: title.into(), edges, accuracy, confidence, count }
    }

    #[test]
    fn reliability_panels_render_and_validate() {
        let panels: Vec<ReliabilityPanel> = (0..5).map(|i| panel(&format!("method {i}"), 0.05 * i as f64)).collect();
        let c = Chart::reliability("Reliability", &panels).unwrap();
        assert_eq!((c.width(), c.height()), (3 * REL_W, super::super::TITLE_H + 2 * (REL_H + PANEL_TITLE_H) + 34));
        assert!(colours() > 64);
        let one = Chart::reliability("", &panels[..1]).unwrap();
        assert_eq!(one.width(), REL_W);
        assert!(Chart::reliability("r", &[]).is_err());
        let mut bad = panel("bad", 0.0);
        bad.edges.pop();
        assert!(Chart::reliability("r", &[bad]).unwrap_err().to_string().contains("'bad'"));
    }

    #[test]
    fn grouped_bars_render_and_validate() {
        let groups: Vec<String> = ["a: x", "a: y", "b: x", "b: y"].iter().map(|s| s.to_string()).collect();
        let series = vec![
            BarSeries { label: "one".into(), values: vec![0.5, f64::NAN, 0.9, f64::NAN] },
            BarSeries { label: "two".into(), values: vec![0.7, 0.99, 0.1, 1.0] },
            BarSeries { label: "three".into(), values: vec![0.2, 0.4, 0.6, 0.8] },
        ];
        let c = Chart::grouped_bars("AUROC", "AUROC", &groups, &series, (0.0, 1.0)).unwrap();
        assert_eq!((c.width(), c.height()), (CHART_W, CHART_H));
        assert!(colours() > 64);
        assert!(Chart::grouped_bars("t", "y", &[], &series, (0.0, 1.0)).is_err());
        assert!(Chart::grouped_bars("t", "y", &groups[..2], &series, (0.0, 1.0)).unwrap_err().to_string().contains("'one'"));
        assert!(Chart::grouped_bars("t", "y", &groups, &series, (1.0, 1.0)).is_err());
        let nan = vec![BarSeries { label: "n".into(), values: vec![f64::NAN; 4] }];
        assert!(Chart::grouped_bars("t", "y", &groups, &nan, (0.0, 1.0)).unwrap_err().to_string().contains("no finite"));
    }

    #[test]
    fn image_grid_renders_and_validates() {
        let tile = |i: usize| ImageTile {
            pixels: (0..28 * 28).map(|p| ((p / 28 + p % 28 + i) % 17) as f64 / 16.0).collect(),
            width: 28,
            height: 28,
            caption: vec![format!("test #{i}"), "MAP: 3 (0.99)".into(), "EPK-GP: 5 (0.41)".into()],
        };
        let tiles: Vec<ImageTile> = (0..10).map(tile).collect();
        let c = Chart::image_grid("Images", &tiles, 4).unwrap();
        assert_eq!(c.width(), 4 * 150);
        assert!(colours() > 16);
        // Small images are drawn larger: an 8 × 8 tile 14 screen pixels a pixel (112 px), a
        // 28 × 28 one 4 (the two captions lines of 17 px and the margins as above).
        let small = ImageTile::square([0.5; 64], vec!["a".into(), "b".into()]);
        let h = |c: Chart| c.height() - super::super::TITLE_H - 8;
        assert_eq!(h(Chart::image_grid("s", &[small], 1).unwrap()), 112 + 10 + 2 * 17 + 14);
        assert_eq!(h(Chart::image_grid("s", &tiles[..1], 1).unwrap()), 28 * 4 + 10 + 3 * 17 + 14);
        assert!(Chart::image_grid("t", &[], 4).is_err());
        assert!(Chart::image_grid("t", &tiles, 0).is_err());
        let mut bad = tile(0);
        bad.pixels.pop();
        assert!(Chart::image_grid("t", &[bad], 2).unwrap_err().to_string().contains("28×28"));
    }
}
