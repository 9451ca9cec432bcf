#include "census/torch_program.h"

#ifdef CAPSTAN_CENSUS_TORCH
#include "census/torch_model.h"
#endif

namespace census {

#ifdef CAPSTAN_CENSUS_TORCH
bool torch_available() { return true; }

capstan::Status create_torch_variables(capstan::ClusterCoordinator& cluster, double wide_learning_rate,
                                       double deep_learning_rate, uint64_t seed) {
  torch::manual_seed(seed);
  WideDeep model(seed);
  return capstan::torch::create_variables(cluster, *model, ps_options(wide_learning_rate, deep_learning_rate))
      .status();
}
#else
bool torch_available() { return false; }

capstan::Status create_torch_variables(capstan::ClusterCoordinator&, double, double, uint64_t) {
  return capstan::Status::FailedPrecondition("this census program was built without LibTorch (CAPSTAN_TORCH=OFF)");
}
#endif

}  // namespace census
