// Peer snapshots (issue 34 item 5): each parameter server keeps, in memory,
// a copy of its buddy's shards, so that a buddy that dies and comes back
// empty gets them from here instead of from the disk checkpoint.
// Transport-free: the service (service.cc) carries the deltas over
// schemas/ps.capnp (sendPeerSnapshot, holdPeerSnapshot, readPeerCopy,
// restoreFromPeer).
//
// Glossary:
//   source    the server whose shards are copied (ps:i).
//   holder    the server that keeps the copy (its buddy, ps:(i+1)%n).
//   delta     what changed on the source since the delta the holder last
//             acknowledged: the variable shards whose version moved (whole:
//             value, slots, step), the table rows whose row version is above
//             the table's last sent version, the shards gone. The first
//             delta, or one after a failure, is full (base_sequence 0) and
//             replaces the holder's copy.
//   sequence  the source's count of deltas; a delta applies on top of the
//             copy of sequence base_sequence only.
//
// Example:
//   PeerSource source(store, tables);          // on ps:0
//   PeerDelta d = *source.next(/*source_task=*/0);
//   PeerCopies copies(16ull << 30);            // on ps:1
//   copies.apply(d);                           // then, on success:
//   source.acknowledge(d.sequence);
//   ...ps:0 restarts empty...
//   PeerDelta all = *copies.read(0, {"w/part_0"});
//   install(all, replacement_store, replacement_tables);
//
// What a recovery from the copy loses: the updates the source applied after
// the last acknowledged delta was taken (at most one snapshot interval plus
// the time to send it). A table's rows evicted on the source after the last
// full copy are still in the copy (a delta carries changed rows, not
// evictions): a recovered table may hold them again until they expire.
//
// Thread-safe: PeerSource and PeerCopies each serialize their own calls with
// a mutex (never held across another object's lock order: the stores'
// locks are taken inside it, never the other way round); install() relies
// on the stores' own thread-safety. Call them off the RPC loop.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_PEER_SNAPSHOTS_H_
#define CAPSTAN_DAEMONS_PS_SERVER_PEER_SNAPSHOTS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "daemons/ps_server/table_store.h"
#include "daemons/ps_server/variable_store.h"
#include "sync/mutex.h"

namespace capstan::ps_server {

// One variable shard, whole.
struct PeerVariable {
  std::string name;
  Tensor value;
  Optimizer optimizer;
  std::vector<std::pair<std::string, Tensor>> slots;  // the optimizer's slot order
  int64_t step = 0;
};

// One table shard's rows: all of them (full) or those changed since the
// last delta.
struct PeerTable {
  std::string name;
  EmbeddingTableSpec spec;  // its configuration (the name unused)
  bool full = false;        // the rows replace the holder's (else they are upserted)
  TableRows rows;
  int64_t step = 0;
};

struct PeerDelta {
  int32_t source_task = 0;
  int64_t base_sequence = 0;  // 0: a full copy
  int64_t sequence = 0;       // > base_sequence
  int64_t taken_ms = 0;       // when the source took it (ms since the epoch)
  std::vector<PeerVariable> variables;
  std::vector<PeerTable> tables;
  std::vector<std::string> removed;  // shards gone since base_sequence
};

// Bytes of the tensors a delta carries (values, slots, rows).
size_t delta_bytes(const PeerDelta& delta);

// InvalidArgument naming the value and the fix: a negative source task,
// sequences not 0 <= base < sequence, an empty or repeated shard name (among
// variables, tables and removed together), invalid tensors, a table config
// that validate_table_config refuses. Nothing is checked against a store.
Status validate_delta(const PeerDelta& delta);

// Writes the delta's shards into the stores: a variable absent there is
// created with its optimizer (one of another dtype, shape or optimizer is
// replaced), then its value, slots and step are set; a table is created
// (replaced when its config differs), its rows imported (replacing all when
// `full`) and its step set; the removed shards are dropped. Stops at the
// first error (the stores then hold part of the delta).
Status install(const PeerDelta& delta, VariableStore& variables, TableStore& tables);

// The source's side: what its holder acknowledged last.
class PeerSource {
 public:
  // The stores must outlive this.
  PeerSource(VariableStore& variables, TableStore& tables) : variables_(variables), tables_(tables) {}

  // The changes since the last acknowledged delta, or every shard when none
  // was acknowledged (or after reset()). Marks the tables (later changes are
  // tagged above the versions read, as a checkpoint's mark does) but
  // remembers nothing until acknowledge(): a delta that never arrives is
  // sent again, in the next one. `now_ms` is stamped as taken_ms.
  Result<PeerDelta> next(int32_t source_task, int64_t now_ms) LOCKS_EXCLUDED(mu_);
  // The holder applied delta `sequence` (the latest next()); later deltas
  // build on it. FailedPrecondition for any other sequence (nothing changes).
  Status acknowledge(int64_t sequence) LOCKS_EXCLUDED(mu_);
  // The next delta is full (the holder lost its copy, or refused a delta).
  void reset() LOCKS_EXCLUDED(mu_);
  int64_t acknowledged_sequence() const LOCKS_EXCLUDED(mu_);

 private:
  // What a delta reflects: each shard's version (a variable's) or the
  // table's version before the mark, and which table object it was.
  struct Marks {
    int64_t sequence = 0;  // 0: nothing acknowledged
    std::map<std::string, int64_t> variables;
    std::map<std::string, std::pair<std::weak_ptr<EmbeddingTable>, int64_t>> tables;
  };

  VariableStore& variables_;
  TableStore& tables_;
  mutable Mutex mu_;
  Marks acknowledged_ GUARDED_BY(mu_);
  std::optional<Marks> pending_ GUARDED_BY(mu_);  // the last next()'s, until acknowledged
  int64_t last_sequence_ GUARDED_BY(mu_) = 0;
};

// The holder's side: copies of other servers' shards, by source task, in
// memory (each a VariableStore and a TableStore of its own).
class PeerCopies {
 public:
  // At most `max_bytes` of tensors held over all copies.
  explicit PeerCopies(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Applies a delta (validate_delta first): a full one replaces the source's
  // copy; another needs the copy to be at delta.base_sequence
  // (FailedPrecondition naming both sequences otherwise: the source sends a
  // full one next). ResourceExhausted when the copies would pass max_bytes
  // (naming both); the copy is dropped then, and when applying fails
  // midway (a half-applied copy is never read).
  Status apply(const PeerDelta& delta) LOCKS_EXCLUDED(mu_);

  struct Held {
    int64_t sequence = 0;
    int64_t taken_ms = 0;
    size_t bytes = 0;
    std::vector<std::string> shards;  // sorted
  };
  std::optional<Held> held(int32_t source_task) const LOCKS_EXCLUDED(mu_);

  // The copy's shards `names` (every one when empty), whole, as a full
  // delta of the copy's sequence. NotFound naming the source when no copy
  // is held, or naming the first shard the copy lacks.
  Result<PeerDelta> read(int32_t source_task, const std::vector<std::string>& names) const LOCKS_EXCLUDED(mu_);
  void drop(int32_t source_task) LOCKS_EXCLUDED(mu_);
  size_t total_bytes() const LOCKS_EXCLUDED(mu_);

  // At most this many sources' copies (a buddy ring gives each server one).
  static constexpr size_t kMaxCopies = 64;

 private:
  struct Copy {
    std::unique_ptr<VariableStore> variables = std::make_unique<VariableStore>();
    std::unique_ptr<TableStore> tables = std::make_unique<TableStore>();
    int64_t sequence = 0;
    int64_t taken_ms = 0;
    size_t bytes() const;
  };
  const size_t max_bytes_;
  mutable Mutex mu_;
  std::map<int32_t, Copy> copies_ GUARDED_BY(mu_);
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_PEER_SNAPSHOTS_H_
