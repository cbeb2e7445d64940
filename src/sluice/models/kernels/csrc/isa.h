// The boundary between the torch glue (ops.cpp) and the per-ISA kernel translation units.
//
// Each ISA TU (isa_avx2.cpp, isa_avx512.cpp) is compiled with its own -m flags and includes no
// torch header and no standard-library template: an inline function instantiated in an AVX-512
// TU could otherwise be merged by the linker with the generic copy and run on a CPU without
// AVX-512. So this header uses plain C types only, and every ISA TU exports one table of
// function pointers, picked at run time from cpuid.
#pragma once
#include <cstdint>

namespace sluice {

// Packed layouts (see docs/ENGINE.md). A panel is 16 consecutive output rows (n); a block is
// 32 consecutive input columns (k), the GGUF quantization block.
//   Q4_1 panel block, 320 bytes: d[16] fp16, m[16] fp16, then 4 groups of 8 k, each 16 lanes x
//     4 bytes; byte i of lane j in group g holds q[n0+j][8g+i] (low nibble) and q[n0+j][8g+4+i]
//     (high nibble). One layout serves the exact kernel (shift + table lookup per k) and the
//     int8 kernel (mask/shift to 4 unsigned bytes per lane for vpdpbusd / maddubs).
//   Q8_0 panel block, 544 bytes: d[16] fp16, then 32 k x 16 lanes int8 (q[n0+j][k] at 16k+j).
constexpr int kPanel = 16;
constexpr int kBlock = 32;
constexpr int kQ4PanelBlockBytes = 320;
constexpr int kQ8PanelBlockBytes = 544;

struct GemmArgs {
  int64_t M, N, K;
  const float* x;       // [M, ldx]
  int64_t ldx;
  float* y;             // [M, ldy]
  int64_t ldy;
  const float* bias;    // [N] or null
  const uint8_t* w;     // packed panels
  const int8_t* xq;     // fast: [M, K] quantized activations
  const float* xd;      // fast: [M, K/32] activation scales
  const float* xs;      // fast: [M, K/32] scale * sum of quantized values
};

// Decode attention is split into tasks of (sequence, KV head, context chunk of at most
// kAttnChunk positions), so that one long sequence still spreads over every thread. A sequence
// of one chunk writes its output directly; longer ones leave per-chunk partials (max, sum,
// unnormalized output) that attn_merge combines.
constexpr int64_t kAttnChunk = 128;

struct AttnTask {
  int32_t b, kv_head, chunk, num_chunks;
};

struct AttnArgs {
  const float* q;            // [B, H, D] with row stride q_stride (floats) per token
  int64_t q_stride;
  const void* k_cache;       // [KVH, S, D] float32, or IEEE fp16 (uint16) when kv_half
  const void* v_cache;
  int32_t kv_half;           // 1: the caches hold fp16 (the opt-in 16-bit K/V cache)
  int64_t num_slots;
  const int32_t* block_tables;  // [B, max_blocks]
  int64_t max_blocks;
  const int32_t* context_lens;  // [B]
  int64_t block_size;
  int64_t heads, kv_heads, head_dim;
  int64_t window;            // 0 = none
  float scale;
  float* out;                // [B, H, D]
  const AttnTask* tasks;
  const int64_t* chunk_base; // [B]: index of the sequence's first chunk among all chunks
  float* scratch;            // per task: [G, kAttnChunk] scores
  float* partials;           // per (chunk, KV head): G x (D + 2): output, max, sum
};

// LoRA (lora_impl.h): one call = up to kLoraRowBlock rows of one adapter, one module of one
// layer. Aᵀ is [K, R] (R a multiple of 16: the parts' A matrices side by side, zero-padded);
// each part adds scale · t[:, r_off : r_off + r_len] · Bᵀ (Bᵀ [r_len, out_len]) into its
// columns [out_off, out_off + out_len) of y.
constexpr int64_t kLoraRowBlock = 4;

struct LoraPartArgs {
  const float* bt;
  int64_t out_off, out_len, r_off, r_len;
  float scale;
};

struct LoraArgs {
  const float* x;  // [rows, ldx]
  int64_t ldx;
  float* y;        // [rows, ldy], added into
  int64_t ldy;
  const int32_t* rows;  // the m row indices of this call
  int64_t m;
  const float* at;
  int64_t K, R;
  float* t;  // scratch [kLoraRowBlock, R]
  const LoraPartArgs* parts;
  int64_t nparts;
};

struct KernelTable {
  const char* name;
  // the exact GEMMs need a per-thread scratch of scratch_per_k * K floats when M > direct_max_m
  int64_t scratch_per_k;
  int64_t direct_max_m;
  // y[:, panels p0..p1) = x . W^T (+ bias), panels of 16 output rows; scratch: this thread's
  void (*q4_exact)(const GemmArgs&, int64_t p0, int64_t p1, float* scratch);
  void (*q4_fast)(const GemmArgs&, int64_t p0, int64_t p1, float* scratch);
  void (*q8_exact)(const GemmArgs&, int64_t p0, int64_t p1, float* scratch);
  // rows r0..r1 of x: Q8_1-style quantization (fast mode)
  void (*quantize_q8)(const float* x, int64_t ldx, int64_t K, int8_t* xq, float* xd, float* xs, int64_t r0,
                      int64_t r1);
  // dequantize one row n of a packed Q8_0 matrix (the embedding lookup)
  void (*q8_row)(const uint8_t* w, int64_t K, int64_t n, float* out);
  // h += delta (when delta) then out = w * (h * rsqrt(mean(h^2) + eps)), rows r0..r1
  void (*add_rms_norm)(float* h, const float* delta, const float* w, float* out, int64_t D, float eps,
                       int64_t r0, int64_t r1);
  // out[r, :I] = silu(gu[r, :I]) * gu[r, I:2I]
  void (*silu_mul)(const float* gu, float* out, int64_t I, int64_t r0, int64_t r1);
  // decode attention for tasks t0..t1; then, for sequences of several chunks, the merge of
  // (sequence, KV head) pairs p0..p1
  void (*paged_decode)(const AttnArgs&, int64_t t0, int64_t t1);
  void (*attn_merge)(const AttnArgs&, int64_t p0, int64_t p1);
  // the greedy LM head (greedy_head.h). Rows r0..r1: per 32-block d = amax / 127, q = round(x / d),
  // xd = d (NaN: compute the row exactly)
  void (*quantize_rows_i8)(const float* x, int64_t ldx, int64_t K, int8_t* xq, float* xd, int64_t r0, int64_t r1);
  // approximate logits of a packed Q8_0 matrix from those int8 rows (GemmArgs xq, xd); scratch:
  // approx_scratch_per_k * K floats per thread
  int64_t approx_scratch_per_k;
  void (*q8_approx)(const GemmArgs&, int64_t p0, int64_t p1, float* scratch);
  // one row's candidates: ids n with !(y[n] + c wt[n] < max(y - c wt)), ascending; -1 past cap
  int64_t (*head_select)(const float* y, const float* wt, float c, int64_t N, int32_t* idx, int64_t cap);
  // token n's exact logit x . w[n], the same bits as q8_exact's
  float (*q8_dot)(const uint8_t* w, int64_t K, int64_t n, const float* x);
  // LoRA's shrink and expand for a.m rows of one adapter (lora_impl.h)
  void (*lora_rows)(const LoraArgs& a);
};

const KernelTable* avx2_table();
const KernelTable* avx512_table();      // F, BW, DQ, VL
const KernelTable* avx512vnni_table();  // and VNNI

}  // namespace sluice
