// TableStore: the embedding-table shards a parameter server holds, by name
// ("user_emb/part_1"). The ps-server's service looks tables up here and
// runs their work on its thread pool.
//
// Thread-safe: the name map is guarded by a shared_mutex, held only to find,
// add or drop a table; the tables are thread-safe themselves.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_TABLE_STORE_H_
#define CAPSTAN_DAEMONS_PS_SERVER_TABLE_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "daemons/ps_server/embedding_table.h"
#include "sync/mutex.h"

namespace capstan::ps_server {

class TableStore {
 public:
  // Creates the table, or keeps an existing one with the same config (a
  // reconnecting coordinator); AlreadyExists naming both configs when it
  // differs; InvalidArgument from validate_table_config(); ResourceExhausted
  // past kMaxTables.
  Status create(const std::string& name, const TableConfig& config) LOCKS_EXCLUDED(mu_);
  // NotFound "no embedding table 'x' on this parameter server".
  Result<std::shared_ptr<EmbeddingTable>> find(const std::string& name) const LOCKS_EXCLUDED(mu_);
  // Whether it existed.
  bool remove(const std::string& name) LOCKS_EXCLUDED(mu_);
  std::vector<std::pair<std::string, std::shared_ptr<EmbeddingTable>>> list() const LOCKS_EXCLUDED(mu_);

  // Sums over every table (for /metrics).
  int64_t total(const std::atomic<int64_t> EmbeddingTable::Stats::*field) const;
  size_t total_bytes() const;

  static constexpr size_t kMaxTables = 4096;

 private:
  mutable SharedMutex mu_;
  std::map<std::string, std::shared_ptr<EmbeddingTable>> tables_ GUARDED_BY(mu_);
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_TABLE_STORE_H_
