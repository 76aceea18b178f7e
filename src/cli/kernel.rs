//! `pathkernel kernel`

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::error::Result;
use crate::io::StagedDir;
use crate::kernel::{self, KernelKind, Layout, Rows, Request, Rule, Side};
use crate::trajectory::Run;

/// Compute a kernel of a recorded run and the kernel machine that reproduces the network.
#[derive(clap::Args, Debug)]
#[command(long_about = "Compute a kernel over a recorded training path between row points and the training set, \
and the kernel machine f(x) = b + sum_s sum_i a_{i,s} K_s(x, x_i). Writes OUT/gram.safetensors (gram [P,M,K,K], or [P,M,K] / [P,M] with --layout diag / trace, \
a [N,M,K], bias [P,K], points [P,d]), OUT/predictions.parquet, OUT/exactness.json and OUT/steps.parquet.\n\n\
Kinds: ntk (at --step S, default the last state), dpk (Domingos' discrete path kernel, t = 0), \
epk (Exact Path Kernel, Definition 3.4: test-side rows integrated over each step), chen (eq. 18), \
kprime (eq. 13, rows always integrated), path (the path-averaged kernel sum_s <Jbar_s(x), Jbar_s(x')>, both sides integrated; any network and rule, plain gradient steps only).\n\
Quadrature: left:T, midpoint:T, gauss:T, or auto:TOL (kink-aware adaptive Gauss, the default auto:1e-12).\n\
Example: pathkernel kernel --run runs/toy --kind epk --quadrature auto:1e-12 --out runs/toy-epk")]
pub struct Args {
    /// Run directory written by `pathkernel train`.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// Kernel: ntk, dpk, epk, chen, kprime or path.
    #[arg(long, default_value = "epk")]
    kind: String,
    /// NTK only: the state S at which the NTK is taken (default: the last state N).
    #[arg(long, value_name = "S")]
    step: Option<usize>,
    /// Quadrature for integrated rows: left:T, midpoint:T, gauss:T, auto:TOL.
    #[arg(long, default_value = "auto:1e-12", value_name = "RULE")]
    quadrature: String,
    /// Row points: test, train, class-means or grid:N (2-D data).
    #[arg(long, default_value = "test", value_name = "SET")]
    points: String,
    /// Side of the row points (EPK Definition 3.3): test (integrated) or train (t = 0).
    #[arg(long, default_value = "test", value_name = "SIDE")]
    side: String,
    /// Sum only the steps A..B (A <= s < B); the machine then predicts f at w_B from f at w_A.
    #[arg(long, value_name = "A:B")]
    steps: Option<String>,
    /// The outputs the kernel is on: network (as trained: a classifier's log-softmax) or logits
    /// (a classifier's logits, plain gradient steps; what function-space Laplace uses).
    #[arg(long, default_value = "network", value_name = "OUTPUTS")]
    outputs: String,
    /// Also keep every per-step Gram (refused with an estimate when over --memory).
    #[arg(long)]
    per_step: bool,
    /// Also split the kernel by parameter layer: each layer's Gram (gram.safetensors
    /// layer_gram) and its share of the machine's change per step (OUT/layers.parquet, with a
    /// `layer` column); the shares sum to the whole. Any optimizer; no tiles.
    #[arg(long)]
    per_layer: bool,
    /// With --steps A:B on a run with momentum or Adam: the earlier steps' gradients that the
    /// momentum carries into the window are one carried-in term of the machine (gram.safetensors
    /// `carried` [P,K], exactness.json carried_term_max_abs) instead of steps of their own in
    /// the Gram and in `a`; the window's cost then no longer grows with A beyond one data
    /// gradient per earlier step. No tiles.
    #[arg(long)]
    carry_in: bool,
    /// The Gram's layout, i.e. which blocks to compute and store: full ([P,M,K,K]), diag (the
    /// class-diagonal blocks K^cc, [P,M,K]: per-class GPs, the SVM) or trace (sum_c K^cc, [P,M]:
    /// stationarity). Work and memory scale with the layout; the kernel machine is checked for
    /// every layout. `--blocks` is an alias.
    #[arg(long = "layout", visible_alias = "blocks", default_value = "full", value_name = "LAYOUT")]
    blocks: String,
    /// Memory budget for the computation, e.g. 8G, 512M: row points are computed in blocks so
    /// that the output plus one block's work fits; refused with an estimate when the output
    /// alone (plus one row point's work) does not.
    #[arg(long, default_value = "8G", value_name = "SIZE")]
    memory: String,
    /// Plan a tiled job instead of computing: write OUT/plan.json with N tiles (row blocks; or
    /// RxS: R row blocks x S step ranges; or RxCxS: R row blocks x C blocks of training points
    /// x S step ranges), each within --memory; see `pathkernel tile --help`.
    #[arg(long, value_name = "N|RxS|RxCxS")]
    tiles: Option<String>,
    /// Where the work runs: cpu, or cuda (GPU 0: where a `dense, relu, dense` stack, the MLP,
    /// takes its closed form (the EPK and k′ under the auto rule) its whole step runs there with the
    /// Gram resident; elsewhere a layer stack's or the CNN's node gradients do; the kernels' PTX from $PATHKERNEL_PTX or epk.ptx beside the
    /// binary). Without a GPU, its driver or libcublas.so.13, cuda is one line
    /// and exit 2, and nothing is written.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    device: kernel::Device,
    /// The Gram path: fast (the layer stack's engine, with a closed form for the stack shapes
    /// that have one, `dense, relu, dense` and `conv2d, relu, max_pool2d, flatten, dense`, where
    /// it is measured faster), nodes (the stack's engine at quadrature nodes, never a closed
    /// form: their cross-check) or generic (autodiff on the network as written, the slow
    /// reference; fixed rules only).
    #[arg(long, default_value = "fast", value_name = "PATH")]
    path: String,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT if it exists (only after the computation succeeded).
    #[arg(long)]
    force: bool,
    /// Exit with status 2 when an adaptive rule misses its tolerance (the outputs are still
    /// written, for inspection); without it the miss is a warning on stderr.
    #[arg(long)]
    strict: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    let kind: KernelKind = a.kind.parse()?;
    let rule: Rule = a.quadrature.parse()?;
    let spec: Rows = a.points.parse()?;
    let layout: Layout = a.blocks.parse()?;
    let outputs: kernel::Outputs = a.outputs.parse()?;
    let path: kernel::GramPath = a.path.parse()?;
    let side = match a.side.as_str() {
        "test" => Side::Test,
        "train" => Side::Train,
        other => return Err(crate::Error::Config(format!("--side {other}: expected test or train"))),
    };
    if a.step.is_some() && kind != KernelKind::Ntk {
        return Err(crate::Error::Config("--step only applies to --kind ntk".into()));
    }
    let budget = crate::io::parse_bytes(&a.memory)?;
    // A device that cannot run is refused before anything is read or written.
    a.device.probe()?;
    let steps = a.steps.as_deref().map(kernel::parse_step_range).transpose()?;
    let run = Run::open(&a.run)?;
    let states = run.load_all()?;
    let points = spec.resolve(&run.dataset)?;
    let req = Request::new(kind).rule(rule).side(side).ntk_step(a.step).per_step(a.per_step).steps(steps).layout(layout).outputs(outputs).per_layer(a.per_layer).device(a.device).carry_in(a.carry_in).path(path);
    if let Some(tiles) = &a.tiles {
        if a.carry_in {
            return Err(crate::Error::Config("--carry-in is not available with --tiles".into()));
        }
        if a.per_layer {
            return Err(crate::Error::Config("--per-layer is not available with --tiles".into()));
        }
        if a.device != kernel::Device::Cpu {
            return Err(crate::Error::Config("--device cuda is not available with --tiles (tiles run on the CPU)".into()));
        }
        if outputs != kernel::Outputs::Network {
            return Err(crate::Error::Config("--outputs logits is not available with --tiles".into()));
        }
        if path != kernel::GramPath::Fast {
            return Err(crate::Error::Config("--path is not available with --tiles (tiles take the fast path)".into()));
        }
        return super::tile::plan(&run, &states, &a.points, &req, budget, tiles, &a.out, a.force);
    }
    let staged = StagedDir::new(&a.out, a.force)?;
    let bar = if !a.quiet && std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(indicatif::ProgressStyle::with_template("kernel {bar:40} {pos}/{len} steps [{elapsed} < {eta}]").expect("valid template"));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let plan = kernel::engine::blocked::plan(&run.manifest, points.len(), run.dataset.n_train(), &req, budget)?;
    let out = kernel::compute(&run, &states, &points, &req.block_rows(Some(plan.block_rows)), &progress)?;
    bar.finish_and_clear();
    kernel::output::write(staged.path(), &out, &points, spec, &run.manifest.run_id)?;
    let dir = staged.commit()?;
    println!("{out}");
    if plan.blocks > 1 {
        println!(
            "computed in {} row blocks of {} points to fit --memory {} (estimated peak {} MiB, output {} MiB)",
            plan.blocks,
            plan.block_rows,
            a.memory,
            plan.estimated_peak() >> 20,
            plan.output_bytes >> 20
        );
    }
    println!("wrote {}", dir.display());
    if let Some(miss) = out.inexactness() {
        if a.strict {
            return Err(crate::Error::Numerical(format!("{miss} (--strict; the outputs are in {})", dir.display())));
        }
        eprintln!("warning: {miss} (exactness.json; --strict makes this an error)");
    }
    Ok(())
}
