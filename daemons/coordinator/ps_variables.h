// PsVariables: the variables and embedding tables that live on the parameter
// servers, as the coordinator placed them: each variable's shards (name, ps
// task, rows) and the placement's version, which goes up with every variable
// created. It creates shards on the parameter servers and reads and writes
// them for checkpoints and recovery; the values stay on the servers.
//
// Glossary:
//   layout    the variables as placed now, without values: what a checkpoint
//             is checked against (checkpointing.h's match_checkpoint) and
//             what a restore fills.
//   save      each parameter server snapshots its shards and writes them
//             into the checkpoint itself (begin_save, finish_save); a
//             restore has it read them back (restore_from).
//
// Example:
//   PsVariables variables(ps, health, pool, log, work_dir, journal_variable);
//   auto w = variables.create({"w", initial, optimizer, Partitioner::fixed_shards(2)}).wait(ws);
//   variables.placements().version;               // 1
//   auto save = variables.begin_save("/ckpt/ckpt-100.tmp").wait(ws);  // snapshots taken
//   auto files = variables.finish_save(*save).wait(ws);                // files written
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
  // Places, without creating or recording them, the variables of a
  // checkpoint's manifest that do not exist and that `skip` does not name (a
  // restore: they get the checkpoint's number of shards on the parameter
  // servers there are now). restore_from() creates their shards with the
  // checkpoint's values; record() then keeps them.
  Result<std::vector<PlacedVariable>> place_absent(const checkpoint::Manifest& manifest,
                                                   const std::function<bool(const std::string&)>& skip);
  // Journals and records a variable whose shards exist (bumping the version).
  Status record(PlacedVariable variable);
  // Writes the rows of table `name` changed since checkpoint `since` ("":
  // every row) to the safetensors file `path`; the number of rows (see
  // Coordinator::export_table).
  kj::Promise<Result<int64_t>> export_table(std::string name, std::string since, std::string path);

  std::vector<VariableState> layout() const;
  static VariableState layout_of(const PlacedVariable& variable);

  // A checkpoint the parameter servers are writing (issue 34): the
  // manifest's entries for the variables and tables, built from their
  // snapshots, and each server's save to wait for.
  struct ServerSave {
    std::vector<checkpoint::ManifestVariable> variables;
    std::vector<std::pair<int, uint64_t>> saves;  // (task, save id)
  };
  // Has every parameter server snapshot the shards it holds and start
  // writing them as ps-<task>.safetensors into `directory` (a checkpoint's
  // .tmp directory); resolves once every snapshot is taken (a table's
  // generation: the highest version of any of its shards, which are told
  // to tag later changes above it). Unavailable while one is not up.
  kj::Promise<Result<ServerSave>> begin_save(std::string directory);
  // Waits for every server's file of `save`: their manifest entries. Every
  // save is waited for, even after one failed, so that no server still
  // writes when this resolves.
  kj::Promise<Result<std::vector<checkpoint::ManifestFile>>> finish_save(const ServerSave& save);
  // Has each parameter server fill its shards of `states` (a layout, or a
  // part of one) from the committed checkpoint at `path` itself, creating
  // those it lacks; the coordinator reads no value. check_against() first.
  kj::Promise<Status> restore_from(std::string path, const std::vector<VariableState>& states);

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
  // The manifest entry of `variable` from its shards' snapshots.
  static Result<checkpoint::ManifestVariable> manifest_entry(
      const PlacedVariable& variable, const std::map<std::string, const ps::SavedShard*>& saved, int64_t generation);
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
