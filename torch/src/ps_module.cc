// torch::nn::Modules whose parameters live on the parameter servers.
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "capstan/torch.h"
#include "errors.h"

namespace capstan::torch {
namespace {

using internal::torch_error;

std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + shape_string(shape);
}

// The parameter servers apply optimizers to float32 and float64 only
// (daemons/ps_server/variable_store.cc); other dtypes are assign-only.
bool takes_gradients(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }

// Every capstan::torch::Embedding inside `module`, with its path.
std::vector<std::pair<std::string, std::shared_ptr<EmbeddingImpl>>> embeddings_of(::torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::shared_ptr<EmbeddingImpl>>> found;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto embedding = std::dynamic_pointer_cast<EmbeddingImpl>(item.value())) {
      found.emplace_back(item.key(), std::move(embedding));
    }
  }
  return found;
}

std::string weight_name(const std::string& path) { return path.empty() ? "weight" : path + ".weight"; }

Partitioner partitioner_for(const PsParameter& parameter, const PsOptions& options) {
  if (auto it = options.partitioners.find(parameter.name); it != options.partitioners.end()) return it->second;
  int64_t elements = shape_num_elements(parameter.shape);
  int64_t bytes = elements * static_cast<int64_t>(dtype_size(parameter.dtype));
  if (!parameter.shape.empty() && parameter.shape[0] >= 2 && bytes >= options.partition_min_bytes &&
      options.max_shards > 1) {
    return Partitioner::min_size(std::max<int64_t>(options.partition_min_bytes / 4, 1), options.max_shards);
  }
  return Partitioner::none();
}

const Optimizer& optimizer_for(const std::string& name, const PsOptions& options) {
  auto it = options.optimizers.find(name);
  return it != options.optimizers.end() ? it->second : options.optimizer;
}

}  // namespace

// ---- Embedding ---------------------------------------------------------------

EmbeddingImpl::EmbeddingImpl(EmbeddingOptions options) : options_(options) {
  TORCH_CHECK(options_.dim > 0, "capstan::torch::Embedding: dim must be positive, not ", options_.dim);
  TORCH_CHECK(options_.hash_table || options_.num_embeddings > 0,
              "capstan::torch::Embedding: num_embeddings must be positive (or set hash_table), not ",
              options_.num_embeddings);
}

Result<Tensor> EmbeddingImpl::initial_value() const {
  if (options_.hash_table) {
    return Status::FailedPrecondition(
        "a hash-table embedding has no whole initial value: its rows are made on first lookup");
  }
  const Shape shape{options_.num_embeddings, options_.dim};
  if (options_.stddev == 0) return constant_initializer(DType::kFloat32, shape, options_.mean);
  return random_normal_initializer(DType::kFloat32, shape, options_.mean, options_.stddev, options_.seed);
}

Status EmbeddingImpl::set_local_rows(::torch::Tensor rows) {
  if (!rows.defined()) {
    local_rows_ = ::torch::Tensor();
    return Status::Ok();
  }
  if (options_.hash_table) {
    return Status::InvalidArgument(
        "a hash-table capstan::torch::Embedding takes no local rows: its rows are keyed by id, not row number");
  }
  const std::vector<int64_t> want{options_.num_embeddings, options_.dim};
  if (rows.scalar_type() != ::torch::kFloat || rows.sizes().vec() != want) {
    std::ostringstream got;
    got << rows.scalar_type() << rows.sizes();
    return Status::InvalidArgument("capstan::torch::Embedding (" + std::to_string(options_.num_embeddings) + " x " +
                                   std::to_string(options_.dim) + ") takes local rows float32[" +
                                   std::to_string(options_.num_embeddings) + ", " + std::to_string(options_.dim) +
                                   "], not " + got.str());
  }
  local_rows_ = std::move(rows);
  return Status::Ok();
}

::torch::Tensor EmbeddingImpl::forward(const ::torch::Tensor& ids) {
  if (step_.context == nullptr && local_rows_.defined()) {
    // Serving: the rows load_checkpoint put here, as torch::nn::Embedding reads its weight.
    TORCH_CHECK(ids.scalar_type() == ::torch::kLong || ids.scalar_type() == ::torch::kInt,
                "capstan::torch::Embedding: ids must be int32 or int64, not ", ids.scalar_type());
    ::torch::Tensor flat = ids.reshape({-1}).to(::torch::kLong).to(local_rows_.device());
    if (flat.numel() > 0) {
      const int64_t low = flat.min().item<int64_t>(), high = flat.max().item<int64_t>();
      TORCH_CHECK(low >= 0 && high < options_.num_embeddings, "capstan::torch::Embedding: id ",
                  low < 0 ? low : high, " is outside its ", options_.num_embeddings, " rows [0, ",
                  options_.num_embeddings, ")");
    }
    std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
    shape.push_back(options_.dim);
    return local_rows_.index_select(0, flat).view(shape);
  }
  TORCH_CHECK(step_.context != nullptr, "capstan::torch::Embedding (", options_.num_embeddings, " x ",
              options_.dim,
              "): its rows live on the parameter servers; call it inside a step (PsModule::train_step, "
              "eval_step or pull), or give it local rows for serving (capstan::torch::load_checkpoint)");
  TORCH_CHECK(ids.scalar_type() == ::torch::kLong || ids.scalar_type() == ::torch::kInt,
              "capstan::torch::Embedding '", step_.variable, "': ids must be int32 or int64, not ",
              ids.scalar_type());
  ::torch::Tensor flat = ids.reshape({-1}).to(::torch::kLong).contiguous();
  // Each distinct id is read (and updated) once; `inverse` puts the rows
  // back in the batch's order, and autograd sums repeated ids' gradients.
  auto [distinct, inverse] = [&] {
    auto result = at::_unique(flat, /*sorted=*/true, /*return_inverse=*/true);
    return std::make_pair(std::get<0>(result), std::get<1>(result));
  }();
  Result<Tensor> wire_ids = from_torch(distinct, "embedding ids");
  TORCH_CHECK(wire_ids.ok(), wire_ids.status().to_string());
  Result<Tensor> rows = options_.hash_table ? step_.context->lookup(step_.variable, *wire_ids, step_.training)
                                            : step_.context->gather(step_.variable, *wire_ids);
  TORCH_CHECK(rows.ok(), "capstan::torch::Embedding '", step_.variable, "': ", rows.status().to_string());
  Result<::torch::Tensor> leaf = to_torch(*rows);
  TORCH_CHECK(leaf.ok(), leaf.status().to_string());
  ::torch::Tensor gathered = *leaf;
  if (step_.training && ::torch::GradMode::is_enabled()) gathered.requires_grad_(true);
  step_.ids.push_back(distinct);
  step_.rows.push_back(gathered);
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(options_.dim);
  return gathered.index_select(0, inverse).view(shape);
}

// ---- The program's side: variables ------------------------------------------------

Result<std::vector<PsParameter>> ps_parameters(::torch::nn::Module& module) {
  std::vector<PsParameter> parameters;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    auto dtype = capstan_dtype(item.value().scalar_type());
    if (!dtype.ok()) return dtype.status().with_context("parameter '" + item.key() + "'");
    const auto sizes = item.value().sizes();
    parameters.push_back({item.key(), Shape(sizes.begin(), sizes.end()), *dtype, false, false});
  }
  for (const auto& [path, embedding] : embeddings_of(module)) {
    const EmbeddingOptions& options = embedding->options();
    parameters.push_back({weight_name(path),
                          Shape{options.hash_table ? 0 : options.num_embeddings, options.dim},
                          DType::kFloat32, true, options.hash_table});
  }
  return parameters;
}

Result<std::vector<VariableInfo>> create_variables(ClusterCoordinator& cluster, ::torch::nn::Module& module,
                                                   const PsOptions& options) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<PsParameter> parameters, ps_parameters(module));
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<VariableInfo> existing_list, cluster.variables());
  std::map<std::string, VariableInfo> existing;
  for (auto& info : existing_list) existing.emplace(info.name, std::move(info));

  // Check everything before writing anything.
  std::vector<bool> create(parameters.size(), true);
  if (options.embeddings_only) {
    std::erase_if(parameters, [](const PsParameter& p) { return !p.embedding; });
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const PsParameter& p = parameters[i];
    const std::string variable = options.prefix + p.name;
    const Optimizer& optimizer = optimizer_for(p.name, options);
    if (optimizer.kind != Optimizer::Kind::kNone && !takes_gradients(p.dtype)) {
      return Status::InvalidArgument("parameter '" + p.name + "' is " + std::string(dtype_name(p.dtype)) +
                                     ": the parameter servers apply optimizers to float32 and float64 only; "
                                     "convert the module (module->to(torch::kFloat32)) or give it "
                                     "Optimizer::none() in PsOptions::optimizers");
    }
    auto found = existing.find(variable);
    if (found == existing.end()) continue;
    const VariableInfo& info = found->second;
    if (info.embedding_table != p.hash_table || info.dtype != p.dtype || info.shape != p.shape) {
      return Status::AlreadyExists(
          "parameter '" + p.name + "' (" + describe(p.dtype, p.shape) + ") conflicts with the existing " +
          (info.embedding_table ? "embedding table" : "variable") + " '" + variable + "' (" +
          describe(info.dtype, info.shape) +
          "); nothing was created: give the model another PsOptions::prefix, or use the module the "
          "variable was made for");
    }
    create[i] = false;  // a restarted program carries on from the servers' values
  }

  std::map<std::string, ::torch::Tensor> dense;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) dense.emplace(item.key(), item.value());
  std::map<std::string, std::shared_ptr<EmbeddingImpl>> embeddings;
  for (auto& [path, embedding] : embeddings_of(module)) embeddings.emplace(weight_name(path), embedding);

  std::vector<VariableInfo> created;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const PsParameter& p = parameters[i];
    const std::string variable = options.prefix + p.name;
    if (!create[i]) {
      created.push_back(existing.at(variable));
      continue;
    }
    const Optimizer& optimizer = optimizer_for(p.name, options);
    Result<VariableInfo> info = Status::Internal("unreachable");
    if (p.hash_table) {
      const EmbeddingOptions& e = embeddings.at(p.name)->options();
      EmbeddingTableSpec spec;
      spec.name = variable;
      spec.dim = e.dim;
      spec.dtype = DType::kFloat32;
      spec.initializer = e.stddev == 0 ? EmbeddingInitializer::constant(e.mean)
                                       : EmbeddingInitializer::random_normal(e.mean, e.stddev, e.seed);
      spec.optimizer = optimizer;
      info = cluster.create_embedding_table(spec);
    } else {
      VariableSpec spec;
      spec.name = variable;
      spec.optimizer = optimizer;
      spec.partitioner = partitioner_for(p, options);
      if (p.embedding) {
        CAPSTAN_ASSIGN_OR_RETURN(spec.initial, embeddings.at(p.name)->initial_value());
      } else {
        // A copy: the module may go on changing its own values.
        CAPSTAN_ASSIGN_OR_RETURN(spec.initial,
                                 from_torch(dense.at(p.name).detach().contiguous().clone(), "parameter '" + p.name + "'"));
      }
      info = cluster.create_variable(spec);
    }
    if (!info.ok()) return info.status().with_context("creating the variable for parameter '" + p.name + "'");
    created.push_back(std::move(*info));
  }
  return created;
}

// ---- The worker's side: a step ------------------------------------------------------

PsModule::PsModule(::torch::nn::Module& module, PsOptions options)
    : module_(module), options_(std::move(options)) {}

Status PsModule::pull(ClosureContext& ctx, bool training) {
  module_.train(training);
  auto parameters = options_.embeddings_only ? ::torch::OrderedDict<std::string, ::torch::Tensor>()
                                             : module_.named_parameters(/*recurse=*/true);
  std::vector<std::string> variables;
  for (const auto& item : parameters) variables.push_back(options_.prefix + item.key());
  // All of them at once: one round trip, not one per parameter.
  std::vector<Tensor> values;
  if (!variables.empty()) {
    CAPSTAN_ASSIGN_OR_RETURN(values, ctx.read_many(variables));
  }
  if (values.size() != variables.size()) {
    return Status::Internal("read_many answered " + std::to_string(values.size()) + " values for " +
                            std::to_string(variables.size()) + " variables");
  }
  size_t i = 0;
  for (auto& item : parameters) {
    ::torch::Tensor& parameter = item.value();
    const Tensor& value = values[i];
    const std::string& variable = variables[i++];
    CAPSTAN_ASSIGN_OR_RETURN(DType dtype, capstan_dtype(parameter.scalar_type()));
    Shape shape(parameter.sizes().begin(), parameter.sizes().end());
    if (value.dtype() != dtype || value.shape() != shape) {
      return Status::FailedPrecondition("parameter '" + item.key() + "' is " + describe(dtype, shape) +
                                        " but its variable '" + variable + "' holds " +
                                        describe(value.dtype(), value.shape()) +
                                        ": the module changed shape since create_variables; a module "
                                        "keeps its parameters' shapes between steps");
    }
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor view, to_torch(value));
    // The parameter now reads the servers' value in place (no copy); its
    // gradient is cleared, so only this step's backward fills it.
    ::torch::NoGradGuard no_grad;
    parameter.set_data(view);
    parameter.mutable_grad() = ::torch::Tensor();
  }
  for (auto& [path, embedding] : embeddings_of(module_)) {
    embedding->step_ = EmbeddingImpl::Step{&ctx, options_.prefix + weight_name(path), training, {}, {}};
  }
  return Status::Ok();
}

Status PsModule::unbind() {
  for (auto& [path, embedding] : embeddings_of(module_)) embedding->step_ = EmbeddingImpl::Step{};
  for (auto& item : module_.named_parameters(/*recurse=*/true)) item.value().mutable_grad() = ::torch::Tensor();
  return Status::Ok();
}

Status PsModule::push(ClosureContext& ctx, const ApplyOptions& options) {
  // Every gradient is put on the wire before any is pushed: a gradient that
  // cannot be (a layout or dtype the parameter servers do not take) fails
  // the push naming its parameter, and nothing of the step is written.
  struct SparseUpdate {
    std::string variable;
    Tensor ids, rows;
  };
  std::vector<std::string> variables;
  std::vector<Tensor> gradients;
  std::vector<SparseUpdate> sparse;
  Status converted = [&]() -> Status {
    for (auto& item : module_.named_parameters(/*recurse=*/true)) {
      const ::torch::Tensor& gradient = item.value().grad();
      if (!gradient.defined() || options_.embeddings_only) continue;
      const std::string what = "the gradient of parameter '" + item.key() + "'";
      const std::string variable = options_.prefix + item.key();
      try {
        if (gradient.is_sparse()) {
          // torch::nn::Embedding(sparse=true): a COO tensor that may name a
          // row once per use; coalesced, each touched row once, its
          // gradients summed, pushed as the rows it touched (IndexedSlices).
          if (gradient.sparse_dim() != 1) {
            return Status::InvalidArgument(what + " is sparse in " + std::to_string(gradient.sparse_dim()) +
                                           " dimensions; the parameter servers take sparse updates by row "
                                           "(sparse in the first dimension) only");
          }
          ::torch::Tensor coalesced = gradient.coalesce();
          CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, from_torch(coalesced.indices()[0].contiguous(), what + "'s row ids"));
          CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, from_torch(coalesced.values().contiguous(), what + "'s rows"));
          sparse.push_back({variable, std::move(ids), std::move(rows)});
          continue;
        }
        CAPSTAN_ASSIGN_OR_RETURN(Tensor wire, from_torch(gradient.contiguous(), what));
        variables.push_back(variable);
        gradients.push_back(std::move(wire));
      } catch (const std::exception& e) {
        return Status::InvalidArgument(what + ": " + torch_error(e));
      }
    }
    for (auto& [path, embedding] : embeddings_of(module_)) {
      EmbeddingImpl::Step& step = embedding->step_;
      for (size_t i = 0; i < step.rows.size(); ++i) {
        const ::torch::Tensor& gradient = step.rows[i].grad();
        if (!gradient.defined()) continue;
        const std::string what = "the gradient of embedding '" + step.variable + "'";
        try {
          CAPSTAN_ASSIGN_OR_RETURN(Tensor ids, from_torch(step.ids[i], "embedding ids"));
          CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, from_torch(gradient.contiguous(), what));
          sparse.push_back({step.variable, std::move(ids), std::move(rows)});
        } catch (const std::exception& e) {
          return Status::InvalidArgument(what + ": " + torch_error(e));
        }
      }
    }
    return Status::Ok();
  }();
  if (!converted.ok()) {
    (void)unbind();
    return converted;
  }

  Status first;
  auto keep_first = [&first](Status status) {
    if (first.ok() && !status.ok()) first = std::move(status);
  };
  if (!variables.empty()) {
    keep_first(ctx.apply_gradients_many(variables, gradients, options).with_context("pushing the module's gradients"));
  }
  for (const SparseUpdate& update : sparse) {
    keep_first(ctx.apply_sparse_gradients(update.variable, update.ids, update.rows, options)
                   .with_context("pushing the sparse gradient of '" + update.variable + "'"));
  }
  Status unbound = unbind();
  return first.ok() ? unbound : first;
}

Result<::torch::Tensor> PsModule::train_step(ClosureContext& ctx, const std::function<::torch::Tensor()>& loss,
                                             const ApplyOptions& options) {
  if (Status pulled = pull(ctx, /*training=*/true); !pulled.ok()) {
    (void)unbind();
    return pulled;
  }
  ::torch::Tensor value;
  try {
    ::torch::Tensor computed = loss();
    if (!computed.defined() || computed.numel() != 1) {
      std::ostringstream shape;
      if (computed.defined()) shape << computed.sizes();
      (void)unbind();
      return Status::InvalidArgument("train_step: the loss has shape " +
                                     (computed.defined() ? shape.str() : std::string("(undefined)")) +
                                     "; it must be one value (reduce it, e.g. with .mean())");
    }
    computed.backward();
    value = computed.detach();
  } catch (const std::exception& e) {
    (void)unbind();
    return Status::InvalidArgument("train_step: " + torch_error(e));
  }
  CAPSTAN_RETURN_IF_ERROR(push(ctx, options));
  return value;
}

Result<::torch::Tensor> PsModule::eval_step(ClosureContext& ctx, const std::function<::torch::Tensor()>& fn) {
  if (Status pulled = pull(ctx, /*training=*/false); !pulled.ok()) {
    (void)unbind();
    return pulled;
  }
  ::torch::Tensor value;
  try {
    ::torch::NoGradGuard no_grad;
    value = fn();
  } catch (const std::exception& e) {
    (void)unbind();
    return Status::InvalidArgument("eval_step: " + torch_error(e));
  }
  (void)unbind();
  return value;
}

}  // namespace capstan::torch
