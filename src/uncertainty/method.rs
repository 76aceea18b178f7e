//! The benchmark's methods by name: the kernels of the kernel GPs ([`GpKernel`]), their ablations
//! ([`Ablation`]), the function-space Laplace predictives (`FslVariant`) and every method
//! (`Method`), whose `Display` is the name in the tables, the parquet files and the charts
//! (`map`, `epk-gp`, `window50-gp-netmean`, `fsl-epk-diag-Ts`, …) and whose `FromStr` reads it
//! back.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::gp::Curvature;
use crate::kernel::KernelKind;

/// A kernel of the kernel GPs (`kernel_gps` of a study's `[uncertainty]` section).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpKernel {
    /// The exact path kernel (`epk`).
    Epk,
    /// The empirical NTK at `w_N` (`ntk`).
    Ntk,
    /// The path kernel over every step (`path`).
    Path,
    /// The path kernel over the last `L ≥ 1` steps (`window:L`, label `windowL`).
    Window(usize),
}

impl GpKernel {
    /// The label in method names and cache folders: `epk`, `ntk`, `path`, `windowL`.
    pub fn label(&self) -> String {
        match self {
            GpKernel::Window(l) => format!("window{l}"),
            GpKernel::Epk => "epk".into(),
            GpKernel::Ntk => "ntk".into(),
            GpKernel::Path => "path".into(),
        }
    }
    /// The kernel computed.
    pub fn kind(&self) -> KernelKind {
        match self {
            GpKernel::Epk => KernelKind::Epk,
            GpKernel::Ntk => KernelKind::Ntk,
            GpKernel::Path | GpKernel::Window(_) => KernelKind::Path,
        }
    }
    /// The window of the path kernel (last L steps), if any.
    pub fn window(&self) -> Option<usize> {
        match self {
            GpKernel::Window(l) => Some(*l),
            _ => None,
        }
    }
}

/// The study file's text: `epk`, `ntk`, `path`, `window:L`.
impl fmt::Display for GpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpKernel::Window(l) => write!(f, "window:{l}"),
            other => f.write_str(&other.label()),
        }
    }
}

impl FromStr for GpKernel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "epk" => Ok(GpKernel::Epk),
            "ntk" => Ok(GpKernel::Ntk),
            "path" => Ok(GpKernel::Path),
            _ => match s.strip_prefix("window:").and_then(|l| l.parse::<usize>().ok()) {
                Some(l) if l >= 1 => Ok(GpKernel::Window(l)),
                _ => Err(Error::Config(format!("[uncertainty] kernel_gps: `{s}` is not epk, ntk, path or window:L (L >= 1 steps)"))),
            },
        }
    }
}

/// An ablation of the kernel GPs on the same Grams (`ablations` of `[uncertainty]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ablation {
    /// `netmean`: the network's outputs as the mean, the GP's variance.
    NetMean,
    /// `sym`: the EPK-GP on the symmetrised training Gram with the training points on the test
    /// side.
    Sym,
}

impl fmt::Display for Ablation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ablation::NetMean => "netmean",
            Ablation::Sym => "sym",
        })
    }
}

impl FromStr for Ablation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "netmean" => Ok(Ablation::NetMean),
            "sym" => Ok(Ablation::Sym),
            _ => Err(Error::Config(format!("[uncertainty] ablations: `{s}` is not sym or netmean"))),
        }
    }
}

/// How a function-space Laplace method turns its posterior into probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum FslVariant {
    /// δ by the evidence, probit link (no suffix).
    Probit,
    /// δ by the evidence, Monte Carlo from the `K × K` covariance (`-mc`).
    Mc,
    /// δ by the evidence, a temperature fitted on the validation split, probit (`-T`).
    Temperature,
    /// δ by the evidence, temperature and variance scale fitted on the validation split (`-Ts`).
    TemperatureScale,
    /// δ by the validation NLL over `logspace(−4, 4, 100)`, probit (`-grid`; class-diagonal only).
    Grid,
}

impl FslVariant {
    /// Every variant, in report order.
    pub(crate) const ALL: [FslVariant; 5] = [FslVariant::Probit, FslVariant::Mc, FslVariant::Temperature, FslVariant::TemperatureScale, FslVariant::Grid];
    /// The suffix of the method name.
    pub(crate) fn suffix(&self) -> &'static str {
        match self {
            FslVariant::Probit => "",
            FslVariant::Mc => "-mc",
            FslVariant::Temperature => "-T",
            FslVariant::TemperatureScale => "-Ts",
            FslVariant::Grid => "-grid",
        }
    }
    /// Whether the variant exists for `curvature` on the class-diagonal kernel (the δ grid only
    /// for the class-diagonal curvature there; on the cross-class kernel every variant exists).
    pub(crate) fn applies_to(&self, curvature: Curvature) -> bool {
        *self != FslVariant::Grid || curvature == Curvature::ClassDiagonal
    }
    /// Whether something was fitted on the validation split.
    pub(crate) fn calibrated(&self) -> bool {
        matches!(self, FslVariant::Temperature | FslVariant::TemperatureScale | FslVariant::Grid)
    }
}

/// A method of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    /// `map`: the network's softmax.
    Map,
    /// `temperature`: `softmax(z / T)`, T fitted on the validation split.
    Temperature,
    /// `laplace`: last-layer Laplace.
    Laplace,
    /// `ensemble`: the deep ensemble's mean softmax.
    Ensemble,
    /// `{kernel}-gp`: the per-class GP regression on a kernel.
    Gp(GpKernel),
    /// `epk-gp-sym`: the EPK-GP on the symmetrised test-side training Gram.
    GpSym,
    /// `{kernel}-gp-netmean`: the network's outputs as the mean, the GP's variance.
    GpNetMean(GpKernel),
    /// `fsl-{kernel}-{curvature}{suffix}`: function-space Laplace on the class-diagonal blocks
    /// of a kernel (`diag`: laplace-torch's `independent_outputs=True`; `full`: the full
    /// per-point Λ with class-diagonal kernels, a hybrid).
    Fsl(GpKernel, Curvature, FslVariant),
    /// `fsl-{kernel}-kxk-{curvature}{suffix}`: function-space Laplace on the cross-class kernel
    /// (`diag`: laplace-torch's `independent_outputs=False`; `full`: the GGN-exact posterior).
    FslKxk(GpKernel, Curvature, FslVariant),
}

impl Method {
    /// The built-in methods of [`super::builtin_methods`], in order.
    pub(crate) const BUILTIN: [Method; 4] = [Method::Map, Method::Temperature, Method::Laplace, Method::Ensemble];
    /// The protocol's methods in table order.
    pub(crate) const PROTOCOL: [Method; 6] = [Method::Map, Method::Temperature, Method::Gp(GpKernel::Epk), Method::Gp(GpKernel::Ntk), Method::Laplace, Method::Ensemble];
    /// The ablations of the kernel GPs with a display name, in table order.
    pub(crate) const ABLATIONS: [Method; 3] = [Method::GpSym, Method::GpNetMean(GpKernel::Epk), Method::GpNetMean(GpKernel::Ntk)];

    /// The display name of the protocol's methods and of the named ablations.
    pub(crate) fn title(&self) -> Option<&'static str> {
        Some(match self {
            Method::Map => "MAP softmax",
            Method::Temperature => "temperature scaling",
            Method::Gp(GpKernel::Epk) => "EPK-GP",
            Method::Gp(GpKernel::Ntk) => "NTK-GP (w_N)",
            Method::Laplace => "last-layer Laplace",
            Method::Ensemble => "deep ensemble",
            Method::GpSym => "EPK-GP, symmetrised test-side training Gram",
            Method::GpNetMean(GpKernel::Epk) => "EPK-GP variance around the network's outputs",
            Method::GpNetMean(GpKernel::Ntk) => "NTK-GP variance around the network's outputs",
            _ => return None,
        })
    }
}

/// The display name of a method named `m` (`temperature` → `temperature scaling`), else `m`.
pub fn display_name(m: &str) -> String {
    m.parse::<Method>().ok().and_then(|x| x.title()).map_or(m.to_string(), str::to_string)
}

impl Method {
    /// Variant, kernel, curvature, FSL variant: the order of [`Ord`].
    fn order_key(&self) -> (u8, Option<GpKernel>, u8, Option<FslVariant>) {
        match *self {
            Method::Map => (0, None, 0, None),
            Method::Temperature => (1, None, 0, None),
            Method::Laplace => (2, None, 0, None),
            Method::Ensemble => (3, None, 0, None),
            Method::Gp(k) => (4, Some(k), 0, None),
            Method::GpSym => (5, None, 0, None),
            Method::GpNetMean(k) => (6, Some(k), 0, None),
            Method::Fsl(k, c, v) => (7, Some(k), if c == Curvature::ClassDiagonal { 0 } else { 1 }, Some(v)),
            Method::FslKxk(k, c, v) => (7, Some(k), if c == Curvature::ClassDiagonal { 2 } else { 3 }, Some(v)),
        }
    }
}

impl PartialOrd for Method {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Method {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order_key().cmp(&other.order_key())
    }
}

impl std::hash::Hash for Method {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.order_key().hash(state);
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Map => f.write_str("map"),
            Method::Temperature => f.write_str("temperature"),
            Method::Laplace => f.write_str("laplace"),
            Method::Ensemble => f.write_str("ensemble"),
            Method::Gp(k) => write!(f, "{}-gp", k.label()),
            Method::GpSym => f.write_str("epk-gp-sym"),
            Method::GpNetMean(k) => write!(f, "{}-gp-netmean", k.label()),
            Method::Fsl(k, c, v) => write!(f, "fsl-{}-{c}{}", k.label(), v.suffix()),
            Method::FslKxk(k, c, v) => write!(f, "fsl-{}-kxk-{c}{}", k.label(), v.suffix()),
        }
    }
}

impl FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Config(format!("`{s}` is not a method of the benchmark"));
        let kernel = |label: &str| -> Option<GpKernel> {
            match label {
                "epk" => Some(GpKernel::Epk),
                "ntk" => Some(GpKernel::Ntk),
                "path" => Some(GpKernel::Path),
                _ => label.strip_prefix("window").and_then(|l| l.parse().ok()).filter(|&l| l >= 1 && label == format!("window{l}")).map(GpKernel::Window),
            }
        };
        Ok(match s {
            "map" => Method::Map,
            "temperature" => Method::Temperature,
            "laplace" => Method::Laplace,
            "ensemble" => Method::Ensemble,
            "epk-gp-sym" => Method::GpSym,
            _ => {
                if let Some(rest) = s.strip_prefix("fsl-") {
                    let (k, rest) = rest.split_once('-').ok_or_else(bad)?;
                    let k = kernel(k).ok_or_else(bad)?;
                    let (kxk, rest) = match rest.strip_prefix("kxk-") {
                        Some(r) => (true, r),
                        None => (false, rest),
                    };
                    let (c, v) = rest.split_once('-').map_or((rest, ""), |(c, v)| (c, v));
                    let c = match c {
                        "diag" => Curvature::ClassDiagonal,
                        "full" => Curvature::Full,
                        _ => return Err(bad()),
                    };
                    let v = FslVariant::ALL.into_iter().find(|x| x.suffix().trim_start_matches('-') == v && (kxk || x.applies_to(c))).ok_or_else(bad)?;
                    if kxk {
                        Method::FslKxk(k, c, v)
                    } else {
                        Method::Fsl(k, c, v)
                    }
                } else if let Some(k) = s.strip_suffix("-gp-netmean") {
                    Method::GpNetMean(kernel(k).ok_or_else(bad)?)
                } else if let Some(k) = s.strip_suffix("-gp") {
                    Method::Gp(kernel(k).ok_or_else(bad)?)
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_todays_and_read_back() {
        let cases = [
            (Method::Map, "map"),
            (Method::Temperature, "temperature"),
            (Method::Laplace, "laplace"),
            (Method::Ensemble, "ensemble"),
            (Method::Gp(GpKernel::Epk), "epk-gp"),
            (Method::Gp(GpKernel::Window(50)), "window50-gp"),
            (Method::GpSym, "epk-gp-sym"),
            (Method::GpNetMean(GpKernel::Ntk), "ntk-gp-netmean"),
            (Method::GpNetMean(GpKernel::Path), "path-gp-netmean"),
            (Method::Fsl(GpKernel::Epk, Curvature::ClassDiagonal, FslVariant::TemperatureScale), "fsl-epk-diag-Ts"),
            (Method::Fsl(GpKernel::Window(20), Curvature::Full, FslVariant::Probit), "fsl-window20-full"),
            (Method::Fsl(GpKernel::Ntk, Curvature::ClassDiagonal, FslVariant::Grid), "fsl-ntk-diag-grid"),
            (Method::Fsl(GpKernel::Ntk, Curvature::Full, FslVariant::Mc), "fsl-ntk-full-mc"),
            (Method::Fsl(GpKernel::Epk, Curvature::Full, FslVariant::Temperature), "fsl-epk-full-T"),
            (Method::FslKxk(GpKernel::Ntk, Curvature::ClassDiagonal, FslVariant::Probit), "fsl-ntk-kxk-diag"),
            (Method::FslKxk(GpKernel::Epk, Curvature::Full, FslVariant::Grid), "fsl-epk-kxk-full-grid"),
            (Method::FslKxk(GpKernel::Window(50), Curvature::Full, FslVariant::TemperatureScale), "fsl-window50-kxk-full-Ts"),
        ];
        for (m, name) in cases {
            assert_eq!(m.to_string(), name);
            assert_eq!(name.parse::<Method>().unwrap(), m, "{name}");
        }
        for bad in ["fsl-epk-full-grid", "fsl-epk-kxk", "fsl-epk-kxk-", "fsl-epk-kxk-full-x", "window0-gp", "window05-gp", "dpk-gp", "fsl-epk", "gp"] {
            assert!(bad.parse::<Method>().is_err(), "{bad}");
        }
    }

    #[test]
    fn kernels_read_the_study_text() {
        for (t, k, label) in [("epk", GpKernel::Epk, "epk"), ("ntk", GpKernel::Ntk, "ntk"), ("path", GpKernel::Path, "path"), ("window:50", GpKernel::Window(50), "window50")] {
            let got: GpKernel = t.parse().unwrap();
            assert_eq!((got, got.to_string().as_str(), got.label().as_str()), (k, t, label));
        }
        assert!("window:0".parse::<GpKernel>().is_err());
        assert!("dpk".parse::<GpKernel>().unwrap_err().to_string().contains("`dpk` is not epk, ntk, path or window:L"));
        assert_eq!("sym".parse::<Ablation>().unwrap(), Ablation::Sym);
        assert!("fancy".parse::<Ablation>().unwrap_err().to_string().contains("not sym or netmean"));
    }
}
