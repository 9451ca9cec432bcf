// Parameter-server health and recovery, the checkpoint policy, and
// preemption (a worker leaving, the coordinator stopping); see "Parameter
// servers" in coordinator.h.
//
// A parameter server's life as the coordinator sees it:
//   kDown        unreachable (at start, or its link broke): dispatch pauses
//   -> reachable: check_ps lists its shards
//        all there            -> kUp (a network outage, not a restart)
//        some missing         -> kRecovering: recover_ps reads them from the
//                                latest checkpoint, creates them again and
//                                writes values, slots and steps -> kUp
//        no checkpoint, or it -> kLost: calls fail with DataLoss saying so,
//        lacks a variable        until restore_checkpoint() by hand
//   -> link breaks again: kDown
// Only the shards that were lost go back to the checkpoint; the others keep
// their newer values (asynchronous training tolerates the staleness, as it
// tolerates stale gradients). The states are PsHealth's (ps_health.h); every
// change into or out of kUp bumps its generation: a closure whose run saw it
// change, and failed, runs again.
#include <algorithm>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "daemons/coordinator/coordinator.h"
#include "async/status_exception.h"
#include "async/pool.h"

namespace capstan::coordinator {
namespace {

std::string join_names(const std::set<std::string>& names, size_t at_most = 5) {
  std::string out;
  size_t n = 0;
  for (const auto& name : names) {
    if (n == at_most) {
      out += ", ... (" + std::to_string(names.size()) + " in all)";
      break;
    }
    out += (n++ == 0 ? "" : ", ") + name;
  }
  return out;
}

int64_t milliseconds(kj::Duration d) { return d / kj::MILLISECONDS; }

}  // namespace

std::optional<kj::TimePoint> Coordinator::ps_pause_deadline() const {
  // Something to recover from, should a parameter server come back empty.
  const bool recoverable =
      config_.ps_recovery && (!last_checkpoint_.empty() || !config_.checkpoint_dir.empty());
  return ps_health_.pause_deadline(recoverable, timer_.now());
}

void Coordinator::set_ps_state(int task, PsState state, Status lost) {
  ps_health_.set(task, state, std::move(lost), timer_.now());
  changes_.notify();
}

kj::Promise<void> Coordinator::watch_ps(int task) {
  return ps_.reachable(task)
      .then([this, task]() { return check_ps(task); })
      .then([this, task]() { return ps_.unreachable(task); })
      .then([this, task]() {
        set_ps_state(task, PsState::kDown);
        log_->warn("parameter server ps:{} at {} is unreachable; dispatch pauses", task, ps_.address(task));
        return watch_ps(task);
      });
}

kj::Promise<void> Coordinator::check_ps(int task) {
  std::set<std::string> expected = variables_.shards_on(task);
  if (expected.empty()) {
    set_ps_state(task, PsState::kUp);
    return kj::READY_NOW;
  }
  return ps_.list_shards(task)
      .catch_([](kj::Exception&& e) { return Result<std::set<std::string>>(async::from_exception(e)); })
      .then([this, task, expected = std::move(expected)](Result<std::set<std::string>> held) -> kj::Promise<void> {
        if (!held.ok()) {
          // Its link broke again (watch_ps sees it next), or it answers
          // nonsense: either way nothing is dispatched meanwhile.
          set_ps_state(task, PsState::kLost,
                       held.status().with_context("parameter server ps:" + std::to_string(task) + " at " +
                                                  ps_.address(task) + ": listing its shards"));
          return kj::READY_NOW;
        }
        std::set<std::string> missing;
        std::set_difference(expected.begin(), expected.end(), held->begin(), held->end(),
                            std::inserter(missing, missing.end()));
        if (missing.empty()) {
          if (ps_health_.ever_up(task)) {
            log_->info("parameter server ps:{} at {} is back with its shards; dispatch resumes", task,
                       ps_.address(task));
          }
          set_ps_state(task, PsState::kUp);
          return kj::READY_NOW;
        }
        return recover_ps(task, std::move(missing));
      });
}

kj::Promise<void> Coordinator::recover_ps(int task, std::set<std::string> missing) {
  const std::string who = "parameter server ps:" + std::to_string(task) + " at " + ps_.address(task);
  const std::string lost_what = who + " came back without " + std::to_string(missing.size()) + " shard(s) (" +
                                join_names(missing) + ")";
  if (!config_.ps_recovery) {
    set_ps_state(task, PsState::kLost,
                 Status::DataLoss(lost_what + "; ps_recovery is off: restore a checkpoint (restoreCheckpoint "
                                              "creates them again)"));
    log_->error("{}", ps_health_.lost(task).message());
    return kj::READY_NOW;
  }
  std::string from = !last_checkpoint_.empty() ? last_checkpoint_ : config_.checkpoint_dir;
  if (from.empty()) {
    set_ps_state(task, PsState::kLost,
                 Status::DataLoss(lost_what + " and there is no checkpoint to restore them from: set checkpoint_dir "
                                              "with checkpoint_every_steps or checkpoint_every_seconds, or save "
                                              "checkpoints from the program (CheckpointManager)"));
    log_->error("{}", ps_health_.lost(task).message());
    return kj::READY_NOW;
  }
  set_ps_state(task, PsState::kRecovering);
  log_->warn("{}; restoring them from the latest checkpoint", lost_what);
  // The shards as placed, to be filled from the checkpoint.
  std::vector<VariableState> layout_now = variables_.layout();
  for (auto& v : layout_now) {
    std::erase_if(v.shards, [&](const ShardState& s) { return s.ps_task != task || missing.count(s.name) == 0; });
  }
  std::erase_if(layout_now, [](const VariableState& v) { return v.shards.empty(); });
  struct Read {
    std::string path;
    int64_t step = 0;
    std::vector<VariableState> states;
  };
  return async::run_on_pool(pool_,
                          [from, states = std::move(layout_now)]() mutable -> Result<Read> {
                            CAPSTAN_ASSIGN_OR_RETURN(std::string path, resolve_checkpoint(from));
                            CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(path));
                            std::vector<std::string> absent;
                            // Strict: a shard the checkpoint lacks cannot be recovered.
                            CAPSTAN_RETURN_IF_ERROR(read_into(*reader, &states, /*strict=*/true, &absent));
                            return Read{path, reader->manifest().step, std::move(states)};
                          })
      .then([this](Result<Read> read) -> kj::Promise<Result<Read>> {
        if (!read.ok()) return kj::mv(read);
        auto shared = std::make_shared<Read>(std::move(*read));
        // Created with their values; then their slots and optimizer steps.
        return variables_.recreate_missing(&shared->states)
            .then([this, shared](Status status) -> kj::Promise<Status> {
              if (!status.ok()) return status;
              return variables_.write_shards(shared->states);
            })
            .then([shared](Status status) -> Result<Read> {
              CAPSTAN_RETURN_IF_ERROR(status);
              return std::move(*shared);
            });
      })
      .then([this, task, who, lost_what](Result<Read> read) {
        if (ps_health_.state(task) != PsState::kRecovering) return;  // lost again meanwhile: watch_ps starts over
        if (!read.ok()) {
          Status why = read.status();
          set_ps_state(task, PsState::kLost,
                       Status::DataLoss(lost_what + " and restoring them failed: " + why.to_string() +
                                        "; restore a checkpoint by hand (restoreCheckpoint creates them again)"));
          log_->error("{}", ps_health_.lost(task).message());
          return;
        }
        int64_t down_ms = milliseconds(timer_.now() - ps_health_.down_since(task));
        size_t shards = 0;
        for (const auto& v : read->states) shards += v.shards.size();
        set_last_checkpoint(read->path);
        ++ps_recoveries_;
        ++stats_->ps_recoveries;
        set_ps_state(task, PsState::kUp);
        log_->warn("{}: restored {} shard(s) from checkpoint {} (step {}); {} ms after it was lost; dispatch resumes",
                   who, shards, read->path, read->step, down_ms);
      });
}

// ---- The checkpoint policy ----------------------------------------------------------

void Coordinator::maybe_checkpoint() {
  if (config_.checkpoint_dir.empty() || config_.checkpoint_every_steps <= 0) return;
  if (closures_completed_ - completed_at_checkpoint_ < config_.checkpoint_every_steps) return;
  save_by_policy();
}

kj::Promise<void> Coordinator::checkpoint_timer() {
  return timer_.afterDelay(config_.checkpoint_every_seconds.count() * kj::SECONDS).then([this]() {
    // Nothing new since the last one: nothing to save.
    if (closures_completed_ != completed_at_checkpoint_) save_by_policy();
    return checkpoint_timer();
  });
}

int64_t Coordinator::policy_step() {
  if (policy_step_base_ < 0) {
    // Steps go on from the newest checkpoint there (a restarted coordinator
    // must not write older-looking ones); a quick directory listing.
    auto newest = checkpoint::latest_checkpoint(config_.checkpoint_dir);
    policy_step_base_ = newest.ok() ? checkpoint::checkpoint_step(std::filesystem::path(*newest).filename().string())
                                          .value_or(0)
                                    : 0;
  }
  return policy_step_base_ + closures_completed_;
}

void Coordinator::save_by_policy() {
  if (checkpointing_ || !ps_health_.status().ok()) return;
  tasks_.add(save_own_checkpoint().then([this](Result<std::string> saved) {
    if (!saved.ok()) log_->warn("checkpoint policy: {}", saved.status().to_string());
  }));
}

kj::Promise<Result<std::string>> Coordinator::save_own_checkpoint() {
  checkpointing_ = true;
  completed_at_checkpoint_ = closures_completed_;
  const int64_t step = policy_step();
  return save_checkpoint(config_.checkpoint_dir, step, config_.checkpoint_max_to_keep)
      .then([this, step](Result<std::string> saved) {
        checkpointing_ = false;
        if (saved.ok()) saved_step_ = step;
        changes_.notify();   // a leave or drain waiting for this save
        maybe_checkpoint();  // another one came due meanwhile
        return saved;
      });
}

// ---- Preemption ------------------------------------------------------------------------

kj::Promise<void> Coordinator::checkpoint_before_leaving(std::string why) {
  if (config_.checkpoint_dir.empty() || !config_.checkpoint_on_preemption) return kj::READY_NOW;
  // After a policy save in flight, which holds the same step otherwise.
  return changes_.until([this]() { return !checkpointing_; })
      .then([this]() -> kj::Promise<Result<std::string>> {
        // Nothing completed since the last one: it is current.
        if (policy_step() == saved_step_) return Result<std::string>(last_checkpoint_);
        return save_own_checkpoint();
      })
      .then([this, why = std::move(why)](Result<std::string> saved) {
        if (saved.ok()) {
          log_->info("{}: saved checkpoint {}", why, *saved);
        } else {
          log_->warn("{}: no checkpoint: {}", why, saved.status().to_string());
        }
      });
}

kj::Promise<Status> Coordinator::leave_worker(int64_t worker_id, std::string reason) {
  if (reason.size() > 1024) return Status::InvalidArgument("leaveWorker: reason longer than 1 KiB");
  Worker* worker = workers_.find(worker_id);
  if (worker == nullptr) {
    return Status::NotFound("leaveWorker: no worker " + std::to_string(worker_id) +
                            " (it was dropped, or registered with another coordinator)");
  }
  worker->leaving = true;
  log_->info("worker {} (task {}) is leaving ({}): no more closures; waiting for its {} running closure(s)", worker_id,
             worker->task_index, reason, queue_.running_on(worker_id));
  changes_.notify();  // its idle lanes end
  auto idle = [this, worker_id]() {
    if (!workers_.alive(worker_id)) return true;  // dropped meanwhile
    return queue_.running_on(worker_id) == 0 && !strategies_.busy_with(worker_id);
  };
  std::string why = "worker " + std::to_string(worker_id) + " leaving";
  return changes_.until(idle)
      .then([this, why]() { return checkpoint_before_leaving(why); })
      .then([this, worker_id, reason]() {
        const Worker* found = workers_.find(worker_id);
        if (found == nullptr) return Status::Ok();
        int task = found->task_index;
        workers_.remove(worker_id);
        log_->info("worker {} (task {}) left ({}); its closures finished", worker_id, task, reason);
        changes_.notify();
        return Status::Ok();
      });
}

kj::Promise<void> Coordinator::drain(std::string reason) {
  gate_.drain();
  log_->info("{}: no more dispatch; waiting for {} running closure(s); {} queued closure(s) {}", reason,
             queue_.running(), queue_.queued(),
             durable() ? "stay in the journal and run when the coordinator restarts with its work_dir"
                       : "will not run (no work_dir)");
  changes_.notify();
  return changes_.until([this]() { return queue_.running() == 0 && !strategies_.busy(); })
      // The ends of the closures that finished are in the journal before
      // the process goes, so that a restart does not run them again.
      .then([this]() { return journal_synced().ignoreResult(); })
      .then([this, reason]() { return checkpoint_before_leaving(reason); });
}

}  // namespace capstan::coordinator
