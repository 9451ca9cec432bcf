// What the census modules' closures share (module.cc: the Eigen model;
// torch_module.cc: the LibTorch one): checking a batch from the pipeline and
// running a model over a whole file for evaluation.
#ifndef CAPSTAN_EXAMPLES_CENSUS_CLOSURES_H_
#define CAPSTAN_EXAMPLES_CENSUS_CLOSURES_H_

#include <capstan/closure.h>
#include <capstan/data/dataset.h>
#include <capstan/functions.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "features.h"

namespace census {

// Checks a batch from the pipeline: (wide_ids int64[n, 15], numeric
// float32[n, 5], label float32[n]); returns n.
inline capstan::Result<int64_t> check_batch(const capstan::Element& batch) {
  using capstan::DType;
  using capstan::Status;
  if (batch.size() != 3) return Status::InvalidArgument("a census batch is (wide_ids, numeric, label)");
  const capstan::Tensor& ids = batch.components[0];
  const capstan::Tensor& numeric = batch.components[1];
  const capstan::Tensor& labels = batch.components[2];
  if (ids.dtype() != DType::kInt64 || ids.rank() != 2 || ids.shape()[1] != kNumWideFields || ids.shape()[0] == 0) {
    return Status::InvalidArgument("wide_ids must be int64[n, " + std::to_string(kNumWideFields) + "], got " +
                                   ids.debug_string(0));
  }
  const int64_t n = ids.shape()[0];
  if (numeric.dtype() != DType::kFloat32 || numeric.num_elements() != n * kNumeric) {
    return Status::InvalidArgument("numeric must be float32[" + std::to_string(n) + ", " +
                                   std::to_string(kNumeric) + "], got " + numeric.debug_string(0));
  }
  if (labels.dtype() != DType::kFloat32 || labels.num_elements() != n) {
    return Status::InvalidArgument("label must be float32[" + std::to_string(n) + "], got " + labels.debug_string(0));
  }
  for (int64_t id : ids.flat<int64_t>()) {
    if (id < 0 || id >= bias_id()) {
      return Status::InvalidArgument("wide id " + std::to_string(id) + " is outside [0, " + std::to_string(bias_id()) +
                                     ")");
    }
  }
  return n;
}

// The model's probabilities and the labels of every example of `examples`
// (batches of 1024, through the functions of `registry`), as (probabilities
// float32[n], labels float32[n]). `model` gives a batch's probabilities.
using Probabilities = std::function<capstan::Result<std::vector<float>>(const capstan::Element& batch, int64_t n)>;
inline capstan::Result<capstan::Element> predictions(capstan::ClosureContext& ctx, const capstan::data::Dataset& examples,
                                                     const capstan::FunctionRegistry* registry,
                                                     const Probabilities& model) {
  using capstan::Tensor;
  CAPSTAN_ASSIGN_OR_RETURN(auto iterator, examples.batch(1024).make_iterator(registry));
  std::vector<float> probabilities, labels;
  while (true) {
    if (ctx.cancelled()) return capstan::Status::Cancelled("evaluation cancelled");
    CAPSTAN_ASSIGN_OR_RETURN(std::optional<capstan::Element> batch, iterator->get_next());
    if (!batch) break;
    CAPSTAN_ASSIGN_OR_RETURN(int64_t n, check_batch(*batch));
    CAPSTAN_ASSIGN_OR_RETURN(std::vector<float> p, model(*batch, n));
    probabilities.insert(probabilities.end(), p.begin(), p.end());
    auto l = batch->components[2].flat<float>();
    labels.insert(labels.end(), l.begin(), l.end());
  }
  const auto count = static_cast<int64_t>(labels.size());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor p, Tensor::from_vector<float>(probabilities, {count}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor y, Tensor::from_vector<float>(labels, {count}));
  return capstan::Element{{p, y}, {"probabilities", "labels"}};
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_CLOSURES_H_
