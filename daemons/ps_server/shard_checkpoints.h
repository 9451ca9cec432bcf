// ShardCheckpoints: a parameter server's own part of saving and restoring a
// checkpoint (issue 34): it snapshots the shards it holds and writes them
// into the checkpoint directory itself, and on a restore reads what it owns
// now from the checkpoint's files, so that no variable or table bytes go
// through the coordinator. Transport-free: the service (service.cc) decodes
// the RPCs and runs these on its thread pools.
//
//   ShardCheckpoints checkpoints(store, tables);
//   auto snapshot = checkpoints.snapshot({{"w/part_0"}, {"emb/part_0", true, mark}});  // cheap: values lent
//   auto file = checkpoints.write(*snapshot, "/ckpt/ckpt-100.tmp", "ps-0.safetensors");  // in the background
//   ...
//   checkpoints.restore("/ckpt/ckpt-100", {{"w/part_0", "w", 0, 50, ...}});
//
// A snapshot is consistent per shard (one instant under the shard's lock:
// value, slots, step; a table's rows per stripe, as export does) and costs a
// copy of the slots only: the value is lent copy-on-write (see
// VariableStore::read), so the shard's next update copies it instead while
// the file is written; a table's rows are copied stripe by stripe while the
// file is written, or by the first change to a stripe before it applies.
//
// Thread-safe: the stores are; call off the RPC loop.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_SHARD_CHECKPOINTS_H_
#define CAPSTAN_DAEMONS_PS_SERVER_SHARD_CHECKPOINTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_files.h"
#include "daemons/ps_server/table_store.h"
#include "daemons/ps_server/variable_store.h"
#include "io/file_system.h"
#include "types/shard_checkpoint.h"

namespace capstan::ps_server {

class ShardCheckpoints {
 public:
  // The stores and `fs` must outlive this.
  ShardCheckpoints(VariableStore& store, TableStore& tables, io::FileSystem& fs = io::local_file_system())
      : store_(store), tables_(tables), fs_(fs) {}

  using SaveItem = ps::SaveItem;
  using SavedShard = ps::SavedShard;
  using RestoreItem = ps::RestoreItem;
  // A table's rows are copied when write() needs them or a change to a
  // stripe comes first (EmbeddingTable::begin_snapshot).
  struct TableSnapshot {
    std::string name;
    std::shared_ptr<EmbeddingTable> table;
    EmbeddingTable::LazySnapshot rows;
    std::vector<std::string> slots;
  };
  struct Snapshot {
    std::vector<SavedShard> saved;  // in request order
    std::vector<checkpoint::ShardTensors> shards;
    std::vector<TableSnapshot> tables;
  };
  // NotFound for a shard this server does not hold; InvalidArgument for an
  // empty or repeated name. Nothing is marked unless all are found.
  Result<Snapshot> snapshot(const std::vector<SaveItem>& items) const;
  // Writes the snapshot as `directory`/`file` (see write_shard_file). The
  // directory must be a save in progress ("<dir>/ckpt-<step>.tmp", existing):
  // InvalidArgument otherwise, so that a bad request cannot write elsewhere.
  Result<checkpoint::ManifestFile> write(const Snapshot& snapshot, const std::string& directory,
                                         const std::string& file) const;

  // Opens the committed checkpoint `checkpoint` (its files' CRC32C checked
  // as each is first read), checks every item against its manifest, then
  // fills each shard: value, the slots the checkpoint has when the optimizer
  // kind matches (another kind's start afresh), step; a table's rows for its
  // keys (replacing all), step and generation. InvalidArgument naming the
  // shard for a dtype or shape that differs from the checkpoint's, NotFound
  // for a variable it lacks, DataLoss for damaged files.
  Status restore(const std::string& checkpoint, const std::vector<RestoreItem>& items) const;

 private:
  Status restore_variable(const checkpoint::CheckpointReader& reader, const checkpoint::ManifestVariable& saved,
                          const RestoreItem& item) const;
  Status restore_table(const checkpoint::CheckpointReader& reader, const checkpoint::ManifestVariable& saved,
                       const RestoreItem& item) const;

  VariableStore& store_;
  TableStore& tables_;
  io::FileSystem& fs_;
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_SHARD_CHECKPOINTS_H_
