// What the census modules' closures share (module.cc: the Eigen model;
// torch_module.cc: the LibTorch one): taking and checking a batch from the
// pipeline, the evaluation closures' arguments and running a model over a
// whole file for evaluation.
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

// The next batch of the per-worker dataset `dataset` (check_batch'ed), and
// its number of examples in *n.
// A batch of census::examples(...).enumerate() (a step input that counts
// its examples) starts with the examples' ids: they go to *example_ids
// (when given), the rest is the batch.
inline capstan::Result<capstan::Element> next_batch(capstan::ClosureContext& ctx, const capstan::Tensor& dataset,
                                                    int64_t* n, capstan::Tensor* example_ids = nullptr) {
  CAPSTAN_ASSIGN_OR_RETURN(capstan::data::Iterator * iterator, ctx.iterator(dataset));
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<capstan::Element> batch, iterator->get_next());
  if (!batch) return capstan::Status::OutOfRange("the per-worker dataset is exhausted");
  if (batch->size() == 4 && batch->components[0].dtype() == capstan::DType::kInt64 &&
      batch->components[0].rank() == 1) {
    if (example_ids != nullptr) *example_ids = batch->components[0];
    batch->components.erase(batch->components.begin());
    batch->names.clear();
  }
  CAPSTAN_ASSIGN_OR_RETURN(*n, check_batch(*batch));
  return std::move(*batch);
}

// A synchronous step's value: loss, correct, examples, and the examples'
// ids when the batch carried them (see next_batch).
inline capstan::Element step_value(float loss, int64_t correct, int64_t n, const capstan::Tensor& example_ids) {
  capstan::Element out{{capstan::Tensor::scalar<float>(loss), capstan::Tensor::scalar<int64_t>(correct),
                        capstan::Tensor::scalar<int64_t>(n)},
                       {"loss", "correct", "examples"}};
  if (example_ids.dtype() == capstan::DType::kInt64 && example_ids.num_elements() == n) {
    out.components.push_back(example_ids);
    out.names.push_back("example_ids");
  }
  return out;
}

// The arguments of an evaluation closure (census_evaluate,
// census_torch_evaluate, named by `closure` in errors): one shard of a CSV
// file.
struct EvalArgs {
  std::string path;
  int64_t shards = 0;
  int64_t index = 0;
};
inline capstan::Result<EvalArgs> parse_eval_args(const capstan::Element& args, const std::string& closure) {
  using capstan::DType;
  using capstan::Status;
  if (args.size() != 3 || args.components[0].dtype() != DType::kString || args.components[0].num_elements() != 1 ||
      args.components[1].dtype() != DType::kInt64 || args.components[2].dtype() != DType::kInt64) {
    return Status::InvalidArgument(closure + " takes (path string, num_shards int64, index int64)");
  }
  EvalArgs parsed{std::string(args.components[0].string_at(0)), args.components[1].flat<int64_t>()[0],
                  args.components[2].flat<int64_t>()[0]};
  if (parsed.shards < 1 || parsed.index < 0 || parsed.index >= parsed.shards) {
    return Status::InvalidArgument(closure + ": shard " + std::to_string(parsed.index) + " of " +
                                   std::to_string(parsed.shards) + " does not exist");
  }
  return parsed;
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
