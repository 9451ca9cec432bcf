#include "placement/placement.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <utility>
#include <vector>

namespace capstan::placement {

Placer::Placer(int num_ps) : num_ps_(num_ps) {}

void Placer::set_counter(int64_t counter) {
  assert(counter >= 0);
  counter_ = counter;
}

Result<std::vector<ShardPlacement>> Placer::place(const std::string& name, const Shape& shape,
                                                  DType dtype, const Partitioner& partitioner) {
  if (num_ps_ < 1) {
    return Status::InvalidArgument("cannot place variable '" + name +
                                   "': num_ps must be positive, got " + std::to_string(num_ps_));
  }
  if (name.empty()) return Status::InvalidArgument("cannot place a variable without a name");

  auto partitions = partition(partitioner, shape, dtype);
  if (!partitions.ok()) return partitions.status().with_context("variable '" + name + "'");
  Status checked = check_partitions(*partitions, shape);
  if (!checked.ok()) return checked.with_context("variable '" + name + "'");

  // Scalars, and variables the partitioner leaves whole, are one shard. As in
  // TF, a result of 1 means "whole" even for a variable with no rows, and a
  // larger result is capped at the number of rows.
  const int64_t num_shards = shape.empty() ? 1 : std::min((*partitions)[0], shape[0]);
  const int64_t rows = shape.empty() ? 1 : shape[0];

  std::vector<ShardPlacement> shards;
  if (num_shards <= 1) {
    shards.push_back(ShardPlacement{{name, static_cast<int>(counter_ % num_ps_), 0, rows}, shape});
  } else {
    CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, shard_rows(rows, num_shards));
    const std::vector<int64_t> offsets = shard_offsets(sizes);
    shards.reserve(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      Shape shard_shape = shape;
      shard_shape[0] = sizes[i];
      const int64_t task = (counter_ + static_cast<int64_t>(i)) % num_ps_;
      shards.push_back(ShardPlacement{{name + "/part_" + std::to_string(i), static_cast<int>(task), offsets[i], sizes[i]},
                                      std::move(shard_shape)});
    }
  }
  counter_ += static_cast<int64_t>(shards.size());
  return shards;
}

}  // namespace capstan::placement
