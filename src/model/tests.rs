use super::*;

fn mlp(hidden: Vec<usize>, zero_last: bool) -> Architecture {
    ModelConfig::Mlp { hidden, activation: Activation::Relu, bias: true, zero_last, alpha: 1.0, zero_output: false }
        .resolve(3, None, 2, OutputKind::LogSoftmax)
        .unwrap()
}

#[test]
fn specs_and_flat_round_trip() {
    let a = mlp(vec![4, 5], false);
    let p = a.init(1);
    let names: Vec<_> = p.specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "layers.2.weight", "layers.2.bias"]);
    assert_eq!(p.specs[2].shape, vec![5, 4]);
    assert_eq!(p.numel(), 3 * 4 + 4 + 4 * 5 + 5 + 5 * 2 + 2);
    let q = Params::from_flat(p.specs.clone(), &p.flat()).unwrap();
    assert_eq!(p, q);
    assert!(Params::from_flat(p.specs.clone(), &[1.0]).is_err());
}

#[test]
fn zero_last_gives_constant_log_uniform_output() {
    let a = mlp(vec![7], true);
    let p = a.init(3);
    let x = [0.3, -1.0, 2.0, 5.0, 1.0, -2.0];
    let f = a.forward(&p, None, &x).unwrap();
    for v in f {
        assert!((v - (0.5f64).ln()).abs() < 1e-15);
    }
    let a2 = mlp(vec![7], false);
    let f2 = a2.forward(&a2.init(3), None, &x).unwrap();
    assert!((f2[0] - f2[2]).abs() > 1e-6);
}

#[test]
fn zero_output_and_alpha() {
    let mut a = mlp(vec![6], false);
    a.zero_output = true;
    a.alpha = 3.0;
    a.output = OutputKind::Identity;
    let p0 = a.init(5);
    let x = [0.3, -1.0, 2.0];
    assert!(a.forward(&p0, None, &x).is_err());
    let f0 = a.forward(&p0, Some(&p0), &x).unwrap();
    assert!(f0.iter().all(|v| *v == 0.0));
    let mut p1 = p0.clone();
    p1.data[3][0] += 0.5; // last bias, output 0
    let g0 = a.raw_forward(&p0, &x);
    let g1 = a.raw_forward(&p1, &x);
    let f1 = a.forward(&p1, Some(&p0), &x).unwrap();
    assert!((f1[0] - 3.0 * (g1[0] - g0[0])).abs() < 1e-14);
    assert!((g1[0] - g0[0]).abs() > 1e-6);
}

#[test]
fn invalid_configs() {
    let bad = ModelConfig::Mlp { hidden: vec![3, 0], activation: Activation::Tanh, bias: true, zero_last: true, alpha: 1.0, zero_output: false };
    assert!(bad.validate().unwrap_err().to_string().contains("hidden[1]"));
    let cnn = ModelConfig::Cnn { channels: 4, kernel: 5, stride: 1, padding: 0, pool: 2, activation: Activation::Relu, bias: true, zero_last: true, alpha: 1.0, zero_output: false };
    assert!(cnn.resolve(784, None, 10, OutputKind::LogSoftmax).is_err());
    let arch = cnn.resolve(784, Some([1, 28, 28]), 10, OutputKind::LogSoftmax).unwrap();
    let specs = arch.param_specs();
    assert_eq!(specs[2].shape, vec![10, 4 * 12 * 12]);
    let cnn3 = ModelConfig::Cnn { channels: 4, kernel: 4, stride: 1, padding: 0, pool: 2, activation: Activation::Relu, bias: true, zero_last: true, alpha: 1.0, zero_output: false };
    assert!(cnn3.resolve(784, Some([1, 28, 28]), 10, OutputKind::LogSoftmax).unwrap_err().to_string().contains("pool"));
}

/// Token rows (the `modular` data) are the input `[T]` of a layer stack; an MLP or a CNN
/// refuses them in one line, and token ids outside the vocabulary are refused by the data.
#[test]
fn token_rows_resolve_only_as_a_layer_stack() {
    let ds = crate::data::DataConfig::Modular { p: 5, op: crate::data::ModOp::Add, train_frac: 0.5, seed: 0 }.load(std::path::Path::new(".")).unwrap();
    assert_eq!(input_shape(&ds), layers::Shape::Tokens(4, 7));
    for cfg in [ModelConfig::default(), toml::from_str("kind = \"cnn\"").unwrap()] {
        let e = cfg.resolve_for(&ds, OutputKind::LogSoftmax).unwrap_err().to_string();
        assert!(e.contains("token sequences") && e.contains("\"layers\"") && !e.contains('\n'), "{e}");
    }
    let mut bad = ds.clone();
    bad.x_test[5] = 7.0;
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("x_test[1, 1] = 7 is not a token id in 0..7"), "{e}");
}
