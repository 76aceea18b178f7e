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
#define PK_INF __longlong_as_double(0x7ff0000000000000LL)
#define PK_NAN __longlong_as_double(0x7ff8000000000000LL)
#else
#include <math.h>
#define PK_KERNEL void
#define PK_DEVFN static inline
#define PK_LOOP(i, n) for (long long i = 0; i < (n); i++)
#define PK_INF INFINITY
#define PK_NAN NAN
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

/* Writes one step's layer-0 factors [(pt, c), o] of the points first.. into slot `slot` of a
 * layer-0 step buffer of npts points (src/kernel/gram.rs' Layer0Sum: layout 0 `full`
 * [(p, c), slot, o], 1 `diag` [c, p, slot, o], 2 `trace` [p, slot, c, o]), scaled by
 * w[pt, c] when has_w (Chen's column weights). n = rows·h. */
PK_KERNEL pk_put_slot(i64 n, i64 k, i64 h, i64 slots, i64 slot, i64 layout, i64 npts, i64 first, i64 has_w, const double *src, const double *w, double *dst) {
    PK_LOOP(e, n) {
        i64 row = e / h, o = e % h, pt = first + row / k, c = row % k, at;
        if (layout == 0) {
            at = ((pt * k + c) * slots + slot) * h + o;
        } else if (layout == 1) {
            at = ((c * npts + pt) * slots + slot) * h + o;
        } else {
            at = ((pt * slots + slot) * k + c) * h + o;
        }
        dst[at] = has_w ? w[pt * k + c] * src[e] : src[e];
    }
}

/* ---- The `dense → relu → dense` closed form's rows on the device
 * (src/kernel/stack/closed/dense_relu/pieces.rs, the same arithmetic in the same order): one
 * item per row point, its hidden pre-activations z + t·u along the step, integrated piece by
 * piece between their kinks. ---- */

/* Scratch numbers one point needs (see pk_mlp_pieces). */
PK_DEVFN i64 pk_pieces_scratch(i64 h, i64 k, i64 ne) {
    return 5 * h + 2 + 2 * ne + 13 * k + 6 * k * k;
}

PK_DEVFN double pk_dot(const double *x, const double *y, i64 n) {
    double s = 0.0;
    for (i64 j = 0; j < n; j++) {
        s += x[j] * y[j];
    }
    return s;
}

/* Layer 0's training sensitivities of the closed form at w_s (step.rs' MlpStep::eval):
 * δ0[i, k, o'] = σ'(z_io')·Σ_o d1[i, k, o] W1[o, o'], the ReLU's derivative read from the
 * activations a1 = max(z, 0) [M, ne] (1 where a1 > 0). One item per (i, k, o'). n = M·K·h. */
PK_KERNEL pk_mlp_delta0(i64 n, i64 k, i64 h, i64 ne, const double *d1, const double *a1, const double *w1, double *d0) {
    PK_LOOP(e, n) {
        i64 row = e / h, o2 = e % h, i = row / k;
        double s = 0.0;
        for (i64 o = 0; o < k; o++) {
            s += d1[row * k + o] * w1[o * h + o2];
        }
        d0[e] = s * (a1[i * ne + o2] > 0.0 ? 1.0 : 0.0);
    }
}

/* The closed form's prediction ⟨∫∇f^k, v⟩ of n/k points (src/kernel/stack/closed/dense_relu/
 * model.rs, the same order): layer 0 as δ̄[k]·(V_0 x̃), the output layer as
 * α(Ā·V_1[k] − Σ_o B̄[o]·V_1[o]). One item per (point, k). */
PK_KERNEL pk_mlp_predict(i64 n, i64 k, i64 h, i64 ne, double alpha, const double *dbar, const double *vx, const double *ab, const double *v1, double *pred) {
    PK_LOOP(e, n) {
        i64 pl = e / k, kt = e % k;
        const double *abp = ab + pl * (k + 1) * ne;
        double bv = 0.0;
        for (i64 o = 0; o < k; o++) {
            bv += pk_dot(abp + (1 + o) * ne, v1 + o * ne, ne);
        }
        double l0 = pk_dot(dbar + e * h, vx + pl * h, h);
        double l1 = alpha * (pk_dot(abp, v1 + kt * ne, ne) - bv);
        pred[e] = l0 + l1;
    }
}

/* Adds w·[p(t), t p(t), D H(t) Dᵀ] of one node to acc [2K + K²] (quadrature/piece.rs'
 * Piece::add_node). */
PK_DEVFN void pk_piece_node(i64 k, double alpha, const double *c, const double *hm, const double *off, int softmax, double t, double w, double *acc, double *p, double *hp) {
    double a2 = alpha * alpha;
    i64 hk = k * k;
    if (softmax) {
        for (i64 o = 0; o < k; o++) {
            double z = c[o] + t * (c[k + o] + t * c[2 * k + o]);
            p[o] = alpha * (z - (off ? off[o] : 0.0));
        }
        double mx = -PK_INF;
        for (i64 o = 0; o < k; o++) {
            mx = p[o] > mx ? p[o] : mx;
        }
        double sum = 0.0;
        for (i64 o = 0; o < k; o++) {
            p[o] = exp(p[o] - mx);
            sum += p[o];
        }
        for (i64 o = 0; o < k; o++) {
            p[o] /= sum;
        }
        for (i64 o = 0; o < k; o++) {
            acc[o] += w * p[o];
            acc[k + o] += w * t * p[o];
        }
    }
    double *dg = acc + 2 * k;
    if (softmax) {
        double php = 0.0;
        for (i64 o = 0; o < k; o++) {
            double s = 0.0;
            for (i64 q = 0; q < k; q++) {
                s += (hm[o * k + q] + t * (hm[hk + o * k + q] + t * hm[2 * hk + o * k + q])) * p[q];
            }
            hp[o] = s;
            php += p[o] * hp[o];
        }
        for (i64 o = 0; o < k; o++) {
            for (i64 q = 0; q < k; q++) {
                double ht = hm[o * k + q] + t * (hm[hk + o * k + q] + t * hm[2 * hk + o * k + q]);
                dg[o * k + q] += w * a2 * (ht - hp[o] - hp[q] + php);
            }
        }
    } else {
        for (i64 o = 0; o < k; o++) {
            for (i64 q = 0; q < k; q++) {
                dg[o * k + q] += w * a2 * (hm[o * k + q] + t * (hm[hk + o * k + q] + t * hm[2 * hk + o * k + q]));
            }
        }
    }
}

/* The largest |x − y| over n, NaN if any is (Piece::integrate's `diff`). */
PK_DEVFN double pk_maxdiff(const double *x, const double *y, i64 n) {
    double m = 0.0;
    for (i64 j = 0; j < n; j++) {
        double d = fabs(x[j] - y[j]);
        if (d != d || m != m) {
            m = PK_NAN;
        } else {
            m = d > m ? d : m;
        }
    }
    return m;
}

/* One piece [a, b] by Gauss–Legendre 8 against 16, bisected until they agree
 * (Piece::integrate): the moments and self-kernel into total [2K + K²]; returns the unconverged
 * intervals. gl: the two rules on [−1, 1], nodes then weights (8, 8, 16, 16). */
PK_DEVFN i64 pk_piece_integrate(i64 k, double alpha, const double *c, const double *hm, const double *off, int softmax, double a, double b, double tol, const double *gl, double *total, double *q1, double *q2, double *p, double *hp) {
    i64 n = 2 * k + k * k, bad = 0, spent = 0, top = 0;
    double hscale = 0.0;
    for (i64 j = 0; j < 3 * k * k; j++) {
        double v = fabs(hm[j]);
        hscale = v > hscale ? v : hscale;
    }
    hscale = alpha * alpha * hscale;
    double slo[64], shi[64];
    int sdepth[64];
    for (i64 j = 0; j < n; j++) {
        total[j] = 0.0;
    }
    slo[0] = a;
    shi[0] = b;
    sdepth[0] = 0;
    top = 1;
    while (top > 0) {
        top--;
        double lo = slo[top], hi = shi[top];
        int depth = sdepth[top];
        spent++;
        for (int r = 0; r < 2; r++) {
            double *q = r == 0 ? q1 : q2;
            i64 order = r == 0 ? 8 : 16;
            const double *x = r == 0 ? gl : gl + 16;
            const double *wt = x + order;
            for (i64 j = 0; j < n; j++) {
                q[j] = 0.0;
            }
            double h = hi - lo;
            for (i64 j = 0; j < order; j++) {
                pk_piece_node(k, alpha, c, hm, off, softmax, lo + 0.5 * h * (x[j] + 1.0), 0.5 * h * wt[j], q, p, hp);
            }
        }
        double rel = (tol > 8.0 * 2.220446049250313e-16 ? tol : 8.0 * 2.220446049250313e-16) * (hi - lo);
        double es = pk_maxdiff(q1, q2, 2 * k), ed = pk_maxdiff(q1 + 2 * k, q2 + 2 * k, k * k);
        double floor = hscale > 2.2250738585072014e-308 ? hscale : 2.2250738585072014e-308;
        int ok = es <= rel && ed <= rel * floor;
        int give_up = es != es || ed != ed || depth >= 40 || hi - lo <= 1e-12 || spent + top >= 4096 || top + 2 > 64;
        if (ok || give_up) {
            if (!ok) {
                bad++;
            }
            for (i64 j = 0; j < n; j++) {
                total[j] += q2[j];
            }
        } else {
            double mid = 0.5 * (lo + hi);
            slo[top] = lo;
            shi[top] = mid;
            sdepth[top] = depth + 1;
            top++;
            slo[top] = mid;
            shi[top] = hi;
            sdepth[top] = depth + 1;
            top++;
        }
    }
    return bad;
}

/* The rows' factors of n points (RowFactors: δ̄ [n, K, h], [Ā; B̄] [n, K+1, ne], the self-kernel
 * [n, K, K], and per point [pieces, unconverged, cosine sum, cosine count]); the output layer
 * w, dw [K, h], b, db [K]; z, u [n, h] the hidden pre-activation lines; xsq [n] = |x|² + bias.
 * One item per point, its scratch its own (pk_pieces_scratch numbers). */
PK_KERNEL pk_mlp_pieces(i64 n, i64 h, i64 k, i64 bias, i64 softmax, i64 has_off, i64 cosine, double alpha, double tol, const double *z, const double *u, const double *xsq, const double *off, const double *w, const double *dw, const double *b, const double *db, const double *gl, double *scratch, double *dbar, double *ab, double *diag, double *stats) {
    PK_LOOP(pi, n) {
        i64 ne = h + (bias ? 1 : 0), nq = 2 * k + k * k;
        double *s = scratch + pi * pk_pieces_scratch(h, k, ne);
        double *cuts = s, *mask = cuts + h + 2, *y = mask + h, *wp = y + h, *d0 = wp + h;
        double *a0 = d0 + h, *a1 = a0 + ne, *c = a1 + ne, *hm = c + 3 * k, *p = hm + 3 * k * k;
        double *hp = p + k, *p0 = hp + k, *a0b = p0 + k, *q1 = a0b + k, *q2 = q1 + nq, *tot = q2 + nq;
        const double *zp = z + pi * h, *up = u + pi * h, *offp = has_off ? off + pi * k : 0;
        double xs = xsq[pi];
        double *dbp = dbar + pi * k * h, *abp = ab + pi * (k + 1) * ne, *dgp = diag + pi * k * k, *st = stats + pi * 4;
        for (i64 j = 0; j < k * h; j++) dbp[j] = 0.0;
        for (i64 j = 0; j < (k + 1) * ne; j++) abp[j] = 0.0;
        for (i64 j = 0; j < k * k; j++) dgp[j] = 0.0;
        for (i64 j = 0; j < ne; j++) {
            a0[j] = 0.0;
            a1[j] = 0.0;
        }
        if (bias) a0[h] = 1.0;
        /* The kinks in (0, 1), sorted, within 1e-15 of the last kept merged (relu_cuts). */
        i64 nc = 0;
        cuts[nc++] = 0.0;
        for (i64 j = 0; j < h; j++) {
            double zv = zp[j], uv = up[j];
            double m = fabs(zv) > fabs(uv) ? fabs(zv) : fabs(uv);
            if (fabs(uv) > 1e-15 * m) {
                double t = -zv / uv;
                if (t > 0.0 && t < 1.0) {
                    i64 at = nc;
                    while (at > 1 && cuts[at - 1] > t) {
                        cuts[at] = cuts[at - 1];
                        at--;
                    }
                    cuts[at] = t;
                    nc++;
                }
            }
        }
        i64 kept = 1;
        for (i64 j = 1; j < nc; j++) {
            if (kept > 1 && fabs(cuts[kept - 1] - cuts[j]) <= 1e-15) continue;
            cuts[kept++] = cuts[j];
        }
        cuts[kept++] = 1.0;
        double pieces = 0.0, unconverged = 0.0;
        for (i64 piece = 0; piece + 1 < kept; piece++) {
            double a = cuts[piece], bb = cuts[piece + 1], tm = 0.5 * (a + bb);
            for (i64 j = 0; j < h; j++) {
                int on = zp[j] + tm * up[j] > 0.0;
                mask[j] = on ? 1.0 : 0.0;
                a0[j] = on ? zp[j] : 0.0;
                a1[j] = on ? up[j] : 0.0;
            }
            for (i64 o = 0; o < k; o++) {
                const double *wo = w + o * h, *dwo = dw + o * h;
                c[o] = pk_dot(wo, a0, h) + b[o];
                c[k + o] = pk_dot(dwo, a0, h) + pk_dot(wo, a1, h) + db[o];
                c[2 * k + o] = pk_dot(dwo, a1, h);
            }
            for (i64 o = 0; o < k; o++) {
                const double *wo = w + o * h, *dwo = dw + o * h;
                for (i64 q = o; q < k; q++) {
                    const double *wq = w + q * h, *dwq = dw + q * h;
                    double g0 = 0.0, g1 = 0.0, g2 = 0.0;
                    for (i64 j = 0; j < h; j++) {
                        double mj = mask[j];
                        g0 += mj * wo[j] * wq[j];
                        g1 += mj * (wo[j] * dwq[j] + dwo[j] * wq[j]);
                        g2 += mj * dwo[j] * dwq[j];
                    }
                    double g[3] = {g0, g1, g2};
                    for (int m = 0; m < 3; m++) {
                        hm[(m * k + o) * k + q] = g[m] * xs;
                        hm[(m * k + q) * k + o] = g[m] * xs;
                    }
                }
            }
            double aa[3] = {pk_dot(a0, a0, ne), 2.0 * pk_dot(a0, a1, ne), pk_dot(a1, a1, ne)};
            for (int m = 0; m < 3; m++) {
                for (i64 o = 0; o < k; o++) {
                    hm[(m * k + o) * k + o] += aa[m];
                }
            }
            unconverged += (double)pk_piece_integrate(k, alpha, c, hm, offp, (int)softmax, a, bb, tol, gl, tot, q1, q2, p, hp);
            pieces += 1.0;
            for (i64 j = 0; j < k * k; j++) dgp[j] += tot[2 * k + j];
            double l = bb - a, t = 0.5 * (bb * bb - a * a);
            for (i64 j = 0; j < ne; j++) abp[j] += l * a0[j] + t * a1[j];
            if (softmax) {
                for (i64 o = 0; o < k; o++) {
                    double s0 = tot[o], s1 = tot[k + o];
                    for (i64 j = 0; j < ne; j++) abp[(1 + o) * ne + j] += s0 * a0[j] + s1 * a1[j];
                }
            }
            for (i64 j = 0; j < h; j++) y[j] = 0.0;
            if (softmax) {
                for (i64 o = 0; o < k; o++) {
                    double s0 = tot[o], s1 = tot[k + o];
                    for (i64 j = 0; j < h; j++) y[j] += s0 * w[o * h + j] + s1 * dw[o * h + j];
                }
            }
            for (i64 kk = 0; kk < k; kk++) {
                for (i64 j = 0; j < h; j++) {
                    dbp[kk * h + j] += alpha * mask[j] * (l * w[kk * h + j] + t * dw[kk * h + j] - y[j]);
                }
            }
        }
        double csum = 0.0, ccount = 0.0;
        if (cosine) {
            /* Σ_k (1 − cos(∇f^k at t = 0, ∫∇f^k dt)) (cosine_measure). */
            for (i64 j = 0; j < ne; j++) a0[j] = j < h ? (zp[j] > 0.0 ? zp[j] : 0.0) : 1.0;
            for (i64 o = 0; o < k; o++) p0[o] = 0.0;
            if (softmax) {
                for (i64 o = 0; o < k; o++) p0[o] = alpha * (pk_dot(w + o * h, a0, h) + b[o] - (offp ? offp[o] : 0.0));
                double mx = -PK_INF, sum = 0.0;
                for (i64 o = 0; o < k; o++) mx = p0[o] > mx ? p0[o] : mx;
                for (i64 o = 0; o < k; o++) {
                    p0[o] = exp(p0[o] - mx);
                    sum += p0[o];
                }
                for (i64 o = 0; o < k; o++) p0[o] /= sum;
            }
            const double *abar = abp, *bbar = abp + ne;
            double aa0 = pk_dot(a0, a0, ne), a0_abar = pk_dot(a0, abar, ne), abar2 = pk_dot(abar, abar, ne), b2 = 0.0;
            for (i64 o = 0; o < k; o++) {
                a0b[o] = pk_dot(a0, bbar + o * ne, ne);
                b2 += pk_dot(bbar + o * ne, bbar + o * ne, ne);
            }
            for (i64 j = 0; j < h; j++) wp[j] = 0.0;
            for (i64 o = 0; o < k; o++) {
                for (i64 j = 0; j < h; j++) wp[j] += p0[o] * w[o * h + j];
            }
            for (i64 kk = 0; kk < k; kk++) {
                for (i64 j = 0; j < h; j++) d0[j] = zp[j] > 0.0 ? alpha * (w[kk * h + j] - wp[j]) : 0.0;
                const double *dbk = dbp + kk * h;
                double sv = 0.0, se = 0.0;
                for (i64 o = 0; o < k; o++) {
                    double e = (o == kk ? 1.0 : 0.0) - p0[o];
                    sv += e * ((o == kk ? a0_abar : 0.0) - a0b[o]);
                    se += e * e;
                }
                double dotv = pk_dot(d0, dbk, h) * xs + alpha * alpha * sv;
                double n0 = pk_dot(d0, d0, h) * xs + alpha * alpha * aa0 * se;
                double nbar = pk_dot(dbk, dbk, h) * xs + alpha * alpha * (abar2 - 2.0 * pk_dot(abar, bbar + kk * ne, ne) + b2);
                double den = sqrt(n0 * nbar);
                if (den > 0.0) {
                    double r = dotv / den;
                    r = r < -1.0 ? -1.0 : (r > 1.0 ? 1.0 : r);
                    csum += 1.0 - r;
                    ccount += 1.0;
                }
            }
        }
        st[0] = pieces;
        st[1] = unconverged;
        st[2] = csum;
        st[3] = ccount;
    }
}
