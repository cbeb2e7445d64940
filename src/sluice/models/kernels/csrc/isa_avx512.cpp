// The kernels for AVX-512 (F, BW, DQ, VL), built twice by build.py: with -mavx512vnni (the
// int8 kernel then uses vpdpbusd) and without it (vpmaddubsw), for CPUs that lack VNNI. The
// -m flags apply to this translation unit only.
#if defined(__AVX512VNNI__)
#define SLUICE_ISA_NS sluice_avx512vnni
#define SLUICE_ISA_NAME "avx512-vnni"
#else
#define SLUICE_ISA_NS sluice_avx512
#define SLUICE_ISA_NAME "avx512"
#endif
#include "simd_avx512.h"
#include "kernels_impl.h"

namespace sluice {
#if defined(__AVX512VNNI__)
const KernelTable* avx512vnni_table() { return &sluice_avx512vnni::kTable; }
#else
const KernelTable* avx512_table() { return &sluice_avx512::kTable; }
#endif
}  // namespace sluice
