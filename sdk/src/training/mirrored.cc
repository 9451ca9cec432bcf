#include "capstan/mirrored.h"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <span>

#include "training/mirrored_access.h"
#include "training/optimizer.h"

namespace capstan {
namespace {

uint64_t fnv1a(uint64_t h, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  return h;
}

Result<Tensor> copy_of(const Tensor& t) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(t.dtype(), t.shape()));
  if (t.byte_size() > 0) std::memcpy(out.mutable_data(), t.data(), t.byte_size());
  return out;
}

Result<Tensor> filled(DType dtype, const Shape& shape, double value) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, shape));
  if (dtype == DType::kFloat32) {
    for (float& x : out.mutable_flat<float>()) x = static_cast<float>(value);
  } else {
    for (double& x : out.mutable_flat<double>()) x = value;
  }
  return out;
}

template <typename T>
void apply(const Optimizer& optimizer, int64_t step, Tensor& value, std::vector<Tensor>& slots, const Tensor& gradient,
           std::optional<double> learning_rate) {
  std::vector<std::span<T>> slot_spans;
  for (Tensor& s : slots) slot_spans.push_back(s.mutable_flat<T>());
  training::apply_dense_update<T>(optimizer, step, value.mutable_flat<T>(),
                                  std::span<const std::span<T>>(slot_spans.data(), slot_spans.size()),
                                  gradient.flat<T>(), learning_rate);
}

}  // namespace

struct MirroredVariables::Impl {
  struct Variable {
    std::string name;
    Optimizer optimizer;
    Tensor value;
    std::vector<Tensor> slots;  // training::slot_names() order
  };
  Communicator* group = nullptr;
  std::vector<Variable> variables;
  std::map<std::string, size_t> by_name;
  int64_t step = 0;
  double gradient_weight = 1.0;
  int64_t input_position = 0;
  int64_t step_examples = 0;  // the next update's, set by MirroredInput::next

  // Names, dtypes, shapes and optimizer kinds: must agree across ranks.
  uint64_t layout_digest() const {
    uint64_t h = 14695981039346656037ull;
    for (const auto& v : variables) {
      h = fnv1a(h, v.name.data(), v.name.size() + 1);
      auto dtype = static_cast<uint8_t>(v.value.dtype());
      h = fnv1a(h, &dtype, 1);
      h = fnv1a(h, v.value.shape().data(), v.value.shape().size() * sizeof(int64_t));
      auto kind = static_cast<int>(v.optimizer.kind);
      h = fnv1a(h, &kind, sizeof(kind));
    }
    return h;
  }

  // Every rank's `digest`; the ranks whose value differs from this rank's.
  Result<std::vector<int>> differing(uint64_t digest) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor all, group->all_gather(*Tensor::from_vector<int64_t>({static_cast<int64_t>(digest)}, {1})));
    std::vector<int> out;
    auto values = all.flat<int64_t>();
    for (size_t r = 0; r < values.size(); ++r) {
      if (static_cast<uint64_t>(values[r]) != digest) out.push_back(static_cast<int>(r));
    }
    return out;
  }

  // One dense gradient per variable, in order, of the variable's dtype and
  // shape; InvalidArgument naming the first that is not.
  Status check_gradients(const std::vector<Tensor>& gradients, const std::string& what) const {
    if (gradients.size() != variables.size()) {
      return Status::InvalidArgument(what + ": " + std::to_string(gradients.size()) + " gradients for " +
                                     std::to_string(variables.size()) + " mirrored variables (one each, in order)");
    }
    for (size_t i = 0; i < gradients.size(); ++i) {
      const Tensor& g = gradients[i];
      const Tensor& v = variables[i].value;
      if (g.dtype() != v.dtype() || g.shape() != v.shape()) {
        return Status::InvalidArgument(what + ": the gradient of '" + variables[i].name + "' is " +
                                       std::string(dtype_name(g.dtype())) + shape_string(g.shape()) +
                                       ", the variable " + std::string(dtype_name(v.dtype())) +
                                       shape_string(v.shape()));
      }
    }
    return Status::Ok();
  }

  // The next step: every variable's optimizer applies its gradient (the
  // ranks' mean, checked) to the value, in place: a view of the value's
  // buffer (value() shares it) sees the new value. `learning_rate`: the
  // override every optimizer uses instead of its own rate (checked).
  void apply_mean(const std::vector<Tensor>& mean, std::optional<double> learning_rate) {
    const int64_t next = ++step;
    input_position += step_examples;
    step_examples = 0;
    for (size_t i = 0; i < variables.size(); ++i) {
      auto& v = variables[i];
      if (v.optimizer.kind == Optimizer::Kind::kNone) continue;
      if (v.value.dtype() == DType::kFloat32) {
        apply<float>(v.optimizer, next, v.value, v.slots, mean[i], learning_rate);
      } else {
        apply<double>(v.optimizer, next, v.value, v.slots, mean[i], learning_rate);
      }
    }
  }

  // Every value, slot, the step and the input position from `source`. Received into copies and
  // committed once all arrived: a broadcast that fails midway (a member
  // died) leaves this replica as it was, never half one state and half
  // another.
  Status broadcast_all(int source) {
    std::vector<Tensor> values;
    std::vector<std::vector<Tensor>> slots;
    for (auto& v : variables) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor value, group->broadcast(v.value, source));
      values.push_back(std::move(value));
      std::vector<Tensor> received;
      for (const Tensor& s : v.slots) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor slot, group->broadcast(s, source));
        received.push_back(std::move(slot));
      }
      slots.push_back(std::move(received));
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor counters,
                             group->broadcast(*Tensor::from_vector<int64_t>({step, input_position}, {2}), source));
    for (size_t i = 0; i < variables.size(); ++i) {
      variables[i].value = std::move(values[i]);
      variables[i].slots = std::move(slots[i]);
    }
    step = counters.flat<int64_t>()[0];
    input_position = counters.flat<int64_t>()[1];
    step_examples = 0;
    return Status::Ok();
  }
};

MirroredVariables::MirroredVariables(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MirroredVariables::~MirroredVariables() = default;

namespace {

Result<std::unique_ptr<MirroredVariables::Impl>> local_variables(Communicator& group,
                                                                 std::vector<MirroredVariableSpec> specs);

}  // namespace

Result<std::unique_ptr<MirroredVariables>> MirroredVariables::join(Communicator& group,
                                                                   std::vector<MirroredVariableSpec> specs, int source) {
  CAPSTAN_ASSIGN_OR_RETURN(auto impl, local_variables(group, std::move(specs)));
  std::unique_ptr<MirroredVariables> vars(new MirroredVariables(std::move(impl)));
  CAPSTAN_RETURN_IF_ERROR(vars->set_group(group, source));
  return vars;
}

Result<std::unique_ptr<MirroredVariables>> MirroredVariables::create(Communicator& group,
                                                                     std::vector<MirroredVariableSpec> specs) {
  CAPSTAN_ASSIGN_OR_RETURN(auto impl, local_variables(group, std::move(specs)));
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int> differ, impl->differing(impl->layout_digest()));
  if (!differ.empty()) {
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return Status::InvalidArgument("mirrored variables differ between ranks: rank(s) " + ranks +
                                   " created other names, dtypes, shapes or optimizers than rank " +
                                   std::to_string(group.rank()));
  }
  // Rank 0's initial values everywhere.
  for (auto& v : impl->variables) {
    CAPSTAN_ASSIGN_OR_RETURN(v.value, group.broadcast(v.value, 0));
  }
  return std::unique_ptr<MirroredVariables>(new MirroredVariables(std::move(impl)));
}

namespace {

// The variables of `specs`, checked, with fresh slots; nothing collective.
Result<std::unique_ptr<MirroredVariables::Impl>> local_variables(Communicator& group,
                                                                 std::vector<MirroredVariableSpec> specs) {
  auto impl = std::make_unique<MirroredVariables::Impl>();
  impl->group = &group;
  for (auto& spec : specs) {
    if (spec.name.empty()) return Status::InvalidArgument("a mirrored variable needs a name");
    if (impl->by_name.count(spec.name) > 0) {
      return Status::InvalidArgument("mirrored variable '" + spec.name + "' is listed twice");
    }
    if (spec.initial.dtype() != DType::kFloat32 && spec.initial.dtype() != DType::kFloat64) {
      return Status::InvalidArgument("mirrored variable '" + spec.name + "' is " +
                                     std::string(dtype_name(spec.initial.dtype())) +
                                     "; mirrored variables are float32 or float64");
    }
    CAPSTAN_RETURN_IF_ERROR(training::validate(spec.optimizer));
    MirroredVariables::Impl::Variable v;
    v.name = spec.name;
    v.optimizer = spec.optimizer;
    CAPSTAN_ASSIGN_OR_RETURN(v.value, copy_of(spec.initial));
    auto slot_names = training::slot_names(spec.optimizer.kind);
    for (size_t i = 0; i < slot_names.size(); ++i) {
      auto slot = filled(v.value.dtype(), v.value.shape(), training::slot_initial_value(spec.optimizer, i));
      if (!slot.ok()) return slot.status();
      v.slots.push_back(std::move(*slot));
    }
    impl->by_name[v.name] = impl->variables.size();
    impl->variables.push_back(std::move(v));
  }
  return impl;
}

}  // namespace

std::vector<std::string> MirroredVariables::names() const {
  std::vector<std::string> out;
  for (const auto& v : impl_->variables) out.push_back(v.name);
  return out;
}

Result<Tensor> MirroredVariables::value(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return Status::NotFound("no mirrored variable '" + name + "'");
  return impl_->variables[it->second].value;
}

int64_t MirroredVariables::step() const { return impl_->step; }

int64_t MirroredVariables::input_position() const { return impl_->input_position; }

Status MirroredVariables::set_step_examples(int64_t examples) {
  if (examples < 0) {
    return Status::InvalidArgument("set_step_examples: " + std::to_string(examples) +
                                   " examples; a step trains on 0 or more");
  }
  impl_->step_examples = examples;
  return Status::Ok();
}

Result<int> MirroredVariables::recovery_source(Communicator& group, const MirroredVariables* held) {
  const int64_t mine = held != nullptr ? held->step() : -1;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor all, group.all_gather(*Tensor::from_vector<int64_t>({mine}, {1})));
  int source = -1;
  auto steps = all.flat<int64_t>();
  for (size_t r = 0; r < steps.size(); ++r) {
    if (steps[r] < 0) continue;
    if (source < 0 || steps[r] < steps[static_cast<size_t>(source)]) source = static_cast<int>(r);
  }
  if (source < 0) {
    return Status::NotFound("recovery_source: no member of the group holds the mirrored variables (a fresh start: "
                            "create them)");
  }
  return source;
}

Status MirroredVariables::apply_gradients(const std::vector<Tensor>& gradients) {
  return apply_gradients(gradients, ApplyOptions{});
}

Status MirroredVariables::apply_gradients(const std::vector<Tensor>& gradients, const ApplyOptions& options) {
  CAPSTAN_RETURN_IF_ERROR(impl_->check_gradients(gradients, "apply_gradients"));
  if (options.learning_rate) {
    CAPSTAN_RETURN_IF_ERROR(
        training::validate_learning_rate_override(*options.learning_rate).with_context("apply_gradients"));
  }
  const double w = impl_->gradient_weight;
  std::vector<Tensor> weighted;
  if (w != 1.0) {
    weighted.reserve(gradients.size());
    for (const Tensor& g : gradients) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor scaled, Tensor::uninitialized(g.dtype(), g.shape()));
      if (g.dtype() == DType::kFloat32) {
        auto in = g.flat<float>();
        auto out = scaled.mutable_flat<float>();
        for (size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(in[i] * w);
      } else {
        auto in = g.flat<double>();
        auto out = scaled.mutable_flat<double>();
        for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] * w;
      }
      weighted.push_back(std::move(scaled));
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<Tensor> mean,
                           impl_->group->all_reduce(w != 1.0 ? weighted : gradients, ReduceOp::kMean));
  impl_->apply_mean(mean, options.learning_rate);
  return Status::Ok();
}

Status MirroredVariables::set_gradient_weight(double weight) {
  if (!std::isfinite(weight) || weight < 0) {
    return Status::InvalidArgument("set_gradient_weight: " + std::to_string(weight) +
                                   " is not a finite weight >= 0 (a rank's share of the global batch times the "
                                   "number of ranks)");
  }
  impl_->gradient_weight = weight;
  return Status::Ok();
}

double MirroredVariables::gradient_weight() const { return impl_->gradient_weight; }

Status MirroredVariables::apply_averaged_gradients(const std::vector<Tensor>& gradients) {
  return apply_averaged_gradients(gradients, ApplyOptions{});
}

Status MirroredVariables::apply_averaged_gradients(const std::vector<Tensor>& gradients,
                                                   const ApplyOptions& options) {
  CAPSTAN_RETURN_IF_ERROR(impl_->check_gradients(gradients, "apply_averaged_gradients"));
  if (options.learning_rate) {
    CAPSTAN_RETURN_IF_ERROR(
        training::validate_learning_rate_override(*options.learning_rate).with_context("apply_averaged_gradients"));
  }
  impl_->apply_mean(gradients, options.learning_rate);
  return Status::Ok();
}

uint64_t MirroredVariables::checksum() const {
  uint64_t h = 14695981039346656037ull;
  for (const auto& v : impl_->variables) {
    h = fnv1a(h, v.value.data(), v.value.byte_size());
    for (const Tensor& s : v.slots) h = fnv1a(h, s.data(), s.byte_size());
  }
  h = fnv1a(h, &impl_->step, sizeof(impl_->step));
  // Only a step input's position (the worker-servers' replicas keep theirs
  // outside, and their digests stay as they were).
  if (impl_->input_position != 0) h = fnv1a(h, &impl_->input_position, sizeof(impl_->input_position));
  return h;
}

Status MirroredVariables::verify_replicas() {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int> differ, impl_->differing(checksum()));
  if (differ.empty()) return Status::Ok();
  std::string ranks;
  for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return Status::DataLoss("mirrored variables diverged: rank(s) " + ranks + " hold other values than rank " +
                          std::to_string(impl_->group->rank()) + " after step " + std::to_string(impl_->step));
}

Status MirroredVariables::set_group(Communicator& group, int source) {
  if (source < 0 || source >= group.size()) {
    return Status::InvalidArgument("set_group: source rank " + std::to_string(source) + " is not in [0, " +
                                   std::to_string(group.size()) + ")");
  }
  // On failure the variables stay as they were, with the group they had.
  Communicator* before = impl_->group;
  impl_->group = &group;
  Status moved = [&]() -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(std::vector<int> differ, impl_->differing(impl_->layout_digest()));
    if (!differ.empty()) {
      return Status::InvalidArgument("set_group: the new group's members created other mirrored variables");
    }
    return impl_->broadcast_all(source);
  }();
  if (!moved.ok()) impl_->group = before;
  return moved;
}

namespace {

// Rank `source`'s outcome on every rank: it broadcasts its status code, and
// the others fail with a status naming it when it failed.
Status agree_from(Communicator& group, const Status& at_source, int source) {
  const int32_t code = group.rank() == source ? static_cast<int32_t>(at_source.code()) : 0;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor shared, group.broadcast(Tensor::scalar<int32_t>(code), source));
  if (group.rank() == source) return at_source;
  const auto source_code = static_cast<StatusCode>(shared.flat<int32_t>()[0]);
  if (source_code == StatusCode::kOk) return Status::Ok();
  return Status(source_code, "rank " + std::to_string(source) + " failed (its error says why)");
}

Status agree(Communicator& group, const Status& at_zero) { return agree_from(group, at_zero, 0); }

}  // namespace

Result<std::string> MirroredVariables::save_checkpoint(ClusterCoordinator& cluster, const std::string& directory,
                                                       int64_t step, int max_to_keep) {
  Communicator& group = *impl_->group;
  std::string path;
  Status status;
  if (group.rank() == 0) {
    status = [&]() -> Status {
      for (const auto& v : impl_->variables) {
        CAPSTAN_RETURN_IF_ERROR(cluster.create_variable({v.name, v.value, v.optimizer}).status());
        CAPSTAN_RETURN_IF_ERROR(cluster.assign_variable(v.name, v.value));
      }
      CAPSTAN_ASSIGN_OR_RETURN(path, cluster.save_checkpoint(directory, step, max_to_keep));
      return Status::Ok();
    }();
  }
  CAPSTAN_RETURN_IF_ERROR(agree(group, status));
  return path;
}

Result<int64_t> MirroredVariables::restore_checkpoint(ClusterCoordinator& cluster, const std::string& path) {
  Communicator& group = *impl_->group;
  int64_t step = 0;
  Status status;
  if (group.rank() == 0) {
    status = [&]() -> Status {
      CAPSTAN_ASSIGN_OR_RETURN(step, cluster.restore_checkpoint(path));
      for (auto& v : impl_->variables) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor value, cluster.read_variable(v.name));
        if (value.dtype() != v.value.dtype() || value.shape() != v.value.shape()) {
          return Status::InvalidArgument("checkpoint " + path + " holds '" + v.name + "' as " +
                                         std::string(dtype_name(value.dtype())) + shape_string(value.shape()) +
                                         ", the mirrored variable is " + std::string(dtype_name(v.value.dtype())) +
                                         shape_string(v.value.shape()));
        }
        CAPSTAN_ASSIGN_OR_RETURN(v.value, copy_of(value));
      }
      return Status::Ok();
    }();
  }
  CAPSTAN_RETURN_IF_ERROR(agree(*impl_->group, status));
  for (auto& v : impl_->variables) {
    CAPSTAN_ASSIGN_OR_RETURN(v.value, group.broadcast(v.value, 0));
    for (size_t i = 0; i < v.slots.size(); ++i) {
      CAPSTAN_ASSIGN_OR_RETURN(v.slots[i],
                               filled(v.value.dtype(), v.value.shape(), training::slot_initial_value(v.optimizer, i)));
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor shared_step, group.broadcast(Tensor::scalar<int64_t>(step), 0));
  impl_->step = shared_step.flat<int64_t>()[0];
  return impl_->step;
}

// ---- Access (Capstan's worker-servers) ---------------------------------------------

training::MirroredState MirroredVariables::Access::state(const MirroredVariables& vars) {
  training::MirroredState out;
  out.step = vars.impl_->step;
  for (const auto& v : vars.impl_->variables) {
    training::MirroredValue value;
    value.name = v.name;
    value.value = *copy_of(v.value);
    auto names = training::slot_names(v.optimizer.kind);
    for (size_t i = 0; i < v.slots.size() && i < names.size(); ++i) value.slots[names[i]] = *copy_of(v.slots[i]);
    out.variables.push_back(std::move(value));
  }
  return out;
}

std::vector<training::MirroredSpec> MirroredVariables::Access::specs(const MirroredVariables& vars) {
  std::vector<training::MirroredSpec> out;
  for (const auto& v : vars.impl_->variables) {
    out.push_back({v.name, v.value.dtype(), v.value.shape(), v.optimizer});
  }
  return out;
}

Result<std::unique_ptr<MirroredVariables>> MirroredVariables::Access::seeded(
    Communicator& group, const std::vector<training::MirroredSpec>& specs, const training::MirroredState* seed,
    int source) {
  std::vector<MirroredVariableSpec> local;
  for (const auto& spec : specs) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor zeros, Tensor::zeros(spec.dtype, spec.shape));
    local.push_back({spec.name, std::move(zeros), spec.optimizer});
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto impl, local_variables(group, std::move(local)));
  Status fitted;
  if (seed != nullptr) {
    fitted = [&]() -> Status {
      std::map<std::string, const training::MirroredValue*> given;
      for (const auto& v : seed->variables) given[v.name] = &v;
      for (auto& v : impl->variables) {
        auto it = given.find(v.name);
        if (it == given.end()) return Status::InvalidArgument("the seed has no value for mirrored variable '" + v.name + "'");
        const Tensor& value = it->second->value;
        if (value.dtype() != v.value.dtype() || value.shape() != v.value.shape()) {
          return Status::InvalidArgument("the seed holds '" + v.name + "' as " + std::string(dtype_name(value.dtype())) +
                                         shape_string(value.shape()) + ", the variable is " +
                                         std::string(dtype_name(v.value.dtype())) + shape_string(v.value.shape()));
        }
        CAPSTAN_ASSIGN_OR_RETURN(v.value, copy_of(value));
        auto names = training::slot_names(v.optimizer.kind);
        for (size_t i = 0; i < names.size() && i < v.slots.size(); ++i) {
          auto slot = it->second->slots.find(names[i]);
          if (slot == it->second->slots.end()) continue;  // starts afresh
          if (slot->second.dtype() != v.value.dtype() || slot->second.shape() != v.value.shape()) {
            return Status::InvalidArgument("the seed's slot '" + names[i] + "' of '" + v.name + "' is " +
                                           std::string(dtype_name(slot->second.dtype())) +
                                           shape_string(slot->second.shape()));
          }
          CAPSTAN_ASSIGN_OR_RETURN(v.slots[i], copy_of(slot->second));
        }
      }
      impl->step = seed->step;
      return Status::Ok();
    }();
  }
  // Everyone learns whether the source's seed fitted before the broadcast.
  CAPSTAN_RETURN_IF_ERROR(agree_from(group, fitted, source));
  std::unique_ptr<MirroredVariables> vars(new MirroredVariables(std::move(impl)));
  CAPSTAN_RETURN_IF_ERROR(vars->set_group(group, source));
  return vars;
}

}  // namespace capstan
