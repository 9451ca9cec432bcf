// VariableStore: the variable shards a parameter server holds, their
// optimizer slots and step counters. The ps-server's RPC service forwards to
// it; it knows nothing of Cap'n Proto.
//
// Glossary:
//   shard     one partition of a variable, named "<variable>/part_<i>"
//             (e.g. "emb/part_0"); the store treats the name as opaque.
//   slot      optimizer state kept per element of a shard, with the shard's
//             dtype and shape ("m", "v", "accumulator", ...; see
//             slot_names() in optimizer.h).
//   step      the shard's iteration counter: the highest step any update
//             used. Adam's bias correction reads it.
//
// Example:
//   VariableStore store;
//   store.create("w/part_0", *Tensor::zeros(DType::kFloat32, {4}), adam);
//   store.apply_dense("w/part_0", gradient);          // step 1
//   Tensor w = *store.read("w/part_0");                // a snapshot
//
// Values are copied in (assign_owned excepted) and read copy-on-write: read()
// hands out the shard's buffer itself, and the next update of the shard
// copies the value first while any such reader still holds it, so a read
// value never changes. A 64 MiB pull thus costs no copy on the server, and
// neither does a gradient step after the pulled value was sent.
//
// Dtypes: float32 and float64 shards take optimizer updates (apply_dense,
// apply_sparse) and keep slots. Other fixed-size dtypes (float16, bfloat16,
// integers, bool) are read, gathered and assigned; assign_add works on the
// numeric ones (integers wrap, float16/bfloat16 add in float32); they keep
// no slots whatever optimizer they were created with, and apply_* on them is
// InvalidArgument. String variables are not supported.
//
// Errors: unknown shard -> NotFound "no variable 'x' on this parameter
// server"; bad arguments -> InvalidArgument naming the shard and the
// offending value ("apply_dense: gradient float32[3] does not match
// 'w/part_0' float32[4]"); re-creating a shard differently -> AlreadyExists.
//
// Thread-safe: updates to one shard are serialized by the shard's own mutex
// (each is atomic with respect to the others, and a failed call changes
// nothing); different shards proceed in parallel; the name map is guarded by
// a shared_mutex, held only to find a shard, never during a copy or update.
#ifndef CAPSTAN_DAEMONS_PS_SERVER_VARIABLE_STORE_H_
#define CAPSTAN_DAEMONS_PS_SERVER_VARIABLE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "training/optimizer.h"
#include "sync/mutex.h"

namespace capstan::ps_server {

class VariableStore {
 public:
  VariableStore() = default;
  VariableStore(const VariableStore&) = delete;
  VariableStore& operator=(const VariableStore&) = delete;

  // Creates a shard holding a copy of `initial`, with the optimizer's slots
  // (zeros, or initial_accumulator_value for "accumulator") and step 0.
  // Creating an existing shard with the same dtype, shape and optimizer is OK
  // and keeps its current value, slots and step (a reconnecting coordinator
  // re-creates its variables); with a different one -> AlreadyExists naming
  // both. InvalidArgument: an invalid optimizer config, a string or invalid
  // tensor.
  Status create(const std::string& name, const Tensor& initial, const Optimizer& optimizer);
  // create() with a value computed here: rows [first_row, first_row + rows)
  // of the variable of `dtype` and `logical_shape` (the whole variable's)
  // that `initializer` makes (training/initializer.h; a scalar: first_row 0,
  // rows 1). The shard's shape is logical_shape with dim 0 = rows. An
  // existing shard compares as in create() (the initializer is not
  // compared) and nothing is computed for it. InvalidArgument naming a bad
  // initializer value, dtype or row range.
  Status create_initialized(const std::string& name, const Initializer& initializer, DType dtype,
                            const Shape& logical_shape, int64_t first_row, int64_t rows,
                            const Optimizer& optimizer);
  // Drops the shard and its slots. An update already running on it finishes
  // on the dropped copy.
  Status remove(const std::string& name);

  // The value as of now (a snapshot: later updates do not change it). It
  // shares the shard's buffer until the next update (copy-on-write above):
  // callers must not write into it.
  Result<Tensor> read(const std::string& name) const;
  // Rows of a variable of rank >= 1: `ids` (int32 or int64, any shape S)
  // give a tensor of shape S + the row shape. An id outside [0, dim 0) ->
  // InvalidArgument "gather: id 17 is out of range [0, 10) for 'emb/part_1'".
  Result<Tensor> gather(const std::string& name, const Tensor& ids) const;

  // value / delta: the shard's dtype and shape. assign leaves slots and step
  // as they are.
  Status assign(const std::string& name, const Tensor& value);
  // assign without the copy: the shard takes `value`'s buffer, which nobody
  // else may hold or write afterwards (a tensor just received over RPC).
  Status assign_owned(const std::string& name, Tensor value);
  Status assign_add(const std::string& name, const Tensor& delta);
  // Writes rows [first_row, first_row + rows.shape[0]) of a shard of rank
  // >= 1 (its own row numbers) with `rows`: the shard's dtype and row shape,
  // the range inside the shard (InvalidArgument naming what differs).
  // Slots and step stay as they are. A program writes an initial value so,
  // in chunks.
  Status assign_rows(const std::string& name, int64_t first_row, const Tensor& rows);

  // One optimizer update. `step` is the optimizer's iteration count for this
  // update, 1-based (Adam's bias correction); <= 0 uses the shard's counter
  // + 1. The counter becomes max(counter, step). The gradient has the
  // shard's dtype and shape. `learning_rate`: the rate of this update
  // instead of the optimizer's own (and its schedule's), as
  // ApplyOptions::learning_rate; not finite or < 0 -> InvalidArgument
  // naming it, nothing applied.
  Status apply_dense(const std::string& name, const Tensor& gradient, int64_t step = 0,
                     std::optional<double> learning_rate = std::nullopt);
  // A sparse gradient of a variable of rank >= 1: `ids` (int32 or int64,
  // rank 1) name rows, `rows` ([len(ids)] + row shape, the shard's dtype)
  // hold their gradients. Repeated ids are summed first; see
  // apply_sparse_update() in optimizer.h for which rows each optimizer moves.
  // An out-of-range id rejects the whole update.
  Status apply_sparse(const std::string& name, const Tensor& ids, const Tensor& rows,
                      int64_t step = 0, std::optional<double> learning_rate = std::nullopt);

  // One shard at one instant, for a checkpoint: the value and the slots (in
  // the optimizer's slot order), lent as read() lends the value: no copy
  // now, and the shard's next update copies them first while the snapshot
  // lives; and the step; all under the shard's lock.
  struct Snapshot {
    DType dtype = DType::kInvalid;
    Shape shape;
    Tensor value;
    std::vector<std::pair<std::string, Tensor>> slots;
    int64_t step = 0;
    // Changes with every write of the value, a slot or the step (values
    // unique across the store's shards: a shard dropped and created again
    // never repeats one). Equal versions: the same contents (a peer
    // snapshot's delta sends the shards whose version moved).
    int64_t version = 0;
    Optimizer optimizer;
  };
  Result<Snapshot> snapshot(const std::string& name) const;

  struct Info {
    DType dtype;
    Shape shape;
    Optimizer optimizer;
    int64_t step;
    size_t bytes;  // value + slots
  };
  Result<Info> info(const std::string& name) const;
  // Shard names, sorted.
  std::vector<std::string> names() const;
  // Every shard's name and info, sorted by name. Waits for each shard's
  // update in progress: call it off the RPC loop.
  std::vector<std::pair<std::string, Info>> list() const;
  // Copies of the slots by name (empty for sgd, none and non-float shards).
  Result<std::map<std::string, Tensor>> slots(const std::string& name) const;
  // Restores one slot (from a checkpoint): `value` has the shard's dtype and
  // shape; `slot` must be one of the shard's slots.
  Status set_slot(const std::string& name, const std::string& slot, const Tensor& value);
  // Restores the step counter (>= 0).
  Status set_step(const std::string& name, int64_t step);
  // Bytes of all values and slots.
  size_t total_bytes() const;

  // What the store served, for /metrics (successful operations only).
  struct Stats {
    std::atomic<int64_t> reads{0};           // read
    std::atomic<int64_t> read_bytes{0};
    std::atomic<int64_t> gathers{0};         // gather calls
    std::atomic<int64_t> gathered_rows{0};
    std::atomic<int64_t> gathered_bytes{0};
    std::atomic<int64_t> dense_updates{0};   // apply_dense, assign, assign_add
    std::atomic<int64_t> sparse_updates{0};  // apply_sparse
    std::atomic<int64_t> updated_rows{0};    // ids of sparse updates
    std::atomic<int64_t> update_bytes{0};    // gradients and values received
  };
  std::shared_ptr<const Stats> stats() const { return stats_; }

 private:
  void count_dense_update(const Tensor& received);
  // A fresh version for a shard's change (see Snapshot::version).
  int64_t next_version() { return versions_.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::atomic<int64_t> versions_{0};
  struct Shard;
  static Status same_or_conflict(const std::string& name, const Shard& existing, DType dtype, const Shape& shape,
                                 const Optimizer& optimizer);
  // OK or AlreadyExists when `name` exists (see create); nullopt when not.
  std::optional<Status> existing(const std::string& name, DType dtype, const Shape& shape,
                                 const Optimizer& optimizer) const LOCKS_EXCLUDED(map_mu_);
  // Adds a shard holding `value` (its own buffer) with fresh slots.
  Status insert(const std::string& name, Tensor value, const Optimizer& optimizer) LOCKS_EXCLUDED(map_mu_);
  Status assign_impl(const std::string& name, const Tensor& value, bool copy);
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  struct Shard {
    Shard(DType dtype, Shape shape, Optimizer optimizer, size_t bytes)
        : dtype(dtype), shape(std::move(shape)), optimizer(optimizer), bytes(bytes) {}

    // Constant after construction.
    const DType dtype;
    const Shape shape;
    const Optimizer optimizer;
    const size_t bytes;  // value + slots

    mutable Mutex mu;
    // Shared outside the store only through `lent`, read-only.
    Tensor value GUARDED_BY(mu);
    // What read() handed out of `value`: while any of it lives, `value` must
    // not change in place (unshare() first). Mutable: read() is const.
    mutable std::weak_ptr<const Tensor> lent GUARDED_BY(mu);
    // True from read() lending `value` until the last reader's copy is gone.
    // Kept under `mu` (the lent tensor's deleter clears it there), so that a
    // reader's last access happens before an update that finds it false: the
    // weak_ptr's use count alone is read without ordering.
    mutable bool lent_out GUARDED_BY(mu) = false;
    std::vector<Tensor> slot GUARDED_BY(mu);  // slot_names() order, empty if none
    // What snapshot() lent of `slot`, as `lent` and `lent_out` for `value`:
    // while any of it lives, an update copies the slots first.
    mutable std::weak_ptr<const std::vector<Tensor>> slots_lent GUARDED_BY(mu);
    mutable bool slots_lent_out GUARDED_BY(mu) = false;
    int64_t step GUARDED_BY(mu) = 0;
    int64_t version GUARDED_BY(mu) = 0;  // see Snapshot::version
  };

  // The shard's value, lent out (see read()); the caller wraps it.
  static std::shared_ptr<const Tensor> lend(const std::shared_ptr<Shard>& shard) EXCLUSIVE_LOCKS_REQUIRED(shard->mu);
  static Result<Tensor> lent_tensor(const Shard& shard, std::shared_ptr<const Tensor> held);
  static std::shared_ptr<const std::vector<Tensor>> lend_slots(const std::shared_ptr<Shard>& shard)
      EXCLUSIVE_LOCKS_REQUIRED(shard->mu);

  // Makes `value` (and `slot`) the shard's own again before an update in
  // place: a copy if a reader (a snapshot) still holds it.
  static Status unshare(Shard& shard) EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  // The shard, or NotFound.
  Result<std::shared_ptr<Shard>> find(const std::string& name) const LOCKS_EXCLUDED(map_mu_);

  mutable SharedMutex map_mu_;
  std::map<std::string, std::shared_ptr<Shard>> shards_ GUARDED_BY(map_mu_);
};

}  // namespace capstan::ps_server

#endif  // CAPSTAN_DAEMONS_PS_SERVER_VARIABLE_STORE_H_
