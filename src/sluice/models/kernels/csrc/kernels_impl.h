// Every kernel of one ISA translation unit (isa_avx2.cpp, isa_avx512.cpp), over the 16-lane
// vector operations of the simd header that the unit includes first:
//   gemm_impl.h       exact and int8 linears over the packed GGUF blocks, activation quantization
//   glue_impl.h       exp, RMSNorm (+ residual add), SiLU x mul
//   greedy_head_impl.h  the greedy LM head's filter: int8 activations, approximate logits, candidates
//   attention_impl.h  paged decode attention and its chunk merge
//   lora_impl.h       LoRA's low-rank products (shrink x·Aᵀ, expand ·Bᵀ) for rows of one adapter
// and the unit's table of entry points (isa.h).
#pragma once
#include "isa_names.h"
#include "attention_impl.h"
#include "gemm_impl.h"
#include "glue_impl.h"
#include "greedy_head_impl.h"
#include "lora_impl.h"

namespace SLUICE_ISA_NS {
namespace {  // internal linkage: nothing here may merge with another TU's code

static const sluice::KernelTable kTable = {
    SLUICE_ISA_NAME, kGemmPanelsFor[1] * kPanel, kDirectMaxM, &q4_exact, &q4_fast, &q8_exact, &quantize_q8, &q8_row,
    &add_rms_norm,   &silu_mul, &paged_decode, &attn_merge, &quantize_rows_i8, kApproxScratchPerK, &q8_approx, &head_select, &q8_dot,
    &lora_rows,
};

}  // namespace
}  // namespace SLUICE_ISA_NS
