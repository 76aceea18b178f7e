use super::*;
use crate::data::{DataConfig, Split, Targets};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Write;

fn idx_bytes(ty: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8, 0, ty, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn p() -> &'static Path {
    Path::new("test.idx")
}

fn err_msg(r: Result<IdxArray>) -> String {
    match r {
        Ok(a) => panic!("expected an error, got {a:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn idx_round_trip() {
    for dims in [
        vec![5u32],
        vec![2, 3],
        vec![2, 3, 4],
        vec![1, 2, 3, 2],
        vec![0, 7],
    ] {
        let n: u32 = dims.iter().product();
        let data: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
        let a = parse_idx(&idx_bytes(8, &dims, &data), p()).unwrap();
        assert_eq!(a.dims, dims.iter().map(|&d| d as usize).collect::<Vec<_>>());
        assert_eq!(a.data, data);
    }
}

#[test]
fn idx_errors() {
    let good = idx_bytes(8, &[2, 3], &[1, 2, 3, 4, 5, 6]);
    assert!(err_msg(parse_idx(&[], p())).contains("empty"));
    assert!(err_msg(parse_idx(&[0, 0, 8], p())).contains("truncated IDX header"));
    let mut bad = good.clone();
    bad[0] = 1;
    let m = err_msg(parse_idx(&bad, p()));
    assert!(m.contains("magic") && m.contains("0x01"), "{m}");
    assert!(m.starts_with("test.idx: "), "{m}");
    let mut bad = good.clone();
    bad[1] = 0xff;
    assert!(err_msg(parse_idx(&bad, p())).contains("magic"));
    let gz = [0x1f, 0x8b, 8, 0, 0, 0];
    assert!(err_msg(parse_idx(&gz, p())).contains("gzip"));
    let m = err_msg(parse_idx(&idx_bytes(0x0D, &[2], &[0; 8]), p()));
    assert!(
        m.contains("unsupported IDX element type 0x0d") && m.contains("f32"),
        "{m}"
    );
    let m = err_msg(parse_idx(&idx_bytes(0x42, &[2], &[0; 2]), p()));
    assert!(m.contains("element type 0x42"), "{m}");
    let m = err_msg(parse_idx(&idx_bytes(8, &[], &[]), p()));
    assert!(m.contains("number of IDX dimensions 0"), "{m}");
    let m = err_msg(parse_idx(&idx_bytes(8, &[1, 1, 1, 1, 1], &[0]), p()));
    assert!(m.contains("number of IDX dimensions 5"), "{m}");
    let m = err_msg(parse_idx(&good[..9], p()));
    assert!(
        m.contains("truncated IDX header") && m.contains("12-byte"),
        "{m}"
    );
    let m = err_msg(parse_idx(&good[..good.len() - 1], p()));
    assert!(
        m.contains("truncated IDX data") && m.contains("need 6") && m.contains("found 5"),
        "{m}"
    );
    let mut long = good.clone();
    long.extend_from_slice(&[9, 9]);
    let m = err_msg(parse_idx(&long, p()));
    assert!(m.contains("2 trailing bytes"), "{m}");
    let m = err_msg(parse_idx(
        &idx_bytes(8, &[u32::MAX, u32::MAX, u32::MAX], &[]),
        p(),
    ));
    assert!(m.contains("overflow") || m.contains("truncated"), "{m}");
}

#[test]
fn idx_never_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let good = idx_bytes(8, &[3, 2, 2], &[7; 12]);
    for k in 0..=good.len() {
        let _ = parse_idx(&good[..k], p());
    }
    for _ in 0..20_000 {
        let len = rng.gen_range(0..40);
        let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if len >= 4 && rng.gen_bool(0.7) {
            b[0] = 0;
            b[1] = 0;
            b[2] = 8;
            b[3] = rng.gen_range(0..6);
        }
        if let Ok(a) = parse_idx(&b, p()) {
            assert_eq!(a.data.len(), a.dims.iter().product::<usize>());
        }
    }
}

#[test]
fn read_idx_file_and_missing() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&idx_bytes(8, &[4], &[1, 2, 3, 4])).unwrap();
    f.flush().unwrap();
    let a = read_idx(f.path()).unwrap();
    assert_eq!(a.dims, vec![4]);
    assert_eq!(a.data, vec![1, 2, 3, 4]);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.idx");
    match read_idx(&missing) {
        Err(Error::Io { path, source }) => {
            assert_eq!(path, missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io error, got {other:?}"),
    }
}

/// Writes fake MNIST files: `n` images where image `i` has every pixel `= (i * 10) % 256` and
/// label `labels[i]`.
fn write_fake_mnist(dir: &Path, prefix: &str, sep: &str, n_img: u32, labels: &[u8]) {
    let pixels: Vec<u8> = (0..n_img)
        .flat_map(|i| std::iter::repeat_n((i * 10 % 256) as u8, 784))
        .collect();
    std::fs::write(
        dir.join(format!("{prefix}-images{sep}idx3-ubyte")),
        idx_bytes(8, &[n_img, 28, 28], &pixels),
    )
    .unwrap();
    std::fs::write(
        dir.join(format!("{prefix}-labels{sep}idx1-ubyte")),
        idx_bytes(8, &[labels.len() as u32], labels),
    )
    .unwrap();
}

/// The `idx` kind on a Fashion-MNIST-like set of 3×4 images: the same selection as `mnist`,
/// `image_shape` from the file, `K` from the labels, and its errors.
#[test]
fn idx_kind_generic_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 12 training images (labels 0,1,2 repeating), 4 test images; image i: every pixel 10 i.
    let img = |n: u32| -> Vec<u8> { (0..n).flat_map(|i| std::iter::repeat_n((10 * i) as u8, 12)).collect() };
    std::fs::write(d.join("tr-img"), idx_bytes(8, &[12, 3, 4], &img(12))).unwrap();
    std::fs::write(d.join("tr-lbl"), idx_bytes(8, &[12], &(0..12).map(|i| (i % 3) as u8).collect::<Vec<_>>())).unwrap();
    std::fs::write(d.join("te-img"), idx_bytes(8, &[4, 3, 4], &img(4))).unwrap();
    std::fs::write(d.join("te-lbl"), idx_bytes(8, &[4], &[2, 1, 0, 2])).unwrap();
    let files = "kind = \"idx\"\ntrain_images = \"tr-img\"\ntrain_labels = \"tr-lbl\"\ntest_images = \"te-img\"\ntest_labels = \"te-lbl\"\n";
    let load = |extra: &str| toml::from_str::<DataConfig>(&format!("{files}{extra}")).unwrap().load(d);
    let ds = load("per_class = 2\nval_per_class = 1\nn_test = 4").unwrap();
    assert_eq!((ds.dim, ds.image_shape, ds.num_outputs), (12, Some([1, 3, 4]), 3));
    assert_eq!(ds.y_train, Targets::Labels(vec![0, 1, 2, 0, 1, 2]));
    assert_eq!(ds.validation.as_ref().unwrap().y, Targets::Labels(vec![0, 1, 2]));
    assert_eq!(ds.validation.as_ref().unwrap().x[0], 60.0 / 255.0);
    assert_eq!(ds.x_test[12], 10.0 / 255.0);
    assert!(ds.description.starts_with("idx tr-img: train: the first 2 images of each class"), "{}", ds.description);
    let ds = load("n_train = 5\nn_test = 2\noffset = 1\nstandardize = true").unwrap();
    ds.validate().unwrap();
    assert_eq!(ds.n_train(), 5);
    let col: Vec<f64> = ds.x_train.iter().step_by(12).copied().collect();
    assert!(col.iter().sum::<f64>().abs() < 1e-12, "standardized");
    // A class missing from the training selection, unless num_classes allows it.
    let e = load("n_train = 2\nn_test = 2").unwrap_err().to_string();
    assert!(e.contains("tr-img: class 2 has no rows in the training selection"), "{e}");
    assert_eq!(load("n_train = 2\nn_test = 2\nnum_classes = 3").unwrap().num_outputs, 3);
    let e = load("num_classes = 2\nn_train = 2\nn_test = 2").unwrap_err().to_string();
    assert!(e.contains("tr-lbl: label 2 is 2, not a class in 0..2"), "{e}");
    let e = load("image_size = [28, 28]\nn_train = 3\nn_test = 2").unwrap_err().to_string();
    assert!(e.contains("images must have dimensions [n, 28, 28], got [12, 3, 4]"), "{e}");
    // Mismatched lengths and a missing file.
    std::fs::write(d.join("te-lbl"), idx_bytes(8, &[3], &[2, 1, 0])).unwrap();
    let e = load("n_train = 3\nn_test = 2").unwrap_err().to_string();
    assert!(e.contains("te-lbl vs image count") && e.contains("expected [4], got [3]"), "{e}");
    std::fs::remove_file(d.join("te-img")).unwrap();
    let e = load("n_train = 3\nn_test = 2").unwrap_err();
    assert!(matches!(e, Error::Io { .. }) && e.to_string().contains("te-img"), "{e}");
}

/// `mnist` is `idx` with MNIST's files: the same rows, labels and pixel values as the
/// generic kind given the four paths, 10 classes and MNIST's normalisation.
#[test]
fn mnist_is_a_preset_of_idx() {
    let dir = tempfile::tempdir().unwrap();
    let labels: Vec<u8> = (0..30u32).map(|i| ((i * 7 + i / 10) % 10) as u8).collect();
    write_fake_mnist(dir.path(), "train", ".", 30, &labels);
    write_fake_mnist(dir.path(), "t10k", "-", 5, &[7, 8, 9, 0, 1]);
    for (sel, norm, off) in [("per_class = 2\nval_per_class = 1", true, 0), ("n_train = 7\noffset = 2", false, 2)] {
        let m: DataConfig = toml::from_str(&format!("kind = \"mnist\"\npath = \".\"\nn_test = 3\nnormalize = {norm}\n{sel}")).unwrap();
        let normalize = if norm { "normalize = [0.1307, 0.3081]\n" } else { "" };
        let g: DataConfig = toml::from_str(&format!(
            "kind = \"idx\"\ntrain_images = \"train-images.idx3-ubyte\"\ntrain_labels = \"train-labels.idx1-ubyte\"\ntest_images = \"t10k-images-idx3-ubyte\"\ntest_labels = \"t10k-labels-idx1-ubyte\"\nnum_classes = 10\nn_test = 3\n{normalize}{sel}"
        ))
        .unwrap();
        let (a, b) = (m.load(dir.path()).unwrap(), g.load(dir.path()).unwrap());
        assert_eq!((&a.x_train, &a.y_train, &a.x_test, &a.y_test, &a.validation), (&b.x_train, &b.y_train, &b.x_test, &b.y_test, &b.validation));
        assert_eq!((a.image_shape, a.num_outputs, a.name.as_str()), (b.image_shape, 10, "mnist"));
        // And the pixels are the old formula's, bit for bit.
        let (x, _) = load_mnist(dir.path(), MnistSplit::Test, off, 3, norm).unwrap();
        let old = |b: u8| if norm { (f64::from(b) / 255.0 - MNIST_MEAN) / MNIST_STD } else { f64::from(b) / 255.0 };
        assert_eq!(x[784], old(10 * (off as u8 + 1)));
        assert_eq!(a.x_test, x);
    }
}

#[test]
fn mnist_fake_files_both_namings() {
    let dir = tempfile::tempdir().unwrap();
    write_fake_mnist(dir.path(), "train", ".", 5, &[0, 1, 2, 3, 9]);
    write_fake_mnist(dir.path(), "t10k", "-", 3, &[7, 8, 9]);
    let (x, y) = load_mnist(dir.path(), MnistSplit::Train, 1, 3, false).unwrap();
    assert_eq!(y, vec![1, 2, 3]);
    assert_eq!(x.len(), 3 * 784);
    assert_eq!(x[0], 10.0 / 255.0);
    assert_eq!(x[784 * 2 + 783], 30.0 / 255.0);
    let (x, y) = load_mnist(dir.path(), MnistSplit::Test, 0, 3, true).unwrap();
    assert_eq!(y, vec![7, 8, 9]);
    assert_eq!(x[0], (0.0 - 0.1307) / 0.3081);
    assert!((x[784] - (10.0 / 255.0 - 0.1307) / 0.3081).abs() < 1e-15);
    assert!((x[784 * 2] - (20.0 / 255.0 - 0.1307) / 0.3081).abs() < 1e-15);
    // Requesting more than available.
    let e = load_mnist(dir.path(), MnistSplit::Test, 1, 3, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds only 3"), "{e}");
    let e = load_mnist(dir.path(), MnistSplit::Test, usize::MAX, 3, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds only 3"), "{e}");

    // Through DataConfig, with a path relative to base_dir.
    let sub = dir.path().join("m");
    std::fs::create_dir(&sub).unwrap();
    write_fake_mnist(&sub, "train", "-", 4, &[3, 3, 5, 5]);
    write_fake_mnist(&sub, "t10k", ".", 2, &[1, 2]);
    let cfg = DataConfig::Mnist {
        path: "m".into(),
        n_train: 3,
        n_test: 1,
        offset: 1,
        normalize: true,
        per_class: None,
        val_per_class: None,
    };
    let ds = cfg.load(dir.path()).unwrap();
    assert_eq!(
        (ds.n_train(), ds.n_test(), ds.dim, ds.num_outputs),
        (3, 1, 784, 10)
    );
    assert_eq!(ds.image_shape, Some([1, 28, 28]));
    assert_eq!(ds.y_train, Targets::Labels(vec![3, 5, 5]));
    assert_eq!(ds.y_test, Targets::Labels(vec![2]));
}

#[test]
fn mnist_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_mnist(&dir.path().join("absent"), MnistSplit::Train, 0, 1, true).unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
    assert!(e.to_string().contains("bash data/fetch-mnist.sh"), "{e}");
    let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train-images.idx3-ubyte") && e.contains("bash data/fetch-mnist.sh"),
        "{e}"
    );
    // Count mismatch.
    write_fake_mnist(dir.path(), "train", ".", 3, &[1, 2]);
    let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("expected [3], got [2]"), "{e}");
    // Label out of range.
    write_fake_mnist(dir.path(), "train", ".", 3, &[1, 11, 2]);
    let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("label 1 is 11"), "{e}");
    // Wrong image shape.
    std::fs::write(
        dir.path().join("t10k-images.idx3-ubyte"),
        idx_bytes(8, &[2, 4], &[0; 8]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("t10k-labels.idx1-ubyte"),
        idx_bytes(8, &[2], &[0, 1]),
    )
    .unwrap();
    let e = load_mnist(dir.path(), MnistSplit::Test, 0, 1, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[n, 28, 28]"), "{e}");
    // Gzipped file only.
    let gzdir = tempfile::tempdir().unwrap();
    std::fs::write(
        gzdir.path().join("train-images-idx3-ubyte.gz"),
        [0x1f, 0x8b],
    )
    .unwrap();
    let e = load_mnist(gzdir.path(), MnistSplit::Train, 0, 1, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gunzip"), "{e}");
}

/// The real files, when `bash data/fetch-mnist.sh` has been run (skipped otherwise).
#[test]
fn mnist_real_files_if_present() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    if !dir.join("train-images.idx3-ubyte").is_file() {
        eprintln!("skipping: {} not present", dir.display());
        return;
    }
    let (x, y) = load_mnist(&dir, MnistSplit::Train, 0, 1000, true).unwrap();
    assert_eq!(&y[..5], &[5, 0, 4, 1, 9]);
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    assert!(mean.abs() < 0.05, "normalised mean {mean}");
    let (_, y) = load_mnist(&dir, MnistSplit::Test, 9998, 2, false).unwrap();
    assert_eq!(y.len(), 2);
    let (_, y) = load_mnist(&dir, MnistSplit::Test, 0, 5, false).unwrap();
    assert_eq!(y, vec![7, 2, 1, 0, 4]);
    assert!(load_mnist(&dir, MnistSplit::Test, 9998, 3, false).is_err());
}

/// The obvious per-digit selection: file indices of each selection, scanning from `offset`.
fn select_by_rank(labels: &[usize], offset: usize, counts: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); counts.len()];
    let mut seen = [0usize; 10];
    for (i, &d) in labels.iter().enumerate().skip(offset) {
        let mut lo = 0;
        for (s, &c) in counts.iter().enumerate() {
            if seen[d] >= lo && seen[d] < lo + c {
                out[s].push(i);
            }
            lo += c;
        }
        seen[d] += 1;
    }
    out
}

#[test]
fn mnist_per_class_selection_fake_files() {
    let dir = tempfile::tempdir().unwrap();
    // 25 images; digit counts are uneven and interleaved. Image i has every pixel (10 i)/255.
    let labels: Vec<u8> = (0..25u32).map(|i| ((i * 7 + i / 10) % 10) as u8).collect();
    write_fake_mnist(dir.path(), "train", ".", 25, &labels);
    write_fake_mnist(dir.path(), "t10k", ".", 3, &[7, 8, 9]);
    let lab: Vec<usize> = labels.iter().map(|&l| l as usize).collect();
    // Every digit occurs at least twice from image 1 on.
    for offset in [0, 1] {
        let sel = load_mnist_per_class(dir.path(), MnistSplit::Train, offset, &[1, 1], false)
            .unwrap();
        let want = select_by_rank(&lab, offset, &[1, 1]);
        for (s, (x, y)) in sel.iter().enumerate() {
            assert_eq!(y.len(), 10);
            assert_eq!(x.len(), 10 * 784);
            assert_eq!(*y, want[s].iter().map(|&i| lab[i]).collect::<Vec<_>>());
            let ids: Vec<usize> = x.chunks(784).map(|r| (r[0] * 255.0 / 10.0).round() as usize).collect();
            assert_eq!(ids, want[s], "selection {s}, offset {offset}");
            // Rows in file order.
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
        }
        let mut per_digit = [0; 10];
        sel[0].1.iter().for_each(|&d| per_digit[d] += 1);
        assert_eq!(per_digit, [1; 10]);
    }
    // Too few images of some digit.
    let e = load_mnist_per_class(dir.path(), MnistSplit::Train, 0, &[2, 2], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("images of digit") && e.contains("4 are needed"), "{e}");
    // Through DataConfig: per_class with a validation split, and without.
    let cfg: DataConfig = toml::from_str(
        "kind = \"mnist\"\npath = \".\"\nper_class = 1\nval_per_class = 1\nn_test = 3\nnormalize = false\n",
    )
    .unwrap();
    let ds = cfg.load(dir.path()).unwrap();
    assert_eq!((ds.n_train(), ds.n_val(), ds.n_test()), (10, 10, 3));
    let want = select_by_rank(&lab, 0, &[1, 1]);
    assert_eq!(ds.y_train, Targets::Labels(want[0].iter().map(|&i| lab[i]).collect()));
    let v = ds.validation.as_ref().unwrap();
    assert_eq!(v.y, Targets::Labels(want[1].iter().map(|&i| lab[i]).collect()));
    assert_eq!(v.x[0], (10 * want[1][0]) as f64 / 255.0);
    assert_eq!(ds.x_test[784], 10.0 / 255.0);
    assert!(
        ds.description.contains("first 1 images of each digit")
            && ds.description.contains("validation: the next 1 of each digit")
            && ds.description.contains("pixels x/255"),
        "{}",
        ds.description
    );
    let cfg: DataConfig =
        toml::from_str("kind = \"mnist\"\npath = \".\"\nper_class = 2\nn_test = 3\n").unwrap();
    let ds = cfg.load(dir.path()).unwrap();
    assert_eq!((ds.n_train(), ds.n_val()), (20, 0));
    assert!(ds.validation.is_none());
    // A validation split of the same kind is checked like the test set.
    let mut bad = ds.clone();
    bad.validation = Some(Split { x: vec![0.0; 784], y: Targets::Labels(vec![10]) });
    assert!(bad.validate().unwrap_err().to_string().contains("y_val[0] = 10"));
    bad.validation = Some(Split { x: vec![0.0; 783], y: Targets::Labels(vec![1]) });
    assert!(bad.validate().unwrap_err().to_string().contains("x_val has 783 values"));
    bad.validation = Some(Split { x: vec![f64::NAN; 784], y: Targets::Labels(vec![1]) });
    assert!(bad.validate().unwrap_err().to_string().contains("x_val[0, 0]"));
    bad.validation = Some(Split { x: vec![0.0; 784], y: Targets::Values(vec![0.0; 10]) });
    assert!(bad.validate().unwrap_err().to_string().contains("y_val and y_train"));
}

#[test]
fn mnist_per_class_config_validation_and_stable_serialisation() {
    let bad = |s: &str, needle: &str| {
        let c: DataConfig = toml::from_str(s).unwrap();
        let e = c.validate().unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains(needle), "{s}: {e}");
    };
    bad("kind = \"mnist\"\nval_per_class = 5", "needs data.per_class");
    bad("kind = \"mnist\"\nper_class = 0", "per_class must be >= 1");
    bad("kind = \"mnist\"\nper_class = 3\nval_per_class = 0", "val_per_class must be >= 1");
    bad("kind = \"mnist\"\nper_class = 3\nn_train = 50", "give one of them");
    bad("kind = \"mnist\"\nper_class = 9223372036854775807", "too large");
    assert!(toml::from_str::<DataConfig>("kind = \"mnist\"\nper_class = -1").is_err());
    // Existing configurations serialise exactly as before (their run ids do not change).
    let old: DataConfig = toml::from_str("kind = \"mnist\"\nn_train = 100\nn_test = 20\n").unwrap();
    assert_eq!(
        serde_json::to_string(&old).unwrap(),
        r#"{"kind":"mnist","path":"data/mnist","n_train":100,"n_test":20,"offset":0,"normalize":true}"#
    );
    let new: DataConfig =
        toml::from_str("kind = \"mnist\"\nper_class = 200\nval_per_class = 50\n").unwrap();
    let json = serde_json::to_string(&new).unwrap();
    assert!(json.ends_with(r#""normalize":true,"per_class":200,"val_per_class":50}"#), "{json}");
    assert_eq!(serde_json::from_str::<DataConfig>(&json).unwrap(), new);
    assert_eq!(toml::from_str::<DataConfig>(&toml::to_string(&new).unwrap()).unwrap(), new);
}

/// The uncertainty benchmark's split on the real files (skipped when absent): 200 + 50 per
/// digit from the training file, checked against the obvious selection.
#[test]
fn mnist_real_per_class_if_present() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    if !dir.join("train-images.idx3-ubyte").is_file() {
        eprintln!("skipping: {} not present", dir.display());
        return;
    }
    let cfg: DataConfig = toml::from_str(&format!(
        "kind = \"mnist\"\npath = \"{}\"\nper_class = 200\nval_per_class = 50\nn_test = 2000\nnormalize = false\n",
        dir.display()
    ))
    .unwrap();
    let ds = cfg.load(Path::new(".")).unwrap();
    assert_eq!((ds.n_train(), ds.n_val(), ds.n_test()), (2000, 500, 2000));
    let (xa, ya) = load_mnist(&dir, MnistSplit::Train, 0, 5000, false).unwrap();
    let want = select_by_rank(&ya, 0, &[200, 50]);
    assert_eq!(want[0].len(), 2000, "5000 images hold 250 of each digit");
    assert_eq!(want[1].len(), 500);
    let rows = |ids: &[usize]| -> Vec<f64> {
        ids.iter().flat_map(|&i| xa[i * 784..(i + 1) * 784].iter().copied()).collect()
    };
    assert_eq!(ds.x_train, rows(&want[0]));
    assert_eq!(ds.y_train, Targets::Labels(want[0].iter().map(|&i| ya[i]).collect()));
    let v = ds.validation.as_ref().unwrap();
    assert_eq!(v.x, rows(&want[1]));
    assert_eq!(v.y, Targets::Labels(want[1].iter().map(|&i| ya[i]).collect()));
    let Targets::Labels(y) = &ds.y_train else { panic!() };
    assert_eq!(&y[..5], &[5, 0, 4, 1, 9]);
    assert!(ds.x_train.iter().chain(&ds.x_test).all(|v| (0.0..=1.0).contains(v)));
    let (xt, _) = load_mnist(&dir, MnistSplit::Test, 0, 2000, false).unwrap();
    assert_eq!(ds.x_test, xt);
}
