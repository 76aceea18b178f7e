//! The hook through which the benchmark's expensive intermediates (retrained outputs, Grams,
//! attributions) pass, so a study engine can plug its own cache in: [`Stages::stage`] is called
//! with a stage name, a key that determines the value, and the computation.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// A cache of named, keyed stages.
pub trait Stages {
    /// The value of stage `name` for `key`: from the cache when present, else `compute()`'s
    /// (then stored).
    fn stage<T: Serialize + DeserializeOwned>(&self, name: &str, key: &str, compute: impl FnOnce() -> Result<T>) -> Result<T>;
}

/// No cache: every stage is computed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCache;

impl Stages for NoCache {
    fn stage<T: Serialize + DeserializeOwned>(&self, _: &str, _: &str, compute: impl FnOnce() -> Result<T>) -> Result<T> {
        compute()
    }
}

/// One JSON file per stage and key hash under a directory (`<name>-<fnv1a(key)>.json`, the key
/// stored beside the value and checked on reading).
#[derive(Clone, Debug)]
pub struct JsonDir(pub PathBuf);

#[derive(serde::Serialize, serde::Deserialize)]
struct Entry<T> {
    key: String,
    value: T,
}

impl Stages for JsonDir {
    fn stage<T: Serialize + DeserializeOwned>(&self, name: &str, key: &str, compute: impl FnOnce() -> Result<T>) -> Result<T> {
        let path = self.0.join(format!("{name}-{:016x}.json", crate::train::fnv1a(key.as_bytes())));
        if path.exists() {
            let bytes = crate::io::read_file(&path)?;
            let e: Entry<T> = serde_json::from_slice(&bytes).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
            if e.key == key {
                return Ok(e.value);
            }
        }
        let value = compute()?;
        crate::io::create_dir_all(&self.0)?;
        let e = Entry { key: key.to_string(), value };
        let s = serde_json::to_vec(&e).map_err(|e| Error::Data(format!("json: {e}")))?;
        crate::io::write_atomic(&path, &s)?;
        Ok(e.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn json_dir_computes_once_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let c = JsonDir(dir.path().join("cache"));
        let calls = Cell::new(0);
        let f = |v: f64| {
            calls.set(calls.get() + 1);
            Ok(vec![v, 0.1 + 0.2])
        };
        let a: Vec<f64> = c.stage("x", "k1", || f(1.0)).unwrap();
        let b: Vec<f64> = c.stage("x", "k1", || f(2.0)).unwrap();
        let d: Vec<f64> = c.stage("x", "k2", || f(3.0)).unwrap();
        assert_eq!((a.clone(), b, d[0], calls.get()), (a, vec![1.0, 0.1 + 0.2], 3.0, 2));
    }
}
