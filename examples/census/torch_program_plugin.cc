// libcensus_torch_program.so: what the census program needs of LibTorch
// (torch_program.cc loads it), the model's variables on the parameter
// servers.
#include <capstan/torch.h>

#include <string>

#include "torch_model.h"

extern "C" __attribute__((visibility("default"))) int census_create_torch_variables(
    capstan::ClusterCoordinator* cluster, double wide_learning_rate, double deep_learning_rate, uint64_t seed,
    std::string* error) {
  torch::manual_seed(seed);
  census::WideDeep model(seed);
  capstan::Status status =
      capstan::torch::create_variables(*cluster, *model, census::ps_options(wide_learning_rate, deep_learning_rate))
          .status();
  if (!status.ok()) *error = status.to_string();
  return status.ok() ? 0 : 1;
}
