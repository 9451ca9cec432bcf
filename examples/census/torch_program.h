// The census program's use of the LibTorch model, behind a header without
// torch: torch_program.cc loads libcensus_torch_program.so at run time.
#ifndef CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
#define CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_

#include <capstan/training.h>

#include <cstdint>
#include <string>

namespace census {

// Whether the LibTorch part loads (built with CAPSTAN_TORCH, and LibTorch
// installed where this runs); if not, why.
bool torch_available();
std::string torch_unavailable_reason();
// Creates the LibTorch Wide & Deep model's variables on the parameter
// servers (torch_model.h: ps_options), its initial values from `seed`.
capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, double wide_learning_rate,
                                       double deep_learning_rate, uint64_t seed);

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
