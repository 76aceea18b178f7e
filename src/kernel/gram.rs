//! Gram assembly from structured per-layer factors, without Jacobians.
//!
//! For a dense layer `∇_W f^k(x) = δ[k] aᵀ` and `∇_b f^k(x) = δ[k]`. With row points p whose
//! test-side gradient is a weighted sum over quadrature nodes r (weights `w_r`) and training
//! points i (gradients at `w_s`), one step's Gram is
//! `K_s[p, i, k, k'] = Σ_l Σ_{r∈p} w_r (δ_{r,l}[k]·δ_{i,l}[k']) (a_{r,l}·a_{i,l} + [bias])`.
//!
//! - **Layer 0** sees the point itself (`a_{r,0} = x_p` for every node), so its term is
//!   `(x_p·x_i + 1)(δ̄_p[k]·δ_i[k'])` with `δ̄_p = Σ_r w_r δ_{r,0}`: one GEMM per step and block
//!   of row points, scaled by `x_p·x_i + 1` (formed once) and folded into the Gram at once.
//! - **Deeper layers** first form the t-averaged layer gradient
//!   `J̄[p, k, o, :] = Σ_{r∈p} w_r δ_r[k, o] [a_r, 1]` (only `P·K·out·(in+1)` numbers), then
//!   `T = J̄ · A_trainᵀ` (one GEMM) and `K[p, i, k, k'] += Σ_o T[(p,k,o), i] δ_i[k', o]`.
//!
//! Nothing of size `M·K·W` is ever formed. The Gram is accumulated in a `GramSink` of the
//! requested [`Layout`] (`full`, `diag` or `trace`), only the entries of that layout being
//! computed, block by block of row points, and permuted once at the end, so the accumulator holds
//! one Gram-sized array.

use rayon::prelude::*;

use crate::kernel::backend::resident::{Layer0View, Resident};
use crate::kernel::backend::{Backend, Factor, Site, Stamp};
use crate::kernel::layout::{fold_formed, fold_output_layer, zeroed, GramSink, Layout, TrainDeltas};
use crate::error::{Error, Result};
use crate::linalg::{gemm_ab, gemm_abt};

/// One layer's factors for a set of rows.
pub(crate) struct LayerFactors<'a> {
    /// Input activations `[R, n_in]`.
    pub acts: &'a [f64],
    /// Sensitivities `[R, K, n_out]`.
    pub deltas: &'a [f64],
    /// Input width.
    pub n_in: usize,
    /// Output width.
    pub n_out: usize,
}

/// Scratch bytes aimed at for one block of row points (the block's Gram rows in
/// `[(p, k), (i, k')]` layout plus the deeper layers' `J̄` and `T`).
pub(crate) const BLOCK_BYTES: usize = 16 << 20;

/// Fewest row points per block: every block re-reads the training factors (`M·K·out`
/// numbers per layer), so thin blocks turn the GEMMs memory-bound (at M = 10 000, blocks of 2
/// points made a step 1.7× slower per Gram entry than at M = 3000).
const MIN_BLOCK_POINTS: usize = 16;

/// Scratch bytes per row point of a block: its Gram rows and the deepest layer's `J̄` and `T`.
///
/// # Shapes
/// `widths` are the layer widths `[d, h_1, …, K]`.
pub fn scratch_bytes_per_point(widths: &[usize], m: usize, k: usize) -> usize {
    8 * k * (m * k + widths.windows(2).skip(1).map(|w| w[1] * (m + w[0] + 1)).max().unwrap_or(0))
}

/// Accumulates `Σ_s K_s` over steps in one [`Layout`].
///
/// Memory: the Gram itself, the layer-0 scale `x_p·x_i + 1` (`[P, M]`) and a scratch block of
/// at most `BLOCK_BYTES` (16 MiB), plus the training factors of the current step.
pub(crate) struct GramAccumulator {
    p: usize,
    m: usize,
    k: usize,
    bias: bool,
    /// `Σ_s K_s` in accumulation rows.
    sink: GramSink,
    /// `x_p·x_i + [bias]` `[P, M]`, formed from the first step's layer-0 factors.
    s0: Option<Vec<f64>>,
    /// Layer 0's unscaled products, buffered over steps (applied with `s0` in `finish_layers`).
    l0: Option<Layer0Sum>,
    /// `Some(α)` when the last layer's sensitivities are `α(δ_ko − q_o)` (log-softmax or
    /// identity output): it is then contracted in its structured form ([`add_output_layer`]).
    output_alpha: Option<f64>,
    /// Time and GEMM flops of the contraction so far ([`GramAccumulator::contraction`]).
    stats: Contraction,
    /// The current step's training side of the deeper layers, built at its first chunk.
    step_train: Option<Vec<DeepTrain>>,
    /// Row points whose deeper layers' J̄ is formed but not yet contracted.
    pending: Pending,
    /// Scratch of the deeper layers' products T within a step.
    scratch_t: Vec<f64>,
    /// With the per-layer decomposition: one sink per parameter layer, filled instead of
    /// `sink` (which receives their sum in [`GramAccumulator::finish_layers`]).
    layers: Option<Vec<GramSink>>,
    /// Where the products `A·Bᵀ` run ([`crate::kernel::backend`]; the CPU unless set).
    backend: Backend,
    /// The first failure of the backend; later contractions are skipped and
    /// [`GramAccumulator::check`] returns it.
    error: Option<Error>,
    /// On a device: [`GramAccumulator::add_integrated`]'s whole contraction there, the Gram
    /// brought into `sink` at [`GramAccumulator::flush`] ([`crate::kernel::backend::resident`]).
    resident: Option<Box<dyn Resident>>,
}

/// One deeper layer's training side for a step.
struct DeepTrain {
    /// Training activations with the bias column `[M, ne]`.
    acts: Vec<f64>,
    /// Sensitivities arranged for the layout.
    deltas: TrainDeltas,
    n_in: usize,
    n_out: usize,
    /// The output layer in its structured form ([`crate::kernel::layout::add_output_layer`]).
    structured: bool,
    /// Names `acts` for the backend (resident on a device for the whole step).
    stamp: Stamp,
}

impl DeepTrain {
    /// Rows of J̄ per point: K + 1 (structured output layer) or K·out.
    fn rows_per_point(&self, k: usize) -> usize {
        if self.structured {
            k + 1
        } else {
            k * self.n_out
        }
    }
}

/// Row points `first..last` of the current step whose deeper layers' J̄ (`[(p, row), ne]`, one
/// array per deeper layer) wait to be contracted, so that chunks of a few points share one GEMM.
#[derive(Default)]
struct Pending {
    first: usize,
    last: usize,
    jbar: Vec<Vec<f64>>,
}

impl GramAccumulator {
    /// A zero accumulator in `layout`.
    pub(crate) fn with_layout(layout: Layout, p: usize, m: usize, k: usize, bias: bool) -> Self {
        GramAccumulator { p, m, k, bias, sink: GramSink::new(layout, p, m, k), s0: None, l0: None, output_alpha: None, stats: Contraction::default(), step_train: None, pending: Pending::default(), scratch_t: Vec::new(), layers: None, backend: Backend::Cpu, error: None, resident: None }
    }

    /// Runs the contraction's products on `backend` (the training side resident there for a
    /// step's deeper layers and for each of layer 0's step buffers).
    pub(crate) fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Contracts [`GramAccumulator::add_integrated`]'s factors on a device, the Gram resident
    /// there until [`GramAccumulator::flush`].
    pub(crate) fn with_resident(mut self, resident: Box<dyn Resident>) -> Self {
        self.resident = Some(resident);
        self
    }

    /// The device accumulation, for a step model that runs its whole step there
    /// (`kernel::stack::closed::dense_relu::device`); `None` on the host.
    pub(crate) fn resident_mut(&mut self) -> Option<&mut (dyn Resident + 'static)> {
        self.resident.as_deref_mut()
    }

    /// The backend's first failure, if any (a device error: out of memory, a cuBLAS status);
    /// after one the accumulator skips every later contraction, so its Gram is incomplete.
    pub(crate) fn check(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }

    /// The accumulation rows, for step models that contract their own features into them
    /// ([`crate::kernel::layout::add_dense`], [`crate::kernel::layout::add_formed`]).
    pub(crate) fn sink_mut(&mut self) -> &mut GramSink {
        &mut self.sink
    }

    /// Keeps one Gram per parameter layer (`n` of them): step models that support the
    /// per-layer decomposition contract each layer into [`GramAccumulator::target`].
    pub(crate) fn with_layers(mut self, n: Option<usize>) -> Self {
        let (layout, p, m, k) = (self.sink.layout(), self.p, self.m, self.k);
        self.layers = n.map(|n| (0..n).map(|_| GramSink::new(layout, p, m, k)).collect());
        self
    }

    /// Where parameter layer `l`'s contraction goes: its own sink with the per-layer
    /// decomposition, else the whole Gram's.
    pub(crate) fn target(&mut self, l: usize) -> &mut GramSink {
        match self.layers.as_mut() {
            Some(ls) => &mut ls[l],
            None => &mut self.sink,
        }
    }

    /// The per-layer sinks (`None` without the decomposition).
    pub(crate) fn layer_sinks(&mut self) -> Option<&mut [GramSink]> {
        self.layers.as_deref_mut()
    }

    /// Declares the last layer's sensitivities to be `α(δ_ko − q_o)` (every MLP of
    /// [`crate::kernel::stack::closed::dense_relu::step::MlpStep`]: log-softmax or identity output scaled by α), so that it is
    /// contracted with K + 1 instead of K² rows per point.
    pub(crate) fn with_output_alpha(mut self, alpha: f64) -> Self {
        self.output_alpha = (alpha != 0.0 && self.k >= 2).then_some(alpha);
        self
    }

    /// Adds one step for the row points `points` (a range of `0..P`; call once per chunk of
    /// points) of a one-hidden-layer network whose rows' side is integrated over the step
    /// (`kernel::stack::closed::dense_relu::pieces`): layer 0's `δ̄` (`dbar` `[n, K, h]`) and the output layer's
    /// `[Ā; B̄]` (`ab` `[n, K+1, h(+1)]`); `train` are the training points' factors of both
    /// layers, `colw` (`[M, K]`) optionally scales every training gradient `∇f^{k'}(x_i)`
    /// (Chen's kernel). Layer 0's row activations are the points themselves (`x_rows` `[P, d]`),
    /// so `x_p·x_i + 1` is formed once, at the first call.
    ///
    /// # Panics
    /// If the network does not have exactly two layers, the output layer is not structured
    /// ([`GramAccumulator::with_output_alpha`]), or the shapes disagree.
    pub(crate) fn add_integrated(&mut self, dbar: &[f64], ab: &[f64], train: &[LayerFactors<'_>], x_rows: &[f64], colw: Option<&[f64]>, points: std::ops::Range<usize>) {
        assert!(train.len() == 2 && self.output_alpha.is_some(), "integrated rows need a one-hidden-layer network with a structured output layer");
        let (p, m, k, bias) = (self.p, self.m, self.k, self.bias);
        let (first, last) = (points.start, points.end.min(p));
        if first >= last {
            return;
        }
        let h = train[0].n_out;
        assert_eq!(dbar.len(), (last - first) * k * h, "δ̄ has the wrong size");
        assert_eq!(ab.len(), (last - first) * (k + 1) * (h + usize::from(bias)), "[Ā; B̄] has the wrong size");
        self.ensure_s0(x_rows, &train[0]);
        let layout = self.sink.layout();
        self.l0.get_or_insert_with(|| Layer0Sum::new(layout, p, m, k, h)).put_rows(first, dbar);
        self.ensure_step_train(&[&train[1]], colw);
        self.push_pending(first, last, &[ab.to_vec()]);
    }

    /// Forms `x_p·x_i + [bias]` (`[P, M]`) at the first call (on the device when resident).
    fn ensure_s0(&mut self, x_rows: &[f64], train0: &LayerFactors<'_>) {
        if let Some(r) = self.resident.as_mut() {
            if !r.has_scale() && self.error.is_none() {
                if let Err(e) = r.scale(&x_rows[..self.p * train0.n_in], train0.acts, train0.n_in, if self.bias { 1.0 } else { 0.0 }) {
                    self.error = Some(e);
                }
            }
            return;
        }
        if self.s0.is_none() {
            let (p, m) = (self.p, self.m);
            let mut s0 = vec![0.0; p * m];
            gemm_abt(&mut s0, x_rows, train0.acts, p, m, train0.n_in, 1.0, false);
            let b = if self.bias { 1.0 } else { 0.0 };
            s0.iter_mut().for_each(|v| *v += b);
            self.s0 = Some(s0);
        }
    }

    /// Builds the step's training side of the deeper layers at its first chunk: activations
    /// with the bias column `[M, ne]` and sensitivities arranged for the layout (the output
    /// layer in its structured form when declared).
    fn ensure_step_train(&mut self, train: &[&LayerFactors<'_>], colw: Option<&[f64]>) {
        if self.step_train.is_some() {
            return;
        }
        let (m, k, bias, layout) = (self.m, self.k, self.bias, self.sink.layout());
        let n_deep = train.len();
        let built: Vec<DeepTrain> = train
            .iter()
            .enumerate()
            .map(|(li, t)| {
                let structured = self.output_alpha.is_some() && li + 1 == n_deep;
                let deltas = match self.output_alpha {
                    Some(alpha) if structured => TrainDeltas::output(layout, t.deltas, m, k, colw, alpha),
                    _ => TrainDeltas::new(layout, t.deltas, m, k, t.n_out, colw),
                };
                DeepTrain { acts: train_acts_ext(t, bias), deltas, n_in: t.n_in, n_out: t.n_out, structured, stamp: Stamp::fresh(Site::Deep(li)) }
            })
            .collect();
        self.pending.jbar.resize_with(built.len(), Vec::new);
        self.step_train = Some(built);
    }

    /// Appends the J̄ rows of the points `first..last` (one array per deeper layer) to the
    /// pending block, contracting it first when it does not continue there and afterwards when
    /// it is large enough.
    fn push_pending(&mut self, first: usize, last: usize, chunk: &[Vec<f64>]) {
        if self.pending.first != self.pending.last && self.pending.last != first {
            self.contract_pending();
        }
        if self.pending.first == self.pending.last {
            (self.pending.first, self.pending.last) = (first, first);
            self.pending.jbar.iter_mut().for_each(Vec::clear);
        }
        for (jbar, c) in self.pending.jbar.iter_mut().zip(chunk) {
            jbar.extend_from_slice(c);
        }
        self.pending.last = last;
        if self.pending.last - self.pending.first >= self.pending_cap() {
            self.contract_pending();
        }
    }

    /// Most row points contracted at once: the block's J̄ and T within [`BLOCK_BYTES`] (at least
    /// [`MIN_BLOCK_POINTS`]).
    fn pending_cap(&self) -> usize {
        let per_point = self.step_train.as_ref().map_or(0, |train| train.iter().map(|dt| 8 * dt.rows_per_point(self.k) * (self.m + dt.n_in + 1)).max().unwrap_or(0));
        (self.backend.block_bytes(BLOCK_BYTES) / per_point.max(1)).max(MIN_BLOCK_POINTS)
    }

    /// Contracts the pending row points' deeper layers into the Gram, in blocks of at most
    /// [`GramAccumulator::pending_cap`] points.
    fn contract_pending(&mut self) {
        let (first, last) = (self.pending.first, self.pending.last);
        if first == last {
            return;
        }
        let started = std::time::Instant::now();
        let (m, k, bias) = (self.m, self.k, self.bias);
        let cap = self.pending_cap();
        let train = self.step_train.as_ref().expect("pending rows have their step's training side");
        let mut t = std::mem::take(&mut self.scratch_t);
        'blocks: for p0 in (first..last).step_by(cap) {
            let nb = cap.min(last - p0);
            let out = self.sink.rows_mut(p0..p0 + nb);
            for (dt, jbar) in train.iter().zip(&self.pending.jbar) {
                if self.error.is_some() {
                    break 'blocks;
                }
                let ne = dt.n_in + usize::from(bias);
                let rpp = dt.rows_per_point(k);
                let j = &jbar[(p0 - first) * rpp * ne..(p0 - first + nb) * rpp * ne];
                if let Some(r) = self.resident.as_mut() {
                    let alpha = self.output_alpha.filter(|_| dt.structured).expect("a resident contraction has only the structured output layer");
                    if let Err(e) = r.output(p0, nb, j, &dt.acts, ne, &dt.deltas, alpha, dt.stamp.version) {
                        self.error = Some(e);
                        break 'blocks;
                    }
                    self.stats.flops += 2.0 * (nb * rpp) as f64 * m as f64 * ne as f64;
                    continue;
                }
                // T = J̄·Aᵀ [(p, row), i] on the backend, then the element-wise fold.
                t.resize(nb * rpp * m, 0.0);
                let tb = &mut t[..nb * rpp * m];
                let acts = Factor { data: &dt.acts, n: m, ld: ne, stamp: dt.stamp };
                if let Err(e) = self.backend.abt(tb, j, ne, &acts, nb * rpp, ne, 1.0, false) {
                    self.error = Some(e);
                    break 'blocks;
                }
                match self.output_alpha {
                    Some(alpha) if dt.structured => fold_output_layer(out, tb, &dt.deltas, nb, alpha),
                    _ => fold_formed(out, tb, &dt.deltas, nb),
                }
                self.stats.flops += 2.0 * (nb * rpp) as f64 * m as f64 * ne as f64;
            }
        }
        self.scratch_t = t;
        self.pending.first = last;
        self.pending.jbar.iter_mut().for_each(Vec::clear);
        self.stats.seconds += started.elapsed().as_secs_f64();
    }

    /// Ends a step whose row points were all added: hands layer 0's training factors to the
    /// step buffer (`train0.deltas` `[M, K, out_0]`, weighted by `colw` `[M, K]` as in
    /// [`GramAccumulator::add_integrated`]).
    pub(crate) fn end_step(&mut self, train0: &LayerFactors<'_>, colw: Option<&[f64]>) {
        self.contract_pending();
        self.step_train = None;
        // T is not kept across steps: layer 0's fold below needs a block of the same size, and
        // holding both would add a block to the peak.
        self.scratch_t = Vec::new();
        let full = self.l0.as_mut().is_some_and(|l0| l0.put_train(train0.deltas, colw));
        if full {
            self.contract_layer0();
        }
    }

    /// Contracts layer 0's buffered steps into the Gram (on the device when resident) and
    /// empties the buffer; after a failure only empties it (the Gram is not returned).
    fn contract_layer0(&mut self) {
        let Some(l0) = self.l0.as_mut() else { return };
        if l0.filled == 0 {
            return;
        }
        if self.error.is_some() {
            l0.filled = 0;
            return;
        }
        let started = std::time::Instant::now();
        let done = match (self.resident.as_mut(), self.s0.as_deref()) {
            (Some(r), _) => r.layer0(&l0.view()),
            (None, Some(s0)) => l0.contract(&mut self.sink, s0, &self.backend),
            (None, None) => unreachable!("layer 0's scale is formed with its first rows"),
        };
        l0.filled = 0;
        match done {
            Ok(flops) => self.stats.flops += flops,
            Err(e) => self.error = Some(e),
        }
        self.stats.seconds += started.elapsed().as_secs_f64();
    }

    /// Adds a step model's own contraction time and flops (models that fill the sink directly).
    pub(crate) fn add_contraction(&mut self, seconds: f64, flops: f64) {
        self.stats.seconds += seconds;
        self.stats.flops += flops;
    }

    /// Adds a step's node work: thread-seconds of gradient evaluations and of the node search.
    pub(crate) fn add_node_work(&mut self, gradient_seconds: f64, node_search_seconds: f64) {
        self.stats.gradient_seconds += gradient_seconds;
        self.stats.node_search_seconds += node_search_seconds;
    }

    /// Wall time and GEMM flops of the contraction so far (not the node evaluations): the
    /// flops are counted from the shapes of the products, `2·m·n·k` each — per step and row
    /// point, `2·M·K·out_0` for layer 0 (`diag`; `full` K times more), `2·M·(K + 1)·(h + 1)`
    /// for the structured output layer and `2·M·K·out·(in + 1)` for other hidden layers.
    pub(crate) fn contraction(&self) -> Contraction {
        self.stats
    }

    /// The Gram `Σ_s K_s` in its output layout (`full`: `[P, M, K, K]`) and, with the
    /// per-layer decomposition, each layer's (the Gram is their sum).
    pub(crate) fn finish_layers(mut self) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
        self.flush();
        match self.layers.take() {
            Some(ls) => {
                ls.iter().for_each(|l| self.sink.add(l));
                (
                    self.sink.finish(),
                    Some(ls.into_iter().map(GramSink::finish).collect()),
                )
            }
            None => (self.sink.finish(), None),
        }
    }

    /// Contracts layer 0's buffered steps now (the Gram is complete only after this or
    /// [`GramAccumulator::finish_layers`]).
    pub(crate) fn flush(&mut self) {
        self.contract_pending();
        self.contract_layer0();
        if let (Some(r), None) = (self.resident.as_mut(), self.error.as_ref()) {
            let started = std::time::Instant::now();
            match r.add_into(&mut self.sink) {
                Ok(flops) => self.stats.flops += flops,
                Err(e) => self.error = Some(e),
            }
            self.stats.seconds += started.elapsed().as_secs_f64();
        }
    }
}

/// Wall time and GEMM flops of a Gram contraction, and (layer stacks) the thread-seconds of the
/// node work around it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Contraction {
    /// Seconds spent contracting (node evaluations excluded), as a share of the wall: where
    /// the point chunks of a layer stack contract side by side (one thread each), their
    /// thread-seconds divided by the threads that ran them.
    pub seconds: f64,
    /// Flops of the products, counted from their shapes.
    pub flops: f64,
    /// Layer stacks: seconds in the gradient evaluations — the training points' (wall) plus the
    /// nodes' summed over the point chunks that run side by side (so up to the cores' count
    /// times the wall); device calls and their transfers included with `--device cuda`. The
    /// `dense → relu → dense` closed form: the wall seconds integrating its rows (the layer-0
    /// GEMM at the points and the pieces; on a device with their transfers).
    pub gradient_seconds: f64,
    /// Layer stacks: seconds choosing the nodes (the kink sweep and the forward-mode acceptance
    /// tests), summed over the point chunks as `gradient_seconds`.
    pub node_search_seconds: f64,
}

impl Contraction {
    /// Adds another part's seconds, flops and node work.
    pub(crate) fn add(&mut self, o: &Contraction) {
        self.seconds += o.seconds;
        self.flops += o.flops;
        self.gradient_seconds += o.gradient_seconds;
        self.node_search_seconds += o.node_search_seconds;
    }

    /// GFLOP/s (0 when nothing was timed).
    pub(crate) fn gflops(&self) -> f64 {
        if self.seconds > 0.0 {
            self.flops / self.seconds * 1e-9
        } else {
            0.0
        }
    }
}

/// Bytes aimed at for layer 0's step buffers (rows and training points together): a quarter of
/// the Gram, or three steps where they fit in half of it ([`crate::kernel::engine::blocked`] counts one more
/// Gram row per row point for them). More
/// steps per buffer make the inner dimension of its GEMMs longer and the fold into the Gram
/// (a pass over the Gram) rarer: on MNIST 2 000 × 2 000 `diag`, 1 slot (inner dimension 128)
/// ran layer 0 at 46 GFLOP/s.
const LAYER0_BUFFER_BYTES: usize = 512 << 20;

/// Layer 0's term `(x_p·x_i + 1) Σ_s ⟨δ̄_s[p, k], δ_s[i, k']⟩`. The scale does not depend on the
/// step, so the factors of several steps are buffered side by side and contracted by one GEMM
/// whose inner dimension is `steps·out_0`, block by block of row points, each block's product
/// scaled and folded into the Gram at once. Only the layout's entries are formed (`diag`: one
/// GEMM per class, `trace`: one with the classes in the inner dimension too).
///
/// Buffers (`slot` = step in the buffer, `o` < out_0): `full` rows `[(p, k), slot, o]`, training
/// `[(i, k'), slot, o]`; `diag` `[c, p, slot, o]`, `[c, i, slot, o]`; `trace` `[p, slot, k, o]`,
/// `[i, slot, k, o]`.
struct Layer0Sum {
    layout: Layout,
    p: usize,
    m: usize,
    k: usize,
    h: usize,
    slots: usize,
    filled: usize,
    rows: Vec<f64>,
    train: Vec<f64>,
}

impl Layer0Sum {
    fn new(layout: Layout, p: usize, m: usize, k: usize, h: usize) -> Self {
        let slots = layer0_slots(layout, p, m, k, h);
        Layer0Sum { layout, p, m, k, h, slots, filled: 0, rows: zeroed(p * k * slots * h), train: zeroed(m * k * slots * h) }
    }

    /// Index of `(point, class, slot, o)` in a buffer of `n` points.
    fn at(&self, n: usize, pt: usize, c: usize, slot: usize, o: usize) -> usize {
        let (k, h, sl) = (self.k, self.h, self.slots);
        match self.layout {
            Layout::Full => ((pt * k + c) * sl + slot) * h + o,
            Layout::Diag => ((c * n + pt) * sl + slot) * h + o,
            Layout::Trace => ((pt * sl + slot) * k + c) * h + o,
        }
    }

    /// Writes the current step's `δ̄` of the points `first..` (`[(p, k), o]`).
    fn put_rows(&mut self, first: usize, dbar: &[f64]) {
        let (k, h, p, slot) = (self.k, self.h, self.p, self.filled);
        for (row, src) in dbar.chunks_exact(h).enumerate() {
            let base = self.at(p, first + row / k, row % k, slot, 0);
            self.rows[base..base + h].copy_from_slice(src);
        }
    }

    /// Writes the current step's training `δ` (`[(i, k'), o]`, weighted by `colw`) and advances;
    /// returns whether the buffer is full (to be contracted).
    fn put_train(&mut self, dtrain: &[f64], colw: Option<&[f64]>) -> bool {
        let (k, h, m, slot) = (self.k, self.h, self.m, self.filled);
        for (row, src) in dtrain.chunks_exact(h).enumerate() {
            let base = self.at(m, row / k, row % k, slot, 0);
            let c = colw.map_or(1.0, |cw| cw[row]);
            self.train[base..base + h].iter_mut().zip(src).for_each(|(d, v)| *d = c * v);
        }
        self.filled += 1;
        self.filled == self.slots
    }

    /// The buffers as a device contracts them.
    fn view(&self) -> Layer0View<'_> {
        Layer0View { p: self.p, m: self.m, k: self.k, h: self.h, slots: self.slots, filled: self.filled, rows: &self.rows, train: &self.train }
    }

    /// Adds `s0 ∘ Σ_slots (rows·trainᵀ)` to `sink` (the filled slots only), the products on
    /// `backend` with the training buffer resident there for every block of row points;
    /// returns the GEMM flops (the caller empties the buffer).
    fn contract(&self, sink: &mut GramSink, s0: &[f64], backend: &Backend) -> Result<f64> {
        if self.filled == 0 {
            return Ok(0.0);
        }
        let (p, m, k, h, sl, layout) = (self.p, self.m, self.k, self.h, self.slots, self.layout);
        // Only the filled slots: the first `filled` of each row's slots (trace: of its
        // `slots·K` classes-by-slot groups).
        let f = self.filled;
        let cols = layout.cols_per_train(k);
        let per_point = 8 * m * layout.per_pair(k);
        let pb = (backend.block_bytes(BLOCK_BYTES) / per_point.max(1)).max(MIN_BLOCK_POINTS).min(p).max(1);
        let mut prod = vec![0.0; pb * m * layout.per_pair(k)];
        // The training buffer: one factor (full, trace) or one per class (diag), each uploaded
        // once for all blocks of row points.
        let stamps: Vec<Stamp> = (0..if layout == Layout::Diag { k } else { 1 }).map(|c| Stamp::fresh(Site::Layer0(c))).collect();
        for p0 in (0..p).step_by(pb) {
            let nb = pb.min(p - p0);
            let pr = &mut prod[..nb * m * layout.per_pair(k)];
            // pr in accumulation rows of the block: [(p, k), (i, k')], [(p, c), i] or [p, i].
            match layout {
                Layout::Full => {
                    let train = Factor { data: &self.train, n: m * k, ld: sl * h, stamp: stamps[0] };
                    backend.abt(pr, &self.rows[p0 * k * sl * h..(p0 + nb) * k * sl * h], sl * h, &train, nb * k, f * h, 1.0, false)?;
                }
                Layout::Trace => {
                    let train = Factor { data: &self.train, n: m, ld: sl * k * h, stamp: stamps[0] };
                    backend.abt(pr, &self.rows[p0 * sl * k * h..(p0 + nb) * sl * k * h], sl * k * h, &train, nb, f * k * h, 1.0, false)?;
                }
                // Class-major [c, p, i] (faer's GEMM into a strided row-major view crashed in
                // gemm 0.x's microkernel epilogue, so the rows are interleaved by the fold).
                Layout::Diag => {
                    for (c, pc) in pr.chunks_exact_mut(nb * m).enumerate() {
                        let r = &self.rows[(c * p + p0) * sl * h..(c * p + p0 + nb) * sl * h];
                        let train = Factor { data: &self.train[c * m * sl * h..(c + 1) * m * sl * h], n: m, ld: sl * h, stamp: stamps[c] };
                        backend.abt(pc, r, sl * h, &train, nb, f * h, 1.0, false)?;
                    }
                }
            }
            let rpp = layout.rows_per_point(k);
            let out = sink.rows_mut(p0..p0 + nb);
            let pr = &*pr;
            // Accumulation row `row` = (point, class) of the block and its product row.
            let prod_row = |row: usize| match layout {
                Layout::Diag => &pr[((row % k) * nb + row / k) * m..((row % k) * nb + row / k + 1) * m],
                _ => &pr[row * m * cols..(row + 1) * m * cols],
            };
            out.par_chunks_mut(m * cols).enumerate().for_each(|(row, g)| {
                let sr = &s0[(p0 + row / rpp) * m..(p0 + row / rpp + 1) * m];
                for ((gc, lc), &sv) in g.chunks_exact_mut(cols).zip(prod_row(row).chunks_exact(cols)).zip(sr) {
                    gc.iter_mut().zip(lc).for_each(|(a, b)| *a += sv * b);
                }
            });
        }
        Ok(2.0 * p as f64 * m as f64 * (k * layout.cols_per_train(k) * f * h) as f64)
    }
}

/// Steps layer 0's buffer holds before it is contracted (host or device): its row and training
/// sides take a quarter of the Gram, or three steps where they fit in half of it, within
/// `LAYER0_BUFFER_BYTES`, 1 to 16 steps.
pub(crate) fn layer0_slots(layout: Layout, p: usize, m: usize, k: usize, h: usize) -> usize {
    let per_slot = 8 * (p + m) * k * h;
    let gram = 8 * p * m * layout.per_pair(k);
    let fit = |bytes: usize| LAYER0_BUFFER_BYTES.min(bytes) / per_slot.max(1);
    fit(gram / 4).max(fit(gram / 2).min(3)).clamp(1, 16)
}

/// Training activations with the bias column appended when the layer has one: `[M, in(+1)]`.
pub(in crate::kernel) fn train_acts_ext(train: &LayerFactors<'_>, bias: bool) -> Vec<f64> {
    let (m, ni) = (train.acts.len() / train.n_in.max(1), train.n_in);
    if bias {
        let mut v = Vec::with_capacity(m * (ni + 1));
        for i in 0..m {
            v.extend_from_slice(&train.acts[i * ni..(i + 1) * ni]);
            v.push(1.0);
        }
        v
    } else {
        train.acts.to_vec()
    }
}

/// The training side of one step's kernel-machine prediction:
/// `v = Σ_i Σ_{k'} a[i,k'] ∇f^{k'}(x_i)` formed per layer as
/// `V_l = Σ_i (Σ_{k'} a[i,k'] δ_{i,l}[k']) [a_{i,l}, 1]ᵀ` (`[out, in(+1)]`).
///
/// # Shapes
/// `a` `[M, K]`; returns one `[out_l, in_l(+1)]` matrix per layer.
pub(crate) fn prediction_weights(train: &[LayerFactors<'_>], a: &[f64], m: usize, k: usize, bias: bool) -> Vec<Vec<f64>> {
    train
        .iter()
        .map(|t| {
            let (ni, no) = (t.n_in, t.n_out);
            let ne = ni + usize::from(bias);
            // uᵀ [out, M], u_i = Σ_k' a[i,k'] δ_i[k']
            let mut ut = vec![0.0; no * m];
            for i in 0..m {
                for ks in 0..k {
                    let c = a[i * k + ks];
                    if c == 0.0 {
                        continue;
                    }
                    let di = &t.deltas[(i * k + ks) * no..(i * k + ks + 1) * no];
                    for o in 0..no {
                        ut[o * m + i] += c * di[o];
                    }
                }
            }
            let a_ext = train_acts_ext(t, bias);
            let mut v = vec![0.0; no * ne];
            gemm_ab(&mut v, &ut, &a_ext, no, ne, m, 1.0, false);
            v
        })
        .collect()
}

