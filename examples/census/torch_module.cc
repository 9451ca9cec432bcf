// The census Wide & Deep model in LibTorch (torch_model.h), trained on the
// parameter servers: closures loaded by every worker beside the census
// module (module.cc), whose dataset functions the pipelines use:
//
//   worker-server --coordinator ADDR --module libcensus_module.so --module libcensus_torch_module.so
//
//   closure "census_torch_train_step"  one step on this worker's next batch:
//                                      pulls the rows and parameters the batch
//                                      uses, forward, loss, backward (autograd),
//                                      pushes the gradients (capstan::torch::PsModule)
//   closure "census_torch_evaluate"    (path, num_shards, index): probabilities
//                                      and labels of one shard of a CSV file
//
// Variables: the prefix "census/" + the module's parameter names, created by
// the census program (--model torch) with census::ps_options.
#include <capstan/closure.h>
#include <capstan/functions.h>
#include <capstan/torch.h>

#include <mutex>

#include "closures.h"
#include "pipeline.h"
#include "torch_model.h"

namespace {

using capstan::ClosureContext;
using capstan::Element;
using capstan::Result;
using capstan::Status;
using capstan::Tensor;

const capstan::FunctionRegistry* loaded_into = nullptr;

// One model per worker process; a closure runs on one thread at a time, and
// the values come from the parameter servers at every step.
struct Model {
  std::mutex mutex;  // a worker with several lanes runs closures at once
  census::WideDeep module;
  capstan::torch::PsModule ps;
  Model()
      : module(census::WideDeep()),
        ps(*module, census::ps_options(capstan::Optimizer::none(), capstan::Optimizer::none())) {}
};
Model& model() {
  static Model* instance = new Model();  // never destroyed: closures may run until exit
  return *instance;
}

struct Batch {
  torch::Tensor ids, numeric, labels;
};
Result<Batch> to_torch(const Element& batch) {
  Batch b;
  CAPSTAN_ASSIGN_OR_RETURN(b.ids, capstan::torch::to_torch(batch.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(b.numeric, capstan::torch::to_torch(batch.components[1]));
  CAPSTAN_ASSIGN_OR_RETURN(b.labels, capstan::torch::to_torch(batch.components[2]));
  return b;
}

Result<Element> train_step(ClosureContext& ctx, const Element& args) {
  if (args.size() != 1) {
    return Status::InvalidArgument("census_torch_train_step takes one argument: the per-worker dataset");
  }
  int64_t n = 0;
  CAPSTAN_ASSIGN_OR_RETURN(Element batch, census::next_batch(ctx, args.components[0], &n));
  CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
  Model& m = model();
  std::lock_guard<std::mutex> lock(m.mutex);
  torch::Tensor logits;
  CAPSTAN_ASSIGN_OR_RETURN(torch::Tensor loss, m.ps.train_step(ctx, [&] {
    logits = m.module->forward(b.ids, b.numeric);
    return torch::binary_cross_entropy_with_logits(logits, b.labels);
  }));
  const int64_t correct = ((logits.detach() > 0) == (b.labels > 0.5)).sum().item<int64_t>();
  return Element{{Tensor::scalar<float>(loss.item<float>()), Tensor::scalar<int64_t>(correct),
                  Tensor::scalar<int64_t>(n)},
                 {"loss", "correct", "examples"}};
}

Result<Element> evaluate(ClosureContext& ctx, const Element& args) {
  CAPSTAN_ASSIGN_OR_RETURN(census::EvalArgs shard, census::parse_eval_args(args, "census_torch_evaluate"));
  Model& m = model();
  std::lock_guard<std::mutex> lock(m.mutex);
  return census::predictions(
      ctx, census::examples(shard.path, shard.shards, shard.index), loaded_into,
      [&](const Element& batch, int64_t n) -> Result<std::vector<float>> {
        CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
        CAPSTAN_ASSIGN_OR_RETURN(torch::Tensor p, m.ps.eval_step(ctx, [&] {
          return torch::sigmoid(m.module->forward(b.ids, b.numeric)).contiguous();
        }));
        auto values = p.data_ptr<float>();
        return std::vector<float>(values, values + n);
      });
}

}  // namespace

CAPSTAN_MODULE(registry) {
  loaded_into = &registry;
  registry.register_closure("census_torch_train_step", train_step);
  registry.register_closure("census_torch_evaluate", evaluate);
}
