//! Chart tests: sizes, non-blank renders, input validation, atomic writes, and the value type.

use std::path::Path;

use ab_glyph::Font;

use super::axis::Axis;
use super::text::{cell_formatter, face, fmt_num, superscript};
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

#[test]
fn a_chart_value_is_the_file_it_saves() {
    let dir = tempfile::tempdir().unwrap();
    let s = Series::new("a", vec![1.0, 2.0, 3.0], vec![3.0, 1.0, 2.0]);
    let chart = Chart::line("value", "x", "y", std::slice::from_ref(&s)).draw().unwrap();
    assert_eq!((chart.width(), chart.height()), (CHART_W, CHART_H));
    assert_eq!(chart.png()[..8], PNG_SIG);
    // The path-taking function writes exactly the bytes of the value.
    let p = dir.path().join("line.png");
    line_chart(&p, "value", "x", "y", &[s], Scale::Linear, Scale::Linear).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), chart.png());
    let q = dir.path().join("saved.png");
    chart.save(&q).unwrap();
    check_png(&q, CHART_W, CHART_H);
    assert_eq!(std::fs::read(&q).unwrap(), chart.png());
    // Display and Debug describe the image without dumping it.
    assert_eq!(
        chart.to_string(),
        format!("900×600 PNG chart ({} bytes)", chart.png().len())
    );
    assert!(format!("{chart:?}").contains("png_bytes"));
    // Saving into a missing directory is an I/O error naming the path; nothing is left behind.
    let missing = dir.path().join("no/such/dir/x.png");
    match chart.save(&missing) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Io error, got {other:?}"),
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["line.png", "saved.png"]);
    assert_eq!(chart.clone().into_png(), chart.png());
}

#[test]
fn evcxr_display_protocol() {
    use base64::Engine;
    let m = Chart::matrix(
        "m",
        &["a".into(), "b".into()],
        &[1.0, -0.5, -0.5, 1.0],
        "kernel value",
    )
    .unwrap();
    let text = m.evcxr_content();
    let body = text
        .strip_prefix("EVCXR_BEGIN_CONTENT image/png\n")
        .and_then(|r| r.strip_suffix("\nEVCXR_END_CONTENT"))
        .expect("evcxr's content markers");
    assert!(!body.contains('\n'));
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap(),
        m.png()
    );
}

#[test]
fn heatmap_panels_have_their_own_colour_bar_labels() {
    let g = grid(|x, y| x * y);
    let shared = Chart::heatmaps(
        "t",
        &[
            Heatmap::new("a", g.clone(), "v"),
            Heatmap::new("b", g.clone(), "v"),
        ],
        None,
    )
    .unwrap();
    let own = Chart::heatmaps(
        "t",
        &[
            Heatmap::new("a", g.clone(), "v"),
            Heatmap::new("b", g.clone(), "w"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(
        (own.width(), own.height()),
        (shared.width(), shared.height())
    );
    assert_ne!(
        own.png(),
        shared.png(),
        "the second colour bar's label differs"
    );
    // The path-taking form with one label for all panels is the shared case.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("h.png");
    heatmaps(
        &p,
        "t",
        &[("a".into(), g.clone()), ("b".into(), g)],
        "v",
        None,
    )
    .unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), shared.png());
}

#[test]
fn errors_of_chart_values_name_the_chart() {
    let msg = |r: Result<Chart>| match r {
        Err(Error::Data(m)) => m,
        other => panic!("expected a data error, got {other:?}"),
    };
    assert_eq!(
        msg(Chart::line("Loss", "x", "y", &[]).draw()),
        "chart 'Loss': line_chart needs at least one series"
    );
    assert_eq!(
        msg(Chart::matrix("", &[], &[], "v")),
        "chart: matrix needs at least one row"
    );
    assert!(msg(Chart::scatter("S", "x", "y", &[Series::new("a", vec![f64::NAN], vec![1.0])]).draw())
        .starts_with("chart 'S': "));
    assert!(msg(Chart::heatmaps("H", &[], None)).starts_with("chart 'H': heatmaps needs"));
    assert!(msg(Chart::point_value_panels("P", &[], &[], "v"))
        .starts_with("chart 'P': point_value_panels needs"));
    // The path-taking forms name the path, as before.
    let p = Path::new("/tmp/x.png");
    match line_chart(p, "t", "x", "y", &[], Scale::Linear, Scale::Linear) {
        Err(Error::Data(m)) => assert_eq!(m, "/tmp/x.png: line_chart needs at least one series"),
        other => panic!("{other:?}"),
    }
}

/// The named options draw what the path-taking functions draw with the same settings: a log y
/// axis and the y = x diagonal give the bytes of `line_chart(…, Scale::Log)` and
/// `scatter_chart(…, true)`; `Series::xy` and `ImageTile::square` hold the values they were given.
#[test]
fn named_chart_options_equal_the_explicit_settings() {
    let dir = tempfile::tempdir().unwrap();
    let s = Series::xy("a", [1.0, 2.0, 3.0], vec![3.0, 1.0, 2.0]);
    assert_eq!(s, Series::new("a", vec![1.0, 2.0, 3.0], vec![3.0, 1.0, 2.0]));
    let p = dir.path().join("line.png");
    line_chart(&p, "t", "x", "y", std::slice::from_ref(&s), Scale::Linear, Scale::Log).unwrap();
    let log = Chart::line("t", "x", "y", std::slice::from_ref(&s)).log_y().draw().unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), log.png());
    assert_ne!(Chart::line("t", "x", "y", std::slice::from_ref(&s)).draw().unwrap().png(), log.png());
    let both = Chart::line("t", "x", "y", std::slice::from_ref(&s)).log_x().log_y().draw().unwrap();
    assert_eq!(both, Chart::line("t", "x", "y", std::slice::from_ref(&s)).scales(Scale::Log, Scale::Log).draw().unwrap());
    let q = dir.path().join("scatter.png");
    scatter_chart(&q, "t", "x", "y", std::slice::from_ref(&s), true).unwrap();
    let diag = Chart::scatter("t", "x", "y", std::slice::from_ref(&s)).diagonal().draw().unwrap();
    assert_eq!(std::fs::read(&q).unwrap(), diag.png());
    assert_ne!(Chart::scatter("t", "x", "y", &[s]).draw().unwrap().png(), diag.png());
    let t = ImageTile::square((0..9).map(|v| v as f64 / 8.0), vec!["c".into()]);
    assert_eq!((t.width, t.height, t.pixels[8]), (3, 3, 1.0));
    let bad = ImageTile::square([0.0; 5], vec![]);
    assert!(Chart::image_grid("g", &[bad], 1).is_err());
}
