// The census Wide & Deep example's functions, loaded by every worker and
// data worker:
//
//   worker-server      --coordinator ADDR --module libcensus_module.so
//   data-worker        --dispatcher ADDR  --module libcensus_module.so
//
//   filter  "census_is_record"   a CSV line with 15 fields (drops adult.test's
//                                "|1x3 Cross validator" line and blank lines)
//   map     "census_features"    decoded row (15 scalars) -> (wide_ids
//                                int64[15], numeric float32[5], label float32)
//   closure "census_train_step"  one step on this worker's next batch: gathers
//                                the rows it uses, runs the model forward and
//                                backward (model.h) and sends the gradients
//                                to the parameter servers
//   closure "census_evaluate"    (path, num_shards, index): the model's
//                                probabilities and the labels of one shard of
//                                a CSV file, read through the same pipeline
//   closure "census_sync_step"   (per-worker dataset, hybrid int64): a
//                                synchronous step (MirroredStrategy::run): the
//                                model on this replica's next batch with its
//                                mirrored variables (and, hybrid, the tables on
//                                the parameter servers); gradients all-reduced
//   closure "census_sync_evaluate" (path, hybrid int64): this replica's shard of
//                                a CSV file (replica id of replicas in sync)
//
// These closures train model.h's hand-written Eigen model (the census
// program's --model eigen). The default model, the LibTorch module of
// torch_model.h, has its closures in torch_module.cc
// (libcensus_torch_module.so, loaded beside this module): census_torch_train_step
// and census_torch_evaluate in ps mode, census_torch_sync_step and
// census_torch_sync_evaluate in the strategy modes.
//
// Variables (created by the program, on the parameter servers; in the
// strategy modes mirrored on the workers, the tables on the parameter
// servers with strategy-hybrid):
//   census_wide        float32[wide_rows(), 1]                 sparse updates
//   census_embeddings  float32[embedding_rows(), kEmbeddingDim] sparse updates
//   census_dnn         float32[dnn_parameters()]               dense updates
#include <capstan/closure.h>
#include <capstan/data/dataset.h>
#include <capstan/functions.h>
#include <capstan/mirrored.h>

#include <functional>
#include <string>
#include <vector>

#include "closures.h"
#include "features.h"
#include "functions.h"
#include "model.h"
#include "pipeline.h"
#include "replica.h"

namespace {

using capstan::ClosureContext;
using capstan::DType;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

constexpr const char* kWide = "census_wide";
constexpr const char* kEmbeddings = "census_embeddings";
constexpr const char* kDnn = "census_dnn";

// The registry this module was loaded into: the evaluation closure builds a
// pipeline that uses the module's own named functions.
const capstan::FunctionRegistry* loaded_into = nullptr;

// The rows a batch uses and what the model computed with them.
struct Step {
  Tensor wide_ids;  // the batch's wide ids, then the bias id
  Tensor deep_ids;  // the ids of the embedded columns
  census::Output output;
};

Result<Step> run_model(ClosureContext& ctx, const Element& batch, int64_t n, bool gradients) {
  auto all = batch.components[0].flat<int64_t>();
  std::vector<int64_t> wide(all.begin(), all.end());
  wide.push_back(census::bias_id());
  std::vector<int64_t> deep;
  deep.reserve(static_cast<size_t>(n * census::kDeepFields));
  for (int64_t i = 0; i < n; ++i) {
    for (int f = 0; f < census::kDeepFields; ++f) deep.push_back(all[static_cast<size_t>(i * census::kNumWideFields + f)]);
  }
  Step step;
  CAPSTAN_ASSIGN_OR_RETURN(step.wide_ids, Tensor::from_vector<int64_t>(wide, {static_cast<int64_t>(wide.size())}));
  CAPSTAN_ASSIGN_OR_RETURN(step.deep_ids, Tensor::from_vector<int64_t>(deep, {static_cast<int64_t>(deep.size())}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor wide_rows, ctx.gather(kWide, step.wide_ids));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor embeddings, ctx.gather(kEmbeddings, step.deep_ids));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor dnn, ctx.read(kDnn));
  if (wide_rows.dtype() != DType::kFloat32 || wide_rows.num_elements() != step.wide_ids.num_elements() ||
      embeddings.dtype() != DType::kFloat32 ||
      embeddings.num_elements() != step.deep_ids.num_elements() * census::kEmbeddingDim ||
      dnn.dtype() != DType::kFloat32 || dnn.num_elements() != census::dnn_parameters()) {
    return Status::FailedPrecondition("the census variables do not have the model's shapes (" +
                                      wide_rows.debug_string(0) + ", " + embeddings.debug_string(0) + ", " +
                                      dnn.debug_string(0) + "): create them with the census program");
  }
  census::Inputs in{n, all.data(), batch.components[1].flat<float>().data(), batch.components[2].flat<float>().data()};
  census::Parameters p{wide_rows.flat<float>().data(), embeddings.flat<float>().data(), dnn.flat<float>().data()};
  step.output = census::run(in, p, gradients);
  return step;
}

Result<Element> train_step(ClosureContext& ctx, const Element& args) {
  if (args.size() != 1) return Status::InvalidArgument("census_train_step takes one argument: the per-worker dataset");
  int64_t n = 0;
  CAPSTAN_ASSIGN_OR_RETURN(Element batch, census::next_batch(ctx, args.components[0], &n));
  CAPSTAN_ASSIGN_OR_RETURN(Step step, run_model(ctx, batch, n, /*gradients=*/true));
  // A cancelled step (another closure failed) does not push its update.
  if (ctx.cancelled()) return Status::Cancelled("census_train_step cancelled before its update");
  const census::Output& out = step.output;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor wide_gradient,
                           Tensor::from_vector<float>(out.wide_gradient, {step.wide_ids.num_elements(), 1}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor embedding_gradient,
                           Tensor::from_vector<float>(out.embedding_gradient,
                                                      {step.deep_ids.num_elements(), census::kEmbeddingDim}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor dnn_gradient, Tensor::from_vector<float>(out.dnn_gradient, {census::dnn_parameters()}));
  CAPSTAN_RETURN_IF_ERROR(ctx.apply_sparse_gradients(kWide, step.wide_ids, wide_gradient));
  CAPSTAN_RETURN_IF_ERROR(ctx.apply_sparse_gradients(kEmbeddings, step.deep_ids, embedding_gradient));
  CAPSTAN_RETURN_IF_ERROR(ctx.apply_gradients(kDnn, dnn_gradient));
  return Element{{Tensor::scalar<float>(static_cast<float>(out.loss_sum / static_cast<double>(n))),
                  Tensor::scalar<int64_t>(out.correct), Tensor::scalar<int64_t>(n)},
                 {"loss", "correct", "examples"}};
}

Result<Element> evaluate(ClosureContext& ctx, const Element& args) {
  CAPSTAN_ASSIGN_OR_RETURN(census::EvalArgs shard, census::parse_eval_args(args, "census_evaluate"));
  return census::predictions(ctx, census::examples(shard.path, shard.shards, shard.index), loaded_into,
                             [&ctx](const Element& batch, int64_t n) -> Result<std::vector<float>> {
                               CAPSTAN_ASSIGN_OR_RETURN(Step step, run_model(ctx, batch, n, /*gradients=*/false));
                               return std::move(step.output.probabilities);
                             });
}

// The hybrid layout's tables through the closure's context.
census::Tables context_tables(ClosureContext& ctx) {
  return {[&ctx](const std::string& name, const Tensor& ids) { return ctx.gather(name, ids); },
          [&ctx](const std::string& name, const Tensor& ids, const Tensor& rows) {
            return ctx.apply_sparse_gradients(name, ids, rows);
          }};
}

bool hybrid_flag(const Element& args, size_t index) {
  return args.size() > index && args.components[index].dtype() == DType::kInt64 &&
         args.components[index].num_elements() == 1 && args.components[index].flat<int64_t>()[0] != 0;
}

Result<Element> sync_step(ClosureContext& ctx, const Element& args) {
  if (ctx.mirrored() == nullptr) {
    return Status::FailedPrecondition("census_sync_step is a synchronous step: run it with MirroredStrategy::run");
  }
  if (args.size() != 2) return Status::InvalidArgument("census_sync_step takes (per-worker dataset, hybrid)");
  int64_t n = 0;
  Tensor example_ids;
  CAPSTAN_ASSIGN_OR_RETURN(Element batch, census::next_batch(ctx, args.components[0], &n, &example_ids));
  const census::Tables tables = context_tables(ctx);
  CAPSTAN_ASSIGN_OR_RETURN(census::StepOutput step,
                           census::replica_step(batch, *ctx.mirrored(), hybrid_flag(args, 1) ? &tables : nullptr,
                                                /*train=*/true));
  return census::step_value(static_cast<float>(step.output.loss_sum / static_cast<double>(n)), step.output.correct,
                            n, example_ids);
}

Result<Element> sync_evaluate(ClosureContext& ctx, const Element& args) {
  if (ctx.mirrored() == nullptr) {
    return Status::FailedPrecondition("census_sync_evaluate is a synchronous step: run it with MirroredStrategy::run");
  }
  if (args.size() != 2 || args.components[0].dtype() != DType::kString || args.components[0].num_elements() != 1) {
    return Status::InvalidArgument("census_sync_evaluate takes (path string, hybrid int64)");
  }
  const std::string path(args.components[0].string_at(0));
  const census::Tables tables = context_tables(ctx);
  const census::Tables* on_ps = hybrid_flag(args, 1) ? &tables : nullptr;
  return census::predictions(ctx, census::examples(path, ctx.num_replicas_in_sync(), ctx.replica_id()), loaded_into,
                             [&ctx, on_ps](const Element& batch, int64_t) -> Result<std::vector<float>> {
                               CAPSTAN_ASSIGN_OR_RETURN(census::StepOutput step,
                                                        census::replica_step(batch, *ctx.mirrored(), on_ps,
                                                                             /*train=*/false));
                               return std::move(step.output.probabilities);
                             });
}

}  // namespace

CAPSTAN_MODULE(registry) {
  loaded_into = &registry;
  census::register_pipeline_functions(registry);
  registry.register_closure("census_train_step", train_step);
  registry.register_closure("census_evaluate", evaluate);
  registry.register_closure("census_sync_step", sync_step);
  registry.register_closure("census_sync_evaluate", sync_evaluate);
}
