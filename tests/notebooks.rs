//! The evcxr notebooks in `notebooks-evcxr/` are generated from Rust sources that `cargo test`
//! compiles as examples; this test checks that every notebook holds exactly the cells of its
//! source (run with `UPDATE_NOTEBOOKS=1` to regenerate them).

use std::path::Path;

use serde_json::{json, Value};

/// Splits a notebook source into (kind, text) cells. Lines before `fn main` that start with
/// `use ` form the first code cell (after the `:dep` line); inside `main`, `// %%` starts a code
/// cell and `// %% md` a markdown cell; `show(&x);` becomes the cell's value `x`; the final
/// `Ok(())` and everything after `main` are dropped.
fn cells(src: &str) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    // The library alone: `default-features = false` leaves out the application (feature `cli`).
    let mut prelude = vec![":dep pathkernel = { path = \"..\", default-features = false }".to_string()];
    let mut lines = src.lines();
    for line in lines.by_ref() {
        if line.starts_with("fn main()") {
            break;
        }
        if line.starts_with("use ") {
            prelude.push(line.to_string());
        }
    }
    out.push(("code", prelude.join("\n")));
    let mut kind: Option<&'static str> = None;
    let mut buf: Vec<String> = Vec::new();
    let mut shown = false;
    let flush = |kind: Option<&'static str>, buf: &mut Vec<String>, out: &mut Vec<(&'static str, String)>| {
        if let Some(k) = kind {
            while buf.last().is_some_and(|l| l.trim().is_empty()) {
                buf.pop();
            }
            out.push((k, buf.join("\n")));
        }
        buf.clear();
    };
    for line in lines {
        if line == "}" {
            break;
        }
        let body = line.strip_prefix("    ").unwrap_or(line);
        match body.trim_end() {
            "// %% md" => {
                shown = false;
                flush(kind, &mut buf, &mut out);
                kind = Some("markdown");
            }
            "// %%" => {
                shown = false;
                flush(kind, &mut buf, &mut out);
                kind = Some("code");
            }
            "Ok(())" => {}
            t if kind == Some("markdown") => buf.push(t.strip_prefix("//").map(|r| r.strip_prefix(' ').unwrap_or(r)).unwrap_or(t).to_string()),
            t => match t.strip_prefix("show(&").and_then(|r| r.strip_suffix(");")) {
                Some(v) => {
                    buf.push(v.to_string());
                    shown = true;
                }
                None => {
                    // A cell's value is its last expression: `show` anywhere else would leave an
                    // expression without `;` in the middle of the cell.
                    assert!(!shown || t.trim().is_empty(), "`show(&…);` must be the last statement of its cell, before `{t}`");
                    buf.push(body.trim_end().to_string());
                }
            },
        }
    }
    flush(kind, &mut buf, &mut out);
    out
}

/// What evcxr needs that `fn main` does not: evcxr keeps every top-level `let` binding of a
/// cell for the next cells, and it cannot keep a closure ("The variable `f` is a closure, which
/// cannot be persisted") nor a value that borrows another variable (a non-`'static` reference).
/// Returns one message per top-level `let` in the code cells that binds a closure (`|…|`,
/// `move |…|`), a reference (`&…`, or a `&` in its type), or the result of a method that
/// returns a borrow (`.iter()`, `.as_slice()`, …). Nested blocks (loops, functions) may do as
/// they like: their bindings are not kept.
fn evcxr_persistence_problems(cells: &[(&'static str, String)]) -> Vec<String> {
    const BORROWING: [&str; 12] = ["iter", "iter_mut", "as_slice", "as_str", "as_ref", "as_deref", "as_path", "chunks", "windows", "lines", "keys", "values"];
    let mut problems = Vec::new();
    for (n, (kind, text)) in cells.iter().enumerate() {
        if *kind != "code" {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // Top level of the cell: no indentation.
            let Some(rest) = line.strip_prefix("let ") else { continue };
            let (pattern, init) = match rest.split_once(" = ") {
                Some((p, init)) => (p, init.trim().to_string()),
                None => match rest.strip_suffix(" =") {
                    Some(p) => (p, lines.get(i + 1).map_or(String::new(), |l| l.trim().to_string())),
                    None => continue, // `let x;` binds nothing yet
                },
            };
            let name = pattern.split(':').next().unwrap_or(pattern).trim();
            let ty = pattern.split_once(':').map(|(_, t)| t.trim());
            let init = init.trim_end_matches(';').trim_end_matches('?');
            let why = if init.starts_with('|') || init.starts_with("move |") || init.starts_with("move|") {
                Some("binds a closure")
            } else if init.starts_with('&') || ty.is_some_and(|t| t.contains('&')) {
                Some("binds a reference")
            } else {
                last_method(init).filter(|m| BORROWING.contains(&m.as_str())).map(|_| "binds a borrow (the result of a borrowing method)")
            };
            if let Some(why) = why {
                problems.push(format!("cell {n}: `let {name}` {why}, which evcxr cannot keep between cells: `{}`", line.trim()));
            }
        }
    }
    problems
}

/// The name of the last method called at the outermost level of `expr` (`a.b(x).c()` → `c`).
fn last_method(expr: &str) -> Option<String> {
    // Drop turbofish arguments (`collect::<Vec<f64>>()` → `collect()`).
    let mut plain = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find("::<") {
        plain.push_str(&rest[..at]);
        let mut depth = 0;
        let mut end = rest.len();
        for (j, ch) in rest[at + 2..].char_indices() {
            match ch {
                '<' => depth += 1,
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + 2 + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    plain.push_str(rest);
    let expr = plain.as_str();
    let bytes = expr.as_bytes();
    let mut depth = 0i32;
    let mut last = None;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' | b'[' | b'{' => {
                if depth == 0 && b == b'(' {
                    // The identifier before this parenthesis, if it follows a `.`.
                    let start = expr[..i].rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |p| p + 1);
                    if start > 0 && bytes[start - 1] == b'.' {
                        last = Some(expr[start..i].to_string());
                    }
                }
                depth += 1;
            }
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
    }
    last
}

fn notebook(cells: &[(&'static str, String)]) -> Value {
    let cells: Vec<Value> = cells
        .iter()
        .enumerate()
        .map(|(i, (kind, text))| {
            let source: Vec<String> = {
                let lines: Vec<&str> = text.split('\n').collect();
                let n = lines.len();
                lines.iter().enumerate().map(|(i, l)| if i + 1 < n { format!("{l}\n") } else { l.to_string() }).collect()
            };
            if *kind == "code" {
                json!({"cell_type": "code", "execution_count": null, "id": format!("cell-{i}"), "metadata": {}, "outputs": [], "source": source})
            } else {
                json!({"cell_type": "markdown", "id": format!("cell-{i}"), "metadata": {}, "source": source})
            }
        })
        .collect();
    json!({
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Rust", "language": "rust", "name": "rust"},
            "language_info": {"codemirror_mode": "rust", "file_extension": ".rs", "mimetype": "text/rust", "name": "Rust", "pygment_lexer": "rust", "version": ""}
        },
        "nbformat": 4,
        "nbformat_minor": 5
    })
}

#[test]
fn notebooks_match_their_compiled_sources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("notebooks-evcxr");
    let mut count = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("rs") {
            continue;
        }
        count += 1;
        let src = std::fs::read_to_string(&p).unwrap();
        let c = cells(&src);
        assert!(c.len() >= 4, "{}: too few cells", p.display());
        assert!(c.iter().any(|(k, _)| *k == "markdown"));
        let problems = evcxr_persistence_problems(&c);
        assert!(problems.is_empty(), "{}:\n{}", p.display(), problems.join("\n"));
        let expected = notebook(&c);
        let nb_path = p.with_extension("ipynb");
        // Cell ids (required since nbformat 4.5), kinds and sources; outputs may differ.
        let strip = |v: &Value| -> Vec<(String, String, String)> {
            v["cells"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["id"].as_str().unwrap_or("").to_string(),
                        c["cell_type"].as_str().unwrap().to_string(),
                        c["source"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect::<String>(),
                    )
                })
                .collect()
        };
        let read = || std::fs::read_to_string(&nb_path).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
        // Regenerate only a notebook whose cells changed: an up-to-date one keeps the outputs of
        // its last execution (`run.sh`).
        if std::env::var_os("UPDATE_NOTEBOOKS").is_some() && read().is_none_or(|a| strip(&a) != strip(&expected)) {
            std::fs::write(&nb_path, serde_json::to_string_pretty(&expected).unwrap() + "\n").unwrap();
        }
        let actual = read().unwrap_or_else(|| panic!("{} is missing; run UPDATE_NOTEBOOKS=1 cargo test --test notebooks", nb_path.display()));
        assert_eq!(strip(&actual), strip(&expected), "{} is out of date with its source", nb_path.display());
    }
    assert!(count >= 1, "no notebook sources found");
}

#[test]
fn the_evcxr_check_finds_closures_and_borrows() {
    let src = r#"use a::b;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %%
    let owned = vec![1.0, 2.0];
    let n = owned.len();
    let f = move |i: usize| owned[i];
    let g = |x: f64| x + 1.0;
    let r = &owned;
    let s: &[f64] = owned.as_slice();
    let it = owned.iter();
    let c = owned.chunks(2).map(|r| r[0]).collect::<Vec<f64>>();
    let w = owned.windows(2).count();
    let keys = std::collections::HashMap::<u8, Vec<u8>>::new().into_keys().collect::<Vec<u8>>();
    let v = owned.iter().copied().collect::<Vec<f64>>();
    for x in &owned {
        let inner = &x;
    }
    fn helper(x: &[f64]) -> f64 {
        x[0]
    }
    Ok(())
}
"#;
    let problems = evcxr_persistence_problems(&cells(src));
    let names: Vec<&str> = problems.iter().map(|p| p.split('`').nth(1).unwrap()).collect();
    assert_eq!(names, ["let f", "let g", "let r", "let s", "let it"], "{problems:#?}");
}

/// Runs every notebook's code (its compiled example) as a program, in a scratch directory laid
/// out like the repository (`NB/` as the notebook folder, so `../runs` lands in the scratch dir).
#[test]
fn notebook_programs_run() {
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().unwrap().parent().unwrap().join("examples");
    let dir = tempfile::tempdir().unwrap();
    let nb = dir.path().join("nb");
    std::fs::create_dir_all(&nb).unwrap();
    // `your-data` imports the committed PyTorch recordings `../tests/data/torch-trajectory` and
    // `../tests/data/torch-stack-adamw`; `mnist-uncertainty` and `grokking` read the committed
    // reports `../reports/mnist-uncertainty` and `../reports/grokking`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.path().join("tests/data")).unwrap();
    for rec in ["torch-trajectory", "torch-stack-adamw"] {
        std::os::unix::fs::symlink(root.join("tests/data").join(rec), dir.path().join("tests/data").join(rec)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("reports")).unwrap();
    for report in ["mnist-uncertainty", "grokking"] {
        std::os::unix::fs::symlink(root.join("reports").join(report), dir.path().join("reports").join(report)).unwrap();
    }
    // `mnist` needs the MNIST files (`bash data/fetch-mnist.sh`); it runs when they are here.
    let mnist = root.join("data/mnist");
    let mut names = vec!["quickstart", "uncertainty", "attribution", "your-data", "mnist-uncertainty", "grokking"];
    if mnist.join("train-images.idx3-ubyte").exists() {
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::os::unix::fs::symlink(&mnist, dir.path().join("data/mnist")).unwrap();
        names.push("mnist");
    } else {
        eprintln!("data/mnist is missing: the mnist notebook is compiled and checked, not run");
    }
    for name in names {
        let bin = examples.join(name);
        assert!(bin.exists(), "{} not built (cargo test builds examples)", bin.display());
        let o = std::process::Command::new(&bin).current_dir(&nb).output().unwrap();
        assert!(o.status.success(), "{name}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.stdout.is_empty(), "{name} printed nothing");
    }
}
