// The LM head for rows that only need their argmax (greedy decoding with nothing else asking for
// the row's logits): the exact argmax at a fraction of the exact head's cost.
//
// The exact Q8_0 head computes K_n = x . w[n] for every token n in fp32 (~17 % of a 32-row decode
// step of the bundled model). Its weights are already integers, w[n][k] = d[n][b] * q[n][k]; with
// the row's activations rounded to 8 bits per 32-block b (x[k] ~ s_b * xq[k], |xq| <= 127), the
// approximation A_n = sum_b d[n][b] s_b sum_k q[n][k] xq[k] is an integer dot product, which
// vpmaddubsw / vpdpbusd run at twice the rate of fp32 fmas, with no dequantization. Then
//   |A_n - K_n| <= E_n = 0.52 * W_n * S,   W_n = max_b |d[n][b]| sum_k |q[n][k]|,   S = sum_b s_b.
// Why 0.52: |s_b xq[k] - x[k]| <= s_b (0.5 + 2.3e-5) (x times the rounded 1 / s_b, rounded to an
// integer), so the rounding of the activations moves A_n by at most sum_b |d[n][b]| sum_k |q[n][k]|
// s_b * 0.50003 <= 0.50003 W_n S. The fp32 arithmetic adds less than 0.0013 W_n S (sum_k |w x| <=
// 127 W_n S): the exact kernel's chains of at most 128 fmas plus 5 chunk sums err by at most
// ~133 * 2^-24 of sum_k |w x| (1.0e-3 W_n S); the approximation's block terms, three roundings each
// and 18 of them summed, by ~21 * 2^-24 of it (1.6e-4 W_n S); the comparisons below by 2^-23 of
// |A_n| + E_n <= 128 W_n S (1.5e-5 W_n S). 0.52 leaves 0.018 W_n S to spare.
// So with L = max_n (A_n - E_n), attained at some m: every n with A_n + E_n < L has
//   K_n <= A_n + E_n < L <= A_m - E_m <= K_m,
// strictly below a candidate's exact logit. The argmax over the candidates' exact logits (first
// index among equals, NaN highest: what argmax_rows does over a full row) is therefore the argmax
// over all N. The candidates' exact logits come from q8_dot, the same chain as q8_exact's, so the
// same bits. On the bundled model a row has a median of a few candidates of 49,152;
// a row with more than kHeadCandidateCap, or with a block the activations' rounding cannot bound
// (non-finite, or a scale that underflows), is computed in full.
//
// The result keeps the head's shape: an argmax row holds its candidates' exact logits and -inf
// elsewhere, so the sampler's argmax gives the same token as over the full row; every other row
// is the exact head's. Included by ops.cpp inside its namespace, after linear_q8.

constexpr int64_t kHeadCandidateCap = 1024;
constexpr double kHeadBoundFactor = 0.52;

// Per token n: max over its blocks of |d| * sum |q|, rounded up to a float (+inf when a scale is
// not finite: every row then computes that head in full).
torch::Tensor q8_row_bounds(const torch::Tensor& w, int64_t N, int64_t K) {
  check_packed(w, N, K, kQ8PanelBlockBytes);
  const int64_t KB = K / kBlock;
  torch::Tensor out = torch::empty({N}, torch::kFloat32);
  const uint8_t* base = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t j = n % kPanel;
    const uint8_t* panel = base + (n / kPanel) * KB * kQ8PanelBlockBytes;
    double best = 0.0;
    for (int64_t kb = 0; kb < KB; ++kb) {
      const uint8_t* blk = panel + kb * kQ8PanelBlockBytes;
      uint16_t bits;
      std::memcpy(&bits, blk + 2 * j, 2);
      const double d = std::fabs((double)static_cast<float>(c10::Half(bits, c10::Half::from_bits())));
      int64_t sum = 0;
      for (int k = 0; k < kBlock; ++k) sum += std::abs((int)(int8_t)blk[32 + k * kPanel + j]);
      const double v = d * (double)sum;  // exact: an 11-bit d times a sum below 2^13
      best = std::isfinite(v) ? std::max(best, v) : INFINITY;
    }
    float f = (float)best;
    if ((double)f < best) f = std::nextafter(f, INFINITY);
    o[n] = f;
  }
  return out;
}

// x [M, K] rows; rows: the indices of the rows that need only their argmax; bounds: q8_row_bounds.
torch::Tensor linear_q8_argmax(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K,
                               const torch::Tensor& bounds, const torch::Tensor& rows) {
  check_rows(x, K, "linear_q8_argmax input");
  check_packed(w, N, K, kQ8PanelBlockBytes);
  TORCH_CHECK(bounds.scalar_type() == torch::kFloat32 && bounds.is_contiguous() && bounds.numel() == N,
              "linear_q8_argmax: bounds [N] float32");
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && rows.dim() == 1 && rows.is_contiguous(),
              "linear_q8_argmax: rows [R] int64");
  const KernelTable& t = table();
  const int64_t M = x.size(0), KB = K / kBlock;
  std::vector<char> pick(M, 0);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t r = rows.data_ptr<int64_t>()[i];
    TORCH_CHECK(r >= 0 && r < M, "linear_q8_argmax: row ", r, " out of range");
    pick[r] = 1;
  }
  std::vector<int64_t> greedy_rows, full_rows;
  for (int64_t r = 0; r < M; ++r) (pick[r] ? greedy_rows : full_rows).push_back(r);
  const c10::optional<torch::Tensor> no_bias;
  if (greedy_rows.empty()) return linear_q8(x, w, N, K, no_bias);
  torch::Tensor y = torch::empty({M, N}, x.options());
  // rows moved with memcpy, not index_select / index_copy_: no ATen op that might open an OpenMP
  // region in a decode step (fused_forward.py says why)
  auto gather = [&](const std::vector<int64_t>& which) {
    torch::Tensor out = torch::empty({(int64_t)which.size(), K}, x.options());
    for (size_t i = 0; i < which.size(); ++i)
      std::memcpy(out.data_ptr<float>() + i * K, x.data_ptr<float>() + which[i] * x.stride(0), K * sizeof(float));
    return out;
  };
  auto scatter = [&](const std::vector<int64_t>& which, const torch::Tensor& src) {
    for (size_t i = 0; i < which.size(); ++i)
      std::memcpy(y.data_ptr<float>() + which[i] * N, src.data_ptr<float>() + i * N, N * sizeof(float));
  };
  if (!full_rows.empty()) scatter(full_rows, linear_q8(gather(full_rows), w, N, K, no_bias));  // the others exact
  const int64_t R = (int64_t)greedy_rows.size();
  const bool all = R == M;
  const torch::Tensor xa = all ? x : gather(greedy_rows);
  torch::Tensor ya = all ? y : torch::empty({R, N}, x.options());  // the approximation, then the rows
  torch::Tensor xq = torch::empty({R, K}, torch::kInt8);
  torch::Tensor xd = torch::empty({R, KB}, torch::kFloat32);
  parallel_rows(R, R * K, 0, R, grain_rows(K), 1, [&](int64_t r0, int64_t r1, int64_t) {
    t.quantize_rows_i8(xa.data_ptr<float>(), xa.stride(0), K, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), r0, r1);
  });
  GemmArgs a = gemm_args(xa, w, ya, N, K, no_bias);
  a.xq = xq.data_ptr<int8_t>();
  a.xd = xd.data_ptr<float>();
  run_panels(a, t.q8_approx, t.approx_scratch_per_k, /*direct_max_m=*/-1);  // a scratch at any M
  const float* wt = bounds.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  parallel_rows(R, R * N, 0, R, 1, 1, [&](int64_t r0, int64_t r1, int64_t) {
    std::vector<int32_t> cand(kHeadCandidateCap);
    std::vector<float> vals(kHeadCandidateCap);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xa.data_ptr<float>() + r * xa.stride(0);
      float* yr = ya.data_ptr<float>() + r * ya.stride(0);
      double S = 0.0;
      for (int64_t b = 0; b < KB; ++b) S += xd.data_ptr<float>()[r * KB + b];
      const int64_t count = std::isfinite(S) ? t.head_select(yr, wt, (float)(kHeadBoundFactor * S), N, cand.data(),
                                                             kHeadCandidateCap)
                                             : -1;
      if (count < 0) {  // in full: the exact kernel on this one row
        GemmArgs one = gemm_args(xa, w, ya, N, K, no_bias);
        one.M = 1;
        one.x = xr;
        one.y = yr;
        t.q8_exact(one, 0, panels_of(N), nullptr);  // one row: the direct path, no scratch
        continue;
      }
      for (int64_t i = 0; i < count; ++i) vals[i] = t.q8_dot(wp, K, cand[i], xr);
      std::fill(yr, yr + N, -INFINITY);
      for (int64_t i = 0; i < count; ++i) yr[cand[i]] = vals[i];
    }
  }, /*pool=*/true);
  if (!all) scatter(greedy_rows, ya);
  return y;
}
