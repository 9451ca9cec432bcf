// Where a variable's shards live: shard i of variable X is the tensor
// "X/part_i" on parameter server task p, holding rows [first_row, first_row +
// rows) of X's axis 0. The one C++ description of it, for every layer: the
// placer's output (placement/placement.h), the coordinator's records, its
// checkpoint states (coordinator/checkpointing.h) and replies, and the
// closures' variable router (training/variable_router.h). The wire's
// VariablePlacement (schemas/coordinator.capnp) is converted to and from it
// at the edge; the public API's ShardInfo / VariableInfo (capstan/training.h)
// are built from it in the SDK.
#ifndef CAPSTAN_LIB_TYPES_SHARD_LOCATION_H_
#define CAPSTAN_LIB_TYPES_SHARD_LOCATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan::ps {

struct ShardLocation {
  std::string name;       // "w/part_0"; an unpartitioned variable's: "w"
  int ps_task = 0;        // index into the cluster's "ps" job
  int64_t first_row = 0;  // offset of the shard along axis 0 of its variable
  int64_t rows = 0;       // the shard's shape[0]; 1 for a scalar, 0 for a table's shard
  // The task's address when the location was handed out; "" where only the
  // task counts (the coordinator's own records: the address can change when
  // the task restarts).
  std::string ps_address = "";
  bool operator==(const ShardLocation&) const = default;
};

struct VariableLocation {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;  // an embedding table's: [0, dim]
  std::vector<ShardLocation> shards;  // in row order
  // An embedding table: one shard per parameter server, by task; key k on
  // shard table_shard_of(k, shards.size()).
  std::optional<EmbeddingTableSpec> table;
};

}  // namespace capstan::ps

#endif  // CAPSTAN_LIB_TYPES_SHARD_LOCATION_H_
