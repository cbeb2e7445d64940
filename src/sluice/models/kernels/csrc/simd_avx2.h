// 16-lane vectors on AVX2 + FMA + F16C: a pair of 8-lane registers (lo = lanes 0-7, hi = 8-15).
// The same operations as simd_avx512.h, op for op (see there).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace SLUICE_ISA_NS {

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

struct F16 {
  __m256 lo, hi;
};
struct I16 {
  __m256i lo, hi;
};

static inline F16 fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline F16 fset(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline F16 fload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void fstore(float* p, F16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
static inline F16 fadd(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline F16 fsub(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline F16 fmul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline F16 fdiv(F16 a, F16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
static inline F16 fmax_(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline F16 fmin_(F16 a, F16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
static inline F16 ffma(F16 a, F16 b, F16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline F16 fabs_(F16 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
static inline F16 fload_half(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
static inline I16 fround_i(F16 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
static inline F16 i2f(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
// The 8 lanes of s8 folded by `op` in a fixed tree: halves of 4, 2, 1 (lane 0 holds the result;
// the other lanes' values are never read).
template <class Op>
static inline float ffold8(__m256 s8, Op op) {
  const __m128 s4 = op(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = op(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(op(s2, _mm_movehdup_ps(s2)));
}
// fhsum's first level alone: lane i + lane i + 8 (hsum8 in attention_impl.h finishes 8 at once)
static inline __m256 fhalf(F16 a) { return _mm256_add_ps(a.lo, a.hi); }
static inline float fhsum(F16 a) {
  return ffold8(fhalf(a), [](__m128 x, __m128 y) { return _mm_add_ps(x, y); });
}
static inline float fhmax(F16 a) {
  return ffold8(_mm256_max_ps(a.lo, a.hi), [](__m128 x, __m128 y) { return _mm_max_ps(x, y); });
}

static inline I16 iload(const void* p) {
  const __m256i* q = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
static inline I16 iset(int32_t a) { return {_mm256_set1_epi32(a), _mm256_set1_epi32(a)}; }
static inline void istore(void* p, I16 a) {
  __m256i* q = reinterpret_cast<__m256i*>(p);
  _mm256_storeu_si256(q, a.lo);
  _mm256_storeu_si256(q + 1, a.hi);
}
static inline I16 izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
static inline I16 iand(I16 a, I16 b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
static inline I16 iadd(I16 a, I16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
static inline I16 isub(I16 a, I16 b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
template <int S>
static inline I16 isrl(I16 a) {
  return {_mm256_srli_epi32(a.lo, S), _mm256_srli_epi32(a.hi, S)};
}
static inline I16 islli(I16 a, int s) {
  return {_mm256_slli_epi32(a.lo, s), _mm256_slli_epi32(a.hi, s)};
}

static inline F16 nibble_to_f(I16 a) {
  const __m256i m = _mm256_set1_epi32(15);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(a.lo, m)), _mm256_cvtepi32_ps(_mm256_and_si256(a.hi, m))};
}
// Q4_1's nibbles of one group (see isa.h): byte i of each lane word holds k = i (low nibble) and
// k = 4 + i (high). Split once into the low and high nibbles, a k's value is then one byte
// shuffle (vpshufb: byte i of each lane to byte 0, zeros above) and a convert: 2 operations per
// k where a shift, a mask and the convert took 3.
struct Q4Nibbles {
  I16 lo, hi;
};
static inline Q4Nibbles q4_nibbles(I16 w) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {{_mm256_and_si256(w.lo, m), _mm256_and_si256(w.hi, m)},
          {_mm256_and_si256(_mm256_srli_epi32(w.lo, 4), m), _mm256_and_si256(_mm256_srli_epi32(w.hi, 4), m)}};
}
// S: the nibble's bit offset in the lane word (0, 8, 16, 24 low nibbles; 4, 12, 20, 28 high)
template <int S>
static inline F16 q4_value(const Q4Nibbles& n) {
  constexpr int i = S / 8;
  const I16& src = (S % 8 == 0) ? n.lo : n.hi;
  const char z = (char)0x80;
  const __m256i ctl = _mm256_setr_epi8(i, z, z, z, 4 + i, z, z, z, 8 + i, z, z, z, 12 + i, z, z, z,
                                       i, z, z, z, 4 + i, z, z, z, 8 + i, z, z, z, 12 + i, z, z, z);
  return {_mm256_cvtepi32_ps(_mm256_shuffle_epi8(src.lo, ctl)), _mm256_cvtepi32_ps(_mm256_shuffle_epi8(src.hi, ctl))};
}
static inline F16 sbytes_to_f(const int8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
static inline I16 dot_u8s8(I16 acc, I16 u, I16 s) {
  // vpmaddubsw saturates its 16-bit pair sums; they stay below 2^15 for both callers: Q4 nibbles
  // (u <= 15, |s| <= 128) and the greedy head (u = |q| <= 128, |s| <= 127: 2 * 128 * 127 = 32512)
  const __m256i one = _mm256_set1_epi16(1);
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(u.lo, s.lo), one)),
          _mm256_add_epi32(acc.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(u.hi, s.hi), one))};
}

}  // namespace SLUICE_ISA_NS

namespace SLUICE_ISA_NS {
static inline F16 fround(F16 a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
static inline F16 i_as_f(I16 a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
// the greedy head's activations stay signed: vpmaddubsw's pair sums would saturate at x + 128
// (simd_avx512.h says what VNNI does instead)
constexpr bool kHeadUnsignedX = false;
static inline void istore_i8(int8_t* p, I16 a) {
  // saturating packs are exact for values in [-128, 127]; the permute undoes packs' lane order
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}
// The Q8_0 panel's 4 k rows at p (16 bytes each, one per lane) as 16 lanes of 4 bytes, k
// ascending (dot_u8s8's layout): lanes 0-7 in lo, 8-15 in hi. Each half gathers its 8 bytes of
// every k (one 64-bit unpack of two 32-byte loads), moves lanes 4h..4h+3 of every k into its
// 128-bit half h (one 32-bit permute), and transposes the bytes there (one shuffle): 8 operations
// where byte and word unpacks of 16-byte loads took 14. The greedy head regroups every panel on
// every call (simd_avx512.h does the same with 512-bit words).
static inline I16 q8_k4_lanes(const uint8_t* p) {
  const __m256i k01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));       // [k0 | k1]
  const __m256i k23 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));  // [k2 | k3]
  const __m256i words = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
  const __m256i bytes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return {_mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(k01, k23), words), bytes),
          _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(k01, k23), words), bytes)};
}
// bytes: |a| (as unsigned: |-128| = 128), and a * sign(b) (0 where b is 0)
static inline I16 iabs8(I16 a) { return {_mm256_abs_epi8(a.lo), _mm256_abs_epi8(a.hi)}; }
static inline I16 isign8(I16 a, I16 b) { return {_mm256_sign_epi8(a.lo, b.lo), _mm256_sign_epi8(a.hi, b.hi)}; }
// bit i set where !(a[i] < b[i]): also where either is NaN
static inline uint32_t fnot_less_mask(F16 a, F16 b) {
  const uint32_t lo = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_NLT_UQ));
  const uint32_t hi = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_NLT_UQ));
  return lo | (hi << 8);
}
// 16 vector registers: half the AVX-512 blocks
constexpr int kMaxRows = 4;
constexpr int kPanelsFor[5] = {0, 2, 2, 1, 1};
constexpr int64_t kDirectMaxM = 8;
// rows per block of the greedy head's approximation (4 measured faster than 2 or 3 at 32 rows,
// though the accumulators then spill)
constexpr int kApproxRows = 4;
constexpr int kGemmRows = 6;
constexpr int kGemmPanelsFor[7] = {0, 2, 2, 2, 1, 1, 1};
}  // namespace SLUICE_ISA_NS
