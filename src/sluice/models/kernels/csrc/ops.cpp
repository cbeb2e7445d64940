// The torch-facing half of sluice's CPU kernels: argument checks, packing, threading
// (at::parallel_for) and the run-time choice of ISA. No SIMD code lives here: it is built with
// the compiler's baseline flags and calls into the per-ISA tables of isa.h.
#include <cpuid.h>
#include <emmintrin.h>
#include <torch/extension.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "helper_pool.h"
#include "isa.h"

namespace sluice {
namespace {

// ---- CPU features -----------------------------------------------------------------------------
struct Features {
  bool avx2 = false, avx512 = false, vnni = false;
};

Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return f;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned xcr0 = lo;
  if ((xcr0 & 0x6) != 0x6) return f;  // the OS saves SSE and AVX state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = b & (1u << 5);
  const bool f512 = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
  f.avx512 = f.avx2 && f512 && dq && bw && vl && (xcr0 & 0xE0) == 0xE0;  // and opmask/zmm state
  f.vnni = f.avx512 && (c & (1u << 11));
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

const KernelTable* pick(const std::string& want) {
  const Features& f = features();
  if (want == "avx2") return f.avx2 ? avx2_table() : nullptr;
  if (want == "avx512") return f.avx512 ? avx512_table() : nullptr;
  if (want == "avx512-vnni") return f.vnni ? avx512vnni_table() : nullptr;
  // auto: the widest the CPU has
  if (f.vnni) return avx512vnni_table();
  if (f.avx512) return avx512_table();
  if (f.avx2) return avx2_table();
  return nullptr;
}

const KernelTable* g_table = nullptr;

const KernelTable& table() {
  TORCH_CHECK(g_table != nullptr, "sluice kernels: this CPU lacks AVX2 + FMA + F16C");
  return *g_table;
}

std::string set_isa(const std::string& want) {
  const KernelTable* t = pick(want);
  TORCH_CHECK(t != nullptr, "sluice kernels: ISA '", want, "' is not available on this CPU");
  g_table = t;
  return t->name;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  const Features& f = features();
  if (f.avx2) out.push_back("avx2");
  if (f.avx512) out.push_back("avx512");
  if (f.vnni) out.push_back("avx512-vnni");
  return out;
}

std::string isa() { return g_table ? g_table->name : "none"; }

// How many threads one at::parallel_for over n items (grain 1) runs on: torch's thread count
// when this file was compiled with OpenMP, 1 when it was not (at::parallel_for is then serial).
// Tests check it, since a build without -fopenmp is correct but silently single-threaded.
int64_t parallel_team(int64_t n) {
  std::atomic<int64_t> widest{0};
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const int64_t mine = at::get_thread_num() + 1;
    int64_t seen = widest.load();
    while (mine > seen && !widest.compare_exchange_weak(seen, mine)) {
    }
  });
  return widest.load();
}

// ---- checks -----------------------------------------------------------------------------------
void check_rows(const torch::Tensor& x, int64_t K, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, what, ": expected a float32 CPU tensor");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.stride(1) == 1 && x.stride(0) >= K, what,
              ": expected rows of ", K, " contiguous floats, got ", x.sizes());
}

void check_packed(const torch::Tensor& w, int64_t N, int64_t K, int64_t block_bytes) {
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.is_contiguous() && w.device().is_cpu(), "packed weight: uint8 CPU");
  TORCH_CHECK(K % kBlock == 0, "K must be a multiple of 32");
  const int64_t panels = (N + kPanel - 1) / kPanel;
  TORCH_CHECK(w.numel() == panels * (K / kBlock) * block_bytes, "packed weight has the wrong size for ", N, "x", K);
}

int64_t panels_of(int64_t N) { return (N + kPanel - 1) / kPanel; }

// rows of work per parallel task: small calls stay on the calling thread
int64_t grain_rows(int64_t K) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K)); }

// Which calls split over torch's threads (measured: docs/BENCHMARKS.md, "Decode batches on two
// threads", on the shared 2-core machine):
// * every call over more than kAlwaysSplitRows rows (prefill steps): at::parallel_for, whose
//   OpenMP barrier waits for a thread that has no core yet; prefill's regions of milliseconds lose
//   little to that and gain up to the thread count (issue 14: TTFT under concurrency);
// * decode calls (at most 64 rows: max_num_seqs defaults to 64) never on OpenMP: there a decode
//   step took 4-13x as long (single stream 13 -> 66 ms per token), each region's barrier waiting
//   for a thread without a core. They split on the helper pool (helper_pool.h: never waits for a
//   helper that did not start, keeps its helpers spinning through a decode step, rests while they
//   get no core) from the cut set_split_cut(min_rows, min_work) gives; the engine sets it from
//   decode_split_rows (models/kernels/__init__.py: 1 row and 64K multiply-adds by default, every
//   linear of one stream; 65 = none split). Served on 2 cores beside the gateway: one stream's
//   step 0.64x of serial, 32 streams 1.70x llama.cpp's throughput instead of 1.20x
//   (docs/BENCHMARKS.md, "The second core, by default").
// The split never changes a result (tests/unit/models/test_kernels.py: 1/2/3 threads bit for bit).
constexpr int64_t kAlwaysSplitRows = 64;
std::atomic<int64_t> g_split_min_rows{kAlwaysSplitRows + 1};
std::atomic<int64_t> g_split_min_work{int64_t(1) << 20};

bool split_call(int64_t rows, int64_t work) {
  return rows > kAlwaysSplitRows ||
         (rows >= g_split_min_rows.load(std::memory_order_relaxed) &&
          work >= g_split_min_work.load(std::memory_order_relaxed));
}

// Sets the cut for calls of at most kAlwaysSplitRows rows (benchmarks and tests; min_rows above
// kAlwaysSplitRows restores "decode always serial"); returns the previous (min_rows, min_work).
std::vector<int64_t> set_split_cut(int64_t min_rows, int64_t min_work) {
  TORCH_CHECK(min_rows >= 1 && min_work >= 0, "set_split_cut: min_rows >= 1, min_work >= 0");
  return {g_split_min_rows.exchange(min_rows), g_split_min_work.exchange(min_work)};
}

std::vector<int64_t> split_cut() { return {g_split_min_rows.load(), g_split_min_work.load()}; }

// Decode attention splits its tasks over the helper pool from this many multiply-adds per call
// (every context position, for every query head, q.k and p.v), at any batch size. INT64_MAX here
// (off); decode_split_rows turns it on at 32K (models/kernels/__init__.py: ~28 context tokens of
// the bundled model, one stream included): one stream at long context is hundreds of microseconds
// of attention per layer, bound by memory bandwidth, which a second core adds to. Before the pool
// rested on a busy machine, its helper ran its chunks on the core the caller shared (wall = CPU
// time) and a step took 1.02-1.05x as long (docs/BENCHMARKS.md, "Decode attention at long context").
std::atomic<int64_t> g_attn_split_work{INT64_MAX};

int64_t set_attn_split_work(int64_t work) {
  TORCH_CHECK(work >= 0, "set_attn_split_work: work >= 0");
  return g_attn_split_work.exchange(work);
}

HelperPool& helper_pool() {
  static HelperPool* pool = new HelperPool();  // never destroyed: its helpers are detached
  return *pool;
}

// Runs f(begin, end, slot) over [begin, end): calls over more than kAlwaysSplitRows rows on
// at::parallel_for (torch's OpenMP team, `grain` items per task at least; slot = OpenMP thread),
// split_call ones on the helper pool (chunks of at least `grain` items, rounded up to `align`,
// ~4 per thread so that a late helper still finds work), the rest on the calling thread (slot 0).
// `pool`: a call of at most kAlwaysSplitRows rows that splits on the helper pool whatever the cut.
template <class F>
void parallel_rows(int64_t rows, int64_t work, int64_t begin, int64_t end, int64_t grain, int64_t align, const F& f,
                   bool pool = false) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int threads = at::get_num_threads();
  if (rows > kAlwaysSplitRows) {
    at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { f(b, e, (int64_t)at::get_thread_num()); });
  } else if (threads > 1 && (pool || split_call(rows, work)) && !at::in_parallel_region()) {
    int64_t chunk = std::max<int64_t>(grain, (n + 4 * threads - 1) / (4 * threads));
    chunk = (chunk + align - 1) / align * align;
    auto trampoline = [](const void* ctx, int64_t b, int64_t e, int slot) {
      const auto& c = *static_cast<const std::pair<const F*, int64_t>*>(ctx);
      (*c.first)(c.second + b, c.second + e, (int64_t)slot);
    };
    const std::pair<const F*, int64_t> ctx{&f, begin};
    helper_pool().run(n, chunk, threads - 1, trampoline, &ctx);
  } else {
    f(begin, end, (int64_t)0);
  }
}

// ---- packing (load time) -------------------------------------------------------------------
// GGUF blocks of `block_bytes` each, [N, K/32] of them, rearranged into panels of kPanel rows:
// `place(block, panel_block, j)` writes row j's block into its panel's block.
template <class Place>
static torch::Tensor pack_panels(const torch::Tensor& raw, int64_t N, int64_t K, int64_t block_bytes,
                                 int64_t panel_block_bytes, const char* name, Place place) {
  TORCH_CHECK(raw.scalar_type() == torch::kUInt8 && raw.is_contiguous() && K % kBlock == 0, name, ": bad input");
  const int64_t KB = K / kBlock;
  TORCH_CHECK(raw.numel() == N * KB * block_bytes, name, ": expected ", N * KB * block_bytes, " bytes");
  torch::Tensor out = torch::empty({panels_of(N) * KB * panel_block_bytes}, torch::kUInt8);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  std::memset(dst, 0, out.numel());  // the padding rows of the last panel stay 0
  // One thread on purpose, and memset rather than torch::zeros (whose fill is parallel): the
  // bundled model packs in ~50 ms of CPU on one core, while an OpenMP team per call (~120 calls)
  // cost 1-1.5 s of CPU (2-4 s wall) on a busy 2-core machine, spinning for a core each time.
  for (int64_t n = 0; n < N; ++n) {
    const int64_t p = n / kPanel, j = n % kPanel;
    for (int64_t kb = 0; kb < KB; ++kb)
      place(src + (n * KB + kb) * block_bytes, dst + (p * KB + kb) * panel_block_bytes, static_cast<int>(j));
  }
  return out;
}

// raw: [N, K/32 * 20] GGUF Q4_1 blocks (d fp16, m fp16, 16 bytes of nibbles)
torch::Tensor pack_q4_1(const torch::Tensor& raw, int64_t N, int64_t K) {
  return pack_panels(raw, N, K, 20, kQ4PanelBlockBytes, "pack_q4_1", [](const uint8_t* blk, uint8_t* base, int j) {
    std::memcpy(base + 2 * j, blk, 2);
    std::memcpy(base + 32 + 2 * j, blk + 2, 2);
    uint8_t q[32];
    for (int k = 0; k < 16; ++k) {
      q[k] = blk[4 + k] & 15;
      q[k + 16] = blk[4 + k] >> 4;
    }
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < 4; ++i) base[64 + g * 64 + j * 4 + i] = q[8 * g + i] | (q[8 * g + 4 + i] << 4);
  });
}

// raw: [N, K/32 * 34] GGUF Q8_0 blocks (d fp16, 32 int8)
torch::Tensor pack_q8_0(const torch::Tensor& raw, int64_t N, int64_t K) {
  return pack_panels(raw, N, K, 34, kQ8PanelBlockBytes, "pack_q8_0", [](const uint8_t* blk, uint8_t* base, int j) {
    std::memcpy(base + 2 * j, blk, 2);
    for (int k = 0; k < kBlock; ++k) base[32 + k * kPanel + j] = blk[2 + k];
  });
}

// ---- linears ------------------------------------------------------------------------------------
GemmArgs gemm_args(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y, int64_t N, int64_t K,
                   const c10::optional<torch::Tensor>& bias) {
  GemmArgs a{};
  a.M = x.size(0);
  a.N = N;
  a.K = K;
  a.x = x.data_ptr<float>();
  a.ldx = x.stride(0);
  a.y = y.data_ptr<float>();
  a.ldy = y.stride(0);
  a.w = w.data_ptr<uint8_t>();
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N, "bias: [N] float32");
    a.bias = bias->data_ptr<float>();
  }
  return a;
}

using GemmFn = void (*)(const GemmArgs&, int64_t, int64_t, float*);

void run_panels(const GemmArgs& a, GemmFn fn, int64_t scratch_per_k, int64_t direct_max_m) {
  // Split the output panels evenly across threads, each task at least ~32K multiply-adds (at
  // M = 1 and K = 576: 4 panels, ~22 KB of Q4_1 weights). With the helpers spinning through a
  // decode step a chunk needs no wake-up to pay for: one stream's step took 0.64x of serial at
  // 32K against 0.69x at 128K (exact; fast numerics 0.73x against 0.80x).
  const int64_t panels = panels_of(a.N);
  const int64_t grain = std::max<int64_t>(1, (32768 + a.M * a.K * kPanel - 1) / (a.M * a.K * kPanel));
  torch::Tensor scratch;
  float* base = nullptr;
  const int64_t per_thread = a.K * scratch_per_k;
  if (scratch_per_k && a.M > direct_max_m) {  // the GEMM path dequantizes panels into a per-thread scratch
    scratch = torch::empty({at::get_num_threads() * per_thread}, torch::kFloat32);
    base = scratch.data_ptr<float>();
  }
  // align 4: the scratch GEMM dequantizes 4 panels at a time
  parallel_rows(a.M, a.M * a.N * a.K, 0, panels, grain, 4, [&](int64_t p0, int64_t p1, int64_t slot) {
    fn(a, p0, p1, base ? base + slot * per_thread : nullptr);
  });
}

// The checks, the output and the GEMM arguments every packed linear shares; `run(a)` fills y.
template <class Run>
static torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K,
                                   const c10::optional<torch::Tensor>& bias, int64_t panel_block_bytes,
                                   const char* what, Run run) {
  check_rows(x, K, what);
  check_packed(w, N, K, panel_block_bytes);
  torch::Tensor y = torch::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
  GemmArgs a = gemm_args(x, w, y, N, K, bias);
  run(a);
  return y;
}

torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K,
                        const c10::optional<torch::Tensor>& bias, bool fast) {
  const KernelTable& t = table();
  return packed_linear(x, w, N, K, bias, kQ4PanelBlockBytes, "linear_q4 input", [&](GemmArgs& a) {
    if (!fast) {
      run_panels(a, t.q4_exact, t.scratch_per_k, t.direct_max_m);
      return;
    }
    const int64_t M = a.M, KB = K / kBlock;
    torch::Tensor xq = torch::empty({M, K}, torch::kInt8);
    torch::Tensor xd = torch::empty({M, KB}, x.options());
    torch::Tensor xs = torch::empty({M, KB}, x.options());
    parallel_rows(M, M * K, 0, M, grain_rows(K), 1, [&](int64_t r0, int64_t r1, int64_t) {
      t.quantize_q8(a.x, a.ldx, K, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>(), r0, r1);
    });
    a.xq = xq.data_ptr<int8_t>();
    a.xd = xd.data_ptr<float>();
    a.xs = xs.data_ptr<float>();
    run_panels(a, t.q4_fast, 0, 0);
  });
}

torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K,
                        const c10::optional<torch::Tensor>& bias) {
  const KernelTable& t = table();
  return packed_linear(x, w, N, K, bias, kQ8PanelBlockBytes, "linear_q8 input",
                       [&](GemmArgs& a) { run_panels(a, t.q8_exact, t.scratch_per_k, t.direct_max_m); });
}

torch::Tensor embed_q8(const torch::Tensor& ids, const torch::Tensor& w, int64_t N, int64_t K) {
  check_packed(w, N, K, kQ8PanelBlockBytes);
  TORCH_CHECK(ids.scalar_type() == torch::kInt64 && ids.dim() == 1 && ids.is_contiguous(), "embed_q8: ids [T] int64");
  const KernelTable& t = table();
  const int64_t T = ids.size(0);
  torch::Tensor out = torch::empty({T, K}, torch::kFloat32);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < T; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < N, "embed_q8: token id ", id[i], " out of range");
  parallel_rows(T, T * K, 0, T, 16, 1, [&](int64_t r0, int64_t r1, int64_t) {
    for (int64_t i = r0; i < r1; ++i) t.q8_row(w.data_ptr<uint8_t>(), K, id[i], out.data_ptr<float>() + i * K);
  });
  return out;
}

// ---- elementwise glue -------------------------------------------------------------------------
torch::Tensor add_rms_norm(torch::Tensor& h, const c10::optional<torch::Tensor>& delta, const torch::Tensor& w,
                           double eps) {
  TORCH_CHECK(h.is_contiguous() && h.dim() == 2 && h.scalar_type() == torch::kFloat32, "rms_norm: h [T, D] float32");
  const int64_t D = h.size(1);
  TORCH_CHECK(w.is_contiguous() && w.numel() == D && w.scalar_type() == torch::kFloat32, "rms_norm: weight [D]");
  const float* dl = nullptr;
  if (delta.has_value() && delta->defined()) {
    TORCH_CHECK(delta->is_contiguous() && delta->sizes() == h.sizes() && delta->scalar_type() == torch::kFloat32,
                "rms_norm: delta like h");
    dl = delta->data_ptr<float>();
  }
  const KernelTable& t = table();
  torch::Tensor out = torch::empty_like(h);
  parallel_rows(h.size(0), h.numel(), 0, h.size(0), grain_rows(D), 1, [&](int64_t r0, int64_t r1, int64_t) {
    t.add_rms_norm(h.data_ptr<float>(), dl, w.data_ptr<float>(), out.data_ptr<float>(), D, (float)eps, r0, r1);
  });
  return out;
}

torch::Tensor silu_mul(const torch::Tensor& gu) {
  TORCH_CHECK(gu.is_contiguous() && gu.dim() == 2 && gu.size(1) % 2 == 0 && gu.scalar_type() == torch::kFloat32,
              "silu_mul: [T, 2I] float32");
  const int64_t I = gu.size(1) / 2;
  const KernelTable& t = table();
  torch::Tensor out = torch::empty({gu.size(0), I}, gu.options());
  parallel_rows(gu.size(0), gu.numel(), 0, gu.size(0), grain_rows(2 * I), 1, [&](int64_t r0, int64_t r1, int64_t) {
    t.silu_mul(gu.data_ptr<float>(), out.data_ptr<float>(), I, r0, r1);
  });
  return out;
}

// ---- greedy sampling ---------------------------------------------------------------------------
// torch.argmax(x, dim=-1) over float32 rows, the same answer: the first index of the maximum, or
// of the first NaN in a row holding one (torch ranks NaN above everything). torch's CPU kernel
// compares one element at a time: 1.5 ms for 32 x 49,152 logits, ~1 % of a batch-32 decode step
// (bench/kernels/step_breakdown.py); two 4-lane passes (the maximum, then its first index) take ~0.1 ms.
// SSE2 only (every x86-64), so no ISA dispatch.
int64_t argmax_row(const float* x, int64_t n) {
  const int64_t V = n / 4 * 4;
  __m128 mx = _mm_set1_ps(-INFINITY), nan = _mm_setzero_ps();
  for (int64_t i = 0; i < V; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    mx = _mm_max_ps(v, mx);  // a NaN in v yields mx: NaNs are caught by the unordered compare
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, mx);
  float m = lanes[0];
  for (int j = 1; j < 4; ++j) m = lanes[j] > m ? lanes[j] : m;
  bool any_nan = _mm_movemask_ps(nan) != 0;
  for (int64_t i = V; i < n; ++i) {
    any_nan |= std::isnan(x[i]);
    m = x[i] > m ? x[i] : m;
  }
  if (any_nan) {
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return i;
  }
  const __m128 target = _mm_set1_ps(m);
  for (int64_t i = 0; i < V; i += 4) {
    const int hits = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), target));
    if (hits) return i + __builtin_ctz(hits);
  }
  for (int64_t i = V; i < n; ++i)
    if (x[i] == m) return i;
  return 0;  // a row of -inf only: torch answers 0 as well
}

torch::Tensor argmax_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.stride(1) == 1 &&
                  x.size(1) > 0,
              "argmax_rows: expected [R, V > 0] float32 CPU rows of contiguous values, got ", x.sizes());
  torch::Tensor out = torch::empty({x.size(0)}, torch::kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  const float* base = x.data_ptr<float>();
  for (int64_t r = 0; r < x.size(0); ++r) o[r] = argmax_row(base + r * x.stride(0), x.size(1));
  return out;
}

// Rotates q and k in place inside the fused qkv rows (rotate-half form, the same products and
// sums as the torch path, so bit-identical) and writes this step's k and v into the paged cache.
void rope_and_cache(torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos,
                    const torch::Tensor& sin, const torch::Tensor& slot_mapping, torch::Tensor& k_cache,
                    torch::Tensor& v_cache, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t T = qkv.size(0), D = head_dim, half = D / 2, W = (heads + 2 * kv_heads) * D;
  TORCH_CHECK(qkv.is_contiguous() && qkv.dim() == 2 && qkv.size(1) == W && qkv.scalar_type() == torch::kFloat32,
              "rope_and_cache: qkv [T, (H + 2 KVH) D] float32");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.numel() == T && positions.is_contiguous(),
              "rope_and_cache: positions [T] int64");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.numel() == T && slot_mapping.is_contiguous(),
              "rope_and_cache: slot_mapping [T] int64");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == half &&
                  cos.sizes() == sin.sizes(),
              "rope_and_cache: cos/sin [max_position, D/2]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.size(0) == kv_heads &&
                  k_cache.size(2) == D && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type() &&
                  (k_cache.scalar_type() == torch::kFloat32 || k_cache.scalar_type() == torch::kHalf),
              "rope_and_cache: caches [KVH, slots, D] float32 or float16");
  const int64_t S = k_cache.size(1), maxpos = cos.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < T; ++i) {
    TORCH_CHECK(pos[i] >= 0 && pos[i] < maxpos, "rope_and_cache: position ", pos[i], " out of range");
    TORCH_CHECK(slots[i] >= 0 && slots[i] < S, "rope_and_cache: slot ", slots[i], " out of range");
  }
  float* base = qkv.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  const bool half_kv = k_cache.scalar_type() == torch::kHalf;
  float* kc = half_kv ? nullptr : k_cache.data_ptr<float>();
  float* vc = half_kv ? nullptr : v_cache.data_ptr<float>();
  at::Half* kh16 = half_kv ? k_cache.data_ptr<at::Half>() : nullptr;
  at::Half* vh16 = half_kv ? v_cache.data_ptr<at::Half>() : nullptr;
  parallel_rows(T, T * W, 0, T, 16, 1, [&](int64_t t0, int64_t t1, int64_t) {
    for (int64_t i = t0; i < t1; ++i) {
      float* row = base + i * W;
      const float* c = cs + pos[i] * half;
      const float* s = sn + pos[i] * half;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        float* x = row + h * D;
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = x[j], x2 = x[j + half];
          x[j] = x1 * c[j] - x2 * s[j];
          x[j + half] = x2 * c[j] + x1 * s[j];
        }
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float* k = row + (heads + h) * D;
        const float* v = row + (heads + kv_heads + h) * D;
        if (half_kv) {  // the 16-bit cache: round to nearest even (c10::Half), not exact
          at::Half* kd = kh16 + (h * S + slots[i]) * D;
          at::Half* vd = vh16 + (h * S + slots[i]) * D;
          for (int64_t j = 0; j < D; ++j) {
            kd[j] = at::Half(k[j]);
            vd[j] = at::Half(v[j]);
          }
        } else {
          std::memcpy(kc + (h * S + slots[i]) * D, k, D * sizeof(float));
          std::memcpy(vc + (h * S + slots[i]) * D, v, D * sizeof(float));
        }
      }
    }
  });
}

bool supports_head_dim(int64_t d) {
  return d % kPanel == 0 && d > 0 && (d / kPanel <= 6 || d / kPanel == 8);
}

// out[:B] = attention of q[:B] over each sequence's cached context, read in place through its
// block table. q rows may be strided (the q part of the fused qkv rows).
void paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& block_tables, const torch::Tensor& context_lens, int64_t block_size,
                  int64_t heads, int64_t kv_heads, double scale, int64_t window, torch::Tensor& out) {
  const int64_t B = block_tables.size(0), D = k_cache.size(2);
  TORCH_CHECK(supports_head_dim(D), "paged_decode: unsupported head_dim ", D);
  TORCH_CHECK(q.dim() == 2 && q.size(0) >= B && q.size(1) >= heads * D && q.stride(1) == 1 &&
                  q.scalar_type() == torch::kFloat32,
              "paged_decode: q rows of H*D floats");
  TORCH_CHECK(out.dim() == 2 && out.size(0) >= B && out.size(1) == heads * D && out.is_contiguous() &&
                  out.scalar_type() == torch::kFloat32,
              "paged_decode: out [>=B, H*D] contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(0) == kv_heads && k_cache.scalar_type() == v_cache.scalar_type() &&
                  (k_cache.scalar_type() == torch::kFloat32 || k_cache.scalar_type() == torch::kHalf),
              "paged_decode: caches [KVH, slots, D] float32 or float16");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous() && block_tables.dim() == 2,
              "paged_decode: block_tables [B, max_blocks] int32");
  TORCH_CHECK(context_lens.scalar_type() == torch::kInt32 && context_lens.is_contiguous() && context_lens.numel() == B,
              "paged_decode: context_lens [B] int32");
  TORCH_CHECK(heads % kv_heads == 0, "paged_decode: heads must be a multiple of kv_heads");
  if (B == 0) return;
  const int64_t S = k_cache.size(1), MB = block_tables.size(1);
  const int32_t* tab = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const int64_t G = heads / kv_heads;
  TORCH_CHECK(G <= 16, "paged_decode: at most 16 query heads per KV head");
  std::vector<AttnTask> tasks;
  std::vector<int64_t> chunk_base(B);
  int64_t chunks = 0;
  bool merge = false;
  int64_t work = 0;  // multiply-adds: every context position, for every query head, q.k and p.v
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= MB * block_size, "paged_decode: context length ", lens[b], " out of range");
    const int64_t used = (lens[b] + block_size - 1) / block_size;
    for (int64_t i = 0; i < used; ++i)
      TORCH_CHECK(tab[b * MB + i] >= 0 && (tab[b * MB + i] + 1) * block_size <= S, "paged_decode: bad block id");
    const int64_t n = window > 0 && lens[b] > window ? window : lens[b];
    const int32_t nc = (int32_t)((n + kAttnChunk - 1) / kAttnChunk);
    chunk_base[b] = chunks;
    chunks += nc;
    merge |= nc > 1;
    work += n * heads * D * 2;
    for (int32_t c = 0; c < nc; ++c)
      for (int32_t h = 0; h < kv_heads; ++h) tasks.push_back({(int32_t)b, h, c, nc});
  }
  const KernelTable& t = table();
  const int64_t T = (int64_t)tasks.size();
  torch::Tensor scratch = torch::empty({T * G * kAttnChunk}, torch::kFloat32);
  torch::Tensor partials;
  AttnArgs a{};
  if (merge) {
    partials = torch::empty({chunks * kv_heads * G * (D + 2)}, torch::kFloat32);
    a.partials = partials.data_ptr<float>();
  }
  a.q = q.data_ptr<float>();
  a.q_stride = q.stride(0);
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  a.kv_half = k_cache.scalar_type() == torch::kHalf ? 1 : 0;
  a.num_slots = S;
  a.block_tables = tab;
  a.max_blocks = MB;
  a.context_lens = lens;
  a.block_size = block_size;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = D;
  a.window = window;
  a.scale = (float)scale;
  a.out = out.data_ptr<float>();
  a.tasks = tasks.data();
  a.chunk_base = chunk_base.data();
  a.scratch = scratch.data_ptr<float>();
  parallel_rows(B, work, 0, T, 1, 1, [&](int64_t t0, int64_t t1, int64_t) { t.paged_decode(a, t0, t1); },
                work >= g_attn_split_work.load(std::memory_order_relaxed));
  if (merge)
    parallel_rows(B, chunks * heads * D, 0, B * kv_heads, 1, 1,
                  [&](int64_t p0, int64_t p1, int64_t) { t.attn_merge(a, p0, p1); });
}

// ---- LoRA's per-row low-rank products, then every decoder layer of a step in one call ----------
#include "lora.h"
#include "decoder_stack.h"
#include "greedy_head.h"

}  // namespace
}  // namespace sluice

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace sluice;
  const char* env = std::getenv("SLUICE_KERNEL_ISA");
  g_table = pick(env && *env ? env : "auto");
  m.doc() = "sluice CPU kernels: exact quantized linears, paged decode attention, fused glue";
  // calls of at most this many rows are decode-sized: never on OpenMP (split_call)
  m.attr("DECODE_MAX_ROWS") = py::int_(kAlwaysSplitRows);
  m.def("isa", &isa, "the ISA in use ('none' when the CPU lacks AVX2)");
  m.def("set_isa", &set_isa, "use 'avx2', 'avx512', 'avx512-vnni' or 'auto'; returns the one chosen");
  m.def("available_isas", &available_isas);
  m.def("parallel_team", &parallel_team, "threads one at::parallel_for over n items uses");
  m.def("set_split_cut", &set_split_cut, py::arg("min_rows"), py::arg("min_work"),
        "calls of at most 64 rows split over threads from min_rows rows and min_work multiply-adds; returns the old pair");
  m.def("split_cut", &split_cut, "(min_rows, min_work) of calls of at most 64 rows");
  m.def("set_attn_split_work", &set_attn_split_work, py::arg("work"),
        "decode attention calls of at least this many multiply-adds split over the helper pool; returns the old value");
  m.def("attn_split_work", [] { return g_attn_split_work.load(); }, "see set_attn_split_work");
  m.def("helper_chunks", [] { return helper_pool().helper_chunks(); }, "chunks the helper pool's threads have run");
  m.def("set_helper_spin_us", [](int64_t us) { helper_pool().set_spin_us(us); },
        "how long an idle helper waits for the next call before it sleeps (benchmarks)");
  m.def("set_pool_hot", [](bool hot) { helper_pool().set_hot(hot); }, py::arg("hot"),
        "between True and False (a decode step's forward) idle helpers spin for the next call");
  m.def("pool_rested_calls", [] { return helper_pool().rested_calls(); },
        "calls run serially because the helpers did not get a core (the pool's guard)");
  m.def("set_helpers_away", [](bool away) { helper_pool().set_away(away); }, py::arg("away"),
        "tests: the helpers join no call, as when other work holds every other core");
  m.def("set_pool_guard", [](bool on) { helper_pool().set_guard(on); }, py::arg("on"),
        "tests: the pool's rest-while-helpers-get-no-core guard on (default) or off, reset either way");
  m.def("pool_guard_shape", [] { return std::vector<int64_t>{HelperPool::kWindow, HelperPool::kMinRest, HelperPool::kMaxRest}; },
        "(window, first rest, longest rest) of the guard, in calls");
  m.def("supports_head_dim", &supports_head_dim);
  // The compute entry points run without the GIL (arguments are converted before, the result
  // after): as torch's own ops do. The engine thread spends most of a forward inside them, and a
  // worker's gRPC and asyncio threads need the GIL to send each step's tokens; holding it here
  // made them wait for the interpreter's 5 ms switch interval and then stall the engine while
  // they ran, serially, on a machine whose second core was free (docs/BENCHMARKS.md, "Where a
  // served token's time goes").
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("pack_q4_1", &pack_q4_1, nogil);
  m.def("pack_q8_0", &pack_q8_0, nogil);
  m.def("linear_q4", &linear_q4, py::arg("x"), py::arg("w"), py::arg("n"), py::arg("k"), py::arg("bias"),
        py::arg("fast"), nogil);
  m.def("linear_q8", &linear_q8, py::arg("x"), py::arg("w"), py::arg("n"), py::arg("k"), py::arg("bias"), nogil);
  m.def("linear_q8_argmax", &linear_q8_argmax, py::arg("x"), py::arg("w"), py::arg("n"), py::arg("k"),
        py::arg("bounds"), py::arg("rows"),
        "linear_q8 whose `rows` keep only their argmax: the exact logits where the maximum can be, -inf elsewhere",
        nogil);
  m.def("q8_row_bounds", &q8_row_bounds, py::arg("w"), py::arg("n"), py::arg("k"),
        "per token of a packed Q8_0 matrix, max over its blocks of |d| * sum |q| (linear_q8_argmax's bounds)", nogil);
  m.def("embed_q8", &embed_q8, nogil);
  m.def("add_rms_norm", &add_rms_norm, py::arg("h"), py::arg("delta"), py::arg("w"), py::arg("eps"), nogil);
  m.def("silu_mul", &silu_mul, nogil);
  m.def("argmax_rows", &argmax_rows, "torch.argmax(x, dim=-1) for [R, V] float32 rows", nogil);
  m.def("rope_and_cache", &rope_and_cache, nogil);
  m.def("paged_decode", &paged_decode, nogil);
  py::class_<DecoderStack>(m, "DecoderStack", "every decoder layer of a step in one call (decoder_stack.h)")
      .def(py::init<int64_t, int64_t, int64_t, double, double, int64_t, torch::Tensor, torch::Tensor>(),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("scale"),
           py::arg("window"), py::arg("cos"), py::arg("sin"))
      .def("add_layer", &DecoderStack::add_layer, py::arg("input_norm"), py::arg("post_norm"), py::arg("packed"),
           py::arg("biases"), py::arg("n"), py::arg("k"), py::arg("q4"))
      .def_property_readonly("num_layers", &DecoderStack::num_layers)
      .def("forward", &DecoderStack::forward, py::arg("h"), py::arg("positions"), py::arg("slot_mapping"),
           py::arg("kv_caches"), py::arg("tables"), py::arg("lens"), py::arg("block_size"), py::arg("fast"),
           py::arg("lora") = py::none(), nogil);
  py::class_<LoraAdapter, std::shared_ptr<LoraAdapter>>(m, "LoraAdapter", "one LoRA adapter's weights (lora.h)")
      .def(py::init<int64_t>(), py::arg("layers"))
      .def("set_module", &LoraAdapter::set_module, py::arg("layer"), py::arg("module"), py::arg("at"),
           py::arg("offsets"), py::arg("scales"), py::arg("bts"))
      .def_property_readonly("num_layers", &LoraAdapter::num_layers);
  py::class_<LoraStep, std::shared_ptr<LoraStep>>(m, "LoraStep", "one step's adapters and rows by adapter (lora.h)")
      .def(py::init<std::vector<std::shared_ptr<LoraAdapter>>, torch::Tensor, torch::Tensor, torch::Tensor>(),
           py::arg("adapters"), py::arg("rows"), py::arg("seg_starts"), py::arg("seg_adapter"));
  m.def("lora_apply", &lora_apply, py::arg("y"), py::arg("x"), py::arg("step"), py::arg("layer"), py::arg("module"),
        "y[rows] += each segment's adapter's low-rank product of x (one module of one layer)", nogil);
  m.attr("LORA_ROW_BLOCK") = py::int_(kLoraRowBlock);
}
