#include "training/variable_router.h"

#include <algorithm>
#include <cstring>

#include "data/tensor_util.h"
#include "async/status_exception.h"
#include "rpc/optimizer_codec.h"
#include "rpc/placement_codec.h"
#include "sync/mutex.h"

namespace capstan {
namespace {

Result<std::vector<int64_t>> ids_of(const Tensor& ids) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(ids.num_elements(), 0)));
  if (ids.dtype() == DType::kInt64) {
    for (int64_t id : ids.flat<int64_t>()) out.push_back(id);
  } else if (ids.dtype() == DType::kInt32) {
    for (int32_t id : ids.flat<int32_t>()) out.push_back(id);
  } else {
    return Status::InvalidArgument("ids must be int32 or int64, not " + std::string(dtype_name(ids.dtype())));
  }
  return out;
}

// The shard holding `row`: the last one whose first_row <= row.
size_t shard_of(const VariableLocation& v, int64_t row) {
  size_t lo = 0, hi = v.shards.size();
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (v.shards[mid].first_row <= row) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace

VariableRouter::PlacementFetcher placements_from(rpc::Connection& connection, kj::Timer& timer) {
  return [conn = &connection, timer = &timer]() {
    return conn->service<wire::Coordinator>(timer->now() + 10 * kj::SECONDS)
        .then([](wire::Coordinator::Client c) { return c.placementsRequest().send(); })
        .then([](capnp::Response<wire::Coordinator::PlacementsResults>&& r) {
          std::vector<VariableLocation> variables;
          for (auto v : r.getPlacements().getVariables()) variables.push_back(rpc::location_from_wire(v));
          return std::make_pair(r.getPlacements().getVersion(), std::move(variables));
        });
  };
}

VariableRouter::VariableRouter(async::LoopThread& loop, rpc::ConnectOptions options,
                               rpc::CodecOptions codec, std::chrono::milliseconds call_timeout,
                               PlacementFetcher fetch)
    : loop_(loop), options_(std::move(options)), codec_(codec), call_timeout_(call_timeout),
      fetch_(std::move(fetch)) {}

VariableRouter::~VariableRouter() {
  try {
    loop_.run_sync([this]() { connections_.clear(); });
  } catch (const kj::Exception&) {
    // The loop is gone, and its connections with it.
  }
}

template <typename T, typename Make>
Result<T> VariableRouter::on_loop(const std::string& what, Make make) {
  try {
    return loop_.run_sync([this, &what, &make]() {
      return rpc::with_deadline<T>(loop_.timer(), make(), call_timeout_, what);
    });
  } catch (const kj::Exception& e) {
    return async::from_exception(e).with_context(what);
  }
}

rpc::Connection& VariableRouter::connection(const std::string& address) {
  auto it = connections_.find(address);
  if (it == connections_.end()) {
    it = connections_.emplace(address, kj::heap<rpc::Connection>(loop_.io(), loop_.timer(), address, options_)).first;
  }
  return *it->second;
}

kj::Promise<wire::ParameterServer::Client> VariableRouter::ps(const std::string& address) {
  // A parameter server that is down fails the call quickly (Unavailable).
  auto deadline = loop_.timer().now() + 2 * kj::SECONDS;
  return connection(address).service<wire::ParameterServer>(deadline);
}

Status VariableRouter::refresh() {
  auto fetched = on_loop<std::pair<int64_t, std::vector<VariableLocation>>>(
      "fetching variable placements", [this]() { return fetch_(); });
  if (!fetched.ok()) return fetched.status();
  MutexLock lock(mutex_);
  version_ = fetched->first;
  variables_.clear();
  for (auto& v : fetched->second) variables_[v.name] = std::move(v);
  return Status::Ok();
}

Status VariableRouter::refresh_if_older(int64_t version) {
  {
    MutexLock lock(mutex_);
    if (version_ >= version) return Status::Ok();
  }
  return refresh();
}

void VariableRouter::remember(VariableLocation location) {
  MutexLock lock(mutex_);
  variables_[location.name] = std::move(location);
}

Result<VariableLocation> VariableRouter::locate(const std::string& variable) {
  {
    MutexLock lock(mutex_);
    auto it = variables_.find(variable);
    if (it != variables_.end()) return it->second;
  }
  CAPSTAN_RETURN_IF_ERROR(refresh());
  MutexLock lock(mutex_);
  auto it = variables_.find(variable);
  if (it == variables_.end()) return Status::NotFound("variable '" + variable + "' does not exist");
  return it->second;
}

namespace {

Status not_for_tables(const VariableLocation& v, const char* op) {
  if (!v.table) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": '" + v.name +
                                 "' is an embedding table: use lookup(ids) and apply_sparse_gradients");
}

}  // namespace

kj::Promise<kj::Array<Tensor>> VariableRouter::read_shards(const VariableLocation& v) {
  auto reads = kj::heapArrayBuilder<kj::Promise<Tensor>>(v.shards.size());
  for (const auto& shard : v.shards) {
    reads.add(ps(shard.ps_address).then([this, name = shard.name](wire::ParameterServer::Client client) {
      auto request = client.readRequest();
      request.setName(name);
      request.setInlineLimit(codec_.whole_chunk_limit);
      return request.send().then([this](capnp::Response<wire::ParameterServer::ReadResults>&& r) {
        return rpc::read_tensor(r.getValue(), codec_).attach(kj::mv(r));
      });
    }));
  }
  return kj::joinPromises(reads.finish());
}

namespace {

// A variable's value from its shards' parts, in row order.
Result<Tensor> whole(const kj::Array<Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  std::vector<const Tensor*> pointers;
  for (const auto& p : parts) pointers.push_back(&p);
  return data::concat_rows(pointers);
}

}  // namespace

Result<Tensor> VariableRouter::read(const std::string& variable) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variable));
  CAPSTAN_RETURN_IF_ERROR(not_for_tables(v, "read"));
  auto parts = on_loop<kj::Array<Tensor>>("read '" + variable + "'", [this, &v]() { return read_shards(v); });
  if (!parts.ok()) return parts.status();
  return whole(*parts);
}

Result<std::vector<Tensor>> VariableRouter::read_many(const std::vector<std::string>& variables) {
  std::vector<VariableLocation> located;
  for (const auto& variable : variables) {
    CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variable));
    CAPSTAN_RETURN_IF_ERROR(not_for_tables(v, "read"));
    located.push_back(std::move(v));
  }
  // Every shard of every variable at once: one round trip for all of them.
  auto parts = on_loop<kj::Array<kj::Array<Tensor>>>(
      "read of " + std::to_string(variables.size()) + " variables", [this, &located]() {
        auto reads = kj::heapArrayBuilder<kj::Promise<kj::Array<Tensor>>>(located.size());
        for (const auto& v : located) reads.add(read_shards(v));
        return kj::joinPromises(reads.finish());
      });
  if (!parts.ok()) return parts.status();
  std::vector<Tensor> values;
  for (const auto& p : *parts) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor value, whole(p));
    values.push_back(std::move(value));
  }
  return values;
}

Result<Tensor> VariableRouter::gather(const std::string& variable, const Tensor& ids) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variable));
  CAPSTAN_RETURN_IF_ERROR(not_for_tables(v, "gather"));
  if (v.shape.empty()) return Status::InvalidArgument("gather: '" + variable + "' is a scalar");
  if (v.dtype == DType::kString) return Status::InvalidArgument("gather: '" + variable + "' holds strings");
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> all, ids_of(ids));
  // Route every id to its shard, remembering where its row goes.
  std::vector<std::vector<int64_t>> local(v.shards.size());
  std::vector<std::vector<size_t>> positions(v.shards.size());
  for (size_t i = 0; i < all.size(); ++i) {
    int64_t id = all[i];
    if (id < 0 || id >= v.shape[0]) {
      return Status::InvalidArgument("gather: id " + std::to_string(id) + " is out of range [0, " +
                                     std::to_string(v.shape[0]) + ") for '" + variable + "'");
    }
    size_t s = shard_of(v, id);
    local[s].push_back(id - v.shards[s].first_row);
    positions[s].push_back(i);
  }
  Shape shape = ids.shape();
  shape.insert(shape.end(), v.shape.begin() + 1, v.shape.end());
  return fetch_rows(v, "gather '" + variable + "'", local, positions, std::move(shape),
                    [this](wire::ParameterServer::Client client, const std::string& name, const Tensor& shard_ids) {
                      auto request = client.gatherRequest();
                      request.setName(name);
                      request.setInlineLimit(codec_.whole_chunk_limit);
                      rpc::write_tensor(request.initIds(), shard_ids, codec_);
                      return request.send().then([this](capnp::Response<wire::ParameterServer::GatherResults>&& r) {
                        return rpc::read_tensor(r.getRows(), codec_).attach(kj::mv(r));
                      });
                    });
}

Result<Tensor> VariableRouter::fetch_rows(const VariableLocation& v, const std::string& what,
                                          const std::vector<std::vector<int64_t>>& local,
                                          const std::vector<std::vector<size_t>>& positions, Shape shape,
                                          const AskShard& ask) {
  std::vector<Tensor> requests(v.shards.size());
  std::vector<size_t> used;
  for (size_t s = 0; s < v.shards.size(); ++s) {
    if (local[s].empty()) continue;
    CAPSTAN_ASSIGN_OR_RETURN(requests[s], Tensor::from_vector<int64_t>(local[s], {static_cast<int64_t>(local[s].size())}));
    used.push_back(s);
  }
  auto parts = on_loop<kj::Array<Tensor>>(what, [this, &v, &requests, &used, &ask]() {
    auto calls = kj::heapArrayBuilder<kj::Promise<Tensor>>(used.size());
    for (size_t s : used) {
      calls.add(ps(v.shards[s].ps_address).then([&ask, name = v.shards[s].name, ids = requests[s]](
                                                 wire::ParameterServer::Client client) {
        return ask(kj::mv(client), name, ids);
      }));
    }
    return kj::joinPromises(calls.finish());
  });
  if (!parts.ok()) return parts.status();
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(v.dtype, shape));
  size_t count = 0;
  for (const auto& p : positions) count += p.size();
  const size_t row = count == 0 ? 0 : out.byte_size() / count;  // bytes of one id's row
  for (size_t k = 0; k < used.size(); ++k) {
    const Tensor& part = (*parts)[k];
    const auto& where = positions[used[k]];
    if (part.dtype() != v.dtype || part.byte_size() != where.size() * row) {
      return Status::Internal(what + ": " + v.shards[used[k]].ps_address + " answered " + part.debug_string(0) +
                              " for " + std::to_string(where.size()) + " ids");
    }
    for (size_t j = 0; j < where.size(); ++j) {
      std::memcpy(out.mutable_data() + where[j] * row, part.data() + j * row, row);
    }
  }
  return out;
}

Result<std::vector<Tensor>> VariableRouter::update_parts(const VariableLocation& v, const Tensor& value) {
  CAPSTAN_RETURN_IF_ERROR(not_for_tables(v, "assign/apply_gradients"));
  if (value.dtype() != v.dtype || value.shape() != v.shape) {
    return Status::InvalidArgument("'" + v.name + "' is " + std::string(dtype_name(v.dtype)) + shape_string(v.shape) +
                                   ", the update is " + std::string(dtype_name(value.dtype())) +
                                   shape_string(value.shape()));
  }
  std::vector<Tensor> parts;
  for (const auto& shard : v.shards) {
    if (v.shards.size() == 1) {
      parts.push_back(value);
      continue;
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor part, data::slice_rows(value, shard.first_row, shard.first_row + shard.rows));
    parts.push_back(std::move(part));
  }
  return parts;
}

kj::Promise<void> VariableRouter::send_update(const VariableLocation& v, const std::vector<Tensor>& parts,
                                              Update kind, int64_t step, std::optional<double> learning_rate) {
  auto updates = kj::heapArrayBuilder<kj::Promise<void>>(v.shards.size());
  for (size_t s = 0; s < v.shards.size(); ++s) {
    updates.add(ps(v.shards[s].ps_address).then([this, kind, step, learning_rate, name = v.shards[s].name,
                                               part = parts[s]](wire::ParameterServer::Client client) {
      if (kind == Update::kAssign) {
        auto request = client.assignRequest();
        request.setName(name);
        rpc::write_tensor(request.initValue(), part, codec_);
        return request.send().ignoreResult();
      }
      if (kind == Update::kAssignAdd) {
        auto request = client.assignAddRequest();
        request.setName(name);
        rpc::write_tensor(request.initDelta(), part, codec_);
        return request.send().ignoreResult();
      }
      auto request = client.applyDenseRequest();
      request.setName(name);
      request.setStep(step);
      if (learning_rate) {
        request.setHasLearningRate(true);
        request.setLearningRate(*learning_rate);
      }
      rpc::write_tensor(request.initGradient(), part, codec_);
      return request.send().ignoreResult();
    }));
  }
  return kj::joinPromises(updates.finish());
}

Status VariableRouter::update_rows(const std::string& variable, const Tensor& value, Update kind,
                                   int64_t step, std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variable));
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<Tensor> parts, update_parts(v, value));
  const char* what = kind == Update::kAssign ? "assign" : kind == Update::kAssignAdd ? "assign_add" : "apply_gradients";
  auto done = on_loop<bool>(std::string(what) + " '" + variable + "'", [this, &v, &parts, kind, step, learning_rate]() {
    return send_update(v, parts, kind, step, learning_rate).then([]() { return true; });
  });
  return done.status();
}

Status VariableRouter::apply_dense_many(const std::vector<std::string>& variables,
                                        const std::vector<Tensor>& gradients, int64_t step,
                                        std::optional<double> learning_rate) {
  if (variables.size() != gradients.size()) {
    return Status::InvalidArgument("apply_gradients_many: " + std::to_string(variables.size()) + " variables but " +
                                   std::to_string(gradients.size()) + " gradients");
  }
  // Everything is checked before anything is sent.
  std::vector<VariableLocation> located;
  std::vector<std::vector<Tensor>> parts;
  for (size_t i = 0; i < variables.size(); ++i) {
    CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variables[i]));
    CAPSTAN_ASSIGN_OR_RETURN(std::vector<Tensor> p, update_parts(v, gradients[i]));
    located.push_back(std::move(v));
    parts.push_back(std::move(p));
  }
  auto done = on_loop<bool>("apply_gradients of " + std::to_string(variables.size()) + " variables",
                            [this, &located, &parts, step, learning_rate]() {
                              auto updates = kj::heapArrayBuilder<kj::Promise<void>>(located.size());
                              for (size_t i = 0; i < located.size(); ++i) {
                                updates.add(send_update(located[i], parts[i], Update::kApplyDense, step,
                                                        learning_rate));
                              }
                              return kj::joinPromises(updates.finish()).then([]() { return true; });
                            });
  return done.status();
}

Status VariableRouter::write_rows(const VariableLocation& v, const Tensor& value, size_t max_chunk_bytes) {
  CAPSTAN_RETURN_IF_ERROR(not_for_tables(v, "write_rows"));
  if (value.dtype() != v.dtype || value.shape() != v.shape || v.shape.empty()) {
    return Status::InvalidArgument("write_rows: '" + v.name + "' is " + std::string(dtype_name(v.dtype)) +
                                   shape_string(v.shape) + ", the value " + std::string(dtype_name(value.dtype())) +
                                   shape_string(value.shape()) + " (a value of rank >= 1 is written by rows)");
  }
  const size_t row_bytes = value.shape()[0] == 0 ? 0 : value.byte_size() / static_cast<size_t>(value.shape()[0]);
  const int64_t chunk_rows =
      row_bytes == 0 ? std::max<int64_t>(1, value.shape()[0])
                     : std::max<int64_t>(1, static_cast<int64_t>(max_chunk_bytes / row_bytes));
  // Chunks share the value's buffer (kept by `owner`); the store copies
  // them into the shard.
  auto owner = std::make_shared<Tensor>(value);
  std::byte* base = const_cast<std::byte*>(owner->data());
  auto chunk = [&](int64_t first, int64_t rows) -> Result<Tensor> {
    Shape shape = value.shape();
    shape[0] = rows;
    return Tensor::from_buffer(value.dtype(), std::move(shape), owner, base + static_cast<size_t>(first) * row_bytes,
                               static_cast<size_t>(rows) * row_bytes);
  };
  for (int64_t round = 0;; ++round) {
    struct Write {
      std::string address, shard;
      int64_t first_row;  // in the shard
      Tensor rows;
    };
    std::vector<Write> writes;
    for (const auto& shard : v.shards) {
      const int64_t first = round * chunk_rows;
      if (first >= shard.rows) continue;
      const int64_t rows = std::min(chunk_rows, shard.rows - first);
      CAPSTAN_ASSIGN_OR_RETURN(Tensor part, chunk(shard.first_row + first, rows));
      writes.push_back({shard.ps_address, shard.name, first, std::move(part)});
    }
    if (writes.empty()) return Status::Ok();
    auto done = on_loop<bool>("writing '" + v.name + "' rows", [this, &writes]() {
      auto sends = kj::heapArrayBuilder<kj::Promise<void>>(writes.size());
      for (const Write& w : writes) {
        sends.add(ps(w.address).then([this, &w](wire::ParameterServer::Client client) {
          auto request = client.assignRowsRequest();
          request.setName(w.shard);
          request.setFirstRow(w.first_row);
          rpc::write_tensor(request.initRows(), w.rows, codec_);
          return request.send().ignoreResult();
        }));
      }
      return kj::joinPromises(sends.finish()).then([]() { return true; });
    });
    CAPSTAN_RETURN_IF_ERROR(done.status());
  }
}

Status VariableRouter::assign(const std::string& variable, const Tensor& value) {
  return update_rows(variable, value, Update::kAssign, 0, std::nullopt);
}

Status VariableRouter::assign_add(const std::string& variable, const Tensor& delta) {
  return update_rows(variable, delta, Update::kAssignAdd, 0, std::nullopt);
}

Status VariableRouter::apply_dense(const std::string& variable, const Tensor& gradient, int64_t step,
                                   std::optional<double> learning_rate) {
  return update_rows(variable, gradient, Update::kApplyDense, step, learning_rate);
}

Status VariableRouter::apply_sparse(const std::string& variable, const Tensor& ids, const Tensor& rows,
                                    int64_t step, std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(variable));
  if (v.shape.empty()) return Status::InvalidArgument("apply_sparse_gradients: '" + variable + "' is a scalar");
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> all, ids_of(ids));
  if (v.table) {
    // Any key; the rows of ids.shape() + [dim] are sent as [n, dim].
    Shape expected = ids.shape();
    expected.push_back(v.table->dim);
    if (rows.dtype() != v.dtype || rows.shape() != expected) {
      return Status::InvalidArgument("apply_sparse_gradients: rows " + std::string(dtype_name(rows.dtype())) +
                                     shape_string(rows.shape()) + " do not match ids " + shape_string(ids.shape()) +
                                     " of embedding table '" + variable + "' (expected " + shape_string(expected) + ")");
    }
    if (v.shards.empty()) {
      return Status::FailedPrecondition("apply_sparse_gradients: embedding table '" + variable + "' has no shards");
    }
    return apply_table(v, all, rows, step, learning_rate);
  }
  Shape expected{static_cast<int64_t>(all.size())};
  expected.insert(expected.end(), v.shape.begin() + 1, v.shape.end());
  if (rows.dtype() != v.dtype || rows.shape() != expected) {
    return Status::InvalidArgument("apply_sparse_gradients: rows " + std::string(dtype_name(rows.dtype())) +
                                   shape_string(rows.shape()) + " do not match " + std::to_string(all.size()) +
                                   " ids of '" + variable + "' (expected " + shape_string(expected) + ")");
  }
  size_t row = all.empty() ? 0 : rows.byte_size() / all.size();
  std::vector<std::vector<int64_t>> local(v.shards.size());
  std::vector<std::vector<size_t>> positions(v.shards.size());
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] < 0 || all[i] >= v.shape[0]) {
      return Status::InvalidArgument("apply_sparse_gradients: id " + std::to_string(all[i]) +
                                     " is out of range [0, " + std::to_string(v.shape[0]) + ") for '" +
                                     variable + "'");
    }
    size_t s = shard_of(v, all[i]);
    local[s].push_back(all[i] - v.shards[s].first_row);
    positions[s].push_back(i);
  }
  Shape row_shape(expected.begin() + 1, expected.end());
  return send_sparse(v, local, positions, rows, row, row_shape, step, learning_rate);
}

Result<Tensor> VariableRouter::lookup(const std::string& table, const Tensor& ids, bool insert) {
  CAPSTAN_ASSIGN_OR_RETURN(VariableLocation v, locate(table));
  if (!v.table) {
    return Status::InvalidArgument("lookup: '" + table + "' is a variable, not an embedding table: use gather(ids)");
  }
  if (v.shards.empty() || v.table->dim < 1) {
    return Status::FailedPrecondition("lookup: embedding table '" + table + "' has no shards (dim " +
                                      std::to_string(v.table->dim) + ")");
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> all, ids_of(ids));
  // Each id to the shard of its key. A repeated id goes with the others:
  // the shard looks each distinct key up once (one lookup counted, one
  // insert) and answers every position, which costs less here than
  // de-duplicating first (a sort of the batch) for the few repeats a batch
  // of random ids has.
  const int parts = static_cast<int>(v.shards.size());
  std::vector<std::vector<int64_t>> local(v.shards.size());
  std::vector<std::vector<size_t>> positions(v.shards.size());
  for (auto& l : local) l.reserve(all.size() / v.shards.size() + 16);
  for (auto& p : positions) p.reserve(all.size() / v.shards.size() + 16);
  for (size_t i = 0; i < all.size(); ++i) {
    auto s = static_cast<size_t>(table_shard_of(all[i], parts));
    local[s].push_back(all[i]);
    positions[s].push_back(i);
  }
  Shape shape = ids.shape();
  shape.push_back(v.table->dim);
  return fetch_rows(v, "lookup '" + table + "'", local, positions, std::move(shape),
                    [this, insert](wire::ParameterServer::Client client, const std::string& name, const Tensor& keys) {
                      auto request = client.lookupTableRequest();
                      request.setName(name);
                      request.setInsert(insert);
                      request.setInlineLimit(codec_.whole_chunk_limit);
                      rpc::write_tensor(request.initIds(), keys, codec_);
                      return request.send().then([this](capnp::Response<wire::ParameterServer::LookupTableResults>&& r) {
                        return rpc::read_tensor(r.getRows(), codec_).attach(kj::mv(r));
                      });
                    });
}

Status VariableRouter::apply_table(const VariableLocation& v, const std::vector<int64_t>& keys, const Tensor& rows,
                                   int64_t step, std::optional<double> learning_rate) {
  const int parts = static_cast<int>(v.shards.size());
  const size_t row = static_cast<size_t>(v.table->dim) * dtype_size(v.dtype);
  std::vector<std::vector<int64_t>> local(v.shards.size());
  std::vector<std::vector<size_t>> positions(v.shards.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto s = static_cast<size_t>(table_shard_of(keys[i], parts));
    local[s].push_back(keys[i]);
    positions[s].push_back(i);
  }
  return send_sparse(v, local, positions, rows, row, {v.table->dim}, step, learning_rate);
}

Status VariableRouter::send_sparse(const VariableLocation& v, const std::vector<std::vector<int64_t>>& local,
                                   const std::vector<std::vector<size_t>>& positions, const Tensor& rows,
                                   size_t row_bytes, const Shape& row_shape, int64_t step,
                                   std::optional<double> learning_rate) {
  std::vector<std::pair<Tensor, Tensor>> updates(v.shards.size());
  std::vector<size_t> used;
  for (size_t s = 0; s < v.shards.size(); ++s) {
    if (local[s].empty()) continue;
    auto n = static_cast<int64_t>(local[s].size());
    CAPSTAN_ASSIGN_OR_RETURN(updates[s].first, Tensor::from_vector<int64_t>(local[s], {n}));
    Shape part_shape{n};
    part_shape.insert(part_shape.end(), row_shape.begin(), row_shape.end());
    CAPSTAN_ASSIGN_OR_RETURN(updates[s].second, Tensor::uninitialized(v.dtype, part_shape));
    for (size_t j = 0; j < positions[s].size(); ++j) {
      std::memcpy(updates[s].second.mutable_data() + j * row_bytes, rows.data() + positions[s][j] * row_bytes,
                  row_bytes);
    }
    used.push_back(s);
  }
  const bool table = v.table.has_value();
  auto done = on_loop<bool>("apply_sparse_gradients '" + v.name + "'", [this, &v, &updates, &used, step, table,
                                                                         learning_rate]() {
    auto calls = kj::heapArrayBuilder<kj::Promise<void>>(used.size());
    for (size_t s : used) {
      calls.add(ps(v.shards[s].ps_address).then([this, step, table, learning_rate, name = v.shards[s].name,
                                               update = updates[s]](wire::ParameterServer::Client client) {
        if (table) {
          auto request = client.applyTableRequest();
          request.setName(name);
          request.setStep(step);
          if (learning_rate) {
            request.setHasLearningRate(true);
            request.setLearningRate(*learning_rate);
          }
          rpc::write_tensor(request.initIds(), update.first, codec_);
          rpc::write_tensor(request.initGradients(), update.second, codec_);
          return request.send().ignoreResult();
        }
        auto request = client.applySparseRequest();
        request.setName(name);
        request.setStep(step);
        if (learning_rate) {
          request.setHasLearningRate(true);
          request.setLearningRate(*learning_rate);
        }
        rpc::write_tensor(request.initIds(), update.first, codec_);
        rpc::write_tensor(request.initRows(), update.second, codec_);
        return request.send().ignoreResult();
      }));
    }
    return kj::joinPromises(calls.finish()).then([]() { return true; });
  });
  return done.status();
}

}  // namespace capstan
