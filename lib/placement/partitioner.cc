#include "placement/partitioner.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace capstan::placement {
namespace {

Status bad_argument(const Partitioner& p, const char* argument, int64_t value,
                    const char* requirement) {
  return Status::InvalidArgument(partitioner_string(p) + ": argument `" + argument + "` must be " +
                                 requirement + ", got " + std::to_string(value));
}

Status check_arguments(const Partitioner& p) {
  switch (p.kind) {
    case Partitioner::Kind::kNone:
      return Status::Ok();
    case Partitioner::Kind::kFixedShards:
      // TF does not check num_shards, but 0 or fewer shards can never pass
      // ParameterServerStrategy's check, so reject them where they are made.
      if (p.num_shards < 1) return bad_argument(p, "num_shards", p.num_shards, "positive");
      return Status::Ok();
    case Partitioner::Kind::kMinSize:
      if (p.min_shard_bytes < 1) {
        return bad_argument(p, "min_shard_bytes", p.min_shard_bytes, "positive");
      }
      if (p.max_shards < 1) return bad_argument(p, "max_shards", p.max_shards, "positive");
      if (p.bytes_per_string < 1) {
        return bad_argument(p, "bytes_per_string", p.bytes_per_string, "positive");
      }
      return Status::Ok();
    case Partitioner::Kind::kMaxSize:
      if (p.max_shard_bytes < 1) {
        return bad_argument(p, "max_shard_bytes", p.max_shard_bytes, "positive");
      }
      if (p.max_shards < 0) {
        return bad_argument(p, "max_shards", p.max_shards, "positive (or 0 for no limit)");
      }
      if (p.bytes_per_string < 1) {
        return bad_argument(p, "bytes_per_string", p.bytes_per_string, "positive");
      }
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown partitioner kind " +
                                 std::to_string(static_cast<int>(p.kind)));
}

// Bytes of `count` elements; InvalidArgument on overflow.
Result<int64_t> byte_count(int64_t count, int64_t element_size, const Shape& shape) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(count, element_size, &bytes)) {
    return Status::InvalidArgument("variable of shape " + shape_string(shape) +
                                   " is too large to partition: byte size overflows int64");
  }
  return bytes;
}

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// What min_size and max_size share: the kind, the cap on shards, the bytes
// counted per string element.
Partitioner by_size(Partitioner::Kind kind, int64_t max_shards, int64_t bytes_per_string) {
  Partitioner p;
  p.kind = kind;
  p.max_shards = max_shards;
  p.bytes_per_string = bytes_per_string;
  return p;
}

}  // namespace

Partitioner Partitioner::fixed_shards(int64_t n) {
  Partitioner p;
  p.kind = Kind::kFixedShards;
  p.num_shards = n;
  return p;
}

Partitioner Partitioner::min_size(int64_t min_shard_bytes, int64_t max_shards, int64_t bytes_per_string) {
  Partitioner p = by_size(Kind::kMinSize, max_shards, bytes_per_string);
  p.min_shard_bytes = min_shard_bytes;
  return p;
}

Partitioner Partitioner::max_size(int64_t max_shard_bytes, int64_t max_shards, int64_t bytes_per_string) {
  Partitioner p = by_size(Kind::kMaxSize, max_shards, bytes_per_string);
  p.max_shard_bytes = max_shard_bytes;
  return p;
}

std::string partitioner_string(const Partitioner& p) {
  switch (p.kind) {
    case Partitioner::Kind::kNone:
      return "no partitioner";
    case Partitioner::Kind::kFixedShards:
      return "FixedShardsPartitioner(num_shards=" + std::to_string(p.num_shards) + ")";
    case Partitioner::Kind::kMinSize:
      return "MinSizePartitioner(min_shard_bytes=" + std::to_string(p.min_shard_bytes) +
             ", max_shards=" + std::to_string(p.max_shards) +
             ", bytes_per_string=" + std::to_string(p.bytes_per_string) + ")";
    case Partitioner::Kind::kMaxSize:
      return "MaxSizePartitioner(max_shard_bytes=" + std::to_string(p.max_shard_bytes) +
             ", max_shards=" +
             (p.max_shards == 0 ? std::string("None") : std::to_string(p.max_shards)) +
             ", bytes_per_string=" + std::to_string(p.bytes_per_string) + ")";
  }
  return "unknown partitioner";
}

Result<std::vector<int64_t>> partition(const Partitioner& p, const Shape& shape, DType dtype) {
  CAPSTAN_RETURN_IF_ERROR(check_arguments(p));
  if (dtype == DType::kInvalid || (dtype != DType::kString && dtype_size(dtype) == 0)) {
    return Status::InvalidArgument("cannot partition a variable of invalid dtype " +
                                   std::string(dtype_name(dtype)));
  }
  const int64_t num_elements = shape_num_elements(shape);
  if (num_elements < 0) {
    return Status::InvalidArgument("cannot partition a variable of shape " + shape_string(shape) +
                                   ": shape is not fully defined or too large");
  }

  std::vector<int64_t> result(shape.size(), 1);
  // Scalars are never partitioned (ParameterServerStrategy skips rank 0).
  if (shape.empty() || p.kind == Partitioner::Kind::kNone) return result;

  const int64_t rows = shape[0];
  const int64_t element_size = dtype == DType::kString
                                   ? p.bytes_per_string
                                   : static_cast<int64_t>(dtype_size(dtype));
  switch (p.kind) {
    case Partitioner::Kind::kNone:
      break;
    case Partitioner::Kind::kFixedShards:
      result[0] = std::min(p.num_shards, rows);
      break;
    case Partitioner::Kind::kMinSize: {
      CAPSTAN_ASSIGN_OR_RETURN(int64_t total_bytes, byte_count(num_elements, element_size, shape));
      result[0] = std::max<int64_t>(
          1, std::min({rows, p.max_shards, ceil_div(total_bytes, p.min_shard_bytes)}));
      break;
    }
    case Partitioner::Kind::kMaxSize: {
      if (num_elements == 0) break;  // TF divides by zero here; nothing to shard.
      CAPSTAN_ASSIGN_OR_RETURN(int64_t row_bytes,
                               byte_count(num_elements / rows, element_size, shape));
      const int64_t rows_per_shard = std::max<int64_t>(1, p.max_shard_bytes / row_bytes);
      int64_t shards = ceil_div(rows, rows_per_shard);
      if (p.max_shards > 0) shards = std::min(shards, p.max_shards);
      result[0] = shards;
      break;
    }
  }
  return result;
}

Status check_partitions(const std::vector<int64_t>& partitions, const Shape& shape) {
  if (partitions.size() != shape.size()) {
    return Status::InvalidArgument(
        "variable_partitioner must return one entry per axis: got " + shape_string(partitions) +
        " for a variable of shape " + shape_string(shape));
  }
  if (partitions.empty()) return Status::Ok();
  bool ok = partitions[0] >= 1;
  for (size_t i = 1; i < partitions.size(); ++i) ok = ok && partitions[i] == 1;
  if (!ok) {
    return Status::InvalidArgument(
        "variable_partitioner must return a list/tuple whose elements are 1 besides the first "
        "element (positive), got: " +
        shape_string(partitions) + " for a variable of shape " + shape_string(shape));
  }
  return Status::Ok();
}

Result<std::vector<int64_t>> shard_rows(int64_t rows, int64_t shards) {
  if (rows < 0) {
    return Status::InvalidArgument("shard_rows: rows must be non-negative, got " +
                                   std::to_string(rows));
  }
  if (shards < 1 || shards > std::max<int64_t>(rows, 1)) {
    return Status::InvalidArgument("shard_rows: cannot split " + std::to_string(rows) +
                                   " rows into " + std::to_string(shards) +
                                   " non-empty shards");
  }
  const int64_t base = rows / shards;
  const int64_t extra = rows % shards;
  std::vector<int64_t> sizes(static_cast<size_t>(shards), base);
  for (int64_t i = 0; i < extra; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

std::vector<int64_t> shard_offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets;
  offsets.reserve(sizes.size());
  int64_t next = 0;
  for (int64_t size : sizes) {
    offsets.push_back(next);
    next += size;
  }
  return offsets;
}

}  // namespace capstan::placement
