//! `flatten`: PyTorch's `Flatten()`, a `[C, H, W]` map to `[C·H·W]` features (row-major, so the
//! numbers do not move).

use dfdx::prelude::*;

use super::autodiff::Activations;
use super::contract::{At, Layer, Poly, Probe, Sweep};
use super::{Cache, Grad};
use crate::model::tensors::ParamTensor;

/// The flatten layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Flatten;

impl Layer for Flatten {
    fn torch(&self) -> String {
        "Flatten()".into()
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, _keep: bool) -> (Vec<f64>, Cache) {
        (x, Cache::None)
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        (x, xd)
    }

    fn backward(&self, _first: usize, _at: &At, _cache: &Cache, dy: Vec<f64>, _k: usize, _want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        dy
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        Some(p)
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        match x {
            Activations::Map(t) => {
                let (b, c, h, w) = *t.shape();
                Activations::Flat(t.reshape_like(&(b, c * h * w)))
            }
            f => f,
        }
    }
}
