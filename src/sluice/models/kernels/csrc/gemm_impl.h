// The linear kernels, written once over the 16-lane vector operations of simd_avx512.h / simd_avx2.h
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
// source keeps apart. Q4_1's d*q + m is one fma, and that is still gguf's two roundings: d is an
// fp16 (11 significant bits) and q an integer 0..15 (4 bits), so d*q has at most 15 significant
// bits and is exact in fp32; round(d*q + m) = round(round(d*q) + m) (tests/unit/models/
// test_kernels.py checks d*q exact for every finite fp16 d and every q, and 200,000 sampled
// (d, q, m) bit for bit).
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

#include "isa_names.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

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

// one fma: d*q is exact in fp32 (see the top of this file), so this is gguf's d*q + m bit for bit
template <int S>
static inline F16 q4_weight(F16 d, F16 m, const Q4Nibbles& nb) {
  return ffma(d, q4_value<S>(nb), m);
}

// ---- the exact formats: a panel block's size and its dequantized weights -------------------
// Format::weights hands the weights of one 32-block (at byte offset off) of NP panels (wp) to
// use(k, j, w): w the 16 lanes of panel j at k of the block, in the order the direct tile
// consumes them. The direct tile's use is its fmas, the converter's a store; both are forced
// inline (the lambda too), so that the hot loops compile as if each tile were written out.
#define SLUICE_FORCE_INLINE __attribute__((always_inline))

struct Q4Format {
  static constexpr int64_t kBytes = kQ4PanelBlockBytes;
  template <int NP, class Use>
  static inline SLUICE_FORCE_INLINE void weights(const uint8_t* const* wp, int64_t off, Use&& use) {
    F16 d[NP], m[NP];
    for (int j = 0; j < NP; ++j) {
      d[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off));
      m[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off + 32));
    }
    for (int g = 0; g < 4; ++g) {
      Q4Nibbles wv[NP];
      for (int j = 0; j < NP; ++j) wv[j] = q4_nibbles(iload(wp[j] + off + 64 + g * 64));
#define SLUICE_STEP(J, S) \
  for (int j = 0; j < NP; ++j) use(8 * g + J, j, q4_weight<S>(d[j], m[j], wv[j]));
      SLUICE_Q4_EACH_K(SLUICE_STEP)
#undef SLUICE_STEP
    }
  }
};

// the tied embedding / LM head: w = q * d, exact
struct Q8Format {
  static constexpr int64_t kBytes = kQ8PanelBlockBytes;
  template <int NP, class Use>
  static inline SLUICE_FORCE_INLINE void weights(const uint8_t* const* wp, int64_t off, Use&& use) {
    F16 d[NP];
    for (int j = 0; j < NP; ++j) d[j] = fload_half(reinterpret_cast<const uint16_t*>(wp[j] + off));
    for (int k = 0; k < kBlock; ++k)
      for (int j = 0; j < NP; ++j)
        use(k, j, fmul(sbytes_to_f(reinterpret_cast<const int8_t*>(wp[j] + off + 32 + k * kPanel)), d[j]));
  }
};

// ---- exact, small M: dequantize per register block ----------------------------------------
template <class Format, int MR, int NP>
static void direct_tile(const GemmArgs& a, int64_t r0, int64_t p) {
  const int64_t KB = a.K / kBlock;
  const uint8_t* wp[NP];
  for (int j = 0; j < NP; ++j) wp[j] = a.w + (p + j) * KB * Format::kBytes;
  const float* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.ldx;
  F16 acc[MR][NP], out[MR][NP];
  for (int64_t kb = 0; kb < KB; ++kb) {
    if (kb % kChunkBlocks == 0) zero_acc(acc);
    const int64_t k0 = kb * kBlock;
    Format::template weights<NP>(wp, kb * Format::kBytes, [&](int k, int j, F16 w) SLUICE_FORCE_INLINE {
      for (int r = 0; r < MR; ++r) acc[r][j] = ffma(fset(xr[r][k0 + k]), w, acc[r][j]);
    });
    if (kb % kChunkBlocks == kChunkBlocks - 1 || kb == KB - 1) add_chunk(out, acc, kb < kChunkBlocks);
  }
  store_acc<MR, NP>(a, out, r0, p);
}

// exact, larger M: panels p .. p+np-1 dequantized into wc[k][np][16]
template <class Format>
static void convert_panels(const GemmArgs& a, int64_t p, int np, float* wc) {
  const int64_t KB = a.K / kBlock;
  for (int j = 0; j < np; ++j) {
    const uint8_t* const wp = a.w + (p + j) * KB * Format::kBytes;
    for (int64_t kb = 0; kb < KB; ++kb) {
      float* dst = wc + (kb * kBlock * np + j) * kPanel;
      Format::template weights<1>(&wp, kb * Format::kBytes,
                                  [&](int k, int, F16 w) SLUICE_FORCE_INLINE {
                                    fstore(dst + k * np * kPanel, w);
                                  });
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
#define SLUICE_CASE_q4_direct(R, P) case R * 16 + P: return &direct_tile<Q4Format, R, P>;
#define SLUICE_CASE_q8_direct(R, P) case R * 16 + P: return &direct_tile<Q8Format, R, P>;
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

// The rows left cut into blocks of at most kGemmRows as even as they go: 32 rows as 6+6+5+5+5+5,
// not 6+6+6+6+6+2, whose last block of two rows runs the micro-kernel at ~3/4 of its rate.
static inline int64_t balanced_rows(int64_t left) {
  const int64_t blocks = (left + kGemmRows - 1) / kGemmRows;
  return (left + blocks - 1) / blocks;
}

// Dequantize kGemmPanels panels at a time into an L2 scratch, then sweep all rows over it.
static void sweep_converted(const GemmArgs& a, void (*convert)(const GemmArgs&, int64_t, int, float*), int64_t m0,
                            int64_t m1, int64_t p0, int64_t p1, float* wc) {
  for (int64_t p = p0; p < p1;) {
    const int np = panels_for(kGemmPanelsFor, 1, p1 - p);
    convert(a, p, np, wc);
    for (int64_t r = m0; r < m1;) {
      const int rows = (int)balanced_rows(m1 - r);
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
  exact_gemm(a, p0, p1, scratch, &pick_q4_direct, &convert_panels<Q4Format>);
}
static void q8_exact(const GemmArgs& a, int64_t p0, int64_t p1, float* scratch) {
  exact_gemm(a, p0, p1, scratch, &pick_q8_direct, &convert_panels<Q8Format>);
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

}  // namespace
}  // namespace SLUICE_ISA_NS
