// The kernels, written once over the 16-lane vector operations of simd_avx512.h / simd_avx2.h
// and compiled once per ISA (isa_avx512.cpp, isa_avx2.cpp) inside that ISA's namespace.
//
// Exactness (the default mode). The weights are dequantized in registers with gguf's reference
// arithmetic (Q4_1: w = d*q + m, two roundings; Q8_0: w = q*d), then every output is an fp32
// multiply-add chain over k ascending, in chunks of 128 k (each chunk's chain starts from 0; the
// chunk sums are added in order). That sequence is the same whatever M, the register block an
// output lands in, the thread split or the ISA, so
//   * a row's result does not depend on the batch (batch invariance),
//   * x = e_k returns w[n][k] bit for bit (the identity check),
//   * AVX2 and AVX-512 give bit-identical results.
// The TUs are built with -ffp-contract=off so that the compiler fuses no multiply and add the
// source keeps apart (d*q + m must round twice, like gguf's numpy code).
//
// Small M (<= kDirectRows) dequantizes on the fly for each register block; larger M dequantizes
// a group of panels once into an L2 scratch and runs a plain fp32 GEMM micro-kernel over it.
// Both paths produce the same values (same w, same chain).
//
// The int8 ("fast") kernel follows llama.cpp's q4_1 x q8_1 dot product per 32-block:
// y += fma(m, xs, (d * xd) * float(sum_k q * xq)), integer sums exact.
#pragma once
#include <cmath>
#include <cstring>

#include "isa.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

using sluice::AttnArgs;
using sluice::GemmArgs;
using sluice::kBlock;
using sluice::kPanel;
using sluice::kQ4PanelBlockBytes;
using sluice::kQ8PanelBlockBytes;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Output: acc[r][j] -> y[r0 + r][16 (p + j) ...] (+ bias), the last panel cut at N.
template <int MR, int NP>
static inline void store_acc(const GemmArgs& a, F16 (&acc)[MR][NP], int64_t r0, int64_t p) {
  const int64_t n0 = p * kPanel;
  const int64_t width = imin(a.N - n0, (int64_t)NP * kPanel);
  for (int r = 0; r < MR; ++r) {
    float* y = a.y + (r0 + r) * a.ldy + n0;
    for (int j = 0; j < NP; ++j) {
      const int64_t c = j * kPanel;
      F16 v = acc[r][j];
      if (c + kPanel <= width) {
        if (a.bias) v = fadd(v, fload(a.bias + n0 + c));
        fstore(y + c, v);
      } else if (c < width) {
        alignas(64) float t[kPanel];
        fstore(t, v);
        for (int64_t i = c; i < width; ++i) y[i] = t[i - c] + (a.bias ? a.bias[n0 + i] : 0.0f);
      }
    }
  }
}

// Each output sums its products in chunks of kChunkBlocks 32-blocks (one fma chain per chunk,
// from 0), then adds the chunk sums in order: shorter chains than one over all of K, so the
// rounding error stays at or below a BLAS sgemm's (measured against float64).
constexpr int64_t kChunkBlocks = 4;

template <int MR, int NP>
static inline void zero_acc(F16 (&acc)[MR][NP]) {
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) acc[r][j] = fzero();
}

template <int MR, int NP>
static inline void add_chunk(F16 (&out)[MR][NP], F16 (&acc)[MR][NP], bool first) {
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) out[r][j] = first ? acc[r][j] : fadd(out[r][j], acc[r][j]);
}

// Q4_1 dequantization of 16 lanes for the k at bit offset S of each lane word (see isa.h):
// offsets 0, 8, 16, 24 hold k = 8g + 0..3 (low nibbles), 4, 12, 20, 28 hold k = 8g + 4..7.
#define SLUICE_Q4_EACH_K(STEP) \
  STEP(0, 0) STEP(1, 8) STEP(2, 16) STEP(3, 24) STEP(4, 4) STEP(5, 12) STEP(6, 20) STEP(7, 28)

template <int S>
static inline F16 q4_weight(F16 d, F16 m, I16 wv) {
  return fadd(fmul(d, nibble_to_f(isrl<S>(wv))), m);
}

// ---- exact Q4_1, small M: dequantize per register block ------------------------------------
template <int MR, int NP>
static void q4_direct(const GemmArgs& a, int64_t r0, int64_t p) {
  const int64_t KB = a.K / kBlock;
  const uint8_t* wp[NP];
  for (int j = 0; j < NP; ++j) wp[j] = a.w + (p + j) * KB * kQ4PanelBlockBytes;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.ldx;
  F16 acc[MR][NP], out[MR][NP];
  for (int64_t kb = 0; kb < KB; ++kb) {
    if (kb % kChunkBlocks == 0) zero_acc(acc);
    const int64_t off = kb * kQ4PanelBlockBytes;
    F16 d[NP], m[NP];
    for (int j = 0; j < NP; ++j) {
      d[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off));
      m[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off + 32));
    }
    for (int g = 0; g < 4; ++g) {
      I16 wv[NP];
      for (int j = 0; j < NP; ++j) wv[j] = iload(wp[j] + off + 64 + g * 64);
      const int64_t k0 = kb * kBlock + 8 * g;
#define SLUICE_STEP(J, S)                                                                \
  for (int j = 0; j < NP; ++j) {                                                         \
    const F16 w = q4_weight<S>(d[j], m[j], wv[j]);                                       \
    for (int r = 0; r < MR; ++r) acc[r][j] = ffma(fset(xr[r][k0 + J]), w, acc[r][j]);    \
  }
      SLUICE_Q4_EACH_K(SLUICE_STEP)
#undef SLUICE_STEP
    }
    if (kb % kChunkBlocks == kChunkBlocks - 1 || kb == KB - 1) add_chunk(out, acc, kb < kChunkBlocks);
  }
  store_acc<MR, NP>(a, out, r0, p);
}

// panels p .. p+np-1 dequantized into wc[k][np][16]
static void q4_convert(const GemmArgs& a, int64_t p, int np, float* wc) {
  const int64_t KB = a.K / kBlock;
  for (int j = 0; j < np; ++j) {
    const uint8_t* wp = a.w + (p + j) * KB * kQ4PanelBlockBytes;
    for (int64_t kb = 0; kb < KB; ++kb) {
      const uint8_t* blk = wp + kb * kQ4PanelBlockBytes;
      const F16 d = fload_half(reinterpret_cast<const uint16_t*>(blk));
      const F16 m = fload_half(reinterpret_cast<const uint16_t*>(blk + 32));
      for (int g = 0; g < 4; ++g) {
        const I16 wv = iload(blk + 64 + g * 64);
        float* dst = wc + ((kb * kBlock + 8 * g) * np + j) * kPanel;
#define SLUICE_STEP(J, S) fstore(dst + J * np * kPanel, q4_weight<S>(d, m, wv));
        SLUICE_Q4_EACH_K(SLUICE_STEP)
#undef SLUICE_STEP
      }
    }
  }
}

// ---- exact Q8_0 (the tied embedding / LM head) -------------------------------------------
template <int MR, int NP>
static void q8_direct(const GemmArgs& a, int64_t r0, int64_t p) {
  const int64_t KB = a.K / kBlock;
  const uint8_t* wp[NP];
  for (int j = 0; j < NP; ++j) wp[j] = a.w + (p + j) * KB * kQ8PanelBlockBytes;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.ldx;
  F16 acc[MR][NP], out[MR][NP];
  for (int64_t kb = 0; kb < KB; ++kb) {
    if (kb % kChunkBlocks == 0) zero_acc(acc);
    const int64_t off = kb * kQ8PanelBlockBytes;
    F16 d[NP];
    for (int j = 0; j < NP; ++j) d[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off));
    for (int k = 0; k < kBlock; ++k) {
      for (int j = 0; j < NP; ++j) {
        const F16 w = fmul(sbytes_to_f(reinterpret_cast<const int8_t*>(wp[j] + off + 32 + k * kPanel)), d[j]);
        for (int r = 0; r < MR; ++r) acc[r][j] = ffma(fset(xr[r][kb * kBlock + k]), w, acc[r][j]);
      }
    }
    if (kb % kChunkBlocks == kChunkBlocks - 1 || kb == KB - 1) add_chunk(out, acc, kb < kChunkBlocks);
  }
  store_acc<MR, NP>(a, out, r0, p);
}

static void q8_convert(const GemmArgs& a, int64_t p, int np, float* wc) {
  const int64_t KB = a.K / kBlock;
  for (int j = 0; j < np; ++j) {
    const uint8_t* wp = a.w + (p + j) * KB * kQ8PanelBlockBytes;
    for (int64_t kb = 0; kb < KB; ++kb) {
      const uint8_t* blk = wp + kb * kQ8PanelBlockBytes;
      const F16 d = fload_half(reinterpret_cast<const uint16_t*>(blk));
      for (int k = 0; k < kBlock; ++k)
        fstore(wc + ((kb * kBlock + k) * np + j) * kPanel,
               fmul(sbytes_to_f(reinterpret_cast<const int8_t*>(blk + 32 + k * kPanel)), d));
    }
  }
}

// ---- fp32 micro-kernel over dequantized panels (larger M) ----------------------------------
template <int MR, int NP>
static void f32_tile(const GemmArgs& a, const float* wc, int stride, int64_t r0, int64_t p) {
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.ldx;
  F16 acc[MR][NP], out[MR][NP];
  const int64_t chunk = kChunkBlocks * kBlock;
  for (int64_t k0 = 0; k0 < a.K; k0 += chunk) {
    zero_acc(acc);
    const int64_t k1 = imin(a.K, k0 + chunk);
    for (int64_t k = k0; k < k1; ++k) {
      const float* w = wc + k * stride * kPanel;
      for (int j = 0; j < NP; ++j) {
        const F16 wj = fload(w + j * kPanel);
        for (int r = 0; r < MR; ++r) acc[r][j] = ffma(fset(xr[r][k]), wj, acc[r][j]);
      }
    }
    add_chunk(out, acc, k0 == 0);
  }
  store_acc<MR, NP>(a, out, r0, p);
}

// ---- int8 activations x Q4_1 (fast mode) ---------------------------------------------------
template <int MR, int NP>
static void q4_fast_tile(const GemmArgs& a, int64_t r0, int64_t p) {
  const int64_t KB = a.K / kBlock;
  const uint8_t* wp[NP];
  for (int j = 0; j < NP; ++j) wp[j] = a.w + (p + j) * KB * kQ4PanelBlockBytes;
  const int8_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.xq + (r0 + r) * a.K;
  const I16 low = iset(0x0F0F0F0F);
  F16 out[MR][NP];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) out[r][j] = fzero();
  for (int64_t kb = 0; kb < KB; ++kb) {
    I16 acc[MR][NP];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NP; ++j) acc[r][j] = izero();
    const int64_t off = kb * kQ4PanelBlockBytes;
    for (int g = 0; g < 4; ++g) {
      I16 lo[NP], hi[NP];
      for (int j = 0; j < NP; ++j) {
        const I16 wv = iload(wp[j] + off + 64 + g * 64);
        lo[j] = iand(wv, low);
        hi[j] = iand(isrl<4>(wv), low);
      }
      for (int r = 0; r < MR; ++r) {
        int32_t b0, b1;
        std::memcpy(&b0, xr[r] + kb * kBlock + 8 * g, 4);
        std::memcpy(&b1, xr[r] + kb * kBlock + 8 * g + 4, 4);
        const I16 x0 = iset(b0), x1 = iset(b1);
        for (int j = 0; j < NP; ++j) acc[r][j] = dot_u8s8(dot_u8s8(acc[r][j], lo[j], x0), hi[j], x1);
      }
    }
    for (int j = 0; j < NP; ++j) {
      const F16 d = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off));
      const F16 m = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off + 32));
      for (int r = 0; r < MR; ++r) {
        const int64_t s = (r0 + r) * KB + kb;
        const F16 u = ffma(m, fset(a.xs[s]), fmul(fmul(d, fset(a.xd[s])), i2f(acc[r][j])));
        out[r][j] = fadd(out[r][j], u);
      }
    }
  }
  store_acc<MR, NP>(a, out, r0, p);
}

// ---- drivers -----------------------------------------------------------------------------------
using TileFn = void (*)(const GemmArgs&, int64_t, int64_t);
using F32TileFn = void (*)(const GemmArgs&, const float*, int, int64_t, int64_t);

// rows 1..8 x panels 1, 2, 4, 8 (the wide ones for few rows only)
#define SLUICE_SHAPES(X)                                                                       \
  X(1, 1) X(1, 2) X(1, 4) X(1, 8) X(2, 1) X(2, 2) X(2, 4) X(2, 8) X(3, 1) X(3, 2) X(3, 4) X(3, 8) \
  X(4, 1) X(4, 2) X(4, 4) X(4, 8) X(5, 1) X(5, 2) X(5, 4) X(6, 1) X(6, 2) X(6, 4) X(7, 1) X(7, 2) \
  X(8, 1) X(8, 2)

#define SLUICE_PICKER(NAME, FN)                    \
  static TileFn NAME(int rows, int panels) {       \
    switch (rows * 16 + panels) {                  \
      SLUICE_SHAPES(SLUICE_CASE_##FN)              \
      default:                                     \
        return nullptr;                            \
    }                                              \
  }
#define SLUICE_CASE_q4_direct(R, P) case R * 16 + P: return &q4_direct<R, P>;
#define SLUICE_CASE_q8_direct(R, P) case R * 16 + P: return &q8_direct<R, P>;
#define SLUICE_CASE_q4_fast(R, P) case R * 16 + P: return &q4_fast_tile<R, P>;
SLUICE_PICKER(pick_q4_direct, q4_direct)
SLUICE_PICKER(pick_q8_direct, q8_direct)
SLUICE_PICKER(pick_q4_fast, q4_fast)

static F32TileFn pick_f32(int rows, int panels) {
  switch (rows * 16 + panels) {
#define SLUICE_CASE(R, P) case R * 16 + P: return &f32_tile<R, P>;
    SLUICE_SHAPES(SLUICE_CASE)
#undef SLUICE_CASE
    default:
      return nullptr;
  }
}

static inline int panels_for(const int* table, int rows, int64_t left) {
  int p = table[rows];
  while (p > left) p >>= 1;
  return p;
}

// Register blocks straight from the packed weights, up to kMaxRows rows each. Panels outer:
// a group's weights stay in L1 while every row block passes over them.
static void sweep_direct(const GemmArgs& a, TileFn (*pick)(int, int), int64_t m0, int64_t m1, int64_t p0,
                         int64_t p1) {
  const int widest_rows = (int)imin(kMaxRows, m1 - m0);
  for (int64_t p = p0; p < p1;) {
    const int group = panels_for(kPanelsFor, widest_rows, p1 - p);
    for (int64_t r = m0; r < m1;) {
      const int rows = (int)imin(kMaxRows, m1 - r);
      for (int j = 0; j < group;) {
        const int step = panels_for(kPanelsFor, rows, group - j);
        pick(rows, step)(a, r, p + j);
        j += step;
      }
      r += rows;
    }
    p += group;
  }
}

// Dequantize kGemmPanels panels at a time into an L2 scratch, then sweep all rows over it.
static void sweep_converted(const GemmArgs& a, void (*convert)(const GemmArgs&, int64_t, int, float*), int64_t m0,
                            int64_t m1, int64_t p0, int64_t p1, float* wc) {
  for (int64_t p = p0; p < p1;) {
    const int np = panels_for(kGemmPanelsFor, 1, p1 - p);
    convert(a, p, np, wc);
    for (int64_t r = m0; r < m1;) {
      const int rows = (int)imin(kGemmRows, m1 - r);
      for (int j = 0; j < np;) {
        const int step = panels_for(kGemmPanelsFor, rows, np - j);
        pick_f32(rows, step)(a, wc + j * kPanel, np, r, p + j);
        j += step;
      }
      r += rows;
    }
    p += np;
  }
}

static void exact_gemm(const GemmArgs& a, int64_t p0, int64_t p1, float* scratch, TileFn (*pick)(int, int),
                       void (*convert)(const GemmArgs&, int64_t, int, float*)) {
  if (a.M <= kDirectMaxM) return sweep_direct(a, pick, 0, a.M, p0, p1);
  // rows in chunks whose activations stay in L2 beside the dequantized panels
  constexpr int64_t kRowChunk = 96;
  for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk)
    sweep_converted(a, convert, m0, imin(a.M, m0 + kRowChunk), p0, p1, scratch);
}

static void q4_exact(const GemmArgs& a, int64_t p0, int64_t p1, float* scratch) {
  exact_gemm(a, p0, p1, scratch, &pick_q4_direct, &q4_convert);
}
static void q8_exact(const GemmArgs& a, int64_t p0, int64_t p1, float* scratch) {
  exact_gemm(a, p0, p1, scratch, &pick_q8_direct, &q8_convert);
}
static void q4_fast(const GemmArgs& a, int64_t p0, int64_t p1, float*) {
  constexpr int64_t kRowChunk = 64;
  for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) sweep_direct(a, &pick_q4_fast, m0, imin(a.M, m0 + kRowChunk), p0, p1);
}

// ---- activation preparation --------------------------------------------------------------------
// Q8_1-style, as llama.cpp: per 32-block d = max|x| / 127, q = round(x / d), s = d * sum(q)
static void quantize_q8(const float* x, int64_t ldx, int64_t K, int8_t* xq, float* xd, float* xs, int64_t r0,
                        int64_t r1) {
  const int64_t KB = K / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < KB; ++b) {
      const float* p = x + r * ldx + b * kBlock;
      const F16 a0 = fload(p), a1 = fload(p + 16);
      const float amax = fhmax(fmax_(fabs_(a0), fabs_(a1)));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const I16 q0 = fround_i(fmul(a0, fset(id))), q1 = fround_i(fmul(a1, fset(id)));
      int8_t* o = xq + r * K + b * kBlock;
      istore_i8(o, q0);
      istore_i8(o + 16, q1);
      xd[r * KB + b] = d;
      xs[r * KB + b] = d * fhsum(fadd(i2f(q0), i2f(q1)));  // integer sums: exact in any order
    }
  }
}

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

static void q8_row(const uint8_t* w, int64_t K, int64_t n, float* out) {
  const int64_t KB = K / kBlock, p = n / kPanel, j = n % kPanel;
  const uint8_t* base = w + p * KB * kQ8PanelBlockBytes;
  for (int64_t b = 0; b < KB; ++b) {
    const uint8_t* blk = base + b * kQ8PanelBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, blk + 2 * j, 2);
    const float d = half_to_float(dh);
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 32);
    for (int k = 0; k < kBlock; ++k) out[b * kBlock + k] = (float)q[k * kPanel + j] * d;
  }
}

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

// ---- paged decode attention ------------------------------------------------------------------
// One task = one chunk of one sequence's context x one KV head: its G query heads share each
// K/V row read, straight from the paged cache through the block table (no gathered copy).
// Per query head: s = (q . k) * scale; e = exp(s - max over the chunk); l = sum e;
// o = sum e * v. One chunk: out = o * (1 / l). Several: attn_merge rescales and adds them.
template <int ND>
static void decode_task(const AttnArgs& a, int64_t index) {
  const sluice::AttnTask task = a.tasks[index];
  const int64_t G = a.heads / a.kv_heads, D = ND * kPanel;
  const int64_t b = task.b, kh = task.kv_head;
  const int64_t len = a.context_lens[b];
  const int64_t first = (a.window > 0 && len > a.window) ? len - a.window : 0;
  const int64_t start = first + (int64_t)task.chunk * sluice::kAttnChunk;
  const int64_t n = imin(sluice::kAttnChunk, len - start);
  const int32_t* table = a.block_tables + b * a.max_blocks;
  const float* kbase = a.k_cache + kh * a.num_slots * D;
  const float* vbase = a.v_cache + kh * a.num_slots * D;
  float* sc = a.scratch + index * G * sluice::kAttnChunk;
  float mx[16], total[16];
  for (int64_t g = 0; g < G; ++g) {
    const float* q = a.q + b * a.q_stride + (kh * G + g) * D;
    F16 qv[ND];
    for (int i = 0; i < ND; ++i) qv[i] = fload(q + i * kPanel);
    float* s = sc + g * sluice::kAttnChunk;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = start + t;
      const float* kp = kbase + ((int64_t)table[pos / a.block_size] * a.block_size + pos % a.block_size) * D;
      F16 acc = fmul(qv[0], fload(kp));
      for (int i = 1; i < ND; ++i) acc = ffma(qv[i], fload(kp + i * kPanel), acc);
      s[t] = fhsum(acc) * a.scale;
    }
    // exp(s - max) in place, through the vector exp (the tail padded)
    const int64_t V = n / kPanel * kPanel;
    float m = -INFINITY;
    if (V) {
      F16 mv = fload(s);
      for (int64_t t = kPanel; t < V; t += kPanel) mv = fmax_(mv, fload(s + t));
      m = fhmax(mv);
    }
    for (int64_t t = V; t < n; ++t) m = s[t] > m ? s[t] : m;
    F16 sum = fzero();
    for (int64_t t = 0; t < V; t += kPanel) {
      const F16 e = fexp(fsub(fload(s + t), fset(m)));
      fstore(s + t, e);
      sum = fadd(sum, e);
    }
    float l = fhsum(sum);
    if (V < n) {
      alignas(64) float tmp[kPanel];
      for (int i = 0; i < kPanel; ++i) tmp[i] = V + i < n ? s[V + i] - m : -INFINITY;
      fstore(tmp, fexp(fload(tmp)));
      for (int64_t t = V; t < n; ++t) {
        s[t] = tmp[t - V];
        l += s[t];
      }
    }
    mx[g] = m;
    total[g] = l;
  }
  for (int64_t g = 0; g < G; ++g) {
    const float* s = sc + g * sluice::kAttnChunk;
    F16 o[ND];
    for (int i = 0; i < ND; ++i) o[i] = fzero();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = start + t;
      const float* vp = vbase + ((int64_t)table[pos / a.block_size] * a.block_size + pos % a.block_size) * D;
      const F16 e = fset(s[t]);
      for (int i = 0; i < ND; ++i) o[i] = ffma(e, fload(vp + i * kPanel), o[i]);
    }
    if (task.num_chunks == 1) {
      const F16 inv = fset(1.0f / total[g]);
      float* out = a.out + (b * a.heads + kh * G + g) * D;
      for (int i = 0; i < ND; ++i) fstore(out + i * kPanel, fmul(o[i], inv));
    } else {
      float* part = a.partials + ((a.chunk_base[b] + task.chunk) * a.kv_heads + kh) * G * (D + 2) + g * (D + 2);
      for (int i = 0; i < ND; ++i) fstore(part + i * kPanel, o[i]);
      part[D] = mx[g];
      part[D + 1] = total[g];
    }
  }
}

static void paged_decode(const AttnArgs& a, int64_t t0, int64_t t1) {
  void (*fn)(const AttnArgs&, int64_t) = nullptr;
  switch (a.head_dim / kPanel) {
    case 1: fn = &decode_task<1>; break;
    case 2: fn = &decode_task<2>; break;
    case 3: fn = &decode_task<3>; break;
    case 4: fn = &decode_task<4>; break;
    case 5: fn = &decode_task<5>; break;
    case 6: fn = &decode_task<6>; break;
    case 8: fn = &decode_task<8>; break;
    default: return;  // the glue only calls for supported head dims (supports_head_dim)
  }
  for (int64_t t = t0; t < t1; ++t) fn(a, t);
}

// pair = b * KVH + kv head, for sequences of more than one chunk: the standard log-sum-exp merge
static void attn_merge(const AttnArgs& a, int64_t p0, int64_t p1) {
  const int64_t G = a.heads / a.kv_heads, D = a.head_dim, W = D + 2;
  for (int64_t pair = p0; pair < p1; ++pair) {
    const int64_t b = pair / a.kv_heads, kh = pair % a.kv_heads;
    const int64_t len = a.context_lens[b];
    const int64_t n = (a.window > 0 && len > a.window) ? a.window : len;
    const int64_t chunks = (n + sluice::kAttnChunk - 1) / sluice::kAttnChunk;
    if (chunks < 2) continue;
    for (int64_t g = 0; g < G; ++g) {
      const float* first = a.partials + (a.chunk_base[b] * a.kv_heads + kh) * G * W + g * W;
      float m = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) {
        const float mc = first[c * a.kv_heads * G * W + D];
        m = mc > m ? mc : m;
      }
      float* out = a.out + (b * a.heads + kh * G + g) * D;
      float l = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) {
        const float* part = first + c * a.kv_heads * G * W;
        const float f = expf(part[D] - m);
        l += part[D + 1] * f;
        for (int64_t i = 0; i < D; i += kPanel) {
          const F16 v = fmul(fload(part + i), fset(f));
          fstore(out + i, c == 0 ? v : fadd(fload(out + i), v));
        }
      }
      const F16 inv = fset(1.0f / l);
      for (int64_t i = 0; i < D; i += kPanel) fstore(out + i, fmul(fload(out + i), inv));
    }
  }
}

static const sluice::KernelTable kTable = {
    SLUICE_ISA_NAME, kGemmPanelsFor[1] * kPanel, kDirectMaxM, &q4_exact, &q4_fast, &q8_exact, &quantize_q8, &q8_row,
    &add_rms_norm,   &silu_mul, &paged_decode, &attn_merge,
};

}  // namespace
}  // namespace SLUICE_ISA_NS
