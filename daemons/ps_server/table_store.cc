#include "daemons/ps_server/table_store.h"

#include <algorithm>

namespace capstan::ps_server {

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
  // Versions start at the wall clock in microseconds, so a table created
  // later (a new run, a re-created table) tags its changes above every
  // generation of an earlier run's checkpoints: a delta export since one of
  // them lists every row rather than none.
  const int64_t start = std::max<int64_t>(2, EmbeddingTable::system_clock_ms() * 1000);
  CAPSTAN_RETURN_IF_ERROR(table->begin_version(std::min(start, EmbeddingTable::kMaxVersion / 2)).status());
  WriterMutexLock lock(mu_);
  if (tables_.size() >= kMaxTables && tables_.count(name) == 0) {
    return Status::ResourceExhausted("createTable '" + name + "': this parameter server holds " +
                                     std::to_string(tables_.size()) + " embedding tables, the most it takes");
  }
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

}  // namespace capstan::ps_server
