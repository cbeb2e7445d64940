// Every decoder layer of a step in one extension call: the same ops, in the same order, on the
// same tensors as models/kernels/fused_forward.py's loop over layers, so the same bits.
//
// Why: that loop makes ~9 calls per layer (~270 for the bundled model's 30 layers). Each costs
// the interpreter's dispatch, pybind's argument conversion, and a release and re-acquire of the
// GIL, which a worker's gRPC and asyncio threads also want (docs/BENCHMARKS.md, "Where a served
// token's time goes"). Here the layers' weights are bound once at load and a step passes only
// what changes per step: one stream's step took 0.957x the loop's time (bench/kernels/decoder_stack.py,
// docs/BENCHMARKS.md "Every layer in one extension call").
//
// Included by ops.cpp inside its namespace, after the ops it calls (linear_q4, linear_q8,
// add_rms_norm, silu_mul, rope_and_cache, paged_decode, and lora_apply after each linear when the
// step has LoRA rows): it adds no op of its own.

struct StackLinear {
  torch::Tensor packed;
  c10::optional<torch::Tensor> bias;
  int64_t n = 0, k = 0;
  bool q4 = false;  // Q4_1 blocks (linear_q4, which has the int8 fast variant), else Q8_0

  torch::Tensor operator()(const torch::Tensor& x, bool fast) const {
    return q4 ? linear_q4(x, packed, n, k, bias, fast) : linear_q8(x, packed, n, k, bias);
  }
};

struct StackLayer {
  torch::Tensor input_norm, post_norm;
  StackLinear qkv, o, gate_up, down;
};

class DecoderStack {
 public:
  DecoderStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale, int64_t window,
               torch::Tensor cos, torch::Tensor sin)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps), scale_(scale), window_(window),
        cos_(std::move(cos)), sin_(std::move(sin)) {
    TORCH_CHECK(supports_head_dim(head_dim), "DecoderStack: unsupported head_dim ", head_dim);
  }

  // linears: qkv, o, gate_up, down, each (packed blocks, bias or None, out features, in
  // features, Q4_1?), in that order.
  void add_layer(torch::Tensor input_norm, torch::Tensor post_norm, const std::vector<torch::Tensor>& packed,
                 const std::vector<c10::optional<torch::Tensor>>& biases, const std::vector<int64_t>& n,
                 const std::vector<int64_t>& k, const std::vector<bool>& q4) {
    TORCH_CHECK(packed.size() == 4 && biases.size() == 4 && n.size() == 4 && k.size() == 4 && q4.size() == 4,
                "DecoderStack.add_layer: four linears (qkv, o, gate_up, down)");
    const int64_t D = input_norm.numel();
    const int64_t expect_in[4] = {D, heads_ * head_dim_, D, n[2] / 2};
    StackLinear lin[4];
    for (int i = 0; i < 4; ++i) {
      check_packed(packed[i], n[i], k[i], q4[i] ? kQ4PanelBlockBytes : kQ8PanelBlockBytes);
      TORCH_CHECK(k[i] == expect_in[i], "DecoderStack.add_layer: linear ", i, " takes ", k[i], " inputs, expected ",
                  expect_in[i]);
      lin[i] = StackLinear{packed[i], biases[i], n[i], k[i], q4[i]};
    }
    TORCH_CHECK(n[0] == (heads_ + 2 * kv_heads_) * head_dim_ && n[1] == D && n[3] == D,
                "DecoderStack.add_layer: linear shapes do not match the model's");
    layers_.push_back(StackLayer{std::move(input_norm), std::move(post_norm), lin[0], lin[1], lin[2], lin[3]});
  }

  int64_t num_layers() const { return (int64_t)layers_.size(); }

  // h [T, D] (updated in place by the residual adds, as the loop does); the attention of every
  // row through one paged_decode call: `tables` / `lens` are the step's decode block tables and
  // context lengths, or the decode-and-short-prefill ones KernelPagedAttention.prepare derives.
  // Returns the last layer's down output (the residual not yet added).
  torch::Tensor forward(torch::Tensor& h, const torch::Tensor& positions, const torch::Tensor& slot_mapping,
                        const std::vector<std::pair<torch::Tensor, torch::Tensor>>& kv_caches,
                        const torch::Tensor& tables, const torch::Tensor& lens, int64_t block_size, bool fast,
                        const std::shared_ptr<LoraStep>& lora) {
    TORCH_CHECK(kv_caches.size() == layers_.size(), "DecoderStack.forward: ", kv_caches.size(), " caches for ",
                layers_.size(), " layers");
    TORCH_CHECK(tables.size(0) == h.size(0), "DecoderStack.forward: attention tables for ", tables.size(0),
                " rows, the step has ", h.size(0));
    const int64_t T = h.size(0);
    c10::optional<torch::Tensor> delta;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const StackLayer& l = layers_[i];
      torch::Tensor k_cache = kv_caches[i].first, v_cache = kv_caches[i].second;
      const int64_t li = (int64_t)i;
      torch::Tensor x = add_rms_norm(h, delta, l.input_norm, eps_);
      torch::Tensor qkv = l.qkv(x, fast);
      if (lora) lora_apply(qkv, x, *lora, li, 0);
      rope_and_cache(qkv, positions, cos_, sin_, slot_mapping, k_cache, v_cache, heads_, kv_heads_, head_dim_);
      torch::Tensor attn = torch::empty({T, heads_ * head_dim_}, torch::kFloat32);
      paged_decode(qkv, k_cache, v_cache, tables, lens, block_size, heads_, kv_heads_, scale_, window_, attn);
      torch::Tensor o = l.o(attn, fast);
      if (lora) lora_apply(o, attn, *lora, li, 1);
      x = add_rms_norm(h, o, l.post_norm, eps_);
      torch::Tensor gate_up = l.gate_up(x, fast);
      if (lora) lora_apply(gate_up, x, *lora, li, 2);
      torch::Tensor act = silu_mul(gate_up);
      torch::Tensor down = l.down(act, fast);
      if (lora) lora_apply(down, act, *lora, li, 3);
      delta = down;
    }
    TORCH_CHECK(delta.has_value(), "DecoderStack.forward: no layers");
    return *delta;
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
  int64_t window_;
  torch::Tensor cos_, sin_;
  std::vector<StackLayer> layers_;
};
