//! The contraction contract against slow obvious loops, the CPU backend against the engine's
//! own GEMMs bit for bit, and (on a GPU only, `#[ignore]`d here) the CUDA backend against the
//! CPU one.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// `c = α·A·Bᵀ (+ c)` by loops over the first `k` columns of strided rows.
#[allow(clippy::too_many_arguments)]
fn naive(c: &mut [f64], a: &[f64], lda: usize, b: &[f64], ldb: usize, m: usize, n: usize, k: usize, alpha: f64, accumulate: bool) {
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|l| a[i * lda + l] * b[j * ldb + l]).sum();
            c[i * n + j] = if accumulate { c[i * n + j] + alpha * s } else { alpha * s };
        }
    }
}

fn random(rng: &mut ChaCha8Rng, len: usize) -> Vec<f64> {
    (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

fn factor(data: &[f64], n: usize, ld: usize, stamp: Stamp) -> Factor<'_> {
    Factor { data, n, ld, stamp }
}

fn any() -> Stamp {
    Stamp::fresh(Site::Layer0(0))
}

/// (m, n, k, lda, ldb, α, accumulate): contiguous, strided prefixes, α and accumulation, empty
/// inner and outer dimensions, and shapes past faer's parallel threshold.
const CASES: &[(usize, usize, usize, usize, usize, f64, bool)] = &[
    (5, 4, 3, 3, 3, 1.0, false),
    (5, 4, 3, 3, 3, -0.5, true),
    (7, 9, 4, 6, 5, 1.0, false),
    (7, 9, 4, 6, 5, 2.0, true),
    (3, 2, 0, 4, 4, 1.0, false),
    (3, 2, 0, 4, 4, 1.0, true),
    (0, 4, 3, 3, 3, 1.0, false),
    (130, 170, 150, 160, 150, 1.0, false),
    (130, 170, 150, 150, 150, 0.25, true),
];

#[test]
fn cpu_backend_matches_loops() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for &(m, n, k, lda, ldb, alpha, acc) in CASES {
        let a = random(&mut rng, m * lda);
        let b = random(&mut rng, n * ldb);
        let c0 = random(&mut rng, m * n);
        let (mut got, mut want) = (c0.clone(), c0.clone());
        Backend::Cpu.abt(&mut got, &a, lda, &factor(&b, n, ldb, any()), m, k, alpha, acc).unwrap();
        naive(&mut want, &a, lda, &b, ldb, m, n, k, alpha, acc);
        let tol = 1e-13 * (k.max(1) as f64);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= tol, "m={m} n={n} k={k} lda={lda} ldb={ldb}: {g} vs {w}");
        }
    }
}

/// The CPU backend is the engine's GEMM: the same numbers, not merely close ones.
#[test]
fn cpu_backend_is_the_engines_gemm_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (m, n, k) = (140, 120, 160);
    let a = random(&mut rng, m * k);
    let b = random(&mut rng, n * k);
    let mut want = vec![0.0; m * n];
    crate::linalg::gemm_abt(&mut want, &a, &b, m, n, k, 1.0, false);
    let mut got = vec![1.0; m * n];
    Backend::Cpu.abt(&mut got, &a, k, &factor(&b, n, k, any()), m, k, 1.0, false).unwrap();
    assert_eq!(got, want);
    // The strided prefix layer 0 contracts: the first 100 of 160 columns.
    let mut want = vec![0.0; m * n];
    crate::linalg::gemm_abt_prefix(&mut want, &a, k, &b, k, m, n, 100);
    let mut got = vec![0.0; m * n];
    Backend::Cpu.abt(&mut got, &a, k, &factor(&b, n, k, any()), m, 100, 1.0, false).unwrap();
    assert_eq!(got, want);
}

#[test]
fn device_names_round_trip() {
    for d in [Device::Cpu, Device::Cuda] {
        assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
    }
    let err = "gpu".parse::<Device>().unwrap_err().to_string();
    assert!(err.contains("expected cpu or cuda"), "{err}");
    assert_eq!(Device::default(), Device::Cpu);
    assert_eq!(Device::Cpu.probe().unwrap(), "cpu");
}

#[test]
fn cuda_is_refused_on_paths_without_a_backend() {
    assert!(check_path(Device::Cpu, false, "the CNN path").is_ok());
    assert!(check_path(Device::Cuda, true, "the MLP path").is_ok());
    let err = check_path(Device::Cuda, false, "the CNN path").unwrap_err().to_string();
    assert!(err.contains("the CNN path") && !err.contains('\n'), "{err}");
}

/// Without a driver, `Device::Cuda` is one line naming what is missing; with one (the GPU
/// machine) it names the device. Either way cudarc's panic on a missing library never fires.
#[test]
fn cuda_probe_is_one_line() {
    let present = unsafe { cudarc::driver::sys::is_culib_present() && cudarc::cublas::sys::is_culib_present() };
    match Device::Cuda.probe() {
        Ok(name) => assert!(present && !name.is_empty() && !name.contains('\n'), "{name}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && msg.contains("cuda"), "{msg}");
            assert!(Backend::open(Device::Cuda).is_err(), "the failure is kept for the process");
        }
    }
}

/// The CUDA backend against the CPU one on every case, with the training side resident across
/// calls (same stamp, new rows), re-uploaded when its stamp changes, and blocks of 3 rows.
#[test]
#[ignore = "needs a CUDA GPU with driver 580+ and libcublas.so.13 on the library path (run by scripts/gpu/run.sh)"]
fn cuda_backend_matches_cpu() {
    let gpu = match Backend::open(Device::Cuda).unwrap() {
        Backend::Cuda(g) => g,
        Backend::Cpu => unreachable!(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for (case, &(m, n, k, lda, ldb, alpha, acc)) in CASES.iter().enumerate() {
        let b = random(&mut rng, n * ldb);
        let stamp = any();
        for (round, blocks) in [None, Some(3)].into_iter().enumerate() {
            let a = random(&mut rng, m * lda);
            let c0 = random(&mut rng, m * n);
            let (mut got, mut want) = (c0.clone(), c0.clone());
            // Same stamp in both rounds: the second reuses the resident B.
            gpu.abt_blocks(&mut got, &a, lda, &factor(&b, n, ldb, stamp), m, k, alpha, acc, blocks).unwrap();
            Backend::Cpu.abt(&mut want, &a, lda, &factor(&b, n, ldb, any()), m, k, alpha, acc).unwrap();
            let scale = want.iter().fold(1.0f64, |s, v| s.max(v.abs()));
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-13 * scale * (k.max(1) as f64), "case {case} round {round}: {g} vs {w}");
            }
        }
    }
    // A changed factor under a new stamp is uploaded again.
    let (m, n, k) = (4, 5, 6);
    let a = random(&mut rng, m * k);
    let site = Site::Deep(0);
    for version in 0..2 {
        let b = random(&mut rng, n * k);
        let mut got = vec![0.0; m * n];
        let mut want = vec![0.0; m * n];
        gpu.abt(&mut got, &a, k, &factor(&b, n, k, Stamp::fresh(site)), m, k, 1.0, false).unwrap();
        naive(&mut want, &a, k, &b, k, m, n, k, 1.0, false);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-13, "version {version}: {g} vs {w}");
        }
    }
    gpu.release();
}
