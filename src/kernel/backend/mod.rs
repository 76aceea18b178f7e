//! Where the Gram contraction's products run: one contract for the GEMM-shaped part of a step's
//! contraction, `C = β·C + α·A·Bᵀ` with the row points' factors in `A` and the training side's in
//! `B`, and two backends behind it.
//!
//! - [`Device::Cpu`]: faer on the global rayon pool, the engine's own GEMM (`crate::linalg`),
//!   bit for bit what the engine computed before this contract existed.
//! - [`Device::Cuda`]: cuBLAS `DGEMM` through `cudarc` (libraries loaded at first use, so the
//!   one binary builds with no CUDA toolkit and runs with or without a GPU). The training side
//!   `B` is uploaded once per `Stamp` and stays on the GPU for every block of row points that
//!   is contracted against it (a step's deeper layers; layer 0's buffer of several steps); the
//!   row side `A` and the product go through the GPU block by block, blocks sized to its free
//!   memory. Nothing here is GPU-specific beyond `cuda.rs`.
//!
//! On a GPU the `dense → relu → dense` closed form (`kernel::stack::closed`, the structured
//! contraction of `kernel::gram`) does not use `Backend::abt`: its whole contraction is
//! `resident` there — the Gram, layer 0's scale `x_p·x_i + 1` and each step's training side
//! stay on the device, the element-wise folds run as kernels, and the Gram comes down once. A
//! layer stack's path (and the CNN's, as its stack) evaluates its node gradients on the GPU
//! instead (`crate::device`) and contracts on the host; other paths refuse [`Device::Cuda`]
//! (`check_path`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub(crate) mod cuda;
pub(crate) mod resident;

/// Where the Gram contraction's GEMMs run (`kernel --device`, [`super::Request::device`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    /// faer on the CPU (the default).
    #[default]
    Cpu,
    /// CUDA device 0 (cuBLAS, and the node evaluations' kernels for layer stacks); an error (one
    /// line) when no GPU, driver or cuBLAS is found.
    Cuda,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(Error::Config(format!("--device {other}: expected cpu or cuda"))),
        }
    }
}

impl Device {
    /// Checks that the device can run a contraction now, and names it (`"cpu"`, or the GPU's
    /// name and memory). For [`Device::Cuda`] this loads the driver and cuBLAS and creates the
    /// context (once per process); without them it is an [`Error::Backend`] of one line.
    pub fn probe(self) -> Result<String> {
        match self {
            Device::Cpu => Ok("cpu".into()),
            Device::Cuda => cuda::shared().map(|g| g.describe()),
        }
    }
}

/// Which training-side factor a [`Stamp`] names: one resident slot each on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Site {
    /// Layer 0's buffer of several steps' training sensitivities (`kernel::gram`'s `Layer0Sum`;
    /// `diag` holds one per class, `full` and `trace` use class 0).
    Layer0(usize),
    /// A deeper layer's training activations with the bias column, for one step (its index
    /// among the deeper layers).
    Deep(usize),
}

/// The name of a training-side factor's contents: the caller changes `version` whenever the
/// numbers under `site` change, and a device backend re-uploads only then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Stamp {
    /// The slot.
    pub site: Site,
    /// Changes with the contents.
    pub version: u64,
}

impl Stamp {
    /// A stamp for `site` whose version no other stamp of the process has (the device is shared
    /// by every computation of the process, so versions must not repeat across them).
    pub(crate) fn fresh(site: Site) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Stamp { site, version: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }
    }
}

/// The training side `B` of `C = α·A·Bᵀ`: `n` rows of which the first `k` columns are used,
/// row `i` starting at `i·ld`.
///
/// # Shapes
/// `data` `[n, ld]` (the last row may stop after its first `k` numbers).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Factor<'a> {
    /// Row-major numbers.
    pub data: &'a [f64],
    /// Rows.
    pub n: usize,
    /// Distance between rows.
    pub ld: usize,
    /// What the numbers are (for residency on a device).
    pub stamp: Stamp,
}

/// A contraction backend: the CPU (faer) or a CUDA device (cuBLAS). Cheap to clone (the device
/// is shared by the process).
#[derive(Clone)]
pub(crate) enum Backend {
    /// faer on the global rayon pool.
    Cpu,
    /// cuBLAS on device 0.
    Cuda(Arc<cuda::CudaGemm>),
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Cpu => "Backend::Cpu",
            Backend::Cuda(_) => "Backend::Cuda",
        })
    }
}

impl Backend {
    /// The backend of `device` (for CUDA: the process's context, created at the first call).
    pub(crate) fn open(device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Backend::Cpu),
            Device::Cuda => cuda::shared().map(Backend::Cuda),
        }
    }

    /// `c = α·A·Bᵀ` (`accumulate`: `c += α·A·Bᵀ`) with the first `k` columns of `A`'s and `B`'s
    /// rows.
    ///
    /// # Shapes
    /// `a` `[m, lda]` (the last row may stop after `k` numbers), `b` `[n, ld]`, `c` `[m, n]`
    /// (`k ≤ lda, b.ld`).
    ///
    /// # Panics
    /// When a slice is shorter than its shape says (a programmer error).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn abt(&self, c: &mut [f64], a: &[f64], lda: usize, b: &Factor<'_>, m: usize, k: usize, alpha: f64, accumulate: bool) -> Result<()> {
        check_shapes(c, a, lda, b, m, k);
        match self {
            Backend::Cpu => {
                cpu_abt(c, a, lda, b.data, b.ld, m, b.n, k, alpha, accumulate);
                Ok(())
            }
            Backend::Cuda(g) => g.abt(c, a, lda, b, m, k, alpha, accumulate),
        }
    }

    /// Bytes of product a block of row points may take on this backend, given the CPU's
    /// `cpu_bytes` (sized for its caches): a GPU gets blocks of at least 256 MiB, since each
    /// block is one round trip over PCIe and a product of a few MFLOP would be all latency.
    /// The memory planner (`kernel::engine::blocked`) counts the CPU's size, so on a GPU the host holds
    /// up to this much more.
    pub(crate) fn block_bytes(&self, cpu_bytes: usize) -> usize {
        match self {
            Backend::Cpu => cpu_bytes,
            Backend::Cuda(_) => cpu_bytes.max(256 << 20),
        }
    }

    /// Frees what a device holds resident (the end of a computation).
    pub(crate) fn release(&self) {
        if let Backend::Cuda(g) = self {
            g.release();
        }
    }
}

/// The shape checks of [`Backend::abt`].
fn check_shapes(c: &[f64], a: &[f64], lda: usize, b: &Factor<'_>, m: usize, k: usize) {
    let n = b.n;
    assert!(k <= lda && k <= b.ld, "the inner dimension is wider than the rows");
    assert_eq!(c.len(), m * n, "C has the wrong size");
    if m > 0 && k > 0 {
        assert!(a.len() >= (m - 1) * lda + k, "A is shorter than [m, lda]");
    }
    if n > 0 && k > 0 {
        assert!(b.data.len() >= (n - 1) * b.ld + k, "B is shorter than [n, ld]");
    }
}

/// The CPU backend: the engine's own faer GEMM (`crate::linalg::gemm_abt` for contiguous
/// operands, `gemm_abt_prefix` for strided ones without α or accumulation, the same call with
/// both otherwise).
#[allow(clippy::too_many_arguments)]
fn cpu_abt(c: &mut [f64], a: &[f64], lda: usize, b: &[f64], ldb: usize, m: usize, n: usize, k: usize, alpha: f64, accumulate: bool) {
    if lda == k && ldb == k {
        crate::linalg::gemm_abt(c, &a[..m * k], &b[..n * k], m, n, k, alpha, accumulate);
    } else if alpha == 1.0 && !accumulate {
        crate::linalg::gemm_abt_prefix(c, &a[..m * lda], lda, &b[..n * ldb], ldb, m, n, k);
    } else {
        if m == 0 || n == 0 {
            return;
        }
        let mut dst = MatMut::from_row_major_slice_mut(c, m, n);
        if k == 0 {
            if !accumulate {
                dst.fill(0.0);
            }
            return;
        }
        let lhs = MatRef::from_row_major_slice_with_stride(&a[..(m - 1) * lda + k], m, k, lda);
        let rhs = MatRef::from_row_major_slice_with_stride(&b[..(n - 1) * ldb + k], n, k, ldb).transpose();
        let beta = if accumulate { Accum::Add } else { Accum::Replace };
        let par = if (m as f64) * (n as f64) * (k as f64) > 2.0e6 { Par::rayon(0) } else { Par::Seq };
        matmul(dst, beta, lhs, rhs, alpha, par);
    }
}

/// Refuses [`Device::Cuda`] on a path that has no device backend: the MLP's structured Gram
/// path (`kernel::gram`) contracts through one, the layer stack's path evaluates its nodes on one
/// (`crate::device`); `supported` says whether the computation takes either.
pub(crate) fn check_path(device: Device, supported: bool, what: &str) -> Result<()> {
    if device == Device::Cuda && !supported {
        return Err(Error::Config(format!("--device cuda runs the MLP's structured Gram path and the layer stack's path only; this computation takes {what} (use --device cpu)")));
    }
    Ok(())
}

/// The DGEMM rate of `device` on an `n × n × n` product `C = A·Bᵀ`, GFLOP/s (the fastest of
/// `repeat` after one warm-up; on a GPU the host transfers are excluded).
pub fn dgemm_rate(device: Device, n: usize, repeat: usize) -> Result<f64> {
    match device {
        Device::Cpu => {
            let a: Vec<f64> = (0..n * n).map(|i| ((i % 97) as f64 - 48.0) / 97.0).collect();
            let mut c = vec![0.0; n * n];
            let mut best = f64::INFINITY;
            for _ in 0..repeat.max(1) + 1 {
                let t0 = std::time::Instant::now();
                crate::linalg::gemm_abt(&mut c, &a, &a, n, n, n, 1.0, false);
                best = best.min(t0.elapsed().as_secs_f64());
            }
            std::hint::black_box(&c);
            Ok(2.0 * (n as f64).powi(3) / best * 1e-9)
        }
        Device::Cuda => cuda::shared()?.dgemm_rate(n, repeat),
    }
}

#[cfg(test)]
mod tests;
