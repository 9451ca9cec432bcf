// libcensus_torch_program.so: what the census program needs of LibTorch
// (torch_program.cc loads it): the model's variables on the parameter
// servers (ps mode), the replicas of the synchronous modes, each a
// process of the program training the module with
// capstan::torch::MirroredModule, and the strategy modes' mirrored
// variables (the worker-servers train them: torch_module.cc).
#include <capstan/closure.h>
#include <capstan/torch.h>
#include <capstan/torch/mirrored_module.h>

#include <memory>
#include <string>
#include <vector>

#include "torch_model.h"
#include "torch_program.h"

namespace {

using capstan::Element;
using capstan::Result;
using capstan::Status;

// What a closure's context offers, from the program's own connection: the
// parameter servers for PsModule outside a worker (hybrid mode's tables).
// No per-worker datasets and no embedding hash tables.
class ProgramContext final : public capstan::ClosureContext {
 public:
  // `cluster` must outlive this object.
  explicit ProgramContext(capstan::ClusterCoordinator& cluster) : cluster_(cluster) {}
  int worker_index() const override { return 0; }
  int num_workers() const override { return 1; }
  int attempt() const override { return 1; }
  Result<capstan::Tensor> read(const std::string& variable) override { return cluster_.read_variable(variable); }
  Result<capstan::Tensor> gather(const std::string& variable, const capstan::Tensor& ids) override {
    return cluster_.gather(variable, ids);
  }
  Status assign(const std::string& variable, const capstan::Tensor& value) override {
    return cluster_.assign_variable(variable, value);
  }
  Status assign_add(const std::string& variable, const capstan::Tensor&) override {
    return Status::Unimplemented("assign_add('" + variable + "'): not offered to the census program's replicas");
  }
  // The program's ClusterCoordinator applies the optimizers' own rates.
  Status apply_gradients(const std::string& variable, const capstan::Tensor& gradient,
                         const capstan::ApplyOptions& options = {}) override {
    if (options.learning_rate) return no_rate_override(variable);
    return cluster_.apply_gradients(variable, gradient);
  }
  Status apply_sparse_gradients(const std::string& variable, const capstan::Tensor& ids, const capstan::Tensor& rows,
                                const capstan::ApplyOptions& options = {}) override {
    if (options.learning_rate) return no_rate_override(variable);
    return cluster_.apply_sparse_gradients(variable, ids, rows);
  }
  static Status no_rate_override(const std::string& variable) {
    return Status::Unimplemented("apply_gradients('" + variable +
                                 "'): the census program's replicas apply the optimizers' own learning rates");
  }
  Result<capstan::data::Iterator*> iterator(const capstan::Tensor&) override {
    return Status::Unimplemented("the census program's replicas read their own pipelines, not a per-worker dataset");
  }

 private:
  capstan::ClusterCoordinator& cluster_;
};

using census::TablesImpl;

capstan::torch::PsOptions table_options(const census::TorchReplicaOptions& options) {
  capstan::torch::PsOptions ps = census::ps_options(options.tables.wide, options.tables.deep);
  ps.optimizers.erase("bias");  // mirrored
  return ps;
}

// The hybrid modes' tables on the parameter servers, with their initial
// rows: fresh each run, as the Eigen model's hybrid mode (a table that
// exists from an earlier run gets its initial values again).
Status create_tables(capstan::ClusterCoordinator& cluster, census::WideDeepImpl& model,
                     const census::TorchReplicaOptions& options) {
  auto tables = std::make_shared<TablesImpl>(model);
  const capstan::torch::PsOptions ps = table_options(options);
  CAPSTAN_RETURN_IF_ERROR(capstan::torch::create_variables(cluster, *tables, ps).status());
  for (const auto& [name, embedding] :
       {std::pair{"wide.weight", model.wide}, std::pair{"embeddings.weight", model.embeddings}}) {
    CAPSTAN_ASSIGN_OR_RETURN(capstan::Tensor initial, embedding->initial_value());
    CAPSTAN_RETURN_IF_ERROR(cluster.assign_variable(ps.prefix + name, initial)
                                .with_context("initializing " + ps.prefix + name));
  }
  return Status::Ok();
}

// The mirrored parameters' optimizers: Adagrad on the wide part (the bias,
// and the wide table when it is mirrored), Adam on the rest.
capstan::torch::MirroredOptions mirrored_options(const census::TorchReplicaOptions& options) {
  capstan::torch::MirroredOptions mirrored;
  mirrored.prefix = "census/";
  mirrored.optimizer = options.mirrored.deep;
  mirrored.optimizers["bias"] = options.mirrored.wide;
  if (!options.hybrid) mirrored.optimizers["wide.weight"] = options.mirrored.wide;
  return mirrored;
}

// The mirrored variables of `model`'s parameters (the names and optimizers
// mirrored_options gives them), with its values.
Result<std::vector<capstan::MirroredVariableSpec>> mirrored_specs(census::WideDeep& model,
                                                                  const census::TorchReplicaOptions& options) {
  const capstan::torch::MirroredOptions mirrored = mirrored_options(options);
  std::vector<capstan::MirroredVariableSpec> specs;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    auto it = mirrored.optimizers.find(item.key());
    CAPSTAN_ASSIGN_OR_RETURN(capstan::Tensor initial,
                             capstan::torch::from_torch(item.value().detach().clone().contiguous()));
    specs.push_back({mirrored.prefix + item.key(), std::move(initial),
                     it != mirrored.optimizers.end() ? it->second : mirrored.optimizer});
  }
  return specs;
}

// The strategy modes' mirrored variables (see torch_strategy_variables in
// torch_program.h).
Result<std::vector<capstan::MirroredVariableSpec>> strategy_variables(capstan::ClusterCoordinator& cluster,
                                                                      const census::TorchReplicaOptions& options) {
  torch::manual_seed(options.seed);
  census::WideDeep model(options.seed,
                         options.hybrid ? census::Tables::kParameterServers : census::Tables::kMirrored);
  if (options.hybrid) CAPSTAN_RETURN_IF_ERROR(create_tables(cluster, *model, options));
  return mirrored_specs(model, options);
}

class Replica final : public census::TorchReplica {
 public:
  // Collective (see create_torch_replica).
  static Result<std::unique_ptr<Replica>> create(capstan::Communicator& group, capstan::ClusterCoordinator& cluster,
                                                 const census::TorchReplicaOptions& options) {
    auto replica = std::unique_ptr<Replica>(new Replica(cluster, options));
    replica->group_ = &group;
    if (options.hybrid) {
      replica->tables_ = std::make_shared<TablesImpl>(*replica->model_);
      replica->ps_ = std::make_unique<capstan::torch::PsModule>(*replica->tables_, table_options(options));
    }
    if (options.join_source >= 0) {
      // The others hold the model (and the tables exist): this process
      // takes their state and binds its module to it.
      CAPSTAN_ASSIGN_OR_RETURN(auto specs, mirrored_specs(replica->model_, options));
      CAPSTAN_ASSIGN_OR_RETURN(replica->joined_,
                               capstan::MirroredVariables::join(group, std::move(specs), options.join_source));
      CAPSTAN_ASSIGN_OR_RETURN(replica->mirrored_, capstan::torch::MirroredModule::attach(
                                                       *replica->joined_, *replica->model_, mirrored_options(options)));
      return replica;
    }
    if (options.hybrid) {
      if (group.rank() == 0) CAPSTAN_RETURN_IF_ERROR(create_tables(cluster, *replica->model_, options));
      CAPSTAN_RETURN_IF_ERROR(group.barrier().with_context("waiting for rank 0's tables"));
    }
    CAPSTAN_ASSIGN_OR_RETURN(replica->mirrored_, capstan::torch::MirroredModule::create(group, *replica->model_,
                                                                                        mirrored_options(options)));
    return replica;
  }

  Result<census::StepFigures> train_step(const Element& batch) override {
    CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
    if (ps_ != nullptr) CAPSTAN_RETURN_IF_ERROR(ps_->pull(context_, /*training=*/true));
    torch::Tensor logits;
    // One backward: the dense gradients all-reduced as it produces them,
    // the tables' rows' gradients left for push.
    CAPSTAN_ASSIGN_OR_RETURN(torch::Tensor loss, mirrored_->train_step(*group_, [&] {
      logits = model_->forward(b.ids, b.numeric);
      return torch::binary_cross_entropy_with_logits(logits, b.labels);
    }));
    if (ps_ != nullptr) CAPSTAN_RETURN_IF_ERROR(ps_->push(context_));
    const int64_t correct = ((logits.detach() > 0) == (b.labels > 0.5)).sum().item<int64_t>();
    return census::StepFigures{loss.item<double>(), correct, b.ids.size(0)};
  }

  Result<std::vector<float>> predict(const Element& batch) override {
    CAPSTAN_ASSIGN_OR_RETURN(Batch b, to_torch(batch));
    auto probabilities = [&] { return torch::sigmoid(model_->forward(b.ids, b.numeric)).contiguous(); };
    torch::Tensor p;
    if (ps_ != nullptr) {
      CAPSTAN_ASSIGN_OR_RETURN(p, ps_->eval_step(context_, probabilities));
    } else {
      torch::NoGradGuard no_grad;
      try {
        p = probabilities();
      } catch (const std::exception& e) {
        return Status::InvalidArgument(std::string("evaluating the census module: ") + e.what());
      }
    }
    const float* values = p.data_ptr<float>();
    return std::vector<float>(values, values + p.numel());
  }

  capstan::MirroredVariables& variables() override { return mirrored_->variables(); }

  capstan::Status set_group(capstan::Communicator& group, int source) override {
    CAPSTAN_RETURN_IF_ERROR(mirrored_->set_group(group, source));
    group_ = &group;
    return capstan::Status::Ok();
  }

 private:
  struct Batch {
    torch::Tensor ids, numeric, labels;
  };
  static Result<Batch> to_torch(const Element& batch) {
    if (batch.size() != 3) {
      return Status::InvalidArgument("a census batch has 3 components (wide_ids, numeric, label), got " +
                                     std::to_string(batch.size()));
    }
    Batch b;
    CAPSTAN_ASSIGN_OR_RETURN(b.ids, capstan::torch::to_torch(batch.components[0]));
    CAPSTAN_ASSIGN_OR_RETURN(b.numeric, capstan::torch::to_torch(batch.components[1]));
    CAPSTAN_ASSIGN_OR_RETURN(b.labels, capstan::torch::to_torch(batch.components[2]));
    return b;
  }

  Replica(capstan::ClusterCoordinator& cluster, const census::TorchReplicaOptions& options)
      : context_(cluster), model_(seeded_model(options)) {}

  // The MLP's initial weights from torch's generator, seeded first.
  static census::WideDeep seeded_model(const census::TorchReplicaOptions& options) {
    torch::manual_seed(options.seed);
    return census::WideDeep(options.seed,
                            options.hybrid ? census::Tables::kParameterServers : census::Tables::kMirrored);
  }

  ProgramContext context_;
  capstan::Communicator* group_ = nullptr;  // the steps' (set_group moves it)
  census::WideDeep model_;
  std::shared_ptr<TablesImpl> tables_;               // hybrid
  std::unique_ptr<capstan::torch::PsModule> ps_;     // hybrid: the tables
  std::unique_ptr<capstan::MirroredVariables> joined_;        // join_source: the replicas mirrored_ views
  std::unique_ptr<capstan::torch::MirroredModule> mirrored_;  // after model_ and joined_: references them
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int census_create_torch_variables(
    capstan::ClusterCoordinator* cluster, const census::Optimizers* optimizers, uint64_t seed, std::string* error) {
  torch::manual_seed(seed);
  census::WideDeep model(seed);
  capstan::Status status =
      capstan::torch::create_variables(*cluster, *model, census::ps_options(optimizers->wide, optimizers->deep))
          .status();
  if (!status.ok()) *error = status.to_string();
  return status.ok() ? 0 : 1;
}

// A new replica, owned by the caller, or null with *error set.
extern "C" __attribute__((visibility("default"))) census::TorchReplica* census_create_torch_replica(
    capstan::Communicator* group, capstan::ClusterCoordinator* cluster, const census::TorchReplicaOptions* options,
    capstan::Status* error) {
  try {
    auto replica = Replica::create(*group, *cluster, *options);
    if (!replica.ok()) {
      *error = replica.status();
      return nullptr;
    }
    return replica->release();
  } catch (const std::exception& e) {
    *error = Status::Internal(std::string("building the census module: ") + e.what());
    return nullptr;
  }
}

// The strategy modes' mirrored variables into *variables, or 1 with *error
// set (torch_program.h: torch_strategy_variables).
extern "C" __attribute__((visibility("default"))) int census_torch_strategy_variables(
    capstan::ClusterCoordinator* cluster, const census::TorchReplicaOptions* options,
    std::vector<capstan::MirroredVariableSpec>* variables, capstan::Status* error) {
  try {
    auto specs = strategy_variables(*cluster, *options);
    if (!specs.ok()) {
      *error = specs.status();
      return 1;
    }
    *variables = std::move(*specs);
    return 0;
  } catch (const std::exception& e) {
    *error = Status::Internal(std::string("building the census module: ") + e.what());
    return 1;
  }
}
