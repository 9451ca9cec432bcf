// The census Wide & Deep model in LibTorch (torch_model.h), trained on the
// parameter servers (ps mode) and, in the strategy modes, synchronously on
// the worker-servers as MirroredStrategy's replicas: closures loaded by
// every worker beside the census module (module.cc), whose dataset
// functions the pipelines use:
//
//   worker-server --coordinator ADDR --module libcensus_module.so --module libcensus_torch_module.so
//
//   closure "census_torch_train_step"  one step on this worker's next batch:
//                                      pulls the rows and parameters the batch
//                                      uses, forward, loss, backward (autograd),
//                                      pushes the gradients (capstan::torch::PsModule)
//   closure "census_torch_evaluate"    (path, num_shards, index): probabilities
//                                      and labels of one shard of a CSV file
//   closure "census_torch_sync_step"   (per-worker dataset, hybrid int64): a
//                                      synchronous step (MirroredStrategy::run)
//                                      on this replica's next batch: the module's
//                                      parameters are views of ctx.mirrored()
//                                      (capstan::torch::MirroredModule::attach),
//                                      one backward all-reduces their gradients
//                                      on ctx.group(); hybrid: the tables are
//                                      capstan::torch::Embeddings on the parameter
//                                      servers, pulled and pushed by a PsModule
//   closure "census_torch_sync_evaluate" (path, hybrid int64): probabilities and
//                                      labels of this replica's shard of a CSV
//                                      file (replica id of replicas in sync)
//
// Variables: the prefix "census/" + the module's parameter names, created by
// the census program (--model torch): on the parameter servers with
// census::ps_options (ps mode), or as the strategy's mirrored variables
// (torch_program.h: torch_strategy_variables; strategy-hybrid: the tables on
// the parameter servers, the MLP and the bias mirrored).
#include <capstan/closure.h>
#include <capstan/functions.h>
#include <capstan/mirrored.h>
#include <capstan/torch.h>
#include <capstan/torch/mirrored_module.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

// ---- The strategy modes: this worker is a replica of MirroredStrategy ---------

// The strategy modes' model in this worker process: its mirrored parameters
// are views of the worker's replicas (ctx.mirrored()), which the worker
// keeps between steps; the model follows them across steps and re-attaches
// when the worker holds other replicas (a new strategy, or replicas
// received again after a re-formation).
struct SyncModel {
  explicit SyncModel(bool hybrid)
      : hybrid(hybrid),
        module(census::WideDeep(0, hybrid ? census::Tables::kParameterServers : census::Tables::kMirrored)) {
    if (hybrid) {
      tables = std::make_shared<census::TablesImpl>(*module);
      // A worker's PsModule uses only the names (the program made the tables).
      ps = std::make_unique<capstan::torch::PsModule>(
          *tables, census::ps_options(capstan::Optimizer::none(), capstan::Optimizer::none()));
    }
  }
  const bool hybrid;
  census::WideDeep module;
  std::shared_ptr<census::TablesImpl> tables;      // hybrid
  std::unique_ptr<capstan::torch::PsModule> ps;    // hybrid: the tables
  capstan::MirroredVariables* attached = nullptr;  // the replicas `mirrored` views
  std::vector<std::string> attached_names;
  std::unique_ptr<capstan::torch::MirroredModule> mirrored;  // references module
};

std::mutex sync_mutex;
SyncModel* sync_instance = nullptr;  // GUARDED_BY(sync_mutex); never destroyed: closures may run until exit

// This worker's model for a step of `ctx`, attached to ctx.mirrored().
// `reattach`: attach again even to the same replicas (an evaluation, which
// reads the parameters without a train_step to point them at buffers the
// worker may have replaced). The caller holds sync_mutex.
Result<SyncModel*> sync_model(ClosureContext& ctx, bool hybrid, bool reattach) {
  if (sync_instance == nullptr || sync_instance->hybrid != hybrid) {
    delete sync_instance;
    sync_instance = nullptr;
    try {
      sync_instance = new SyncModel(hybrid);
    } catch (const std::exception& e) {
      return Status::Internal(std::string("building the census module: ") + e.what());
    }
  }
  SyncModel& m = *sync_instance;
  capstan::MirroredVariables* replicas = ctx.mirrored();
  if (reattach || m.mirrored == nullptr || m.attached != replicas || m.attached_names != replicas->names()) {
    m.mirrored.reset();  // its hooks go before the new ones come
    m.attached = nullptr;
    capstan::torch::MirroredOptions options;
    options.prefix = "census/";
    auto attached = capstan::torch::MirroredModule::attach(*replicas, *m.module, options);
    if (!attached.ok()) {
      return attached.status().with_context("attaching the census module to this worker's replicas (did the "
                                            "program create the strategy with the LibTorch model's variables?)");
    }
    m.mirrored = std::move(*attached);
    m.attached = replicas;
    m.attached_names = replicas->names();
  }
  return &m;
}

Status check_sync(ClosureContext& ctx, const char* closure) {
  if (ctx.mirrored() == nullptr || ctx.group() == nullptr) {
    return Status::FailedPrecondition(std::string(closure) +
                                      " is a synchronous step: run it with MirroredStrategy::run");
  }
  return Status::Ok();
}

bool hybrid_flag(const Element& args, size_t index) {
  return args.size() > index && args.components[index].dtype() == capstan::DType::kInt64 &&
         args.components[index].num_elements() == 1 && args.components[index].flat<int64_t>()[0] != 0;
}

Result<Element> sync_step(ClosureContext& ctx, const Element& args) {
  CAPSTAN_RETURN_IF_ERROR(check_sync(ctx, "census_torch_sync_step"));
  if (args.size() != 2) return Status::InvalidArgument("census_torch_sync_step takes (per-worker dataset, hybrid)");
  int64_t n = 0;
  Tensor example_ids;
  CAPSTAN_ASSIGN_OR_RETURN(Element batch, census::next_batch(ctx, args.components[0], &n, &example_ids));
  CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
  std::lock_guard<std::mutex> lock(sync_mutex);
  CAPSTAN_ASSIGN_OR_RETURN(SyncModel * m, sync_model(ctx, hybrid_flag(args, 1), /*reattach=*/false));
  if (m->ps != nullptr) CAPSTAN_RETURN_IF_ERROR(m->ps->pull(ctx, /*training=*/true));
  torch::Tensor logits;
  // One backward: the mirrored gradients all-reduced on the step's group as
  // it produces them, the tables' rows' gradients left for push.
  CAPSTAN_ASSIGN_OR_RETURN(torch::Tensor loss, m->mirrored->train_step(*ctx.group(), [&] {
    logits = m->module->forward(b.ids, b.numeric);
    return torch::binary_cross_entropy_with_logits(logits, b.labels);
  }));
  if (m->ps != nullptr) CAPSTAN_RETURN_IF_ERROR(m->ps->push(ctx));
  const int64_t correct = ((logits.detach() > 0) == (b.labels > 0.5)).sum().item<int64_t>();
  return census::step_value(loss.item<float>(), correct, n, example_ids);
}

Result<Element> sync_evaluate(ClosureContext& ctx, const Element& args) {
  CAPSTAN_RETURN_IF_ERROR(check_sync(ctx, "census_torch_sync_evaluate"));
  if (args.size() != 2 || args.components[0].dtype() != capstan::DType::kString ||
      args.components[0].num_elements() != 1) {
    return Status::InvalidArgument("census_torch_sync_evaluate takes (path string, hybrid int64)");
  }
  const std::string path(args.components[0].string_at(0));
  std::lock_guard<std::mutex> lock(sync_mutex);
  CAPSTAN_ASSIGN_OR_RETURN(SyncModel * m, sync_model(ctx, hybrid_flag(args, 1), /*reattach=*/true));
  return census::predictions(
      ctx, census::examples(path, ctx.num_replicas_in_sync(), ctx.replica_id()), loaded_into,
      [&](const Element& batch, int64_t n) -> Result<std::vector<float>> {
        CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
        auto probabilities = [&] { return torch::sigmoid(m->module->forward(b.ids, b.numeric)).contiguous(); };
        torch::Tensor p;
        if (m->ps != nullptr) {
          CAPSTAN_ASSIGN_OR_RETURN(p, m->ps->eval_step(ctx, probabilities));
        } else {
          torch::NoGradGuard no_grad;
          try {
            p = probabilities();
          } catch (const std::exception& e) {
            return Status::InvalidArgument(std::string("evaluating the census module: ") + e.what());
          }
        }
        const float* values = p.data_ptr<float>();
        return std::vector<float>(values, values + n);
      });
}

}  // namespace

CAPSTAN_MODULE(registry) {
  loaded_into = &registry;
  registry.register_closure("census_torch_train_step", train_step);
  registry.register_closure("census_torch_evaluate", evaluate);
  registry.register_closure("census_torch_sync_step", sync_step);
  registry.register_closure("census_torch_sync_evaluate", sync_evaluate);
}
