//! The one way to compute a Gram: [`compute`] takes a run, its weight states, the row points and
//! a [`Request`]; everything else in the crate (the notebook API, tiles, the CLI, the bench,
//! the studies) calls it.

use crate::kernel::engine::blocked::in_blocks;
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::request::{GramPath, Request};
use crate::kernel::types::{KernelKind, KernelOutput, Points};
use crate::kernel::{engine::driver, engine::stateful};
use crate::error::{Error, Result};
use crate::model::{param_layers, Body, Params};
use crate::trajectory::Run;

/// The kernel of a recorded run between `rows` and its training points, with the kernel machine
/// and its per-step validation.
///
/// Only the entries of `req.layout` are computed and held; the kernel machine and its per-step
/// validation are computed for every layout (contracted with `a_{i,s}` on the fly, from the
/// factors); the single machine of Theorem 3.7 contracts the off-diagonal blocks and comes with
/// `full` only. MLPs take the structured fast path, CNNs theirs ([`crate::kernel::GramPath::Fast`]) or
/// the generic autodiff reference ([`crate::kernel::GramPath::Generic`], fixed rules only). Runs whose
/// optimizer keeps state (momentum, Adam, weight decay) take the optimizer replay
/// (`crate::kernel::engine::stateful`) on the network's layer stack; what the run recorded besides its states (Adam's preconditioners) is
/// loaded from its directory. With `req.block_rows` the rows are computed in blocks and the
/// outputs concatenated (equal to one block up to rounding of the combined record means).
///
/// `progress(done, total)` counts steps (over all blocks).
///
/// # Shapes
/// `states` `N + 1` (`w_0 … w_N`), `rows.x` `[P, d]`; the output's Gram is `[P, M, K, K]` in
/// `req.layout` (`M` the columns' training points).
///
/// # Panics
/// If `req.block_rows == Some(0)`.
pub fn compute(run: &Run, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    // A device that cannot run fails here, before any work (one line, see `backend::cuda`).
    req.device.probe()?;
    if req.per_layer {
        return per_layer(run, states, rows, req, progress);
    }
    if req.kind == KernelKind::Path && req.path == GramPath::Fast && !path_closed_form(run, req) && !matches!(run.manifest.architecture.body, Body::Layers { .. }) {
        return on_stack(run, states, rows, req, progress);
    }
    if cnn_on_stack(run, req) || mlp_on_stack(run, req) {
        return on_stack(run, states, rows, req, progress);
    }
    if let Some(preset) = closed_form_of(run, req) {
        return on_preset(run, &preset, states, rows, req, progress);
    }
    compute_plain(run, states, rows, req, progress)
}

/// The preset a layer stack is computed as: the one-hidden-layer ReLU MLP or the ReLU CNN
/// ([`crate::model::Architecture::closed_form_preset`]) where its closed form applies
/// ([`closed_form`]), whose rows the preset integrates between the kinks
/// ([`crate::kernel::mlp::pieces`], [`crate::kernel::cnn::pieces`]) where the stack engine
/// evaluates gradients at nodes: 2.6× faster on the MNIST MLP written as a stack, 2.9× on the
/// CNN (`bench/families.sh`, `mlp-as-stack` and `cnn-as-stack`).
fn closed_form_of(run: &Run, req: &Request) -> Option<crate::model::Architecture> {
    let preset = run.manifest.architecture.closed_form_preset()?;
    closed_form(run, &preset, req).then_some(preset)
}

/// Whether a preset's own path computes this request: the EPK or k′ under the auto rule and
/// plain gradient steps on the CPU, on a one-hidden-layer ReLU MLP whose output layer's
/// sensitivities are `α(δ_ko − p_o)` (α ≠ 0, K ≥ 2: its closed form) or on the ReLU CNN preset
/// (its closed form). Everything else runs on the layer stack ([`on_stack`]): the tanh CNN too,
/// whose max-pool the stack runs ahead of the tanh so that its sweep finds every window switch
/// (on MNIST, 1 000 training images, 64 held-out, 20 steps: 17.0 s where the preset's node
/// search took 24.2 s and the stack with the pool behind the tanh 173 s).
fn closed_form(run: &Run, preset: &crate::model::Architecture, req: &Request) -> bool {
    let plain = crate::optim::UpdateRule::of(&run.manifest.optimizer).is_plain();
    let auto = matches!(req.rule, crate::kernel::quadrature::Rule::Auto(_));
    let shape = match &preset.body {
        Body::Mlp { widths } => widths.len() == 3 && preset.activation == crate::model::Activation::Relu && preset.alpha != 0.0 && preset.outputs() >= 2,
        // The rows integrated (the test side): the train side's gradients at `t = 0` run on the
        // stack, as the NTK's.
        Body::Cnn { .. } => preset.activation == crate::model::Activation::Relu && req.integrates_rows(),
        Body::Layers { .. } => false,
    };
    plain && auto && shape && matches!(req.kind, KernelKind::Epk | KernelKind::Kprime) && req.path == GramPath::Fast && req.device == crate::kernel::backend::Device::Cpu
}

/// [`compute_plain`] on the preset `preset` of a layer stack (the same tensors in the same order,
/// under the preset's names).
fn on_preset(run: &Run, preset: &crate::model::Architecture, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let specs = preset.param_specs();
    let preset_states: Vec<Params> = states.iter().map(|s| Params { specs: specs.clone(), data: s.data.clone() }).collect();
    let mut preset_run = run.clone();
    preset_run.manifest.architecture = preset.clone();
    compute_plain(&preset_run, &preset_states, rows, req, progress)
}

/// Whether the CNN preset runs as its layer stack: every kernel but its ReLU closed form (the
/// EPK's test side and k′ under the auto rule on the CPU, [`crate::kernel::cnn::pieces`]), and on a GPU (its layer
/// stack's nodes go to the device). Measured on the MNIST CNN (`bench/out/families`: 1 000
/// training images, 64 held-out, class-diagonal, steps 0:20, two cores, alternating), the
/// preset's own node path against its stack's: EPK `left:10` 2.24 / 2.14 against 1.99 / 1.97 s,
/// `gauss:4` 2.02 / 2.15 against 1.64 / 1.71 s, the DPK 2.06 / 1.99 against 1.44 / 1.42 s, the
/// NTK 0.18 / 0.19 against 0.14 / 0.18 s.
fn cnn_on_stack(run: &Run, req: &Request) -> bool {
    let arch = &run.manifest.architecture;
    matches!(arch.body, Body::Cnn { .. }) && req.path == GramPath::Fast && !closed_form(run, arch, req)
}

/// Whether an MLP preset runs as its layer stack: every kernel but its closed forms (the EPK and
/// k′ under the auto rule, [`closed_form`]; the path kernel, [`path_closed_form`]) and the
/// gradients at `t = 0` of the NTK and the EPK's training side (measured level with the stack's
/// on the NTK; the Grams the GP studies fit on). Measured on MNIST (`bench/families.sh`: 2 000
/// training images, 64 held-out, 20 steps, two cores): 3.77 s where the preset's node path took
/// 11.10 s on a 784-128-64-10 ReLU MLP, 3.75 s against 12.70 s on a one-hidden-layer tanh MLP;
/// on the 784-128-10 ReLU MLP, 2 000 × 2 000 × 20 steps, the EPK under `left:10` 15.4–17.4 s
/// against the preset's 20.7–21.6 s, the DPK 9.8–10.6 against 11.8–12.9 s
/// (`docs/src/performance.md`). (Under momentum, Adam or weight decay every preset runs as its
/// stack: [`compute_plain`].)
fn mlp_on_stack(run: &Run, req: &Request) -> bool {
    let arch = &run.manifest.architecture;
    let path = req.kind == KernelKind::Path && path_closed_form(run, req);
    let at_ws = req.kind == KernelKind::Ntk || (matches!(req.kind, KernelKind::Epk | KernelKind::Kprime) && !req.integrates_rows());
    matches!(arch.body, Body::Mlp { .. }) && req.path == GramPath::Fast && !closed_form(run, arch, req) && !path && !at_ws
}

/// Whether the path kernel takes the one-hidden-layer ReLU MLP's closed form
/// ([`crate::kernel::mlp::pieces`]): identity outputs (a regression, or a classifier's logits
/// by `req.outputs`) and the auto rule; other networks take their layer stack's path.
fn path_closed_form(run: &Run, req: &Request) -> bool {
    let arch = &run.manifest.architecture;
    matches!(&arch.body, Body::Mlp { widths } if widths.len() == 3)
        && arch.activation == crate::model::Activation::Relu
        && (arch.output == crate::model::OutputKind::Identity || req.outputs == crate::kernel::types::Outputs::Logits)
        && arch.alpha != 0.0
        && arch.outputs() >= 2
        && matches!(req.rule, crate::kernel::quadrature::Rule::Auto(_))
}

/// [`compute`] on the run's own architecture; the optimizer replay (momentum, Adam, weight
/// decay) on layer stacks only, an MLP or CNN preset as its stack ([`on_stack`]). Measured on
/// MNIST (`OPTIM=momentum` and `OPTIM=adam bash bench/families.sh`: 2 000 training images, 64
/// held-out, EPK `auto:1e-12`, class-diagonal, steps 0:20, two cores), the preset's own replay
/// against its stack's: 10.21 against 10.35 s on the 784-128-10 ReLU MLP under heavy-ball
/// momentum, 16.70 against 15.95 s on the 784-128-64-10, 68.05 against 69.72 s under Adam,
/// 107.7 against 11.0 s on the CNN; the machine equal to the network to 2.2e-15 on the MLPs'
/// stacks where the presets' replay reached 6.2e-14 to 1.2e-13 (`docs/src/performance.md`).
fn compute_plain(run: &Run, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    if !matches!(run.manifest.architecture.body, Body::Layers { .. }) && !crate::optim::UpdateRule::of(&run.manifest.optimizer).is_plain() {
        return on_stack(run, states, rows, req, progress);
    }
    let precond = run.load_preconditioners()?;
    let mut one = |pts: &Points, prog: &dyn Fn(usize, usize)| -> Result<KernelOutput> {
        let prep = Prepared::new(&run.manifest, &run.dataset, states, precond.as_deref(), pts, req)?;
        if prep.rule.is_plain() {
            driver::compute(&prep, prog)
        } else {
            crate::kernel::backend::check_path(req.device, false, "the optimizer replay (momentum, Adam, weight decay)")?;
            stateful::compute(&prep, prog)
        }
    };
    match req.block_rows {
        Some(block) => in_blocks(rows, block, progress, &mut one),
        None => one(rows, progress),
    }
}

/// [`compute`] with the per-layer decomposition ([`Request::per_layer`]): any optimizer, all
/// columns. Layer stacks take their structured path (or the generic reference); an MLP or the
/// CNN is computed as its layer stack ([`crate::model::Architecture::as_stack`], the same
/// tensors in the same order) and its layers keep their own names (`layers.0`, `conv`).
fn per_layer(run: &Run, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    if req.columns.is_some_and(|(lo, hi)| (lo, hi) != (0, run.dataset.n_train())) {
        return Err(Error::Config("the per-layer decomposition needs all training points as columns (no tiles)".into()));
    }
    let arch = &run.manifest.architecture;
    let preset = matches!(arch.body, Body::Mlp { .. }) || (matches!(arch.body, Body::Cnn { .. }) && req.path == GramPath::Fast);
    if !preset {
        return compute_plain(run, states, rows, req, progress);
    }
    on_stack(run, states, rows, req, progress)
}

/// [`compute_plain`] on the layer stack of an MLP or CNN preset
/// ([`crate::model::Architecture::as_stack`], the same tensors in the same order); its layers
/// keep their own names (`layers.0`, `conv`).
fn on_stack(run: &Run, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let arch = &run.manifest.architecture;
    let names: Vec<String> = param_layers(&states[0].specs).into_iter().map(|l| l.name).collect();
    let stack_states = states.iter().map(|s| arch.params_as_stack(s)).collect::<Result<Vec<_>>>()?;
    let mut stack_run = run.clone();
    stack_run.manifest.architecture = arch.as_stack()?;
    let mut out = compute_plain(&stack_run, &stack_states, rows, req, progress)?;
    if let Some(l) = out.layers.as_mut() {
        l.names = names;
    }
    Ok(out)
}
