//! Every layer kind alone and composed (LeNet-5-like, residual CNNs, GELU + layer norm MLPs),
//! each checked against the dfdx autodiff reference: forward values, per-sample Jacobians from
//! the structured backward pass, and tangents along a random parameter direction.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::*;
use crate::model::{net, Architecture, Body, ModelConfig, OutputKind, Params};

/// A JSON value as TOML inline syntax (how a study file writes a layer list).
pub(crate) fn inline(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!("{{ {} }}", m.iter().map(|(k, v)| format!("{k} = {}", inline(v))).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn arch(layers: serde_json::Value, dim: usize, image: Option<[usize; 3]>, k: usize) -> Architecture {
    let text = format!("kind = \"layers\"\nzero_last = false\nlayers = {}\n", inline(&layers));
    let cfg: ModelConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    cfg.resolve(dim, image, k, OutputKind::Identity).unwrap()
}

/// A stack on sequences of `t` token ids from a vocabulary of `vocab`.
fn token_arch(layers: serde_json::Value, t: usize, vocab: usize, k: usize) -> Architecture {
    let text = format!("kind = \"layers\"\nzero_last = false\nlayers = {}\n", inline(&layers));
    let cfg: ModelConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    cfg.resolve_on(Shape::Tokens(t, vocab), k, OutputKind::Identity).unwrap()
}

/// `n` random input rows for the stack: token ids on a token input, else uniform in [−1, 1].
fn sample_rows(st: &Stack, n: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    match st.input {
        Shape::Tokens(t, v) => (0..n * t).map(|_| rng.gen_range(0..v) as f64).collect(),
        s => (0..n * s.size()).map(|_| rng.gen_range(-1.0..1.0)).collect(),
    }
}

/// Sample `dst` of `x` (`[n, d]`) becomes a copy of sample `src`, for each `(src, dst)` in turn:
/// a point's node rows share its input.
fn repeat_samples(x: &mut [f64], d: usize, copies: &[(usize, usize)]) {
    for &(src, dst) in copies {
        x.copy_within(src * d..(src + 1) * d, dst * d);
    }
}

fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

/// Checks one architecture on `n` random inputs; returns the largest relative difference.
fn check(a: &Architecture, n: usize, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let p = a.init(seed);
    // Perturb every tensor so that zero-initialised or constant ones (layer norm) are generic.
    let p = Params { specs: p.specs.clone(), data: p.data.iter().map(|d| d.iter().map(|v| v + 0.1 * rng.gen_range(-1.0..1.0)).collect()).collect() };
    let d = a.input_dim();
    let k = a.outputs();
    let st = a.stack().unwrap();
    let x = sample_rows(&st, n, &mut rng);
    // Forward: plain vs autodiff (through the Jacobian's reference forward).
    let y = st.forward(&p.data, &x);
    let (y2, caches) = st.forward_cached(&p.data, &x);
    assert_eq!(y, y2);
    let dev = dfdx::tensor::Cpu::default();
    let mut worst: f64 = 0.0;
    let mut jref = Vec::new();
    for s in 0..n {
        jref.extend(net::jacobian(&dev, a, &p, None, &x[s * d..(s + 1) * d]).unwrap());
    }
    // Backward with identity seeds: dy[s, c, :] = e_c.
    let mut dy = vec![0.0; n * k * k];
    for s in 0..n {
        for c in 0..k {
            dy[(s * k + c) * k + c] = 1.0;
        }
    }
    let grads = st.backward(&p.data, &caches, dy, k);
    let j = dense_jacobian(&p.specs, &grads, n, k);
    worst = worst.max(rel_diff(&j, &jref));
    // Tangent along a random direction equals J · dir.
    let dir: Vec<Vec<f64>> = p.data.iter().map(|t| t.iter().map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
    let (y3, yd) = st.tangent(&p.data, &dir, &x);
    worst = worst.max(rel_diff(&y3, &y));
    let flat: Vec<f64> = dir.iter().flatten().copied().collect();
    let w = flat.len();
    let jd: Vec<f64> = (0..n * k).map(|r| jref[r * w..(r + 1) * w].iter().zip(&flat).map(|(u, v)| u * v).sum()).collect();
    worst = worst.max(rel_diff(&yd, &jd));
    worst
}

#[test]
fn every_layer_kind_alone_matches_autodiff() {
    let img = Some([2, 7, 6]);
    let cases: Vec<(&str, serde_json::Value, usize, Option<[usize; 3]>)> = vec![
        ("dense", json!([{ "dense": 3 }]), 5, None),
        ("dense no bias", json!([{ "dense": { "features": 3, "bias": false } }]), 5, None),
        ("relu", json!([{ "dense": 6 }, "relu", { "dense": 3 }]), 5, None),
        ("leaky_relu", json!([{ "dense": 6 }, { "leaky_relu": 0.2 }, { "dense": 3 }]), 5, None),
        ("tanh", json!([{ "dense": 6 }, "tanh", { "dense": 3 }]), 5, None),
        ("sigmoid", json!([{ "dense": 6 }, "sigmoid", { "dense": 3 }]), 5, None),
        ("softplus", json!([{ "dense": 6 }, "softplus", { "dense": 3 }]), 5, None),
        ("gelu", json!([{ "dense": 6 }, "gelu", { "dense": 3 }]), 5, None),
        ("silu", json!([{ "dense": 6 }, "silu", { "dense": 3 }]), 5, None),
        ("layer_norm flat", json!([{ "dense": 6 }, "layer_norm", { "dense": 3 }]), 5, None),
        ("residual identity", json!([{ "dense": 6 }, { "residual": [{ "dense": 6 }, "relu", { "dense": 6 }] }, { "dense": 3 }]), 5, None),
        ("residual projection", json!([{ "residual": [{ "dense": 7 }, "tanh"] }, { "dense": 3 }]), 5, None),
        ("conv2d", json!([{ "conv2d": { "channels": 3, "kernel": 3, "stride": 2, "padding": 1 } }, "flatten", { "dense": 3 }]), 84, img),
        ("conv2d no bias", json!([{ "conv2d": { "channels": 3, "kernel": 2, "bias": false } }, "flatten", { "dense": 3 }]), 84, img),
        ("max_pool2d", json!([{ "conv2d": { "channels": 3, "kernel": 2 } }, { "max_pool2d": 2 }, "flatten", { "dense": 3 }]), 84, img),
        ("max_pool2d overlapping", json!([{ "conv2d": { "channels": 3, "kernel": 2 } }, { "max_pool2d": { "kernel": 3, "stride": 2 } }, "flatten", { "dense": 3 }]), 84, img),
        ("avg_pool2d", json!([{ "conv2d": { "channels": 3, "kernel": 2 } }, { "avg_pool2d": 2 }, "flatten", { "dense": 3 }]), 84, img),
        ("layer_norm channels", json!([{ "conv2d": { "channels": 3, "kernel": 2 } }, "layer_norm", "flatten", { "dense": 3 }]), 84, img),
        ("residual conv projection", json!([{ "residual": [{ "conv2d": { "channels": 4, "kernel": 3, "stride": 2, "padding": 1 } }, "relu"] }, "flatten", { "dense": 3 }]), 84, img),
    ];
    for (name, layers, d, image) in cases {
        let a = arch(layers, d, image, 3);
        let e = check(&a, 3, 7);
        eprintln!("{name}: {e:e}");
        assert!(e < 1e-12, "{name}: largest relative difference {e:e}");
    }
}

#[test]
fn lenet_and_residual_cnn_match_autodiff() {
    let lenet = json!([
        { "conv2d": { "channels": 6, "kernel": 5, "padding": 2 } }, "relu", { "max_pool2d": 2 },
        { "conv2d": { "channels": 16, "kernel": 5 } }, "relu", { "max_pool2d": 2 },
        "flatten", { "dense": 120 }, "relu", { "dense": 84 }, "relu", { "dense": 10 }
    ]);
    let a = arch(lenet, 784, Some([1, 28, 28]), 10);
    assert_eq!(a.param_specs().iter().map(ParamSpec::numel).sum::<usize>(), 61_706);
    let e = check(&a, 2, 3);
    assert!(e < 1e-12, "LeNet-5: {e:e}");
    let resnet = json!([
        { "conv2d": { "channels": 4, "kernel": 3, "padding": 1 } }, "gelu",
        { "residual": [{ "conv2d": { "channels": 4, "kernel": 3, "padding": 1 } }, "layer_norm", "gelu", { "conv2d": { "channels": 4, "kernel": 3, "padding": 1 } }] },
        { "residual": [{ "conv2d": { "channels": 8, "kernel": 3, "stride": 2, "padding": 1 } }, "silu"] },
        { "avg_pool2d": 2 }, "flatten", { "dense": 16 }, "layer_norm", "softplus", { "dense": 5 }
    ]);
    let a = arch(resnet, 200, Some([2, 10, 10]), 5);
    let e = check(&a, 2, 5);
    assert!(e < 1e-12, "residual CNN: {e:e}");
}

/// A max-pool runs ahead of the nondecreasing activation written before it (tanh, ReLU, leaky
/// ReLU with slope ≥ 0, sigmoid): the same function, gradients and tangents as the stack in its
/// written order, the same PyTorch printout and parameters; a ReLU's pool knows it (the sweep's
/// floor); GELU and a negative slope keep their place.
#[test]
fn a_max_pool_runs_ahead_of_its_relu_with_the_same_function() {
    let layers = json!([
        { "conv2d": { "channels": 3, "kernel": 3, "padding": 1 } }, "tanh", { "max_pool2d": 2 },
        { "conv2d": { "channels": 3, "kernel": 3, "padding": 1 } }, "relu", { "max_pool2d": 2 },
        { "conv2d": { "channels": 4, "kernel": 3 } }, { "leaky_relu": 0.1 }, { "max_pool2d": { "kernel": 2, "stride": 1 } },
        { "conv2d": { "channels": 2, "kernel": 1 } }, { "leaky_relu": -0.5 }, { "max_pool2d": { "kernel": 1, "stride": 1 } },
        "gelu", { "max_pool2d": { "kernel": 1, "stride": 1 } },
        "sigmoid", { "max_pool2d": { "kernel": 1, "stride": 1 } },
        "flatten", { "dense": 5 }, "relu", { "dense": 3 }
    ]);
    let a = arch(layers, 256, Some([1, 16, 16]), 3);
    let Body::Layers { input, layers: specs, .. } = &a.body else { unreachable!("a stack") };
    let fused = a.stack().unwrap();
    let mut tensors = 0;
    let written = Stack { input: *input, nodes: resolve_as_written(*input, specs, "model.layers", "", &mut tensors).unwrap(), tensors };
    let kinds: Vec<String> = fused.nodes.iter().map(|n| match &n.layer {
        AnyLayer::MaxPool2d(m) => format!("pool{}", if m.relu_after { "+floor" } else { "" }),
        AnyLayer::Act(x) => x.act.name().to_string(),
        AnyLayer::Conv2d(_) => "conv".into(),
        AnyLayer::Dense(_) => "dense".into(),
        AnyLayer::Flatten(_) => "flatten".into(),
        other => panic!("unexpected {other:?}"),
    }).collect();
    assert_eq!(kinds, ["conv", "pool", "tanh", "conv", "pool+floor", "relu", "conv", "pool", "leaky_relu", "conv", "leaky_relu", "pool", "gelu", "pool", "pool", "sigmoid", "flatten", "dense", "relu", "dense"]);
    assert_eq!(fused.torch_description(), written.torch_description());
    assert!(fused.torch_description().starts_with("Sequential(Conv2d(1, 3, 3, stride=1, padding=1), Tanh(), MaxPool2d(2, stride=2), Conv2d(3, 3, 3, stride=1, padding=1), ReLU(), MaxPool2d(2, stride=2), "), "{}", fused.torch_description());
    assert_eq!(fused.param_specs(), written.param_specs());
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let p = a.init(3);
    let p = Params { specs: p.specs.clone(), data: p.data.iter().map(|d| d.iter().map(|v| v + 0.1 * rng.gen_range(-1.0..1.0)).collect()).collect() };
    let (n, k) = (5, 3);
    let x = sample_rows(&fused, n, &mut rng);
    assert_eq!(fused.forward(&p.data, &x), written.forward(&p.data, &x), "the same numbers bit for bit");
    let mut dy = vec![0.0; n * k * k];
    (0..n * k).for_each(|r| dy[r * k + r % k] = 1.0);
    let jac = |st: &Stack| {
        let (_, caches) = st.forward_cached(&p.data, &x);
        dense_jacobian(&p.specs, &st.backward(&p.data, &caches, dy.clone(), k), n, k)
    };
    assert!(rel_diff(&jac(&fused), &jac(&written)) <= 1e-15);
    let dir: Vec<Vec<f64>> = p.data.iter().map(|t| t.iter().map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
    let ((y, yd), (y2, yd2)) = (fused.tangent(&p.data, &dir, &x), written.tangent(&p.data, &dir, &x));
    assert_eq!(y, y2);
    assert!(rel_diff(&yd, &yd2) <= 1e-15);
    // And against autodiff, as every stack.
    assert!(check(&a, 4, 11) < 1e-12);
}

#[test]
fn a_convolution_behind_a_max_pool_takes_its_gradients_from_the_winners() {
    // A first convolution with a max-pool right after it (a ReLU written ahead of the pool runs
    // after it): its gradients come from the pool's sensitivities and winners
    // (`Layer::grads_behind_max_pool`), with the winners' patches shared by consecutive rows of
    // one sample that pick the same winners. Against the written-out walk: the pool's scatter
    // into a full-size cotangent, then the convolution's own backward over every position.
    for (layers, image) in [
        (json!([{ "conv2d": { "channels": 3, "kernel": 3, "padding": 1 } }, "relu", { "max_pool2d": 2 }, "flatten", { "dense": 3 }]), [2, 8, 8]),
        // Overlapping windows (an entry can win two), no bias, a stride.
        (json!([{ "conv2d": { "channels": 2, "kernel": 3, "stride": 2, "padding": 1, "bias": false } }, { "max_pool2d": { "kernel": 3, "stride": 1 } }, "tanh", "flatten", { "dense": 4 }, "relu", { "dense": 3 }]), [1, 9, 9]),
    ] {
        let d = image.iter().product();
        let a = arch(layers, d, Some(image), 3);
        let st = a.stack().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let w: Vec<Vec<f64>> = a.init(4).data.iter().map(|v| v.iter().map(|x| x + 0.1 * rng.gen_range(-1.0..1.0)).collect()).collect();
        let dw: Vec<Vec<f64>> = w.iter().map(|v| v.iter().map(|_| 0.5 * rng.gen_range(-1.0..1.0)).collect()).collect();
        // Samples 0 = 1 = 2 (t 0, 0, 1: the first two share their winners), 3 = 4 (t 0.3, 0.6).
        let t = [0.0, 0.0, 1.0, 0.3, 0.6];
        let (n, k) = (t.len(), 3);
        let mut x = sample_rows(&st, n, &mut rng);
        repeat_samples(&mut x, d, &[(0, 1), (0, 2), (3, 4)]);
        let at = At { w: &w, dw: Some(&dw), t: Some(&t) };
        let (_, caches) = st.forward_cached_at(&at, x.clone());
        let Cache::Arg(arg) = &caches[1] else { panic!("the pool runs right after the convolution") };
        let on = arg.len() / n;
        assert_eq!(arg[..on], arg[on..2 * on], "rows 0 and 1 pick the same winners");
        let seeds: Vec<f64> = (0..n * k * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let fast = st.backward_at(&at, &caches, seeds.clone(), k);
        let mut slow = Vec::new();
        let mut dy = seeds;
        for (j, (node, cache)) in st.nodes.iter().zip(&caches).enumerate().rev() {
            dy = node.layer.backward(node.first, &at, cache, dy, k, j > 0, &mut slow);
        }
        slow.sort_by_key(|g| g.0);
        let (jf, js) = (dense_jacobian(&a.param_specs(), &fast, n, k), dense_jacobian(&a.param_specs(), &slow, n, k));
        assert!(js.iter().fold(0.0f64, |m, v| m.max(v.abs())) > 1e-3, "a trivial Jacobian");
        assert!(rel_diff(&jf, &js) <= 1e-14, "{}: the winners' gradients differ from the dense walk's by {:e}", st.torch_description(), rel_diff(&jf, &js));
        assert!(check(&a, 4, 3) < 1e-12);
    }
}

#[test]
fn bad_stacks_are_refused_with_the_layer_named() {
    let parse = |layers: serde_json::Value| -> String {
        let text = format!("kind = \"layers\"\nlayers = {}\n", inline(&layers));
        match toml::from_str::<ModelConfig>(&text) {
            Err(e) => e.to_string(),
            Ok(cfg) => cfg.resolve(784, Some([1, 28, 28]), 10, OutputKind::LogSoftmax).err().map(|e| e.to_string()).unwrap_or_default(),
        }
    };
    let e = parse(json!(["flatten", { "dense": 10 }, "batch_norm"]));
    assert!(e.contains("model.layers[2]") && e.contains("batch norm") && e.contains("batch"), "{e}");
    let e = parse(json!([{ "conv2d": { "channels": 4, "kernel": 3 } }, "dropout", "flatten", { "dense": 10 }]));
    assert!(e.contains("model.layers[1]") && e.contains("dropout"), "{e}");
    let e = parse(json!([{ "conv2d": { "channels": 4, "kernel": 3 } }, { "dense": 10 }]));
    assert!(e.contains("model.layers[1] dense(10)") && e.contains("[4, 26, 26]") && e.contains("flatten"), "{e}");
    let e = parse(json!(["flatten", { "conv2d": { "channels": 4, "kernel": 3 } }]));
    assert!(e.contains("model.layers[1] conv2d") && e.contains("[784]"), "{e}");
    let e = parse(json!(["flatten", { "dense": 12 }]));
    assert!(e.contains("[12]") && e.contains("[10]"), "{e}");
    let e = parse(json!([{ "conv2d": { "channels": 4, "kernel": 30 } }, "flatten", { "dense": 10 }]));
    assert!(e.contains("does not fit"), "{e}");
    let e = parse(json!(["flatten", { "dense": 10 }, "swish"]));
    assert!(e.contains("unknown layer `swish`"), "{e}");
    let e = parse(json!(["flatten", { "dense": { "features": 10, "bais": false } }]));
    assert!(e.contains("no option `bais`"), "{e}");
    let e = parse(json!(["flatten", { "residual": [{ "dense": 5 }] }, { "dense": 10 }]));
    assert!(e.is_empty(), "a projecting flat residual is fine: {e}");
    // PyTorch's floor on pool sizes: 13×13 pooled by 2 gives 6×6.
    let e = parse(json!([{ "conv2d": { "channels": 2, "kernel": 3, "stride": 2 } }, { "max_pool2d": 2 }, "flatten", { "dense": 10 }]));
    assert!(e.is_empty(), "{e}");
}

/// A stack without parameters is refused where it is configured (it would train nothing and
/// has no kernel), and PyTorch's printout of a layer norm keeps a non-default eps.
#[test]
fn parameterless_stacks_are_refused_and_eps_is_printed() {
    let text = "kind = \"layers\"\nlayers = [\"tanh\"]\n";
    let cfg: ModelConfig = toml::from_str(text).unwrap();
    let e = cfg.resolve(3, None, 3, OutputKind::LogSoftmax).unwrap_err().to_string();
    assert!(e.contains("no parameters") && !e.contains('\n'), "{e}");
    let a = arch(json!([{ "dense": 16 }, { "layer_norm": { "eps": 0.5 } }, { "dense": 3 }]), 4, None, 3);
    let printed = a.stack().unwrap().torch_description();
    assert!(printed.contains("LayerNorm(16, eps=0.5)"), "{printed}");
    let a = arch(json!([{ "dense": 16 }, "layer_norm", { "dense": 3 }]), 4, None, 3);
    assert!(a.stack().unwrap().torch_description().contains("LayerNorm(16),"));
}

/// A max-pool window's margins (each entry against the best of the rest, ties to the first)
/// equal their definition taken entry by entry, on windows with ties and overlaps.
#[test]
fn max_pool_margins_equal_their_definition() {
    let pool = pool::Pool { c: 2, h: 5, w: 5, k: 3, stride: 2, ho: 2, wo: 2 };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    // Values from a small set, so that windows tie.
    let x: Vec<f64> = (0..2 * 50).map(|_| f64::from(rng.gen_range(0..4u8))).collect();
    let xd: Vec<f64> = (0..2 * 50).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut got = Vec::new();
    pool.max_margins(&x, &xd, &mut got);
    let mut want = Vec::new();
    for s in 0..2 {
        let (xs, ds) = (&x[s * 50..(s + 1) * 50], &xd[s * 50..(s + 1) * 50]);
        for c in 0..2 {
            for oy in 0..2 {
                for ox in 0..2 {
                    let win: Vec<usize> = pool.window(c, oy, ox).collect();
                    for &q in &win {
                        let rest = win.iter().copied().filter(|&r| r != q).fold(usize::MAX, |b, r| if b == usize::MAX || xs[r] > xs[b] { r } else { b });
                        want.push((xs[q] - xs[rest], ds[q] - ds[rest]));
                    }
                }
            }
        }
    }
    assert_eq!(got, want);
}

/// The per-row points of a step (`w + t_s·Δw` per sample, formed as `W·x + t_s·(ΔW·x)` per
/// layer) equal each sample run alone at its own weights: forward values, per-sample
/// gradients and tangents, on every layer kind with parameters (dense, conv2d, layer norm,
/// residual projections), with some samples at t = 0 and some repeated times.
#[test]
fn per_row_times_equal_each_row_at_its_own_weights() {
    let stacks: Vec<(serde_json::Value, usize, Option<[usize; 3]>)> = vec![
        (json!([{ "dense": 6 }, "gelu", "layer_norm", { "dense": 5 }, "relu", { "residual": [{ "dense": 4 }, "tanh"] }, { "dense": 3 }]), 5, None),
        (json!([{ "conv2d": { "channels": 3, "kernel": 3, "stride": 2, "padding": 1 } }, "silu", { "max_pool2d": 2 }, "layer_norm",
                { "residual": [{ "conv2d": { "channels": 4, "kernel": 3, "padding": 1 } }, "relu"] }, { "avg_pool2d": 1 }, "flatten", { "dense": 3 }]), 2 * 9 * 8, Some([2, 9, 8])),
        // Token sequences (`d` = T = 4 ids from a vocabulary of 9): embedding, both attentions.
        (json!([{ "embedding": { "vocab": 9, "dim": 6, "scale": "sqrt_dim" } }, { "self_attention": { "heads": 2, "shared_qkv": true } }, "last_token",
                { "residual": [{ "dense": 7 }, "relu", { "dense": 6 }, "relu"] }, { "dense": { "features": 3, "bias": false } }]), 4, None),
        (json!([{ "embedding": { "vocab": 9, "dim": 6, "positions": true } }, { "self_attention": { "heads": 2, "head_dim": 4, "bias": true, "causal": true } }, "gelu", "layer_norm",
                { "residual": [{ "self_attention": { "heads": 3 } }] }, "last_token", { "dense": 3 }]), 4, None),
        (json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 2, "bias": true, "causal": true, "layout": "packed" } }, "gelu",
                { "residual": [{ "self_attention": { "heads": 3, "layout": "packed" } }] }, "last_token", { "dense": 3 }]), 4, None),
        // Dense layers at every position (their rows combined by each sample's t over T rows).
        (json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "dense": 5 }, "relu", { "residual": ["layer_norm", { "dense": 7 }, "relu", { "dense": 4 }] },
                { "self_attention": 2 }, "last_token", { "dense": 3 }]), 4, None),
    ];
    // Repeated samples too (a point's node rows share its input: a convolution forms their
    // patches once and stacks their `W(t_s)`), with runs at different and at equal times.
    for ((layers, d, image), dup) in stacks.iter().flat_map(|s| [(s.clone(), false), (s.clone(), true)]) {
        let a = if layers[0].get("embedding").is_some() { token_arch(layers, d, 9, 3) } else { arch(layers, d, image, 3) };
        let st = a.stack().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let w: Vec<Vec<f64>> = a.init(2).data.iter().map(|v| v.iter().map(|x| x + 0.1 * rng.gen_range(-1.0..1.0)).collect()).collect();
        let dw: Vec<Vec<f64>> = w.iter().map(|v| v.iter().map(|_| 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect();
        let t = if dup { [0.0, 0.25, 0.7, 0.7, 1.0] } else { [0.0, 0.25, 0.7, 0.25, 1.0] };
        let n = t.len();
        let k = 3;
        let mut x = sample_rows(&st, n, &mut rng);
        if dup {
            // Samples 0 = 1 (different times), 2 = 3 = 4 (two at the same time).
            repeat_samples(&mut x, d, &[(0, 1), (2, 3), (2, 4)]);
        }
        let at = At { w: &w, dw: Some(&dw), t: Some(&t) };
        let (y, caches) = st.forward_cached_at(&at, x.clone());
        let seeds: Vec<f64> = (0..n * k * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let grads = st.backward_at(&at, &caches, seeds.clone(), k);
        let jac = dense_jacobian(&a.param_specs(), &grads, n, k);
        let (y2, yd) = st.tangent_at(&at, x.clone());
        let width = jac.len() / (n * k);
        let mut worst: f64 = 0.0;
        for s in 0..n {
            let ws: Vec<Vec<f64>> = w.iter().zip(&dw).map(|(a, b)| a.iter().zip(b).map(|(u, v)| u + t[s] * v).collect()).collect();
            let xs = &x[s * d..(s + 1) * d];
            let (ys, cs) = st.forward_cached(&ws, xs);
            let gs = st.backward(&ws, &cs, seeds[s * k * k..(s + 1) * k * k].to_vec(), k);
            let js = dense_jacobian(&a.param_specs(), &gs, 1, k);
            let (_, yds) = st.tangent(&ws, &dw, xs);
            worst = worst.max(rel_diff(&y[s * k..(s + 1) * k], &ys));
            worst = worst.max(rel_diff(&y2[s * k..(s + 1) * k], &ys));
            worst = worst.max(rel_diff(&jac[s * k * width..(s + 1) * k * width], &js));
            worst = worst.max(rel_diff(&yd[s * k..(s + 1) * k], &yds));
        }
        assert!(worst < 1e-13, "{} (repeated samples: {dup}): per-row points differ by {worst:e}", st.torch_description());
    }
}

/// The sequence stacks: ExPLAIND's block and its variants (separate q/k/v, biases, causal
/// masks, heads that do not divide the width with `head_dim`, attention inside a residual,
/// activations and flatten on sequences).
fn sequence_stacks() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("embedding", json!([{ "embedding": { "vocab": 9, "dim": 5, "scale": 2.5 } }, "last_token", { "dense": 3 }])),
        ("positions", json!([{ "embedding": { "vocab": 9, "dim": 6, "scale": 1.5, "positions": true } }, { "self_attention": { "heads": 2, "causal": true } }, "mean_tokens", { "dense": 3 }])),
        ("explaind block", json!([{ "embedding": { "vocab": 9, "dim": 8, "scale": "sqrt_dim" } }, { "self_attention": { "heads": 2, "shared_qkv": true } }, "last_token",
            { "residual": [{ "dense": 16 }, "relu", { "dense": 8 }, "relu"] }, { "dense": { "features": 3, "bias": false } }])),
        ("separate qkv, bias", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 3, "bias": true } }, "last_token", { "dense": 3 }])),
        ("causal, head_dim", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 4, "head_dim": 2, "causal": true, "shared_qkv": true } }, "tanh", "flatten", { "dense": 3 }])),
        ("residual attention", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "residual": [{ "self_attention": { "heads": 2, "bias": true } }, "gelu"] },
            { "self_attention": 1 }, "last_token", { "dense": 3 }])),
        ("pre-norm block", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "residual": ["layer_norm", { "self_attention": { "heads": 2, "causal": true } }] },
            "layer_norm", "last_token", { "dense": 3 }])),
        ("mean_tokens", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 2, "causal": true } }, "mean_tokens", "relu", { "dense": 3 }])),
        // nn.MultiheadAttention's tensors: one in- and one out-projection, one output bias.
        ("packed, bias", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 3, "bias": true, "layout": "packed" } }, "last_token", { "dense": 3 }])),
        ("packed pre-norm transformer block", json!([{ "embedding": { "vocab": 9, "dim": 6, "positions": true } },
            { "residual": ["layer_norm", { "self_attention": { "heads": 2, "bias": true, "causal": true, "layout": "packed" } }] },
            "last_token", { "residual": ["layer_norm", { "dense": 8 }, "relu", { "dense": 6 }] }, { "dense": 3 }])),
        ("packed, no bias", json!([{ "embedding": { "vocab": 9, "dim": 4 } }, { "self_attention": { "heads": 1, "layout": "packed" } }, "mean_tokens", { "dense": 3 }])),
        // Dense layers at every position: a pre-norm transformer block's MLP, a projection
        // without bias, and a residual whose body changes the width (a position-wise shortcut).
        ("position-wise MLP", json!([{ "embedding": { "vocab": 9, "dim": 6, "positions": true } },
            { "residual": ["layer_norm", { "self_attention": { "heads": 2, "bias": true, "causal": true, "layout": "packed" } }] },
            { "residual": ["layer_norm", { "dense": 8 }, "relu", { "dense": 6 }] }, "mean_tokens", { "dense": 3 }])),
        ("position-wise projection", json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "dense": { "features": 4, "bias": false } }, "gelu",
            { "residual": [{ "dense": 5 }, "tanh"] }, { "self_attention": 1 }, "mean_tokens", { "dense": 3 }])),
    ]
}

#[test]
fn sequence_layers_match_autodiff() {
    for (name, layers) in sequence_stacks() {
        let a = token_arch(layers, 4, 9, 3);
        let e = check(&a, 3, 11);
        eprintln!("{name}: {e:e}");
        assert!(e < 1e-12, "{name}: largest relative difference {e:e}");
        // The forward values against dfdx's.
        let p = a.init(4);
        let st = a.stack().unwrap();
        let x = sample_rows(&st, 5, &mut ChaCha8Rng::seed_from_u64(5));
        let dev = dfdx::tensor::Cpu::default();
        use dfdx::tensor::TensorFromVec;
        let y = net::raw_forward(&a, &crate::model::tensors::upload(&dev, &p), dev.tensor_from_vec(x.clone(), (5, 4))).as_vec();
        let e = rel_diff(&st.forward(&p.data, &x), &y);
        assert!(e < 1e-13, "{name}: forward vs dfdx {e:e}");
    }
}

/// The per-sample gradients (backward pass) against central differences of the forward pass in
/// every parameter, and the tangent against central differences along a random direction.
#[test]
fn sequence_layers_match_finite_differences() {
    for (name, layers) in sequence_stacks() {
        let a = token_arch(layers, 4, 9, 3);
        let st = a.stack().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let w: Vec<Vec<f64>> = a.init(3).data.iter().map(|v| v.iter().map(|x| x + 0.1 * rng.gen_range(-1.0..1.0)).collect()).collect();
        let (n, k) = (2, 3);
        let x = sample_rows(&st, n, &mut rng);
        let (_, caches) = st.forward_cached(&w, &x);
        let mut seeds = vec![0.0; n * k * k];
        for s in 0..n {
            for c in 0..k {
                seeds[(s * k + c) * k + c] = 1.0;
            }
        }
        let jac = dense_jacobian(&a.param_specs(), &st.backward(&w, &caches, seeds, k), n, k);
        let width = jac.len() / (n * k);
        let h = 1e-5;
        let mut fd = vec![0.0; jac.len()];
        let mut col = 0;
        for i in 0..w.len() {
            for j in 0..w[i].len() {
                let mut wp = w.clone();
                wp[i][j] += h;
                let mut wm = w.clone();
                wm[i][j] -= h;
                let (yp, ym) = (st.forward(&wp, &x), st.forward(&wm, &x));
                for r in 0..n * k {
                    fd[r * width + col] = (yp[r] - ym[r]) / (2.0 * h);
                }
                col += 1;
            }
        }
        let e_back = rel_diff(&jac, &fd);
        assert!(e_back < 1e-7, "{name}: backward vs central differences {e_back:e}");
        let dir: Vec<Vec<f64>> = w.iter().map(|v| v.iter().map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
        let (_, yd) = st.tangent(&w, &dir, &x);
        let step = |sign: f64| -> Vec<Vec<f64>> { w.iter().zip(&dir).map(|(a, b)| a.iter().zip(b).map(|(u, v)| u + sign * h * v).collect()).collect() };
        let (yp, ym) = (st.forward(&step(1.0), &x), st.forward(&step(-1.0), &x));
        let fd: Vec<f64> = yp.iter().zip(&ym).map(|(p, m)| (p - m) / (2.0 * h)).collect();
        let e = rel_diff(&yd, &fd);
        assert!(e < 1e-7, "{name}: tangent vs central differences {e:e}");
        eprintln!("{name}: central differences: backward {e_back:e}, tangent {e:e}");
    }
}

/// ExPLAIND's names and order: the embedding, every head's encoder, every head's decoder.
#[test]
fn attention_tensors_carry_explainds_names() {
    let a = token_arch(json!([{ "embedding": { "vocab": 9, "dim": 8, "scale": "sqrt_dim" } }, { "self_attention": { "heads": 2, "shared_qkv": true } }, "last_token", { "dense": { "features": 9, "bias": false } }]), 4, 9, 9);
    assert!(a.stack().unwrap().torch_description().starts_with("Sequential(ScaledEmbedding(9, 8, scale=2.8284271247461903), "));
    let names: Vec<(String, Vec<usize>)> = a.param_specs().into_iter().map(|s| (s.name, s.shape)).collect();
    let want = [("0.weight", vec![9, 8]), ("1.head1_encoder.weight", vec![4, 8]), ("1.head2_encoder.weight", vec![4, 8]), ("1.head1_decoder.weight", vec![8, 4]), ("1.head2_decoder.weight", vec![8, 4]), ("3.weight", vec![9, 8])];
    assert_eq!(names, want.iter().map(|(n, s)| (n.to_string(), s.clone())).collect::<Vec<_>>());
    let a = token_arch(json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 1, "bias": true } }, "last_token", { "dense": 3 }]), 4, 9, 3);
    let names: Vec<String> = a.param_specs().into_iter().map(|s| s.name).collect();
    assert_eq!(&names[1..9], ["1.head1_query.weight", "1.head1_query.bias", "1.head1_key.weight", "1.head1_key.bias", "1.head1_value.weight", "1.head1_value.bias", "1.head1_decoder.weight", "1.head1_decoder.bias"]);
    // One gradient per parameter layer (the engine pairs them with the name-grouped layers).
    let st = a.stack().unwrap();
    let p = a.init(1);
    let x = [1.0, 2.0, 3.0, 8.0];
    let (_, caches) = st.forward_cached(&p.data, &x);
    let grads = st.backward(&p.data, &caches, vec![1.0; 9], 3);
    let layers = crate::model::param_layers(&p.specs);
    assert_eq!(grads.iter().map(|g| g.0).collect::<Vec<_>>(), layers.iter().map(|l| l.tensors.start).collect::<Vec<_>>());
    let printed = st.torch_description();
    assert!(printed.starts_with("Sequential(Embedding(9, 6), SelfAttention(6, heads=1, head_dim=6, shared_qkv=False, bias=True, causal=False), LastToken()"), "{printed}");
}

/// `layout = "packed"`: PyTorch's `nn.MultiheadAttention` names and shapes under `attn`, two
/// parameter layers (`1.attn`: the in-projection's weight and bias; `1.attn.out_proj`), one
/// gradient each; the same function as the per-head layout with head h's maps cut out of the
/// packed tensors and the output bias on head 1 only; PyTorch's initialisation.
#[test]
fn packed_attention_carries_pytorchs_names_and_is_the_per_head_function() {
    let packed = json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 2, "bias": true, "causal": true, "layout": "packed" } }, "last_token", { "dense": 3 }]);
    let a = token_arch(packed, 4, 9, 3);
    let names: Vec<(String, Vec<usize>)> = a.param_specs().into_iter().map(|s| (s.name, s.shape)).collect();
    let want = [("1.attn.in_proj_weight", vec![18, 6]), ("1.attn.in_proj_bias", vec![18]), ("1.attn.out_proj.weight", vec![6, 6]), ("1.attn.out_proj.bias", vec![6])];
    assert_eq!(&names[1..5], want.iter().map(|(n, s)| (n.to_string(), s.clone())).collect::<Vec<_>>());
    let st = a.stack().unwrap();
    assert!(st.torch_description().contains("MHSelfAttention(6, num_heads=2, bias=True, causal=True)"), "{}", st.torch_description());
    let p = a.init(1);
    let layers = crate::model::param_layers(&p.specs);
    assert_eq!(layers.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["0", "1.attn", "1.attn.out_proj", "3"]);
    let x = [1.0, 2.0, 3.0, 8.0];
    let (_, caches) = st.forward_cached(&p.data, &x);
    let grads = st.backward(&p.data, &caches, vec![1.0; 9], 3);
    assert_eq!(grads.iter().map(|g| g.0).collect::<Vec<_>>(), layers.iter().map(|l| l.tensors.start).collect::<Vec<_>>());
    // PyTorch's initialisation: Xavier-uniform in-projection, zero biases.
    let bound = (6.0f64 / 24.0).sqrt();
    assert!(p.data[1].iter().all(|v| v.abs() <= bound) && p.data[1].iter().any(|v| v.abs() > 1.0 / 6f64.sqrt()));
    assert!(p.data[2].iter().chain(&p.data[4]).all(|&v| v == 0.0));
    // The per-head stack with head h's query/key/value rows and decoder columns cut out of the
    // packed tensors, the output bias on head 1 and zero on head 2: the same network.
    let heads = token_arch(json!([{ "embedding": { "vocab": 9, "dim": 6 } }, { "self_attention": { "heads": 2, "bias": true, "causal": true } }, "last_token", { "dense": 3 }]), 4, 9, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let w: Vec<Vec<f64>> = p.data.iter().map(|v| v.iter().map(|x| x + 0.2 * rng.gen_range(-1.0..1.0)).collect()).collect();
    let (d, dh) = (6, 3);
    let mut hw = vec![w[0].clone()];
    for h in 0..2 {
        for which in 0..3 {
            let row = which * d + h * dh;
            hw.push(w[1][row * d..(row + dh) * d].to_vec());
            hw.push(w[2][row..row + dh].to_vec());
        }
    }
    for h in 0..2 {
        hw.push((0..d).flat_map(|r| w[3][r * d + h * dh..r * d + (h + 1) * dh].to_vec()).collect());
        hw.push(if h == 0 { w[4].clone() } else { vec![0.0; d] });
    }
    hw.extend_from_slice(&w[5..]);
    assert_eq!(hw.iter().map(Vec::len).collect::<Vec<_>>(), heads.param_specs().iter().map(|s| s.numel()).collect::<Vec<_>>());
    let xs = sample_rows(&st, 5, &mut rng);
    let e = rel_diff(&st.forward(&w, &xs), &heads.stack().unwrap().forward(&hw, &xs));
    assert!(e < 1e-14, "packed vs per head: {e:e}");
}

#[test]
fn bad_sequence_stacks_are_one_line_config_errors() {
    let resolve = |layers: serde_json::Value, input: Shape| -> String {
        let text = format!("kind = \"layers\"\nlayers = {}\n", inline(&layers));
        match toml::from_str::<ModelConfig>(&text) {
            Err(e) => e.to_string(),
            Ok(cfg) => cfg.resolve_on(input, 3, OutputKind::LogSoftmax).err().map(|e| e.to_string()).unwrap_or_default(),
        }
    };
    let tokens = Shape::Tokens(4, 9);
    let emb = json!({ "embedding": { "vocab": 9, "dim": 8 } });
    for (layers, input, needles) in [
        (json!([emb, { "self_attention": 3 }, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[1]", "3 heads do not divide the width 8", "head_dim"]),
        (json!([{ "self_attention": 2 }, { "dense": 3 }]), Shape::Flat(8), vec!["model.layers[0]", "needs a sequence", "[8]"]),
        (json!([{ "dense": 8 }, emb, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[0] dense(8)", "token ids are not features", "embedding"]),
        (json!(["relu", emb, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[0] relu", "first layer must be an \"embedding\""]),
        (json!([emb, "last_token", { "dense": 3 }]), Shape::Flat(4), vec!["model.layers[0] embedding(9, 8)", "needs token ids"]),
        (json!([{ "embedding": { "vocab": 5, "dim": 8 } }, "last_token", { "dense": 3 }]), tokens, vec!["0..9", "vocabulary of 5"]),
        (json!([emb, { "dense": 3 }]), tokens, vec!["[4, 3]", "last_token"]),
        (json!(["layer_norm", emb, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[0] layer_norm", "token ids", "embedding"]),
        (json!([emb, { "self_attention": 2 }]), tokens, vec!["[4, 8]", "last_token"]),
        (json!(["flatten", "last_token", { "dense": 3 }]), Shape::Flat(8), vec!["model.layers[1] last_token", "needs a sequence"]),
        (json!([emb, "mean_tokens", "mean_tokens", { "dense": 3 }]), tokens, vec!["model.layers[2] mean_tokens", "needs a sequence", "[8]"]),
        (json!([emb, { "self_attention": { "heads": 2, "mask": true } }, "last_token", { "dense": 3 }]), tokens, vec!["no option `mask`"]),
        (json!([emb, { "self_attention": { "heads": 2, "layout": "torch" } }, "last_token", { "dense": 3 }]), tokens, vec!["self_attention.layout", "\"packed\"", "\"torch\""]),
        (json!([emb, { "self_attention": { "heads": 2, "shared_qkv": true, "layout": "packed" } }, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[1]", "shared_qkv"]),
        (json!([emb, { "self_attention": { "heads": 2, "head_dim": 3, "layout": "packed" } }, "last_token", { "dense": 3 }]), tokens, vec!["model.layers[1]", "2 heads of width 3", "layout = \"heads\""]),
        (json!([emb, { "self_attention": { "heads": 3, "layout": "packed" } }, "last_token", { "dense": 3 }]), tokens, vec!["3 heads do not divide the width 8"]),
        (json!([{ "embedding": { "vocab": 9, "dim": 8, "scale": "sqrt" } }, "last_token", { "dense": 3 }]), tokens, vec!["embedding.scale"]),
    ] {
        let e = resolve(layers.clone(), input);
        assert!(!e.is_empty() && !e.trim_end().contains('\n'), "{layers}: {e:?}");
        for n in needles {
            assert!(e.contains(n), "{layers}: `{n}` not in {e}");
        }
    }
    // An MLP on token ids, and token ids outside the vocabulary at the network's front door.
    let e = ModelConfig::default().resolve_on(tokens, 3, OutputKind::LogSoftmax).unwrap_err().to_string();
    assert!(e.contains("token sequences") && e.contains("embedding"), "{e}");
    let a = token_arch(json!([emb, "last_token", { "dense": 3 }]), 4, 9, 3);
    let p = a.init(0);
    assert!(a.forward(&p, None, &[0.0, 8.0, 3.0, 1.0]).is_ok());
    for bad in [9.0, -1.0, 2.5, f64::NAN] {
        let e = a.forward(&p, None, &[0.0, 1.0, bad, 1.0]).unwrap_err().to_string();
        assert!(e.contains("position 2") && e.contains("not a token id in 0..9"), "{e}");
    }
}
