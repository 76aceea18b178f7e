//! The paper's Fig. 2 measure on a layer stack: per row point and class, `1 − cos` between the
//! DPK's test gradient `∇f^k(x; w_s)` and the EPK's integrated one
//! `J̄^k = Σ_r w_r ∇f^k(x; w_s + t_rΔw)` over the step's nodes, read from the factors the row
//! engine holds for its contraction (the same measure as the MLP preset's closed form and node
//! path, which its tests compare it with; the CNN preset's own path computes it here too).
//!
//! Per parameter layer the three inner products `⟨g_0, J̄⟩`, `|g_0|²`, `|J̄|²` add up over the
//! layers; a layer's `J̄` is one of [`Integrated`].

use super::dot;
use super::step::RowGrad;
use crate::linalg::{gemm_abt, gemm_abt_strided_add};

/// One parameter layer's `J̄` for a chunk of `pc` row points.
pub(crate) enum Integrated<'a> {
    /// Formed: `[pc, K, width]` (a formed layer's width, or a dense layer's `out·ne` in the
    /// order of [`RowGrad::Factor`]'s `δ[k] ⊗ [a, 1]`).
    Formed(&'a [f64]),
    /// A dense first layer whose input the point's nodes share: `J̄^k = δ̄[k] ⊗ a_p`
    /// (`acts` `[pc, ne]`, `dbar` `[pc, K, out]`).
    Shared { acts: &'a [f64], dbar: &'a [f64] },
    /// A dense output layer's `K + 1` rows `[Ā; B̄]` (`[pc, K + 1, ne]`):
    /// `J̄^k[o, :] = α(δ_ko Ā − B̄_o)`.
    Output { ab: &'a [f64], alpha: f64 },
    /// A dense layer folded node by node: its node rows (`point` `[R]`, in `0..pc`; `weight`
    /// `[R]`; `acts` `[R, ne]`; `deltas` `[R, K·out]`), `J̄^k = Σ_r w_r δ_r[k] ⊗ a_r` never
    /// formed: `⟨δ_0 ⊗ a_0, J̄^k⟩ = Σ_r w_r (δ_0·δ_r[k])(a_0·a_r)` and
    /// `|J̄^k|² = Σ_{r,r'} w_r w_r' (δ_r[k]·δ_r'[k])(a_r·a_r')` over the point's `n` rows:
    /// `n²(ne + K·out)` per point where the formed `J̄` takes `n·K·out·ne` to sum and `K·out·ne`
    /// to read (the caller keeps rows only where they are fewer numbers than `J̄`).
    Rows { point: &'a [usize], weight: &'a [f64], acts: &'a [f64], deltas: &'a [f64] },
}

/// `Σ (1 − cos(g_0^k, J̄^k))` over the chunk's (point, class) pairs where both are nonzero, and
/// how many pairs that is.
///
/// # Shapes
/// `g0` one [`RowGrad`] per parameter layer with the `pc` points' gradients at `w_s` as rows,
/// `jbar` one [`Integrated`] per parameter layer.
pub(crate) fn add(g0: &[RowGrad], jbar: &[Integrated<'_>], pc: usize, k: usize) -> (f64, usize) {
    let n = pc * k;
    let (mut inner, mut n0, mut nbar) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for (g, jb) in g0.iter().zip(jbar) {
        match (g, jb) {
            (RowGrad::Formed { g, width }, Integrated::Formed(j)) => {
                for (pk, (gr, jr)) in g.chunks_exact(*width).zip(j.chunks_exact(*width)).enumerate().take(n) {
                    inner[pk] += dot(gr, jr);
                    n0[pk] += dot(gr, gr);
                    nbar[pk] += dot(jr, jr);
                }
            }
            (RowGrad::Factor { acts, deltas, ne, out }, jb) => {
                let (ne, no) = (*ne, *out);
                // A folded layer's node rows by point.
                let mut by_point: Vec<Vec<usize>> = Vec::new();
                if let Integrated::Rows { point, .. } = jb {
                    by_point = vec![Vec::new(); pc];
                    point.iter().enumerate().for_each(|(r, &q)| by_point[q].push(r));
                }
                for q in 0..pc {
                    let a0 = &acts[q * ne..(q + 1) * ne];
                    let aa = dot(a0, a0);
                    // The output rows' products that do not depend on the class, once per point:
                    // `Ā·a_0`, `B̄_o·a_0`, `|Ā|²`, `Σ_o |B̄_o|²`.
                    let rows = match jb {
                        Integrated::Output { ab, .. } => {
                            let abq = &ab[q * (k + 1) * ne..(q + 1) * (k + 1) * ne];
                            let (abar, b) = abq.split_at(ne);
                            let ba: Vec<f64> = b.chunks_exact(ne).map(|bo| dot(bo, a0)).collect();
                            let bb: f64 = b.chunks_exact(ne).map(|bo| dot(bo, bo)).sum();
                            Some((abar, b, dot(abar, a0), ba, dot(abar, abar), bb))
                        }
                        _ => None,
                    };
                    // A folded layer's products that do not depend on the class, once per point:
                    // `w_r a_0·a_r` and `w_r w_r' a_r·a_r'` over the point's rows.
                    let pairs = match jb {
                        Integrated::Rows { weight, acts: ra, deltas: rd, .. } => {
                            let idx = &by_point[q];
                            let n = idx.len();
                            let row = |x: usize| &ra[idx[x] * ne..(idx[x] + 1) * ne];
                            let a0r: Vec<f64> = (0..n).map(|x| weight[idx[x]] * dot(a0, row(x))).collect();
                            // The point's rows gathered, their products as GEMMs: `w_r w_r' a_r·a_r'`
                            // here, `δ_r[k]·δ_r'[k]` per class below (`[n, n]` each).
                            let acts_q: Vec<f64> = (0..n).flat_map(|x| row(x).iter().copied()).collect();
                            let mut gw = vec![0.0; n * n];
                            gemm_abt(&mut gw, &acts_q, &acts_q, n, n, ne, 1.0, false);
                            for (x, gr) in gw.chunks_exact_mut(n.max(1)).enumerate() {
                                gr.iter_mut().enumerate().for_each(|(y, v)| *v *= weight[idx[x]] * weight[idx[y]]);
                            }
                            let kno = k * no;
                            let deltas_q: Vec<f64> = (0..n).flat_map(|x| rd[idx[x] * kno..(idx[x] + 1) * kno].iter().copied()).collect();
                            Some((a0r, gw, deltas_q))
                        }
                        _ => None,
                    };
                    let mut dd: Vec<f64> = Vec::new();
                    for c in 0..k {
                        let pk = q * k + c;
                        let d0 = &deltas[pk * no..(pk + 1) * no];
                        n0[pk] += aa * dot(d0, d0);
                        match jb {
                            Integrated::Formed(j) => {
                                // `J̄^k` as `[out, ne]`: ⟨δ_0 ⊗ a_0, J̄⟩ = Σ_o δ_0[o] (J̄[o]·a_0).
                                let jq = &j[pk * no * ne..(pk + 1) * no * ne];
                                inner[pk] += jq.chunks_exact(ne).zip(d0).map(|(row, &d)| d * dot(row, a0)).sum::<f64>();
                                nbar[pk] += dot(jq, jq);
                            }
                            Integrated::Shared { acts: ap, dbar } => {
                                let (ap, db) = (&ap[q * ne..(q + 1) * ne], &dbar[pk * no..(pk + 1) * no]);
                                inner[pk] += dot(a0, ap) * dot(d0, db);
                                nbar[pk] += dot(ap, ap) * dot(db, db);
                            }
                            Integrated::Output { alpha, .. } => {
                                // `out = K`: ⟨δ_0 ⊗ a_0, J̄⟩ = α Σ_o δ_0[o] (δ_ko Ā·a_0 − B̄_o·a_0),
                                // |J̄|² = α² (|Ā|² − 2 Ā·B̄_k + Σ_o |B̄_o|²).
                                let (abar, b, abar_a0, ba, abar_sq, bb) = rows.as_ref().expect("formed above for the output rows");
                                let pa: f64 = d0[c] * abar_a0 - d0.iter().zip(ba).map(|(d, v)| d * v).sum::<f64>();
                                inner[pk] += alpha * pa;
                                nbar[pk] += alpha * alpha * (abar_sq - 2.0 * dot(abar, &b[c * ne..(c + 1) * ne]) + bb);
                            }
                            Integrated::Rows { .. } => {
                                let (a0r, gw, dq) = pairs.as_ref().expect("formed above for the folded rows");
                                let (n, kno) = (a0r.len(), k * no);
                                let sin: f64 = (0..n).map(|x| a0r[x] * dot(d0, &dq[x * kno + c * no..x * kno + (c + 1) * no])).sum();
                                inner[pk] += sin;
                                if n > 0 {
                                    dd.clear();
                                    dd.resize(n * n, 0.0);
                                    gemm_abt_strided_add(&mut dd, n, &dq[c * no..], kno, &dq[c * no..], kno, n, n, no, 1.0);
                                    nbar[pk] += dot(gw, &dd);
                                }
                            }
                        }
                    }
                }
            }
            _ => unreachable!("a layer's test gradient and its integrated one have one form"),
        }
    }
    let mut total = 0.0;
    let mut count = 0;
    for pk in 0..n {
        // A pairwise `|J̄|²` may round below 0 where `J̄` nearly cancels.
        let den = (n0[pk] * nbar[pk].max(0.0)).sqrt();
        if den > 0.0 {
            total += 1.0 - (inner[pk] / den).clamp(-1.0, 1.0);
            count += 1;
        }
    }
    (total, count)
}

/// The rows' gradients at `t = 0` kept from a chunk's node rows where the rule has a node there
/// (the left rules), so that the measure needs no evaluation of its own (one more per point and
/// step: a tenth more evaluations under `left:10`; on LeNet-5 15.1 → 14.8 s kept).
pub(crate) struct AtZero {
    /// One [`RowGrad`] per parameter layer with `pc` rows (filled as they come).
    layers: Vec<RowGrad>,
    have: Vec<bool>,
}

impl AtZero {
    pub(crate) fn new(pc: usize) -> AtZero {
        AtZero { layers: Vec::new(), have: vec![false; pc] }
    }

    /// Keeps the rows at `t = 0` of a block of node rows (`parts` in row order, row r of point
    /// `point[r]` at time `t[r]`, K outputs).
    pub(crate) fn keep(&mut self, parts: &[Vec<RowGrad>], point: &[usize], t: &[f64], k: usize) {
        if !t.contains(&0.0) {
            return;
        }
        let pc = self.have.len();
        if self.layers.is_empty() {
            let Some(first) = parts.first() else { return };
            self.layers = first
                .iter()
                .map(|g| match g {
                    RowGrad::Factor { ne, out, .. } => RowGrad::Factor { acts: vec![0.0; pc * ne], deltas: vec![0.0; pc * k * out], ne: *ne, out: *out },
                    RowGrad::Formed { width, .. } => RowGrad::Formed { g: vec![0.0; pc * k * width], width: *width },
                })
                .collect();
        }
        let mut r0 = 0;
        for part in parts {
            let rows = match part.first() {
                Some(RowGrad::Factor { acts, ne, .. }) => acts.len() / (*ne).max(1),
                Some(RowGrad::Formed { g, width }) => g.len() / (k * width).max(1),
                None => 0,
            };
            for r in 0..rows {
                if t[r0 + r] != 0.0 {
                    continue;
                }
                let q = point[r0 + r];
                self.have[q] = true;
                for (dst, src) in self.layers.iter_mut().zip(part) {
                    match (dst, src) {
                        (RowGrad::Factor { acts, deltas, ne, out }, RowGrad::Factor { acts: a, deltas: d, .. }) => {
                            let (ne, kno) = (*ne, k * *out);
                            acts[q * ne..(q + 1) * ne].copy_from_slice(&a[r * ne..(r + 1) * ne]);
                            deltas[q * kno..(q + 1) * kno].copy_from_slice(&d[r * kno..(r + 1) * kno]);
                        }
                        (RowGrad::Formed { g, width }, RowGrad::Formed { g: h, .. }) => {
                            let kw = k * *width;
                            g[q * kw..(q + 1) * kw].copy_from_slice(&h[r * kw..(r + 1) * kw]);
                        }
                        _ => unreachable!("the same stack gives the same layer kinds"),
                    }
                }
            }
            r0 += rows;
        }
    }

    /// The kept gradients, when every point has its row at `t = 0`.
    pub(crate) fn take(self) -> Option<Vec<RowGrad>> {
        (!self.layers.is_empty() && self.have.iter().all(|&h| h)).then_some(self.layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form of `J̄` against the same `J̄` written out and the cosine computed on the
    /// flattened vectors.
    #[test]
    fn each_form_equals_the_written_out_cosine() {
        let (pc, k, ne) = (2usize, 3usize, 4usize);
        let val = |i: usize, s: f64| ((i as f64 + 1.0) * s).sin();
        // A dense layer with out = K (so that the output form applies), gradients at t = 0.
        let a0: Vec<f64> = (0..pc * ne).map(|i| val(i, 0.7)).collect();
        let d0: Vec<f64> = (0..pc * k * k).map(|i| val(i, 1.3)).collect();
        let g0 = RowGrad::Factor { acts: a0.clone(), deltas: d0.clone(), ne, out: k };
        // Written out: g_0^k = δ_0[k] ⊗ a_0, `[out, ne]`.
        let outer = |d: &[f64], a: &[f64]| -> Vec<f64> { d.iter().flat_map(|&x| a.iter().map(move |&y| x * y)).collect() };
        let cos = |g: &[Vec<f64>], j: &[Vec<f64>]| -> f64 {
            g.iter().zip(j).map(|(g, j)| 1.0 - dot(g, j) / (dot(g, g) * dot(j, j)).sqrt()).sum()
        };
        let g_out: Vec<Vec<f64>> = (0..pc * k).map(|pk| outer(&d0[pk * k..(pk + 1) * k], &a0[(pk / k) * ne..(pk / k + 1) * ne])).collect();
        // Formed.
        let j: Vec<f64> = (0..pc * k * k * ne).map(|i| val(i, 0.3)).collect();
        let j_out: Vec<Vec<f64>> = j.chunks(k * ne).map(<[f64]>::to_vec).collect();
        let (s, c) = add(std::slice::from_ref(&g0), &[Integrated::Formed(&j)], pc, k);
        assert_eq!(c, pc * k);
        assert!((s - cos(&g_out, &j_out)).abs() <= 1e-14, "formed {s} vs {}", cos(&g_out, &j_out));
        // Shared input.
        let ap: Vec<f64> = (0..pc * ne).map(|i| val(i, 0.9)).collect();
        let db: Vec<f64> = (0..pc * k * k).map(|i| val(i, 0.5)).collect();
        let j_out: Vec<Vec<f64>> = (0..pc * k).map(|pk| outer(&db[pk * k..(pk + 1) * k], &ap[(pk / k) * ne..(pk / k + 1) * ne])).collect();
        let (s, _) = add(std::slice::from_ref(&g0), &[Integrated::Shared { acts: &ap, dbar: &db }], pc, k);
        assert!((s - cos(&g_out, &j_out)).abs() <= 1e-14, "shared {s} vs {}", cos(&g_out, &j_out));
        // Output rows.
        let ab: Vec<f64> = (0..pc * (k + 1) * ne).map(|i| val(i, 0.45)).collect();
        let alpha = 0.8;
        let j_out: Vec<Vec<f64>> = (0..pc * k)
            .map(|pk| {
                let (q, kk) = (pk / k, pk % k);
                let abq = &ab[q * (k + 1) * ne..(q + 1) * (k + 1) * ne];
                (0..k).flat_map(|o| (0..ne).map(move |i| alpha * (if o == kk { abq[i] } else { 0.0 } - abq[(1 + o) * ne + i]))).collect()
            })
            .collect();
        let (s, _) = add(std::slice::from_ref(&g0), &[Integrated::Output { ab: &ab, alpha }], pc, k);
        assert!((s - cos(&g_out, &j_out)).abs() <= 1e-14, "output {s} vs {}", cos(&g_out, &j_out));
        // A folded layer's node rows (unsorted, two and three per point): `J̄` written out as
        // `Σ_r w_r δ_r[k] ⊗ a_r` against the pairwise products.
        let point = [1usize, 0, 1, 1, 0];
        let weight: Vec<f64> = (0..point.len()).map(|r| val(r, 0.65)).collect();
        let ra: Vec<f64> = (0..point.len() * ne).map(|i| val(i, 0.35)).collect();
        let rd: Vec<f64> = (0..point.len() * k * k).map(|i| val(i, 0.85)).collect();
        let j_out: Vec<Vec<f64>> = (0..pc * k)
            .map(|pk| {
                let (q, kk) = (pk / k, pk % k);
                let mut jq = vec![0.0; k * ne];
                for (r, _) in point.iter().enumerate().filter(|(_, &p)| p == q) {
                    let o = outer(&rd[(r * k + kk) * k..(r * k + kk + 1) * k], &ra[r * ne..(r + 1) * ne]);
                    jq.iter_mut().zip(o).for_each(|(a, b)| *a += weight[r] * b);
                }
                jq
            })
            .collect();
        let (s, _) = add(std::slice::from_ref(&g0), &[Integrated::Rows { point: &point, weight: &weight, acts: &ra, deltas: &rd }], pc, k);
        assert!((s - cos(&g_out, &j_out)).abs() <= 1e-14, "rows {s} vs {}", cos(&g_out, &j_out));
        // A formed layer, and two layers summed before the cosine.
        let w = 5;
        let gf: Vec<f64> = (0..pc * k * w).map(|i| val(i, 1.7)).collect();
        let jf: Vec<f64> = (0..pc * k * w).map(|i| val(i, 0.2)).collect();
        let both_g: Vec<Vec<f64>> = (0..pc * k).map(|pk| [g_out[pk].clone(), gf[pk * w..(pk + 1) * w].to_vec()].concat()).collect();
        let both_j: Vec<Vec<f64>> = (0..pc * k).map(|pk| [j.chunks(k * ne).nth(pk).unwrap().to_vec(), jf[pk * w..(pk + 1) * w].to_vec()].concat()).collect();
        let (s, _) = add(&[g0, RowGrad::Formed { g: gf, width: w }], &[Integrated::Formed(&j), Integrated::Formed(&jf)], pc, k);
        assert!((s - cos(&both_g, &both_j)).abs() <= 1e-14, "two layers {s} vs {}", cos(&both_g, &both_j));
    }
}
