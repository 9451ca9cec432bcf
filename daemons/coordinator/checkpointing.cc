#include "daemons/coordinator/checkpointing.h"

#include <cstring>

#include "training/optimizer.h"

namespace capstan::coordinator {
namespace {

// Rows `index` of `t` (rank >= 1), in that order.
Result<Tensor> take_rows(const Tensor& t, const std::vector<int64_t>& index) {
  Shape shape = t.shape();
  const int64_t n = shape.empty() ? 0 : shape[0];
  shape[0] = static_cast<int64_t>(index.size());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(t.dtype(), shape));
  const size_t row_bytes = n == 0 ? 0 : t.byte_size() / static_cast<size_t>(n);
  for (size_t i = 0; i < index.size(); ++i) {
    std::memcpy(out.mutable_data() + i * row_bytes, t.data() + static_cast<size_t>(index[i]) * row_bytes, row_bytes);
  }
  return out;
}

// Every row of a table checkpointed as variable `saved`, from all its shards.
Result<ps::TableRows> read_table(const checkpoint::CheckpointReader& reader, const checkpoint::ManifestVariable& saved) {
  std::vector<ps::TableRows> parts;
  for (const auto& shard : saved.shards) {
    CAPSTAN_ASSIGN_OR_RETURN(const checkpoint::SafetensorsReader* file, reader.file(shard.file));
    ps::TableRows rows;
    CAPSTAN_ASSIGN_OR_RETURN(rows.keys, file->read(checkpoint::table_keys_tensor_name(shard.name)));
    CAPSTAN_ASSIGN_OR_RETURN(rows.values, file->read(shard.name));
    CAPSTAN_ASSIGN_OR_RETURN(rows.meta, file->read(checkpoint::table_meta_tensor_name(shard.name)));
    for (const auto& slot : saved.slots) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, file->read(checkpoint::slot_tensor_name(shard.name, slot)));
      rows.slots.push_back(std::move(t));
    }
    const Shape rows_shape{shard.rows};
    const Shape values_shape{shard.rows, saved.table->dim};
    bool ok = rows.keys.dtype() == DType::kInt64 && rows.keys.shape() == rows_shape &&
              rows.values.dtype() == saved.dtype && rows.values.shape() == values_shape &&
              rows.meta.dtype() == DType::kInt64 && rows.meta.shape() == Shape{shard.rows, ps::kMetaColumns};
    for (const auto& t : rows.slots) ok = ok && t.dtype() == saved.dtype && t.shape() == values_shape;
    if (!ok) {
      return Status::DataLoss("checkpoint " + reader.path() + ": table shard '" + shard.name + "' in " + shard.file +
                              " does not match its manifest entry (" + std::to_string(shard.rows) + " rows of " +
                              std::to_string(saved.table->dim) + ")");
    }
    parts.push_back(std::move(rows));
  }
  if (parts.size() == 1) return std::move(parts[0]);
  // Concatenated, shard after shard.
  auto concat = [](const std::vector<const Tensor*>& pieces) -> Result<Tensor> {
    Shape shape = pieces.front()->shape();
    int64_t n = 0;
    for (const Tensor* p : pieces) n += p->shape()[0];
    shape[0] = n;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(pieces.front()->dtype(), shape));
    size_t at = 0;
    for (const Tensor* p : pieces) {
      if (p->byte_size() > 0) std::memcpy(out.mutable_data() + at, p->data(), p->byte_size());
      at += p->byte_size();
    }
    return out;
  };
  auto column = [&](auto member) {
    std::vector<const Tensor*> out;
    for (const auto& p : parts) out.push_back(member(p));
    return out;
  };
  ps::TableRows all;
  if (parts.empty()) {
    CAPSTAN_ASSIGN_OR_RETURN(all.keys, Tensor::zeros(DType::kInt64, {0}));
    CAPSTAN_ASSIGN_OR_RETURN(all.values, Tensor::zeros(saved.dtype, {0, saved.table->dim}));
    CAPSTAN_ASSIGN_OR_RETURN(all.meta, Tensor::zeros(DType::kInt64, {0, ps::kMetaColumns}));
    for (size_t i = 0; i < saved.slots.size(); ++i) all.slots.push_back(all.values);
    return all;
  }
  CAPSTAN_ASSIGN_OR_RETURN(all.keys, concat(column([](const ps::TableRows& p) { return &p.keys; })));
  CAPSTAN_ASSIGN_OR_RETURN(all.values, concat(column([](const ps::TableRows& p) { return &p.values; })));
  CAPSTAN_ASSIGN_OR_RETURN(all.meta, concat(column([](const ps::TableRows& p) { return &p.meta; })));
  for (size_t i = 0; i < saved.slots.size(); ++i) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, concat(column([i](const ps::TableRows& p) { return &p.slots[i]; })));
    all.slots.push_back(std::move(t));
  }
  return all;
}

// The rows of `all` whose keys the table's shard `part` (of `parts`) holds.
Result<ps::TableRows> rows_of_shard(const ps::TableRows& all, int part, int parts) {
  std::vector<int64_t> index;
  auto keys = all.keys.flat<int64_t>();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (table_shard_of(keys[i], parts) == part) index.push_back(static_cast<int64_t>(i));
  }
  ps::TableRows out;
  CAPSTAN_ASSIGN_OR_RETURN(out.keys, take_rows(all.keys, index));
  CAPSTAN_ASSIGN_OR_RETURN(out.values, take_rows(all.values, index));
  CAPSTAN_ASSIGN_OR_RETURN(out.meta, take_rows(all.meta, index));
  for (const auto& slot : all.slots) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, take_rows(slot, index));
    out.slots.push_back(std::move(t));
  }
  return out;
}

Status read_table_into(const checkpoint::CheckpointReader& reader, const checkpoint::ManifestVariable& saved,
                       VariableState* v) {
  if (!saved.table) {
    return Status::InvalidArgument("'" + v->name + "' is an embedding table but the checkpoint has a variable " +
                                   std::string(dtype_name(saved.dtype)) + shape_string(saved.shape) + " of that name");
  }
  if (saved.dtype != v->dtype || saved.table->dim != v->table->dim) {
    return Status::InvalidArgument("embedding table '" + v->name + "' is " + std::string(dtype_name(v->dtype)) +
                                   "[*, " + std::to_string(v->table->dim) + "] but the checkpoint has " +
                                   std::string(dtype_name(saved.dtype)) + "[*, " + std::to_string(saved.table->dim) +
                                   "]");
  }
  if (saved.slots != training::slot_names(v->optimizer.kind)) {
    return Status::InvalidArgument("embedding table '" + v->name + "' uses " + optimizer_name(v->optimizer.kind) +
                                   " but the checkpoint's has other optimizer slots");
  }
  CAPSTAN_ASSIGN_OR_RETURN(ps::TableRows all, read_table(reader, saved));
  for (auto& s : v->shards) {
    CAPSTAN_ASSIGN_OR_RETURN(s.table_rows, rows_of_shard(all, s.ps_task, v->table_shards));
    s.step = saved.optimizer_step;
    s.version = saved.table->generation;
  }
  v->generation = saved.table->generation;
  return Status::Ok();
}

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

Result<std::string> write_checkpoint(const std::string& dir, int64_t step, int max_to_keep,
                                     const std::vector<VariableState>& variables,
                                     const std::map<std::string, std::string>& iterators, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, checkpoint::CheckpointWriter::begin(dir, step, max_to_keep, fs));
  std::map<int, std::vector<std::pair<std::string, Tensor>>> files;  // ps task -> tensors
  checkpoint::Manifest manifest;
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
        std::string file = "ps-" + std::to_string(s.ps_task) + ".safetensors";
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

Result<std::string> resolve_checkpoint(const std::string& path, io::FileSystem& fs) {
  if (fs.stat(io::join_path(path, checkpoint::kManifestFileName)).ok()) return path;
  Result<io::FileInfo> info = fs.stat(path);
  if (!info.ok() || !info->is_directory) {
    return Status::NotFound("no checkpoint at '" + path + "'");
  }
  return checkpoint::latest_checkpoint(path, fs);
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
    if (v.table) {
      CAPSTAN_RETURN_IF_ERROR(read_table_into(reader, *saved, &v));
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
