#include "daemons/coordinator/checkpointing.h"

#include <cstring>
#include <filesystem>

namespace capstan::coordinator {

std::string iterator_tensor_name(const std::string& dataset_name, int64_t dataset_id, int task_index) {
  return "iterator/" + (dataset_name.empty() ? "#" + std::to_string(dataset_id) : dataset_name) + "/worker-" +
         std::to_string(task_index);
}

Result<std::map<std::string, std::string>> read_iterator_states(const checkpoint::CheckpointReader& reader) {
  std::map<std::string, std::string> states;
  bool listed = false;
  for (const auto& f : reader.manifest().files) listed = listed || f.name == kIteratorsFile;
  if (!listed) return states;
  CAPSTAN_ASSIGN_OR_RETURN(const checkpoint::SafetensorsReader* file, reader.file(kIteratorsFile));
  for (const auto& name : file->names()) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, file->read(name));
    if (t.dtype() != DType::kUInt8 || t.rank() != 1) {
      return Status::DataLoss("checkpoint " + reader.path() + ": " + kIteratorsFile + " tensor '" + name +
                              "' is not a 1-D uint8 tensor");
    }
    states[name] = std::string(reinterpret_cast<const char*>(t.data()), t.byte_size());
  }
  return states;
}

Result<std::string> write_checkpoint(const std::string& dir, int64_t step, int max_to_keep,
                                     const std::vector<VariableState>& variables,
                                     const std::map<std::string, std::string>& iterators) {
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, checkpoint::CheckpointWriter::begin(dir, step, max_to_keep));
  std::map<int, std::vector<std::pair<std::string, Tensor>>> files;  // ps task -> tensors
  checkpoint::Manifest manifest;
  for (const auto& v : variables) {
    checkpoint::ManifestVariable mv;
    mv.name = v.name;
    mv.dtype = v.dtype;
    mv.shape = v.shape;
    mv.optimizer = v.optimizer;
    for (const auto& s : v.shards) {
      std::string file = "ps-" + std::to_string(s.ps_task) + ".safetensors";
      mv.partitioning.push_back(s.rows);
      mv.shards.push_back({s.name, file, s.first_row, s.rows});
      files[s.ps_task].emplace_back(s.name, s.value);
      for (const auto& [slot, tensor] : s.slots) {
        files[s.ps_task].emplace_back(checkpoint::slot_tensor_name(s.name, slot), tensor);
      }
      mv.optimizer_step = std::max(mv.optimizer_step, s.step);
    }
    if (!v.shards.empty()) {
      for (const auto& [slot, tensor] : v.shards.front().slots) mv.slots.push_back(slot);
    }
    manifest.variables.push_back(std::move(mv));
  }
  for (const auto& [task, tensors] : files) {
    CAPSTAN_RETURN_IF_ERROR(writer->add_file("ps-" + std::to_string(task) + ".safetensors", tensors,
                                             {{"capstan.ps_task", std::to_string(task)}}));
  }
  if (!iterators.empty()) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, state] : iterators) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(state.size())}));
      std::memcpy(t.mutable_data(), state.data(), state.size());
      tensors.emplace_back(name, std::move(t));
    }
    CAPSTAN_RETURN_IF_ERROR(writer->add_file(kIteratorsFile, tensors, {{"capstan.content", "iterator positions"}}));
  }
  std::string path = writer->checkpoint_path();
  CAPSTAN_RETURN_IF_ERROR(writer->commit(std::move(manifest)));
  return path;
}

Result<std::string> resolve_checkpoint(const std::string& path) {
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json")) return path;
  if (!std::filesystem::is_directory(path)) {
    return Status::NotFound("no checkpoint at '" + path + "'");
  }
  return checkpoint::latest_checkpoint(path);
}

Status read_into(const checkpoint::CheckpointReader& reader, std::vector<VariableState>* variables, bool strict,
                 std::vector<std::string>* not_in_checkpoint) {
  not_in_checkpoint->clear();
  std::vector<VariableState> present;
  for (auto& v : *variables) {
    if (reader.manifest().find_variable(v.name) == nullptr) {
      not_in_checkpoint->push_back(v.name);
    } else {
      present.push_back(std::move(v));
    }
  }
  *variables = std::move(present);
  if (strict && !not_in_checkpoint->empty()) {
    std::string names;
    for (const auto& n : *not_in_checkpoint) names += (names.empty() ? "'" : ", '") + n + "'";
    return Status::NotFound("the checkpoint has no variable " + names +
                            " (strict restore; the default restores the variables it has and leaves these as they are)");
  }
  for (auto& v : *variables) {
    const auto* saved = reader.manifest().find_variable(v.name);
    if (saved->dtype != v.dtype || saved->shape != v.shape) {
      return Status::InvalidArgument("variable '" + v.name + "' is " + std::string(dtype_name(v.dtype)) +
                                     shape_string(v.shape) + " but the checkpoint has " +
                                     std::string(dtype_name(saved->dtype)) + shape_string(saved->shape));
    }
    for (auto& s : v.shards) {
      bool scalar = v.shape.empty();
      if (scalar) {
        CAPSTAN_ASSIGN_OR_RETURN(s.value, reader.read_variable(v.name));
      } else {
        CAPSTAN_ASSIGN_OR_RETURN(s.value, reader.read_variable_rows(v.name, s.first_row, s.first_row + s.rows));
      }
      s.slots.clear();
      for (const auto& slot : saved->slots) {
        Tensor t;
        if (scalar) {
          CAPSTAN_ASSIGN_OR_RETURN(t, reader.read_slot(v.name, slot));
        } else {
          CAPSTAN_ASSIGN_OR_RETURN(t, reader.read_slot_rows(v.name, slot, s.first_row, s.first_row + s.rows));
        }
        s.slots[slot] = std::move(t);
      }
      s.step = saved->optimizer_step;
    }
  }
  return Status::Ok();
}

}  // namespace capstan::coordinator
