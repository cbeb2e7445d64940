// 16-lane vectors on AVX-512 (F, BW, DQ, VL; VNNI when the TU is built with it): one register.
// simd_avx2.h defines the same operations on pairs of AVX2 registers, op for op, so the kernels
// in kernels_impl.h perform the same IEEE operations in the same order on both: results are
// bit-identical across the two ISAs.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace SLUICE_ISA_NS {

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

struct F16 {
  __m512 v;
};
struct I16 {
  __m512i v;
};

static inline F16 fzero() { return {_mm512_setzero_ps()}; }
static inline F16 fset(float a) { return {_mm512_set1_ps(a)}; }
static inline F16 fload(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void fstore(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
static inline F16 fadd(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline F16 fsub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline F16 fmul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline F16 fdiv(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
static inline F16 fmax_(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
static inline F16 fmin_(F16 a, F16 b) { return {_mm512_min_ps(a.v, b.v)}; }
// a * b + c with one rounding
static inline F16 ffma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
static inline F16 fabs_(F16 a) { return {_mm512_abs_ps(a.v)}; }
// 16 fp16 values -> fp32 (exact)
static inline F16 fload_half(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// round to nearest even, as the default MXCSR rounding mode
static inline I16 fround_i(F16 a) { return {_mm512_cvtps_epi32(a.v)}; }
static inline F16 i2f(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
// horizontal sum in a fixed tree: halves of 8, 4, 2, 1 (the AVX2 version adds in the same order)
static inline float fhsum(F16 a) {
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}
// fhsum's first level alone: lane i + lane i + 8 (hsum8 in attention_impl.h finishes 8 at once)
static inline __m256 fhalf(F16 a) { return _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)); }
static inline float fhmax(F16 a) { return _mm512_reduce_max_ps(a.v); }  // max is exact in any order

static inline I16 iload(const void* p) { return {_mm512_loadu_si512(p)}; }
static inline I16 iset(int32_t a) { return {_mm512_set1_epi32(a)}; }
static inline void istore(void* p, I16 a) { _mm512_storeu_si512(p, a.v); }
static inline I16 izero() { return {_mm512_setzero_si512()}; }
static inline I16 iand(I16 a, I16 b) { return {_mm512_and_si512(a.v, b.v)}; }
static inline I16 iadd(I16 a, I16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
static inline I16 isub(I16 a, I16 b) { return {_mm512_sub_epi32(a.v, b.v)}; }
template <int S>
static inline I16 isrl(I16 a) {
  return {_mm512_srli_epi32(a.v, S)};
}
static inline I16 islli(I16 a, int s) { return {_mm512_slli_epi32(a.v, s)}; }

// The low 4 bits of each 32-bit lane, as floats 0..15: a 16-entry table lookup (vpermps
// ignores the upper index bits, so no mask is needed).
static inline F16 nibble_to_f(I16 a) {
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return {_mm512_permutexvar_ps(a.v, table)};
}
// Q4_1's nibbles of one group, kept as loaded: a k's value is a shift and the table lookup
struct Q4Nibbles {
  I16 w;
};
static inline Q4Nibbles q4_nibbles(I16 w) { return {w}; }
template <int S>
static inline F16 q4_value(const Q4Nibbles& n) {
  return nibble_to_f(isrl<S>(n.w));
}
// 16 signed bytes -> floats
static inline F16 sbytes_to_f(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
// per 32-bit lane: acc += sum of 4 products of unsigned bytes (u) and signed bytes (s)
static inline I16 dot_u8s8(I16 acc, I16 u, I16 s) {
#if defined(__AVX512VNNI__)
  return {_mm512_dpbusd_epi32(acc.v, u.v, s.v)};
#else
  // the 16-bit pair sums stay below 2^15: Q4 nibbles (u <= 15, |s| <= 128) and the greedy
  // head (u = |q| <= 128, |s| <= 127: 2 * 128 * 127 = 32512)
  const __m512i pairs = _mm512_maddubs_epi16(u.v, s.v);
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
#endif
}

}  // namespace SLUICE_ISA_NS

namespace SLUICE_ISA_NS {
static inline F16 fround(F16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
static inline F16 i_as_f(I16 a) { return {_mm512_castsi512_ps(a.v)}; }
// 16 int32 lanes in [-128, 127] -> 16 bytes
static inline void istore_i8(int8_t* p, I16 a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(a.v));
}
// The Q8_0 panel's 4 k rows at p (16 bytes each, one per lane) as 16 lanes of 4 bytes, k
// ascending (dot_u8s8's layout): a 4 x 4 transpose of 32-bit words across the 128-bit rows (lanes
// 4i..4i+3 of every k into row i), then of the bytes within each row: two loads and two shuffles
// where SSE unpacks took fourteen operations (the greedy head regroups every panel on every call).
// Two 256-bit loads, not one 512-bit: the rows start 32 bytes into a 64-byte line, and a 512-bit
// load across two lines made the 1-row head 2x slower on Zen 4.
static inline I16 q8_k4_lanes(const uint8_t* p) {
  const __m512i words = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), 1);
  return {_mm512_shuffle_epi8(_mm512_permutexvar_epi32(words, v), bytes)};
}
// bytes: |a| (as unsigned: |-128| = 128), and a * sign(b) (0 where b is 0; AVX-512 has no vpsignb:
// a negated where b < 0, and where b is 0 the product with |b| = 0 is 0 anyway)
static inline I16 iabs8(I16 a) { return {_mm512_abs_epi8(a.v)}; }
static inline I16 isign8(I16 a, I16 b) {
  return {_mm512_mask_sub_epi8(a.v, _mm512_movepi8_mask(b.v), _mm512_setzero_si512(), a.v)};
}
// The greedy head's int8 dot products (greedy_head_impl.h). With VNNI, vpdpbusd adds four byte
// products into 32 bits without vpmaddubsw's 16-bit saturation, so the activations go in unsigned
// (x + 128) against the weights' own signed q, and the offset comes out once per block
// (-128 * sum q, kept beside the panel): one instruction per row and 4 k, against three (a
// broadcast, x * sign(q), the product) for |q| . x * sign(q). Same integers either way.
#if defined(__AVX512VNNI__)
constexpr bool kHeadUnsignedX = true;
#else
constexpr bool kHeadUnsignedX = false;
#endif
// bit i set where !(a[i] < b[i]): also where either is NaN
static inline uint32_t fnot_less_mask(F16 a, F16 b) { return (uint32_t)_mm512_cmp_ps_mask(a.v, b.v, _CMP_NLT_UQ); }
// register-block shapes: rows x panels per register block (32 vector registers)
// small M: register blocks of up to 8 rows, dequantizing on the fly; up to kDirectMaxM rows
// in all (measured: beyond it dequantizing once into a scratch and a plain GEMM wins)
constexpr int kMaxRows = 8;
constexpr int kPanelsFor[9] = {0, 4, 4, 4, 2, 2, 2, 2, 2};
constexpr int64_t kDirectMaxM = 16;
// the fp32 micro-kernel over dequantized panels: up to 6 rows x 4 panels (24 accumulators)
// rows per block of the greedy head's approximation: 8 accumulators + 8 partial sums of 32 registers
constexpr int kApproxRows = 8;
constexpr int kGemmRows = 6;
constexpr int kGemmPanelsFor[7] = {0, 4, 4, 4, 4, 4, 4};
}  // namespace SLUICE_ISA_NS
