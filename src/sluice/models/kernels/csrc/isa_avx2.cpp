// The kernels for AVX2 + FMA + F16C; built with those -m flags only in this translation unit.
#define SLUICE_ISA_NS sluice_avx2
#define SLUICE_ISA_NAME "avx2"
#include "simd_avx2.h"
#include "kernels_impl.h"

namespace sluice {
const KernelTable* avx2_table() { return &sluice_avx2::kTable; }
}  // namespace sluice
