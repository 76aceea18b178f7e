//! The layer stack's closed forms: two stack shapes whose rows the stack engine integrates over
//! a step exactly between their kinks instead of at nodes, because it was measured faster there.
//!
//! - `[flatten,] dense(h) → relu → dense(K)` ([`dense_relu`]): the EPK's rows and k′ under the
//!   auto rule (log-softmax or identity outputs scaled by α ≠ 0, K ≥ 2), and the path kernel on
//!   identity outputs (a regression, or a classifier's logits).
//! - `conv2d → relu → max_pool2d (window = stride, dividing the conv output) → flatten → dense`
//!   ([`conv_relu_pool`]): the EPK's rows and k′ under the auto rule.
//!
//! Both on plain gradient steps, for the whole Gram (not per layer); the dense form also with
//! `--device cuda`, its rows then integrated and its Gram accumulated on the GPU. What makes them
//! faster than the engine's nodes is not one layer's integral but the ReLU between two linear
//! layers: along a step the first layer's pre-activations are affine in `t`, so each hidden unit
//! (each pool window) switches at its own computed time, and its share of the gradient is
//! integrated over its own active interval in closed form, with two backward passes per point
//! and step (the logits' affine gradient) where the engine evaluates the whole gradient at two
//! nodes per piece between every pair of consecutive kinks. Measured on MNIST
//! (`bench/families.sh`'s networks, EPK `auto:1e-12`, class-diagonal, two cores, alternating):
//! the 784-128-10 MLP, 2 000 × 64 × 200 steps, 15.2 s against the engine's 19.1 s; the CNN,
//! 1 000 × 64 × 20 steps, 3.6 s against 4.6 s (`docs/src/performance.md`). A preset (`mlp`,
//! `cnn`) is computed as its layer stack, so it takes these where its stack does.
//!
//! Which one applies is decided here ([`ClosedForm::of`]) from the shape of the stack's layer
//! list ([`shape`], which the closed forms read theirs from).

pub(crate) mod conv_relu_pool;
pub(crate) mod dense_relu;
pub(crate) mod shape;

pub(crate) use shape::ClosedForm;

use crate::kernel::quadrature::Rule;
use crate::kernel::request::{GramPath, Request};
use crate::kernel::step_model::StepModel;
use crate::kernel::types::KernelKind;
use crate::model::Architecture;
use crate::model::OutputKind;

impl ClosedForm {
    /// The closed form `arch` (a layer stack, with the output map the kernel is on) takes for
    /// `req` on a run whose optimizer is `plain` (GD/SGD), where one applies and is faster.
    pub(crate) fn of(arch: &Architecture, req: &Request, plain: bool) -> Option<Self> {
        let base = plain && req.path == GramPath::Fast && matches!(req.rule, Rule::Auto(_)) && !req.per_layer;
        // On a GPU the dense form runs there (`dense_relu::device`, `kernel::backend::resident`);
        // the convolutional one fills the host's Gram directly, so a GPU takes the engine's nodes.
        let cpu = req.device == crate::kernel::backend::Device::Cpu;
        if !base {
            return None;
        }
        let rows = matches!(req.kind, KernelKind::Epk | KernelKind::Kprime) && req.integrates_rows();
        match Self::shape(arch)? {
            ClosedForm::DenseRelu(s) if s.alpha != 0.0 && s.k >= 2 && (rows || (req.kind == KernelKind::Path && s.output == OutputKind::Identity)) => Some(ClosedForm::DenseRelu(s)),
            ClosedForm::ConvReluPool(s) if rows && cpu => Some(ClosedForm::ConvReluPool(s)),
            _ => None,
        }
    }

    /// Its step model; the dense form's rows integrated on `device` when there is one.
    pub(crate) fn model(&self, device: Option<std::sync::Arc<dyn dense_relu::device::RowsOnDevice>>) -> Box<dyn StepModel + '_> {
        match self {
            ClosedForm::DenseRelu(s) => Box::new(dense_relu::model::DenseReluModel { shape: s, device }),
            ClosedForm::ConvReluPool(s) => Box::new(conv_relu_pool::model::ConvReluPoolModel { shape: s }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shape::{ConvReluPool, DenseRelu};
    use super::*;
    use crate::kernel::backend::Device;
    use crate::kernel::types::{Outputs, Side};
    use crate::model::ModelConfig;

    /// A model from its `[model]` table, on MNIST-shaped inputs with K outputs.
    fn arch(model: &str, k: usize, output: OutputKind) -> Architecture {
        let cfg: ModelConfig = toml::from_str(model).unwrap_or_else(|e| panic!("{model}: {e}"));
        cfg.resolve(784, Some([1, 28, 28]), k, output).unwrap()
    }

    #[test]
    fn shapes_are_read_from_the_layer_list() {
        let ls = OutputKind::LogSoftmax;
        let mlp = arch("kind = \"mlp\"\nhidden = [16]", 10, ls);
        let want = ClosedForm::DenseRelu(DenseRelu { d: 784, h: 16, k: 10, bias: true, alpha: 1.0, output: ls });
        // The preset, its stack, and the same stack written by hand are one shape.
        assert_eq!(ClosedForm::shape(&mlp), Some(want.clone()));
        assert_eq!(ClosedForm::shape(&mlp.as_stack().unwrap()), Some(want.clone()));
        assert_eq!(ClosedForm::shape(&arch("kind = \"layers\"\nlayers = [\"flatten\", { dense = 16 }, \"relu\", { dense = 10 }]", 10, ls)), Some(want));
        let cnn = arch("kind = \"cnn\"\nchannels = 4\nkernel = 5\npool = 2", 10, ls);
        let want = ClosedForm::ConvReluPool(ConvReluPool { image: [1, 28, 28], channels: 4, kernel: 5, stride: 1, padding: 0, pool: 2, ho: 24, wo: 24, k: 10, bias: true, alpha: 1.0, output: ls });
        assert_eq!(ClosedForm::shape(&cnn), Some(want.clone()));
        assert_eq!(ClosedForm::shape(&arch("kind = \"layers\"\nlayers = [{ conv2d = { channels = 4, kernel = 5 } }, \"relu\", { max_pool2d = 2 }, \"flatten\", { dense = 10 }]", 10, ls)), Some(want));
        // Not these shapes: another activation, a second hidden layer, mixed biases, a pool
        // whose stride is not its window or that does not divide the conv output.
        for model in [
            "kind = \"mlp\"\nhidden = [16]\nactivation = \"tanh\"",
            "kind = \"mlp\"\nhidden = [16, 8]",
            "kind = \"layers\"\nlayers = [\"flatten\", { dense = 16 }, { leaky_relu = 0.1 }, { dense = 10 }]",
            "kind = \"layers\"\nlayers = [\"flatten\", { dense = { features = 16, bias = false } }, \"relu\", { dense = 10 }]",
            "kind = \"layers\"\nlayers = [{ conv2d = { channels = 4, kernel = 5 } }, \"relu\", { max_pool2d = { kernel = 2, stride = 1 } }, \"flatten\", { dense = 10 }]",
            "kind = \"layers\"\nlayers = [{ conv2d = { channels = 4, kernel = 4 } }, \"relu\", { max_pool2d = 2 }, \"flatten\", { dense = 10 }]",
            "kind = \"layers\"\nlayers = [{ conv2d = { channels = 4, kernel = 5 } }, \"relu\", { avg_pool2d = 2 }, \"flatten\", { dense = 10 }]",
        ] {
            assert_eq!(ClosedForm::shape(&arch(model, 10, ls)), None, "{model}");
        }
    }

    #[test]
    fn requests_take_a_closed_form_only_where_it_applies() {
        let ls = OutputKind::LogSoftmax;
        let mlp = arch("kind = \"mlp\"\nhidden = [16]", 10, ls).as_stack().unwrap();
        let cnn = arch("kind = \"cnn\"", 10, ls).as_stack().unwrap();
        let auto = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
        let is = |a: &Architecture, r: &Request, plain: bool| ClosedForm::of(a, r, plain).is_some();
        for a in [&mlp, &cnn] {
            assert!(is(a, &auto, true));
            assert!(is(a, &Request::new(KernelKind::Kprime).rule(Rule::Auto(1e-12)), true));
            // Not: another optimizer, a fixed rule, the training side, another kernel, the
            // per-layer split, the generic path; on a device, the dense form only.
            assert_eq!(is(a, &auto.clone().device(Device::Cuda), true), std::ptr::eq(a, &mlp));
            assert!(!is(a, &auto, false));
            assert!(!is(a, &auto.clone().rule(Rule::Gauss(4)), true));
            assert!(!is(a, &auto.clone().side(Side::Train), true));
            assert!(!is(a, &Request::new(KernelKind::Dpk).rule(Rule::Auto(1e-12)), true));
            assert!(!is(a, &auto.clone().per_layer(true), true));
            assert!(!is(a, &auto.clone().path(GramPath::Generic), true));
            assert!(!is(a, &auto.clone().path(GramPath::Nodes), true));
        }
        // The path kernel: the dense shape on identity outputs (the `Prepared` view of the
        // logits) only.
        let path = Request::new(KernelKind::Path).rule(Rule::Auto(1e-12)).outputs(Outputs::Logits);
        let mut logits = mlp.clone();
        logits.output = OutputKind::Identity;
        assert!(is(&logits, &path, true));
        assert!(!is(&mlp, &path, true));
        let mut cnn_logits = cnn.clone();
        cnn_logits.output = OutputKind::Identity;
        assert!(!is(&cnn_logits, &path, true));
        // One output, or α = 0 (refused at the config; the shape holds it anyway): the dense
        // closed form's output layer needs K ≥ 2 and α ≠ 0.
        let one = arch("kind = \"mlp\"\nhidden = [16]", 1, OutputKind::Identity).as_stack().unwrap();
        assert!(!is(&one, &auto, true));
        let mut zero = mlp.clone();
        zero.alpha = 0.0;
        assert!(!is(&zero, &auto, true));
    }
}
