//! The device program on the host backend against the CPU engine: every kernel of
//! `kernels/epk.cu` and every lowered layer kind, on stacks that use them all.

use rand::{Rng, SeedableRng};

use super::host::Host;
use super::kernels::{Kernels, KERNELS};
use super::program::{DeviceGrad, Weights};
use super::{Backend, Gemm, Operand};
use crate::kernel::stack::step::{RowGrad, StackStep};
use crate::model::{Architecture, ModelConfig, OutputKind, Params};

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

fn arch(text: &str, dim: usize, image: Option<[usize; 3]>, k: usize, output: OutputKind) -> Architecture {
    let cfg: ModelConfig = toml::from_str(text).unwrap();
    cfg.resolve(dim, image, k, output).unwrap()
}

/// `max |a − b| / max(1, max |b|)`.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The program's per-row gradients on the host backend against `StackStep::block_grads`, at
/// rows whose times include 0, 1 and repeats of one point (a point's nodes), with and without a
/// step, with and without output offsets.
fn check(arch: &Architecture, seed: u64, tol: f64) {
    let mut r = rng(seed);
    let stack_arch = arch.as_stack().unwrap();
    let w0 = stack_arch.init(seed);
    let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.2 * r.gen_range(-1.0..1.0)).collect()).collect() };
    let d = stack_arch.input_dim();
    let k = stack_arch.outputs();
    let points = 3;
    let x: Vec<f64> = (0..points * d).map(|_| r.gen_range(-1.0..1.0)).collect();
    let off: Vec<f64> = (0..points * k).map(|_| r.gen_range(-0.5..0.5)).collect();
    let idx = [0usize, 0, 0, 1, 2, 2, 1];
    let times = [0.0, 0.25, 1.0, 0.6, 0.0, 0.9, 0.1];
    let program = stack_arch.device_program().unwrap();
    let be = Host;
    for (next, use_off) in [(Some(&w1), false), (Some(&w1), true), (None, false)] {
        let step = StackStep::new(&stack_arch, &w0, next).unwrap();
        let t: Vec<f64> = if next.is_some() { times.to_vec() } else { vec![0.0; idx.len()] };
        let want = step.cpu_block_grads(&x, use_off.then_some(off.as_slice()), &idx, &t, None);
        let wts = Weights::upload(&be, &w0.data, step.dir.as_deref()).unwrap();
        let xs: Vec<f64> = idx.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
        let os: Vec<f64> = idx.iter().flat_map(|&i| off[i * k..(i + 1) * k].iter().copied()).collect();
        let (got, f) = program.block_grads(&be, &wts, &be.upload(&t).unwrap(), be.upload(&xs).unwrap(), use_off.then_some(&os), idx.len()).unwrap();
        // The outputs against the network's forward pass at each row's point.
        for (row, (&i, &ti)) in idx.iter().zip(&t).enumerate() {
            let mut g = step.stack.forward(&step.params_at(ti), &x[i * d..(i + 1) * d]);
            if use_off {
                g.iter_mut().zip(&off[i * k..(i + 1) * k]).for_each(|(a, b)| *a -= b);
            }
            g.iter_mut().for_each(|v| *v *= stack_arch.alpha);
            if stack_arch.output == OutputKind::LogSoftmax {
                crate::model::log_softmax_rows(&mut g, k);
            }
            let e = rel(&f[row * k..(row + 1) * k], &g);
            assert!(e < tol, "row {row}: outputs differ by {e:e}");
        }
        assert_eq!(got.len(), want.len(), "parameter layers");
        for (l, (a, b)) in got.iter().zip(&want).enumerate() {
            match (a, b) {
                (DeviceGrad::Factor { acts, deltas, ne, out }, RowGrad::Factor { acts: wa, deltas: wd, ne: wne, out: wout }) => {
                    assert_eq!((ne, out), (wne, wout), "layer {l}: factor shapes");
                    let (ea, ed) = (rel(acts, wa), rel(deltas, wd));
                    assert!(ea < tol && ed < tol, "layer {l} (step {}, off {use_off}): acts {ea:e}, deltas {ed:e}", next.is_some());
                }
                (DeviceGrad::Formed { g, width }, RowGrad::Formed { g: wg, width: ww }) => {
                    assert_eq!(width, ww, "layer {l}: width");
                    let e = rel(g, wg);
                    assert!(e < tol, "layer {l} (step {}, off {use_off}): formed gradient {e:e}", next.is_some());
                }
                _ => panic!("layer {l}: a different gradient form"),
            }
        }
    }
}

#[test]
fn mlps_on_the_host_backend_equal_the_cpu_engine() {
    for (act, out) in [("relu", OutputKind::LogSoftmax), ("tanh", OutputKind::Identity)] {
        let text = format!("kind = \"mlp\"\nhidden = [7, 5]\nactivation = \"{act}\"\nzero_last = false\nalpha = {}", if act == "tanh" { 2.0 } else { 1.0 });
        check(&arch(&text, 6, None, 3, out), 1, 1e-13);
    }
}

#[test]
fn cnns_on_the_host_backend_equal_the_cpu_engine() {
    let text = "kind = \"cnn\"\nchannels = 3\nkernel = 3\nzero_last = false";
    check(&arch(text, 64, Some([1, 8, 8]), 4, OutputKind::LogSoftmax), 2, 1e-13);
}

/// LeNet-5's shape at a small size: padded conv, ReLU ahead of overlapping and plain max-pools,
/// no-bias layers, every activation kind, average pooling, strides.
#[test]
fn every_lowered_layer_kind_on_the_host_backend_equals_the_cpu_engine() {
    let stacks = [
        r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 3 } }, { leaky_relu = 0.1 }, { max_pool2d = { kernel = 2, stride = 1 } }, "flatten", { dense = 6 }, "relu", { dense = 3 }]"#,
        r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "silu", { avg_pool2d = 2 }, { conv2d = { channels = 3, kernel = 2, bias = false } }, { leaky_relu = 0.05 }, "flatten", { dense = 5 }, "tanh", { dense = { features = 3, bias = false } }]"#,
        r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 2, kernel = 3 } }, "gelu", { max_pool2d = { kernel = 3, stride = 2 } }, "flatten", { dense = 4 }, "sigmoid", { dense = 4 }, "softplus", { dense = 3 }]"#,
        r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, { layer_norm = {} }, { residual = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { conv2d = { channels = 3, kernel = 3, padding = 1 } }] }, { residual = [{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "tanh"] }, "relu", "flatten", { residual = [{ layer_norm = { eps = 0.5 } }, { dense = 6 }, "gelu", { dense = 5 }] }, { layer_norm = {} }, { dense = 3 }]"#,
    ];
    for (i, text) in stacks.iter().enumerate() {
        for out in [OutputKind::LogSoftmax, OutputKind::Identity] {
            check(&arch(text, 64, Some([1, 8, 8]), 3, out), 10 + i as u64, 1e-12);
        }
    }
}

/// A layer the device program has no op for is refused in one line naming it.
#[test]
fn a_layer_without_a_device_op_is_named() {
    let text = r#"kind = "layers"
zero_last = false
layers = [{ dense = 8 }, { residual = [{ dense = 8 }, "relu"] }, { dense = 3 }]"#;
    assert!(arch(text, 5, None, 3, OutputKind::LogSoftmax).device_program().is_ok());
    let cfg: ModelConfig = toml::from_str(r#"kind = "layers"
zero_last = false
layers = [{ embedding = { vocab = 7, dim = 8 } }, { self_attention = { heads = 2 } }, "last_token", { dense = 3 }]"#).unwrap();
    let a = cfg.resolve_on(crate::model::layers::Shape::Tokens(4, 7), 3, OutputKind::LogSoftmax).unwrap();
    let e = a.device_program().unwrap_err().to_string();
    assert!(e.contains("does not run on a device") && e.contains("Embedding") && !e.contains('\n'), "{e}");
}

/// The host GEMM (faer on strided, offset, transposed, batched views) against the triple loop.
#[test]
fn host_gemm_equals_the_triple_loop() {
    let mut r = rng(7);
    let (m, n, k, batch) = (3, 4, 5, 3);
    for (ta, tb, acc) in [(false, false, false), (true, false, true), (false, true, false), (true, true, true)] {
        let a_op = Operand { offset: 2, ld: if ta { m + 1 } else { k + 2 }, stride: 40, trans: ta };
        let b_op = Operand { offset: 1, ld: if tb { k + 1 } else { n + 3 }, stride: 0, trans: tb };
        let c_op = Operand { offset: 3, ld: n + 1, stride: 20, trans: false };
        let a: Vec<f64> = (0..200).map(|_| r.gen_range(-1.0..1.0)).collect();
        let b: Vec<f64> = (0..80).map(|_| r.gen_range(-1.0..1.0)).collect();
        let c0: Vec<f64> = (0..100).map(|_| r.gen_range(-1.0..1.0)).collect();
        let g = Gemm { m, n, k, batch, alpha: 0.5, accumulate: acc, a: a_op, b: b_op, c: c_op };
        let mut c = c0.clone();
        Host.gemm(&g, &a, &b, &mut c).unwrap();
        let mut want = c0.clone();
        for e in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let at = |o: &Operand, rr: usize, cc: usize| if o.trans { o.offset + e * o.stride + cc * o.ld + rr } else { o.offset + e * o.stride + rr * o.ld + cc };
                    let s: f64 = (0..k).map(|l| a[at(&a_op, i, l)] * b[at(&b_op, l, j)]).sum();
                    let ci = c_op.offset + e * c_op.stride + i * c_op.ld + j;
                    want[ci] = 0.5 * s + if acc { c0[ci] } else { 0.0 };
                }
            }
        }
        assert!(rel(&c, &want) < 1e-15, "trans {ta} {tb}");
    }
    // An operand reaching beyond its buffer is refused, not read.
    let g = Gemm { m: 2, n: 2, k: 2, batch: 2, alpha: 1.0, accumulate: false, a: Operand::shared(2, false), b: Operand::shared(2, false), c: Operand { offset: 0, ld: 2, stride: 4, trans: false } };
    let e = Host.gemm(&g, &vec![0.0; 4], &vec![0.0; 4], &mut vec![0.0; 7]).unwrap_err().to_string();
    assert!(e.contains("beyond its buffer"), "{e}");
}

/// The activations' kernels against `Act` (value and derivative) at points across their range.
#[test]
fn activation_kernels_equal_the_layer_formulas() {
    use crate::model::layers::Act;
    let z: Vec<f64> = (-400..=400).map(|i| f64::from(i) * 0.05).chain([0.0, -0.0, 1e-300, -40.0, 40.0, 700.0, -700.0]).collect();
    for act in [Act::Relu, Act::LeakyRelu(0.3), Act::Tanh, Act::Sigmoid, Act::Softplus, Act::Gelu, Act::Silu] {
        let kind = super::program::act_code(act.name()).unwrap();
        let slope = if let Act::LeakyRelu(s) = act { s } else { 0.0 };
        let mut y = vec![0.0; z.len()];
        Host.pk_act(z.len(), kind, slope, &z, &mut y).unwrap();
        let mut dy = vec![1.0; z.len()];
        Host.pk_act_back(z.len(), z.len() as i64, 1, kind, slope, &z, &mut dy).unwrap();
        for (i, &v) in z.iter().enumerate() {
            let (a, da) = (act.apply(v), act.derivative(v));
            // GELU's `1 + erf(z/√2)` cancels for z < 0: the C library's erf and the `libm`
            // crate's differ by an ulp there, an absolute ulp of Φ (times |z|).
            let floor = if matches!(act, Act::Gelu) { v.abs().max(1.0) } else { 0.0 };
            assert!((y[i] - a).abs() <= 4.0 * f64::EPSILON * a.abs().max(floor).max(f64::MIN_POSITIVE), "{} at {v}: {} vs {a}", act.name(), y[i]);
            assert!((dy[i] - da).abs() <= 4.0 * f64::EPSILON * da.abs().max(floor).max(1e-300), "{}' at {v}: {} vs {da}", act.name(), dy[i]);
        }
    }
}

/// A call whose buffers are shorter than its items need is refused in one line, before it runs.
#[test]
fn a_short_buffer_is_refused() {
    let (t, y1) = (vec![1.0; 2], vec![1.0; 6]);
    let mut y0 = vec![0.0; 5];
    let e = Host.pk_combine(6, 3, &t, &y1, &mut y0).unwrap_err().to_string();
    assert!(e.contains("pk_combine") && e.contains("`y0` holds 5") && e.contains("needs 6"), "{e}");
    assert!(y0.iter().all(|&v| v == 0.0));
}

/// The kernel list names each kernel of the source once, and the source defines each (the PTX
/// check, `scripts/gpu/ptx.py`, reads the same list).
#[test]
fn the_kernel_list_matches_the_source() {
    let src = include_str!("../../kernels/epk.cu");
    let defined: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("PK_KERNEL ")).map(|l| l.split('(').next().unwrap().trim()).collect();
    let listed: Vec<&str> = KERNELS.iter().map(|k| k.0).collect();
    assert_eq!(defined, listed);
    for (name, kinds) in KERNELS {
        let line = src.lines().find(|l| l.starts_with(&format!("PK_KERNEL {name}("))).unwrap();
        let params = line.split('(').nth(1).unwrap().split(')').next().unwrap().split(',').count();
        assert_eq!(params, kinds.len() + 1, "{name}: parameters in the source vs the list");
    }
}

/// The segmented sum against the loop, and its row ranges clamped to the rows it was given (a
/// wrong range reads nothing outside the buffer).
#[test]
fn segment_sums_equal_the_loop_and_stay_inside() {
    let mut r = rng(9);
    let (rows, width) = (7, 3);
    let g: Vec<f64> = (0..rows * width).map(|_| r.gen_range(-1.0..1.0)).collect();
    let wt: Vec<f64> = (0..rows).map(|_| r.gen_range(0.0..1.0)).collect();
    let idx = [4usize, 4, 1, 1, 1, 4, 2];
    let runs = super::runs(&idx);
    assert_eq!(runs, vec![(0, 2), (2, 3), (5, 1), (6, 1)]);
    let start: Vec<f64> = runs.iter().map(|&(s, _)| s as f64).chain([rows as f64]).collect();
    let mut out = vec![0.0; runs.len() * width];
    Host.pk_segment_sum(out.len(), width as i64, rows as i64, &start, &wt, &g, &mut out).unwrap();
    for (p, &(s, len)) in runs.iter().enumerate() {
        for c in 0..width {
            let want: f64 = (s..s + len).map(|j| wt[j] * g[j * width + c]).sum();
            assert!((out[p * width + c] - want).abs() <= 1e-15, "segment {p}");
        }
    }
    let bad = vec![-3.0, 2.0, 99.0];
    let mut out = vec![0.0; 2 * width];
    Host.pk_segment_sum(out.len(), width as i64, rows as i64, &bad, &wt, &g, &mut out).unwrap();
    let want: f64 = (2..rows).map(|j| wt[j] * g[j * width]).sum();
    assert!((out[width] - want).abs() <= 1e-15);
}
