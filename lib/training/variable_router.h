// VariableRouter: variable operations on partitioned variables, fanned out
// to the parameter servers that hold their shards.
//
// Used by worker-servers (ClosureContext) and by the SDK's
// ClusterCoordinator. Shard requests for one operation are sent together
// and run in parallel; a gather routes each id to its shard (TF's "div"
// partitioning: shard i holds rows [first_row, first_row + rows)) and puts
// the rows back in the order asked.
//
// Thread-safety: every method may be called from any thread except the loop
// thread, which runs the connections (calls block on it).
#ifndef CAPSTAN_LIB_TRAINING_VARIABLE_ROUTER_H_
#define CAPSTAN_LIB_TRAINING_VARIABLE_ROUTER_H_

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/connection.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"
#include "types/shard_location.h"

namespace capstan {

// Each shard's ps_address is set: it is where the router sends.
using ps::ShardLocation;
using ps::VariableLocation;

// What a closure does to variables, wherever they live. VariableRouter
// reaches the parameter servers; tests use an in-memory fake.
// Implementations are thread-safe.
class VariableAccess {
 public:
  virtual ~VariableAccess() = default;
  // Refreshes what is known of variable placements when it is older than
  // `version` (the coordinator's placement version).
  virtual Status refresh_if_older(int64_t version) = 0;
  virtual Result<Tensor> read(const std::string& variable) = 0;
  virtual Result<Tensor> gather(const std::string& variable, const Tensor& ids) = 0;
  virtual Status assign(const std::string& variable, const Tensor& value) = 0;
  virtual Status assign_add(const std::string& variable, const Tensor& delta) = 0;
  // `learning_rate`: ApplyOptions::learning_rate, carried to the parameter
  // servers with each shard's update (which check it).
  virtual Status apply_dense(const std::string& variable, const Tensor& gradient, int64_t step = 0,
                             std::optional<double> learning_rate = std::nullopt) = 0;
  virtual Status apply_sparse(const std::string& variable, const Tensor& ids, const Tensor& rows,
                              int64_t step = 0, std::optional<double> learning_rate = std::nullopt) = 0;
  // Several variables at once (ClosureContext::read_many); this default
  // reads them one after another.
  virtual Result<std::vector<Tensor>> read_many(const std::vector<std::string>& variables) {
    std::vector<Tensor> values;
    for (const auto& variable : variables) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor value, read(variable));
      values.push_back(std::move(value));
    }
    return values;
  }
  // Dense gradients of several variables (ClosureContext::apply_gradients_many).
  virtual Status apply_dense_many(const std::vector<std::string>& variables, const std::vector<Tensor>& gradients,
                                  int64_t step = 0, std::optional<double> learning_rate = std::nullopt) {
    if (variables.size() != gradients.size()) return Status::InvalidArgument("apply_gradients_many: sizes differ");
    for (size_t i = 0; i < variables.size(); ++i) {
      CAPSTAN_RETURN_IF_ERROR(apply_dense(variables[i], gradients[i], step, learning_rate));
    }
    return Status::Ok();
  }
  // An embedding table's rows for `ids` (ClosureContext::lookup).
  virtual Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool insert) {
    return Status::Unimplemented("lookup of embedding table '" + table + "'");
  }
};

class VariableRouter final : public VariableAccess {
 public:
  // Fetches the current placements; runs on the loop thread.
  using PlacementFetcher = std::function<kj::Promise<std::pair<int64_t, std::vector<VariableLocation>>>()>;

  VariableRouter(async::LoopThread& loop, rpc::ConnectOptions options, rpc::CodecOptions codec,
                 std::chrono::milliseconds call_timeout, PlacementFetcher fetch);
  ~VariableRouter();

  // Refreshes the placements when ours are older than `version`.
  Status refresh_if_older(int64_t version) override;
  // Remembers a placement learnt otherwise (e.g. createVariable's reply).
  void remember(VariableLocation location);
  Result<VariableLocation> locate(const std::string& variable);

  Result<Tensor> read(const std::string& variable) override;
  // Every shard of every variable in parallel: one round trip for all.
  Result<std::vector<Tensor>> read_many(const std::vector<std::string>& variables) override;
  Status apply_dense_many(const std::vector<std::string>& variables, const std::vector<Tensor>& gradients,
                          int64_t step = 0, std::optional<double> learning_rate = std::nullopt) override;
  Result<Tensor> gather(const std::string& variable, const Tensor& ids) override;
  Status assign(const std::string& variable, const Tensor& value) override;
  Status assign_add(const std::string& variable, const Tensor& delta) override;
  Status apply_dense(const std::string& variable, const Tensor& gradient, int64_t step = 0,
                     std::optional<double> learning_rate = std::nullopt) override;
  Status apply_sparse(const std::string& variable, const Tensor& ids, const Tensor& rows, int64_t step = 0,
                      std::optional<double> learning_rate = std::nullopt) override;
  // Each id goes to the shard that holds its key (which looks a repeated
  // key up once); all shards at once. The rows come back in the order of
  // `ids`: shape ids.shape() + [dim].
  Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool insert) override;
  // Writes `value` (v's whole dtype and shape, rank >= 1) into v's shards,
  // straight to the parameter servers that hold them, as assignRows calls
  // of at most `max_chunk_bytes` each (at least one row): in rounds, each
  // round one chunk of every shard that has one left, in parallel, under
  // the call timeout. Slots and steps stay as they are. The chunks share
  // `value`'s buffer: nothing is copied here.
  Status write_rows(const VariableLocation& v, const Tensor& value, size_t max_chunk_bytes);

 private:
  Status apply_table(const VariableLocation& v, const std::vector<int64_t>& keys, const Tensor& rows, int64_t step,
                     std::optional<double> learning_rate);
  // Asks each shard s with ids local[s] (ask: one request on the loop) and
  // puts the rows it answers at positions[s] of a tensor of `shape`
  // (gather, lookup); a shard that answers another size is Internal.
  using AskShard = std::function<kj::Promise<Tensor>(wire::ParameterServer::Client, const std::string& shard,
                                                     const Tensor& ids)>;
  Result<Tensor> fetch_rows(const VariableLocation& v, const std::string& what,
                            const std::vector<std::vector<int64_t>>& local,
                            const std::vector<std::vector<size_t>>& positions, Shape shape, const AskShard& ask);
  // Sends shard s the rows of `rows` at positions[s] (row_bytes each, shape
  // row_shape) for ids local[s]: applySparse, or applyTable for a table.
  Status send_sparse(const VariableLocation& v, const std::vector<std::vector<int64_t>>& local,
                     const std::vector<std::vector<size_t>>& positions, const Tensor& rows, size_t row_bytes,
                     const Shape& row_shape, int64_t step, std::optional<double> learning_rate);
  enum class Update { kAssign, kAssignAdd, kApplyDense };
  // On the loop: the reads of each shard of `v`, in shard order.
  kj::Promise<kj::Array<Tensor>> read_shards(const VariableLocation& v);
  // `value` checked against `v` and cut into its shards' rows.
  Result<std::vector<Tensor>> update_parts(const VariableLocation& v, const Tensor& value);
  // On the loop: `parts` sent to their shards.
  kj::Promise<void> send_update(const VariableLocation& v, const std::vector<Tensor>& parts, Update kind,
                                int64_t step, std::optional<double> learning_rate);
  Status refresh();
  Status update_rows(const std::string& variable, const Tensor& value, Update kind, int64_t step,
                     std::optional<double> learning_rate);
  // On the loop thread: the connection to `address`, made on first use.
  rpc::Connection& connection(const std::string& address);
  kj::Promise<wire::ParameterServer::Client> ps(const std::string& address);
  // Runs `make` (building shard requests) on the loop under the call timeout.
  template <typename T, typename Make>
  Result<T> on_loop(const std::string& what, Make make);

  async::LoopThread& loop_;
  const rpc::ConnectOptions options_;
  const rpc::CodecOptions codec_;
  const std::chrono::milliseconds call_timeout_;
  const PlacementFetcher fetch_;

  Mutex mutex_;
  int64_t version_ GUARDED_BY(mutex_) = -1;
  std::map<std::string, VariableLocation> variables_ GUARDED_BY(mutex_);
  std::map<std::string, kj::Own<rpc::Connection>> connections_;  // loop thread only
};

// The placements from the coordinator at the end of `connection` (its
// placements() call, 10 s to reach it): what a VariableRouter fetches.
// Both must outlive the router; used on the loop thread.
VariableRouter::PlacementFetcher placements_from(rpc::Connection& connection, kj::Timer& timer);

}  // namespace capstan

#endif  // CAPSTAN_LIB_TRAINING_VARIABLE_ROUTER_H_
