// PsVariables: the variables and embedding tables that live on the parameter
// servers, as the coordinator placed them: each variable's shards (name, ps
// task, rows) and the placement's version, which goes up with every variable
// created. It creates shards on the parameter servers and reads and writes
// them for checkpoints and recovery; the values stay on the servers.
//
// Glossary:
//   layout    the variables as placed now, without values: what a checkpoint
//             is read into (checkpointing.h's read_into) and what a
//             snapshot fills.
//   snapshot  every shard's value, slots and step (a table's rows), read
//             from the parameter servers.
//
// Example:
//   PsVariables variables(ps, health, pool, log, work_dir, journal_variable);
//   auto w = variables.create({"w", initial, optimizer, Partitioner::fixed_shards(2)}).wait(ws);
//   variables.placements().version;               // 1
//   auto states = variables.snapshot().wait(ws);  // for a checkpoint
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PS_VARIABLES_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PS_VARIABLES_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <kj/vector.h>
#include <spdlog/logger.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"
#include "checkpoint/manifest.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/ps_health.h"
#include "daemons/coordinator/requests.h"
#include "placement/placement.h"

namespace capstan::coordinator {

// A variable as the coordinator records and journals it: where its shards
// live (by task: their ps_address stays "") and the optimizer the parameter
// servers apply to it.
struct PlacedVariable : VariableLocation {
  Optimizer optimizer;
  // How the shards were filled: by this initializer on the parameter
  // servers, or (kNone) with a given value.
  Initializer initializer{};
  // Created for the program to write its value (value_from_program), which
  // it has not said it has done yet (written()).
  bool awaiting_value = false;
};

class PsVariables {
 public:
  // Journals a new variable before it is recorded; an error refuses it.
  using Journal = std::function<Status(const PlacedVariable& variable)>;
  // `ps`, `health` (asked whether the parameter servers are up) and `pool`
  // (checkpoint reads, table exports) must outlive this. Exports are refused
  // inside `work_dir` ("": none).
  PsVariables(ParameterServers& ps, const PsHealth& health, boost::asio::thread_pool& pool,
              std::shared_ptr<spdlog::logger> log, std::string work_dir, Journal journal);

  // Creates the variable's shards on the parameter servers and records it
  // (the coordinator has checked the name, the request and that the servers
  // are up): with the request's initial value sliced by shard, or with its
  // initializer (zeros for value_from_program) sent to each shard, which
  // computes its rows: no value passes through here. One that exists with
  // the same dtype and shape is handed back as it is (a reconnecting
  // program); AlreadyExists when they differ or it is a table.
  kj::Promise<Result<VariableLocation>> create(VariableRequest request);
  // The program has written the value of `name` (created awaiting it):
  // journaled again without the flag. NotFound for an unknown variable;
  // OK, nothing journaled, when it was not awaiting a value.
  Status written(const std::string& name);
  // Whether `name` exists and awaits its value from the program.
  bool awaiting_value(const std::string& name) const;
  // Creates an embedding table: one shard on every parameter server. One
  // that exists with the same spec is handed back; InvalidArgument for a dim
  // outside [1, 65536]; AlreadyExists when the spec differs or a variable has
  // the name.
  kj::Promise<Result<VariableLocation>> create_table(EmbeddingTableSpec spec);
  // Creates, zero-filled, the variables of a checkpoint's manifest that do
  // not exist and that `skip` does not name (a restore: they get the
  // checkpoint's number of shards on the parameter servers there are now).
  kj::Promise<Status> create_absent(const checkpoint::Manifest& manifest,
                                    const std::function<bool(const std::string&)>& skip);
  // Writes the rows of table `name` changed since checkpoint `since` ("":
  // every row) to the safetensors file `path`; the number of rows (see
  // Coordinator::export_table).
  kj::Promise<Result<int64_t>> export_table(std::string name, std::string since, std::string path);

  std::vector<VariableState> layout() const;
  // The layout filled from the parameter servers. Unavailable while one is
  // not up.
  kj::Promise<Result<std::vector<VariableState>>> snapshot();
  // Writes values (those set), slots and steps; a table's rows replace all
  // of its shard's.
  kj::Promise<Status> write_shards(std::vector<VariableState> states);
  // Creates, on each parameter server, the shards of `states` it lacks (it
  // restarted), with the values in `states`. Their values go with the
  // create; those are cleared from `states`, so that write_shards sends only
  // the slots and steps of those shards.
  kj::Promise<Status> recreate_missing(std::vector<VariableState>* states);

  // Names of the shards placed on `task`.
  std::set<std::string> shards_on(int task) const;
  Placements placements() const;
  int64_t version() const { return version_; }
  bool contains(const std::string& name) const { return variables_.count(name) != 0; }
  size_t size() const { return variables_.size(); }
  const std::map<std::string, PlacedVariable>& all() const { return variables_; }

  // The journal: a variable as it was recorded, and the placer's round
  // robin it had reached then (restore() keeps the highest).
  void restore(PlacedVariable variable, int64_t placer_counter);
  int64_t placer_counter() const { return placer_.counter(); }

 private:
  VariableLocation location(const PlacedVariable& variable) const;
  Result<PlacedVariable> place(const std::string& name, DType dtype, const Shape& shape,
                               const placement::Partitioner& partitioner);
  // An embedding table: shard i ("name/part_i") on parameter server i.
  PlacedVariable place_table(EmbeddingTableSpec spec) const;
  // Creates the shards of a new variable, then journals and records it
  // (bumping the version).
  kj::Promise<Status> create_shards(PlacedVariable variable, Tensor initial);
  // Fills the table (*states)[v]'s shards and generation.
  kj::Promise<Status> snapshot_table(std::shared_ptr<std::vector<VariableState>> states, size_t v);
  kj::Promise<Result<int64_t>> export_rows(PlacedVariable variable, int64_t since_version, std::string path);

  ParameterServers& ps_;
  const PsHealth& health_;
  boost::asio::thread_pool& pool_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::string work_dir_;
  const Journal journal_;
  placement::Placer placer_;
  std::map<std::string, PlacedVariable> variables_;
  int64_t version_ = 0;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PS_VARIABLES_H_
