// CheckpointPolicy: the checkpoints the coordinator saves on its own, and
// which checkpoint is the last one.
//
// When it saves (into config.checkpoint_dir, keeping checkpoint_max_to_keep):
//   by steps       every checkpoint_every_steps closures completed;
//   by time        every checkpoint_every_seconds, when closures completed
//                  since the last one;
//   on preemption  a worker leaving or the coordinator draining
//                  (checkpoint_on_preemption), unless nothing completed
//                  since its last save.
// One save at a time: one that comes due meanwhile starts when it ends.
// None while a parameter server is not up. A policy checkpoint's step is the
// newest step in checkpoint_dir when the policy first needed one, plus the
// closures completed since the start: a restarted coordinator never writes
// checkpoints that look older than the ones there.
//
// The last checkpoint is the one saved or restored last, by the policy or
// the program, or recovered from: what a parameter server that comes back
// empty is restored from (else checkpoint_dir's newest). It is journaled.
//
// Example:
//   CheckpointPolicy policy(config, loop, health, journal, save_checkpoint);
//   policy.start();               // the timer, with checkpoint_every_seconds
//   policy.closure_succeeded();   // at every_steps of them, a save
//   policy.before_leaving("worker 3 leaving").wait(ws);
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINT_POLICY_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINT_POLICY_H_

#include <kj/async.h>

#include <cstdint>
#include <functional>
#include <string>

#include "capstan/status.h"
#include "daemons/coordinator/config.h"
#include "daemons/coordinator/coordinator_journal.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/ps_health.h"

namespace capstan::coordinator {

class CheckpointPolicy {
 public:
  // Saves a checkpoint of the model (Coordinator::save_checkpoint); its path.
  using Save = std::function<kj::Promise<Result<std::string>>(std::string directory, int64_t step, int max_to_keep)>;
  // `config`, `health` and `journal` must outlive this.
  CheckpointPolicy(const CoordinatorConfig& config, LoopContext loop, const PsHealth& health,
                   CoordinatorJournal& journal, Save save);

  // Starts saving by time, when checkpoint_dir and checkpoint_every_seconds
  // are set.
  void start();
  // A closure completed: a save when one is due by steps.
  void closure_succeeded();
  // With checkpoint_dir and checkpoint_on_preemption: resolves once a
  // checkpoint holds everything completed so far (after a save in flight;
  // a new one unless the last policy save is current), logged with `why`.
  kj::Promise<void> before_leaving(std::string why);

  const std::string& last() const { return last_; }
  // Remembers (and journals) the last checkpoint.
  void set_last(const std::string& path);
  // The last checkpoint, read back from the journal.
  void restore_last(std::string path) { last_ = std::move(path); }
  // What a parameter server that came back empty is restored from: the last
  // checkpoint, else checkpoint_dir (its newest); "" when there is neither.
  const std::string& recovery_source() const { return !last_.empty() ? last_ : config_.checkpoint_dir; }

 private:
  void maybe_save();
  kj::Promise<void> timer();
  void save_by_policy();
  // Saves into checkpoint_dir now, as step policy_step(); its path.
  kj::Promise<Result<std::string>> save_own();
  int64_t policy_step();

  const CoordinatorConfig& config_;
  const LoopContext loop_;
  const PsHealth& health_;
  CoordinatorJournal& journal_;
  const Save save_;
  std::string last_;
  int64_t closures_completed_ = 0;
  int64_t completed_at_checkpoint_ = 0;
  int64_t policy_step_base_ = -1;  // the newest step in checkpoint_dir; -1: not looked up
  int64_t saved_step_ = -1;        // of the last checkpoint saved by save_own()
  bool saving_ = false;            // save_own() runs
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CHECKPOINT_POLICY_H_
