// The census program's use of the LibTorch model, behind a header without
// torch (main.cc compiles without LibTorch's headers; torch_program.cc has
// them, or a stand-in when the build has no LibTorch).
#ifndef CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
#define CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_

#include <capstan/training.h>

#include <cstdint>

namespace census {

// Whether this program was built with LibTorch (CAPSTAN_TORCH).
bool torch_available();
// Creates the LibTorch Wide & Deep model's variables on the parameter
// servers (torch_model.h: ps_options), its initial values from `seed`.
capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, double wide_learning_rate,
                                       double deep_learning_rate, uint64_t seed);

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_TORCH_PROGRAM_H_
