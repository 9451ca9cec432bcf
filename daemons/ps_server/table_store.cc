#include "daemons/ps_server/table_store.h"

namespace capstan::ps {

Status TableStore::create(const std::string& name, const TableConfig& config) {
  if (name.empty()) return Status::InvalidArgument("createTable: empty table name");
  CAPSTAN_RETURN_IF_ERROR(validate_table_config(config).with_context("createTable '" + name + "'"));
  {
    ReaderMutexLock lock(mu_);
    auto it = tables_.find(name);
    if (it != tables_.end()) {
      if (it->second->config() == config) return Status::Ok();
      return Status::AlreadyExists("embedding table '" + name + "' exists as " +
                                   table_config_debug_string(it->second->config()) + ", not " +
                                   table_config_debug_string(config));
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table, EmbeddingTable::create(config));
  WriterMutexLock lock(mu_);
  auto [it, inserted] = tables_.emplace(name, std::move(table));
  if (!inserted && !(it->second->config() == config)) {
    return Status::AlreadyExists("embedding table '" + name + "' was created meanwhile as " +
                                 table_config_debug_string(it->second->config()));
  }
  return Status::Ok();
}

Result<std::shared_ptr<EmbeddingTable>> TableStore::find(const std::string& name) const {
  ReaderMutexLock lock(mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return Status::NotFound("no embedding table '" + name + "' on this parameter server");
  return it->second;
}

bool TableStore::remove(const std::string& name) {
  WriterMutexLock lock(mu_);
  return tables_.erase(name) != 0;
}

std::vector<std::pair<std::string, std::shared_ptr<EmbeddingTable>>> TableStore::list() const {
  ReaderMutexLock lock(mu_);
  return {tables_.begin(), tables_.end()};
}

int64_t TableStore::total(const std::atomic<int64_t> EmbeddingTable::Stats::*field) const {
  int64_t sum = 0;
  for (const auto& [name, table] : list()) sum += (table->stats().*field).load(std::memory_order_relaxed);
  return sum;
}

size_t TableStore::total_bytes() const {
  size_t sum = 0;
  for (const auto& [name, table] : list()) sum += table->bytes();
  return sum;
}

}  // namespace capstan::ps
