// The replicas a worker-server holds for synchronous training
// (MirroredStrategy), apart from the transport: per strategy, the collective
// group of the current epoch and the mirrored variables.
//
// Glossary:
//   strategy  a named set of mirrored variables the program created through
//             the coordinator (MirroredStrategy::create)
//   epoch     one formation of the strategy's group (the Communicator's
//             generation); the coordinator forms a new one when the workers
//             change or a step failed
//   source    the member whose state every member takes when a group forms
//             (a survivor that kept the variables, or the one the
//             coordinator seeds with initial values or a checkpoint)
//
// The coordinator drives it (the service forwards its calls):
//   std::string address = replicas.prepare("dense", 7).value();   // on every member
//   ... the coordinator collects every member's address ...
//   replicas.form({"dense", 7, rank, addresses, source, specs, seed, settings});
//   {
//     auto step = replicas.acquire("dense", 7).value();   // a step's closure
//     step.group().all_reduce(...); step.variables().apply_gradients(...);
//   }
//
// Thread-safety: thread-safe. A strategy's step and its formation exclude
// each other (Lease holds the replica); abort() and status reads of the
// group do not wait for a running step.
#ifndef CAPSTAN_DAEMONS_WORKER_SERVER_REPLICAS_H_
#define CAPSTAN_DAEMONS_WORKER_SERVER_REPLICAS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/mirrored.h"
#include "capstan/status.h"
#include "sync/mutex.h"
#include "types/replica.h"

namespace capstan::worker_server {

class Replicas {
 public:
  // Groups listen on `host` (an IP address of this machine that the other
  // workers reach: the worker's collective_host). A strategy whose values
  // and optimizer slots would need more than `budget_bytes` is refused
  // (ResourceExhausted) before anything is allocated.
  explicit Replicas(std::string host, int64_t budget_bytes = int64_t{4} << 30);
  ~Replicas();

  const std::string& host() const { return host_; }

  // Whether this worker holds `strategy`'s variables, their step and
  // checksum. Waits for a step of the strategy running here.
  training::ReplicaReport status(const std::string& strategy);
  // Listens for the group of `epoch`; the address the others dial.
  Result<std::string> prepare(const std::string& strategy, int64_t epoch);
  // Forms the group of `form.epoch` (prepared before) and brings the
  // variables to the source's state. FailedPrecondition when this worker is
  // the source without a seed and holds nothing, or was not prepared for
  // the epoch. A source seeded from a checkpoint (form.seed_checkpoint)
  // reads it itself before the group connects; what that read fails with
  // (NotFound, InvalidArgument, DataLoss) fails the formation on every
  // member.
  Result<training::ReplicaReport> form(const training::ReplicaForm& form);
  // Copies of the values, slots and step. NotFound when nothing is held.
  Result<training::MirroredState> read(const std::string& strategy);
  // Writes the state (copied under the replica's lock, so at a step
  // boundary, as read() is; written after the lock is released, so steps go
  // on meanwhile) as `directory`/mirrored-<strategy>.safetensors; see
  // checkpoint::write_mirrored_file for the rules on `directory` and its
  // errors. NotFound when nothing is held.
  Result<training::SavedReplica> save(const std::string& strategy, const std::string& directory);
  // Aborts the group of `epoch` (no-op for another epoch): a step running
  // in it fails at once.
  void abort(const std::string& strategy, int64_t epoch, const Status& reason);

  // A step's hold on the replica: its group and variables, for as long as
  // the closure runs.
  class Lease {
   public:
    Communicator& group() { return *group_; }
    MirroredVariables& variables() { return *variables_; }
    // How far the strategy's step input was consumed with these variables
    // (ReplicaReport::input_position); the step that takes input moves it.
    int64_t input_position() const { return *input_position_; }
    void set_input_position(int64_t position) { *input_position_ = position; }
    // Aborts the group so that the other members' collectives fail at once
    // (this member's closure failed before or between them).
    void abort(const Status& reason) { group_->abort(reason); }

   private:
    friend class Replicas;
    Lease(std::shared_ptr<void> hold, Communicator* group, MirroredVariables* variables, int64_t* input_position)
        : hold_(std::move(hold)), group_(group), variables_(variables), input_position_(input_position) {}
    std::shared_ptr<void> hold_;  // the replica's lock
    Communicator* group_;
    MirroredVariables* variables_;
    int64_t* input_position_;  // guarded by the lock hold_ keeps
  };
  // FailedPrecondition unless the replica's group is the one of `epoch`.
  Result<Lease> acquire(const std::string& strategy, int64_t epoch);

  static constexpr size_t kMaxStrategies = 64;

 private:
  struct Replica {
    Mutex mutex;  // held for a step or a formation
    std::unique_ptr<CollectiveEndpoint> pending GUARDED_BY(mutex);
    int64_t pending_epoch GUARDED_BY(mutex) = 0;
    std::unique_ptr<MirroredVariables> variables GUARDED_BY(mutex);
    int64_t input_position GUARDED_BY(mutex) = 0;  // see Lease::input_position
    // Read by abort() without `mutex` (a step holds it).
    Mutex group_mutex;
    std::shared_ptr<Communicator> group GUARDED_BY(group_mutex);
    int64_t epoch GUARDED_BY(group_mutex) = 0;
  };
  std::shared_ptr<Replica> find(const std::string& strategy, bool create);

  const std::string host_;
  const int64_t budget_bytes_;
  Mutex mutex_;
  std::map<std::string, std::shared_ptr<Replica>> replicas_ GUARDED_BY(mutex_);
};

}  // namespace capstan::worker_server

#endif  // CAPSTAN_DAEMONS_WORKER_SERVER_REPLICAS_H_
