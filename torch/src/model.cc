// register_model: the closures fit schedules, over a PsModule, or, in a
// synchronous step (MirroredStrategy::run: MirroredFitStrategy), over a
// MirroredModule attached to the worker's replicas.
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
  // Synchronous steps: the module attached to the worker's replicas
  // (ctx.mirrored()), re-attached when they change. GUARDED_BY(mutex).
  std::unique_ptr<MirroredModule> mirrored;
  MirroredVariables* attached = nullptr;
  std::vector<std::string> attached_names;
  ::torch::Tensor thresholds;  // float64 [T]
  std::mutex mutex;            // guards the module and `ps` while a step runs
};

// The batch's metric state (capstan/fit.h's MetricState::add reads it).
Result<Element> metric_state(const Model& m, const ::torch::Tensor& outputs, const ::torch::Tensor& labels,
                             const ::torch::Tensor& loss) {
  ::torch::NoGradGuard no_grad;
  ::torch::Tensor p = m.spec.probabilities(outputs.detach()).reshape({-1}).to(::torch::kDouble);
  ::torch::Tensor positive = labels.detach().reshape({-1}).to(::torch::kDouble) > 0.5;
  if (p.numel() != positive.numel()) {
    return Status::InvalidArgument(m.name + ": " + std::to_string(p.numel()) + " probabilities for " +
                                   std::to_string(positive.numel()) +
                                   " labels; fit's metrics want one output per label (binary classification)");
  }
  const int64_t n = positive.numel();
  const int64_t correct = ((p > 0.5) == positive).sum().item<int64_t>();
  ::torch::Tensor predicted = p.unsqueeze(1) > m.thresholds.unsqueeze(0);  // [n, T]
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
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> batch, iterator->get_next());
  if (!batch) {
    return Status::OutOfRange(function + ": the per-worker dataset is exhausted; repeat() it (fit counts steps)");
  }
  const auto size = static_cast<int>(batch->size());
  const int label = m.spec.label_component < 0 ? size + m.spec.label_component : m.spec.label_component;
  if (label < 0 || label >= size) {
    return Status::InvalidArgument(function + ": label_component " + std::to_string(m.spec.label_component) +
                                   " but a batch has " + std::to_string(size) + " components");
  }
  std::vector<::torch::Tensor> inputs;
  for (int i = 0; i < size; ++i) {
    const Tensor& component = batch->components[static_cast<size_t>(i)];
    if (component.dtype() == DType::kString) {
      if (i == label) return Status::InvalidArgument(function + ": the labels (component " + std::to_string(i) + ") are strings");
      inputs.emplace_back();  // forward sees an undefined tensor
      continue;
    }
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor t, to_torch(component));
    inputs.push_back(std::move(t));
  }
  const ::torch::Tensor labels = inputs[static_cast<size_t>(label)];

  std::lock_guard<std::mutex> lock(m.mutex);
  m.spec.module->train(training);
  ::torch::Tensor outputs, loss;
  const bool synchronous = ctx.mirrored() != nullptr && ctx.group() != nullptr;
  if (synchronous) {
    CAPSTAN_RETURN_IF_ERROR(attach(m, ctx, /*reattach=*/!training));
  }
  if (synchronous && training) {
    CAPSTAN_RETURN_IF_ERROR(m.mirrored->train_step(*ctx.group(), [&] {
      outputs = m.spec.forward(inputs);
      ::torch::Tensor computed = m.spec.loss(outputs, labels);
      loss = computed.detach();
      return computed;
    }, apply).status());
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
    return metric_state(m, outputs, labels, loss);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(function + ": metrics of the outputs: " + e.what());
  }
}

}  // namespace

Status register_model(FunctionRegistry& registry, const std::string& name, ModelSpec spec) {
  if (name.empty()) return Status::InvalidArgument("register_model: an empty name; fit names the model by it");
  if (!spec.module) return Status::InvalidArgument("register_model('" + name + "'): ModelSpec::module is null");
  if (!spec.forward) return Status::InvalidArgument("register_model('" + name + "'): ModelSpec::forward is empty");
  if (!spec.loss) return Status::InvalidArgument("register_model('" + name + "'): ModelSpec::loss is empty");
  if (spec.auc_thresholds < 3) {
    return Status::InvalidArgument("register_model('" + name + "'): auc_thresholds " +
                                   std::to_string(spec.auc_thresholds) + "; use 3 or more (Keras: 200)");
  }
  if (!spec.probabilities) {
    spec.probabilities = [](const ::torch::Tensor& outputs) { return ::torch::sigmoid(outputs); };
  }
  auto model = std::make_shared<Model>();
  model->name = name;
  const std::vector<double> thresholds = auc_thresholds(spec.auc_thresholds);
  model->thresholds = ::torch::tensor(thresholds, ::torch::kDouble);
  model->ps = std::make_unique<PsModule>(*spec.module, spec.ps);
  model->spec = std::move(spec);
  registry.register_closure(name + "/train_step", [model](ClosureContext& ctx, const Element& args) {
    return step(*model, ctx, args, true);
  });
  registry.register_closure(name + "/eval_step", [model](ClosureContext& ctx, const Element& args) {
    return step(*model, ctx, args, false);
  });
  return Status::Ok();
}

}  // namespace capstan::torch
