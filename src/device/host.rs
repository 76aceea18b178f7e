//! The host backend: buffers are `Vec<f64>`, GEMMs are faer's, kernels are `kernels/epk.cu`
//! compiled as C (one thread each). It exists to run the device's program on the CPU in the
//! ordinary tests; the CPU engine itself does not use it.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use super::kernels::{host_launch, Arg, Kernels};
use super::{check_gemm, Backend, Gemm, Operand};
use crate::error::Result;

/// The host backend.
pub(crate) struct Host;

/// Operand `op` of batch entry `b` as a `[rows, cols]` view (transposed when stored so).
fn view<'a>(buf: &'a [f64], op: &Operand, b: usize, rows: usize, cols: usize) -> MatRef<'a, f64> {
    let (sr, sc) = if op.trans { (cols, rows) } else { (rows, cols) };
    let start = op.offset + b * op.stride;
    let end = if sr == 0 || sc == 0 { start } else { start + (sr - 1) * op.ld + sc };
    let m = MatRef::from_row_major_slice_with_stride(&buf[start..end], sr, sc, op.ld);
    if op.trans {
        m.transpose()
    } else {
        m
    }
}

impl Backend for Host {
    type Buf = Vec<f64>;

    fn upload(&self, x: &[f64]) -> Result<Vec<f64>> {
        Ok(x.to_vec())
    }
    fn zeros(&self, n: usize) -> Result<Vec<f64>> {
        Ok(vec![0.0; n])
    }
    fn download(&self, b: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(b.clone())
    }
    fn download_part(&self, b: &Vec<f64>, offset: usize, dst: &mut [f64]) -> Result<()> {
        let src = b.get(offset..offset + dst.len()).ok_or_else(|| crate::error::Error::Backend(format!("download of {} numbers at {offset} from a buffer of {}", dst.len(), b.len())))?;
        dst.copy_from_slice(src);
        Ok(())
    }
    fn len(&self, b: &Vec<f64>) -> usize {
        b.len()
    }
    fn copy(&self, b: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(b.clone())
    }

    fn gemm(&self, g: &Gemm, a: &Vec<f64>, b: &Vec<f64>, c: &mut Vec<f64>) -> Result<()> {
        check_gemm(g, a.len(), b.len(), c.len())?;
        for e in 0..g.batch {
            let lhs = view(a, &g.a, e, g.m, g.k);
            let rhs = view(b, &g.b, e, g.k, g.n);
            let start = g.c.offset + e * g.c.stride;
            let end = if g.m == 0 || g.n == 0 { start } else { start + (g.m - 1) * g.c.ld + g.n };
            // The transpose of a column-major view: faer 0.24.4's `from_row_major_slice_with_stride_mut`
            // lays rows out with unit row stride (a column-major matrix), unlike its `MatRef` twin.
            let mut dst = MatMut::from_column_major_slice_with_stride_mut(&mut c[start..end], g.n, g.m, g.c.ld).transpose_mut();
            if g.k == 0 {
                if !g.accumulate {
                    dst.fill(0.0);
                }
                continue;
            }
            matmul(dst, if g.accumulate { Accum::Add } else { Accum::Replace }, lhs, rhs, g.alpha, Par::Seq);
        }
        Ok(())
    }
}

impl Kernels for Host {
    fn launch(&self, name: &'static str, n: usize, args: &mut [Arg<'_, Vec<f64>>]) -> Result<()> {
        host_launch(name, n, args)
    }
}
