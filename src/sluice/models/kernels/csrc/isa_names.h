// The shared names of sluice:: that every kernel header of one ISA translation unit uses,
// brought into that unit's namespace (SLUICE_ISA_NS, set by isa_avx2.cpp / isa_avx512.cpp) once.
#pragma once
#include "isa.h"

namespace SLUICE_ISA_NS {
using sluice::AttnArgs;
using sluice::GemmArgs;
using sluice::kBlock;
using sluice::kPanel;
using sluice::kQ4PanelBlockBytes;
using sluice::kQ8PanelBlockBytes;
}  // namespace SLUICE_ISA_NS
