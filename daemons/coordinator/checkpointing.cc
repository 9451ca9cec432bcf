#include "daemons/coordinator/checkpointing.h"

#include <cstring>

#include "checkpoint/shard_files.h"
#include "training/optimizer.h"

namespace capstan::coordinator {
namespace {

// The file of the coordinator's own tensors (the strategies' mirrored
// variables: shards whose ps_task is < 0) or of parameter server `task`.
std::string file_of(int task) { return task < 0 ? std::string(kMirroredFile) : checkpoint::ps_file_name(task); }

}  // namespace

std::string iterator_tensor_name(const std::string& dataset_name, int64_t dataset_id, int task_index) {
  return "iterator/" + (dataset_name.empty() ? "#" + std::to_string(dataset_id) : dataset_name) + "/worker-" +
         std::to_string(task_index);
}

Result<int64_t> write_table_export(const VariableState& state, const std::string& path, io::FileSystem& fs) {
  int64_t n = 0;
  for (const auto& s : state.shards) n += s.table_rows.keys.num_elements();
  const int64_t dim = state.table->dim;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor k, Tensor::uninitialized(DType::kInt64, {n}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor v, Tensor::uninitialized(state.dtype, {n, dim}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor m, Tensor::uninitialized(DType::kInt64, {n, ps::kMetaColumns}));
  size_t at_k = 0, at_v = 0, at_m = 0;
  for (const auto& s : state.shards) {
    const ps::TableRows& r = s.table_rows;
    if (r.keys.byte_size() > 0) std::memcpy(k.mutable_data() + at_k, r.keys.data(), r.keys.byte_size());
    if (r.values.byte_size() > 0) std::memcpy(v.mutable_data() + at_v, r.values.data(), r.values.byte_size());
    if (r.meta.byte_size() > 0) std::memcpy(m.mutable_data() + at_m, r.meta.data(), r.meta.byte_size());
    at_k += r.keys.byte_size();
    at_v += r.values.byte_size();
    at_m += r.meta.byte_size();
  }
  if (at_k != k.byte_size() || at_v != v.byte_size() || at_m != m.byte_size()) {
    return Status::Internal("export of table '" + state.name + "': the parameter servers' rows disagree in size");
  }
  CAPSTAN_RETURN_IF_ERROR(checkpoint::write_safetensors(
      path, {{"keys", k}, {"values", v}, {"meta", m}},
      {{"capstan.table", state.name}, {"capstan.dim", std::to_string(dim)}}, fs));
  return n;
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

Status add_files(checkpoint::CheckpointWriter& writer, const std::vector<VariableState>& variables,
                 const std::map<std::string, std::string>& iterators, checkpoint::Manifest* out) {
  std::map<int, std::vector<std::pair<std::string, Tensor>>> files;  // ps task -> tensors
  checkpoint::Manifest& manifest = *out;
  for (const auto& v : variables) {
    checkpoint::ManifestVariable mv;
    mv.name = v.name;
    mv.dtype = v.dtype;
    mv.shape = v.shape;
    mv.optimizer = v.optimizer;
    if (v.table) {
      mv.table = checkpoint::ManifestTable{v.table->dim, v.table->initializer, v.table->options, v.generation};
      mv.slots = training::slot_names(v.optimizer.kind);
      int64_t first_row = 0;
      for (const auto& s : v.shards) {
        std::string file = file_of(s.ps_task);
        const int64_t rows = s.table_rows.keys.num_elements();
        mv.partitioning.push_back(rows);
        mv.shards.push_back({s.name, file, first_row, rows});
        first_row += rows;
        auto& out = files[s.ps_task];
        out.emplace_back(s.name, s.table_rows.values);
        out.emplace_back(checkpoint::table_keys_tensor_name(s.name), s.table_rows.keys);
        out.emplace_back(checkpoint::table_meta_tensor_name(s.name), s.table_rows.meta);
        for (size_t i = 0; i < mv.slots.size() && i < s.table_rows.slots.size(); ++i) {
          out.emplace_back(checkpoint::slot_tensor_name(s.name, mv.slots[i]), s.table_rows.slots[i]);
        }
        mv.optimizer_step = std::max(mv.optimizer_step, s.step);
      }
      mv.shape = {first_row, v.table->dim};
      manifest.variables.push_back(std::move(mv));
      continue;
    }
    for (const auto& s : v.shards) {
      std::string file = file_of(s.ps_task);
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
    CAPSTAN_RETURN_IF_ERROR(writer.add_file(file_of(task), tensors, {{"capstan.file", file_of(task)}}));
  }
  if (!iterators.empty()) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, state] : iterators) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(state.size())}));
      std::memcpy(t.mutable_data(), state.data(), state.size());
      tensors.emplace_back(name, std::move(t));
    }
    CAPSTAN_RETURN_IF_ERROR(writer.add_file(kIteratorsFile, tensors, {{"capstan.content", "iterator positions"}}));
  }
  return Status::Ok();
}

Result<std::string> write_checkpoint(const std::string& dir, int64_t step, int max_to_keep,
                                     const std::vector<VariableState>& variables,
                                     const std::map<std::string, std::string>& iterators, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, checkpoint::CheckpointWriter::begin(dir, step, max_to_keep, fs));
  checkpoint::Manifest manifest;
  CAPSTAN_RETURN_IF_ERROR(add_files(*writer, variables, iterators, &manifest));
  std::string path = writer->checkpoint_path();
  CAPSTAN_RETURN_IF_ERROR(writer->commit(std::move(manifest)));
  return path;
}

Result<std::string> resolve_checkpoint(const std::string& path, io::FileSystem& fs) {
  if (fs.stat(io::join_path(path, checkpoint::kManifestFileName)).ok()) return path;
  Result<io::FileInfo> info = fs.stat(path);
  if (!info.ok() || !info->is_directory) {
    return Status::NotFound("no checkpoint at '" + path + "'");
  }
  return checkpoint::latest_checkpoint(path, fs);
}

Status match_checkpoint(const checkpoint::Manifest& manifest, std::vector<VariableState>* variables, bool strict,
                        std::vector<std::string>* not_in_checkpoint) {
  not_in_checkpoint->clear();
  std::vector<VariableState> present;
  for (auto& v : *variables) {
    if (manifest.find_variable(v.name) == nullptr) {
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
    const auto* saved = manifest.find_variable(v.name);
    if (v.table) {
      if (!saved->table) {
        return Status::InvalidArgument("'" + v.name + "' is an embedding table but the checkpoint has a variable " +
                                       std::string(dtype_name(saved->dtype)) + shape_string(saved->shape) +
                                       " of that name");
      }
      if (saved->dtype != v.dtype || saved->table->dim != v.table->dim) {
        return Status::InvalidArgument("embedding table '" + v.name + "' is " + std::string(dtype_name(v.dtype)) +
                                       "[*, " + std::to_string(v.table->dim) + "] but the checkpoint has " +
                                       std::string(dtype_name(saved->dtype)) + "[*, " +
                                       std::to_string(saved->table->dim) + "]");
      }
      if (saved->slots != training::slot_names(v.optimizer.kind)) {
        return Status::InvalidArgument("embedding table '" + v.name + "' uses " + optimizer_name(v.optimizer.kind) +
                                       " but the checkpoint's has other optimizer slots");
      }
      continue;
    }
    if (saved->table) {
      return Status::InvalidArgument("variable '" + v.name + "' is " + std::string(dtype_name(v.dtype)) +
                                     shape_string(v.shape) + " but the checkpoint has an embedding table of that name");
    }
    if (saved->dtype != v.dtype || saved->shape != v.shape) {
      return Status::InvalidArgument("variable '" + v.name + "' is " + std::string(dtype_name(v.dtype)) +
                                     shape_string(v.shape) + " but the checkpoint has " +
                                     std::string(dtype_name(saved->dtype)) + shape_string(saved->shape));
    }
  }
  return Status::Ok();
}

}  // namespace capstan::coordinator
