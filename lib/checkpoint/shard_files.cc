#include "checkpoint/shard_files.h"

#include <cstring>

#include "capstan/training.h"
#include "checkpoint/safetensors.h"

namespace capstan::checkpoint {
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

// `pieces` one after another along dimension 0 (all of `like`'s dtype and
// row shape; `like` gives them when there is none).
Result<Tensor> concat_rows(const std::vector<Tensor>& pieces, DType dtype, Shape row_shape) {
  int64_t n = 0;
  for (const Tensor& p : pieces) n += p.shape()[0];
  Shape shape{n};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, shape));
  size_t at = 0;
  for (const Tensor& p : pieces) {
    if (p.byte_size() > 0) std::memcpy(out.mutable_data() + at, p.data(), p.byte_size());
    at += p.byte_size();
  }
  return out;
}

// Every row of one saved table shard, checked against the manifest.
Result<ps::TableRows> read_table_shard(const CheckpointReader& reader, const ManifestVariable& saved,
                                       const ManifestShard& shard) {
  CAPSTAN_ASSIGN_OR_RETURN(const SafetensorsReader* file, reader.file(shard.file));
  ps::TableRows rows;
  CAPSTAN_ASSIGN_OR_RETURN(rows.keys, file->read(table_keys_tensor_name(shard.name)));
  CAPSTAN_ASSIGN_OR_RETURN(rows.values, file->read(shard.name));
  CAPSTAN_ASSIGN_OR_RETURN(rows.meta, file->read(table_meta_tensor_name(shard.name)));
  for (const auto& slot : saved.slots) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, file->read(slot_tensor_name(shard.name, slot)));
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
  return rows;
}

// The rows of `all` whose keys part `part` of `parts` holds.
Result<ps::TableRows> rows_of_part(const ps::TableRows& all, int part, int parts) {
  std::vector<int64_t> index;
  auto keys = all.keys.flat<int64_t>();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (table_shard_of(keys[i], parts) == part) index.push_back(static_cast<int64_t>(i));
  }
  if (index.size() == keys.size()) return all;
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

}  // namespace

Status check_save_directory(const std::string& directory, const std::string& what, io::FileSystem& fs) {
  std::string name = directory;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  const size_t slash = name.rfind('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  constexpr std::string_view kTmp = ".tmp";
  if (!name.ends_with(kTmp) || !checkpoint_step(name.substr(0, name.size() - kTmp.size()))) {
    return Status::InvalidArgument(what + ": '" + directory +
                                   "' is not a checkpoint being saved (a directory <dir>/ckpt-<step>.tmp)");
  }
  Result<io::FileInfo> info = fs.stat(directory);
  if (!info.ok() || !info->is_directory) {
    return Status::NotFound(what + ": the checkpoint directory '" + directory +
                            "' does not exist here: checkpoint_dir must be a directory every parameter server and "
                            "worker reaches at the same path (a shared file system)");
  }
  return Status::Ok();
}

std::string ps_file_name(int task) { return "ps-" + std::to_string(task) + ".safetensors"; }

bool is_ps_file_name(const std::string& name) {
  constexpr std::string_view kPrefix = "ps-", kSuffix = ".safetensors";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) || !name.ends_with(kSuffix)) {
    return false;
  }
  std::string_view digits(name.data() + kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 9) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

Result<ManifestFile> write_shard_file(const std::string& directory, const std::string& file,
                                      const std::vector<ShardTensors>& shards,
                                      const std::vector<TableShardTensors>& tables, io::FileSystem& fs) {
  if (!is_ps_file_name(file)) {
    return Status::InvalidArgument("a parameter server's checkpoint file is named ps-<task>.safetensors, not '" +
                                   file + "'");
  }
  const std::string path = io::join_path(directory, file);
  if (fs.stat(path).ok()) {
    return Status::AlreadyExists("checkpoint file '" + path + "' exists: another save of this step wrote it");
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& s : shards) {
    tensors.emplace_back(s.name, s.value);
    for (const auto& [slot, t] : s.slots) tensors.emplace_back(slot_tensor_name(s.name, slot), t);
  }
  for (const auto& t : tables) {
    tensors.emplace_back(t.name, t.rows.values);
    tensors.emplace_back(table_keys_tensor_name(t.name), t.rows.keys);
    tensors.emplace_back(table_meta_tensor_name(t.name), t.rows.meta);
    for (size_t i = 0; i < t.slots.size() && i < t.rows.slots.size(); ++i) {
      tensors.emplace_back(slot_tensor_name(t.name, t.slots[i]), t.rows.slots[i]);
    }
  }
  // Checksummed as it is written: the file is not read back.
  uint32_t crc = 0;
  CAPSTAN_RETURN_IF_ERROR(write_safetensors(path, tensors, {{"capstan.file", file}}, fs, &crc));
  CAPSTAN_ASSIGN_OR_RETURN(io::FileInfo info, fs.stat(path));
  return ManifestFile{file, info.size, crc};
}

Result<ShardTensors> read_shard_rows(const CheckpointReader& reader, const std::string& variable,
                                     int64_t first_row, int64_t rows, bool with_slots) {
  const ManifestVariable* saved = reader.manifest().find_variable(variable);
  if (saved == nullptr) return Status::NotFound("checkpoint " + reader.path() + " has no variable '" + variable + "'");
  if (saved->table) {
    return Status::InvalidArgument("checkpoint " + reader.path() + ": '" + variable +
                                   "' is an embedding table, not a variable");
  }
  ShardTensors out;
  out.step = saved->optimizer_step;
  const bool scalar = saved->shape.empty();
  if (scalar) {
    if (first_row != 0 || rows != 1) {
      return Status::InvalidArgument("variable '" + variable + "' is a scalar: restore it whole (rows [0, 1))");
    }
    CAPSTAN_ASSIGN_OR_RETURN(out.value, reader.read_variable(variable));
  } else {
    CAPSTAN_ASSIGN_OR_RETURN(out.value, reader.read_variable_rows(variable, first_row, first_row + rows));
  }
  if (!with_slots) return out;
  for (const auto& slot : saved->slots) {
    Tensor t;
    if (scalar) {
      CAPSTAN_ASSIGN_OR_RETURN(t, reader.read_slot(variable, slot));
    } else {
      CAPSTAN_ASSIGN_OR_RETURN(t, reader.read_slot_rows(variable, slot, first_row, first_row + rows));
    }
    out.slots.emplace_back(slot, std::move(t));
  }
  return out;
}

Result<ps::TableRows> read_table_part(const CheckpointReader& reader, const ManifestVariable& saved, int part,
                                      int parts) {
  if (!saved.table) {
    return Status::InvalidArgument("checkpoint " + reader.path() + ": '" + saved.name + "' is not an embedding table");
  }
  if (parts < 1 || part < 0 || part >= parts) {
    return Status::InvalidArgument("table part " + std::to_string(part) + " of " + std::to_string(parts) +
                                   " is out of range");
  }
  // Saved on as many parts: key k was in saved part table_shard_of(k, parts)
  // already, so this part's rows are all in saved shard `part`.
  const bool same_split = saved.shards.size() == static_cast<size_t>(parts);
  std::vector<ps::TableRows> kept;
  for (size_t i = 0; i < saved.shards.size(); ++i) {
    if (same_split && i != static_cast<size_t>(part)) continue;
    CAPSTAN_ASSIGN_OR_RETURN(ps::TableRows all, read_table_shard(reader, saved, saved.shards[i]));
    CAPSTAN_ASSIGN_OR_RETURN(ps::TableRows mine, rows_of_part(all, part, parts));
    kept.push_back(std::move(mine));
  }
  if (kept.size() == 1) return std::move(kept[0]);
  const int64_t dim = saved.table->dim;
  auto column = [&](auto member) {
    std::vector<Tensor> out;
    for (const auto& k : kept) out.push_back(member(k));
    return out;
  };
  ps::TableRows out;
  CAPSTAN_ASSIGN_OR_RETURN(out.keys, concat_rows(column([](const ps::TableRows& r) { return r.keys; }),
                                                 DType::kInt64, {}));
  CAPSTAN_ASSIGN_OR_RETURN(out.values, concat_rows(column([](const ps::TableRows& r) { return r.values; }),
                                                   saved.dtype, {dim}));
  CAPSTAN_ASSIGN_OR_RETURN(out.meta, concat_rows(column([](const ps::TableRows& r) { return r.meta; }),
                                                 DType::kInt64, {ps::kMetaColumns}));
  for (size_t s = 0; s < saved.slots.size(); ++s) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, concat_rows(column([s](const ps::TableRows& r) { return r.slots[s]; }),
                                                   saved.dtype, {dim}));
    out.slots.push_back(std::move(t));
  }
  return out;
}

}  // namespace capstan::checkpoint
