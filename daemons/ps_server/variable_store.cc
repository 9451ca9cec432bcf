#include "daemons/ps_server/variable_store.h"
#include "sync/mutex.h"
#include "training/initializer.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include <unistd.h>

namespace capstan::ps_server {
namespace {

using Kind = Optimizer::Kind;

// "float32[4]": how messages show a dtype and shape.
std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + shape_string(shape);
}
std::string describe(const Tensor& t) { return describe(t.dtype(), t.shape()); }

std::string quoted(const std::string& name) { return "'" + name + "'"; }

bool takes_updates(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }

// A fresh buffer with t's bytes (t: a valid, fixed-size dtype).
Result<Tensor> copy_of(const Tensor& t) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor copy, Tensor::uninitialized(t.dtype(), t.shape()));
  if (t.byte_size() > 0) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
  return copy;
}

// Elements per row of a variable of rank >= 1 (product of dims 1..).
int64_t row_elements(const Shape& shape) {
  return shape_num_elements(Shape(shape.begin() + 1, shape.end()));
}

// `ids` (int32 or int64) as int64, each checked against [0, num_rows).
Result<std::vector<int64_t>> checked_ids(const char* op, const std::string& name,
                                         const Tensor& ids, int64_t num_rows) {
  std::vector<int64_t> out;
  if (ids.dtype() == DType::kInt64) {
    auto flat = ids.flat<int64_t>();
    out.assign(flat.begin(), flat.end());
  } else if (ids.dtype() == DType::kInt32) {
    auto flat = ids.flat<int32_t>();
    out.assign(flat.begin(), flat.end());
  } else {
    return Status::InvalidArgument(std::string(op) + ": ids for " + quoted(name) +
                                   " must be int32 or int64, got " + describe(ids));
  }
  for (int64_t id : out) {
    if (id < 0 || id >= num_rows) {
      return Status::InvalidArgument(std::string(op) + ": id " + std::to_string(id) +
                                     " is out of range [0, " + std::to_string(num_rows) +
                                     ") for " + quoted(name));
    }
  }
  return out;
}

// value += delta element-wise, for the numeric dtypes. Integers wrap (the add
// runs in the unsigned type of the same width); float16/bfloat16 add in float.
template <typename T>
void add_into(Tensor& value, const Tensor& delta) {
  auto out = value.mutable_flat<T>();
  auto in = delta.flat<T>();
  for (size_t i = 0; i < out.size(); ++i) {
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      out[i] = T::from_float(out[i].to_float() + in[i].to_float());
    } else if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      out[i] = static_cast<T>(static_cast<U>(static_cast<U>(out[i]) + static_cast<U>(in[i])));
    } else {
      out[i] = out[i] + in[i];
    }
  }
}

template <typename T>
std::vector<std::span<T>> slot_spans(std::vector<Tensor>& slots) {
  std::vector<std::span<T>> spans;
  spans.reserve(slots.size());
  for (Tensor& slot : slots) spans.push_back(slot.mutable_flat<T>());
  return spans;
}

template <typename T>
void fill(Tensor& t, double value) {
  auto flat = t.mutable_flat<T>();
  std::fill(flat.begin(), flat.end(), static_cast<T>(value));
}

// Why apply_* cannot run on a shard, or OK.
Status check_trainable(const char* op, const std::string& name, DType dtype,
                       const Optimizer& optimizer) {
  if (!takes_updates(dtype)) {
    return Status::InvalidArgument(std::string(op) + ": " + quoted(name) + " is " +
                                   std::string(dtype_name(dtype)) +
                                   "; optimizers update float32 and float64 variables only");
  }
  if (optimizer.kind == Kind::kNone) {
    return Status::InvalidArgument(std::string(op) + ": " + quoted(name) +
                                   " has no optimizer (none); it can only be assigned");
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<VariableStore::Shard>> VariableStore::find(const std::string& name) const {
  ReaderMutexLock lock(map_mu_);
  auto it = shards_.find(name);
  if (it == shards_.end()) {
    return Status::NotFound("no variable " + quoted(name) + " on this parameter server");
  }
  return it->second;
}

// Same dtype, shape and optimizer: the re-create of a reconnecting
// coordinator, which keeps what the shard has learned. The value (or the
// initializer) is not compared: the shard's has moved on since.
Status VariableStore::same_or_conflict(const std::string& name, const Shard& existing, DType dtype,
                                       const Shape& shape, const Optimizer& optimizer) {
  if (existing.dtype == dtype && existing.shape == shape && existing.optimizer == optimizer) return Status::Ok();
  return Status::AlreadyExists("create: " + quoted(name) + " already exists as " +
                               describe(existing.dtype, existing.shape) + " with " +
                               training::optimizer_debug_string(existing.optimizer) + ", not " +
                               describe(dtype, shape) + " with " + training::optimizer_debug_string(optimizer));
}

std::optional<Status> VariableStore::existing(const std::string& name, DType dtype, const Shape& shape,
                                              const Optimizer& optimizer) const {
  ReaderMutexLock lock(map_mu_);
  auto it = shards_.find(name);
  if (it == shards_.end()) return std::nullopt;
  return same_or_conflict(name, *it->second, dtype, shape, optimizer);
}

Status VariableStore::create(const std::string& name, const Tensor& initial,
                             const Optimizer& optimizer) {
  if (!initial.valid() || initial.dtype() == DType::kString) {
    return Status::InvalidArgument("create: " + quoted(name) + " cannot hold a " +
                                   std::string(dtype_name(initial.dtype())) + " tensor");
  }
  CAPSTAN_RETURN_IF_ERROR(initial.validate().with_context("create " + quoted(name)));
  CAPSTAN_RETURN_IF_ERROR(training::validate(optimizer).with_context("create " + quoted(name)));
  if (auto status = existing(name, initial.dtype(), initial.shape(), optimizer)) return *status;
  // Build the shard outside the map lock: copying a large value must not
  // stall lookups of other shards.
  CAPSTAN_ASSIGN_OR_RETURN(Tensor value, copy_of(initial));
  return insert(name, std::move(value), optimizer);
}

Status VariableStore::create_initialized(const std::string& name, const Initializer& initializer, DType dtype,
                                         const Shape& logical_shape, int64_t first_row, int64_t rows,
                                         const Optimizer& optimizer) {
  const std::string context = "create " + quoted(name);
  CAPSTAN_RETURN_IF_ERROR(training::validate_initializer(initializer, dtype).with_context(context));
  CAPSTAN_RETURN_IF_ERROR(training::validate(optimizer).with_context(context));
  Shape shape = logical_shape;
  if (!shape.empty()) shape[0] = rows;
  if (auto status = existing(name, dtype, shape, optimizer)) return *status;  // nothing computed again
  // A few bytes of request can ask for any size: refuse one this machine
  // cannot hold (with overcommit the allocation would succeed and filling
  // it would get the server killed).
  const int64_t elements = shape_num_elements(shape);
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (elements >= 0 && dtype_size(dtype) > 0 && pages > 0 && page_size > 0 &&
      static_cast<double>(elements) * static_cast<double>(dtype_size(dtype)) >
          static_cast<double>(pages) * static_cast<double>(page_size)) {
    return Status::InvalidArgument(context + ": " + describe(dtype, shape) +
                                     " is larger than this machine's memory");
  }
  auto value = training::initial_rows(initializer, dtype, logical_shape, first_row, rows);
  if (!value.ok()) return value.status().with_context(context);
  return insert(name, std::move(*value), optimizer);
}

Status VariableStore::insert(const std::string& name, Tensor value, const Optimizer& optimizer) {
  const DType dtype = value.dtype();
  std::vector<Tensor> slots;
  if (takes_updates(dtype)) {
    std::vector<std::string> slot_list = training::slot_names(optimizer.kind);
    for (size_t i = 0; i < slot_list.size(); ++i) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor slot, Tensor::zeros(dtype, value.shape()));
      double init = training::slot_initial_value(optimizer, i);
      if (init != 0.0) {
        if (dtype == DType::kFloat32) {
          fill<float>(slot, init);
        } else {
          fill<double>(slot, init);
        }
      }
      slots.push_back(std::move(slot));
    }
  }
  size_t bytes = value.byte_size() * (1 + slots.size());
  auto shard = std::make_shared<Shard>(dtype, value.shape(), optimizer, bytes);
  {
    MutexLock init(shard->mu);  // not shared yet: uncontended, but it keeps the analysis exact
    shard->value = std::move(value);
    shard->slot = std::move(slots);
    shard->version = next_version();
  }

  WriterMutexLock lock(map_mu_);
  auto [it, inserted] = shards_.try_emplace(name, shard);
  if (!inserted) return same_or_conflict(name, *it->second, shard->dtype, shard->shape, optimizer);  // created meanwhile
  return Status::Ok();
}

Status VariableStore::remove(const std::string& name) {
  std::shared_ptr<Shard> dropped;  // freed after the map lock is released
  WriterMutexLock lock(map_mu_);
  auto it = shards_.find(name);
  if (it == shards_.end()) {
    return Status::NotFound("no variable " + quoted(name) + " on this parameter server");
  }
  dropped = std::move(it->second);
  shards_.erase(it);
  return Status::Ok();
}

void VariableStore::count_dense_update(const Tensor& received) {
  stats_->dense_updates.fetch_add(1, std::memory_order_relaxed);
  stats_->update_bytes.fetch_add(static_cast<int64_t>(received.byte_size()), std::memory_order_relaxed);
}

Status VariableStore::unshare(Shard& shard) {
  if (shard.slots_lent_out) {
    std::vector<Tensor> own;
    for (const Tensor& t : shard.slot) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor copy, copy_of(t));
      own.push_back(std::move(copy));
    }
    shard.slot = std::move(own);
    shard.slots_lent.reset();
    shard.slots_lent_out = false;
  }
  if (!shard.lent_out) return Status::Ok();
  CAPSTAN_ASSIGN_OR_RETURN(Tensor own, copy_of(shard.value));
  shard.value = std::move(own);
  shard.lent.reset();
  shard.lent_out = false;
  return Status::Ok();
}

std::shared_ptr<const std::vector<Tensor>> VariableStore::lend_slots(const std::shared_ptr<Shard>& shard) {
  std::shared_ptr<const std::vector<Tensor>> held = shard->slots_lent.lock();
  if (held != nullptr) return held;
  std::weak_ptr<Shard> owner = shard;
  held = std::shared_ptr<const std::vector<Tensor>>(new std::vector<Tensor>(shard->slot),
                                                    [owner](const std::vector<Tensor>* lent) {
                                                      if (auto s = owner.lock()) {
                                                        MutexLock relock(s->mu);
                                                        if (s->slots_lent.expired()) s->slots_lent_out = false;
                                                      }
                                                      delete lent;
                                                    });
  shard->slots_lent = held;
  shard->slots_lent_out = true;
  return held;
}

std::shared_ptr<const Tensor> VariableStore::lend(const std::shared_ptr<Shard>& shard) {
  std::shared_ptr<const Tensor> held = shard->lent.lock();
  if (held != nullptr) return held;
  // The last copy's deleter says, under the shard's lock, that the value is
  // no longer lent (unless it was replaced and lent again meanwhile).
  std::weak_ptr<Shard> owner = shard;
  held = std::shared_ptr<const Tensor>(new Tensor(shard->value), [owner](const Tensor* lent) {
    if (auto s = owner.lock()) {
      MutexLock relock(s->mu);
      if (s->lent.expired()) s->lent_out = false;
    }
    delete lent;
  });
  shard->lent = held;
  shard->lent_out = true;
  return held;
}

Result<Tensor> VariableStore::lent_tensor(const Shard& shard, std::shared_ptr<const Tensor> held) {
  // The tensor's owner is `held`: the shard sees the value as lent until the
  // last copy of this tensor is gone. The store never writes a lent buffer.
  std::byte* data = const_cast<std::byte*>(held->data());
  size_t size = held->byte_size();
  return Tensor::from_buffer(shard.dtype, shard.shape, std::const_pointer_cast<Tensor>(held), data, size);
}

Result<Tensor> VariableStore::read(const std::string& name) const {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  std::shared_ptr<const Tensor> held;
  {
    MutexLock lock(shard->mu);
    held = lend(shard);
  }
  stats_->reads.fetch_add(1, std::memory_order_relaxed);
  stats_->read_bytes.fetch_add(static_cast<int64_t>(held->byte_size()), std::memory_order_relaxed);
  return lent_tensor(*shard, std::move(held));
}

Result<VariableStore::Snapshot> VariableStore::snapshot(const std::string& name) const {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  std::vector<std::string> slot_list = training::slot_names(shard->optimizer.kind);
  Snapshot out;
  out.dtype = shard->dtype;
  out.shape = shard->shape;
  std::shared_ptr<const Tensor> held;
  std::shared_ptr<const std::vector<Tensor>> slots;
  {
    MutexLock lock(shard->mu);
    held = lend(shard);
    if (!shard->slot.empty()) slots = lend_slots(shard);
    out.step = shard->step;
    out.version = shard->version;
  }
  out.optimizer = shard->optimizer;
  CAPSTAN_ASSIGN_OR_RETURN(out.value, lent_tensor(*shard, std::move(held)));
  for (size_t i = 0; slots != nullptr && i < slots->size(); ++i) {
    const Tensor& t = (*slots)[i];
    // Owned by `slots`: the shard sees them lent until the last view goes.
    CAPSTAN_ASSIGN_OR_RETURN(Tensor view, Tensor::from_buffer(t.dtype(), t.shape(), std::const_pointer_cast<std::vector<Tensor>>(slots),
                                                             const_cast<std::byte*>(t.data()), t.byte_size()));
    out.slots.emplace_back(slot_list[i], std::move(view));
  }
  return out;
}

Result<Tensor> VariableStore::gather(const std::string& name, const Tensor& ids) const {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  if (shard->shape.empty()) {
    return Status::InvalidArgument("gather: " + quoted(name) + " is a scalar " +
                                   describe(shard->dtype, shard->shape) +
                                   "; gather needs rank >= 1");
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> id_list,
                           checked_ids("gather", name, ids, shard->shape[0]));
  Shape out_shape = ids.shape();
  out_shape.insert(out_shape.end(), shard->shape.begin() + 1, shard->shape.end());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(shard->dtype, out_shape));
  const size_t row_bytes = static_cast<size_t>(row_elements(shard->shape)) *
                           dtype_size(shard->dtype);
  stats_->gathers.fetch_add(1, std::memory_order_relaxed);
  stats_->gathered_rows.fetch_add(static_cast<int64_t>(id_list.size()), std::memory_order_relaxed);
  stats_->gathered_bytes.fetch_add(static_cast<int64_t>(out.byte_size()), std::memory_order_relaxed);
  if (row_bytes == 0) return out;
  MutexLock lock(shard->mu);
  for (size_t j = 0; j < id_list.size(); ++j) {
    std::memcpy(out.mutable_data() + j * row_bytes,
                shard->value.data() + static_cast<size_t>(id_list[j]) * row_bytes, row_bytes);
  }
  return out;
}

Status VariableStore::assign(const std::string& name, const Tensor& value) {
  return assign_impl(name, value, /*copy=*/true);
}

Status VariableStore::assign_owned(const std::string& name, Tensor value) {
  return assign_impl(name, value, /*copy=*/false);
}

Status VariableStore::assign_impl(const std::string& name, const Tensor& value, bool copy) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  if (value.dtype() != shard->dtype || value.shape() != shard->shape) {
    return Status::InvalidArgument("assign: value " + describe(value) + " does not match " +
                                   quoted(name) + " " + describe(shard->dtype, shard->shape));
  }
  CAPSTAN_RETURN_IF_ERROR(value.validate().with_context("assign " + quoted(name)));
  Tensor fresh = value;
  if (copy) {
    CAPSTAN_ASSIGN_OR_RETURN(fresh, copy_of(value));
  }
  Tensor old;  // freed outside the shard lock
  MutexLock lock(shard->mu);
  old = std::exchange(shard->value, std::move(fresh));
  shard->version = next_version();
  shard->lent.reset();  // what was lent is `old`, which readers keep
  shard->lent_out = false;
  count_dense_update(value);
  return Status::Ok();
}

Status VariableStore::assign_add(const std::string& name, const Tensor& delta) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  if (delta.dtype() != shard->dtype || delta.shape() != shard->shape) {
    return Status::InvalidArgument("assign_add: delta " + describe(delta) + " does not match " +
                                   quoted(name) + " " + describe(shard->dtype, shard->shape));
  }
  if (shard->dtype == DType::kBool) {
    return Status::InvalidArgument("assign_add: " + quoted(name) +
                                   " is bool; assign_add needs a numeric variable");
  }
  CAPSTAN_RETURN_IF_ERROR(delta.validate().with_context("assign_add " + quoted(name)));
  MutexLock lock(shard->mu);
  CAPSTAN_RETURN_IF_ERROR(unshare(*shard));
  shard->version = next_version();
  Tensor& value = shard->value;
  switch (shard->dtype) {
    case DType::kFloat16: add_into<Float16>(value, delta); break;
    case DType::kBFloat16: add_into<BFloat16>(value, delta); break;
    case DType::kFloat32: add_into<float>(value, delta); break;
    case DType::kFloat64: add_into<double>(value, delta); break;
    case DType::kInt8: add_into<int8_t>(value, delta); break;
    case DType::kInt16: add_into<int16_t>(value, delta); break;
    case DType::kInt32: add_into<int32_t>(value, delta); break;
    case DType::kInt64: add_into<int64_t>(value, delta); break;
    case DType::kUInt8: add_into<uint8_t>(value, delta); break;
    case DType::kBool:
    case DType::kString:
    case DType::kInvalid:
      break;  // rejected above or at create
  }
  count_dense_update(delta);
  return Status::Ok();
}

Status VariableStore::assign_rows(const std::string& name, int64_t first_row, const Tensor& rows) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  if (shard->shape.empty()) {
    return Status::InvalidArgument("assign_rows: " + quoted(name) + " is a scalar " +
                                   describe(shard->dtype, shard->shape) + "; assign it whole");
  }
  const Shape row_shape(shard->shape.begin() + 1, shard->shape.end());
  if (rows.dtype() != shard->dtype || rows.rank() < 1 || Shape(rows.shape().begin() + 1, rows.shape().end()) != row_shape) {
    return Status::InvalidArgument("assign_rows: rows " + describe(rows) + " do not match the rows of " +
                                   quoted(name) + " " + describe(shard->dtype, shard->shape));
  }
  const int64_t n = rows.shape()[0];
  if (first_row < 0 || first_row > shard->shape[0] || n > shard->shape[0] - first_row) {
    return Status::InvalidArgument("assign_rows: rows [" + std::to_string(first_row) + ", " +
                                   std::to_string(first_row) + " + " + std::to_string(n) + ") are outside " +
                                   quoted(name) + "'s " + std::to_string(shard->shape[0]) + " rows");
  }
  CAPSTAN_RETURN_IF_ERROR(rows.validate().with_context("assign_rows " + quoted(name)));
  const size_t row_bytes = static_cast<size_t>(row_elements(shard->shape)) * dtype_size(shard->dtype);
  MutexLock lock(shard->mu);
  CAPSTAN_RETURN_IF_ERROR(unshare(*shard));
  shard->version = next_version();
  if (rows.byte_size() > 0) {
    std::memcpy(shard->value.mutable_data() + static_cast<size_t>(first_row) * row_bytes, rows.data(),
                rows.byte_size());
  }
  count_dense_update(rows);
  return Status::Ok();
}

Status VariableStore::apply_dense(const std::string& name, const Tensor& gradient, int64_t step,
                                  std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  CAPSTAN_RETURN_IF_ERROR(check_trainable("apply_dense", name, shard->dtype, shard->optimizer));
  if (learning_rate) {
    CAPSTAN_RETURN_IF_ERROR(training::validate_learning_rate_override(*learning_rate)
                                .with_context("apply_dense " + quoted(name)));
  }
  if (gradient.dtype() != shard->dtype || gradient.shape() != shard->shape) {
    return Status::InvalidArgument("apply_dense: gradient " + describe(gradient) +
                                   " does not match " + quoted(name) + " " +
                                   describe(shard->dtype, shard->shape));
  }
  CAPSTAN_RETURN_IF_ERROR(gradient.validate().with_context("apply_dense " + quoted(name)));
  MutexLock lock(shard->mu);
  CAPSTAN_RETURN_IF_ERROR(unshare(*shard));
  shard->version = next_version();
  int64_t t = step > 0 ? step : shard->step + 1;
  if (shard->dtype == DType::kFloat32) {
    auto slots = slot_spans<float>(shard->slot);
    training::apply_dense_update<float>(shard->optimizer, t, shard->value.mutable_flat<float>(), slots,
                                        gradient.flat<float>(), learning_rate);
  } else {
    auto slots = slot_spans<double>(shard->slot);
    training::apply_dense_update<double>(shard->optimizer, t, shard->value.mutable_flat<double>(), slots,
                                         gradient.flat<double>(), learning_rate);
  }
  shard->step = std::max(shard->step, t);
  count_dense_update(gradient);
  return Status::Ok();
}

Status VariableStore::apply_sparse(const std::string& name, const Tensor& ids, const Tensor& rows,
                                   int64_t step, std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  CAPSTAN_RETURN_IF_ERROR(check_trainable("apply_sparse", name, shard->dtype, shard->optimizer));
  if (learning_rate) {
    CAPSTAN_RETURN_IF_ERROR(training::validate_learning_rate_override(*learning_rate)
                                .with_context("apply_sparse " + quoted(name)));
  }
  if (shard->shape.empty()) {
    return Status::InvalidArgument("apply_sparse: " + quoted(name) + " is a scalar " +
                                   describe(shard->dtype, shard->shape) +
                                   "; sparse updates need rank >= 1");
  }
  if (ids.rank() != 1) {
    return Status::InvalidArgument("apply_sparse: ids for " + quoted(name) +
                                   " must have rank 1, got " + describe(ids));
  }
  Shape expected = {ids.shape()[0]};
  expected.insert(expected.end(), shard->shape.begin() + 1, shard->shape.end());
  if (rows.dtype() != shard->dtype || rows.shape() != expected) {
    return Status::InvalidArgument("apply_sparse: rows " + describe(rows) + " do not match " +
                                   std::to_string(ids.shape()[0]) + " ids of " + quoted(name) +
                                   " " + describe(shard->dtype, shard->shape) + ": expected " +
                                   describe(shard->dtype, expected));
  }
  CAPSTAN_RETURN_IF_ERROR(rows.validate().with_context("apply_sparse " + quoted(name)));
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> id_list,
                           checked_ids("apply_sparse", name, ids, shard->shape[0]));
  const int64_t row_size = row_elements(shard->shape);

  MutexLock lock(shard->mu);
  CAPSTAN_RETURN_IF_ERROR(unshare(*shard));
  shard->version = next_version();
  int64_t t = step > 0 ? step : shard->step + 1;
  if (row_size > 0) {  // rows of no elements: nothing to move, but the step counts
    if (shard->dtype == DType::kFloat32) {
      auto slots = slot_spans<float>(shard->slot);
      training::apply_sparse_update<float>(shard->optimizer, t, row_size,
                                           shard->value.mutable_flat<float>(), slots, id_list,
                                           rows.flat<float>(), learning_rate);
    } else {
      auto slots = slot_spans<double>(shard->slot);
      training::apply_sparse_update<double>(shard->optimizer, t, row_size,
                                            shard->value.mutable_flat<double>(), slots, id_list,
                                            rows.flat<double>(), learning_rate);
    }
  }
  shard->step = std::max(shard->step, t);
  stats_->sparse_updates.fetch_add(1, std::memory_order_relaxed);
  stats_->updated_rows.fetch_add(static_cast<int64_t>(id_list.size()), std::memory_order_relaxed);
  stats_->update_bytes.fetch_add(static_cast<int64_t>(rows.byte_size() + ids.byte_size()), std::memory_order_relaxed);
  return Status::Ok();
}

Result<VariableStore::Info> VariableStore::info(const std::string& name) const {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  MutexLock lock(shard->mu);
  return Info{shard->dtype, shard->shape, shard->optimizer, shard->step, shard->bytes};
}

std::vector<std::string> VariableStore::names() const {
  ReaderMutexLock lock(map_mu_);
  std::vector<std::string> out;
  out.reserve(shards_.size());
  for (const auto& [name, shard] : shards_) out.push_back(name);
  return out;  // std::map keeps them sorted
}

std::vector<std::pair<std::string, VariableStore::Info>> VariableStore::list() const {
  std::vector<std::pair<std::string, Info>> out;
  for (const std::string& name : names()) {
    auto info_or = info(name);
    if (info_or.ok()) out.emplace_back(name, std::move(*info_or));  // else removed meanwhile
  }
  return out;
}

Result<std::map<std::string, Tensor>> VariableStore::slots(const std::string& name) const {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  std::vector<std::string> slot_list = training::slot_names(shard->optimizer.kind);
  std::map<std::string, Tensor> out;
  MutexLock lock(shard->mu);
  for (size_t i = 0; i < shard->slot.size(); ++i) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor copy, copy_of(shard->slot[i]));
    out.emplace(slot_list[i], std::move(copy));
  }
  return out;
}

Status VariableStore::set_slot(const std::string& name, const std::string& slot,
                               const Tensor& value) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  std::vector<std::string> slot_list;
  if (takes_updates(shard->dtype)) slot_list = training::slot_names(shard->optimizer.kind);
  auto it = std::find(slot_list.begin(), slot_list.end(), slot);
  if (it == slot_list.end()) {
    std::string known;
    for (const std::string& s : slot_list) known += (known.empty() ? "" : ", ") + s;
    return Status::InvalidArgument("set_slot: " + quoted(name) + " (" +
                                   optimizer_name(shard->optimizer.kind) + ", " +
                                   std::string(dtype_name(shard->dtype)) + ") has no slot " +
                                   quoted(slot) + "; its slots: " +
                                   (known.empty() ? "none" : known));
  }
  if (value.dtype() != shard->dtype || value.shape() != shard->shape) {
    return Status::InvalidArgument("set_slot: slot " + quoted(slot) + " value " +
                                   describe(value) + " does not match " + quoted(name) + " " +
                                   describe(shard->dtype, shard->shape));
  }
  CAPSTAN_RETURN_IF_ERROR(value.validate().with_context("set_slot " + quoted(name)));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor fresh, copy_of(value));
  Tensor old;  // freed outside the shard lock
  MutexLock lock(shard->mu);
  old = std::exchange(shard->slot[static_cast<size_t>(it - slot_list.begin())], std::move(fresh));
  shard->version = next_version();
  return Status::Ok();
}

Status VariableStore::set_step(const std::string& name, int64_t step) {
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, find(name));
  if (step < 0) {
    return Status::InvalidArgument("set_step: step " + std::to_string(step) + " for " +
                                   quoted(name) + " must be >= 0");
  }
  MutexLock lock(shard->mu);
  shard->step = step;
  shard->version = next_version();
  return Status::Ok();
}

size_t VariableStore::total_bytes() const {
  ReaderMutexLock lock(map_mu_);
  size_t total = 0;
  for (const auto& [name, shard] : shards_) total += shard->bytes;
  return total;
}

}  // namespace capstan::ps_server
