// The functions of the CTR example, loaded by every worker:
//
//   worker-server --coordinator ADDR --module libctr_module.so
//
//   map "make_example"   index (int64 scalar) -> (ids int64[kFields], label float32[])
//   closure "train_step" one step of logistic regression on this worker's next batch
//   closure "eval"       log-losses of the model and of the planted model on
//                        held-out examples [first, first + count)
//   closure "train_step_dynamic", "eval_dynamic"
//                        the same with the weights in the dynamic embedding
//                        table "ctr_table" (dim 1), keyed by raw 40-bit ids
//                        (ctr::raw_id): lookup inserts new ids in training;
//                        evaluation looks up without inserting
//
// The model is logistic regression over hashed categorical ids: one weight
// per id in the variable "ctr_weights" [kVocabularySize, 1], partitioned
// across the parameter servers, plus a bias stored as the row kBiasId that
// every example has. A step gathers only the rows its batch uses and sends
// back a sparse gradient (IndexedSlices) for those rows; the optimizer runs
// on the parameter servers.
#include <capstan/closure.h>
#include <capstan/data/dataset.h>
#include <capstan/functions.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "planted_model.h"

namespace {

using capstan::ClosureContext;
using capstan::DType;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

constexpr const char* kWeights = "ctr_weights";
constexpr const char* kTable = "ctr_table";

// Where the weights live: the fixed table indexed by model id, or the
// dynamic table keyed by raw ids.
enum class Mode { kFixed, kDynamicTrain, kDynamicEval };

// A batch's distinct ids (the bias included) and, for each example, where
// its ids sit among them.
struct Lookup {
  std::vector<int64_t> unique_ids;
  std::vector<int32_t> slots;  // [batch * (kFields + 1)]
};

Lookup make_lookup(std::span<const int64_t> ids, int64_t batch) {
  constexpr int64_t kPerExample = ctr::kFields + 1;
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(batch * kPerExample));
  for (int64_t i = 0; i < batch; ++i) {
    for (int f = 0; f < ctr::kFields; ++f) all.push_back(ids[static_cast<size_t>(i * ctr::kFields + f)]);
    all.push_back(ctr::kBiasId);
  }
  Lookup lookup;
  lookup.unique_ids = all;
  std::sort(lookup.unique_ids.begin(), lookup.unique_ids.end());
  lookup.unique_ids.erase(std::unique(lookup.unique_ids.begin(), lookup.unique_ids.end()), lookup.unique_ids.end());
  lookup.slots.reserve(all.size());
  for (int64_t id : all) {
    auto at = std::lower_bound(lookup.unique_ids.begin(), lookup.unique_ids.end(), id);
    lookup.slots.push_back(static_cast<int32_t>(at - lookup.unique_ids.begin()));
  }
  return lookup;
}

Result<Tensor> ids_tensor(const std::vector<int64_t>& ids) {
  return Tensor::from_vector<int64_t>(ids, {static_cast<int64_t>(ids.size())});
}

// The ids the weights are stored under in `mode`.
Result<Tensor> storage_ids(const Lookup& lookup, Mode mode) {
  if (mode == Mode::kFixed) return ids_tensor(lookup.unique_ids);
  std::vector<int64_t> raw;
  raw.reserve(lookup.unique_ids.size());
  for (int64_t id : lookup.unique_ids) raw.push_back(ctr::raw_id(id));
  return ids_tensor(raw);
}

// The model's weights for `lookup.unique_ids`, from the parameter servers.
Result<std::vector<float>> gather_weights(ClosureContext& ctx, const Lookup& lookup, Mode mode) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, storage_ids(lookup, mode));
  Result<Tensor> found = mode == Mode::kFixed ? ctx.gather(kWeights, ids)
                                              : ctx.lookup(kTable, ids, /*insert=*/mode == Mode::kDynamicTrain);
  CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, std::move(found));
  if (rows.dtype() != DType::kFloat32 || rows.num_elements() != ids.num_elements()) {
    return Status::FailedPrecondition(std::string("'") + (mode == Mode::kFixed ? kWeights : kTable) +
                                      "' must be float32 rows of 1 weight; the parameter servers returned " +
                                      rows.debug_string(0));
  }
  auto flat = rows.flat<float>();
  return std::vector<float>(flat.begin(), flat.end());
}

// Checks a batch from the pipeline: (ids int64[batch, kFields], labels float32[batch]).
Result<int64_t> check_batch(const Element& batch) {
  if (batch.size() != 2) return Status::InvalidArgument("a batch must be (ids, labels)");
  const Tensor& ids = batch.components[0];
  const Tensor& labels = batch.components[1];
  if (ids.dtype() != DType::kInt64 || ids.rank() != 2 || ids.shape()[1] != ctr::kFields) {
    return Status::InvalidArgument("ids must be int64[batch, " + std::to_string(ctr::kFields) + "], got " +
                                   ids.debug_string(0));
  }
  if (labels.dtype() != DType::kFloat32 || labels.num_elements() != ids.shape()[0]) {
    return Status::InvalidArgument("labels must be float32[" + std::to_string(ids.shape()[0]) + "], got " +
                                   labels.debug_string(0));
  }
  if (ids.shape()[0] == 0) return Status::InvalidArgument("empty batch");
  return ids.shape()[0];
}

Result<int64_t> scalar_int(const Element& args, size_t i, const char* what) {
  if (args.size() <= i || args.components[i].dtype() != DType::kInt64 || args.components[i].num_elements() != 1) {
    return Status::InvalidArgument(std::string("eval: argument ") + std::to_string(i) + " (" + what +
                                   ") must be an int64 scalar");
  }
  return args.components[i].flat<int64_t>()[0];
}

Result<Element> train_step(ClosureContext& ctx, const Element& args, Mode mode) {
  if (args.size() != 1) return Status::InvalidArgument("train_step takes one argument: the per-worker dataset");
  CAPSTAN_ASSIGN_OR_RETURN(capstan::data::Iterator * iterator, ctx.iterator(args.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> batch, iterator->get_next());
  if (!batch) return Status::OutOfRange("the per-worker dataset is exhausted");
  CAPSTAN_ASSIGN_OR_RETURN(int64_t n, check_batch(*batch));
  auto labels = batch->components[1].flat<float>();

  Lookup lookup = make_lookup(batch->components[0].flat<int64_t>(), n);
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<float> weights, gather_weights(ctx, lookup, mode));

  // Gradient of the batch's summed log-loss with respect to each weight:
  // (sigmoid(logit) - label) for every example that has the id. Summing
  // (not averaging) keeps per-id gradients the size of one example's, which
  // suits Adagrad's per-coordinate step sizes.
  constexpr int64_t kPerExample = ctr::kFields + 1;
  std::vector<float> gradient(lookup.unique_ids.size(), 0.0f);
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* slots = &lookup.slots[static_cast<size_t>(i * kPerExample)];
    double logit = 0;
    for (int64_t k = 0; k < kPerExample; ++k) logit += weights[static_cast<size_t>(slots[k])];
    double label = labels[static_cast<size_t>(i)];
    loss += ctr::log_loss(logit, label);
    auto d = static_cast<float>(ctr::sigmoid(logit) - label);
    for (int64_t k = 0; k < kPerExample; ++k) gradient[static_cast<size_t>(slots[k])] += d;
  }
  // A cancelled step (another closure failed) does not push its update.
  if (ctx.cancelled()) return Status::Cancelled("train_step cancelled before its update");
  CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, storage_ids(lookup, mode));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor rows,
                           Tensor::from_vector<float>(gradient, {static_cast<int64_t>(gradient.size()), 1}));
  CAPSTAN_RETURN_IF_ERROR(ctx.apply_sparse_gradients(mode == Mode::kFixed ? kWeights : kTable, ids, rows));
  return Element{{Tensor::scalar<float>(static_cast<float>(loss / static_cast<double>(n)))}, {"loss"}};
}

// args: (first, count): held-out examples first .. first + count - 1.
// Returns float64 sums over them: (model log-loss, planted log-loss, labels,
// count).
Result<Element> eval(ClosureContext& ctx, const Element& args, Mode mode) {
  CAPSTAN_ASSIGN_OR_RETURN(int64_t first, scalar_int(args, 0, "first example"));
  CAPSTAN_ASSIGN_OR_RETURN(int64_t count, scalar_int(args, 1, "count"));
  if (first < ctr::kHeldOutBegin || count < 1 || count > 1 << 20) {
    return Status::InvalidArgument("eval: examples [" + std::to_string(first) + ", +" + std::to_string(count) +
                                   ") are not a held-out range (first >= " + std::to_string(ctr::kHeldOutBegin) +
                                   ", 1 <= count <= 2^20)");
  }
  std::vector<ctr::Example> examples;
  std::vector<int64_t> ids;
  examples.reserve(static_cast<size_t>(count));
  ids.reserve(static_cast<size_t>(count * ctr::kFields));
  for (int64_t i = 0; i < count; ++i) {
    // Up to 2^20 examples: a long closure checks for cancellation as it goes.
    if (i % 4096 == 0 && ctx.cancelled()) return Status::Cancelled("eval cancelled");
    examples.push_back(ctr::make_example(first + i));
    ids.insert(ids.end(), examples.back().ids.begin(), examples.back().ids.end());
  }
  Lookup lookup = make_lookup(ids, count);
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<float> weights, gather_weights(ctx, lookup, mode));

  constexpr int64_t kPerExample = ctr::kFields + 1;
  double model_loss = 0, planted_loss = 0, clicks = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t* slots = &lookup.slots[static_cast<size_t>(i * kPerExample)];
    double logit = 0;
    for (int64_t k = 0; k < kPerExample; ++k) logit += weights[static_cast<size_t>(slots[k])];
    const ctr::Example& e = examples[static_cast<size_t>(i)];
    model_loss += ctr::log_loss(logit, e.label);
    planted_loss += ctr::log_loss(e.planted_logit, e.label);
    clicks += e.label;
  }
  return Element{{Tensor::scalar<double>(model_loss), Tensor::scalar<double>(planted_loss),
                  Tensor::scalar<double>(clicks), Tensor::scalar<double>(static_cast<double>(count))},
                 {"model_loss", "planted_loss", "clicks", "count"}};
}

}  // namespace

CAPSTAN_MODULE(registry) {
  registry.register_map("make_example", [](Element element) -> Result<Element> {
    if (element.size() != 1 || element.components[0].dtype() != DType::kInt64 ||
        element.components[0].num_elements() != 1) {
      return Status::InvalidArgument("make_example takes an int64 scalar (the example's index)");
    }
    ctr::Example e = ctr::make_example(element.components[0].flat<int64_t>()[0]);
    CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, Tensor::from_vector<int64_t>({e.ids.begin(), e.ids.end()}, {ctr::kFields}));
    return Element{{ids, Tensor::scalar<float>(e.label)}, {"ids", "label"}};
  });
  registry.register_closure("train_step", [](ClosureContext& ctx, const Element& args) {
    return train_step(ctx, args, Mode::kFixed);
  });
  registry.register_closure("eval", [](ClosureContext& ctx, const Element& args) {
    return eval(ctx, args, Mode::kFixed);
  });
  // train_step, then 1 added to each element of "ctr_updates" (float32[2],
  // one element per parameter server): counts the updates each server keeps
  // (ctr --count-updates), so a recovery's losses can be counted.
  registry.register_closure("train_step_counted", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(Element out, train_step(ctx, args, Mode::kFixed));
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("ctr_updates", Tensor::from_vector<float>({1, 1}, {2}).value()));
    return out;
  });
  registry.register_closure("train_step_dynamic_counted",
                            [](ClosureContext& ctx, const Element& args) -> Result<Element> {
                              CAPSTAN_ASSIGN_OR_RETURN(Element out, train_step(ctx, args, Mode::kDynamicTrain));
                              CAPSTAN_RETURN_IF_ERROR(
                                  ctx.assign_add("ctr_updates", Tensor::from_vector<float>({1, 1}, {2}).value()));
                              return out;
                            });
  registry.register_closure("train_step_dynamic", [](ClosureContext& ctx, const Element& args) {
    return train_step(ctx, args, Mode::kDynamicTrain);
  });
  registry.register_closure("eval_dynamic", [](ClosureContext& ctx, const Element& args) {
    return eval(ctx, args, Mode::kDynamicEval);
  });
}
