//! The CUDA backend of the device program: `kernels/epk.cu` as PTX (compiled ahead of time by
//! NVRTC, `scripts/gpu/ptx.py`; found at `$PATHKERNEL_PTX` or as `epk.ptx` beside the
//! executable) loaded by the driver, cuBLAS `DGEMM` (strided batched) for the GEMMs, every buffer
//! on device 0. Libraries are loaded at first use (`cudarc`'s dynamic loading, probed first: it
//! panics on a missing library), so the one binary runs with or without a GPU.
//!
//! What runs here is the program the host backend runs in the ordinary tests; only the launches
//! and the cuBLAS calls below are GPU-only, and they are tested on a GPU (`tests/device.rs`,
//! `#[ignore]`d without one).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::kernels::{Arg, Kernels, KERNELS, POINT_ITEM_KERNELS};
use super::{check_gemm, Backend, Gemm};
use crate::error::{Error, Result};

/// Threads per block of every kernel launch (grid-stride loops cover any `n`).
const THREADS: u32 = 256;
/// Threads per block of [`POINT_ITEM_KERNELS`] (2 000 points over 63 SMs, not 8).
const POINT_THREADS: u32 = 32;
/// At most this many blocks per launch.
const MAX_BLOCKS: u32 = 1 << 16;

/// Device 0 with its stream, cuBLAS handle and the loaded kernels.
pub(crate) struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<&'static str, CudaFunction>,
}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("CUDA {what}: {e:?}"))
}

/// Where the PTX is: `$PATHKERNEL_PTX`, else `epk.ptx` beside the executable.
fn ptx_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PATHKERNEL_PTX") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| Error::Backend(format!("--device cuda: cannot locate the executable to find epk.ptx beside it: {e}")))?;
    Ok(exe.with_file_name("epk.ptx"))
}

impl Cuda {
    /// The process's device (opened once; the reason it cannot be, every time).
    pub(crate) fn shared() -> Result<Arc<Cuda>> {
        static DEVICE: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();
        DEVICE.get_or_init(|| Cuda::open().map(Arc::new).map_err(|e| e.to_string())).clone().map_err(Error::Backend)
    }

    fn open() -> Result<Cuda> {
        // SAFETY: both only try `dlopen` on the candidate names and close what they opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Backend("--device cuda: no CUDA driver library (libcuda.so.1) could be loaded: this machine has no NVIDIA driver/GPU".into()));
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Backend("--device cuda: the CUDA driver is present but cuBLAS 13 (libcublas.so.13 with libcublasLt.so.13) is not on the library path; add its directory to LD_LIBRARY_PATH".into()));
        }
        let path = ptx_path()?;
        let ptx = std::fs::read_to_string(&path).map_err(|e| Error::Backend(format!("--device cuda: the kernels' PTX {} cannot be read ({e}); build it with scripts/gpu/ptx.py --out and set PATHKERNEL_PTX", path.display())))?;
        let ctx = CudaContext::new(0).map_err(|e| err("context on device 0", e))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| err("cuBLAS handle", e))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| err(&format!("loading {}", path.display()), e))?;
        let mut funcs = HashMap::new();
        for (kname, _) in KERNELS {
            funcs.insert(*kname, module.load_function(kname).map_err(|e| err(&format!("kernel {kname} in {}", path.display()), e))?);
        }
        Ok(Cuda { ctx, stream, blas, funcs })
    }
}

impl Backend for Cuda {
    type Buf = CudaSlice<f64>;

    fn upload(&self, x: &[f64]) -> Result<CudaSlice<f64>> {
        self.ctx.bind_to_thread().map_err(|e| err("bind", e))?;
        if x.is_empty() {
            return self.stream.alloc_zeros::<f64>(0).map_err(|e| err("allocation", e));
        }
        self.stream.clone_htod(x).map_err(|e| err("upload", e))
    }
    fn zeros(&self, n: usize) -> Result<CudaSlice<f64>> {
        self.ctx.bind_to_thread().map_err(|e| err("bind", e))?;
        self.stream.alloc_zeros::<f64>(n).map_err(|e| err(&format!("allocation of {n} numbers"), e))
    }
    fn download(&self, b: &CudaSlice<f64>) -> Result<Vec<f64>> {
        if b.is_empty() {
            return Ok(Vec::new());
        }
        self.stream.clone_dtoh(b).map_err(|e| err("download", e))
    }
    fn download_part(&self, b: &CudaSlice<f64>, offset: usize, dst: &mut [f64]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        if offset + dst.len() > b.len() {
            return Err(Error::Backend(format!("download of {} numbers at {offset} from a buffer of {}", dst.len(), b.len())));
        }
        self.stream.memcpy_dtoh(&b.slice(offset..offset + dst.len()), dst).map_err(|e| err("download", e))
    }
    fn len(&self, b: &CudaSlice<f64>) -> usize {
        b.len()
    }
    fn copy(&self, b: &CudaSlice<f64>) -> Result<CudaSlice<f64>> {
        if b.is_empty() {
            return self.zeros(0);
        }
        self.stream.clone_dtod(b).map_err(|e| err("copy", e))
    }

    /// Row-major `C = op(A)·op(B)` is column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLAS gets `(n, m, k)`,
    /// B first (transposed when stored untransposed is not what it needs), `ldc`.
    fn gemm(&self, g: &Gemm, a: &CudaSlice<f64>, b: &CudaSlice<f64>, c: &mut CudaSlice<f64>) -> Result<()> {
        check_gemm(g, a.len(), b.len(), c.len())?;
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        if g.k == 0 {
            return Err(Error::Backend("device GEMM with k = 0".into()));
        }
        let int = |v: usize, what: &str| i32::try_from(v).map_err(|_| Error::Backend(format!("cuBLAS: {what} = {v} exceeds a 32-bit int")));
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let gemm = GemmConfig {
            transa: op(g.b.trans),
            transb: op(g.a.trans),
            m: int(g.n, "n")?,
            n: int(g.m, "m")?,
            k: int(g.k, "k")?,
            alpha: g.alpha,
            lda: int(g.b.ld, "ldb")?,
            ldb: int(g.a.ld, "lda")?,
            beta: if g.accumulate { 1.0 } else { 0.0 },
            ldc: int(g.c.ld, "ldc")?,
        };
        let cfg = StridedBatchedConfig { gemm, batch_size: int(g.batch, "batch")?, stride_a: g.b.stride as i64, stride_b: g.a.stride as i64, stride_c: g.c.stride as i64 };
        let (bv, av) = (b.slice(g.b.offset..), a.slice(g.a.offset..));
        let mut cv = c.slice_mut(g.c.offset..);
        // SAFETY: `check_gemm` bounded every batch entry's extent by its buffer's length.
        unsafe { self.blas.gemm_strided_batched(cfg, &bv, &av, &mut cv) }.map_err(|e| err("cublasDgemmStridedBatched", e))
    }
}

impl Kernels for Cuda {
    fn launch(&self, name: &'static str, n: usize, args: &mut [Arg<'_, CudaSlice<f64>>]) -> Result<()> {
        let f = self.funcs.get(name).ok_or_else(|| Error::Backend(format!("no device kernel named {name}")))?;
        let threads = if POINT_ITEM_KERNELS.contains(&name) { POINT_THREADS } else { THREADS };
        let blocks = n.div_ceil(threads as usize).min(MAX_BLOCKS as usize) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&n64);
        for a in args.iter_mut() {
            match a {
                Arg::I(v) => b.arg(&*v),
                Arg::F(v) => b.arg(&*v),
                Arg::R(buf) => b.arg(*buf),
                Arg::W(buf) => b.arg(&mut **buf),
            };
        }
        // SAFETY: the typed callers checked every buffer's length for `n` items against what the
        // kernel reads and writes, and the arguments are pushed in the declared order.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| err(&format!("launch of {name}"), e))
    }
}
