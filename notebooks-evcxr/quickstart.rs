//! Notebook source for `quickstart.ipynb` (evcxr). `cargo test` compiles this file as an example and
//! checks that the notebook's cells are exactly the ones below; regenerate the notebook with
//! `UPDATE_NOTEBOOKS=1 cargo test --release --test notebooks`.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Quick start: train → exact path kernel → exactness
    //
    // We train a small ReLU network (2-16-3) on the 2-D version of the EPK paper's three-class
    // Gaussian mixture (50 training points per class, 30 test points) with 60 steps of full-batch
    // gradient descent, recording every weight state, and then rebuild the
    // network as a kernel machine with the Exact Path Kernel (EPK). The kernel machine must agree with
    // the network to machine precision; the discrete path kernel (DPK) of prior work does not.
    // %%
    let cfg = RunConfig::mixture(2, 50, 30).mlp(&[16]).lr(0.5).steps(60);
    let net = Trained::train(&cfg, "../runs/notebook-quickstart")?;
    show(&net);
    // %% md
    // The run directory holds the manifest, the dataset and one safetensors file per weight state
    // `w_0 … w_N`. The EPK between the 30 held-out points and the 150 training points, with the
    // defaults: test-side rows integrated over every step by the adaptive, kink-aware quadrature
    // `auto:1e-12`, all `K × K` blocks. `machine` compares the kernel machine
    // `b + Σ_s Σ_i a_{i,s} K_s(x, x_i)` with the network's log-softmax output over all points and
    // classes.
    // %%
    let epk = net.epk().compute()?;
    show(&epk);
    // %% md
    // The same with a single evaluation per step at `t = 0` (Domingos' discrete path kernel):
    // %%
    let dpk = net.dpk().compute()?;
    show(&dpk);
    // %% md
    // The paper's Figure 4: the kernel machine against the network, class 0 of every test point.
    // The EPK's points lie on the diagonal; the DPK's do not.
    // %%
    let fig4 = Chart::scatter("Kernel machine vs network (class-0 log-probability, 30 test points)", "network f(x)", "kernel machine", &[
        Series::xy("EPK (auto:1e-12)", epk.network().col(0).iter(), epk.machine().col(0).iter()),
        Series::xy("DPK (t = 0)", dpk.network().col(0).iter(), dpk.machine().col(0).iter()),
    ]).diagonal().draw()?;
    show(&fig4);
    // %% md
    // Per step, the change of the output predicted by that step's kernel against the network's
    // actual change (the per-step check), and the gradient evaluations the adaptive rule needed:
    // %%
    let errors = [epk.step_errors("EPK"), dpk.step_errors("DPK")];
    let per_step = Chart::line("Per step: |predicted − actual change of the output| (max over points and classes)", "step", "max abs error", &errors).log_y().draw()?;
    show(&per_step);
    // %% md
    // The Gram is a typed value: a class block is a `faer` view `[P, M]` (no index arithmetic), and
    // converts to `nalgebra` for code that holds that type.
    // %%
    let k00: DMatrix = epk.class_block(0)?.to_nalgebra();
    println!("K^00 is {} × {}; the first test point against the first 4 training points:", k00.nrows(), k00.ncols());
    println!("{:.4}", k00.view((0, 0), (1, 4)));
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
