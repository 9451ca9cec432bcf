// CoordinatorStats: the coordinator's totals and levels for /metrics and the
// status page. The loop thread writes them (each part of the coordinator
// counts its own); any thread reads them. Shared (Coordinator::stats()), so
// a metrics callback may outlive the coordinator.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_STATS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_STATS_H_

#include <atomic>
#include <cstdint>

namespace capstan::coordinator {

struct CoordinatorStats {
  std::atomic<int64_t> closures_scheduled{0};
  std::atomic<int64_t> closures_succeeded{0};
  std::atomic<int64_t> closures_failed{0};  // ended with an error (not re-run)
  std::atomic<int64_t> closures_queued{0};
  std::atomic<int64_t> closures_running{0};
  std::atomic<int64_t> workers{0};
  std::atomic<int64_t> checkpoints_saved{0};
  std::atomic<int64_t> ps_recoveries{0};
  std::atomic<int64_t> ps_peer_recoveries{0};       // of ps_recoveries: from a buddy's peer snapshot
  std::atomic<int64_t> peer_snapshots{0};           // deltas sent to a buddy
  std::atomic<int64_t> peer_snapshot_failures{0};
  std::atomic<int64_t> steps_completed{0};  // synchronous steps (run_step) that succeeded
  std::atomic<int64_t> steps_failed{0};     // synchronous steps that failed (a replica lost or its closure's error)
  std::atomic<int64_t> step_replicas{0};    // replicas of the last synchronous step that succeeded
  std::atomic<int64_t> step_examples{0};    // step input examples committed by synchronous steps
  std::atomic<int64_t> closures_released{0};  // results (or closures in flight) the programs let go
  std::atomic<int64_t> results_kept{0};       // finished closures whose values are kept for fetch
  std::atomic<int64_t> clients{0};            // program clients heard from within client_grace
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_STATS_H_
