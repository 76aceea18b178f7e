//! Colours: the categorical palette for classes and series, the viridis and diverging colour
//! maps with their ranges, and the inks of text, axes and grids.

use plotters::prelude::*;

use super::range::{finite_range, widen};

/// matplotlib's "tab10" categorical palette.
pub(super) const TAB10: [RGBColor; 10] = [
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
pub(super) const VIRIDIS: [RGBColor; 9] = [
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
pub(super) const RDBU_R: [RGBColor; 11] = [
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

pub(super) const NAN_GREY: RGBColor = RGBColor(200, 200, 200);
pub(super) const INK: RGBColor = RGBColor(0, 0, 0);
pub(super) const AXIS_INK: RGBColor = RGBColor(51, 51, 51);
pub(super) const GRID_BOLD: RGBAColor = RGBAColor(0, 0, 0, 0.13);
pub(super) const GRID_LIGHT: RGBAColor = RGBAColor(0, 0, 0, 0.05);

pub(super) fn mix(a: RGBColor, b: RGBColor, t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let f = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * t).round() as u8;
    RGBColor(f(a.0, b.0), f(a.1, b.1), f(a.2, b.2))
}

pub(super) fn interp(stops: &[RGBColor], t: f64) -> RGBColor {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let s = t * (stops.len() - 1) as f64;
    let i = (s.floor() as usize).min(stops.len() - 2);
    mix(stops[i], stops[i + 1], s - i as f64)
}

pub(super) fn class_color(c: usize) -> RGBColor {
    TAB10[c % TAB10.len()]
}

/// Light version of a class colour for decision-region backgrounds.
pub(super) fn light_class(c: usize) -> RGBColor {
    mix(class_color(c), WHITE, 0.72)
}

pub(super) fn luminance(c: RGBColor) -> f64 {
    (0.299 * c.0 as f64 + 0.587 * c.1 as f64 + 0.114 * c.2 as f64) / 255.0
}

/// A value → colour mapping with its range.
#[derive(Clone, Copy)]
pub(super) enum Cmap {
    /// Viridis on [lo, hi].
    Viridis(f64, f64),
    /// Diverging RdBu_r on [-m, m], white at 0.
    Diverging(f64),
}

impl Cmap {
    pub(super) fn range(&self) -> (f64, f64) {
        match *self {
            Cmap::Viridis(lo, hi) => (lo, hi),
            Cmap::Diverging(m) => (-m, m),
        }
    }
    pub(super) fn color(&self, v: f64) -> RGBColor {
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
    pub(super) fn viridis_for(values: impl Iterator<Item = f64>) -> Option<Cmap> {
        let (lo, hi) = finite_range(values)?;
        let (lo, hi) = widen(lo, hi);
        Some(Cmap::Viridis(lo, hi))
    }
    /// Diverging, symmetric around 0, over the largest finite |value|.
    pub(super) fn diverging_for(values: impl Iterator<Item = f64>) -> Option<Cmap> {
        let m = values
            .filter(|v| v.is_finite())
            .map(f64::abs)
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))?;
        Some(Cmap::Diverging(if m > 0.0 { m } else { 1.0 }))
    }
}
