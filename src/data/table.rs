//! The `table` kind: a CSV or parquet file (read with polars), one row per point.
//!
//! ```toml
//! [data]
//! kind = "table"
//! path = "data/wine/wine.csv"   # or a .parquet file
//! label = "class"                # integer or string classes; float targets with task = "regression"
//! features = ["alcohol", "ash"]  # default: every column but the label and the split column
//! test_fraction = 0.3            # or split = "split", a column of train / val / test
//! val_fraction = 0.2
//! seed = 0
//! standardize = true
//! ```
//!
//! String classes are numbered `0..K` in sorted (byte) order and the mapping is written into the
//! dataset's description (and so into every run's manifest). Every value must be present: an
//! empty CSV field, a null, NaN or ±inf in a feature is an error naming the file, column and row.

use std::path::Path;

use polars::prelude::{DataFrame, DataType, SerReader};
use serde::{Deserialize, Serialize};

use super::prep::{self, check_finite, check_not_empty, fraction_split, labels_from_f64, num_classes, take_rows, take_targets, Prep, Task};
use super::{Dataset, Targets};
use crate::error::{Error, Result};

/// The `[data]` keys of `kind = "table"` (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// A `.csv` (with a header row) or `.parquet` file, relative to the `base_dir` given to
    /// [`super::DataConfig::load`] unless absolute.
    pub path: String,
    /// Feature columns, in this order (default: every column but `label` and `split`, in file
    /// order). All must be numeric (booleans count as 0/1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// The target column.
    pub label: String,
    /// Classification (default) or regression.
    #[serde(default)]
    pub task: Task,
    /// A column whose values are `train`, `val` or `test`, assigning every row to a split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Without `split`: the fraction of rows held out for testing (stratified by class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_fraction: Option<f64>,
    /// Without `split`: the fraction of rows held out for validation (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_fraction: Option<f64>,
    /// Seed of the fraction split's shuffle (default 0).
    #[serde(default)]
    pub seed: u64,
    /// Multiply every feature by this before standardising.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Z-score features with the training split's statistics (default false).
    #[serde(default)]
    pub standardize: bool,
    /// Keep this many training rows of each class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_class: Option<usize>,
    /// Keep this many training rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_train: Option<usize>,
    /// Choose the kept training rows by a seeded shuffle (default: the first ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset_seed: Option<u64>,
}

impl TableConfig {
    fn prep(&self) -> Prep {
        Prep {
            scale: self.scale,
            standardize: self.standardize,
            per_class: self.per_class,
            n_train: self.n_train,
            subset_seed: self.subset_seed,
        }
    }

    /// Checks the keys without reading the file.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.path.is_empty() {
            return Err(Error::Config("data.path must not be empty".into()));
        }
        if self.features.as_ref().is_some_and(|f| f.is_empty()) {
            return Err(Error::Config("data.features is empty; leave it out to use every column but the label".into()));
        }
        if self.split.is_some() && (self.test_fraction.is_some() || self.val_fraction.is_some()) {
            return Err(Error::Config("data.split (a split column) and data.test_fraction / data.val_fraction both define the split; give one".into()));
        }
        if self.split.is_none() && self.test_fraction.is_none() {
            return Err(Error::Config("data: a table needs data.split (a column of train/val/test) or data.test_fraction".into()));
        }
        let t = self.test_fraction.unwrap_or(0.0);
        let v = self.val_fraction.unwrap_or(0.0);
        if self.split.is_none() && !(t > 0.0 && t < 1.0) {
            return Err(Error::Config(format!("data.test_fraction = {t}; it must be in (0, 1)")));
        }
        if !(v.is_finite() && v >= 0.0 && t + v < 1.0) {
            return Err(Error::Config(format!("data.val_fraction = {v}; it must be >= 0 with test_fraction + val_fraction < 1")));
        }
        if self.per_class.is_some() && self.task == Task::Regression {
            return Err(Error::Config("data.per_class needs task = \"classification\"".into()));
        }
        self.prep().validate()
    }

    /// Reads the table, splits it, preprocesses it and returns the (unvalidated) dataset.
    pub fn load(&self, base_dir: &Path) -> Result<Dataset> {
        self.validate()?;
        let file = base_dir.join(&self.path);
        let df = read_frame(&file)?;
        let names: Vec<String> = df.get_column_names().iter().map(|s| s.to_string()).collect();
        let has = |c: &str| names.iter().any(|n| n == c);
        let missing = |c: &str, what: &str| Error::format(&file, format!("no {what} column '{c}' (columns: {})", names.join(", ")));
        if !has(&self.label) {
            return Err(missing(&self.label, "label"));
        }
        if let Some(s) = &self.split {
            if !has(s) {
                return Err(missing(s, "split"));
            }
        }
        let features: Vec<String> = match &self.features {
            Some(f) => {
                if let Some(c) = f.iter().find(|c| !has(c)) {
                    return Err(missing(c, "feature"));
                }
                f.clone()
            }
            None => names.iter().filter(|n| **n != self.label && Some(*n) != self.split.as_ref()).cloned().collect(),
        };
        if features.is_empty() {
            return Err(Error::format(&file, "no feature columns (the table holds only the label and split columns)"));
        }
        let n = df.height();
        let dim = features.len();
        // x: [n, dim] row-major.
        let mut x = vec![0.0; n * dim];
        for (j, name) in features.iter().enumerate() {
            let col = numeric_column(&df, name, &file, "feature")?;
            for (i, v) in col.into_iter().enumerate() {
                x[i * dim + j] = v;
            }
        }
        check_finite(&x, dim, |j| format!("'{}'", features[j]), &file, "the table's")?;
        // Targets for every row, and the class names for string labels.
        let (y, class_names): (Targets, Option<Vec<String>>) = match (self.task, is_string(&df, &self.label)) {
            (Task::Classification, true) => {
                let s = string_column(&df, &self.label, &file)?;
                let mut names: Vec<String> = s.clone();
                names.sort();
                names.dedup();
                let l = s.iter().map(|v| names.binary_search(v).expect("every value is a class")).collect();
                (Targets::Labels(l), Some(names))
            }
            (Task::Classification, false) => {
                let v = numeric_column(&df, &self.label, &file, "label")?;
                (Targets::Labels(labels_from_f64(&v, &file, &format!("label column '{}'", self.label))?), None)
            }
            (Task::Regression, true) => {
                return Err(Error::format(&file, format!("label column '{}' holds strings; task = \"regression\" needs numbers", self.label)))
            }
            (Task::Regression, false) => {
                let v = numeric_column(&df, &self.label, &file, "label")?;
                if let Some(i) = v.iter().position(|t| !t.is_finite()) {
                    return Err(Error::format(&file, format!("{} in label column '{}' row {i} (targets must be finite numbers)", v[i], self.label)));
                }
                (Targets::Values(v), None)
            }
        };
        // Row indices of each split.
        let [tr, va, te] = match &self.split {
            Some(col) => {
                let s = string_column(&df, col, &file)?;
                let mut out: [Vec<usize>; 3] = Default::default();
                for (i, v) in s.iter().enumerate() {
                    match v.as_str() {
                        "train" => out[0].push(i),
                        "val" => out[1].push(i),
                        "test" => out[2].push(i),
                        other => {
                            return Err(Error::format(&file, format!("split column '{col}' row {i} is '{other}'; the values must be train, val or test")))
                        }
                    }
                }
                out
            }
            None => {
                let labels = match &y {
                    Targets::Labels(l) => Some(l.as_slice()),
                    Targets::Values(_) => None,
                };
                fraction_split(labels, n, self.test_fraction.unwrap_or(0.0), self.val_fraction.unwrap_or(0.0), self.seed)
            }
        };
        check_not_empty(tr.len(), &file, "train")?;
        check_not_empty(te.len(), &file, "test")?;
        if self.val_fraction.is_some_and(|v| v > 0.0) {
            check_not_empty(va.len(), &file, "val")?;
        }
        let k = match &y {
            Targets::Labels(l) => {
                let pick = |idx: &[usize]| idx.iter().map(|&i| l[i]).collect::<Vec<_>>();
                num_classes(&pick(&tr), &[&pick(&va), &pick(&te)], &file)?
            }
            Targets::Values(_) => 1,
        };
        let part = |idx: &[usize]| (take_rows(&x, dim, idx), take_targets(&y, 1, idx));
        let stem = file.file_stem().map_or("table".into(), |s| s.to_string_lossy().to_string());
        let mut desc = format!("table {} ({n} rows): features [{}], label '{}'", self.path, features.join(", "), self.label);
        if let Some(c) = &class_names {
            let quoted: Vec<String> = c.iter().map(|s| format!("'{s}'")).collect();
            desc += &format!(" with classes [{}] -> 0..{}", quoted.join(", "), c.len() - 1);
        } else if self.task == Task::Regression {
            desc += " (regression)";
        }
        desc += &match &self.split {
            Some(c) => format!(", split column '{c}'"),
            None => format!(
                ", {}split test {} val {} seed {}",
                if self.task == Task::Classification { "stratified " } else { "" },
                self.test_fraction.unwrap_or(0.0),
                self.val_fraction.unwrap_or(0.0),
                self.seed
            ),
        };
        desc += &format!(": {} train, {} val, {} test rows", tr.len(), va.len(), te.len());
        let val = (!va.is_empty()).then(|| part(&va));
        let mut ds = prep::assemble(stem, desc, dim, k, part(&tr), val, part(&te));
        self.prep().apply(&mut ds, &file)?;
        Ok(ds)
    }
}

/// Reads a CSV (header row, schema inferred from every row) or parquet file by its extension.
fn read_frame(file: &Path) -> Result<DataFrame> {
    let table_err = |e: polars::error::PolarsError| Error::Table { path: file.to_path_buf(), msg: e.to_string().replace('\n', " ") };
    let ext = file.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("csv") | Some("parquet")) {
        return Err(Error::format(file, "a table must be a .csv or .parquet file"));
    }
    let f = std::fs::File::open(file).map_err(|e| Error::io(file, e))?;
    match ext.as_deref() {
        Some("csv") => polars::prelude::CsvReadOptions::default()
            .with_has_header(true)
            .with_infer_schema_length(None)
            .into_reader_with_file_handle(f)
            .finish()
            .map_err(table_err),
        _ => polars::prelude::ParquetReader::new(f).finish().map_err(table_err),
    }
}

fn is_string(df: &DataFrame, name: &str) -> bool {
    df.column(name).is_ok_and(|c| matches!(c.dtype(), DataType::String))
}

/// The first null of a column, as an error naming it.
fn no_nulls(c: &polars::prelude::Column, name: &str, file: &Path) -> Result<()> {
    if c.null_count() > 0 {
        let s = c.as_materialized_series();
        let i = (0..s.len()).find(|&i| s.get(i).is_ok_and(|v| v.is_null())).unwrap_or(0);
        return Err(Error::format(file, format!("missing value in column '{name}' row {i}")));
    }
    Ok(())
}

/// A numeric (or boolean) column as `f64`. # Shapes `[n]`.
fn numeric_column(df: &DataFrame, name: &str, file: &Path, what: &str) -> Result<Vec<f64>> {
    let c = df.column(name).map_err(|e| Error::format(file, e.to_string()))?;
    if matches!(c.dtype(), DataType::String) {
        // polars infers only `NaN` and `inf` as floats; a column spelling them `nan`, `-Infinity`,
        // ... is read as text: parse it as Rust does, so the finiteness check names the value.
        return string_column(df, name, file)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.trim().parse::<f64>().map_err(|_| {
                    Error::format(file, format!("{what} column '{name}' has type str (row {i} is '{v}'); it must be numeric"))
                })
            })
            .collect();
    }
    let ok = c.dtype().is_primitive_numeric() || matches!(c.dtype(), DataType::Boolean);
    if !ok {
        return Err(Error::format(file, format!("{what} column '{name}' has type {}; it must be numeric", c.dtype())));
    }
    no_nulls(c, name, file)?;
    let s = c.as_materialized_series().cast(&DataType::Float64).map_err(|e| Error::format(file, e.to_string()))?;
    let ca = s.f64().map_err(|e| Error::format(file, e.to_string()))?;
    Ok(ca.iter().map(|v| v.expect("no nulls")).collect())
}

/// A string column. # Shapes `[n]`.
fn string_column(df: &DataFrame, name: &str, file: &Path) -> Result<Vec<String>> {
    let c = df.column(name).map_err(|e| Error::format(file, e.to_string()))?;
    no_nulls(c, name, file)?;
    let s = c.as_materialized_series();
    if !matches!(s.dtype(), DataType::String) {
        return Err(Error::format(file, format!("column '{name}' has type {}; expected strings", s.dtype())));
    }
    let ca = s.str().map_err(|e| Error::format(file, e.to_string()))?;
    Ok(ca.iter().map(|v| v.expect("no nulls").to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataConfig;
    use crate::io::{Column, Table};

    fn cfg(extra: &str) -> DataConfig {
        toml::from_str(&format!("kind = \"table\"\npath = \"t.csv\"\nlabel = \"y\"\n{extra}")).unwrap()
    }

    fn load(dir: &Path, csv: &str, extra: &str) -> Result<Dataset> {
        std::fs::write(dir.join("t.csv"), csv).unwrap();
        cfg(extra).load(dir)
    }

    fn err(dir: &Path, csv: &str, extra: &str) -> String {
        match load(dir, csv, extra) {
            Ok(d) => panic!("expected an error, got {}", d.description),
            Err(e) => e.to_string(),
        }
    }

    /// 12 rows, classes 0/1/2 four each, a split column: rows 0..6 train, 6..9 val, 9..12 test
    /// hold classes [0,1,2,0,1,2], [0,1,2], [0,1,2].
    fn csv12() -> String {
        let mut s = String::from("a,b,y,split\n");
        for i in 0..12 {
            let split = if i < 6 { "train" } else if i < 9 { "val" } else { "test" };
            s += &format!("{},{},{},{split}\n", i as f64 * 0.5, 10 - i, i % 3);
        }
        s
    }

    #[test]
    fn csv_with_a_split_column() {
        let dir = tempfile::tempdir().unwrap();
        let ds = load(dir.path(), &csv12(), "split = \"split\"").unwrap();
        ds.validate().unwrap();
        assert_eq!((ds.dim, ds.num_outputs, ds.n_train(), ds.n_val(), ds.n_test()), (2, 3, 6, 3, 3));
        assert_eq!(ds.x_train[..4], [0.0, 10.0, 0.5, 9.0]);
        assert_eq!(ds.y_train, Targets::Labels(vec![0, 1, 2, 0, 1, 2]));
        assert_eq!(ds.x_test, vec![4.5, 1.0, 5.0, 0.0, 5.5, -1.0]);
        assert_eq!(ds.validation.as_ref().unwrap().x[0], 3.0);
        assert_eq!(ds.name, "t");
        // Explicit features, in the order given.
        let ds = load(dir.path(), &csv12(), "split = \"split\"\nfeatures = [\"b\"]").unwrap();
        assert_eq!((ds.dim, ds.x_train[1]), (1, 9.0));
    }

    #[test]
    fn string_classes_sorted_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = String::from("f,kind\n");
        for (i, k) in ["pear", "apple", "fig", "apple", "pear", "fig", "fig", "apple", "pear", "apple"].iter().enumerate() {
            s += &format!("{i},{k}\n");
        }
        let e = load(dir.path(), &s, "test_fraction = 0.3").map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("no label column 'y'"), "{e}");
        std::fs::write(dir.path().join("t.csv"), &s).unwrap();
        let c: DataConfig = toml::from_str("kind = \"table\"\npath = \"t.csv\"\nlabel = \"kind\"\ntest_fraction = 0.3\nseed = 1").unwrap();
        let ds = c.load(dir.path()).unwrap();
        assert_eq!(ds.num_outputs, 3);
        assert!(ds.description.contains("classes ['apple', 'fig', 'pear'] -> 0..2"), "{}", ds.description);
        // Row f = i has class index of its name; check on both splits.
        let name_of = |f: f64| ["pear", "apple", "fig", "apple", "pear", "fig", "fig", "apple", "pear", "apple"][f as usize];
        let idx = |n: &str| ["apple", "fig", "pear"].iter().position(|c| *c == n).unwrap();
        for (x, y) in [(&ds.x_train, &ds.y_train), (&ds.x_test, &ds.y_test)] {
            let Targets::Labels(y) = y else { panic!() };
            for (f, &l) in x.iter().zip(y) {
                assert_eq!(l, idx(name_of(*f)));
            }
        }
        // Stratified: 0.3 of 4 apples → 1, of 3 figs → 1, of 3 pears → 1.
        assert_eq!(ds.n_test(), 3);
        let Targets::Labels(yt) = &ds.y_test else { panic!() };
        let mut yt = yt.clone();
        yt.sort();
        assert_eq!(yt, vec![0, 1, 2]);
        assert_eq!(c.load(dir.path()).unwrap(), ds, "deterministic");
    }

    #[test]
    fn parquet_regression_with_standardize() {
        let dir = tempfile::tempdir().unwrap();
        let n = 20;
        let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let b: Vec<i64> = (0..n).map(|i| (i * i) as i64).collect();
        let y: Vec<f64> = (0..n).map(|i| 0.5 * i as f64 - 1.0).collect();
        Table::new().with("a", Column::F64(a.clone())).with("b", Column::I64(b)).with("target", Column::F64(y.clone())).write_parquet(&dir.path().join("r.parquet")).unwrap();
        let c: DataConfig = toml::from_str(
            "kind = \"table\"\npath = \"r.parquet\"\nlabel = \"target\"\ntask = \"regression\"\ntest_fraction = 0.25\nstandardize = true\nseed = 2",
        )
        .unwrap();
        let ds = c.load(dir.path()).unwrap();
        ds.validate().unwrap();
        assert!(!ds.is_classification());
        assert_eq!((ds.dim, ds.num_outputs, ds.n_train(), ds.n_test()), (2, 1, 15, 5));
        // Training features z-scored; test features with the same (training) statistics.
        for j in 0..2 {
            let col: Vec<f64> = ds.x_train.iter().skip(j).step_by(2).copied().collect();
            assert!(col.iter().sum::<f64>().abs() < 1e-12);
            assert!((col.iter().map(|v| v * v).sum::<f64>() / 15.0 - 1.0).abs() < 1e-12);
        }
        // Feature a is the row index and the target is 0.5 a - 1: recover a from the target.
        let Targets::Values(yt) = &ds.y_train else { panic!() };
        let a_train: Vec<f64> = yt.iter().map(|t| (t + 1.0) / 0.5).collect();
        let st = prep::Standardization::fit(&a_train, 1);
        let Targets::Values(ytest) = &ds.y_test else { panic!() };
        for (r, t) in ds.x_test.chunks(2).zip(ytest) {
            assert!((r[0] - ((t + 1.0) / 0.5 - st.mean[0]) / st.std[0]).abs() < 1e-12);
        }
        assert!(ds.description.contains("standardized with the training split's mean"), "{}", ds.description);
    }

    #[test]
    fn bad_tables_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let good = csv12();
        let split = "split = \"split\"";
        // Missing file.
        let e = cfg(split).load(&d.join("nowhere")).unwrap_err();
        assert!(matches!(e, Error::Io { .. }) && e.to_string().contains("t.csv"), "{e}");
        // Missing columns.
        let e = err(d, &good, "split = \"part\"");
        assert!(e.contains("t.csv: no split column 'part' (columns: a, b, y, split)"), "{e}");
        let e = err(d, &good, "split = \"split\"\nfeatures = [\"a\", \"c\"]");
        assert!(e.contains("no feature column 'c'"), "{e}");
        let e = err(d, &good.replace("a,b,y,split", "a,b,label,split"), split);
        assert!(e.contains("no label column 'y'"), "{e}");
        // NaN / inf / missing in features.
        let e = err(d, &good.replace("0.5,9,1,train", "nan,9,1,train"), split);
        assert!(e.contains("t.csv: NaN in feature 'a' of the table's row 1"), "{e}");
        let e = err(d, &good.replace("0.5,9,1,train", "0.5,inf,1,train"), split);
        assert!(e.contains("inf in feature 'b'"), "{e}");
        let e = err(d, &good.replace("0.5,9,1,train", "0.5,,1,train"), split);
        assert!(e.contains("missing value in column 'b' row 1"), "{e}");
        // A text feature.
        let e = err(d, &good.replace("0.5,9,1,train", "one,9,1,train"), split);
        assert!(e.contains("feature column 'a' has type str (row 1 is 'one')"), "{e}");
        let e = err(d, &good.replace("0.5,9,1,train", "NaN,9,1,train"), split);
        assert!(e.contains("t.csv: NaN in feature 'a' of the table's row 1"), "{e}");
        // Labels that are not classes.
        let e = err(d, &good.replace("0.5,9,1,train", "0.5,9,-1,train"), split);
        assert!(e.contains("label column 'y' row 1 is -1, not a class label"), "{e}");
        let e = err(d, &good.replace("0.5,9,1,train", "0.5,9,1.5,train"), split);
        assert!(e.contains("row 1 is 1.5, not a class label"), "{e}");
        // A split column with other values, and empty splits.
        let e = err(d, &good.replace("0.5,9,1,train", "0.5,9,1,training"), split);
        assert!(e.contains("split column 'split' row 1 is 'training'"), "{e}");
        let e = err(d, &good.replace("test", "val"), split);
        assert!(e.contains("t.csv: the test split is empty"), "{e}");
        let e = err(d, &good.replace("train", "val"), split);
        assert!(e.contains("the train split is empty"), "{e}");
        // A class missing from the training split (class 2 only in val/test).
        let e = err(d, &good.replace("1,8,2,train", "1,8,1,train").replace("2.5,5,2,train", "2.5,5,0,train"), split);
        assert!(e.contains("class 2 has no rows in the training split"), "{e}");
        // Unknown extension, and a fraction split with no rows for val.
        std::fs::write(d.join("t.tsv"), "x").unwrap();
        let c: DataConfig = toml::from_str("kind = \"table\"\npath = \"t.tsv\"\nlabel = \"y\"\ntest_fraction = 0.5").unwrap();
        assert!(c.load(d).unwrap_err().to_string().contains(".csv or .parquet"));
        let e = err(d, &good, "test_fraction = 0.3\nval_fraction = 0.01\nfeatures = [\"a\", \"b\"]");
        assert!(e.contains("the val split is empty"), "{e}");
    }

    #[test]
    fn config_checks() {
        for (extra, needle) in [
            ("", "needs data.split"),
            ("split = \"s\"\ntest_fraction = 0.2", "give one"),
            ("test_fraction = 1.0", "test_fraction"),
            ("test_fraction = 0.5\nval_fraction = 0.5", "val_fraction"),
            ("test_fraction = 0.5\nfeatures = []", "data.features is empty"),
            ("test_fraction = 0.5\nper_class = 2\nn_train = 3", "give one of them"),
            ("test_fraction = 0.5\ntask = \"regression\"\nper_class = 2", "classification"),
        ] {
            let e = cfg(extra).validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{extra}: {e}");
        }
        assert!(toml::from_str::<DataConfig>("kind = \"table\"\npath = \"t.csv\"\nlabel = \"y\"\ncolumns = 3").unwrap_err().to_string().contains("unknown field"));
        let c = cfg("test_fraction = 0.2\nstandardize = true");
        assert_eq!(toml::from_str::<DataConfig>(&toml::to_string(&c).unwrap()).unwrap(), c);
    }
}
