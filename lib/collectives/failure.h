// How a host group fails: never a hang, and the dead rank named.
//
// A rank that sees a failure (a peer's connection closed, a deadline
// passed, a mismatch) sends an abort Notice (frames.h) on every control
// connection, naming the ranks it suspects (the ones it was still waiting
// for), and then listens for the others' notices for a short grace period.
// A rank that sends a notice is alive, so the ranks reported are the
// suspects that stayed silent: the dead or stuck ones, whichever rank
// noticed first. A peer on shared memory that dies shows as its control
// connection closing while this rank still waits for its bytes.
//
// Thread-safety: interrupt(), interrupted(), interruption() and aborted()
// from any thread; everything else on the thread that runs the group's
// operations (it drives mesh.io).
#ifndef CAPSTAN_LIB_COLLECTIVES_FAILURE_H_
#define CAPSTAN_LIB_COLLECTIVES_FAILURE_H_

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "collectives/frames.h"
#include "collectives/mesh.h"
#include "sync/mutex.h"

namespace capstan::collectives {

// Unavailable for a link to `peer` that broke: "closed its connection (the
// process exited or was killed)" when `closed`, else what failed while
// `doing` what.
Status link_failure(int peer, const std::string& address, bool closed, std::string_view doing,
                    const std::string& error);

// Unavailable: operation `kind` (frames.h) ran past its deadline.
Status timed_out(uint32_t kind, std::chrono::milliseconds timeout);

// What this rank reports once the grace period is over: `first` (what it
// saw) unless it was a mismatch elsewhere (InvalidArgument, from a peer's
// notice) or there are suspects nobody vouched for (Unavailable naming
// them). `notices` by rank: what each peer sent, if anything; `closed`: the
// ranks whose control connection closed.
Status verdict(const Status& first, std::set<int> suspects, const std::vector<std::optional<Notice>>& notices,
               const std::set<int>& closed, int rank);

class GroupFailure {
 public:
  // `mesh` must outlive this.
  GroupFailure(Mesh& mesh, int64_t generation, std::chrono::milliseconds timeout);

  // Starts reading every peer's control connection (once; the reads stay
  // outstanding across operations).
  void listen();
  // Unavailable ("rank N gave up: ...") once a peer's notice arrived.
  Status notice() const;
  bool closed(int peer) const { return peers_closed_.count(peer) != 0; }
  // Aborted, naming what aborted the group, once it failed.
  Status usable() const;

  // Gives up on the group: tells every peer which ranks this one suspects,
  // collects their notices for a grace period, reports the suspects nobody
  // vouched for (verdict()), and closes every connection.
  Status fail(const Status& first, std::set<int> suspects);
  // fail(reason) unless the group failed already (then why it did).
  Status abort(const Status& reason);

  // From any thread: the running operation gives up with `why` at its next
  // step (wakes mesh.io if it sleeps there).
  void interrupt(const Status& why) LOCKS_EXCLUDED(interrupt_mutex_);
  bool interrupted() const { return interrupted_.load(std::memory_order_acquire); }
  Status interruption() const LOCKS_EXCLUDED(interrupt_mutex_);
  bool aborted() const { return aborted_.load(); }

 private:
  void read_notice(int peer);

  Mesh& mesh_;
  const int64_t generation_;
  const std::chrono::milliseconds timeout_;

  // Operations' thread only:
  std::vector<std::optional<Notice>> notices_in_;  // the notice each peer sent, once read
  std::set<int> peers_closed_;  // control connections that closed (the process is gone)
  bool reading_notices_ = false;
  Status abort_reason_;

  std::atomic<bool> aborted_{false};
  std::atomic<bool> interrupted_{false};
  mutable Mutex interrupt_mutex_;
  Status interrupt_reason_ GUARDED_BY(interrupt_mutex_);
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_FAILURE_H_
