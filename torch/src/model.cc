// The models fit trains: register_model's closures, over a PsModule, or, in
// a synchronous step (MirroredStrategy::run: MirroredFitStrategy), over a
// MirroredModule attached to the worker's replicas (and, hybrid, a
// PsModule for the embeddings' rows); and MultiWorkerMirroredFitStrategy,
// whose steps run in the program's own process over a MirroredModule on
// its group.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include "capstan/data/dataset.h"
#include "capstan/fit.h"
#include "capstan/mirrored.h"
#include "capstan/torch.h"
#include "capstan/torch/mirrored_module.h"

namespace capstan::torch {
namespace {

// One per registered model, shared by its two closures for the process's
// life (closures may run until exit).
struct Model {
  std::string name;
  ModelSpec spec;
  std::unique_ptr<PsModule> ps;
  // Hybrid synchronous steps: the embeddings' rows on the parameter servers
  // (spec.ps with embeddings_only); null for a module without
  // capstan::torch::Embeddings.
  std::unique_ptr<PsModule> tables;
  // Synchronous steps: the module attached to the worker's replicas
  // (ctx.mirrored()), re-attached when they change. GUARDED_BY(mutex).
  std::unique_ptr<MirroredModule> mirrored;
  MirroredVariables* attached = nullptr;
  std::vector<std::string> attached_names;
  ::torch::Tensor thresholds;  // float64 [T]
  std::mutex mutex;        // guards the module and `ps` while a step runs
};

// The batch's metric state (capstan/fit.h's MetricState::add reads it).
Result<Element> metric_state(const std::string& name, const ModelSpec& spec, const ::torch::Tensor& thresholds,
                             const ::torch::Tensor& outputs, const ::torch::Tensor& labels,
                             const ::torch::Tensor& loss) {
  ::torch::NoGradGuard no_grad;
  ::torch::Tensor p = spec.probabilities(outputs.detach()).reshape({-1}).to(::torch::kDouble);
  ::torch::Tensor positive = labels.detach().reshape({-1}).to(::torch::kDouble) > 0.5;
  if (p.numel() != positive.numel()) {
    return Status::InvalidArgument(name + ": " + std::to_string(p.numel()) + " probabilities for " +
                                   std::to_string(positive.numel()) +
                                   " labels; fit's metrics want one output per label (binary classification)");
  }
  const int64_t n = positive.numel();
  const int64_t correct = ((p > 0.5) == positive).sum().item<int64_t>();
  ::torch::Tensor predicted = p.unsqueeze(1) > thresholds.unsqueeze(0);  // [n, T]
  ::torch::Tensor pos = positive.unsqueeze(1), neg = ~pos;
  ::torch::Tensor confusion = ::torch::stack({(predicted & pos).sum(0), (predicted & neg).sum(0),
                                              (~predicted & neg).sum(0), (~predicted & pos).sum(0)})
                                  .to(::torch::kLong)
                                  .contiguous();
  CAPSTAN_ASSIGN_OR_RETURN(Tensor wire, from_torch(confusion, "confusion"));
  return Element{{Tensor::scalar<double>(loss.item<double>() * static_cast<double>(n)), Tensor::scalar<int64_t>(n),
                  Tensor::scalar<int64_t>(correct), std::move(wire)},
                 {"loss_sum", "examples", "correct", "confusion"}};
}

// A batch as the spec's forward and loss take it.
struct Batch {
  std::vector<::torch::Tensor> inputs;  // every component; an undefined tensor for strings
  ::torch::Tensor labels;               // inputs[label_component]
};

// The iterator's next element as a Batch; OutOfRange at its end.
Result<Batch> next_batch(const std::string& function, const ModelSpec& spec, data::Iterator& iterator) {
  Result<std::optional<Element>> next = [&] {
    PhaseScope phase(Phase::kInput);
    return iterator.get_next();
  }();
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> element, std::move(next));
  if (!element) {
    return Status::OutOfRange(function + ": the dataset is exhausted; repeat() it (fit counts steps)");
  }
  const auto size = static_cast<int>(element->size());
  const int label = spec.label_component < 0 ? size + spec.label_component : spec.label_component;
  if (label < 0 || label >= size) {
    return Status::InvalidArgument(function + ": label_component " + std::to_string(spec.label_component) +
                                   " but a batch has " + std::to_string(size) + " components");
  }
  Batch batch;
  for (int i = 0; i < size; ++i) {
    const Tensor& component = element->components[static_cast<size_t>(i)];
    if (component.dtype() == DType::kString) {
      if (i == label) {
        return Status::InvalidArgument(function + ": the labels (component " + std::to_string(i) + ") are strings");
      }
      batch.inputs.emplace_back();  // forward sees an undefined tensor
      continue;
    }
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor t, to_torch(component));
    batch.inputs.push_back(std::move(t));
  }
  batch.labels = batch.inputs[static_cast<size_t>(label)];
  return batch;
}

// register_model's checks of a spec, and its defaults filled in.
Status check_spec(const std::string& caller, ModelSpec& spec) {
  if (!spec.module) return Status::InvalidArgument(caller + ": ModelSpec::module is null");
  if (!spec.forward) return Status::InvalidArgument(caller + ": ModelSpec::forward is empty");
  if (!spec.loss) return Status::InvalidArgument(caller + ": ModelSpec::loss is empty");
  if (spec.auc_thresholds < 3) {
    return Status::InvalidArgument(caller + ": auc_thresholds " + std::to_string(spec.auc_thresholds) +
                                   "; use 3 or more (Keras: 200)");
  }
  if (!spec.probabilities) {
    spec.probabilities = [](const ::torch::Tensor& outputs) { return ::torch::sigmoid(outputs); };
  }
  return Status::Ok();
}

bool has_embeddings(::torch::nn::Module& module) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (std::dynamic_pointer_cast<EmbeddingImpl>(item.value()) != nullptr) return true;
  }
  return false;
}

// The module attached to this synchronous step's replicas. `reattach`:
// even to the same ones (an evaluation reads the parameters without a
// train_step pointing them at buffers the worker may have replaced). The
// caller holds m.mutex.
Status attach(Model& m, ClosureContext& ctx, bool reattach) {
  MirroredVariables* replicas = ctx.mirrored();
  if (!reattach && m.mirrored != nullptr && m.attached == replicas && m.attached_names == replicas->names()) {
    return Status::Ok();
  }
  m.mirrored.reset();  // its hooks go before the new ones come
  m.attached = nullptr;
  auto attached = MirroredModule::attach(*replicas, *m.spec.module, {.prefix = m.spec.ps.prefix});
  if (!attached.ok()) {
    return attached.status().with_context(m.name + ": attaching the module to the strategy's mirrored variables "
                                                   "(create the strategy with the module's parameters, named "
                                                   "ModelSpec::ps.prefix + the parameter's name)");
  }
  m.mirrored = std::move(*attached);
  m.attached = replicas;
  m.attached_names = replicas->names();
  return Status::Ok();
}

Result<Element> step(Model& m, ClosureContext& ctx, const Element& args, bool training) {
  const std::string function = m.name + (training ? "/train_step" : "/eval_step");
  const size_t want = training ? 2 : 1;
  if (args.size() != want || (training && (args.components[1].dtype() != DType::kFloat64 ||
                                           args.components[1].num_elements() > 1))) {
    return Status::InvalidArgument(function + " takes " +
                                   (training ? "(per-worker dataset, learning rate float64 [] or [0] for none)"
                                             : "(per-worker dataset)") +
                                   "; got " + std::to_string(args.size()) + " arguments (schedule it through fit)");
  }
  // The rate fit's LearningRateScheduler set, applied by the optimizers
  // wherever they run (the parameter servers, or the replicas) instead of
  // their own: exact for every optimizer, as Keras' optimizer.learning_rate.
  // The servers check it (finite, >= 0).
  ApplyOptions apply;
  if (training && args.components[1].num_elements() == 1) apply.learning_rate = args.components[1].flat<double>()[0];
  CAPSTAN_ASSIGN_OR_RETURN(data::Iterator * iterator, ctx.iterator(args.components[0]));
  CAPSTAN_ASSIGN_OR_RETURN(Batch batch, next_batch(function, m.spec, *iterator));
  const std::vector<::torch::Tensor>& inputs = batch.inputs;
  const ::torch::Tensor& labels = batch.labels;

  std::lock_guard<std::mutex> lock(m.mutex);
  m.spec.module->train(training);
  ::torch::Tensor outputs, loss;
  const bool synchronous = ctx.mirrored() != nullptr && ctx.group() != nullptr;
  if (synchronous) {
    CAPSTAN_RETURN_IF_ERROR(attach(m, ctx, /*reattach=*/!training));
  }
  if (synchronous && training) {
    // Hybrid: the rows this batch names are gathered in forward; the one
    // backward all-reduces the dense gradients and leaves the rows' for push.
    if (m.tables != nullptr) {
      if (Status pulled = m.tables->pull(ctx, /*training=*/true); !pulled.ok()) {
        (void)m.tables->unbind();
        return pulled.with_context(function + ": binding the embeddings");
      }
    }
    Result<::torch::Tensor> trained = m.mirrored->train_step(*ctx.group(), [&] {
      outputs = m.spec.forward(inputs);
      ::torch::Tensor computed = m.spec.loss(outputs, labels);
      loss = computed.detach();
      return computed;
    }, apply);
    if (!trained.ok()) {
      if (m.tables != nullptr) (void)m.tables->unbind();
      return trained.status();
    }
    if (m.tables != nullptr) CAPSTAN_RETURN_IF_ERROR(m.tables->push(ctx, apply).with_context(function));
  } else if (synchronous && m.tables != nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(loss, m.tables->eval_step(ctx, [&] {
      outputs = m.spec.forward(inputs);
      return m.spec.loss(outputs, labels);
    }));
  } else if (synchronous) {
    ::torch::NoGradGuard no_grad;
    try {
      outputs = m.spec.forward(inputs);
      loss = m.spec.loss(outputs, labels);
    } catch (const std::exception& e) {
      return Status::InvalidArgument(function + ": the forward or loss threw: " + e.what());
    }
  } else if (training) {
    CAPSTAN_RETURN_IF_ERROR(m.ps->train_step(ctx, [&] {
      outputs = m.spec.forward(inputs);
      ::torch::Tensor computed = m.spec.loss(outputs, labels);
      loss = computed.detach();
      return computed;
    }, apply).status());
  } else {
    CAPSTAN_ASSIGN_OR_RETURN(loss, m.ps->eval_step(ctx, [&] {
      outputs = m.spec.forward(inputs);
      return m.spec.loss(outputs, labels);
    }));
  }
  try {
    return metric_state(m.name, m.spec, m.thresholds, outputs, labels, loss);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(function + ": metrics of the outputs: " + e.what());
  }
}

}  // namespace

Status register_model(FunctionRegistry& registry, const std::string& name, ModelSpec spec) {
  if (name.empty()) return Status::InvalidArgument("register_model: an empty name; fit names the model by it");
  CAPSTAN_RETURN_IF_ERROR(check_spec("register_model('" + name + "')", spec));
  auto model = std::make_shared<Model>();
  model->name = name;
  const std::vector<double> thresholds = auc_thresholds(spec.auc_thresholds);
  model->thresholds = ::torch::tensor(thresholds, ::torch::kDouble);
  model->ps = std::make_unique<PsModule>(*spec.module, spec.ps);
  if (has_embeddings(*spec.module)) {
    PsOptions tables = spec.ps;
    tables.embeddings_only = true;
    model->tables = std::make_unique<PsModule>(*spec.module, std::move(tables));
  }
  model->spec = std::move(spec);
  registry.register_closure(name + "/train_step", [model](ClosureContext& ctx, const Element& args) {
    return step(*model, ctx, args, true);
  });
  registry.register_closure(name + "/eval_step", [model](ClosureContext& ctx, const Element& args) {
    return step(*model, ctx, args, false);
  });
  return Status::Ok();
}

// ---- Multi-client: MultiWorkerMirroredFitStrategy ------------------------------------

struct MultiWorkerMirroredFitStrategy::Impl {
  // Constant after create.
  Communicator* group = nullptr;
  std::string name;
  ModelSpec spec;
  MultiWorkerMirroredFitOptions options;
  ::torch::Tensor thresholds;  // float64 [T]
  std::unique_ptr<MirroredModule> mirrored;  // the module's parameters: views of its replicas
  // This process's iterators, by PerWorkerDataset id (1, 2, ...).
  std::map<int64_t, std::unique_ptr<data::Iterator>> iterators;
  PhaseTimes phases;  // of every step run here

  Status check_model(const std::string& model) const {
    if (model == name) return Status::Ok();
    return Status::InvalidArgument("MultiWorkerMirroredFitStrategy trains '" + name + "', not '" + model +
                                   "'; call fit with the name create was given");
  }

  Result<data::Iterator*> iterator(const PerWorkerDataset& dataset) {
    auto it = iterators.find(dataset.id);
    if (it == iterators.end()) {
      return Status::InvalidArgument("MultiWorkerMirroredFitStrategy: dataset " + std::to_string(dataset.id) +
                                     " is not this strategy's; make it with its distribute_dataset or "
                                     "create_per_worker_dataset");
    }
    return it->second.get();
  }

  Result<PerWorkerDataset> add(const data::Dataset& dataset) {
    CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<data::Iterator> iterator, dataset.make_iterator(options.functions));
    PerWorkerDataset handle;
    handle.id = static_cast<int64_t>(iterators.size()) + 1;
    iterators.emplace(handle.id, std::move(iterator));
    return handle;
  }

  // One step on this rank's next batch; its metric state.
  Result<Element> step(data::Iterator& iterator, bool training, const ApplyOptions& apply) {
    const std::string function = name + (training ? "/train_step" : "/eval_step");
    CAPSTAN_ASSIGN_OR_RETURN(Batch batch, next_batch(function, spec, iterator));
    spec.module->train(training);
    ::torch::Tensor outputs, loss;
    if (training) {
      CAPSTAN_RETURN_IF_ERROR(mirrored->train_step([&] {
        outputs = spec.forward(batch.inputs);
        ::torch::Tensor computed = spec.loss(outputs, batch.labels);
        loss = computed.detach();
        return computed;
      }, apply).status().with_context(function));
    } else {
      ::torch::NoGradGuard no_grad;
      try {
        outputs = spec.forward(batch.inputs);
        loss = spec.loss(outputs, batch.labels);
      } catch (const std::exception& e) {
        return Status::InvalidArgument(function + ": the forward or loss threw: " + e.what());
      }
    }
    try {
      return metric_state(name, spec, thresholds, outputs, batch.labels, loss);
    } catch (const std::exception& e) {
      return Status::InvalidArgument(function + ": metrics of the outputs: " + e.what());
    }
  }

  // `steps` steps; then every rank's sums, added in rank order (the same
  // bits on every rank). A rank's failure aborts the group, so the others
  // do not wait for it until the collective timeout.
  Result<MetricState> run(const PerWorkerDataset& dataset, int64_t steps, bool training, const ApplyOptions& apply) {
    MetricState local;
    Status failed = [&]() -> Status {
      CAPSTAN_ASSIGN_OR_RETURN(data::Iterator * it, iterator(dataset));
      for (int64_t i = 0; i < steps; ++i) {
        PhaseRecorder recorder;
        Result<Element> result = step(*it, training, apply);
        phases += recorder.stop();
        if (!result.ok()) {
          return result.status().with_context("step " + std::to_string(i + 1) + " of " + std::to_string(steps) +
                                              " on rank " + std::to_string(group->rank()));
        }
        CAPSTAN_RETURN_IF_ERROR(local.add(*result));
      }
      return Status::Ok();
    }();
    if (!failed.ok()) {
      if (!group->aborted()) group->abort(failed);
      return failed;
    }
    return sum_over_ranks(local);
  }

  // loss_sum, examples, correct, then tp, fp, tn, fn per threshold, as
  // float64 (exact for counts below 2^53).
  Result<MetricState> sum_over_ranks(const MetricState& local) {
    const size_t t = local.tp.size();
    std::vector<double> flat;
    flat.reserve(3 + 4 * t);
    flat.push_back(local.loss_sum);
    flat.push_back(static_cast<double>(local.examples));
    flat.push_back(static_cast<double>(local.correct));
    for (const std::vector<int64_t>* counts : {&local.tp, &local.fp, &local.tn, &local.fn}) {
      for (int64_t c : *counts) flat.push_back(static_cast<double>(c));
    }
    const auto width = static_cast<int64_t>(flat.size());
    CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, Tensor::from_vector(flat, {1, width}));
    Result<Tensor> gathered = group->all_gather(mine);
    if (!gathered.ok()) return gathered.status().with_context("summing the metrics over the ranks");
    const Tensor& all = *gathered;
    if (all.shape() != Shape{group->size(), width}) {
      return Status::Internal("metrics of the ranks: gathered " + shape_string(all.shape()) + ", expected [" +
                              std::to_string(group->size()) + ", " + std::to_string(width) + "]");
    }
    auto values = all.flat<double>();
    MetricState sum;
    sum.tp.assign(t, 0), sum.fp.assign(t, 0), sum.tn.assign(t, 0), sum.fn.assign(t, 0);
    for (int r = 0; r < group->size(); ++r) {
      const double* row = values.data() + static_cast<size_t>(r) * static_cast<size_t>(width);
      sum.loss_sum += row[0];
      sum.examples += static_cast<int64_t>(row[1]);
      sum.correct += static_cast<int64_t>(row[2]);
      size_t k = 3;
      for (std::vector<int64_t>* counts : {&sum.tp, &sum.fp, &sum.tn, &sum.fn}) {
        for (int64_t& c : *counts) c += static_cast<int64_t>(row[k++]);
      }
    }
    if (t == 0) sum.tp.clear(), sum.fp.clear(), sum.tn.clear(), sum.fn.clear();
    return sum;
  }

  Result<ClusterCoordinator*> cluster(const char* what) const {
    if (options.cluster == nullptr) {
      return Status::FailedPrecondition(std::string("MultiWorkerMirroredFitStrategy::") + what +
                                        ": no cluster to checkpoint through; set "
                                        "MultiWorkerMirroredFitOptions::cluster (on every rank)");
    }
    return options.cluster;
  }
};

MultiWorkerMirroredFitStrategy::MultiWorkerMirroredFitStrategy(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
MultiWorkerMirroredFitStrategy::~MultiWorkerMirroredFitStrategy() = default;

Result<std::unique_ptr<MultiWorkerMirroredFitStrategy>> MultiWorkerMirroredFitStrategy::create(
    Communicator& group, const std::string& model, const ModelSpec& spec, MultiWorkerMirroredFitOptions options) {
  const std::string caller = "MultiWorkerMirroredFitStrategy('" + model + "')";
  if (model.empty()) {
    return Status::InvalidArgument("MultiWorkerMirroredFitStrategy: an empty model name; fit names the model by it");
  }
  auto impl = std::make_unique<Impl>();
  impl->group = &group;
  impl->name = model;
  impl->spec = spec;
  impl->options = options;
  CAPSTAN_RETURN_IF_ERROR(check_spec(caller, impl->spec));
  if (has_embeddings(*impl->spec.module)) {
    return Status::InvalidArgument(caller + ": the module has capstan::torch::Embeddings, whose rows live on "
                                            "parameter servers; train it with MirroredFitStrategy (hybrid), or "
                                            "use torch::nn::Embedding to mirror the rows");
  }
  const std::vector<double> thresholds = auc_thresholds(impl->spec.auc_thresholds);
  impl->thresholds = ::torch::tensor(thresholds, ::torch::kDouble);
  MirroredOptions mirrored{.prefix = impl->spec.ps.prefix,
                           .optimizer = impl->spec.ps.optimizer,
                           .optimizers = impl->spec.ps.optimizers,
                           .bucket_bytes = options.bucket_bytes,
                           .first_bucket_bytes = options.first_bucket_bytes};
  CAPSTAN_ASSIGN_OR_RETURN(impl->mirrored, MirroredModule::create(group, *impl->spec.module, std::move(mirrored)));
  return std::unique_ptr<MultiWorkerMirroredFitStrategy>(new MultiWorkerMirroredFitStrategy(std::move(impl)));
}

Result<PerWorkerDataset> MultiWorkerMirroredFitStrategy::distribute_dataset(const data::Dataset& dataset) {
  return impl_->add(dataset.shard(impl_->group->size(), impl_->group->rank()));
}

Result<PerWorkerDataset> MultiWorkerMirroredFitStrategy::create_per_worker_dataset(const data::Dataset& dataset) {
  return impl_->add(dataset);
}

std::optional<PhaseTimes> MultiWorkerMirroredFitStrategy::phases() { return impl_->phases; }

int MultiWorkerMirroredFitStrategy::rank() const { return impl_->group->rank(); }
int MultiWorkerMirroredFitStrategy::num_replicas_in_sync() const { return impl_->group->size(); }

Result<MetricState> MultiWorkerMirroredFitStrategy::train(const std::string& model, const PerWorkerDataset& dataset,
                                                          int64_t steps, std::optional<double> learning_rate) {
  CAPSTAN_RETURN_IF_ERROR(impl_->check_model(model));
  return impl_->run(dataset, steps, /*training=*/true, ApplyOptions{.learning_rate = learning_rate});
}

Result<MetricState> MultiWorkerMirroredFitStrategy::evaluate(const std::string& model, const PerWorkerDataset& dataset,
                                                             int64_t steps) {
  CAPSTAN_RETURN_IF_ERROR(impl_->check_model(model));
  return impl_->run(dataset, steps, /*training=*/false, ApplyOptions{});
}

Result<std::string> MultiWorkerMirroredFitStrategy::save_checkpoint(const std::string& directory, int64_t step,
                                                                    int max_to_keep) {
  CAPSTAN_ASSIGN_OR_RETURN(ClusterCoordinator * cluster, impl_->cluster("save_checkpoint"));
  CAPSTAN_ASSIGN_OR_RETURN(std::string path,
                           impl_->mirrored->variables().save_checkpoint(*cluster, directory, step, max_to_keep));
  // Rank 0's path on every rank (the others wrote nothing), so that
  // callbacks keep the same record everywhere.
  Communicator& group = *impl_->group;
  CAPSTAN_ASSIGN_OR_RETURN(
      Tensor length, group.broadcast(Tensor::scalar<int64_t>(static_cast<int64_t>(path.size())), /*root=*/0));
  const int64_t n = length.flat<int64_t>()[0];
  if (n == 0) return std::string();
  std::vector<uint8_t> bytes(static_cast<size_t>(n), 0);
  if (group.rank() == 0) bytes.assign(path.begin(), path.end());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, Tensor::from_vector(bytes, {n}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor shared, group.broadcast(mine, /*root=*/0));
  auto flat = shared.flat<uint8_t>();
  return std::string(flat.begin(), flat.end());
}

Result<int64_t> MultiWorkerMirroredFitStrategy::restore_checkpoint(const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(ClusterCoordinator * cluster, impl_->cluster("restore_checkpoint"));
  CAPSTAN_ASSIGN_OR_RETURN(int64_t step, impl_->mirrored->variables().restore_checkpoint(*cluster, path));
  // The restore put new buffers into the replicas: the module views them
  // again (and every rank holds rank 0's reading).
  CAPSTAN_RETURN_IF_ERROR(impl_->mirrored->set_group(*impl_->group, /*source=*/0));
  return step;
}

Status MultiWorkerMirroredFitStrategy::verify_replicas() { return impl_->mirrored->verify_replicas(); }

}  // namespace capstan::torch
