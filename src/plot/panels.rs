//! Panel figures over the plane: heatmaps of gridded values (Figs. 3 and 5) and training points
//! coloured by a per-point value over decision regions (Fig. 6), with a shared class legend.

use std::path::Path;

use ab_glyph::FontRef;
use plotters::prelude::*;

use super::axis::{build_chart, Axis};
use super::colour::{class_color, light_class, Cmap};
use super::marks::{cross_px, draw_colorbar, draw_cross, draw_marker, legend_marker, titled};
use super::range::{finite_range, widen};
use super::text::{face, measure, Txt, H, V};
use super::{
    chart_name, path_name, Area, Chart, Drawn, Grid2d, Heatmap, Overlay, Plot, CBAR_W, FOOTER_H,
    FOOTER_LINE_H, LEGEND_PX, PANEL_H, PANEL_TITLE_H, PANEL_TITLE_PX, PANEL_W, TITLE_H,
};
use crate::error::{Error, Result};

impl Chart {
    /// Several heatmap panels side by side (e.g. Fig. 3: one panel per class; Fig. 5: kernel value |
    /// MC std), each with its own title and its own labelled colour bar, a perceptual colormap
    /// (viridis), optional overlay.
    ///
    /// Each panel gets its own colour range (finite min..max of its grid). Overlay points are drawn
    /// on every panel with a black edge; their shape encodes the class and their fill the class
    /// colour, or — when `overlay.value` is given — that value on the panel's own colour scale.
    /// With class-coloured points a class legend is drawn below the panels. Up to 4 panels form one
    /// row; more form a near-square grid. Each panel is 450×420 pixels, plus a 44-pixel title band
    /// and, with a class legend, a 36-pixel legend band (28 pixels more per wrapped line).
    ///
    /// # Errors
    /// [`Error::Data`] for no panels, a degenerate grid or one without a finite value, or an
    /// overlay whose vectors differ in length.
    pub fn heatmaps(title: &str, panels: &[Heatmap], overlay: Option<&Overlay>) -> Result<Chart> {
        heatmaps_chart(&chart_name(title), title, panels, overlay)
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
    ///
    /// # Errors
    /// [`Error::Data`] for no panels, an overlay whose vectors differ in length, a degenerate
    /// background grid, a panel whose values are all non-finite, or no point with finite
    /// coordinates.
    pub fn point_value_panels(
        title: &str,
        panels: &[(String, Overlay, Option<Grid2d>)],
        marks: &[(f64, f64)],
        colorbar_label: &str,
    ) -> Result<Chart> {
        point_values_chart(&chart_name(title), title, panels, marks, colorbar_label)
    }
}

/// [`Chart::heatmaps`] with one colour bar label for every panel, written to `path`
/// ([`Chart::save`]); errors name `path`.
pub fn heatmaps(
    path: &Path,
    title: &str,
    panels: &[(String, Grid2d)],
    colorbar_label: &str,
    overlay: Option<&Overlay>,
) -> Result<()> {
    let panels: Vec<Heatmap> = panels
        .iter()
        .map(|(name, g)| Heatmap::new(name.clone(), g.clone(), colorbar_label))
        .collect();
    heatmaps_chart(&path_name(path), title, &panels, overlay)?.save(path)
}

/// [`Chart::point_value_panels`] written to `path` ([`Chart::save`]); errors name `path`.
pub(crate) fn point_value_panels(
    path: &Path,
    title: &str,
    panels: &[(String, Overlay, Option<Grid2d>)],
    marks: &[(f64, f64)],
    colorbar_label: &str,
) -> Result<()> {
    point_values_chart(&path_name(path), title, panels, marks, colorbar_label)?.save(path)
}

fn check_grid(who: &str, name: &str, g: &Grid2d) -> Result<()> {
    let bad = |m: String| Err(Error::Data(format!("{who}: grid '{name}': {m}")));
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

fn check_overlay(who: &str, name: &str, o: &Overlay) -> Result<()> {
    let n = o.x.len();
    let vlen = o.value.as_ref().map_or(n, Vec::len);
    if o.y.len() != n || o.class.len() != n || vlen != n {
        return Err(Error::Data(format!(
            "{who}: overlay {name}: lengths differ (x {}, y {}, class {}, value {})",
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

fn heatmaps_chart(
    who: &str,
    title: &str,
    panels: &[Heatmap],
    overlay: Option<&Overlay>,
) -> Result<Chart> {
    if panels.is_empty() {
        return Err(Error::Data(format!(
            "{who}: heatmaps needs at least one panel"
        )));
    }
    let mut cmaps = Vec::with_capacity(panels.len());
    for Heatmap {
        title: name,
        grid: g,
        ..
    } in panels
    {
        check_grid(who, name, g)?;
        let cm = Cmap::viridis_for(g.values.iter().copied())
            .ok_or_else(|| Error::Data(format!("{who}: grid '{name}' has no finite value")))?;
        cmaps.push(cm);
    }
    if let Some(o) = overlay {
        check_overlay(who, "of heatmaps", o)?;
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

    Chart::render(who, size, |root, txt| {
        let names: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        let (cells, footer_area) = panel_cells(root, txt, title, &names, rows, cols);
        for ((cell, panel), cmap) in cells.iter().zip(panels).zip(&cmaps) {
            let g = &panel.grid;
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
            draw_colorbar(&cell.cbar, txt, *cmap, &panel.colorbar_label, rows_px)?;
        }
        draw_footer(&footer_area, txt, &items, true, false)
    })
}

fn point_values_chart(
    who: &str,
    title: &str,
    panels: &[(String, Overlay, Option<Grid2d>)],
    marks: &[(f64, f64)],
    colorbar_label: &str,
) -> Result<Chart> {
    if panels.is_empty() {
        return Err(Error::Data(format!(
            "{who}: point_value_panels needs at least one panel"
        )));
    }
    let mut cmaps: Vec<Option<Cmap>> = Vec::with_capacity(panels.len());
    let mut any_point = false;
    for (name, o, g) in panels {
        check_overlay(who, &format!("'{name}'"), o)?;
        if let Some(g) = g {
            check_grid(who, name, g)?;
        }
        any_point |=
            o.x.iter()
                .zip(&o.y)
                .any(|(x, y)| x.is_finite() && y.is_finite());
        cmaps.push(match &o.value {
            Some(v) => Some(Cmap::diverging_for(v.iter().copied()).ok_or_else(|| {
                Error::Data(format!("{who}: panel '{name}' has no finite value"))
            })?),
            None => None,
        });
    }
    if !any_point {
        return Err(Error::Data(format!(
            "{who}: point_value_panels has no point with finite coordinates"
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

    Chart::render(who, size, |root, txt| {
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
