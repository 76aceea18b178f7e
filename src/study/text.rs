//! Serde through the text form of a value with `FromStr` (`quadrature = "auto:1e-12"`,
//! `points = "grid:40"`, `kernel_gps = ["epk", "window:50"]`), so a study file and the cache key
//! read as before.

use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

pub fn deserialize<'de, D: Deserializer<'de>, T: std::str::FromStr<Err = crate::Error>>(d: D) -> Result<T, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|e: crate::Error| D::Error::custom(e.to_string()))
}

pub mod rule {
    pub use super::deserialize;
    pub fn serialize<S: super::Serializer>(r: &crate::kernel::Rule, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&r.to_string())
    }
}

/// A list of values in their text form (`Display` writes what `FromStr` reads).
pub mod list {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>, T: std::str::FromStr<Err = crate::Error>>(d: D) -> Result<Vec<T>, D::Error> {
        Vec::<String>::deserialize(d)?.iter().map(|s| s.parse().map_err(|e: crate::Error| D::Error::custom(e.to_string()))).collect()
    }
    pub fn serialize<S: Serializer, T: std::fmt::Display>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| x.to_string()))
    }
}

/// An optional list of values in their text form (absent: `None`).
pub mod opt_list {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>, T: std::str::FromStr<Err = crate::Error>>(d: D) -> Result<Option<Vec<T>>, D::Error> {
        Option::<Vec<String>>::deserialize(d)?.map(|v| v.iter().map(|s| s.parse().map_err(|e: crate::Error| D::Error::custom(e.to_string()))).collect()).transpose()
    }
    pub fn serialize<S: Serializer, T: std::fmt::Display>(v: &Option<Vec<T>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_seq(v.iter().map(|x| x.to_string())),
            None => s.serialize_none(),
        }
    }
}
