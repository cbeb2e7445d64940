// Paged decode attention micro-benchmark: two builds of the kernel (before / after a change) and a
// plain read of the same K/V rows (the memory floor), interleaved in one process, timed in this
// thread's CPU time so other processes' load on the shared machine counts as little as it can.
// Built and run by bench/kernels/decode_attention_micro.py (which compiles each side's kernels into its
// own namespace); arguments: context, repetitions, layers (distinct caches, so K/V come from
// memory as in a forward), scatter (1: a sequence's blocks contiguous, as a fresh engine hands
// them out; 4: spread at random over a 4x larger pool).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <immintrin.h>
#include <map>
#include <random>
#include <string>
#include <time.h>
#include <vector>

#include "isa.h"

static double tcpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

namespace sluice {
const KernelTable* table_before();
const KernelTable* table_after();

// the rows one task's attention reads (K, then V), summed: the memory floor
static void stream_rows(const AttnArgs& a, int64_t t0, int64_t t1, float* sink) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = t0; i < t1; ++i) {
    const AttnTask task = a.tasks[i];
    const int64_t D = a.head_dim, len = a.context_lens[task.b];
    const int64_t start = task.chunk * kAttnChunk, n = std::min<int64_t>(kAttnChunk, len - start);
    const float* kb = (const float*)a.k_cache + task.kv_head * a.num_slots * D;
    const float* vb = (const float*)a.v_cache + task.kv_head * a.num_slots * D;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = start + t;
        const float* r = (pass ? vb : kb) + ((int64_t)a.block_tables[pos / a.block_size] * a.block_size + pos % a.block_size) * D;
        for (int j = 0; j < D; j += 16) acc = _mm256_add_ps(acc, _mm256_add_ps(_mm256_loadu_ps(r + j), _mm256_loadu_ps(r + j + 8)));
      }
  }
  float o[8];
  _mm256_storeu_ps(o, acc);
  *sink += o[0];
}
}  // namespace sluice

using namespace sluice;

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s CONTEXT REPS LAYERS SCATTER\n", argv[0]);
    return 2;
  }
  const int ctx = atoi(argv[1]), reps = atoi(argv[2]), L = atoi(argv[3]), SC = atoi(argv[4]);
  const int H = 9, KVH = 3, D = 64, BS = 8;  // the bundled model's attention
  const int nb = (ctx + BS - 1) / BS, S = (SC * nb + 1) * BS;
  std::vector<float> k((size_t)L * KVH * S * D), v((size_t)L * KVH * S * D), q((H + 2 * KVH) * D), out(H * D);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> tab(nb), all(SC * nb);
  for (int i = 0; i < SC * nb; ++i) all[i] = i + 1;
  if (SC > 1) std::shuffle(all.begin(), all.end(), rng);
  std::copy(all.begin(), all.begin() + nb, tab.begin());
  int32_t len = ctx;
  int64_t chunk_base = 0;
  const int nc = (ctx + kAttnChunk - 1) / kAttnChunk;
  std::vector<AttnTask> tasks;
  for (int c = 0; c < nc; ++c)
    for (int h = 0; h < KVH; ++h) tasks.push_back({0, h, c, nc});
  std::vector<float> scratch(tasks.size() * (H / KVH) * kAttnChunk), partials(nc * KVH * (H / KVH) * (D + 2));
  AttnArgs a{};
  a.q = q.data();
  a.q_stride = (H + 2 * KVH) * D;
  a.num_slots = S;
  a.block_tables = tab.data();
  a.max_blocks = nb;
  a.context_lens = &len;
  a.block_size = BS;
  a.heads = H;
  a.kv_heads = KVH;
  a.head_dim = D;
  a.scale = 0.125f;
  a.out = out.data();
  a.tasks = tasks.data();
  a.chunk_base = &chunk_base;
  a.scratch = scratch.data();
  a.partials = partials.data();
  const std::vector<std::pair<std::string, const KernelTable*>> sides = {
      {"before", table_before()}, {"after", table_after()}, {"read", nullptr}};
  std::map<std::string, std::vector<double>> res;
  float sink = 0;
  for (int r = 0; r < 15; ++r)
    for (size_t j = 0; j < sides.size(); ++j) {
      const auto& [name, t] = sides[(j + r) % sides.size()];  // the lead rotates every round
      const double t0 = tcpu();
      for (int i = 0; i < reps; ++i)
        for (int l = 0; l < L; ++l) {
          a.k_cache = k.data() + (size_t)l * KVH * S * D;
          a.v_cache = v.data() + (size_t)l * KVH * S * D;
          if (!t) {
            stream_rows(a, 0, tasks.size(), &sink);
            continue;
          }
          t->paged_decode(a, 0, tasks.size());
          if (nc > 1) t->attn_merge(a, 0, KVH);
        }
      res[name].push_back((tcpu() - t0) / reps / L * 1e6);
    }
  printf("{\"context\": %d, \"layers\": %d, \"scatter\": %d, \"sink\": %g", ctx, L, SC, sink * 0);
  for (auto& [name, xs] : res) {
    std::sort(xs.begin(), xs.end());
    printf(", \"%s_us_p25\": %.2f, \"%s_us_median\": %.2f", name.c_str(), xs[xs.size() / 4], name.c_str(), xs[xs.size() / 2]);
  }
  printf("}\n");
}
