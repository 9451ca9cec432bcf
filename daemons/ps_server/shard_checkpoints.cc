#include "daemons/ps_server/shard_checkpoints.h"

#include <algorithm>
#include <set>

#include "checkpoint/checkpoint.h"
#include "training/optimizer.h"

namespace capstan::ps_server {

Result<ShardCheckpoints::Snapshot> ShardCheckpoints::snapshot(const std::vector<SaveItem>& items) const {
  std::set<std::string> seen;
  std::vector<std::shared_ptr<EmbeddingTable>> tables(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const SaveItem& item = items[i];
    if (item.name.empty()) return Status::InvalidArgument("beginSave: shard " + std::to_string(i) + " has no name");
    if (!seen.insert(item.name).second) {
      return Status::InvalidArgument("beginSave: shard '" + item.name + "' is named twice");
    }
    if (item.table) {
      CAPSTAN_ASSIGN_OR_RETURN(tables[i], tables_.find(item.name));
    } else {
      CAPSTAN_RETURN_IF_ERROR(store_.info(item.name).status());
    }
  }
  Snapshot out;
  for (size_t i = 0; i < items.size(); ++i) {
    const SaveItem& item = items[i];
    SavedShard saved;
    saved.name = item.name;
    if (item.table) {
      EmbeddingTable& table = *tables[i];
      CAPSTAN_ASSIGN_OR_RETURN(EmbeddingTable::LazySnapshot rows, table.begin_snapshot(item.begin_version));
      saved.dtype = table.config().dtype;
      saved.shape = {rows.rows, table.config().dim};
      saved.slots = training::slot_names(table.config().optimizer.kind);
      saved.slots.resize(std::min(saved.slots.size(), static_cast<size_t>(rows.slots)));
      saved.step = rows.step;
      saved.version = rows.version;
      out.tables.push_back({item.name, tables[i], std::move(rows), saved.slots});
    } else {
      CAPSTAN_ASSIGN_OR_RETURN(VariableStore::Snapshot shard, store_.snapshot(item.name));
      saved.dtype = shard.dtype;
      saved.shape = shard.shape;
      for (const auto& [slot, t] : shard.slots) saved.slots.push_back(slot);
      saved.step = shard.step;
      out.shards.push_back({item.name, std::move(shard.value), std::move(shard.slots), shard.step});
    }
    out.saved.push_back(std::move(saved));
  }
  return out;
}

Result<checkpoint::ManifestFile> ShardCheckpoints::write(const Snapshot& snapshot, const std::string& directory,
                                                         const std::string& file) const {
  CAPSTAN_RETURN_IF_ERROR(checkpoint::check_save_directory(directory, "beginSave", fs_));
  std::vector<checkpoint::TableShardTensors> tables;
  for (const TableSnapshot& t : snapshot.tables) {
    CAPSTAN_ASSIGN_OR_RETURN(TableRows rows, t.table->finish_snapshot(t.rows));
    tables.push_back({t.name, std::move(rows), t.slots});
  }
  return checkpoint::write_shard_file(directory, file, snapshot.shards, tables, fs_);
}

Status ShardCheckpoints::restore(const std::string& checkpoint, const std::vector<RestoreItem>& items) const {
  checkpoint::CheckpointReaderOptions options;
  options.verify_checksums_on_open = false;  // each file when first read: only the ones this server needs
  CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(checkpoint, options, fs_));
  // Everything is checked before anything changes.
  std::vector<const checkpoint::ManifestVariable*> saved(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RestoreItem& item = items[i];
    const std::string what = "restoreShards '" + item.name + "'";
    saved[i] = reader->manifest().find_variable(item.variable);
    if (saved[i] == nullptr) {
      return Status::NotFound(what + ": checkpoint " + reader->path() + " has no variable '" + item.variable + "'");
    }
    const auto& v = *saved[i];
    if (item.table) {
      if (!v.table || v.dtype != item.table->dtype || v.table->dim != item.table->dim) {
        return Status::InvalidArgument(what + ": the checkpoint's '" + item.variable + "' is " +
                                       std::string(dtype_name(v.dtype)) + shape_string(v.shape) +
                                       (v.table ? " (a table)" : " (not a table)") +
                                       ", not a table of dim " + std::to_string(item.table->dim));
      }
      if (item.table_parts < 1 || item.table_part < 0 || item.table_part >= item.table_parts) {
        return Status::InvalidArgument(what + ": table part " + std::to_string(item.table_part) + " of " +
                                       std::to_string(item.table_parts));
      }
      continue;
    }
    Shape expect = v.shape;
    if (!expect.empty()) expect[0] = item.rows;
    const int64_t dim0 = v.shape.empty() ? 1 : v.shape[0];
    if (v.table || v.dtype != item.dtype || expect != item.shape || item.first_row < 0 || item.rows < 0 ||
        item.first_row + item.rows > dim0 || (v.shape.empty() && item.first_row != 0)) {
      return Status::InvalidArgument(what + " " + std::string(dtype_name(item.dtype)) + shape_string(item.shape) +
                                     " (rows " + std::to_string(item.first_row) + ".." +
                                     std::to_string(item.first_row + item.rows) + ") does not fit the checkpoint's '" +
                                     item.variable + "' " + std::string(dtype_name(v.dtype)) + shape_string(v.shape) +
                                     (v.table ? " (a table)" : ""));
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const RestoreItem& item = items[i];
    Status done = item.table ? restore_table(*reader, *saved[i], item) : restore_variable(*reader, *saved[i], item);
    CAPSTAN_RETURN_IF_ERROR(done.with_context("restoreShards '" + item.name + "'"));
  }
  return Status::Ok();
}

Status ShardCheckpoints::restore_variable(const checkpoint::CheckpointReader& reader,
                                          const checkpoint::ManifestVariable& saved, const RestoreItem& item) const {
  const bool same_kind = saved.optimizer.kind == item.optimizer.kind;
  CAPSTAN_ASSIGN_OR_RETURN(checkpoint::ShardTensors read,
                           checkpoint::read_shard_rows(reader, item.variable, saved.shape.empty() ? 0 : item.first_row,
                                                       saved.shape.empty() ? 1 : item.rows, same_kind));
  if (!store_.info(item.name).ok()) {
    // Created with the value itself: no zeros first.
    CAPSTAN_RETURN_IF_ERROR(store_.create(item.name, read.value, item.optimizer));
  } else {
    CAPSTAN_RETURN_IF_ERROR(store_.assign_owned(item.name, std::move(read.value)));
  }
  CAPSTAN_ASSIGN_OR_RETURN(VariableStore::Info info, store_.info(item.name));
  std::vector<std::string> slots;
  if (info.dtype == DType::kFloat32 || info.dtype == DType::kFloat64) slots = training::slot_names(info.optimizer.kind);
  for (auto& [slot, t] : read.slots) {
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) continue;
    CAPSTAN_RETURN_IF_ERROR(store_.set_slot(item.name, slot, t));
  }
  return store_.set_step(item.name, read.step);
}

Status ShardCheckpoints::restore_table(const checkpoint::CheckpointReader& reader,
                                       const checkpoint::ManifestVariable& saved, const RestoreItem& item) const {
  const EmbeddingTableSpec& spec = *item.table;
  CAPSTAN_RETURN_IF_ERROR(
      tables_.create(item.name, TableConfig{spec.dtype, spec.dim, spec.initializer, spec.optimizer, spec.options}));
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<EmbeddingTable> table, tables_.find(item.name));
  if (saved.slots != training::slot_names(item.table->optimizer.kind)) {
    return Status::InvalidArgument("embedding table '" + item.variable + "' uses " +
                                   optimizer_name(item.table->optimizer.kind) +
                                   " but the checkpoint's has other optimizer slots");
  }
  CAPSTAN_ASSIGN_OR_RETURN(ps::TableRows rows,
                           checkpoint::read_table_part(reader, saved, item.table_part, item.table_parts));
  return table->restore(rows, /*replace=*/true, saved.optimizer_step, saved.table->generation);
}

}  // namespace capstan::ps_server
