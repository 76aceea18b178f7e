//! Notebook source for `grokking.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
//! Reads the committed report `reports/grokking/` (`pathkernel study run
//! data/studies/grokking.toml` writes it), then trains the run's first 810 steps again and
//! rebuilds its memorisation window exactly.
use pathkernel::api::*;
use pathkernel::io::Table;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Grokking, exactly: a transformer that memorises first and generalises later
    //
    // The study `data/studies/grokking.toml` trains ExPLAIND's one-layer transformer on
    // `a + b mod 31` (tokens `[a, +, b, =]`, 397 training pairs, 99 held out) full batch with AdamW
    // and weight decay 2 for 10 000 steps, recording every weight state. Its report
    // (`reports/grokking/`) holds the training log, the exact path kernel's machine of the whole run
    // put together from five windows, and every step's change of the held-out outputs split by
    // layer. This notebook reads that report (no network is trained for these charts), then
    // trains the run's first 810 steps here and rebuilds one window exactly.
    // %%
    /// The first step at which `v` reaches `th`, or "never".
    fn first_at(v: &[f64], th: f64) -> String {
        v.iter().position(|&a| a >= th).map_or("never".to_string(), |s| format!("step {s}"))
    }
    let log = Table::read_parquet("../reports/grokking/train_log.parquet".as_ref())?;
    let steps: Vec<f64> = log.i64("step").ok_or("no step column")?.iter().map(|&s| s as f64).collect();
    let acc: Vec<f64> = log.f64("accuracy").ok_or("no accuracy column")?.to_vec();
    let held: Vec<f64> = log.f64("test_accuracy").ok_or("no test_accuracy column")?.to_vec();
    println!("training accuracy ≥ 0.99 at {}", first_at(&acc, 0.99));
    println!("held-out accuracy ≥ 0.5 at {}, ≥ 0.9 at {}, ≥ 0.99 at {}; {:.3} at the end", first_at(&held, 0.5), first_at(&held, 0.9), first_at(&held, 0.99), held[held.len() - 1]);
    let curve = Chart::line("Accuracy during training (full batch: one step per epoch)", "step", "accuracy", &[
        Series::new("train", steps.clone(), acc.clone()),
        Series::new("held-out", steps.clone(), held.clone()),
    ])
    .draw()?;
    show(&curve);
    // %% md
    // ## Which layer moved the held-out predictions, and when
    //
    // Over step s the network moves along `w_s + tΔw_s`, so each held-out output's change splits
    // exactly into one path integral per top-level layer, `∫₀¹ ∇_g f·Δw_g dt` (embedding, attention,
    // the residual MLP, the unembedding). The report keeps, per step and layer, its share of the
    // change of the mean held-out log-probability of the target class; summed over steps, the layers
    // add up to the network's own change.
    // %%
    /// Per layer of the report's `layer_shares.parquet` (rows: step, layer), its target shares
    /// summed from step 0; and the network, the layers' sum.
    fn cumulative_by_layer(t: &Table) -> Result<Vec<Series>, Box<dyn std::error::Error>> {
        let (layer, target) = (t.str("layer").ok_or("no layer column")?, t.f64("target_share").ok_or("no target_share column")?);
        let mut names: Vec<String> = Vec::new();
        for l in layer {
            if !names.contains(l) {
                names.push(l.clone());
            }
        }
        let mut series: Vec<Series> = Vec::new();
        for name in &names {
            let mut c = 0.0;
            let ys: Vec<f64> = layer.iter().zip(target).filter(|(l, _)| *l == name).map(|(_, v)| {
                c += v;
                c
            }).collect();
            series.push(Series::new(name.clone(), (0..ys.len()).map(|s| s as f64).collect(), ys));
        }
        let total: Vec<f64> = (0..series[0].y.len()).map(|s| series.iter().map(|se| se.y[s]).sum()).collect();
        series.push(Series::new("network (sum)", (0..total.len()).map(|s| s as f64).collect(), total));
        Ok(series)
    }
    let shares = Table::read_parquet("../reports/grokking/analysis/layer_shares.parquet".as_ref())?;
    let series: Vec<Series> = cumulative_by_layer(&shares)?;
    let cumulative = Chart::line("Change of the mean held-out log p(target) since step 0, by layer", "step", "cumulative change", &series).draw()?;
    show(&cumulative);
    // %% md
    // ## The whole run's kernel machine
    //
    // Five windows of 8 steps are exact EPK machines (the start, memorisation, the plateau, the jump,
    // the end); between them the network's own change is one term per gap. With AdamW the momentum
    // carries earlier gradients into a window: those are one exact term of their own. Each
    // segment's largest term at the four held-out pairs, each window's machine against the network
    // at its end, and what the window's carried-in term was (the summary puts them together and
    // checks the sum against the network at step 10 000):
    // %%
    /// The report's `windows.parquet` as a table: each segment, its steps, its largest term, the
    /// window's machine error and its carried-in term.
    fn windows_table(t: &Table) -> Result<String, Box<dyn std::error::Error>> {
        let seg = t.str("segment").ok_or("no segment column")?;
        let (from, to) = (t.i64("from_step").ok_or("no from_step column")?, t.i64("to_step").ok_or("no to_step column")?);
        let (term, err, carried) = (t.f64("max_abs_term").ok_or("no max_abs_term column")?, t.f64("window_max_abs_error").ok_or("no window_max_abs_error column")?, t.f64("max_abs_carried_in").ok_or("no max_abs_carried_in column")?);
        let opt = |v: f64| if v.is_nan() { "—".to_string() } else { format!("{v:.2e}") };
        let mut out = format!("{:<14} {:>14} {:>12} {:>16} {:>12}\n", "segment", "steps", "max |term|", "machine vs net", "carried in");
        for i in 0..seg.len() {
            out.push_str(&format!("{:<14} {:>14} {:>12.3e} {:>16} {:>12}\n", seg[i], format!("[{}, {})", from[i], to[i]), term[i], opt(err[i]), opt(carried[i])));
        }
        Ok(out)
    }
    let windows = Table::read_parquet("../reports/grokking/analysis/windows.parquet".as_ref())?;
    println!("{}", windows_table(&windows)?);
    // %% md
    // ## One window, rebuilt here
    //
    // The same data, network and optimizer (same seeds), trained for 810 steps: its states are the
    // study's first 810. The EPK over the memorisation window, steps 802 to 810, at the first four
    // held-out pairs, with the earlier steps' momentum as one carried-in term: the machine against
    // the network's log-softmax.
    // %%
    let toml = r#"
[data]
kind = "modular"
p = 31
op = "+"
train_frac = 0.8
seed = 2

[model]
kind = "layers"
zero_last = false
init_scale = 0.1
layers = [
  { embedding = { vocab = 33, dim = 64, scale = "sqrt_dim" } },
  { self_attention = { heads = 4, shared_qkv = true } },
  "last_token",
  { residual = [{ dense = 256 }, "relu", { dense = 64 }, "relu"] },
  { dense = { features = 33, bias = false } },
]

[train]
optimizer = "adamw"
lr = 1e-3
betas = [0.9, 0.98]
weight_decay = 2.0
steps = 810
seed = 5
"#;
    let net = Trained::train_toml(toml, "../runs/notebook-grokking")?;
    let x: Vec<f64> = {
        let xt = net.x_test();
        (0..4).flat_map(|i| (0..xt.ncols()).map(move |j| xt[(i, j)])).collect()
    };
    let window = net.epk().inputs(&x).steps(802, 810).carry_in().rule("auto:1e-11".parse()?).compute()?;
    show(&window);
    // %% md
    // The study computed the same window from the same states; its machine, from the report:
    // %%
    let report = Table::read_parquet("../reports/grokking/kernels/epk-memorise/predictions.parquet".as_ref())?;
    let there: Vec<f64> = report.f64("kernel_machine").ok_or("no kernel_machine column")?.to_vec();
    let here: Vec<f64> = {
        let m = window.machine();
        (0..m.nrows()).flat_map(|i| (0..m.ncols()).map(move |j| m[(i, j)])).collect()
    };
    let apart = here.iter().zip(&there).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!("{} outputs here, {} in the report; max |machine here − machine in the report| = {apart:.1e}", here.len(), there.len());
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
