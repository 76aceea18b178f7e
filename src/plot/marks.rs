//! Marks around and on a plot: point markers (shape per class), test-point crosses, colour bars,
//! legends and the figure title.

use plotters::prelude::*;

use super::axis::Axis;
use super::colour::{Cmap, AXIS_INK};
use super::text::{Txt, H, V};
use super::{Area, Drawn, Plot, CBAR_TICK_PX, CHART_W, DESC_PX, LEGEND_PX, TITLE_H, TITLE_PX};

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
pub(super) fn draw_marker(
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
pub(super) fn legend_marker(
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
pub(super) fn cross_px(a: &Area, (x, y): (i32, i32), r: i32) -> Drawn {
    for (w, c) in [(6, WHITE), (3, BLACK)] {
        let s = c.stroke_width(w);
        a.draw(&PathElement::new(vec![(x - r, y - r), (x + r, y + r)], s))?;
        a.draw(&PathElement::new(vec![(x - r, y + r), (x + r, y - r)], s))?;
    }
    Ok(())
}

/// Draws a cross (test point mark) at the plot point `p`.
pub(super) fn draw_cross(pa: &Plot, p: (f64, f64), r: i32) -> Drawn {
    for (w, c) in [(6, WHITE), (3, BLACK)] {
        let s = c.stroke_width(w);
        pa.draw(&(EmptyElement::at(p) + PathElement::new(vec![(-r, -r), (r, r)], s)))?;
        pa.draw(&(EmptyElement::at(p) + PathElement::new(vec![(-r, r), (r, -r)], s)))?;
    }
    Ok(())
}

/// Draws a vertical colour bar in `area` spanning the absolute pixel rows `rows`, with tick
/// labels and a rotated `label` to its right.
pub(super) fn draw_colorbar(
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
pub(super) type Entry = (String, RGBColor, usize);

/// Draws legend entries top-down in `area` starting at pixel row `top`; `key` draws the key
/// centred on the given pixel.
pub(super) fn draw_legend(
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
pub(super) fn legend_w(txt: &Txt, labels: &[&str]) -> u32 {
    let w = labels
        .iter()
        .map(|l| txt.width(l, LEGEND_PX))
        .max()
        .unwrap_or(0) as u32
        + 56;
    w.min(CHART_W / 3)
}

/// Draws the figure title centred in the top band of `root`; returns the area below it.
pub(super) fn titled<'a>(root: &Area<'a>, txt: &Txt, title: &str) -> Area<'a> {
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
