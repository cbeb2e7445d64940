// The low-rank products of LoRA over the 16-lane vector layer (S-LoRA / Punica's segmented
// shape: the base product is shared by the whole step; each adapter's rows, gathered by row
// index, are multiplied by that adapter's own A and B). Included by kernels_impl.h, once per
// ISA translation unit.
//
// One call handles up to kLoraRowBlock rows of one adapter and one module of one layer:
//   shrink  t[i, :]  = x[row_i, :] . Aᵀ        (Aᵀ stored [K, R], R a multiple of 16: the parts'
//                                               A matrices side by side, zero-padded)
//   expand  y[row_i, out_off + n] += scale · Σ_j t[i, r_off + j] · Bᵀ[j, n]   per part
// Every output is an fma chain in a fixed order (over k, then over j) that depends on nothing
// but the row itself: a row's result is the same whatever else shares its block or its step
// (batch invariance), and the same on both ISAs (the vector layer is op for op the same).
#pragma once
#include <cmath>

#include "isa_names.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

// t[i, r0 .. r0 + 16 NV) for M rows, sharing every Aᵀ load between the rows
template <int M, int NV>
static inline void lora_shrink_block(const sluice::LoraArgs& a, float* t, int64_t r0) {
  F16 acc[M][NV];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = fzero();
  const float* xr[M];
  for (int i = 0; i < M; ++i) xr[i] = a.x + (int64_t)a.rows[i] * a.ldx;
  for (int64_t k = 0; k < a.K; ++k) {
    const float* w = a.at + k * a.R + r0;
    F16 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = fload(w + 16 * v);
    for (int i = 0; i < M; ++i) {
      const F16 xk = fset(xr[i][k]);
      for (int v = 0; v < NV; ++v) acc[i][v] = ffma(xk, wv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NV; ++v) fstore(t + i * a.R + r0 + 16 * v, acc[i][v]);
}

template <int M>
static inline void lora_shrink(const sluice::LoraArgs& a, float* t) {
  int64_t r0 = 0;
  for (; r0 + 64 <= a.R; r0 += 64) lora_shrink_block<M, 4>(a, t, r0);
  switch ((a.R - r0) / 16) {
    case 3: lora_shrink_block<M, 3>(a, t, r0); break;
    case 2: lora_shrink_block<M, 2>(a, t, r0); break;
    case 1: lora_shrink_block<M, 1>(a, t, r0); break;
    default: break;
  }
}

template <int M>
static inline void lora_expand(const sluice::LoraArgs& a, const sluice::LoraPartArgs& p, const float* t) {
  const int64_t N = p.out_len, V = N / kPanel * kPanel;
  const F16 scale = fset(p.scale);
  float* yr[M];
  const float* tr[M];
  for (int i = 0; i < M; ++i) {
    yr[i] = a.y + (int64_t)a.rows[i] * a.ldy + p.out_off;
    tr[i] = t + i * a.R + p.r_off;
  }
  for (int64_t n = 0; n < V; n += kPanel) {
    F16 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = fzero();
    for (int64_t j = 0; j < p.r_len; ++j) {
      const F16 w = fload(p.bt + j * N + n);
      for (int i = 0; i < M; ++i) acc[i] = ffma(fset(tr[i][j]), w, acc[i]);
    }
    // as PEFT: result + (lora_B(lora_A(x)) * scaling)
    for (int i = 0; i < M; ++i) fstore(yr[i] + n, fadd(fload(yr[i] + n), fmul(acc[i], scale)));
  }
  for (int64_t n = V; n < N; ++n) {  // the same operations, one lane at a time
    for (int i = 0; i < M; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < p.r_len; ++j) acc = fmaf(tr[i][j], p.bt[j * N + n], acc);
      yr[i][n] = yr[i][n] + acc * p.scale;
    }
  }
}

template <int M>
static void lora_rows_m(const sluice::LoraArgs& a) {
  lora_shrink<M>(a, a.t);
  for (int64_t q = 0; q < a.nparts; ++q) lora_expand<M>(a, a.parts[q], a.t);
}

// a.m rows (1 .. kLoraRowBlock) of one adapter: shrink, then every part's expand
static void lora_rows(const sluice::LoraArgs& a) {
  switch (a.m) {
    case 1: lora_rows_m<1>(a); break;
    case 2: lora_rows_m<2>(a); break;
    case 3: lora_rows_m<3>(a); break;
    case 4: lora_rows_m<4>(a); break;
    default: break;  // the glue never passes more (kLoraRowBlock)
  }
}

}  // namespace
}  // namespace SLUICE_ISA_NS
