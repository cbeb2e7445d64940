// Paged decode attention over the 16-lane vector layer (see isa.h for the task split).
// Included by kernels_impl.h, once per ISA translation unit, after glue_impl.h (fexp).
#pragma once
#include <cmath>
#include <cstring>
#include <type_traits>

#include "isa_names.h"
#include "glue_impl.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

// ---- paged decode attention ------------------------------------------------------------------
// One task = one chunk of one sequence's context x one KV head: its G query heads share each
// K/V row read, straight from the paged cache through the block table (no gathered copy).
// Per query head: s = (q . k) * scale; e = exp(s - max over the chunk); l = sum e;
// o = sum e * v. One chunk: out = o * (1 / l). Several: attn_merge rescales and adds them.
//
// The context is walked in groups of kGroup positions. A group's K rows are read from memory once
// for all G query heads (the other heads find them in L1), and the group's 8 scores per head come
// out of one transposed reduction (hsum8) instead of 8 horizontal sums. hsum8 adds in fhsum's
// tree, and o accumulates position by position as before, so the result is bit for bit what the
// one-position-at-a-time kernel gave (checked on every head dim, fp32 and fp16 caches, windows).
// Measured (docs/BENCHMARKS.md): with K/V in L2 the two cost about the same — the kernel is bound
// by its loads and multiply-adds, not the sums — and at long context by memory bandwidth; the
// gain is at long context, from K read once per group instead of once per head.
// Each position's K/V row address is computed once per chunk (the block-table division was made
// once per query head and pass). With a group's work for all heads between one block's loads and
// the next's, fewer blocks are in flight than when one head's light loop ran ahead, which cost
// ~7 % on blocks scattered through the cache: the K rows kPrefetchGroups groups ahead are
// prefetched by hand into L1, and a task's other rows into L2 as it starts (decode_task says why).
constexpr int64_t kGroup = 8;
constexpr int64_t kPrefetchGroups = 2;
static_assert(sluice::kAttnChunk % kGroup == 0, "a chunk is whole groups");

// One K or V row's panel i: fp32, or fp16 widened exactly to fp32 (the 16-bit K/V cache).
template <bool HALF>
static inline F16 kv_load(const void* row, int i) {
  if constexpr (HALF) return fload_half(static_cast<const uint16_t*>(row) + i * kPanel);
  else return fload(static_cast<const float*>(row) + i * kPanel);
}

// out[p] = (the fhsum of the vector whose fhalf is s[p]) * scale, p = 0..7: fhsum's remaining
// levels (128-bit halves, then pairs, then neighbours) for 8 vectors at once.
static inline void hsum8(const __m256 s[8], float scale, float* out) {
  __m256 v[4];
  for (int j = 0; j < 4; ++j)
    v[j] = _mm256_add_ps(_mm256_permute2f128_ps(s[2 * j], s[2 * j + 1], 0x20),
                         _mm256_permute2f128_ps(s[2 * j], s[2 * j + 1], 0x31));  // [p's 4 | p+1's 4]
  __m256 w[2];
  for (int j = 0; j < 2; ++j) {
    const __m256d a = _mm256_castps_pd(v[2 * j]), b = _mm256_castps_pd(v[2 * j + 1]);
    w[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  const __m256 h = _mm256_hadd_ps(w[0], w[1]);  // positions 0 2 4 6 | 1 3 5 7
  const __m256 r = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_ps(out, _mm256_mul_ps(r, _mm256_set1_ps(scale)));
}

template <int ND, bool HALF>
static inline F16 qdot(const F16* qv, const void* row) {
  F16 acc = fmul(qv[0], kv_load<HALF>(row, 0));
  for (int i = 1; i < ND; ++i) acc = ffma(qv[i], kv_load<HALF>(row, i), acc);
  return acc;
}

// LOCALITY: 3 into L1 (the next groups' K rows), 2 into L2 (a whole task's rows at its start)
template <int ND, bool HALF, int LOCALITY = 3>
static inline void prefetch_rows(const void* const* rows, int64_t count) {
  constexpr int64_t kBytes = ND * kPanel * (HALF ? 2 : 4);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t b = 0; b < kBytes; b += 64) __builtin_prefetch(static_cast<const char*>(rows[r]) + b, 0, LOCALITY);
}

template <int ND, bool HALF>
static void decode_task(const AttnArgs& a, int64_t index) {
  const sluice::AttnTask task = a.tasks[index];
  const int64_t G = a.heads / a.kv_heads, D = ND * kPanel;
  const int64_t b = task.b, kh = task.kv_head;
  const int64_t len = a.context_lens[b];
  const int64_t first = (a.window > 0 && len > a.window) ? len - a.window : 0;
  const int64_t start = first + (int64_t)task.chunk * sluice::kAttnChunk;
  const int64_t n = imin(sluice::kAttnChunk, len - start);
  const int32_t* table = a.block_tables + b * a.max_blocks;
  // the chunk's K and V rows (their element size is HALF's: fp16 or fp32)
  using Elem = typename std::conditional<HALF, uint16_t, float>::type;
  const Elem* kbase = static_cast<const Elem*>(a.k_cache) + kh * a.num_slots * D;
  const Elem* vbase = static_cast<const Elem*>(a.v_cache) + kh * a.num_slots * D;
  const void* krow[sluice::kAttnChunk];
  const void* vrow[sluice::kAttnChunk];
  // block by block: one integer division per block, not per position (the block size is a
  // run-time value, and a 64-bit division costs ~10-20 cycles on every position of every task)
  for (int64_t t = 0, pos = start; t < n;) {
    const int64_t blk = pos / a.block_size, in = pos - blk * a.block_size;
    const int64_t cnt = imin(a.block_size - in, n - t);
    const int64_t off0 = ((int64_t)table[blk] * a.block_size + in) * D;
    for (int64_t j = 0; j < cnt; ++j) {
      krow[t + j] = kbase + off0 + j * D;
      vrow[t + j] = vbase + off0 + j * D;
    }
    t += cnt;
    pos += cnt;
  }
  float* sc = a.scratch + index * G * sluice::kAttnChunk;
  const int64_t full = n / kGroup * kGroup;
  prefetch_rows<ND, HALF>(krow, imin(n, kPrefetchGroups * kGroup));
  // ...and every other K and V row of the task into L2, at once. Decoding many sequences, the K/V
  // (~150 MB in a 32-stream step) comes from memory in blocks of a few KB scattered through the
  // cache, where the hardware prefetchers find no stream to follow; asked for only as the loops
  // reach them, the rows arrive one miss at a time. All of them in flight together, the task runs
  // at the memory's rate (bench/kernels/decode_attention_micro.py: scattered cases 0.75x, the case in L2
  // 1.03-1.05x; a 32-stream step 0.96x, paired in one process; asking one or more tasks ahead
  // instead measured the same).
  if (n > kPrefetchGroups * kGroup)
    prefetch_rows<ND, HALF, 2>(krow + kPrefetchGroups * kGroup, n - kPrefetchGroups * kGroup);
  prefetch_rows<ND, HALF, 2>(vrow, n);
  for (int64_t t0 = 0; t0 < full; t0 += kGroup) {
    const int64_t ahead = t0 + kPrefetchGroups * kGroup;
    if (ahead < n) prefetch_rows<ND, HALF>(krow + ahead, imin(kGroup, n - ahead));
    for (int64_t g = 0; g < G; ++g) {
      const float* q = a.q + b * a.q_stride + (kh * G + g) * D;
      F16 qv[ND];
      for (int i = 0; i < ND; ++i) qv[i] = fload(q + i * kPanel);
      __m256 s8[kGroup];
      for (int p = 0; p < kGroup; ++p) s8[p] = fhalf(qdot<ND, HALF>(qv, krow[t0 + p]));
      hsum8(s8, a.scale, sc + g * sluice::kAttnChunk + t0);
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float* q = a.q + b * a.q_stride + (kh * G + g) * D;
    F16 qv[ND];
    for (int i = 0; i < ND; ++i) qv[i] = fload(q + i * kPanel);
    for (int64_t t = full; t < n; ++t) sc[g * sluice::kAttnChunk + t] = fhsum(qdot<ND, HALF>(qv, krow[t])) * a.scale;
  }
  float mx[16], total[16];
  for (int64_t g = 0; g < G; ++g) {
    float* s = sc + g * sluice::kAttnChunk;
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
      const F16 e = fset(s[t]);
      for (int i = 0; i < ND; ++i) o[i] = ffma(e, kv_load<HALF>(vrow[t], i), o[i]);
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
  const bool h = a.kv_half != 0;
  switch (a.head_dim / kPanel) {
    case 1: fn = h ? &decode_task<1, true> : &decode_task<1, false>; break;
    case 2: fn = h ? &decode_task<2, true> : &decode_task<2, false>; break;
    case 3: fn = h ? &decode_task<3, true> : &decode_task<3, false>; break;
    case 4: fn = h ? &decode_task<4, true> : &decode_task<4, false>; break;
    case 5: fn = h ? &decode_task<5, true> : &decode_task<5, false>; break;
    case 6: fn = h ? &decode_task<6, true> : &decode_task<6, false>; break;
    case 8: fn = h ? &decode_task<8, true> : &decode_task<8, false>; break;
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

}  // namespace
}  // namespace SLUICE_ISA_NS
