//! What a kernel computation is asked for: one [`Request`], built by `Request::new(kind)` and
//! chainable setters, taken by the one entry [`super::compute`].

use super::backend::Device;
use super::layout::Layout;
use super::quadrature::Rule;
use super::types::{KernelKind, Outputs, Side};

/// Which Gram path a network takes (`pathkernel kernel --path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GramPath {
    /// The structured path: the network's layer stack (`kernel::stack`; an MLP or CNN preset as
    /// its stack), with the stack's closed form where one applies and is measured faster
    /// (`kernel::stack::closed`); any quadrature rule.
    Fast,
    /// The stack engine at quadrature nodes, never a closed form: the closed forms' cross-check
    /// and their benchmark's peer; any quadrature rule.
    Nodes,
    /// The generic autodiff path ([`super::generic`], the reference, on the network as
    /// written); fixed rules only.
    Generic,
}

impl std::str::FromStr for GramPath {
    type Err = crate::error::Error;

    /// `fast`, `nodes` or `generic`.
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "fast" => Ok(GramPath::Fast),
            "nodes" => Ok(GramPath::Nodes),
            "generic" => Ok(GramPath::Generic),
            other => Err(crate::error::Error::Config(format!("--path {other}: expected fast, nodes or generic"))),
        }
    }
}

/// What to compute and how: the kernel (kind, quadrature, side, steps) and how the computation
/// runs (layout, CNN path, memory budget, columns, outputs, row blocks).
///
/// ```
/// use pathkernel::kernel::{KernelKind, Layout, Request, Rule, Side};
/// let req = Request::new(KernelKind::Epk).rule(Rule::Gauss(4)).side(Side::Train).layout(Layout::Diag);
/// assert_eq!((req.kind, req.rule, req.side, req.layout), (KernelKind::Epk, Rule::Gauss(4), Side::Train, Layout::Diag));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Kernel kind.
    pub kind: KernelKind,
    /// Quadrature for integrated rows (default `auto:1e-12`).
    pub rule: Rule,
    /// Side of the row points (default: test).
    pub side: Side,
    /// For the NTK: the step S (default: the last state N).
    pub ntk_step: Option<usize>,
    /// Keep every per-step Gram `K_s`.
    pub per_step: bool,
    /// Sum only the steps `[A, B)` (default: all); the machine then predicts `f_{w_B}` from
    /// the bias `f_{w_A}`.
    pub steps: Option<(usize, usize)>,
    /// Which blocks of the Gram are computed and held (`full`, `diag`, `trace`).
    pub layout: Layout,
    /// The Gram path (default: [`GramPath::Fast`]).
    pub path: GramPath,
    /// Bytes the outputs of one computation (one row block) may take; refused with an estimate
    /// above it (default: no limit).
    pub memory_budget: u64,
    /// The training points `[lo, hi)` the Gram's columns are (`None`: all M). Only those
    /// columns are computed: every path forms the training-side factors of those points alone,
    /// so work and memory scale with `hi − lo` (the loss gradients `∂L/∂f` of a step, `[M, K]`,
    /// and for momentum/Adam the optimizer replay, which needs the full data gradient, still see
    /// all M). A proper range gives one column block's share ([`super::ColumnShare`]), assembled
    /// with the others by [`super::engine::columns::assemble`]; `(0, M)` is the same as `None`.
    pub columns: Option<(usize, usize)>,
    /// Which outputs the kernel is on: the network's own (log-softmax for a classifier) or its
    /// logits ([`Outputs`]).
    pub outputs: Outputs,
    /// Row points per block (`None`: all rows at once). Rows are independent, so the blocks'
    /// outputs are concatenated (`super::engine::blocked::in_blocks`); [`super::engine::blocked::plan`] picks a
    /// size that fits a memory budget.
    pub block_rows: Option<usize>,
    /// Also return each parameter layer's share of the Gram and of the machine's change per
    /// step ([`super::LayerShares`]); any optimizer, all columns.
    pub per_layer: bool,
    /// Where the work runs (default: the CPU). [`Device::Cuda`]: where a `dense, relu, dense` stack
    /// takes its closed form (the EPK and k′ under the auto rule) its whole step runs on the GPU
    /// with the Gram resident there, elsewhere layer stacks and the CNN evaluate their node
    /// gradients there; the generic path and the
    /// optimizer replay refuse it.
    pub device: Device,
    /// With momentum or Adam and `steps = [A, B)`, `A > 0`: the gradients of the steps before A
    /// that still move the weights inside the window enter the machine as one carried-in term
    /// ([`super::KernelOutput::carried`]) instead of with their own kernels in the Gram and in
    /// `a`, so the Gram, `a` and the per-step Grams are the window's own and its cost no longer
    /// grows with A beyond one data gradient per earlier step (default: off).
    pub carry_in: bool,
}

impl Request {
    /// A request for `kind` with the defaults: `auto:1e-12` quadrature, test-side rows, all
    /// steps (the NTK at the last state), no per-step Grams, the full layout, the fast path, no
    /// memory limit, all columns, the network's outputs, one block, no per-layer shares.
    pub fn new(kind: KernelKind) -> Self {
        Request {
            kind,
            rule: Rule::Auto(1e-12),
            side: Side::Test,
            ntk_step: None,
            per_step: false,
            steps: None,
            layout: Layout::Full,
            path: GramPath::Fast,
            memory_budget: u64::MAX,
            columns: None,
            outputs: Outputs::Network,
            block_rows: None,
            per_layer: false,
            device: Device::Cpu,
            carry_in: false,
        }
    }
    /// Whether the steps before a window's first step are one carried-in term
    /// ([`Request::carry_in`]).
    pub fn carry_in(mut self, carry_in: bool) -> Self {
        self.carry_in = carry_in;
        self
    }
    /// The quadrature rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rule = rule;
        self
    }
    /// The side of the row points.
    pub fn side(mut self, side: Side) -> Self {
        self.side = side;
        self
    }
    /// The NTK's step S (`None`: the last state).
    pub fn ntk_step(mut self, step: Option<usize>) -> Self {
        self.ntk_step = step;
        self
    }
    /// Whether every per-step Gram is kept.
    pub fn per_step(mut self, per_step: bool) -> Self {
        self.per_step = per_step;
        self
    }
    /// The steps `[A, B)` summed (`None`: all).
    pub fn steps(mut self, steps: Option<(usize, usize)>) -> Self {
        self.steps = steps;
        self
    }
    /// The Gram's layout.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// The CNN's Gram path.
    pub fn path(mut self, path: GramPath) -> Self {
        self.path = path;
        self
    }
    /// Bytes one computation's outputs may take.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }
    /// The training points `[lo, hi)` of the Gram's columns (`None`: all).
    pub fn columns(mut self, columns: Option<(usize, usize)>) -> Self {
        self.columns = columns;
        self
    }
    /// The outputs the kernel is on.
    pub fn outputs(mut self, outputs: Outputs) -> Self {
        self.outputs = outputs;
        self
    }
    /// Whether each parameter layer's share is returned as well.
    pub fn per_layer(mut self, per_layer: bool) -> Self {
        self.per_layer = per_layer;
        self
    }
    /// Where the work runs: the dense closed form's whole step, or a layer stack's node gradients.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }
    /// Row points per block (`None`: one block).
    ///
    /// # Panics
    /// At [`super::compute`] if `Some(0)`.
    pub fn block_rows(mut self, rows: Option<usize>) -> Self {
        self.block_rows = rows;
        self
    }

    /// Whether the rows are integrated over each step's `t ∈ [0, 1]` (the EPK's test side, k′,
    /// the path kernel); the other kernels take the rows' gradients at `t = 0`.
    pub(crate) fn integrates_rows(&self) -> bool {
        match self.kind {
            KernelKind::Epk => self.side == Side::Test,
            KernelKind::Kprime | KernelKind::Path => true,
            _ => false,
        }
    }
}
