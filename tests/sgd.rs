//! Mini-batch SGD with learning-rate schedules stays exact: the per-point decomposition of each
//! step equals the actual weight change, and the EPK kernel machine reproduces the network.

mod common;

use common::*;
use pathkernel::kernel::{self, generic, KernelKind, Rows, Request, Rule};
use pathkernel::trajectory::{batch_schedule, OptimizerRecord};

fn sgd_config(schedule: &str) -> String {
    toy2d("[10]", "relu", 25, 0.8, 10, 12).replace("seed = 7\n", &format!("seed = 7\noptimizer = \"sgd\"\nbatch_size = 7\nschedule = {schedule}\n"))
}

#[test]
fn sgd_steps_decompose_exactly_and_the_epk_reproduces_the_network() {
    let dir = tempfile::tempdir().unwrap();
    for (name, schedule) in [("step", "{ kind = \"step\", every = 10, gamma = 0.5 }"), ("cosine", "{ kind = \"cosine\", min_lr = 0.05 }")] {
        let run = train(dir.path(), name, &sgd_config(schedule));
        let m = run.dataset.n_train();
        let n = run.manifest.steps;
        // Schedule and batches are recorded.
        let lrs = &run.manifest.learning_rates;
        match name {
            "step" => {
                assert_eq!(lrs[0], 0.8);
                assert_eq!(lrs[9], 0.8);
                assert_eq!(lrs[10], 0.4);
                assert_eq!(lrs[24], 0.2);
            }
            _ => {
                assert_eq!(lrs[0], 0.8);
                assert!(lrs[24] > 0.05 && lrs[24] < 0.06, "{}", lrs[24]);
            }
        }
        let OptimizerRecord::Sgd { batch_size, shuffle_seed, .. } = run.manifest.optimizer else { panic!("sgd") };
        assert_eq!(batch_size, 7);
        let batches = batch_schedule(m, 7, n, shuffle_seed);
        assert_eq!(run.manifest.batches().unwrap(), batches);
        // One epoch covers every point exactly once (30 points: 7, 7, 7, 7, 2).
        let mut seen: Vec<usize> = batches[..5].iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..m).collect::<Vec<_>>());
        assert_eq!(batches[4].len(), 2);
        assert!(run.dir.join("trajectory/batches.safetensors").exists());

        let states = run.load_all().unwrap();
        let arch = &run.manifest.architecture;
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
        let out = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        assert!(out.max_abs_error() <= 1e-11, "{name}: EPK error {:e}", out.max_abs_error());
        assert!(out.single_machine.is_none(), "a_i changes with the batch: no single machine");
        assert!(max_abs_diff(&out.network, &out.bias) > 0.3);
        // Per-point decomposition: w_{s+1} − w_s = Σ_i Σ_k a_{i,s,k} ∇f^k(x_i) at w_s; only the batch contributes.
        let k = arch.outputs();
        for s in [0, 7, 13, 24] {
            let j = generic::jacobians(arch, &states[s], &states[0], &run.dataset.x_train).unwrap();
            let w = states[s].numel();
            let mut pred = vec![0.0; w];
            for i in 0..m {
                for c in 0..k {
                    let a = out.a[(s * m + i) * k + c];
                    if !batches[s].contains(&i) {
                        assert_eq!(a, 0.0, "point {i} is not in the batch of step {s}");
                    }
                    for (p, g) in pred.iter_mut().zip(&j[(i * k + c) * w..(i * k + c + 1) * w]) {
                        *p += a * g;
                    }
                }
            }
            let actual: Vec<f64> = states[s + 1].flat().iter().zip(states[s].flat()).map(|(a, b)| a - b).collect();
            let err = max_abs_diff(&pred, &actual);
            assert!(err <= 1e-12 * max_abs(&actual).max(1e-300) + 1e-15, "{name} step {s}: decomposition off by {err:e}");
        }
    }
}

#[test]
fn sgd_configs_are_checked() {
    use pathkernel::train::RunConfig;
    let p = std::path::Path::new("t.toml");
    let no_batch = toy2d("[4]", "relu", 3, 0.5, 5, 3).replace("seed = 7\n", "seed = 7\noptimizer = \"sgd\"\n");
    assert!(RunConfig::from_toml(&no_batch, p).unwrap_err().to_string().contains("needs train.batch_size"));
    let gd_batch = toy2d("[4]", "relu", 3, 0.5, 5, 3).replace("seed = 7\n", "seed = 7\nbatch_size = 4\n");
    assert!(RunConfig::from_toml(&gd_batch, p).unwrap_err().to_string().contains("only used by"));
    let bad_step = sgd_config("{ kind = \"step\", every = 0, gamma = 0.5 }");
    assert!(RunConfig::from_toml(&bad_step, p).unwrap_err().to_string().contains("every >= 1"));
    let bad_cos = sgd_config("{ kind = \"cosine\", min_lr = 5.0 }");
    assert!(RunConfig::from_toml(&bad_cos, p).unwrap_err().to_string().contains("min_lr"));
    let unknown = sgd_config("{ kind = \"warmup\" }");
    assert!(RunConfig::from_toml(&unknown, p).is_err());
}
