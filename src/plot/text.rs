//! The text layer: the embedded font, text measurement, anchored (and rotated) labels queued
//! while plotters draws the shapes and rasterised on top at the end, and number formatting for
//! tick labels and matrix cells.

use std::cell::RefCell;
use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::*;

use super::colour::INK;
use super::Area;
use crate::error::{Error, Result};

static FONT_BYTES: &[u8] = include_bytes!("../../data/fonts/DejaVuSans.ttf");
static FACE: OnceLock<Option<FontRef<'static>>> = OnceLock::new();

/// The embedded font, parsed and registered with plotters once per process.
pub(super) fn face() -> Result<&'static FontRef<'static>> {
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
pub(super) enum H {
    Left,
    Center,
    Right,
}

/// Vertical anchor of a text, in the text's own frame (before rotation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum V {
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
pub(super) struct Txt {
    pub(super) face: &'static FontRef<'static>,
    cmds: RefCell<Vec<TextCmd>>,
}

/// Width and height (ascent − descent) in pixels of `s` at size `px`.
pub(super) fn measure(face: &FontRef<'static>, s: &str, px: f32) -> (f32, f32) {
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
    /// An empty text layer with the embedded font.
    pub(super) fn new() -> Result<Txt> {
        Ok(Txt {
            face: face()?,
            cmds: RefCell::new(Vec::new()),
        })
    }

    pub(super) fn measure(&self, s: &str, px: f32) -> (f32, f32) {
        measure(self.face, s, px)
    }

    pub(super) fn width(&self, s: &str, px: f32) -> i32 {
        self.measure(s, px).0.ceil() as i32
    }

    /// The largest size ≤ `px` (down to 9 px) at which `s` fits in `max_w` pixels.
    pub(super) fn fit(&self, s: &str, px: f32, max_w: i32) -> f32 {
        let w = self.measure(s, px).0;
        if w <= max_w as f32 || w <= 0.0 {
            px
        } else {
            (px * max_w.max(1) as f32 / w).floor().max(9.0)
        }
    }

    /// Queues `s` at `at`, a position relative to `area`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put(&self, area: &Area, s: &str, at: (i32, i32), px: f32, h: H, v: V, up: bool) {
        self.put_color(area, s, at, px, INK, h, v, up);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_color(
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
    pub(super) fn put_abs(
        &self,
        s: &str,
        at: (i32, i32),
        px: f32,
        color: RGBColor,
        h: H,
        v: V,
        up: bool,
    ) {
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
    pub(super) fn rasterize(&self, buf: &mut [u8], w: u32, h: u32) {
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

/// Formats a number compactly (≤ 5 significant digits, scientific when very small or large).
pub(super) fn fmt_num(v: f64) -> String {
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
pub(super) fn cell_formatter(maxabs: f64) -> impl Fn(f64) -> String {
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

pub(super) fn superscript(n: i64) -> String {
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
