// EmbeddingTable: one parameter server's shard of a dynamic embedding table
// (EmbeddingTableSpec in capstan/training.h): int64 keys of any value, each
// with a row of `dim` values, the optimizer's slots and per-key metadata.
// The ps-server's RPC service forwards to it; it knows nothing of Cap'n
// Proto.
//
// Glossary:
//   row        a key's `dim` values.
//   slot       optimizer state per row element (slot_names() order).
//   step       the shard's optimizer iteration counter (the highest step any
//              update used); ttl_steps counts in it.
//   version    the generation a change is tagged with. A checkpoint save
//              calls begin_version(v + 1) on every shard and records v; the
//              rows changed since that checkpoint are those whose version is
//              greater than v (export_rows(v)).
//   default row  `default_value` in every element: what a lookup returns for
//              a key that is not in the table and is not inserted.
//
// Example:
//   auto table = EmbeddingTable::create(config).value();
//   Tensor rows = table->lookup(ids, true).value();      // [n, dim]
//   table->apply_gradients(ids, gradient_rows, 0);       // step + 1
//   auto all = table->export_rows(0).value();             // every row
//
// Layout: the table is split into kStripes stripes by key hash, each with its
// own mutex, open-addressing index (key -> row) and row arena. Rows live in
// fixed-size blocks that never move: the table grows without copying rows and
// without per-row heap allocations; an index resize rehashes one stripe only,
// holding only that stripe's lock, so lookups of the other stripes go on.
// Freed rows (evictions) are reused.
//
// Thread-safe: every method may be called from any thread. A lookup or update
// of several keys is atomic per stripe, not as a whole.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_EMBEDDING_TABLE_H_
#define CAPSTAN_DAEMONS_PS_SERVER_EMBEDDING_TABLE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "types/table_rows.h"

namespace capstan::ps_server {

struct TableConfig {
  DType dtype = DType::kFloat32;
  int64_t dim = 0;
  EmbeddingInitializer initializer;
  Optimizer optimizer;
  EmbeddingTableOptions options;
  bool operator==(const TableConfig& other) const;
};

// InvalidArgument naming the field and value: dim in [1, 65536]; dtype
// float32 or float64; initializer kind known, stddev >= 0 and finite values;
// optimizer valid (validate() in optimizer.h); min_count in [1, 65535]
// (the admission sketch's counters are 16 bits);
// admit_probability in (0, 1]; ttl_*, max_rows, max_bytes >= 0; eviction
// "lru" or "lfu"; default_value finite.
Status validate_table_config(const TableConfig& config);
// "float32[*, 64] adagrad(...) min_count=2 ...": for messages.
std::string table_config_debug_string(const TableConfig& config);

// The initial row of `key` (its `dim` values as double): a pure function of
// (initializer, key), the same on every parameter server and after
// re-sharding.
void initial_row(const EmbeddingInitializer& init, int64_t key, std::span<double> out);

// TableRows (rows with their state, as exported and imported) and
// kMetaColumns come from types/table_rows.h.
using ps::kMetaColumns;
using ps::TableRows;

class EmbeddingTable {
 public:
  // Milliseconds since the Unix epoch; tests inject their own.
  using Clock = std::function<int64_t()>;
  static int64_t system_clock_ms();

  // InvalidArgument from validate_table_config().
  static Result<std::unique_ptr<EmbeddingTable>> create(TableConfig config, Clock clock = system_clock_ms);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const TableConfig& config() const { return config_; }

  // `ids`: int64 (or int32), rank 1. Returns dtype[len(ids), dim], row i for
  // ids[i]. With `insert`: each distinct key counts once toward its
  // frequency (LFU) and admission (stats().lookups counts every id); a missing key that is admitted is inserted with its
  // initial row (and the shard's caps enforced after the rows are copied
  // out); others get the default row. Without: nothing changes, missing keys
  // get the default row. InvalidArgument for other dtypes or ranks.
  Result<Tensor> lookup(const Tensor& ids, bool insert);

  // `ids` int64 (or int32) rank 1, `gradients` dtype[len(ids), dim]. Repeated
  // ids are summed, then the optimizer updates the rows of the keys present
  // (with their slots; Adam lazily: only those rows). Keys not present are
  // skipped and counted (stats().dropped_updates). `step` as in
  // VariableStore::apply_dense (<= 0: the shard's step + 1). Marks the
  // rows updated (step, time, version). InvalidArgument for mismatched
  // shapes or dtypes, FailedPrecondition for a table whose optimizer is none.
  // `learning_rate` as in VariableStore::apply_dense (an override of the
  // optimizer's rate; InvalidArgument naming it when not finite or < 0).
  Status apply_gradients(const Tensor& ids, const Tensor& gradients, int64_t step,
                         std::optional<double> learning_rate = std::nullopt);

  // Evicts the rows past ttl_steps / ttl_seconds now; how many. A row is
  // past them when more than ttl_steps steps (step() minus its last update
  // step) or more than ttl_seconds seconds have passed since its last update
  // (or insert). lookup(insert=true) and apply_gradients also sweep, one
  // stripe at a time, each stripe about once a second of the clock.
  int64_t evict_expired();

  // The rows whose version > since_version (0: every row), sorted by key.
  Result<TableRows> export_rows(int64_t since_version) const;
  // Inserts or overwrites the rows (a restore, a recovery); validates every
  // tensor's dtype and shape, the keys (no duplicates) and the meta (no
  // negative values) first, and changes nothing on error; then, with
  // `replace`, drops every row first. Each row keeps its lookups and last
  // update step; its version becomes the current one (a written row is a
  // change: a delta export since any earlier checkpoint lists it) and its
  // last update time now (its ttl_seconds starts again). The caps apply
  // after.
  Status import_rows(const TableRows& rows, bool replace = false);
  // Drops every row (a restore replaces the table's contents).
  void clear();

  // A checkpoint's read of this shard: the rows whose version >
  // since_version, the step, and the version in force before `mark`; with
  // mark > 0, changes from now on are first tagged max(mark, version + 1)
  // (mark at most kMaxVersion, else InvalidArgument).
  struct Snapshot {
    TableRows rows;
    int64_t step = 0;
    int64_t version = 0;
  };
  Result<Snapshot> snapshot(int64_t since_version, int64_t mark);
  // The same snapshot of every row in two parts, so that a checkpoint's
  // barrier copies nothing (issue 34): begin_snapshot() tags changes from
  // now on as snapshot(0, mark) does and marks every stripe; a marked
  // stripe's rows are copied by the first change to it (before the change
  // applies: copy-on-write per stripe) or by finish_snapshot(), whichever
  // comes first. finish_snapshot() returns every row as it was at
  // begin_snapshot(), sorted by key. A later begin_snapshot() first copies
  // the stripes an earlier one still marks. Dropping a LazySnapshot without
  // finishing it is fine: the stripes then copy nothing.
  struct PendingSnapshot;  // the stripes' copies, as they are made
  struct LazySnapshot {
    std::shared_ptr<PendingSnapshot> pending;
    int64_t rows = 0;  // at begin_snapshot()
    int64_t slots = 0;  // slot planes per row
    int64_t step = 0;
    int64_t version = 0;  // in force before the mark
  };
  Result<LazySnapshot> begin_snapshot(int64_t mark);
  Result<TableRows> finish_snapshot(const LazySnapshot& snapshot);
  // A restore or a recovery of this shard from a checkpoint of generation
  // `generation` (in [0, kMaxVersion)): changes from now on, these rows
  // included, are tagged above it; the rows are imported (replace: every
  // other row goes) and the step becomes `step` (>= 0), as a variable's
  // restore sets it. InvalidArgument for bad values, nothing changed.
  Status restore(const TableRows& rows, bool replace, int64_t step, int64_t generation);

  // Tags changes from now on with `version` (> the current one and at most
  // kMaxVersion, or InvalidArgument); returns the previous version.
  Result<int64_t> begin_version(int64_t version);
  int64_t version() const;
  int64_t step() const;
  // Restores the step counter (>= 0).
  Status set_step(int64_t step);

  struct Stats {
    std::atomic<int64_t> rows{0};
    std::atomic<int64_t> lookups{0};           // keys looked up
    std::atomic<int64_t> inserted{0};          // rows lookups inserted (imports not counted)
    std::atomic<int64_t> not_admitted{0};      // lookups answered with the default row (insert=true)
    std::atomic<int64_t> evicted_ttl{0};
    std::atomic<int64_t> evicted_capacity{0};
    std::atomic<int64_t> updated_rows{0};
    std::atomic<int64_t> dropped_updates{0};   // gradients of keys not in the table
  };
  const Stats& stats() const { return *stats_; }
  std::shared_ptr<const Stats> shared_stats() const { return stats_; }
  // Bytes held: row arena (values + slots + metadata), indexes, sketches.
  size_t bytes() const;
  // Bytes one row costs in the arena (values, slots, metadata) plus its
  // share of a full index: what max_bytes divides by.
  size_t bytes_per_row() const;

  static constexpr int kStripes = 16;
  static constexpr int64_t kMaxVersion = int64_t{1} << 62;

 private:
  struct Layout;  // row sizes and per-row constants derived from config_
  struct Stripe;  // one stripe's mutex, index, rows and admission state
  struct Staged;  // rows copied out of stripes, before they become TableRows
  // Copies stripe `i`'s rows into the snapshot that marks it, if any, and
  // unmarks it: before any change to the stripe (its lock held).
  void settle(int i);
  // The rows copied out, sorted by key, as TableRows.
  Result<TableRows> rows_of(const std::vector<Staged>& parts) const;
  EmbeddingTable(TableConfig config, Clock clock);
  void maybe_sweep();
  int64_t evict_expired_in(int stripe);
  // The step an update uses (`step`, or the counter + 1) after raising the
  // counter to it; OutOfRange when the counter cannot go up.
  Result<int64_t> advance_step(int64_t step);
  template <typename T>
  void apply_typed(const std::vector<int64_t>& keys, std::span<const T> gradients, int64_t step,
                   std::optional<double> learning_rate);

  const TableConfig config_;
  const Clock clock_;
  const std::unique_ptr<const Layout> layout_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<int64_t> version_{1};
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> last_sweep_ms_{0};
  std::atomic<uint64_t> sweep_cursor_{0};
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_EMBEDDING_TABLE_H_
