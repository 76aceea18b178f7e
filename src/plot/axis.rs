//! Axes: linear and log10 axes with "nice" ticks, the plotters coordinate that draws them, and
//! the chart frame (grid lines, tick marks, tick and axis labels).

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

use super::colour::{AXIS_INK, GRID_BOLD, GRID_LIGHT, INK};
use super::range::{finite_range, widen};
use super::text::{fmt_num, superscript, Txt, H, V};
use super::{Area, Ctx, Scale, DESC_PX, TICK_PX};

/// A linear f64 coordinate with caller-chosen tick (bold) and grid (light) positions.
#[derive(Clone)]
pub(super) struct Axis1 {
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
pub(super) struct Axis {
    log: bool,
    /// Log axis whose decade labels are all written as powers of ten.
    sup: bool,
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) ticks: Vec<f64>,
    light: Vec<f64>,
}

impl Axis {
    pub(super) fn label(&self, t: f64) -> String {
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
    pub(super) fn linear(lo: f64, hi: f64, pad: f64, target_ticks: usize) -> Axis {
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
    pub(super) fn log(lo: f64, hi: f64) -> Axis {
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
    pub(super) fn fit(values: impl Iterator<Item = f64>, scale: Scale, pad: f64) -> Option<Axis> {
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

    pub(super) fn coord(&self) -> Axis1 {
        Axis1 {
            lo: self.lo,
            hi: self.hi,
            ticks: self.ticks.clone(),
            light: self.light.clone(),
        }
    }

    /// Widest tick label in pixels.
    pub(super) fn label_w(&self, txt: &Txt, px: f32) -> i32 {
        self.ticks
            .iter()
            .map(|t| txt.width(&self.label(*t), px))
            .max()
            .unwrap_or(0)
    }
}

/// Plot-space value of a data value; `None` when it cannot be drawn.
pub(super) fn tf(log: bool, v: f64) -> Option<f64> {
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
pub(super) fn build_chart<'a>(
    area: &Area<'a>,
    txt: &Txt,
    xa: &Axis,
    ya: &Axis,
    x_desc: &str,
    y_desc: &str,
    top: u32,
    right: u32,
) -> std::result::Result<Ctx<'a>, Box<dyn std::error::Error>> {
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
