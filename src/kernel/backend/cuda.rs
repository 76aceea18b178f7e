//! The CUDA backend of the contraction: cuBLAS `DGEMM` on device 0 through `cudarc`.
//!
//! `cudarc` is built with `dynamic-loading`: `libcuda.so.1` (the driver's) and `libcublas.so.13`
//! are `dlopen`ed at first use, and `cudarc` **panics** when one is missing, so [`shared`] first
//! asks `is_culib_present()` of both and turns absence into one [`Error::Backend`] line. The
//! context, stream and cuBLAS handle are created once per process and shared.
//!
//! Row-major `C[m, n] = α·A[m, k]·B[n, k]ᵀ` is column-major `Cᵀ = α·B·Aᵀ`: cuBLAS is called with
//! `(m, n) = (n, m)`, `op(B) = T` with `ld = ldb`, `op(A) = N` with `ld = lda`, `ldc = n`, so no
//! operand is transposed or copied on either side.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use super::{Factor, Site};
use crate::error::{Error, Result};

/// Fraction of the device's free memory (at the first contraction of a process) that the
/// scratch blocks of row points and products may take, the resident training side aside.
const FREE_FRACTION: f64 = 0.6;

/// The process's CUDA device 0, its stream and cuBLAS handle, and what it holds resident.
pub(crate) struct CudaGemm {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    name: String,
    total_bytes: usize,
    state: Mutex<State>,
}

/// Device buffers kept between calls.
#[derive(Default)]
struct State {
    /// One training-side factor per site, with the stamp version and length it was uploaded
    /// with.
    resident: HashMap<Site, (u64, usize, CudaSlice<f64>)>,
    /// Scratch for row blocks of `A` and of the product `C`.
    a: Option<CudaSlice<f64>>,
    c: Option<CudaSlice<f64>>,
}

/// The shared device: created at the first call of the process, or the reason it cannot be
/// (kept, so that every later call fails the same way without touching the libraries again).
pub(crate) fn shared() -> Result<Arc<CudaGemm>> {
    static DEVICE: OnceLock<std::result::Result<Arc<CudaGemm>, String>> = OnceLock::new();
    DEVICE.get_or_init(|| CudaGemm::open().map(Arc::new)).clone().map_err(Error::Backend)
}

fn driver_err(what: &str, e: impl std::fmt::Debug) -> String {
    format!("CUDA {what}: {e:?}")
}

impl CudaGemm {
    /// Loads the driver and cuBLAS (checked first: `cudarc` panics on a missing library),
    /// creates the context on device 0, a stream and a cuBLAS handle.
    fn open() -> std::result::Result<Self, String> {
        // SAFETY: both only try `dlopen` on the candidate names and close what they opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("--device cuda: no CUDA driver library (libcuda.so.1) could be loaded: this machine has no NVIDIA driver/GPU".into());
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("--device cuda: the CUDA driver is present but cuBLAS 13 (libcublas.so.13 with libcublasLt.so.13) is not on the library path; add its directory to LD_LIBRARY_PATH".into());
        }
        let count = CudaContext::device_count().map_err(|e| driver_err("device count", e))?;
        if count < 1 {
            return Err("--device cuda: the CUDA driver reports no device".into());
        }
        let ctx = CudaContext::new(0).map_err(|e| driver_err("context on device 0", e))?;
        let name = ctx.name().map_err(|e| driver_err("device name", e))?;
        // SAFETY: the device handle is the context's own, from `cuDeviceGet`.
        let total_bytes = unsafe { cudarc::driver::result::device::total_mem(ctx.cu_device()) }.map_err(|e| driver_err("device memory", e))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| driver_err("cuBLAS handle", e))?;
        Ok(CudaGemm { ctx, stream, blas, name, total_bytes, state: Mutex::new(State::default()) })
    }

    /// `"<name>, <GiB> GiB"`.
    pub(crate) fn describe(&self) -> String {
        format!("{}, {:.1} GiB", self.name, self.total_bytes as f64 / (1u64 << 30) as f64)
    }

    /// Bytes free on the device now.
    fn free_bytes(&self) -> Result<usize> {
        self.ctx.bind_to_thread().map_err(|e| Error::Backend(driver_err("bind", e)))?;
        cudarc::driver::result::mem_get_info().map(|(free, _)| free).map_err(|e| Error::Backend(driver_err("memory info", e)))
    }

    /// Drops every resident factor and the scratch blocks.
    pub(crate) fn release(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *st = State::default();
    }

    /// [`super::Backend::abt`] on the device, in blocks of row points sized to its free memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn abt(&self, c: &mut [f64], a: &[f64], lda: usize, b: &Factor<'_>, m: usize, k: usize, alpha: f64, accumulate: bool) -> Result<()> {
        self.abt_blocks(c, a, lda, b, m, k, alpha, accumulate, None)
    }

    /// [`CudaGemm::abt`] with at most `max_rows` rows of `A` per block (`None`: what the free
    /// memory allows); the tests use small blocks to exercise the blocking.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn abt_blocks(&self, c: &mut [f64], a: &[f64], lda: usize, b: &Factor<'_>, m: usize, k: usize, alpha: f64, accumulate: bool, max_rows: Option<usize>) -> Result<()> {
        let n = b.n;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            if !accumulate {
                c.iter_mut().for_each(|v| *v = 0.0);
            }
            return Ok(());
        }
        let int = |v: usize, what: &str| i32::try_from(v).map_err(|_| Error::Backend(format!("cuBLAS: {what} = {v} exceeds a 32-bit int")));
        let (n_i, k_i, ldb_i, lda_i) = (int(n, "n")?, int(k, "k")?, int(b.ld, "ldb")?, int(lda, "lda")?);
        let be = |what: &str, e: &dyn std::fmt::Debug| Error::Backend(format!("CUDA {what}: {e:?}"));
        self.ctx.bind_to_thread().map_err(|e| be("bind", &e))?;
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        // The training side: uploaded once per stamp.
        let b_len = (n - 1) * b.ld + k;
        let fresh = !matches!(st.resident.get(&b.stamp.site), Some((v, len, _)) if *v == b.stamp.version && *len == b_len);
        if fresh {
            st.resident.remove(&b.stamp.site);
            let buf = self.stream.clone_htod(&b.data[..b_len]).map_err(|e| be("upload of the training side", &e))?;
            st.resident.insert(b.stamp.site, (b.stamp.version, b_len, buf));
        }
        // Rows per block: A's rows and C's rows within a fraction of the free memory.
        let rows = match max_rows {
            Some(r) => r.max(1),
            None => {
                let free = self.free_bytes()? as f64 * FREE_FRACTION;
                ((free / (8.0 * (lda + n) as f64)) as usize).max(1)
            }
        }
        .min(m);
        let need_a = (rows - 1) * lda + k;
        if st.a.as_ref().is_none_or(|s| s.len() < need_a) {
            st.a = None;
            st.a = Some(self.stream.alloc_zeros::<f64>(need_a).map_err(|e| be("allocation of a row block", &e))?);
        }
        if st.c.as_ref().is_none_or(|s| s.len() < rows * n) {
            st.c = None;
            st.c = Some(self.stream.alloc_zeros::<f64>(rows * n).map_err(|e| be("allocation of a product block", &e))?);
        }
        let (bdev, adev, cdev) = match (st.resident.get(&b.stamp.site), st.a.as_mut(), st.c.as_mut()) {
            (Some((_, _, bd)), Some(ad), Some(cd)) => (bd, ad, cd),
            _ => unreachable!("allocated above"),
        };
        for r0 in (0..m).step_by(rows) {
            let mr = rows.min(m - r0);
            let a_len = (mr - 1) * lda + k;
            self.stream.memcpy_htod(&a[r0 * lda..r0 * lda + a_len], &mut adev.slice_mut(0..a_len)).map_err(|e| be("upload of a row block", &e))?;
            let cblock = &mut c[r0 * n..(r0 + mr) * n];
            if accumulate {
                self.stream.memcpy_htod(&*cblock, &mut cdev.slice_mut(0..mr * n)).map_err(|e| be("upload of a product block", &e))?;
            }
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: n_i,
                n: int(mr, "m")?,
                k: k_i,
                alpha,
                lda: ldb_i,
                ldb: lda_i,
                beta: if accumulate { 1.0 } else { 0.0 },
                ldc: n_i,
            };
            // SAFETY: the shapes and leading dimensions describe buffers of at least the lengths
            // allocated and uploaded above: B `(n−1)·ldb + k`, A `(mr−1)·lda + k`, C `mr·n`.
            unsafe { self.blas.gemm(cfg, bdev, &adev.slice(0..a_len), &mut cdev.slice_mut(0..mr * n)) }.map_err(|e| be("cublasDgemm", &e))?;
            self.stream.memcpy_dtoh(&cdev.slice(0..mr * n), cblock).map_err(|e| be("download of a product block", &e))?;
        }
        self.stream.synchronize().map_err(|e| be("synchronize", &e))?;
        Ok(())
    }

    /// cuBLAS's DGEMM rate on `C = A·Bᵀ`, `n × n × n`, GFLOP/s: the fastest of `repeat` after a
    /// warm-up, operands resident (no host transfers in the timing).
    pub(crate) fn dgemm_rate(&self, n: usize, repeat: usize) -> Result<f64> {
        let be = |what: &str, e: &dyn std::fmt::Debug| Error::Backend(format!("CUDA {what}: {e:?}"));
        let n_i = i32::try_from(n).map_err(|_| Error::Config(format!("DGEMM size {n} exceeds a 32-bit int")))?;
        self.ctx.bind_to_thread().map_err(|e| be("bind", &e))?;
        let host: Vec<f64> = (0..n * n).map(|i| ((i % 97) as f64 - 48.0) / 97.0).collect();
        let a = self.stream.clone_htod(&host).map_err(|e| be("upload", &e))?;
        let mut c = self.stream.alloc_zeros::<f64>(n * n).map_err(|e| be("allocation", &e))?;
        let cfg = GemmConfig { transa: cublasOperation_t::CUBLAS_OP_T, transb: cublasOperation_t::CUBLAS_OP_N, m: n_i, n: n_i, k: n_i, alpha: 1.0, lda: n_i, ldb: n_i, beta: 0.0, ldc: n_i };
        let mut best = f64::INFINITY;
        for rep in 0..repeat.max(1) + 1 {
            self.stream.synchronize().map_err(|e| be("synchronize", &e))?;
            let t0 = Instant::now();
            // SAFETY: every operand is an `n × n` buffer allocated above.
            unsafe { self.blas.gemm(cfg, &a, &a, &mut c) }.map_err(|e| be("cublasDgemm", &e))?;
            self.stream.synchronize().map_err(|e| be("synchronize", &e))?;
            if rep > 0 {
                best = best.min(t0.elapsed().as_secs_f64());
            }
        }
        // Read one number back so a failed kernel cannot pass as a fast one.
        let mut probe = [0.0f64; 1];
        self.stream.memcpy_dtoh(&c.slice(0..1), &mut probe[..]).map_err(|e| be("download", &e))?;
        let expect: f64 = (0..n).map(|l| host[l] * host[l]).sum();
        if (probe[0] - expect).abs() > 1e-9 * expect.abs().max(1.0) {
            return Err(Error::Backend(format!("cuBLAS DGEMM check failed: C[0,0] = {} (expected {expect})", probe[0])));
        }
        Ok(2.0 * (n as f64).powi(3) / best * 1e-9)
    }
}
