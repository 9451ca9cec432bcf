// What a parameter server is asked to save or restore of a checkpoint, and
// what it answers (issue 34: every server writes and reads its own shards).
// The coordinator builds these, the wire (schemas/ps.capnp beginSave,
// restoreShards) carries them, the ps-server's ShardCheckpoints
// (daemons/ps_server/shard_checkpoints.h) acts on them.
#ifndef CAPSTAN_LIB_TYPES_SHARD_CHECKPOINT_H_
#define CAPSTAN_LIB_TYPES_SHARD_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan::ps {

// A shard to snapshot and write.
struct SaveItem {
  std::string name;
  bool table = false;
  int64_t begin_version = 0;  // a table: later changes are tagged >= this (0: no mark)
};

// What a shard's snapshot holds, as the manifest needs it.
struct SavedShard {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;  // a table's: [rows, dim]
  std::vector<std::string> slots;  // written, in the optimizer's order
  int64_t step = 0;
  int64_t version = 0;  // a table: the version before the mark
};

// One shard to fill from a checkpoint, as placed now.
struct RestoreItem {
  std::string name;      // the shard; created first when absent
  std::string variable;  // the checkpoint's variable
  int64_t first_row = 0;
  int64_t rows = 0;
  DType dtype = DType::kInvalid;
  Shape shape;  // the shard's
  Optimizer optimizer;
  // An embedding table's part `table_part` of `table_parts`.
  std::optional<EmbeddingTableSpec> table;
  int table_part = 0;
  int table_parts = 0;
};

}  // namespace capstan::ps

#endif  // CAPSTAN_LIB_TYPES_SHARD_CHECKPOINT_H_
