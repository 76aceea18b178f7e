//! `max_pool2d`: PyTorch's `MaxPool2d(kernel, stride)` ([`Pool`] holds the windows).
//!
//! Piecewise linear: along a step each window's output follows one entry, and changes entry
//! where two entries' polynomials in t cross — a kink the sweep follows; behind a smooth layer
//! the probe gives each entry's margin over the rest of its window, whose sign changes there.

use dfdx::prelude::*;

use super::autodiff::{map, pool_index, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, Along, At, Layer, Poly, Probe, Sweep};
use super::pool::Pool;
use super::{pool, AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved max-pooling layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MaxPool {
    pub pool: Pool,
    /// A ReLU follows (the pool runs ahead of it, see `pool_ahead_of_activations`): the kink
    /// sweep then follows `max(0, window)`, on which a change of winner among negative entries
    /// is no kink.
    pub relu_after: bool,
}

impl Layer for MaxPool {
    fn torch(&self) -> String {
        format!("MaxPool2d({}, stride={})", self.pool.k, self.pool.stride)
    }

    /// The winners as here (a following ReLU changes only the kink sweep).
    fn device(&self) -> Option<crate::device::program::Op> {
        Some(crate::device::program::Op::MaxPool(self.pool.device_window()))
    }

    fn along(&self) -> Along {
        Along::Kinked
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let (y, arg) = self.pool.max_forward(&x);
        (y, if keep { Cache::Arg(arg) } else { Cache::None })
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        if let (Some(pr), Some(xd)) = (probe, xd.as_deref()) {
            self.pool.max_margins(&x, xd, pr);
        }
        let (y, arg) = self.pool.max_forward(&x);
        (y, xd.as_deref().map(|xd| self.pool.max_gather(xd, &arg)))
    }

    fn max_pool_winners<'a>(&self, cache: &'a Cache) -> Option<&'a [u32]> {
        match cache {
            Cache::Arg(arg) => Some(arg),
            _ => None,
        }
    }

    fn backward(&self, _first: usize, _at: &At, cache: &Cache, dy: Vec<f64>, k: usize, _want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Arg(arg) = cache else { unreachable!("a max-pool's cache is its winners") };
        self.pool.max_backward(&dy, arg, k)
    }

    /// Each window follows its winner at `sw.tm`; every other entry's difference to it is a
    /// polynomial whose roots are kinks. With a ReLU after it, a window whose winner is not
    /// positive at `sw.tm` gives 0 until one of its entries turns positive: then each entry's
    /// own roots are the kinks, and its entries' crossings below zero are not (the winner
    /// still goes on, so that the ReLU finds its root).
    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, sw: &mut Sweep) -> Option<Poly> {
        let pl = &self.pool;
        let out = pl.c * pl.ho * pl.wo;
        let deg = p.deg();
        let mut c = vec![0.0; (deg + 1) * out];
        let mut o = 0;
        for ch in 0..pl.c {
            for oy in 0..pl.ho {
                for ox in 0..pl.wo {
                    let best = pl.window(ch, oy, ox).fold(usize::MAX, |b, q| if b == usize::MAX || p.at(q, sw.tm) > p.at(b, sw.tm) { q } else { b });
                    let floored = self.relu_after && p.at(best, sw.tm) <= 0.0;
                    for q in pl.window(ch, oy, ox) {
                        if floored {
                            sw.roots_of(&p, q, None);
                        } else if q != best {
                            sw.roots_of(&p, q, Some(best));
                        } else if self.relu_after {
                            // Where the winner falls to zero the window turns to the floor (the
                            // ReLU's kink too): ending the piece here makes the next walk start
                            // at this layer, whose roots are then the floor's.
                            sw.roots_of(&p, q, None);
                        }
                    }
                    for j in 0..=deg {
                        c[j * out + o] = p.c[j * p.size + best];
                    }
                    o += 1;
                }
            }
        }
        Some(Poly { c, size: out })
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let pl = &self.pool;
        let a = map(x);
        let rows = a.shape().0;
        let dev = a.device().clone();
        let values = a.as_vec();
        let idx = pool_index(pl, rows, Some(&values));
        let len = idx.len();
        let idx = dev.tensor_from_vec(idx, (len,));
        let g = a.reshape_like(&(rows * pl.c * pl.h * pl.w,)).gather::<(usize,), (usize,)>(idx);
        Activations::Map(g.reshape_like(&(rows, pl.c, pl.ho, pl.wo)))
    }
}

/// `{ max_pool2d = k }` or `{ max_pool2d = { kernel, stride } }`: `MaxPool2d(kernel, stride)` (stride
/// defaults to the kernel).
#[derive(Clone, Debug, PartialEq)]
pub struct MaxPool2dSpec {
    /// Window size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
}

impl KindSpec for MaxPool2dSpec {
    const NAMES: &'static [&'static str] = &["max_pool2d"];
    const TORCH: &'static [&'static str] = &["MaxPool2d"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let (kernel, stride) = pool::parse_window(name, arg, at)?;
        Ok(MaxPool2dSpec { kernel, stride })
    }

    fn to_value(&self) -> Value {
        json!({ "max_pool2d": { "kernel": self.kernel, "stride": self.stride } })
    }

    fn label(&self) -> String {
        format!("max_pool2d({}, s{})", self.kernel, self.stride)
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        let (kernel, stride) = pool::torch_window(m, at)?;
        if m.get("dilation").is_some() && super::recorded::square(m, "dilation", at)? != 1 {
            return Err(super::recorded::refuse(at, m, "dilation is not supported"));
        }
        Ok(MaxPool2dSpec { kernel, stride })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let p = pool::resolve(input, self.kernel, self.stride, at, &self.label())?;
        let out = Shape::Map(p.c, p.ho, p.wo);
        Ok((AnyLayer::MaxPool2d(MaxPool { pool: p, relu_after: false }), out))
    }
}
