//! The one way to compute a Gram: [`compute`] takes a run, its weight states, the row points and
//! a [`Request`]; everything else in the crate (the notebook API, tiles, the CLI, the bench,
//! the studies) calls it.

use crate::kernel::engine::blocked::in_blocks;
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::request::{GramPath, Request};
use crate::kernel::types::{KernelOutput, Points};
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
/// `full` only. Every network takes its layer stack's structured path
/// ([`crate::kernel::GramPath::Fast`]; an MLP or CNN preset as its stack; two stack shapes have
/// a closed form for some requests, measured faster) or the generic autodiff reference
/// ([`crate::kernel::GramPath::Generic`], fixed rules only, on the network as written). Runs whose
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
    #[cfg(test)]
    let _switches = crate::kernel::test_switches::shared();
    // A device that cannot run fails here, before any work (one line, see `backend::cuda`).
    req.device.probe()?;
    if req.per_layer {
        return per_layer(run, states, rows, req, progress);
    }
    // An MLP or CNN preset is computed as its layer stack (the same tensors in the same order),
    // which takes its closed form where one applies (`kernel::stack::closed`); the generic
    // path is the dfdx reference on the network as written.
    if req.path != GramPath::Generic && !matches!(run.manifest.architecture.body, Body::Layers { .. }) {
        return on_stack(run, states, rows, req, progress);
    }
    compute_plain(run, states, rows, req, progress)
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
    let preset = matches!(arch.body, Body::Mlp { .. }) || (matches!(arch.body, Body::Cnn { .. }) && req.path != GramPath::Generic);
    if !preset {
        return compute_plain(run, states, rows, req, progress);
    }
    on_stack(run, states, rows, req, progress)
}

/// [`compute_plain`] on the layer stack of an MLP or CNN preset
/// ([`crate::model::Architecture::as_stack`], the same tensors in the same order); its layers
/// keep their own names (`layers.0`, `conv`). Every kernel of a preset runs here, on the CPU and
/// on a GPU (the stack's nodes go to the device), its stack's closed forms included
/// (`kernel::stack::closed`), because the presets' own paths were measured slower (or level)
/// and are gone. On MNIST (`bench/families.sh`, two cores): the 784-128-64-10 ReLU MLP 3.77 s
/// against its preset's 11.10 s (2 000 training images, 64 held-out, 20 steps), the
/// one-hidden-layer tanh MLP 3.75 against 12.70 s; the 784-128-10 ReLU MLP, 2 000 × 2 000 × 20
/// steps, the EPK under `left:10` 15.4–17.4 s against 20.7–21.6 s, the DPK 9.8–10.6 against
/// 11.8–12.9 s, its gradients at `t = 0` (the NTK, the EPK's training side: the Grams the GP
/// studies fit on) 2.0–3.7 s against 3.6–4.0 s (NTK) and 12.1–12.9 against 12.5–13.3 s (the
/// training side over 20 steps); the CNN (1 000 training images, 64 held-out, class-diagonal,
/// steps 0:20, alternating): EPK `left:10` 1.99 / 1.97 s against 2.24 / 2.14 s, `gauss:4` 1.64 /
/// 1.71 against 2.02 / 2.15 s, the DPK 1.44 / 1.42 against 2.06 / 1.99 s, the NTK 0.14 / 0.18
/// against 0.18 / 0.19 s. With 200 nodes per point (`mnist-cnn`'s `left:200`, 200 held-out × 1 000
/// × 100 steps) the stack took 91 s where the preset's own node path took 54 s, until a fixed
/// rule was evaluated on each point's pieces: 42 s (`docs/src/performance.md`).
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
