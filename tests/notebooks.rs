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
    let mut prelude = vec![":dep pathkernel = { path = \"..\" }".to_string()];
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
                flush(kind, &mut buf, &mut out);
                kind = Some("markdown");
            }
            "// %%" => {
                flush(kind, &mut buf, &mut out);
                kind = Some("code");
            }
            "Ok(())" => {}
            t if kind == Some("markdown") => buf.push(t.strip_prefix("//").map(|r| r.strip_prefix(' ').unwrap_or(r)).unwrap_or(t).to_string()),
            t => match t.strip_prefix("show(&").and_then(|r| r.strip_suffix(");")) {
                Some(v) => buf.push(v.to_string()),
                None => buf.push(body.trim_end().to_string()),
            },
        }
    }
    flush(kind, &mut buf, &mut out);
    out
}

fn notebook(cells: &[(&'static str, String)]) -> Value {
    let cells: Vec<Value> = cells
        .iter()
        .map(|(kind, text)| {
            let source: Vec<String> = {
                let lines: Vec<&str> = text.split('\n').collect();
                let n = lines.len();
                lines.iter().enumerate().map(|(i, l)| if i + 1 < n { format!("{l}\n") } else { l.to_string() }).collect()
            };
            if *kind == "code" {
                json!({"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], "source": source})
            } else {
                json!({"cell_type": "markdown", "metadata": {}, "source": source})
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
        let expected = notebook(&c);
        let nb_path = p.with_extension("ipynb");
        if std::env::var_os("UPDATE_NOTEBOOKS").is_some() {
            std::fs::write(&nb_path, serde_json::to_string_pretty(&expected).unwrap() + "\n").unwrap();
        }
        let text = std::fs::read_to_string(&nb_path).unwrap_or_else(|_| panic!("{} is missing; run UPDATE_NOTEBOOKS=1 cargo test --test notebooks", nb_path.display()));
        let actual: Value = serde_json::from_str(&text).unwrap();
        let strip = |v: &Value| -> Vec<(String, String)> {
            v["cells"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["cell_type"].as_str().unwrap().to_string(), c["source"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect::<String>()))
                .collect()
        };
        assert_eq!(strip(&actual), strip(&expected), "{} is out of date with its source", nb_path.display());
    }
    assert!(count >= 1, "no notebook sources found");
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
    for name in ["quickstart", "uncertainty", "attribution"] {
        let bin = examples.join(name);
        assert!(bin.exists(), "{} not built (cargo test builds examples)", bin.display());
        let o = std::process::Command::new(&bin).current_dir(&nb).output().unwrap();
        assert!(o.status.success(), "{name}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.stdout.is_empty(), "{name} printed nothing");
    }
    assert!(nb.join("uncertainty-fig5.png").exists());
}
