//! Line and scatter charts of labelled series (training curves, per-step errors, kernel machine
//! against network).

use std::path::Path;

use plotters::prelude::*;

use super::axis::{build_chart, tf, Axis};
use super::colour::{mix, TAB10};
use super::marks::{draw_legend, draw_marker, legend_marker, legend_w, titled, Entry};
use super::range::finite_range;
use super::{chart_name, path_name, Chart, Drawn, Scale, Series, CHART_H, CHART_W};
use crate::error::{Error, Result};

impl Chart {
    /// A line chart of `series` (legend, axis labels with units given by the caller), drawn by
    /// [`LineChart::draw`]; options by name: [`LineChart::log_x`], [`LineChart::log_y`].
    ///
    /// Non-finite points are skipped (and, on a log axis, non-positive ones). A skipped point
    /// breaks the line; isolated points and short series (≤ 40 drawable points) are also drawn
    /// as markers. The legend sits in a column to the right of the plot, never over the data;
    /// series with an empty label are left out of it. 900×600 pixels.
    ///
    /// # Example
    ///
    /// ```
    /// use pathkernel::api::*;
    /// let s = Series::xy("loss", [0.0, 1.0, 2.0], [1.0, 0.1, 0.01]);
    /// let chart = Chart::line("Training loss", "step", "loss", &[s]).log_y().draw()?;
    /// assert_eq!((chart.width(), chart.height()), (900, 600));
    /// # Ok::<(), pathkernel::Error>(())
    /// ```
    pub fn line(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> LineChart {
        LineChart { title: title.into(), x_label: x_label.into(), y_label: y_label.into(), series: series.to_vec(), x_scale: Scale::Linear, y_scale: Scale::Linear }
    }

    /// A scatter chart of `series`, drawn by [`ScatterChart::draw`]; [`ScatterChart::diagonal`]
    /// adds the y = x line (kernel machine vs network, Fig. 4).
    ///
    /// Non-finite points are skipped. Series get distinct colours and marker shapes; the legend
    /// sits to the right of the plot. 900×600 pixels.
    ///
    /// # Example
    ///
    /// ```
    /// use pathkernel::api::*;
    /// let s = Series::xy("machine vs network", [0.1, 0.5, 0.9], [0.1, 0.52, 0.88]);
    /// let fig = Chart::scatter("Fig. 4", "network", "kernel machine", &[s]).diagonal().draw()?;
    /// assert_eq!(fig.width(), 900);
    /// # Ok::<(), pathkernel::Error>(())
    /// ```
    pub fn scatter(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> ScatterChart {
        ScatterChart { title: title.into(), x_label: x_label.into(), y_label: y_label.into(), series: series.to_vec(), diagonal: false }
    }
}

/// A line chart with its options, from [`Chart::line`]; [`LineChart::draw`] renders it.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    x_scale: Scale,
    y_scale: Scale,
}

impl LineChart {
    /// A base-10 logarithmic x axis (non-positive values skipped).
    pub fn log_x(mut self) -> Self {
        self.x_scale = Scale::Log;
        self
    }
    /// A base-10 logarithmic y axis (non-positive values skipped).
    pub fn log_y(mut self) -> Self {
        self.y_scale = Scale::Log;
        self
    }
    /// The x and y axis scales at once.
    pub fn scales(mut self, x: Scale, y: Scale) -> Self {
        (self.x_scale, self.y_scale) = (x, y);
        self
    }

    /// Renders the chart.
    ///
    /// # Errors
    /// [`Error::Data`] for no series, series with different numbers of x and y values, or no
    /// drawable point.
    pub fn draw(&self) -> Result<Chart> {
        line(&chart_name(&self.title), &self.title, &self.x_label, &self.y_label, &self.series, self.x_scale, self.y_scale)
    }
}

/// A scatter chart with its options, from [`Chart::scatter`]; [`ScatterChart::draw`] renders it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterChart {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    diagonal: bool,
}

impl ScatterChart {
    /// Adds the dashed y = x line; both axes then share one range, so that it is the 45°
    /// diagonal of the data range.
    pub fn diagonal(mut self) -> Self {
        self.diagonal = true;
        self
    }

    /// Renders the chart.
    ///
    /// # Errors
    /// [`Error::Data`] for no series, series with different numbers of x and y values, or no
    /// finite point.
    pub fn draw(&self) -> Result<Chart> {
        scatter(&chart_name(&self.title), &self.title, &self.x_label, &self.y_label, &self.series, self.diagonal)
    }
}

/// [`Chart::line`] written to `path` ([`Chart::save`]); errors name `path`.
pub(crate) fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_scale: Scale,
    y_scale: Scale,
) -> Result<()> {
    line(
        &path_name(path),
        title,
        x_label,
        y_label,
        series,
        x_scale,
        y_scale,
    )?
    .save(path)
}

/// [`Chart::scatter`] written to `path` ([`Chart::save`]); errors name `path`.
pub(crate) fn scatter_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    diagonal: bool,
) -> Result<()> {
    scatter(&path_name(path), title, x_label, y_label, series, diagonal)?.save(path)
}

fn check_series(who: &str, what: &str, series: &[Series]) -> Result<()> {
    if series.is_empty() {
        return Err(Error::Data(format!(
            "{who}: {what} needs at least one series"
        )));
    }
    for s in series {
        if s.x.len() != s.y.len() {
            return Err(Error::Data(format!(
                "{who}: series '{}' has {} x values but {} y values",
                s.label,
                s.x.len(),
                s.y.len()
            )));
        }
    }
    Ok(())
}

fn line(
    who: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    x_scale: Scale,
    y_scale: Scale,
) -> Result<Chart> {
    check_series(who, "line_chart", series)?;
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
            "{who}: line_chart has no drawable point (all non-finite{})",
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
        .ok_or_else(|| Error::Data(format!("{who}: line_chart: no x range")))?;
    let ya = Axis::fit(drawable().map(|p| back(ylog, p.1)), y_scale, 0.05)
        .ok_or_else(|| Error::Data(format!("{who}: line_chart: no y range")))?;
    let entries: Vec<Entry> = series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.label.is_empty())
        .map(|(i, s)| (s.label.clone(), TAB10[i % TAB10.len()], i))
        .collect();

    Chart::render(who, (CHART_W, CHART_H), |root, txt| {
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

fn scatter(
    who: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    diagonal: bool,
) -> Result<Chart> {
    check_series(who, "scatter_chart", series)?;
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
            "{who}: scatter_chart has no finite point"
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
        .map(|(i, s)| (s.label.clone(), TAB10[i % TAB10.len()], scatter_shape(i)))
        .collect();
    if diagonal {
        entries.push(("y = x".into(), RGBColor(90, 90, 90), usize::MAX));
    }

    Chart::render(who, (CHART_W, CHART_H), |root, txt| {
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
                draw_marker(pa, *p, scatter_shape(i), radius, color, mix(color, BLACK, 0.45))?;
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

/// The marker shape of scatter series `i`: shapes cycle by 5 and colours by 10, so from the 11th
/// series on the shape shifts by one per round of colours and no two of the first 50 series look
/// alike.
fn scatter_shape(i: usize) -> usize {
    i + i / TAB10.len()
}
