// Elementwise kernels over the 16-lane vector layer: exp, RMSNorm (+ residual), SiLU x mul.
// Included by kernels_impl.h, once per ISA translation unit.
#pragma once
#include <cmath>
#include <cstring>

#include "isa_names.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

// ---- elementwise glue ------------------------------------------------------------------------
// exp on 16 lanes: Cephes' expf (range reduction by ln 2 in two parts, degree-6 polynomial),
// within ~1 ulp of the true value over the clamped range.
static inline F16 fexp(F16 x) {
  x = fmin_(fmax_(x, fset(-87.33654f)), fset(88.3762626647949f));
  const F16 n = fround(fmul(x, fset(1.44269504088896341f)));
  F16 r = ffma(n, fset(-0.693359375f), x);
  r = ffma(n, fset(2.12194440e-4f), r);
  F16 p = fset(1.9875691500e-4f);
  p = ffma(p, r, fset(1.3981999507e-3f));
  p = ffma(p, r, fset(8.3334519073e-3f));
  p = ffma(p, r, fset(4.1665795894e-2f));
  p = ffma(p, r, fset(1.6666665459e-1f));
  p = ffma(p, r, fset(5.0000001201e-1f));
  p = ffma(p, fmul(r, r), fadd(r, fset(1.0f)));
  const F16 scale = i_as_f(islli(iadd(fround_i(n), iset(127)), 23));
  return fmul(p, scale);
}

static void add_rms_norm(float* h, const float* delta, const float* w, float* out, int64_t D, float eps, int64_t r0,
                         int64_t r1) {
  const int64_t V = D / kPanel * kPanel;
  for (int64_t r = r0; r < r1; ++r) {
    float* x = h + r * D;
    if (delta) {
      const float* dl = delta + r * D;
      for (int64_t i = 0; i < V; i += kPanel) fstore(x + i, fadd(fload(x + i), fload(dl + i)));
      for (int64_t i = V; i < D; ++i) x[i] = x[i] + dl[i];
    }
    // as transformers' LlamaRMSNorm: mean of squares, rsqrt, x * r, then weight * that
    F16 acc = fzero();
    for (int64_t i = 0; i < V; i += kPanel) {
      const F16 v = fload(x + i);
      acc = fadd(acc, fmul(v, v));
    }
    float ss = fhsum(acc);
    for (int64_t i = V; i < D; ++i) ss += x[i] * x[i];
    const float rs = 1.0f / sqrtf(ss / (float)D + eps);
    float* o = out + r * D;
    for (int64_t i = 0; i < V; i += kPanel) fstore(o + i, fmul(fload(w + i), fmul(fload(x + i), fset(rs))));
    for (int64_t i = V; i < D; ++i) o[i] = w[i] * (x[i] * rs);
  }
}

static void silu_mul(const float* gu, float* out, int64_t I, int64_t r0, int64_t r1) {
  const int64_t V = I / kPanel * kPanel;
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = gu + r * 2 * I;
    const float* u = g + I;
    float* o = out + r * I;
    // as torch's silu: x / (1 + exp(-x)), then times up
    for (int64_t i = 0; i < V; i += kPanel) {
      const F16 x = fload(g + i);
      const F16 s = fdiv(x, fadd(fset(1.0f), fexp(fsub(fzero(), x))));
      fstore(o + i, fmul(s, fload(u + i)));
    }
    for (int64_t i = V; i < I; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  }
}

}  // namespace
}  // namespace SLUICE_ISA_NS
