// LoRA on the kernel path, the torch-facing half (the products are lora_impl.h's):
//   LoraAdapter  one adapter's weights, bound once when it is loaded: per (layer, module) Aᵀ
//                [K, R] and its parts (output columns, rank slice, scale, Bᵀ [r, out])
//   LoraStep     one step's adapters and its rows grouped by adapter (segments of row indices:
//                S-LoRA / Punica's layout), built once per step by models/lora/batch.py
//   lora_apply   y[rows of each segment] += that adapter's low-rank product of x, for one
//                module of one layer: what the decoder stack and the Python loop call after
//                each base linear (the base product is shared by every row)
//
// Included by ops.cpp inside its namespace, after parallel_rows and table().

constexpr int64_t kLoraModules = 4;  // qkv, o, gate_up, down (models/lora/weights.py MODULES)

struct LoraModule {
  torch::Tensor at;
  int64_t K = 0, R = 0;
  std::vector<torch::Tensor> bts;
  std::vector<LoraPartArgs> parts;  // bt pointers into bts
};

class LoraAdapter {
 public:
  explicit LoraAdapter(int64_t layers) : layers_(layers), mods_(layers * kLoraModules) {
    TORCH_CHECK(layers >= 1, "LoraAdapter: at least one layer");
  }

  // offsets: per part (out_off, out_len, r_off, r_len); scales and bts: per part
  void set_module(int64_t layer, int64_t module, torch::Tensor at, const std::vector<int64_t>& offsets,
                  const std::vector<double>& scales, const std::vector<torch::Tensor>& bts) {
    TORCH_CHECK(layer >= 0 && layer < layers_ && module >= 0 && module < kLoraModules, "LoraAdapter: bad slot");
    TORCH_CHECK(at.scalar_type() == torch::kFloat32 && at.is_contiguous() && at.dim() == 2 && at.size(1) % 16 == 0,
                "LoraAdapter: A^T [K, R] float32 contiguous with R a multiple of 16");
    const size_t n = bts.size();
    TORCH_CHECK(n >= 1 && scales.size() == n && offsets.size() == 4 * n, "LoraAdapter: 4 offsets and a scale per part");
    LoraModule m;
    m.K = at.size(0);
    m.R = at.size(1);
    m.at = std::move(at);
    m.bts = bts;
    for (size_t p = 0; p < n; ++p) {
      const torch::Tensor& bt = m.bts[p];
      const int64_t out_off = offsets[4 * p], out_len = offsets[4 * p + 1], r_off = offsets[4 * p + 2],
                    r_len = offsets[4 * p + 3];
      TORCH_CHECK(bt.scalar_type() == torch::kFloat32 && bt.is_contiguous() && bt.dim() == 2 &&
                      bt.size(0) == r_len && bt.size(1) == out_len,
                  "LoraAdapter: B^T [r, out] float32 contiguous per part");
      TORCH_CHECK(out_off >= 0 && out_len >= 1 && r_off >= 0 && r_len >= 1 && r_off + r_len <= m.R,
                  "LoraAdapter: a part's offsets are out of range");
      m.parts.push_back({bt.data_ptr<float>(), out_off, out_len, r_off, r_len, (float)scales[p]});
    }
    mods_[layer * kLoraModules + module] = std::move(m);
  }

  const LoraModule* module(int64_t layer, int64_t module) const {
    const LoraModule& m = mods_[layer * kLoraModules + module];
    return m.R ? &m : nullptr;
  }

  int64_t num_layers() const { return layers_; }

 private:
  int64_t layers_;
  std::vector<LoraModule> mods_;
};

class LoraStep {
 public:
  // rows: the step's rows that have an adapter, grouped by adapter; seg_starts [S + 1] into rows;
  // seg_adapter [S]: each segment's index into adapters
  LoraStep(std::vector<std::shared_ptr<LoraAdapter>> adapters, torch::Tensor rows, torch::Tensor seg_starts,
           torch::Tensor seg_adapter)
      : adapters_(std::move(adapters)), rows_(std::move(rows)) {
    TORCH_CHECK(rows_.scalar_type() == torch::kInt32 && rows_.is_contiguous() && rows_.dim() == 1,
                "LoraStep: rows [n] int32");
    TORCH_CHECK(seg_starts.scalar_type() == torch::kInt64 && seg_adapter.scalar_type() == torch::kInt64 &&
                    seg_starts.numel() == seg_adapter.numel() + 1,
                "LoraStep: seg_starts [S + 1] and seg_adapter [S] int64");
    const int64_t* st = seg_starts.data_ptr<int64_t>();
    const int64_t* ad = seg_adapter.data_ptr<int64_t>();
    const int32_t* r = rows_.data_ptr<int32_t>();
    for (int64_t s = 0; s < seg_adapter.numel(); ++s) {
      TORCH_CHECK(ad[s] >= 0 && ad[s] < (int64_t)adapters_.size() && adapters_[ad[s]], "LoraStep: bad adapter index");
      TORCH_CHECK(st[s] >= 0 && st[s] <= st[s + 1] && st[s + 1] <= rows_.numel(), "LoraStep: bad segment");
      // blocks of at most kLoraRowBlock rows of one adapter: the unit of work of lora_apply
      for (int64_t b = st[s]; b < st[s + 1]; b += kLoraRowBlock)
        tasks_.push_back({ad[s], b, std::min(st[s + 1], b + kLoraRowBlock)});
    }
    for (int64_t i = 0; i < rows_.numel(); ++i) {
      TORCH_CHECK(r[i] >= 0, "LoraStep: negative row");
      max_row_ = std::max<int64_t>(max_row_, r[i]);
    }
  }

  struct Task {
    int64_t adapter, begin, end;
  };

  const std::vector<Task>& tasks() const { return tasks_; }
  const LoraAdapter& adapter(int64_t i) const { return *adapters_[i]; }
  const int32_t* rows() const { return rows_.data_ptr<int32_t>(); }
  int64_t num_rows() const { return rows_.numel(); }
  int64_t max_row() const { return max_row_; }

 private:
  std::vector<std::shared_ptr<LoraAdapter>> adapters_;
  torch::Tensor rows_;
  std::vector<Task> tasks_;
  int64_t max_row_ = -1;
};

// y [T, N] += each adapter's product for its rows of x [T, K] (one module of one layer)
void lora_apply(torch::Tensor& y, const torch::Tensor& x, const LoraStep& step, int64_t layer, int64_t module) {
  TORCH_CHECK(module >= 0 && module < kLoraModules, "lora_apply: bad module");
  const auto& tasks = step.tasks();
  if (tasks.empty()) return;
  TORCH_CHECK(y.scalar_type() == torch::kFloat32 && y.dim() == 2 && y.stride(1) == 1, "lora_apply: y [T, N] float32");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.stride(1) == 1 && x.size(0) == y.size(0),
              "lora_apply: x [T, K] float32 with y's rows");
  TORCH_CHECK(step.max_row() < y.size(0), "lora_apply: a row index is past the step's rows");
  const KernelTable& t = table();
  int64_t max_r = 0, work = 0;
  for (const auto& task : tasks) {
    const LoraAdapter& ad = step.adapter(task.adapter);
    TORCH_CHECK(layer >= 0 && layer < ad.num_layers(), "lora_apply: the adapter has no layer ", layer);
    const LoraModule* m = ad.module(layer, module);
    if (m == nullptr) continue;
    TORCH_CHECK(m->K == x.size(1), "lora_apply: the adapter's A takes ", m->K, " inputs, x has ", x.size(1));
    for (const auto& p : m->parts)
      TORCH_CHECK(p.out_off + p.out_len <= y.size(1), "lora_apply: a part is past y's columns");
    max_r = std::max(max_r, m->R);
    work += (task.end - task.begin) * m->R * (m->K + y.size(1));
  }
  if (max_r == 0) return;  // no adapter of the step targets this module
  torch::Tensor scratch = torch::empty({(int64_t)tasks.size() * kLoraRowBlock * max_r}, torch::kFloat32);
  float* base = scratch.data_ptr<float>();
  parallel_rows(step.num_rows(), work, 0, (int64_t)tasks.size(), 1, 1, [&](int64_t t0, int64_t t1, int64_t) {
    for (int64_t i = t0; i < t1; ++i) {
      const auto& task = tasks[i];
      const LoraModule* m = step.adapter(task.adapter).module(layer, module);
      if (m == nullptr) continue;
      LoraArgs a{};
      a.x = x.data_ptr<float>();
      a.ldx = x.stride(0);
      a.y = y.data_ptr<float>();
      a.ldy = y.stride(0);
      a.rows = step.rows() + task.begin;
      a.m = task.end - task.begin;
      a.at = m->at.data_ptr<float>();
      a.K = m->K;
      a.R = m->R;
      a.t = base + i * kLoraRowBlock * max_r;
      a.parts = m->parts.data();
      a.nparts = (int64_t)m->parts.size();
      t.lora_rows(a);
    }
  });
}
