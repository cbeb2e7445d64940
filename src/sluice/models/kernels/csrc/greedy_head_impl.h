// The greedy head's kernels (the argument that makes them exact is in greedy_head.h, the glue
// that runs them): int8 activations, approximate logits from the Q8_0 weights' own integers, one
// row's candidates under the bound, and one token's exact logit.
#pragma once
#include <cmath>
#include <cstring>

#include "isa_names.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

constexpr float kSmallestNormal = 1.17549435e-38f;  // FLT_MIN

// Per 32-block of a row: d = amax / 127 and q = round(x * (1/d)), which is at most 127 in size
// (|x| * (1/d) <= 127 * (1 + 2^-21) < 127.5), so dot_u8s8 cannot saturate; xd = d. A block holding
// a non-finite value, or whose d would underflow while x is not 0, gets xd = NaN and q = 0: the
// caller computes that row exactly.
static void quantize_rows_i8(const float* x, int64_t ldx, int64_t K, int8_t* xq, float* xd, int64_t r0, int64_t r1) {
  const int64_t KB = K / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < KB; ++b) {
      const float* p = x + r * ldx + b * kBlock;
      const F16 a0 = fload(p), a1 = fload(p + 16);
      const bool finite = fhsum(fadd(fsub(a0, a0), fsub(a1, a1))) == 0.0f;  // x - x is NaN for inf / NaN
      const float amax = fhmax(fmax_(fabs_(a0), fabs_(a1)));
      const float d = amax / 127.0f;
      const bool ok = finite && (amax == 0.0f || d >= kSmallestNormal);
      const float id = ok && d != 0.0f ? 1.0f / d : 0.0f;
      int8_t* o = xq + r * K + b * kBlock;
      // kHeadUnsignedX: stored as x + 128 in [1, 255] (the low byte of the 32-bit lane)
      const I16 off = iset(kHeadUnsignedX ? 128 : 0);
      istore_i8(o, iadd(fround_i(fmul(a0, fset(id))), off));
      istore_i8(o + 16, iadd(fround_i(fmul(a1, fset(id))), off));
      xd[r * KB + b] = ok ? d : NAN;
    }
  }
}

// The approximate logits: y[r][n] = sum over blocks of (d[n] * xd[r]) * sum_k q[n][k] xq[r][k]. The
// integer sum (|.| < 2^19) is exact, so a block's term has three roundings. The products are
// |q| * (xq * sign(q)) (vpmaddubsw wants an unsigned operand), llama.cpp's q8_0 x q8_0 way, or
// with VNNI (xq + 128) * q less 128 * sum q (kHeadUnsignedX). One panel at a time: its bytes are
// first regrouped into dot_u8s8's lanes (its scales widened, and with VNNI its blocks' -128 * sum q
// added up) in an L1 scratch of kApproxBlockBytes per block, then every row block reads them there.
constexpr int64_t kApproxBlockBytes = kBlock * kPanel + kPanel * 4 + 64;  // 8 groups of 64 bytes, 16 scales, 16 offsets
constexpr int64_t kApproxOffsetAt = kBlock * kPanel + kPanel * 4;
constexpr int64_t kApproxScratchPerK = kApproxBlockBytes / kBlock / 4;  // in floats (= 5)
static_assert(kApproxScratchPerK * 4 * kBlock == kApproxBlockBytes, "the scratch is whole floats per k");

static void q8_approx_panel(const GemmArgs& a, int64_t p, uint8_t* sc) {
  const int64_t KB = a.K / kBlock;
  const uint8_t* wp = a.w + p * KB * kQ8PanelBlockBytes;
  for (int64_t kb = 0; kb < KB; ++kb) {
    const uint8_t* blk = wp + kb * kQ8PanelBlockBytes;
    uint8_t* dst = sc + kb * kApproxBlockBytes;
    I16 qsum = izero();
    for (int g = 0; g < kBlock / 4; ++g) {
      const I16 q = q8_k4_lanes(blk + 32 + g * 4 * kPanel);
      istore(dst + g * 4 * kPanel, q);
      if constexpr (kHeadUnsignedX) qsum = dot_u8s8(qsum, iset(0x01010101), q);
    }
    fstore(reinterpret_cast<float*>(dst + kBlock * kPanel), fload_half(reinterpret_cast<const uint16_t*>(blk)));
    if constexpr (kHeadUnsignedX) istore(dst + kApproxOffsetAt, isub(izero(), islli(qsum, 7)));  // -128 * sum q
  }
}

template <int MR>
static void q8_approx_tile(const GemmArgs& a, const uint8_t* sc, int64_t r0, int64_t p) {
  const int64_t KB = a.K / kBlock;
  const int8_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.xq + (r0 + r) * a.K;
  F16 out[MR][1];
  for (int r = 0; r < MR; ++r) out[r][0] = fzero();
  for (int64_t kb = 0; kb < KB; ++kb) {
    const uint8_t* blk = sc + kb * kApproxBlockBytes;
    // kHeadUnsignedX: start from the block's -128 * sum q and multiply x + 128 by q; else
    // from 0, |q| by x * sign(q)
    const I16 start = kHeadUnsignedX ? iload(blk + kApproxOffsetAt) : izero();
    I16 acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = start;
    for (int g = 0; g < kBlock / 4; ++g) {
      const I16 q = iload(blk + g * 4 * kPanel), u = kHeadUnsignedX ? q : iabs8(q);
      for (int r = 0; r < MR; ++r) {
        int32_t b;
        std::memcpy(&b, xr[r] + kb * kBlock + 4 * g, 4);
        if constexpr (kHeadUnsignedX) acc[r] = dot_u8s8(acc[r], iset(b), u);
        else acc[r] = dot_u8s8(acc[r], u, isign8(iset(b), q));
      }
    }
    const F16 d = fload(reinterpret_cast<const float*>(blk + kBlock * kPanel));
    for (int r = 0; r < MR; ++r) out[r][0] = ffma(fmul(d, fset(a.xd[(r0 + r) * KB + kb])), i2f(acc[r]), out[r][0]);
  }
  store_acc<MR, 1>(a, out, r0, p);
}

using ApproxTileFn = void (*)(const GemmArgs&, const uint8_t*, int64_t, int64_t);
static ApproxTileFn pick_q8_approx(int rows) {
  switch (rows) {
    case 1: return &q8_approx_tile<1>;
    case 2: return &q8_approx_tile<2>;
    case 3: return &q8_approx_tile<3>;
    case 4: return &q8_approx_tile<4>;
    case 5: return &q8_approx_tile<5>;
    case 6: return &q8_approx_tile<6>;
    case 7: return &q8_approx_tile<7>;
    default: return &q8_approx_tile<8>;
  }
}

// scratch: kApproxScratchPerK * K floats of this thread's
static void q8_approx(const GemmArgs& a, int64_t p0, int64_t p1, float* scratch) {
  uint8_t* sc = reinterpret_cast<uint8_t*>(scratch);
  for (int64_t p = p0; p < p1; ++p) {
    q8_approx_panel(a, p, sc);
    for (int64_t r = 0; r < a.M;) {
      const int rows = (int)imin(kApproxRows, a.M - r);
      pick_q8_approx(rows)(a, sc, r, p);
      r += rows;
    }
  }
}

// One row's candidates: L = max over n of y[n] - c * wt[n] (NaN terms skipped); n is a candidate
// unless y[n] + c * wt[n] < L, so a NaN logit is one. Writes their ids ascending to idx and
// returns how many, or -1 as soon as there are more than cap.
static int64_t head_select(const float* y, const float* wt, float c, int64_t N, int32_t* idx, int64_t cap) {
  const F16 cv = fset(c);
  F16 m = fset(-INFINITY);
  int64_t n = 0;
  for (; n + kPanel <= N; n += kPanel) m = fmax_(fsub(fload(y + n), fmul(cv, fload(wt + n))), m);  // NaN keeps m
  float L = fhmax(m);
  for (int64_t i = n; i < N; ++i) {
    const float v = y[i] - c * wt[i];
    if (v > L) L = v;
  }
  const F16 lv = fset(L);
  int64_t count = 0;
  for (n = 0; n + kPanel <= N; n += kPanel) {
    uint32_t mask = fnot_less_mask(fadd(fload(y + n), fmul(cv, fload(wt + n))), lv);
    for (; mask; mask &= mask - 1) {
      if (count == cap) return -1;
      idx[count++] = (int32_t)(n + __builtin_ctz(mask));
    }
  }
  for (; n < N; ++n) {
    if (!(y[n] + c * wt[n] < L)) {
      if (count == cap) return -1;
      idx[count++] = (int32_t)n;
    }
  }
  return count;
}

// Token n's exact logit x . w[n]: the chain every exact Q8_0 kernel computes for it (w = q * d,
// exact; one fma per k ascending from 0 within each chunk of kChunkBlocks blocks; the chunk sums
// added in order), so the same bits as direct_tile<Q8Format> and f32_tile. The chunks' chains
// run side by side, kMaxChains at a time, so that their fmas overlap.
constexpr int kMaxChains = 8;

static float q8_dot(const uint8_t* w, int64_t K, int64_t n, const float* x) {
  const int64_t KB = K / kBlock, j = n % kPanel;
  const uint8_t* base = w + (n / kPanel) * KB * kQ8PanelBlockBytes + j;
  const int64_t chunks = (KB + kChunkBlocks - 1) / kChunkBlocks;
  float out = 0.0f;
  for (int64_t c0 = 0; c0 < chunks; c0 += kMaxChains) {
    const int nc = (int)imin(kMaxChains, chunks - c0);
    float acc[kMaxChains] = {};
    for (int64_t bi = 0; bi < kChunkBlocks; ++bi) {
      const uint8_t* q[kMaxChains];
      float d[kMaxChains];
      const float* xs[kMaxChains];
      int live = 0;  // chains with a block at this position (only the last chunk can be short)
      for (int c = 0; c < nc; ++c) {
        const int64_t kb = (c0 + c) * kChunkBlocks + bi;
        if (kb >= KB) break;
        const uint8_t* blk = base + kb * kQ8PanelBlockBytes;
        uint16_t dh;
        std::memcpy(&dh, blk + j, 2);  // blk is offset by j: d[j] sits at 2j
        d[c] = half_to_float(dh);
        q[c] = blk + 32;
        xs[c] = x + kb * kBlock;
        live = c + 1;
      }
      for (int64_t k = 0; k < kBlock; ++k)
        for (int c = 0; c < live; ++c)
          acc[c] = __builtin_fmaf(xs[c][k], (float)(int8_t)q[c][k * kPanel] * d[c], acc[c]);
    }
    for (int c = 0; c < nc; ++c) out = c0 + c == 0 ? acc[c] : out + acc[c];
  }
  return out;
}

}  // namespace
}  // namespace SLUICE_ISA_NS
