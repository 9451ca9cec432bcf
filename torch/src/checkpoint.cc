// Loading a Capstan checkpoint into a torch::nn::Module without a cluster
// (capstan::torch::load_checkpoint), over the SDK's capstan::CheckpointReader.
#include <map>
#include <memory>
#include <set>

#include "capstan/checkpoint.h"
#include "capstan/torch.h"

namespace capstan::torch {
namespace {

std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + shape_string(shape);
}

// "a, b, c (and 7 more)": enough of a list to spot a wrong prefix.
std::string some_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i == 0 ? "'" : ", '") + names[i] + "'";
  if (names.size() > kShown) out += " (and " + std::to_string(names.size() - kShown) + " more)";
  return names.empty() ? "none" : out;
}

// What one parameter receives.
struct Planned {
  PsParameter parameter;
  std::string variable;
};

// What one buffer receives.
struct PlannedBuffer {
  std::string name;  // named_buffers()'
  std::string variable;
  ::torch::Tensor buffer;
};

}  // namespace

Result<LoadedCheckpoint> load_checkpoint(::torch::nn::Module& module, const std::string& path,
                                         const LoadCheckpointOptions& options) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<PsParameter> parameters, ps_parameters(module));
  std::set<std::string> names;
  for (const auto& parameter : parameters) names.insert(parameter.name);
  for (const auto& name : options.allow_missing) {
    if (names.count(name) == 0) {
      std::vector<std::string> all(names.begin(), names.end());
      return Status::InvalidArgument("LoadCheckpointOptions::allow_missing names '" + name +
                                     "', which is no parameter of the module (its parameters, without the "
                                     "prefix: " + some_names(all) + ")");
    }
  }
  const std::set<std::string> allowed(options.allow_missing.begin(), options.allow_missing.end());

  auto opened = CheckpointReader::open(path);
  if (!opened.ok()) return opened.status().with_context("loading a checkpoint into a module");
  const CheckpointReader& reader = **opened;

  LoadedCheckpoint result;
  result.path = reader.path();
  result.step = reader.step();
  std::vector<std::string> under_prefix;
  for (const auto& variable : reader.variables()) {
    if (variable.name.starts_with(options.prefix)) under_prefix.push_back(variable.name);
  }

  // Everything is checked before anything is copied.
  std::vector<Planned> plan;
  for (const auto& parameter : parameters) {
    const std::string name = options.prefix + parameter.name;
    const CheckpointVariable* variable = reader.find_variable(name);
    const bool may_miss = !options.strict || allowed.count(parameter.name) != 0;
    if (variable == nullptr) {
      if (!may_miss) {
        return Status::NotFound("checkpoint " + reader.path() + " has no variable '" + name + "' for parameter '" +
                                parameter.name + "' (its variables under prefix '" + options.prefix +
                                "': " + some_names(under_prefix) +
                                "); set LoadCheckpointOptions::prefix to the prefix create_variables was given, "
                                "or list the parameter in allow_missing");
      }
      result.missing.push_back(parameter.name);
      continue;
    }
    if (parameter.hash_table || variable->embedding_table) {
      if (allowed.count(parameter.name) != 0) {
        result.missing.push_back(parameter.name);
        continue;
      }
      return Status::FailedPrecondition(
          "parameter '" + parameter.name + "': variable '" + name + "' of checkpoint " + reader.path() +
          (variable->embedding_table ? " is a dynamic embedding table" : " is dense but the module's embedding is a hash table") +
          ", which cannot be loaded into a module yet; list '" + parameter.name +
          "' in LoadCheckpointOptions::allow_missing (its rows keyed by id come out with "
          "ClusterCoordinator::export_embedding_table)");
    }
    if (variable->dtype != parameter.dtype || variable->shape != parameter.shape) {
      const bool dtype_differs = variable->dtype != parameter.dtype;
      return Status::InvalidArgument(
          "parameter '" + parameter.name + "' is " + describe(parameter.dtype, parameter.shape) + " but variable '" +
          name + "' of checkpoint " + reader.path() + " is " + describe(variable->dtype, variable->shape) +
          (dtype_differs ? "; convert the module to the checkpoint's dtype first (module.to(...))"
                         : "; build the module with the sizes it was trained with"));
    }
    plan.push_back(Planned{parameter, name});
  }
  std::vector<PlannedBuffer> buffer_plan;
  std::set<std::string> buffer_names;
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    buffer_names.insert(item.key());
    if (!item.value().defined()) continue;
    const std::string name = options.prefix + item.key();
    const CheckpointVariable* variable = reader.find_variable(name);
    if (variable == nullptr) {
      result.missing_buffers.push_back(item.key());
      continue;
    }
    auto dtype = capstan_dtype(item.value().scalar_type());
    if (!dtype.ok()) return dtype.status().with_context("buffer '" + item.key() + "'");
    const Shape shape(item.value().sizes().begin(), item.value().sizes().end());
    if (variable->embedding_table || variable->dtype != *dtype || variable->shape != shape) {
      return Status::InvalidArgument("buffer '" + item.key() + "' is " + describe(*dtype, shape) + " but variable '" +
                                     name + "' of checkpoint " + reader.path() + " is " +
                                     (variable->embedding_table ? std::string("an embedding table")
                                                                : describe(variable->dtype, variable->shape)) +
                                     "; build the module as it was trained");
    }
    buffer_plan.push_back(PlannedBuffer{item.key(), name, item.value()});
  }
  for (const auto& name : under_prefix) {
    const std::string key = name.substr(options.prefix.size());
    if (names.count(key) == 0 && buffer_names.count(key) == 0) result.unexpected.push_back(name);
  }

  // Read every value first, so that a read error leaves the module as it was.
  std::vector<::torch::Tensor> values;
  values.reserve(plan.size());
  for (const auto& planned : plan) {
    auto value = reader.read_variable(planned.variable);
    if (!value.ok()) return value.status().with_context("parameter '" + planned.parameter.name + "'");
    auto view = to_torch(*value);
    if (!view.ok()) return view.status().with_context("parameter '" + planned.parameter.name + "'");
    values.push_back(std::move(*view));
  }
  std::vector<::torch::Tensor> buffer_values;
  for (const auto& planned : buffer_plan) {
    auto value = reader.read_variable(planned.variable);
    if (!value.ok()) return value.status().with_context("buffer '" + planned.name + "'");
    auto view = to_torch(*value);
    if (!view.ok()) return view.status().with_context("buffer '" + planned.name + "'");
    buffer_values.push_back(std::move(*view));
  }

  std::map<std::string, std::shared_ptr<EmbeddingImpl>> embeddings;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto embedding = std::dynamic_pointer_cast<EmbeddingImpl>(item.value())) {
      embeddings[item.key().empty() ? "weight" : item.key() + ".weight"] = std::move(embedding);
    }
  }
  auto dense = module.named_parameters(/*recurse=*/true);
  ::torch::NoGradGuard no_grad;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PsParameter& parameter = plan[i].parameter;
    if (parameter.embedding) {
      // Checked above: float32 [num_embeddings, dim], as set_local_rows wants.
      CAPSTAN_RETURN_IF_ERROR(embeddings.at(parameter.name)->set_local_rows(values[i]));
    } else {
      dense[parameter.name].copy_(values[i]);
    }
    result.loaded.push_back(parameter.name);
  }
  for (size_t i = 0; i < buffer_plan.size(); ++i) {
    buffer_plan[i].buffer.copy_(buffer_values[i]);
    result.buffers.push_back(buffer_plan[i].name);
  }
  return result;
}

}  // namespace capstan::torch
