/* The element-wise and gather kernels of the batched node evaluation (forward and backward of a
 * layer stack on node rows, each row at its own point w_s + t·Δw of a step), written once and
 * compiled twice:
 *
 *   - for the host, as C (build.rs with the `cc` crate, through kernels/host.c): the ordinary
 *     tests run every kernel there against the CPU engine's layers (src/device/tests.rs);
 *   - for a GPU, as CUDA C++ by NVRTC (scripts/gpu/ptx.py, `--fmad=false` so that the device's
 *     arithmetic rounds as the host's): the bundle carries the PTX, cudarc loads it.
 *
 * Every kernel takes the number of work items `n` first and covers them with PK_LOOP: one item
 * per thread in a grid-stride loop on the device, a plain loop on the host. Items are written
 * by exactly one iteration (gathers, never scattered `+=`), so the two builds sum in the same
 * order. The GEMMs are not here: cuBLAS on the device, faer on the host (src/device/mod.rs).
 *
 * Layouts are PyTorch's, row-major: a sample's map [C, H, W]; a batch [n, ·]; K cotangent rows
 * per sample [n, K, ·]; a convolution's patches [n, P, C·k·k] (P = Ho·Wo positions); indices
 * (max-pool winners) are stored as doubles (exact below 2^53). Argument lists must match the
 * declarations in src/device/kernels.rs. */

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define PK_KERNEL extern "C" __global__ void
#define PK_DEVFN static __device__ __forceinline__
#define PK_LOOP(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)blockDim.x * gridDim.x)
#else
#include <math.h>
#define PK_KERNEL void
#define PK_DEVFN static inline
#define PK_LOOP(i, n) for (long long i = 0; i < (n); i++)
#endif

typedef long long i64;

/* The activation kinds, as src/device/kernels.rs numbers them. */
#define PK_RELU 0
#define PK_LEAKY_RELU 1
#define PK_TANH 2
#define PK_SIGMOID 3
#define PK_SOFTPLUS 4
#define PK_GELU 5
#define PK_SILU 6

PK_DEVFN double pk_sigmoid(double z) {
    if (z >= 0.0) {
        return 1.0 / (1.0 + exp(-z));
    }
    double e = exp(z);
    return e / (1.0 + e);
}

PK_DEVFN double pk_phi(double z) {
    return 0.5 * (1.0 + erf(z * 0.70710678118654752440));
}

PK_DEVFN double pk_act_value(int kind, double slope, double z) {
    switch (kind) {
    case PK_RELU: return z > 0.0 ? z : 0.0;
    case PK_LEAKY_RELU: return z > 0.0 ? z : slope * z;
    case PK_TANH: return tanh(z);
    case PK_SIGMOID: return pk_sigmoid(z);
    case PK_SOFTPLUS: return (z > 0.0 ? z : 0.0) + log1p(exp(-fabs(z)));
    case PK_GELU: return z * pk_phi(z);
    default: return z * pk_sigmoid(z);
    }
}

PK_DEVFN double pk_act_derivative(int kind, double slope, double z) {
    switch (kind) {
    case PK_RELU: return z > 0.0 ? 1.0 : 0.0;
    case PK_LEAKY_RELU: return z > 0.0 ? 1.0 : slope;
    case PK_TANH: {
        double t = tanh(z);
        return 1.0 - t * t;
    }
    case PK_SIGMOID: {
        double s = pk_sigmoid(z);
        return s * (1.0 - s);
    }
    case PK_SOFTPLUS: return pk_sigmoid(z);
    case PK_GELU: return pk_phi(z) + z * exp(-0.5 * z * z) * 0.39894228040143267794;
    default: {
        double s = pk_sigmoid(z);
        return s * (1.0 + z * (1.0 - s));
    }
    }
}

/* y0 += t_s·y1 with `per` numbers per sample s: the per-row combine of a layer linear in its
 * parameters, y(w_s + tΔw) = y(w_s) + t·y(Δw). n = samples·per. */
PK_KERNEL pk_combine(i64 n, i64 per, const double *t, const double *y1, double *y0) {
    PK_LOOP(i, n) {
        double ts = t[i / per];
        if (ts != 0.0) {
            y0[i] += ts * y1[i];
        }
    }
}

/* y[r, j, q] += b[j] for y [rows, out, inner] (a dense layer: inner = 1; a convolution's
 * [Co, P]: inner = P). n = rows·out·inner. */
PK_KERNEL pk_add_bias(i64 n, i64 out, i64 inner, const double *b, double *y) {
    PK_LOOP(i, n) {
        y[i] += b[(i / inner) % out];
    }
}

/* y = σ(x). n = numbers. */
PK_KERNEL pk_act(i64 n, i64 kind, double slope, const double *x, double *y) {
    PK_LOOP(i, n) {
        y[i] = pk_act_value((int)kind, slope, x[i]);
    }
}

/* dy[s, k, j] *= σ'(x[s, j]) in place (`per` numbers per sample, `k` rows per sample).
 * n = samples·k·per. */
PK_KERNEL pk_act_back(i64 n, i64 per, i64 k, i64 kind, double slope, const double *x, double *dy) {
    PK_LOOP(i, n) {
        i64 s = i / (k * per), j = i % per;
        dy[i] *= pk_act_derivative((int)kind, slope, x[s * per + j]);
    }
}

/* im2col: u[s, pos, (c·kk + ki)·kk + kj] = x[s, c, oy·stride + ki − pad, ox·stride + kj − pad]
 * (0 in the padding), pos = oy·wo + ox. n = samples·ho·wo·c·kk·kk. */
PK_KERNEL pk_im2col(i64 n, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 pad, i64 ho, i64 wo, const double *x, double *u) {
    PK_LOOP(i, n) {
        i64 taps = c * kk * kk, p = ho * wo;
        i64 tap = i % taps, pos = (i / taps) % p, s = i / (taps * p);
        i64 ch = tap / (kk * kk), ki = (tap / kk) % kk, kj = tap % kk;
        i64 iy = (pos / wo) * stride + ki - pad, ix = (pos % wo) * stride + kj - pad;
        u[i] = (iy >= 0 && ix >= 0 && iy < h && ix < w) ? x[((s * c + ch) * h + iy) * w + ix] : 0.0;
    }
}

/* col2im as a gather: dx[r, c, y, x] = Σ du[r, pos, tap] over the patch entries that read
 * (c, y, x), positions in increasing order. n = rows·c·h·w. */
PK_KERNEL pk_col2im(i64 n, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 pad, i64 ho, i64 wo, const double *du, double *dx) {
    PK_LOOP(i, n) {
        i64 size = c * h * w, taps = c * kk * kk, p = ho * wo;
        i64 q = i % size, r = i / size;
        i64 ch = q / (h * w), iy = (q / w) % h, ix = q % w;
        double acc = 0.0;
        for (i64 ki = kk - 1; ki >= 0; ki--) {
            i64 ny = iy + pad - ki;
            if (ny < 0 || ny % stride != 0 || ny / stride >= ho) {
                continue;
            }
            for (i64 kj = kk - 1; kj >= 0; kj--) {
                i64 nx = ix + pad - kj;
                if (nx < 0 || nx % stride != 0 || nx / stride >= wo) {
                    continue;
                }
                i64 pos = (ny / stride) * wo + nx / stride;
                acc += du[(r * p + pos) * taps + (ch * kk + ki) * kk + kj];
            }
        }
        dx[i] = acc;
    }
}

/* Max pooling (no padding, floor mode): y[s, c, oy, ox] = the window's first maximum in
 * row-major order, arg its offset within the sample. n = samples·c·ho·wo. */
PK_KERNEL pk_maxpool(i64 n, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 ho, i64 wo, const double *x, double *y, double *arg) {
    PK_LOOP(i, n) {
        i64 ox = i % wo, oy = (i / wo) % ho, ch = (i / (wo * ho)) % c, s = i / (wo * ho * c);
        const double *xs = x + s * c * h * w;
        i64 best = -1;
        for (i64 a = 0; a < kk; a++) {
            for (i64 b = 0; b < kk; b++) {
                i64 q = (ch * h + oy * stride + a) * w + ox * stride + b;
                if (best < 0 || xs[q] > xs[best]) {
                    best = q;
                }
            }
        }
        y[i] = xs[best];
        arg[i] = (double)best;
    }
}

/* Max pooling's input sensitivities as a gather: dx[r, c, y, x] = Σ dy[r, c, oy, ox] over the
 * windows that cover (y, x) and whose winner it is (r = s·k + class). n = rows·c·h·w. */
PK_KERNEL pk_maxpool_back(i64 n, i64 k, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 ho, i64 wo, const double *arg, const double *dy, double *dx) {
    PK_LOOP(i, n) {
        i64 size = c * h * w, out = c * ho * wo;
        i64 q = i % size, r = i / size, s = r / k;
        i64 ch = q / (h * w), iy = (q / w) % h, ix = q % w;
        i64 oy0 = iy >= kk ? (iy - kk) / stride + 1 : 0, ox0 = ix >= kk ? (ix - kk) / stride + 1 : 0;
        double acc = 0.0;
        for (i64 oy = oy0; oy <= iy / stride && oy < ho; oy++) {
            for (i64 ox = ox0; ox <= ix / stride && ox < wo; ox++) {
                i64 j = (ch * ho + oy) * wo + ox;
                if (arg[s * out + j] == (double)q) {
                    acc += dy[r * out + j];
                }
            }
        }
        dx[i] = acc;
    }
}

/* Average pooling (no padding, floor mode). n = samples·c·ho·wo. */
PK_KERNEL pk_avgpool(i64 n, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 ho, i64 wo, const double *x, double *y) {
    PK_LOOP(i, n) {
        i64 ox = i % wo, oy = (i / wo) % ho, ch = (i / (wo * ho)) % c, s = i / (wo * ho * c);
        const double *xs = x + s * c * h * w;
        double acc = 0.0;
        for (i64 a = 0; a < kk; a++) {
            for (i64 b = 0; b < kk; b++) {
                acc += xs[(ch * h + oy * stride + a) * w + ox * stride + b];
            }
        }
        y[i] = acc / (double)(kk * kk);
    }
}

/* Average pooling's input sensitivities as a gather. n = rows·c·h·w. */
PK_KERNEL pk_avgpool_back(i64 n, i64 c, i64 h, i64 w, i64 kk, i64 stride, i64 ho, i64 wo, const double *dy, double *dx) {
    PK_LOOP(i, n) {
        i64 size = c * h * w, out = c * ho * wo;
        i64 q = i % size, r = i / size;
        i64 ch = q / (h * w), iy = (q / w) % h, ix = q % w;
        i64 oy0 = iy >= kk ? (iy - kk) / stride + 1 : 0, ox0 = ix >= kk ? (ix - kk) / stride + 1 : 0;
        double acc = 0.0;
        for (i64 oy = oy0; oy <= iy / stride && oy < ho; oy++) {
            for (i64 ox = ox0; ox <= ix / stride && ox < wo; ox++) {
                acc += dy[r * out + (ch * ho + oy) * wo + ox];
            }
        }
        dx[i] = acc / (double)(kk * kk);
    }
}

/* The output map of K raw outputs per row, in place, and its sensitivities: g ← α(g − off)
 * (off only when has_off), then log-softmax of the row when log_softmax; seeds[r, c, o] =
 * ∂f^c/∂g^o = α(δ_co − p_o) (log-softmax) or α·δ_co. One item per row: n = rows. */
PK_KERNEL pk_output_seeds(i64 n, i64 k, i64 log_softmax, double alpha, i64 has_off, const double *off, double *g, double *seeds) {
    PK_LOOP(r, n) {
        double *z = g + r * k;
        double *s = seeds + r * k * k;
        for (i64 o = 0; o < k; o++) {
            if (has_off) {
                z[o] -= off[r * k + o];
            }
            z[o] *= alpha;
        }
        if (log_softmax) {
            double m = z[0];
            for (i64 o = 1; o < k; o++) {
                m = z[o] > m ? z[o] : m;
            }
            double sum = 0.0;
            for (i64 o = 0; o < k; o++) {
                sum += exp(z[o] - m);
            }
            double lse = m + log(sum);
            for (i64 o = 0; o < k; o++) {
                z[o] -= lse;
            }
            for (i64 c = 0; c < k; c++) {
                for (i64 o = 0; o < k; o++) {
                    s[c * k + o] = alpha * ((c == o ? 1.0 : 0.0) - exp(z[o]));
                }
            }
        } else {
            for (i64 c = 0; c < k; c++) {
                for (i64 o = 0; o < k; o++) {
                    s[c * k + o] = c == o ? alpha : 0.0;
                }
            }
        }
    }
}

/* y[r, 0..m] = x[r, ·], y[r, m] = 1: a dense layer's activations with the bias column.
 * n = rows·(m + 1). */
PK_KERNEL pk_append_one(i64 n, i64 m, const double *x, double *y) {
    PK_LOOP(i, n) {
        i64 r = i / (m + 1), j = i % (m + 1);
        y[i] = j < m ? x[r * m + j] : 1.0;
    }
}

/* out[r·stride + offset + o] = Σ_q dy[r, o, q] for dy [rows, out, inner] (a convolution's
 * bias gradient per row, written into its formed gradient). n = rows·out. */
PK_KERNEL pk_row_sums(i64 n, i64 out, i64 inner, i64 stride, i64 offset, const double *dy, double *dst) {
    PK_LOOP(i, n) {
        i64 r = i / out, o = i % out;
        const double *v = dy + i * inner;
        double acc = 0.0;
        for (i64 q = 0; q < inner; q++) {
            acc += v[q];
        }
        dst[r * stride + offset + o] = acc;
    }
}

/* y += x. n = numbers. */
PK_KERNEL pk_add(i64 n, const double *x, double *y) {
    PK_LOOP(i, n) {
        y[i] += x[i];
    }
}

/* Offset of value c of group pos in one sample of a layer norm: a sequence's row pos
 * (pos·g + c), else a map's channel column (c·positions + pos; a flat vector has one group). */
PK_DEVFN i64 pk_norm_at(i64 seq, i64 g, i64 positions, i64 c, i64 pos) {
    return seq ? pos * g + c : c * positions + pos;
}

/* Layer norm forward, one item per group (s, pos): x̂ = (x − μ)/√(σ² + ε) (biased variance),
 * y = γ(t_s) ⊙ x̂ + β(t_s) with γ(t) = γ + t·Δγ; keeps x̂ and 1/√(σ² + ε).
 * n = samples·positions. */
PK_KERNEL pk_norm(i64 n, i64 g, i64 positions, i64 seq, double eps, const double *t, const double *gamma, const double *dgamma, const double *beta, const double *dbeta, const double *x, double *y, double *xhat, double *rstd) {
    PK_LOOP(i, n) {
        i64 s = i / positions, pos = i % positions, size = g * positions;
        double ts = t[s];
        const double *xs = x + s * size;
        double mean = 0.0, var = 0.0;
        for (i64 c = 0; c < g; c++) {
            mean += xs[pk_norm_at(seq, g, positions, c, pos)];
        }
        mean /= (double)g;
        for (i64 c = 0; c < g; c++) {
            double d = xs[pk_norm_at(seq, g, positions, c, pos)] - mean;
            var += d * d;
        }
        var /= (double)g;
        double r = 1.0 / sqrt(var + eps);
        rstd[i] = r;
        for (i64 c = 0; c < g; c++) {
            i64 q = s * size + pk_norm_at(seq, g, positions, c, pos);
            double gm = ts != 0.0 ? gamma[c] + ts * dgamma[c] : gamma[c];
            double bt = ts != 0.0 ? beta[c] + ts * dbeta[c] : beta[c];
            xhat[q] = (x[q] - mean) * r;
            y[q] = gm * xhat[q] + bt;
        }
    }
}

/* Layer norm's input sensitivities, one item per group of a cotangent row (r, pos), r = s·k + c:
 * dx = r_s (dy⊙γ − mean(dy⊙γ) − x̂·mean(dy⊙γ⊙x̂)). n = rows·positions. */
PK_KERNEL pk_norm_back(i64 n, i64 k, i64 g, i64 positions, i64 seq, const double *t, const double *gamma, const double *dgamma, const double *xhat, const double *rstd, const double *dy, double *dx) {
    PK_LOOP(i, n) {
        i64 row = i / positions, pos = i % positions, s = row / k, size = g * positions;
        double ts = t[s];
        const double *d = dy + row * size;
        const double *xh = xhat + s * size;
        double m1 = 0.0, m2 = 0.0;
        for (i64 c = 0; c < g; c++) {
            i64 q = pk_norm_at(seq, g, positions, c, pos);
            double gm = ts != 0.0 ? gamma[c] + ts * dgamma[c] : gamma[c];
            m1 += d[q] * gm;
            m2 += d[q] * gm * xh[q];
        }
        m1 /= (double)g;
        m2 /= (double)g;
        double r = rstd[s * positions + pos];
        for (i64 c = 0; c < g; c++) {
            i64 q = pk_norm_at(seq, g, positions, c, pos);
            double gm = ts != 0.0 ? gamma[c] + ts * dgamma[c] : gamma[c];
            dx[row * size + q] = r * (d[q] * gm - m1 - xh[q] * m2);
        }
    }
}

/* Layer norm's parameter gradients per cotangent row: pg[r, c] = Σ_pos dy·x̂ (γ), pg[r, g + c] =
 * Σ_pos dy (β), positions in order. n = rows·g. */
PK_KERNEL pk_norm_grads(i64 n, i64 k, i64 g, i64 positions, i64 seq, const double *xhat, const double *dy, double *pg) {
    PK_LOOP(i, n) {
        i64 row = i / g, c = i % g, s = row / k, size = g * positions;
        double a = 0.0, b = 0.0;
        for (i64 pos = 0; pos < positions; pos++) {
            i64 q = pk_norm_at(seq, g, positions, c, pos);
            a += dy[row * size + q] * xhat[s * size + q];
            b += dy[row * size + q];
        }
        pg[row * 2 * g + c] = a;
        pg[row * 2 * g + g + c] = b;
    }
}

/* The weighted sum of each segment of rows: out[p, c] = Σ_j wt[j]·g[j, c] over the rows j of
 * segment p, [start[p], start[p+1]) clamped to [0, rows), in order (a point's node rows into
 * its integral). n = segments·width. */
PK_KERNEL pk_segment_sum(i64 n, i64 width, i64 rows, const double *start, const double *wt, const double *g, double *out) {
    PK_LOOP(i, n) {
        i64 p = i / width, c = i % width;
        i64 j0 = (i64)start[p], j1 = (i64)start[p + 1];
        j0 = j0 < 0 ? 0 : (j0 > rows ? rows : j0);
        j1 = j1 < j0 ? j0 : (j1 > rows ? rows : j1);
        double acc = 0.0;
        for (i64 j = j0; j < j1; j++) {
            acc += wt[j] * g[j * width + c];
        }
        out[i] = acc;
    }
}

/* ---- The Gram's contraction resident on the device (src/kernel/backend/resident.rs): the
 * element-wise passes after its GEMMs, each item owning the Gram entries it adds to. ---- */

/* y += c. n = numbers. */
PK_KERNEL pk_add_scalar(i64 n, double c, double *y) {
    PK_LOOP(i, n) {
        y[i] += c;
    }
}

/* Layer 0's fold: the Gram rows of points p0.. (rpp accumulation rows per point, m·cols numbers
 * a row) += s0[p, i] ∘ the product of the block of nb points, row by row (`diag`: the product
 * class-major [c, p, i], the rows (p, c)). n = nb·rpp·m·cols. */
PK_KERNEL pk_fold_scaled(i64 n, i64 m, i64 cols, i64 rpp, i64 k, i64 diag, i64 nb, i64 p0, const double *s0, const double *prod, double *g) {
    PK_LOOP(e, n) {
        i64 row = e / (m * cols), j = e % (m * cols), i = j / cols, pl = row / rpp;
        double sv = s0[(p0 + pl) * m + i];
        double pv = diag ? prod[((row % k) * nb + row / k) * m + i] : prod[e];
        g[p0 * rpp * m * cols + e] += sv * pv;
    }
}

/* The output layer's fold against a structured training side (`diag`, `trace`): with
 * T = [T_A; T_B[0..K]] per point ([nb·(K+1), M]) and S[i] = Σ_o q[o, i] T_B[o][i],
 * G[(p, c), i] += scale·w[c, i]·(T_A[i](1 − q[c, i]) − T_B[c][i] + S[i]) (`trace`: summed over c
 * into G[p, i]). One item per (point, i). n = nb·m. */
PK_KERNEL pk_fold_soft(i64 n, i64 m, i64 k, i64 trace, i64 has_w, double scale, i64 p0, const double *tb, const double *q, const double *w, double *g) {
    PK_LOOP(e, n) {
        i64 pl = e / m, i = e % m;
        const double *t = tb + pl * (k + 1) * m;
        double s = 0.0;
        for (i64 o = 0; o < k; o++) {
            s += q[o * m + i] * t[(1 + o) * m + i];
        }
        double ta = t[i];
        for (i64 c = 0; c < k; c++) {
            double qc = q[c * m + i], b = t[(1 + c) * m + i];
            double v = has_w ? scale * w[c * m + i] * (ta * (1.0 - qc) - b + s) : scale * (ta * (1.0 - qc) - b + s);
            if (trace) {
                g[(p0 + pl) * m + i] += v;
            } else {
                g[((p0 + pl) * k + c) * m + i] += v;
            }
        }
    }
}

/* The output layer's fold in the `full` layout against formed training sensitivities
 * d [o, (i, k')] (= δ_i[k', o]): G[(p, k), (i, k')] += α T_A[i] d[k, (i, k')] −
 * Σ_o α T_B[o][i] d[o, (i, k')]. One item per Gram entry. n = nb·K·M·K. */
PK_KERNEL pk_fold_output_full(i64 n, i64 m, i64 k, double alpha, i64 p0, const double *tb, const double *d, double *g) {
    PK_LOOP(e, n) {
        i64 mk = m * k, row = e / mk, j = e % mk, pl = row / k, kt = row % k, i = j / k;
        const double *t = tb + pl * (k + 1) * m;
        double acc = g[p0 * k * mk + e];
        acc += (alpha * t[i]) * d[kt * mk + j];
        for (i64 o = 0; o < k; o++) {
            acc += (-alpha * t[(1 + o) * m + i]) * d[o * mk + j];
        }
        g[p0 * k * mk + e] = acc;
    }
}
