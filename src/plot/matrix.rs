//! Matrix heatmaps with row and column labels (gradient-similarity matrices).

use std::path::Path;

use plotters::prelude::*;

use super::colour::{luminance, Cmap, AXIS_INK, INK};
use super::marks::draw_colorbar;
use super::range::{finite_range, widen};
use super::text::{cell_formatter, H, V};
use super::{chart_name, path_name, Chart, CBAR_W, MATRIX_H, MATRIX_W, TICK_PX, TITLE_H, TITLE_PX};
use crate::error::{Error, Result};

impl Chart {
    /// A matrix heatmap with row/column tick labels (gradient-similarity matrix of the Domingos
    /// notebook), values printed in cells when small (≤ 12×12).
    ///
    /// `values` is row-major `n × n` with `n = labels.len()`; row 0 is drawn at the top, column 0
    /// at the left. The colour map is diverging (RdBu, white at 0, symmetric range) when the finite
    /// values have both signs, viridis otherwise; non-finite cells are grey. Column labels are
    /// rotated when they do not fit the cell width; with many rows only every k-th label is shown.
    /// 900×780 pixels.
    ///
    /// # Errors
    /// [`Error::Data`] for no labels, `values.len() != n²` or no finite value.
    pub fn matrix(
        title: &str,
        labels: &[String],
        values: &[f64],
        colorbar_label: &str,
    ) -> Result<Chart> {
        matrix_chart(&chart_name(title), title, labels, values, colorbar_label)
    }
}

/// [`Chart::matrix`] written to `path` ([`Chart::save`]); errors name `path`.
pub fn matrix(
    path: &Path,
    title: &str,
    labels: &[String],
    values: &[f64],
    colorbar_label: &str,
) -> Result<()> {
    matrix_chart(&path_name(path), title, labels, values, colorbar_label)?.save(path)
}

fn matrix_chart(
    who: &str,
    title: &str,
    labels: &[String],
    values: &[f64],
    colorbar_label: &str,
) -> Result<Chart> {
    let n = labels.len();
    if n == 0 {
        return Err(Error::Data(format!("{who}: matrix needs at least one row")));
    }
    if n.checked_mul(n) != Some(values.len()) {
        return Err(Error::Data(format!(
            "{who}: matrix has {n} labels but {} values (expected {})",
            values.len(),
            n.saturating_mul(n)
        )));
    }
    let (lo, hi) = finite_range(values.iter().copied())
        .ok_or_else(|| Error::Data(format!("{who}: matrix has no finite value")))?;
    let cmap = if lo < 0.0 && hi > 0.0 {
        Cmap::Diverging(lo.abs().max(hi))
    } else {
        let (lo, hi) = widen(lo, hi);
        Cmap::Viridis(lo, hi)
    };
    let fmt = cell_formatter(lo.abs().max(hi.abs()));

    Chart::render(who, (MATRIX_W, MATRIX_H), |root, txt| {
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
