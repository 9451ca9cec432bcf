// PsRecovery: the parameter servers' links as the coordinator watches them,
// and what it does when one comes back (see "Parameter servers" in
// coordinator.h; PsHealth holds the states).
//
// A parameter server's life as the coordinator sees it:
//   kDown        unreachable (at start, or its link broke): dispatch pauses
//   -> reachable: check() lists its shards
//        all there            -> kUp (a network outage, not a restart)
//        some missing         -> kRecovering: recover() gets them from the
//                                buddy's in-memory copy (peer snapshots on),
//                                else (or when that fails) reads them from the
//                                latest checkpoint, creates them again and
//                                writes values, slots and steps -> kUp
//        no checkpoint, or it -> kLost: calls fail with DataLoss saying so,
//        lacks a variable        until restore_checkpoint() by hand
//   -> link breaks again: kDown
// Peer snapshots (peer_snapshot_every_seconds > 0, 2+ parameter servers):
// every interval, each server that is up sends its buddy ((task + 1) % n),
// when up, the changes since its last delta (send_peer_snapshot); a failed
// send makes the next one full, and a holder that lost its copy is sent a
// full one at once. What a recovery from the copy loses: the updates since
// the copy was taken.
// Only the shards that were lost go back to the checkpoint; the others keep
// their newer values (asynchronous training tolerates the staleness, as it
// tolerates stale gradients). Every change into or out of kUp bumps
// PsHealth's generation: a closure whose run saw it change, and failed,
// runs again.
//
// Example:
//   PsRecovery recovery(config, ps, health, variables, policy, pool, loop);
//   recovery.start();                  // watches every parameter server
//   if (auto until = recovery.pause_deadline()) wait_until(*until);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_PS_RECOVERY_H_
#define CAPSTAN_DAEMONS_COORDINATOR_PS_RECOVERY_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/checkpoint_policy.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/config.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/ps_health.h"
#include "daemons/coordinator/ps_variables.h"

namespace capstan::coordinator {

class PsRecovery {
 public:
  // Everything given must outlive this.
  PsRecovery(const CoordinatorConfig& config, ParameterServers& ps, PsHealth& health, PsVariables& variables,
             CheckpointPolicy& checkpoints, boost::asio::thread_pool& pool, LoopContext loop);

  // Watches every parameter server's link (for good).
  void start();
  // health.pause_deadline(), recoverable when a checkpoint exists to
  // recover from (and ps_recovery is on).
  std::optional<kj::TimePoint> pause_deadline() const;
  // A restore by hand gave the lost parameter servers their shards again:
  // they are up.
  void restored_by_hand();
  // Parameter servers restored from a checkpoint or a peer's copy after
  // coming back empty.
  int64_t recoveries() const { return recoveries_; }
  // Of recoveries(): from the buddy's in-memory copy.
  int64_t peer_recoveries() const { return peer_recoveries_; }
  // The task that keeps an in-memory copy of `task`'s shards ((task + 1) %
  // n), or -1 when peer snapshots are off (or there is one server).
  int buddy(int task) const;

 private:
  kj::Promise<void> watch(int task);
  // On reconnecting: up when it has its shards; else recovered or lost.
  kj::Promise<void> check(int task);
  kj::Promise<void> recover(int task, std::set<std::string> missing);
  // The shards of `missing` on `task`, read from the checkpoint at (or
  // newest in) `from` and put back on the parameter server.
  struct Recovered {
    std::string path;
    int64_t step = 0;
    std::vector<VariableState> states;
  };
  kj::Promise<Result<Recovered>> restore_shards(int task, const std::set<std::string>& missing, std::string from);
  void finish_recovery(int task, const std::string& who, const std::string& lost_what, Result<Recovered> read);
  // From the checkpoint (the fallback of a recovery from a peer's copy).
  kj::Promise<void> recover_from_disk(int task, std::set<std::string> missing, const std::string& who,
                                      const std::string& lost_what);
  // Every peer_snapshot_every_seconds (for good): send_peer_snapshot(task).
  kj::Promise<void> peer_snapshots(int task);
  kj::Promise<void> send_peer_snapshot(int task, bool full);
  void set_state(int task, PsHealth::State state, Status lost = Status::Ok());
  void lose(int task, Status why);

  const CoordinatorConfig& config_;
  ParameterServers& ps_;
  PsHealth& health_;
  PsVariables& variables_;
  CheckpointPolicy& checkpoints_;
  boost::asio::thread_pool& pool_;
  const LoopContext loop_;
  int64_t recoveries_ = 0;
  int64_t peer_recoveries_ = 0;
  std::vector<bool> peer_failing_;  // by task: the last send failed (logged once)
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_PS_RECOVERY_H_
