#include "daemons/coordinator/checkpoint_policy.h"

#include <filesystem>
#include <utility>

#include "checkpoint/checkpoint.h"

namespace capstan::coordinator {

CheckpointPolicy::CheckpointPolicy(const CoordinatorConfig& config, LoopContext loop, const PsHealth& health,
                                   CoordinatorJournal& journal, Save save)
    : config_(config), loop_(std::move(loop)), health_(health), journal_(journal), save_(std::move(save)) {}

void CheckpointPolicy::start() {
  if (!config_.checkpoint_dir.empty() && config_.checkpoint_every_seconds.count() > 0) loop_.tasks.add(timer());
}

void CheckpointPolicy::closure_succeeded() {
  ++closures_completed_;
  maybe_save();
}

void CheckpointPolicy::maybe_save() {
  if (config_.checkpoint_dir.empty() || config_.checkpoint_every_steps <= 0) return;
  if (closures_completed_ - completed_at_checkpoint_ < config_.checkpoint_every_steps) return;
  save_by_policy();
}

kj::Promise<void> CheckpointPolicy::timer() {
  return loop_.timer.afterDelay(config_.checkpoint_every_seconds.count() * kj::SECONDS).then([this]() {
    // Nothing new since the last one: nothing to save.
    if (closures_completed_ != completed_at_checkpoint_) save_by_policy();
    return timer();
  });
}

int64_t CheckpointPolicy::policy_step() {
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

void CheckpointPolicy::save_by_policy() {
  if (saving_ || !health_.status().ok()) return;
  loop_.tasks.add(save_own().then([this](Result<std::string> saved) {
    if (!saved.ok()) loop_.log->warn("checkpoint policy: {}", saved.status().to_string());
  }));
}

kj::Promise<Result<std::string>> CheckpointPolicy::save_own() {
  saving_ = true;
  completed_at_checkpoint_ = closures_completed_;
  const int64_t step = policy_step();
  return save_(config_.checkpoint_dir, step, config_.checkpoint_max_to_keep)
      .then([this, step](Result<std::string> saved) {
        saving_ = false;
        if (saved.ok()) saved_step_ = step;
        loop_.changes.notify();  // a leave or drain waiting for this save
        maybe_save();            // another one came due meanwhile
        return saved;
      });
}

kj::Promise<void> CheckpointPolicy::before_leaving(std::string why) {
  if (config_.checkpoint_dir.empty() || !config_.checkpoint_on_preemption) return kj::READY_NOW;
  // After a policy save in flight, which holds the same step otherwise.
  return loop_.changes.until([this]() { return !saving_; })
      .then([this]() -> kj::Promise<Result<std::string>> {
        // Nothing completed since the last one: it is current.
        if (policy_step() == saved_step_) return Result<std::string>(last_);
        return save_own();
      })
      .then([this, why = std::move(why)](Result<std::string> saved) {
        if (saved.ok()) {
          loop_.log->info("{}: saved checkpoint {}", why, *saved);
        } else {
          loop_.log->warn("{}: no checkpoint: {}", why, saved.status().to_string());
        }
      });
}

void CheckpointPolicy::set_last(const std::string& path) {
  if (path == last_) return;
  last_ = path;
  Status logged = journal_.last_checkpoint(path);
  if (!logged.ok()) {
    // Recovery after a restart falls back to checkpoint_dir's newest.
    loop_.log->warn("journaling the last checkpoint {}: {}", path, logged.to_string());
  }
}

}  // namespace capstan::coordinator
