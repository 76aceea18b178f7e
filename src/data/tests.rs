use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapper {
    data: DataConfig,
}
#[test]
fn config_toml_parsing() {
    let w: Wrapper = toml::from_str("[data]\nkind = \"gaussian-mixture\"\n").unwrap();
    assert_eq!(w.data, DataConfig::default());
    let w: Wrapper =
        toml::from_str("[data]\nkind = \"gaussian-mixture\"\ndim = 2\nstd = 2\nseed = 9\n")
            .unwrap();
    assert_eq!(
        w.data,
        DataConfig::GaussianMixture {
            dim: 2,
            per_class: 1000,
            n_test: 200,
            std: 2.0,
            seed: 9
        }
    );
    let c: DataConfig = toml::from_str("kind = \"mnist\"\nn_train = 50\n").unwrap();
    assert_eq!(
        c,
        DataConfig::Mnist {
            path: "data/mnist".into(),
            n_train: 50,
            n_test: 200,
            offset: 0,
            normalize: true,
            per_class: None,
            val_per_class: None,
        }
    );
    let c: DataConfig = toml::from_str("kind = \"regression1d\"").unwrap();
    assert_eq!(c, DataConfig::Regression1d { n_test: 101 });
    let c: DataConfig = toml::from_str("kind = \"linear2d\"\nseed = 4").unwrap();
    assert_eq!(
        c,
        DataConfig::Linear2d {
            n_train: 20,
            n_test: 100,
            seed: 4
        }
    );
    // Round trip through serialisation.
    let s = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<DataConfig>(&s).unwrap(), c);

    // Unknown key, unknown kind, missing kind, wrong types.
    let e = toml::from_str::<Wrapper>("[data]\nkind = \"gaussian-mixture\"\nper_clas = 3\n")
        .unwrap_err();
    assert!(
        e.to_string().contains("unknown field") && e.to_string().contains("per_clas"),
        "{e}"
    );
    let e = toml::from_str::<DataConfig>("kind = \"regression1d\"\nseed = 1\n").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    let e = toml::from_str::<DataConfig>("kind = \"cifar\"\n").unwrap_err();
    assert!(e.to_string().contains("unknown variant"), "{e}");
    assert!(toml::from_str::<DataConfig>("dim = 3\n").is_err());
    let e = toml::from_str::<DataConfig>("kind = \"gaussian-mixture\"\nper_class = \"many\"\n")
        .unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
    assert!(
        toml::from_str::<DataConfig>("kind = \"gaussian-mixture\"\nper_class = -1\n").is_err()
    );
    assert!(toml::from_str::<DataConfig>("kind = \"mnist\"\nnormalize = 1\n").is_err());

    // Values rejected by validate.
    let bad = |s: &str, needle: &str| {
        let c: DataConfig = toml::from_str(s).unwrap();
        let e = c.validate().unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains(needle), "{s}: {e}");
        assert!(c.load(Path::new(".")).is_err());
    };
    bad("kind = \"gaussian-mixture\"\nper_class = 0", "per_class");
    bad("kind = \"gaussian-mixture\"\nstd = -1", "std");
    bad("kind = \"gaussian-mixture\"\nstd = 0.0", "std");
    bad("kind = \"gaussian-mixture\"\nstd = nan", "std");
    bad("kind = \"gaussian-mixture\"\nstd = inf", "std");
    bad("kind = \"gaussian-mixture\"\ndim = 1", "dim");
    bad("kind = \"gaussian-mixture\"\nn_test = 0", "n_test");
    bad(
        "kind = \"gaussian-mixture\"\nper_class = 9223372036854775807",
        "too large",
    );
    bad("kind = \"linear2d\"\nn_train = 1", "n_train");
    bad("kind = \"linear2d\"\nn_test = 0", "n_test");
    bad("kind = \"regression1d\"\nn_test = 1", "n_test");
    bad("kind = \"mnist\"\nn_train = 0", "n_train");
    bad("kind = \"mnist\"\nn_test = 0", "n_test");
    bad("kind = \"mnist\"\npath = \"\"", "path");
    let c = DataConfig::Mnist {
        path: "m".into(),
        n_train: 2,
        n_test: 1,
        offset: usize::MAX,
        normalize: true,
        per_class: None,
        val_per_class: None,
    };
    assert!(c.validate().unwrap_err().to_string().contains("overflow"));
    for c in [
        DataConfig::default(),
        DataConfig::Linear2d {
            n_train: 20,
            n_test: 100,
            seed: 0,
        },
        DataConfig::Regression1d { n_test: 101 },
    ] {
        c.validate().unwrap();
        assert_eq!(c.load(Path::new(".")).unwrap().name, c.kind());
    }
}

#[test]
fn dataset_validate() {
    let ok = || {
        Dataset::from_arrays(
            "t",
            "test",
            2,
            3,
            vec![0.0, 1.0, 2.0, 3.0],
            Targets::Labels(vec![0, 2]),
            vec![5.0, 5.0],
            Targets::Labels(vec![1]),
        )
        .unwrap()
    };
    let ds = ok();
    assert!(ds.is_classification());
    assert_eq!((ds.n_train(), ds.n_test()), (2, 1));
    let check = |f: &dyn Fn(&mut Dataset), needle: &str| {
        let mut d = ok();
        f(&mut d);
        let e = d.validate().unwrap_err().to_string();
        assert!(e.contains(needle), "expected '{needle}' in: {e}");
    };
    check(&|d| d.dim = 0, "dim must be >= 1");
    check(&|d| d.num_outputs = 0, "num_outputs");
    check(&|d| d.image_shape = Some([1, 1, 3]), "image_shape");
    check(
        &|d| {
            d.x_train.clear();
            d.y_train = Targets::Labels(vec![])
        },
        "empty",
    );
    check(
        &|d| d.x_train.push(1.0),
        "x_train has 5 values, not a multiple of dim = 2",
    );
    check(&|d| d.x_test.push(1.0), "x_test has 3 values");
    check(
        &|d| d.y_train = Targets::Labels(vec![0, 1, 2]),
        "expected [2], got [3]",
    );
    check(&|d| d.y_test = Targets::Labels(vec![]), "y_test labels");
    check(&|d| d.x_train[3] = f64::NAN, "x_train[1, 1]");
    check(&|d| d.x_test[0] = f64::INFINITY, "x_test[0, 0]");
    check(
        &|d| d.y_train = Targets::Labels(vec![0, 3]),
        "y_train[1] = 3 is not < num_outputs = 3",
    );
    check(&|d| d.y_test = Targets::Labels(vec![7]), "y_test[0] = 7");
    check(
        &|d| d.y_train = Targets::Labels(vec![1, 1]),
        "at least 2 distinct classes",
    );
    check(
        &|d| d.y_test = Targets::Values(vec![0.0; 3]),
        "different kinds",
    );
    let mut d = ok();
    d.image_shape = Some([1, 1, 2]);
    d.validate().unwrap();
    // Regression.
    let r = |yt: Vec<f64>| {
        Dataset::from_arrays(
            "r",
            "r",
            1,
            2,
            vec![1.0, 2.0],
            Targets::Values(yt),
            vec![],
            Targets::Values(vec![]),
        )
    };
    r(vec![0.0; 4]).unwrap();
    let e = r(vec![0.0; 3]).unwrap_err().to_string();
    assert!(
        e.contains("y_train has 3 values, expected n_train * num_outputs = 2 * 2 = 4"),
        "{e}"
    );
    let e = r(vec![0.0, 0.0, f64::NAN, 0.0]).unwrap_err().to_string();
    assert!(e.contains("y_train[1, 0]"), "{e}");
    assert!(!r(vec![0.0; 4]).unwrap().is_classification());
}

#[test]
fn grid_2d_layout() {
    let pts = [0.0, 10.0, 2.0, 20.0, 1.0, 15.0];
    let g = grid_2d(&pts, 3, 0.5).unwrap();
    assert_eq!(g.len(), 3 * 3 * 2);
    // Box [0,2]x[10,20] enlarged by half the extent on each side: [-1,3]x[5,25].
    let row = |k: usize| (g[2 * k], g[2 * k + 1]);
    assert_eq!(row(0), (-1.0, 5.0));
    assert_eq!(row(1), (1.0, 5.0)); // x0 fastest
    assert_eq!(row(2), (3.0, 5.0));
    assert_eq!(row(3), (-1.0, 15.0));
    assert_eq!(row(8), (3.0, 25.0));
    let g = grid_2d(&pts, 11, 0.0).unwrap();
    assert_eq!(g.len(), 242);
    assert!(g
        .chunks_exact(2)
        .all(|p| (0.0..=2.0).contains(&p[0]) && (10.0..=20.0).contains(&p[1])));
    assert_eq!((g[240], g[241]), (2.0, 20.0));
    // Degenerate extent: a single point.
    let g = grid_2d(&[1.0, 1.0], 2, 0.5).unwrap();
    assert_eq!(g, vec![0.5, 0.5, 1.5, 0.5, 0.5, 1.5, 1.5, 1.5]);
    assert!(grid_2d(&[], 3, 0.1).is_err());
    assert!(grid_2d(&[1.0, 2.0, 3.0], 3, 0.1)
        .unwrap_err()
        .to_string()
        .contains("2-D"));
    assert!(grid_2d(&pts, 1, 0.1).is_err());
    assert!(grid_2d(&pts, 3, -0.1).is_err());
    assert!(grid_2d(&[f64::NAN, 0.0], 3, 0.1).is_err());
}
