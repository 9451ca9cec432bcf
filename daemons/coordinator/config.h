// The coordinator's settings (CoordinatorConfig), read and checked once at
// start: CoordinatorConfig::from over the keys of CoordinatorConfig::options
// (both in service.cc, which links the daemon's configuration).
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CONFIG_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "capstan/status.h"

namespace capstan::daemon {
class Config;
struct OptionSpec;
}  // namespace capstan::daemon

namespace capstan::coordinator {

// The coordinator's settings, read and checked once at start.
// The parameter servers of a StatefulSet behind a headless Service, as
// Kubernetes names them: for `service` "ps.capstan.svc:7100" and n 2,
// "ps-0.ps.capstan.svc:7100" and "ps-1.ps.capstan.svc:7100" (the StatefulSet
// is named as the Service's first label; pod i's name is stable across
// restarts, so recovery finds it again). INVALID_ARGUMENT names a bad value.
Result<std::vector<std::string>> ps_addresses_of_service(const std::string& service, int64_t n);

struct CoordinatorConfig {
  std::vector<std::string> ps;  // addresses, ps task order
  int closures_per_worker = 1;
  // A lane sends up to this many closures in one call when the queue is deep
  // (WorkerPeer::run_closures); 1: one per call. Not with closure_timeout.
  int closure_batch = 1;
  std::chrono::milliseconds worker_ping_interval{2000};
  std::chrono::milliseconds worker_ping_timeout{5000};
  // Workers per-worker datasets are sharded for; the number registered when
  // that is larger (0: always the number registered).
  int expected_workers = 0;
  // A run that takes longer fails with DeadlineExceeded (and, as any
  // closure error, cancels the others); the closure sees the deadline in its
  // context. 0: no deadline.
  std::chrono::milliseconds closure_timeout{0};

  // Where the coordinator journals what it must not forget across a restart
  // (variables and their placement, per-worker datasets, the checkpoint to
  // recover from); "": nothing survives a restart.
  std::string work_dir;
  // The journal is rewritten as a snapshot of the state once it holds this
  // many records and more than twice the live ones (closures kept,
  // variables, datasets).
  int64_t journal_compact_records = 100000;

  // The results of a program's closures are released when its client (the
  // client id its schedule calls carry) has not been heard from for this
  // long: its program is gone, and nothing can fetch them any more. A live
  // SDK client calls at least every kClientHeartbeat (a release, empty when
  // there is nothing to release); a client that reconnects within it (a
  // link outage, a coordinator restart) fetches its values as before.
  // 0: never (kept until released one by one).
  std::chrono::milliseconds client_grace{300000};
  // A schedule is answered only once fewer closures than this wait for a
  // worker (queue_room), and the SDK blocks schedule() while 16384 of its
  // schedules have no answer: a program that schedules faster than the
  // workers run waits (TF's schedule blocks while its queue is full), and
  // the queue, the coordinator's memory with it, stays bounded.
  int64_t max_queued_closures = 32768;

  // The checkpoint policy: every `checkpoint_every_steps` closures completed
  // and/or every `checkpoint_every_seconds`, the coordinator saves into
  // `checkpoint_dir` (keeping the newest checkpoint_max_to_keep). 0: off.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;
  std::chrono::seconds checkpoint_every_seconds{0};
  int checkpoint_max_to_keep = 3;
  // A parameter server that comes back without its shards is restored from
  // the latest checkpoint by itself (false: only by restore_checkpoint).
  bool ps_recovery = true;
  // How long join/fetch wait for a lost parameter server that can be
  // recovered before they fail with Unavailable.
  std::chrono::milliseconds ps_recovery_timeout{300000};
  // Every this often each parameter server sends its buddy (the next in
  // `ps`, cyclically) the changes since its last peer snapshot, which the
  // buddy keeps in memory; a server that comes back empty is recovered from
  // that copy first, the disk checkpoint being the fallback. 0: off.
  std::chrono::seconds peer_snapshot_every_seconds{0};
  // With checkpoint_dir: a worker leaving or the coordinator stopping
  // (SIGTERM) saves a checkpoint once the running closures have finished.
  bool checkpoint_on_preemption = true;

  // The coordinator's own keys, each integer with its range; from() expects
  // a Config parsed with them. Defined with the service (service.cc), which
  // links the daemon's configuration.
  static std::vector<daemon::OptionSpec> options();
  // InvalidArgument naming the key and the value, for what the ranges cannot
  // say (keys that exclude each other, client_grace_ms's gap).
  static Result<CoordinatorConfig> from(const daemon::Config& config);
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CONFIG_H_
