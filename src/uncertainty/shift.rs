//! Dataset shift and out-of-distribution inputs for 28×28 images with pixels in `[0, 1]`:
//! rotation (bilinear, zeros outside), uniform noise, and inversion.
//!
//! Rotation convention: pixel `(r, c)` (row `r` downwards, column `c` rightwards, both 0..28)
//! sits at `(r − 13.5, c − 13.5)` relative to the image centre. A positive angle `θ` rotates the
//! image content **counter-clockwise as displayed** (row 0 at the top), as `np.rot90` does for
//! 90°; the whole operation equals `scipy.ndimage.rotate(img, θ, reshape=False, order=1,
//! mode="grid-constant", cval=0)` (tested against golden values from it; scipy's default
//! `mode="constant"` differs near the border). The output pixel `(r, c)` samples the input at
//!
//! ```text
//! r_in = 13.5 + sin θ · (c − 13.5) + cos θ · (r − 13.5)
//! c_in = 13.5 + cos θ · (c − 13.5) − sin θ · (r − 13.5)
//! ```
//!
//! by bilinear interpolation between the four pixels around `(r_in, c_in)`, where pixels outside
//! the image count as 0 (so the value fades to 0 over the last pixel at the border). Angles that
//! are whole multiples of 90° use exact `sin`/`cos` values, so they are exact permutations.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// Image side.
pub(crate) const SIDE: usize = 28;
/// Pixels per image.
pub(crate) const PIXELS: usize = SIDE * SIDE;
/// The rotation centre (row and column).
pub(crate) const CENTRE: f64 = 13.5;

/// `(sin θ, cos θ)` of `degrees`, exact for whole multiples of 90°.
fn sin_cos_degrees(degrees: f64) -> (f64, f64) {
    let q = degrees / 90.0;
    if q == q.round() {
        match (q.round() as i64).rem_euclid(4) {
            0 => (0.0, 1.0),
            1 => (1.0, 0.0),
            2 => (0.0, -1.0),
            _ => (-1.0, 0.0),
        }
    } else {
        degrees.to_radians().sin_cos()
    }
}

fn check_images(x: &[f64], what: &str) -> Result<usize> {
    if x.len() % PIXELS != 0 {
        return Err(Error::ShapeMismatch {
            what: format!("{what}: images [N, 784]"),
            expected: vec![x.len() / PIXELS * PIXELS],
            got: vec![x.len()],
        });
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("{what}: non-finite pixel [{}, {}] = {}", i / PIXELS, i % PIXELS, x[i])));
    }
    Ok(x.len() / PIXELS)
}

/// Rotates one image by `degrees` (convention in the module docs).
///
/// # Shapes
/// `img: [784]` (28×28 row-major); returns `[784]`.
///
/// # Panics
/// If `img.len() != 784`.
pub fn rotate_image(img: &[f64], degrees: f64) -> Vec<f64> {
    assert_eq!(img.len(), PIXELS, "rotate_image takes one 28x28 image");
    let (s, c) = sin_cos_degrees(degrees);
    let at = |r: i64, col: i64| -> f64 {
        if (0..SIDE as i64).contains(&r) && (0..SIDE as i64).contains(&col) {
            img[r as usize * SIDE + col as usize]
        } else {
            0.0
        }
    };
    let mut out = vec![0.0; PIXELS];
    for r in 0..SIDE {
        let v = r as f64 - CENTRE;
        for col in 0..SIDE {
            let u = col as f64 - CENTRE;
            let r_in = CENTRE + s * u + c * v;
            let c_in = CENTRE + c * u - s * v;
            let (r0, c0) = (r_in.floor(), c_in.floor());
            let (fr, fc) = (r_in - r0, c_in - c0);
            let (r0, c0) = (r0 as i64, c0 as i64);
            let mut acc = 0.0;
            // Skipping zero weights keeps exact permutations exact (0 · x would be too, but
            // this also avoids reading pixels the result does not depend on).
            for (dr, wr) in [(0, 1.0 - fr), (1, fr)] {
                for (dc, wc) in [(0, 1.0 - fc), (1, fc)] {
                    let w = wr * wc;
                    if w != 0.0 {
                        acc += w * at(r0 + dr, c0 + dc);
                    }
                }
            }
            out[r * SIDE + col] = acc;
        }
    }
    out
}

/// Rotates every image of `x` by `degrees`.
///
/// # Shapes
/// `x: [N, 784]`; returns `[N, 784]`.
pub(crate) fn rotate_images(x: &[f64], degrees: f64) -> Result<Vec<f64>> {
    check_images(x, "rotate_images")?;
    if !degrees.is_finite() {
        return Err(Error::Config(format!("rotation angle must be finite, got {degrees}")));
    }
    Ok(x.chunks_exact(PIXELS).flat_map(|img| rotate_image(img, degrees)).collect())
}

/// `n` images of independent uniform pixels `U[0, 1)`: `ChaCha8Rng::seed_from_u64(seed)`, one
/// `gen::<f64>()` per pixel, image by image in row-major order.
///
/// # Shapes
/// Returns `[n, 784]`.
pub(crate) fn uniform_noise_images(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n * PIXELS).map(|_| rng.gen::<f64>()).collect()
}

/// Inverted images `1 − x`. Pixels must lie in `[0, 1]` (the `x/255` scaling; inverting
/// standardised pixels would not give an image of the same family).
///
/// # Shapes
/// `x: [N, 784]`; returns `[N, 784]`.
pub(crate) fn invert_images(x: &[f64]) -> Result<Vec<f64>> {
    check_images(x, "invert_images")?;
    if let Some(i) = x.iter().position(|v| !(0.0..=1.0).contains(v)) {
        return Err(Error::Data(format!(
            "invert_images: pixel [{}, {}] = {} is not in [0, 1] (use pixels x/255: data.normalize = false)",
            i / PIXELS,
            i % PIXELS,
            x[i]
        )));
    }
    Ok(x.iter().map(|v| 1.0 - v).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> Vec<f64> {
        (0..PIXELS).map(|i| (i as f64 + 1.0) / PIXELS as f64).collect()
    }

    #[test]
    fn zero_and_full_turns_are_identity() {
        let img = ramp();
        assert_eq!(rotate_image(&img, 0.0), img);
        assert_eq!(rotate_image(&img, 360.0), img);
        assert_eq!(rotate_image(&img, -720.0), img);
    }

    #[test]
    fn quarter_and_half_turns_are_exact_permutations() {
        let img = ramp();
        let r90 = rotate_image(&img, 90.0);
        let r180 = rotate_image(&img, 180.0);
        let r270 = rotate_image(&img, 270.0);
        let rm90 = rotate_image(&img, -90.0);
        for r in 0..SIDE {
            for c in 0..SIDE {
                // np.rot90: out[r][c] = in[c][27 − r] (counter-clockwise).
                assert_eq!(r90[r * SIDE + c], img[c * SIDE + (27 - r)]);
                assert_eq!(r180[r * SIDE + c], img[(27 - r) * SIDE + (27 - c)]);
                assert_eq!(r270[r * SIDE + c], img[(27 - c) * SIDE + r]);
            }
        }
        assert_eq!(rm90, r270);
        assert_eq!(rotate_image(&r90, 90.0), r180);
        // Top-right content moves to the top-left under a counter-clockwise quarter turn.
        let mut dot = vec![0.0; PIXELS];
        dot[27] = 1.0;
        assert_eq!(rotate_image(&dot, 90.0)[0], 1.0);
    }

    #[test]
    fn forty_five_degrees_by_hand() {
        let h = std::f64::consts::FRAC_1_SQRT_2;
        // Output (13, 13): u = v = −0.5, so r_in = 13.5 − h, c_in = 13.5: rows 12/13 with
        // weights (h − 0.5, 1.5 − h), columns 13/14 with weights ½, ½.
        let mut img = vec![0.0; PIXELS];
        img[12 * SIDE + 13] = 1.0;
        img[13 * SIDE + 14] = 2.0;
        let out = rotate_image(&img, 45.0);
        let want = (h - 0.5) * 0.5 * 1.0 + (1.5 - h) * 0.5 * 2.0;
        assert!((out[13 * SIDE + 13] - want).abs() < 1e-15, "{} vs {want}", out[13 * SIDE + 13]);
        // Output (0, 0): u = v = −13.5, r_in = 13.5 − 27h ≈ −5.59 → outside, 0; output (0, 13):
        // u = −0.5, v = −13.5: r_in = 13.5 − 14h ≈ 3.60, c_in = 13.5 + 13h ≈ 22.69.
        let full = vec![1.0; PIXELS];
        let o = rotate_image(&full, 45.0);
        assert_eq!(o[0], 0.0);
        assert!((o[13] - 1.0).abs() < 1e-15);
        // Output (13, 0): u = −13.5, v = −0.5: r_in = 13.5 − 14h ≈ 3.60, c_in = 13.5 − 13h ≈ 4.31,
        // inside; output (0, 27) (top-right corner): r_in = 13.5 ≈ 13.5, c_in = 13.5 + 27h ≈ 32.6
        // → outside.
        assert!((o[13 * SIDE] - 1.0).abs() < 1e-15);
        assert_eq!(o[27], 0.0);
        // Border fade: a constant image, output (27, 13): u = −0.5, v = 13.5 → c_in = 13.5 − 14h
        // ≈ 3.60, r_in = 13.5 + 13h ≈ 22.69 inside: 1. Output (13, 27): u = 13.5, v = −0.5:
        // r_in = 13.5 + 13h, c_in = 13.5 + 14h ≈ 23.40: inside.
        assert!((o[27 * SIDE + 13] - 1.0).abs() < 1e-15);
        // A pixel whose source straddles the last column: fraction of weight inside.
        // Output (r, c) with c_in in (27, 28): weight (1 − frac) on column 27, frac on column 28 (0).
        let (s, c) = (h, h);
        for r in 0..SIDE {
            for col in 0..SIDE {
                let (u, v) = (col as f64 - CENTRE, r as f64 - CENTRE);
                let (ri, ci) = (CENTRE + s * u + c * v, CENTRE + c * u - s * v);
                if (0.0..=27.0).contains(&ri) && ci > 27.0 && ci < 28.0 {
                    let want = 1.0 - (ci - 27.0);
                    assert!((o[r * SIDE + col] - want).abs() < 1e-12, "({r}, {col})");
                }
            }
        }
    }

    #[test]
    fn linear_images_are_reproduced_inside() {
        // Bilinear interpolation reproduces a linear function wherever the four pixels are inside.
        let img: Vec<f64> = (0..PIXELS).map(|i| 0.01 * (i / SIDE) as f64 + 0.02 * (i % SIDE) as f64).collect();
        for deg in [10.0, 33.0, 45.0, -60.0, 137.0] {
            let out = rotate_image(&img, deg);
            let (s, c) = deg.to_radians().sin_cos();
            for r in 0..SIDE {
                for col in 0..SIDE {
                    let (u, v) = (col as f64 - CENTRE, r as f64 - CENTRE);
                    let (ri, ci) = (CENTRE + s * u + c * v, CENTRE + c * u - s * v);
                    if (0.0..=27.0).contains(&ri) && (0.0..=27.0).contains(&ci) {
                        let want = 0.01 * ri + 0.02 * ci;
                        assert!((out[r * SIDE + col] - want).abs() < 1e-12, "{deg}° ({r}, {col})");
                    }
                }
            }
        }
    }

    #[test]
    fn noise_and_inversion() {
        let a = uniform_noise_images(3, 7);
        assert_eq!(a.len(), 3 * PIXELS);
        assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
        assert_eq!(a, uniform_noise_images(3, 7));
        assert_ne!(a, uniform_noise_images(3, 8));
        assert_eq!(&uniform_noise_images(1, 7)[..], &a[..PIXELS]);
        let mean = uniform_noise_images(100, 1).iter().sum::<f64>() / (100 * PIXELS) as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let x = ramp();
        let inv = invert_images(&x).unwrap();
        assert!(inv.iter().zip(&x).all(|(a, b)| a + b == 1.0));
        assert!(invert_images(&[2.0; PIXELS]).unwrap_err().to_string().contains("not in [0, 1]"));
        assert!(invert_images(&[0.5; 10]).is_err());
        let mut nan = x.clone();
        nan[5] = f64::NAN;
        assert!(rotate_images(&nan, 10.0).unwrap_err().to_string().contains("[0, 5]"));
        assert!(rotate_images(&x, f64::INFINITY).is_err());
        let two: Vec<f64> = x.iter().chain(&inv).copied().collect();
        let r = rotate_images(&two, 90.0).unwrap();
        assert_eq!(&r[PIXELS..], &rotate_image(&inv, 90.0)[..]);
    }
}
