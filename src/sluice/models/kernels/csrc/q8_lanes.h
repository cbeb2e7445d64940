// The Q8_0 panel's 4 k rows of 16 signed bytes at p (k .. k+3, see isa.h) regrouped into 4 bytes
// per output lane, k ascending (dot_u8s8's layout): lanes 0-7 in *lo, 8-15 in *hi. SSE byte moves
// only; simd_avx2.h keeps the halves as its pair of registers, simd_avx512.h joins them.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace SLUICE_ISA_NS {

static inline void q8_k4_halves(const uint8_t* p, __m256i* lo, __m256i* hi) {
  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  const __m128i r0 = _mm_loadu_si128(v), r1 = _mm_loadu_si128(v + 1), r2 = _mm_loadu_si128(v + 2),
                r3 = _mm_loadu_si128(v + 3);
  const __m128i a0 = _mm_unpacklo_epi8(r0, r1), a1 = _mm_unpackhi_epi8(r0, r1);  // (k, k+1) per lane
  const __m128i b0 = _mm_unpacklo_epi8(r2, r3), b1 = _mm_unpackhi_epi8(r2, r3);  // (k+2, k+3)
  *lo = _mm256_set_m128i(_mm_unpackhi_epi16(a0, b0), _mm_unpacklo_epi16(a0, b0));
  *hi = _mm256_set_m128i(_mm_unpackhi_epi16(a1, b1), _mm_unpacklo_epi16(a1, b1));
}

}  // namespace SLUICE_ISA_NS
