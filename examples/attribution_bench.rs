//! Temporary driver of the attribution benchmark (issue #28 §2) until the study engine runs it
//! as an `[attribution]` section: opens (or trains) the mnist-uncertainty protocol's run and
//! calls `pathkernel::datamodels::run` with the default spec.
//!
//!     cargo run --release --example attribution_bench -- RUN_DIR OUT_DIR [SPEC.json]
//!
//! RUN_DIR: a recorded run (MNIST, 2 000 training images, 784-128-10, GD lr 0.5 x 500 steps,
//! seed 0); it is trained there with `data/studies/mnist-uncertainty.toml`'s settings when
//! absent. OUT_DIR receives the tables, `cache/` and `work/` (the noisy-label run).

use pathkernel::api::Trained;
use pathkernel::datamodels::{benchmark::write_tables, run, AttributionSpec, JsonDir};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let run_dir = std::path::PathBuf::from(args.get(1).ok_or("usage: attribution_bench RUN_DIR OUT_DIR [SPEC.json]")?);
    let out = std::path::PathBuf::from(args.get(2).ok_or("usage: attribution_bench RUN_DIR OUT_DIR [SPEC.json]")?);
    let spec: AttributionSpec = match args.get(3) {
        Some(p) => serde_json::from_slice(&std::fs::read(p)?)?,
        None => AttributionSpec::default(),
    };
    let t = std::time::Instant::now();
    let net = match Trained::open(&run_dir) {
        Ok(n) => n,
        Err(_) => Trained::train_toml(
            r#"
            [data]
            kind = "mnist"
            path = "data/mnist"
            per_class = 200
            val_per_class = 50
            n_test = 2000
            normalize = false
            [model]
            kind = "mlp"
            hidden = [128]
            activation = "relu"
            zero_last = true
            [train]
            optimizer = "gd"
            lr = 0.5
            steps = 500
            seed = 0
            "#,
            &run_dir,
        )?,
    };
    eprintln!("[{:7.1} s] run {} open", t.elapsed().as_secs_f64(), net.run().manifest.run_id);
    let log = |s: &str| eprintln!("[{:7.1} s] {s}", t.elapsed().as_secs_f64());
    let r = run(&net, &spec, &JsonDir(out.join("cache")), &out.join("work"), &log)?;
    write_tables(&r, &out)?;
    println!("{r}");
    eprintln!("wall-clock {:.1} s (including opening the run)", t.elapsed().as_secs_f64());
    Ok(())
}
