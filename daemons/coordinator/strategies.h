// Strategies: synchronous training in the coordinator, TF's
// MultiWorkerMirroredStrategy with the worker-servers as replicas (see
// "Synchronous training" in coordinator.h). A strategy is a named set of
// mirrored variables held in the workers' memory. Each step runs a closure
// on every live worker that has it, at once, as the ranks of one collective
// group.
//
// A step's life:
//   ensure_group  the live workers that have the function, by task index,
//                 are the replicas; when they differ from the last group's,
//                 or the last step failed, or a seed waits, form_group:
//                   replica_status on each (what it holds, at which step)
//                   -> the source: rank 0 with the seed, else the member of
//                      the last group with the fewest steps applied
//                   -> prepare_replica on each (its address for this epoch)
//                   -> form_replica on each (connect, take the source's state)
//   dispatch_step the closure on every member at once; a member lost
//                 mid-step (link broken, or dropped for missing pings) makes
//                 the coordinator abort the others' group so that they fail
//                 at once; the step fails, the next one re-forms.
//
// Glossary:
//   seed    a state no replica holds yet (the initial values, or a restored
//           checkpoint's: its path, not its values): the next group starts
//           from it; the source reads a checkpoint's values itself.
//   epoch   the number of the last group formed; each formation is the next.
//   busy    a step or a formation of the strategy runs; steps of one
//           strategy run one at a time.
//
// Durable (with the Coordinator's journal, set_journal): each strategy is
// journaled at its creation, at each group formed and when a restore seeds
// it; a restarted coordinator's restore_from_journal() brings it back with
// no group formed, and its first step forms one from the survivors of the
// last (by task index), its steps taken from the source's replica.
//
// Example:
//   Strategies strategies(workers, variables, gate, loop);
//   strategies.create("dense", {{"w", initial, Optimizer::sgd(0.1)}}, {});
//   auto out = strategies.run_step("dense", "train_step", args).wait(ws);  // a value per replica
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_STRATEGIES_H_
#define CAPSTAN_DAEMONS_COORDINATOR_STRATEGIES_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "checkpoint/checkpoint.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/dispatch_gate.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/ps_variables.h"
#include "daemons/coordinator/requests.h"
#include "daemons/coordinator/worker_times.h"
#include "daemons/coordinator/workers.h"
#include "types/replica.h"

namespace capstan::coordinator {

class Strategies {
 public:
  // Everything given must outlive this. `pool` reads and writes files (a
  // seed's, see save()).
  // Each replica's run of a step is timed in `times`.
  Strategies(Workers& workers, const PsVariables& variables, const DispatchGate& gate, LoopContext loop,
             boost::asio::thread_pool& pool, WorkerTimes& times);

  // Creates a strategy (its values are held here until the first group
  // forms and takes them), or hands back the one of that name with the same
  // variables (a reconnecting program); AlreadyExists when they differ or a
  // parameter-server variable has one of the names.
  Status create(const std::string& name, std::vector<MirroredVariableInit> variables, StrategyConfig config);
  // Gives strategy `name` its step input (StepInputConfig; the per-worker
  // dataset exists): from the next step on, each replica reads its share of
  // the step's positions, and the step commits them with the update. The
  // same input again is a no-op (a reconnecting program); another one
  // replaces it and starts at position 0. InvalidArgument for a config that
  // is not exactly one positive batch size.
  Status set_input(const std::string& name, const StepInputConfig& input);
  // set_input's checks of `input` alone.
  static Status check_input(const std::string& name, const StepInputConfig& input);
  bool has(const std::string& name) const { return strategies_.count(name) != 0; }
  // A step's shares of the input for `replicas` replicas from `position`
  // (by replica: start, count, weight; first and end are the step's).
  static Result<std::vector<training::StepInput>> split_input(const StepInputConfig& input, int64_t position,
                                                              size_t replicas);
  // One synchronous step (Coordinator::run_step).
  kj::Promise<Result<StepOutcome>> run_step(std::string strategy, std::string function, std::string args);
  // Replica 0's value of a mirrored variable, and the optimizer step.
  kj::Promise<Result<std::pair<Tensor, int64_t>>> read_mirrored(std::string strategy, std::string variable);
  kj::Promise<Result<StrategyStatus>> status(std::string strategy);

  bool is_mirrored(const std::string& variable) const;
  bool empty() const { return strategies_.empty(); }
  size_t size() const { return strategies_.size(); }
  // A step or a formation runs: of any strategy, or with `worker_id` a member.
  bool busy() const;
  bool busy_with(int64_t worker_id) const;

  // ---- Checkpoints (checkpoint/mirrored_files.h has the files)
  // Every strategy's variables written into the checkpoint being saved in
  // `directory` (its .tmp directory): rank 0 of each strategy's group
  // writes mirrored-<strategy>.safetensors itself (saveReplica; the next
  // member when it is lost), at a step boundary, and answers the file's
  // size and CRC32C; the values never pass through here. A strategy whose
  // seed no group has taken yet (no step since create() or a restore) is
  // written from the seed, on the pool (the initial values held here, or
  // the restored checkpoint's values read from it).
  struct MirroredSave {
    std::vector<checkpoint::ManifestVariable> variables;
    std::vector<checkpoint::ManifestFile> written;
  };
  kj::Promise<Result<MirroredSave>> save(std::string directory);
  // Each strategy's variables, by strategy.
  using Specs = std::map<std::string, std::vector<training::MirroredSpec>>;
  Specs specs() const;
  // The mirrored variables a checkpoint holds, checked (dtype, shape) for
  // the strategies as they are now (specs()) from its manifest alone; then
  // seed() makes the checkpoint the strategies' seeds: the next step's
  // group's source reads the values, slots and step from it itself.
  struct Restore {
    std::string checkpoint;                                     // its path
    std::map<std::string, std::vector<std::string>> variables;  // by strategy: those the checkpoint has
    std::vector<std::string> missing;
  };
  static Result<Restore> read_checkpoint(const checkpoint::CheckpointReader& reader, const Specs& specs);
  kj::Promise<Status> seed(Restore restore);

  // ---- Durability (the coordinator's journal: coordinator_journal.h)
  // What a restarted coordinator must know of a strategy: journaled at its
  // creation, at each group formed and when a restore seeds it (the whole
  // strategy each time; a later one of a name replaces the earlier). Not
  // each step: a replica's own step counter (replica_status) gives the
  // steps again when the next group forms.
  struct Journaled {
    std::string name;
    std::vector<training::MirroredSpec> specs;
    StrategyConfig config;
    // The seed no group has taken yet: create()'s values, or a restored
    // checkpoint's path and the variables read from it.
    std::optional<training::MirroredState> initial;
    std::string seed_checkpoint;
    std::vector<std::string> seed_from_checkpoint;
    int64_t epoch = 0;              // of the last group formed
    std::vector<int> member_tasks;  // its members' task indexes, by rank
    int64_t steps = 0;              // steps run when it formed
    std::optional<StepInputConfig> input;
  };
  // Writes a record durably before the change it describes is applied; an
  // error refuses the change. Unset: nothing is journaled.
  using Journal = std::function<Status(const Journaled&)>;
  void set_journal(Journal journal) { journal_ = std::move(journal); }
  // Every strategy as records (a compacted journal).
  std::vector<Journaled> journaled_state() const;
  // A replayed record: the strategy as it was, with no group formed (the
  // first step forms one; its source is the last group's member, by task
  // index, with the fewest steps, as after a failed step).
  void restore_from_journal(Journaled record);

 private:
  struct Strategy {
    std::string name;
    std::vector<training::MirroredSpec> specs;
    StrategyConfig config;
    // Variables `from_checkpoint` of the committed checkpoint at
    // `checkpoint` (none when ""), the others from `values`.
    struct Seed {
      std::optional<training::MirroredState> values;
      std::string checkpoint;
      std::vector<std::string> from_checkpoint;
    };
    std::optional<Seed> seed;
    bool seed_is_initial = false;  // the seed is create()'s values, not a checkpoint's
    int64_t epoch = 0;              // of the last group formed
    std::vector<int64_t> members;   // worker ids by rank
    bool formed = false;            // false after a failed step: form again
    // A step or a formation runs. Shared with the step's promise, which
    // clears it even when dropped.
    std::shared_ptr<bool> busy = std::make_shared<bool>(false);
    int64_t steps = 0;
    std::optional<StepInputConfig> input;
    // The positions of the input the replicas' state has consumed: taken
    // from the source's report at each formation, moved by each step.
    int64_t input_position = 0;
    // The last group's members by task index, as journaled (worker ids do
    // not outlive a coordinator). `replayed`: read back from the journal,
    // no group formed since; the next formation's source is one of these
    // and the steps are taken from its replica.
    std::vector<int> member_tasks;
    bool replayed = false;
  };
  // One formation of a group (form_group's stages share it).
  struct Formation {
    std::vector<int64_t> ids;  // by rank
    int64_t epoch = 0;
    int source = 0;  // the rank whose state every member takes
    int64_t input_position = 0;  // the source's
    std::chrono::milliseconds quick{0};    // replica_status, prepare_replica
    std::chrono::milliseconds forming{0};  // form_replica: connect, then move the state
  };
  template <typename T>
  using Answer = ReplicaAnswer<T>;

  Result<Strategy*> find(const std::string& name);
  // The specs of `variables`, or why they cannot be strategy `name`'s.
  Result<std::vector<training::MirroredSpec>> check_variables(const std::string& name,
                                                              const std::vector<MirroredVariableInit>& variables) const;

  kj::Promise<Status> ensure_group(Strategy& strategy, std::string function, kj::TimePoint give_up);
  kj::Promise<Status> form_group(Strategy& strategy, std::vector<int64_t> members);
  // form_group's stages, after each round of answers.
  kj::Promise<kj::Array<Answer<std::string>>> prepare(Strategy& strategy, Formation& formation,
                                                      kj::Array<Answer<training::ReplicaReport>> reports);
  kj::Promise<kj::Array<Answer<training::ReplicaReport>>> form(Strategy& strategy, const Formation& formation,
                                                               kj::Array<Answer<std::string>> addresses);
  Status conclude(Strategy& strategy, const Formation& formation, kj::Array<Answer<training::ReplicaReport>> reports);
  // The rank whose state the group takes (see the header comment).
  Result<int> choose_source(Strategy& strategy, const std::vector<int64_t>& ids,
                            const kj::Array<Answer<training::ReplicaReport>>& reports);
  // The first answer that is not OK as the formation's failure: a lost
  // member is dropped (Unavailable), another error names the member and
  // `stage`.
  template <typename T>
  Status check_answers(Strategy& strategy, const std::vector<int64_t>& ids, const kj::Array<Answer<T>>& answers,
                       const char* stage);
  // Drops a member lost while the group formed; the formation's failure.
  Status lost_while_forming(Strategy& strategy, int64_t worker_id, const Status& why);

  kj::Promise<Result<StepOutcome>> dispatch_step(Strategy& strategy, std::string function, std::string args);
  // Member `r`'s run of the step; its failure aborts the others' group.
  kj::Promise<ClosureOutcome> run_replica(const std::string& name, const std::vector<int64_t>& members,
                                          int64_t epoch, size_t r, const std::string& function,
                                          const std::string& args, std::optional<training::StepInput> input,
                                          std::shared_ptr<std::vector<size_t>> arrivals);
  // The step's outcome from every member's answer (`arrivals`: the order
  // they came in; `shares`: the input each took, empty without one).
  Result<StepOutcome> step_result(Strategy& strategy, const std::vector<int64_t>& members, int64_t epoch,
                                  const std::vector<size_t>& arrivals, const std::vector<training::StepInput>& shares,
                                  kj::Array<ClosureOutcome> all);

  // One call to each of `ids` (a member already dropped answers lost).
  template <typename T, typename Call>
  kj::Promise<kj::Array<Answer<T>>> ask_each(const std::vector<int64_t>& ids, Call call,
                                             std::chrono::milliseconds limit);
  // A replica call to `worker_id` that counts as lost when its link breaks,
  // the worker is dropped, or it does not answer within `limit`.
  template <typename T>
  kj::Promise<Answer<T>> ask(int64_t worker_id, kj::Promise<Result<T>> call, std::chrono::milliseconds limit);
  // The state now: the seed's (read on the pool from its checkpoint), or
  // replica 0's.
  kj::Promise<Result<training::MirroredState>> mirrored_state(Strategy& strategy);
  // Has member `i` of `members` (else the next, when it is lost) write the
  // strategy's file into `directory`.
  kj::Promise<Result<training::SavedReplica>> save_from(std::string name, std::vector<int64_t> members, size_t i,
                                                        std::string directory, std::chrono::milliseconds limit,
                                                        Status last);
  kj::Promise<Result<training::MirroredState>> read_state_from(std::string name, std::vector<int64_t> members, size_t i,
                                                               std::chrono::milliseconds limit, Status last);

  // The journal's record of `strategy` as it is now.
  Journaled journaled(const Strategy& strategy) const;
  // journal_(...) when set.
  Status journal(const Journaled& record) const;
  // Journals the group `formation` formed (the source at `source_step`),
  // then keeps its members' task indexes; conclude() applies the rest.
  Status journal_formation(Strategy& strategy, const Formation& formation, int64_t source_step);
  // The live workers that were in a replayed strategy's last group, by
  // task index.
  std::vector<int64_t> replayed_members(const Strategy& strategy) const;

  Workers& workers_;
  const PsVariables& variables_;
  const DispatchGate& gate_;
  const LoopContext loop_;
  boost::asio::thread_pool& pool_;
  WorkerTimes& times_;
  std::map<std::string, Strategy> strategies_;  // never erased: references stay valid
  Journal journal_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_STRATEGIES_H_
