// Placement of variable shards on parameter-server tasks, as TF's
// ParameterServerStrategy (parameter_server_strategy_v2.py) does it:
//
//   - A variable is partitioned with its Partitioner; the result must pass
//     check_partitions(), and its shard count is capped at shape[0].
//   - One shard (unpartitioned, a scalar, or a partitioner that returns 1):
//     one variable under the logical name itself, no "/part_0" suffix.
//   - n > 1 shards: "name/part_0" ... "name/part_{n-1}", rows by the "div"
//     split (shard_rows), each shard shape [rows_i, shape[1:]...].
//   - Every shard created, of every variable, takes the next PS task in turn:
//     task = counter % num_ps, then counter += 1. So with 2 PS, a variable
//     "a" of 3 shards lands on tasks 0, 1, 0 and the next variable "b",
//     unpartitioned, on task 1.
//
// Placer is not thread-safe; the coordinator calls it from one thread, in
// variable creation order (the order decides the placement).
#ifndef CAPSTAN_LIB_PLACEMENT_PLACEMENT_H_
#define CAPSTAN_LIB_PLACEMENT_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "placement/partitioner.h"
#include "types/shard_location.h"

namespace capstan::placement {

// One shard of a logical variable and the PS task that holds it (no
// ps_address: the placer knows tasks only), with the shard's full shape.
struct ShardPlacement : ps::ShardLocation {
  Shape shape;
};

class Placer {
 public:
  // num_ps is the number of PS tasks; place() fails while it is below 1.
  explicit Placer(int num_ps);

  // Partitions and places one logical variable, advancing the counter by its
  // number of shards. InvalidArgument (and no change to the counter) for an
  // empty name, a bad partitioner or shape, a partition result that fails
  // check_partitions(), or num_ps < 1.
  Result<std::vector<ShardPlacement>> place(const std::string& name, const Shape& shape,
                                            DType dtype, const Partitioner& partitioner);

  // Shards placed so far. A restarted coordinator restores it (from its
  // journal) so that new variables continue the same round robin.
  int64_t counter() const { return counter_; }
  // Precondition: counter >= 0.
  void set_counter(int64_t counter);

  int num_ps() const { return num_ps_; }

 private:
  const int num_ps_;
  int64_t counter_ = 0;
};

}  // namespace capstan::placement

#endif  // CAPSTAN_LIB_PLACEMENT_PLACEMENT_H_
