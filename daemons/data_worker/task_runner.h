// TaskRunner: one data-service task on a data worker. It runs the task's
// pipeline and hands elements to consumers, in one of three ways:
//
//   first come, first served (the default): a background thread keeps a
//       bounded buffer (elements and bytes) full; each request takes the
//       next elements, up to its own limits (small elements go out in
//       batches). Numbered requests are acknowledged: the runner keeps each
//       consumer's replies until the consumer acknowledges them (a
//       consumer keeps up to kMaxRequestsInFlight requests in flight), so a
//       reply lost on the way is sent again; and a runner rebuilt after its worker
//       restarted skips the elements its first consumer says it has (the
//       pipeline is deterministic, and DYNAMIC splits come back in the same
//       order), so nothing is lost and nothing repeats. It trusts that count
//       once the consumer has acknowledged every reply before its first
//       request here ("none ready" until then): a request sent while an
//       earlier one was in flight counts without that one's reply;
//   coordinated reads (num_consumers > 0; infinite datasets): elements come
//       in rounds of num_consumers consecutive elements; consumer c of round
//       r gets element c of that round, so every consumer takes one step per
//       round in lockstep;
//   cross-trainer cache (named jobs): elements stay in a sliding window
//       bounded in bytes; every trainer (trainer_id) reads the window from
//       its own position, so trainers share what was produced once; a
//       trainer that fell behind the window jumps to its start.
//
// Thread-safety: all methods may be called from any thread.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_TASK_RUNNER_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_TASK_RUNNER_H_

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capstan/data/dataset.h"
#include "sync/mutex.h"

namespace capstan::data_worker {

class TaskRunner {
 public:
  struct Options {
    int64_t buffer_elements = 256;     // first-come mode: prefetched elements
    int64_t buffer_bytes = 64 << 20;   // first-come mode: prefetched bytes
    int64_t num_consumers = 0;         // > 0: coordinated reads
    bool cross_trainer_cache = false;
    int64_t cache_bytes = 256 << 20;   // the sliding window
  };
  struct Request {
    int64_t consumer_index = -1;  // coordinated reads
    int64_t round = -1;           // coordinated reads
    std::string trainer_id;       // cross-trainer cache
    // First-come acknowledgement: `sequence` 1, 2, 3, ... per client (0:
    // none). `acknowledged`: the client has the replies up to this number
    // (-1: sequence - 1, one request at a time). A kept number again is a
    // retry; the next number after the last one served gets new elements.
    // `received`: elements of this task the client has.
    int64_t client_id = -1;
    int64_t sequence = 0;
    int64_t acknowledged = -1;
    int64_t received = 0;
    int max_elements = 1;
    int64_t max_bytes = 16 << 20;
    // How long to wait for a first element before answering with none.
    std::chrono::milliseconds wait{100};
  };
  struct Reply {
    std::vector<Element> elements;
    bool end_of_sequence = false;
    // The pipeline's error, after `elements` (get() itself fails only for
    // a bad request or a task being removed).
    Status pipeline_error;
  };

  TaskRunner(std::unique_ptr<data::Iterator> iterator, Options options);
  ~TaskRunner();  // stops the producer and joins it
  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  // Elements for one request. Errors of the pipeline are returned once, in
  // order, like a local iterator's; InvalidArgument for a bad request;
  // FailedPrecondition for a request number that is neither a kept one nor
  // the next (a client's first numbered request here may skip numbers: they
  // were answered while the task was built, empty, and get empty replies);
  // InvalidArgument for more than kMaxRequestsInFlight unacknowledged ones.
  Result<Reply> get(const Request& request);
  // Elements produced so far (for metrics and tests).
  int64_t produced() const;
  // Consumers whose last reply is kept, at most this many (the oldest go).
  static constexpr size_t kMaxAcknowledgedClients = 1024;
  // Requests of one client after its acknowledged one, at most.
  static constexpr int64_t kMaxRequestsInFlight = 16;

 private:
  Result<Reply> get_first_come(const Request& request) REQUIRES(mutex_);
  Result<Reply> take_first_come(const Request& request) REQUIRES(mutex_);
  // Drops buffered elements still to skip.
  void skip_buffered() REQUIRES(mutex_);
  Result<Reply> get_round(const Request& request) REQUIRES(mutex_);
  Result<Reply> get_cached(const Request& request) REQUIRES(mutex_);
  // Pulls one element from the pipeline on the calling thread (with the lock
  // released around the pull); false at the end.
  Result<bool> pull_locked(Element* out) REQUIRES(mutex_);
  void produce();  // the first-come producer thread

  const Options options_;
  std::unique_ptr<data::Iterator> iterator_;  // used by one thread at a time (pulling_)
  mutable Mutex mutex_;
  CondVar cv_;
  bool pulling_ GUARDED_BY(mutex_) = false;  // someone is in iterator_->get_next
  bool end_ GUARDED_BY(mutex_) = false;
  bool stopping_ GUARDED_BY(mutex_) = false;
  int64_t produced_ GUARDED_BY(mutex_) = 0;
  // First come: buffered results (an element or an error).
  struct Item {
    Status status;
    Element element;
  };
  std::deque<Item> buffer_ GUARDED_BY(mutex_);
  int64_t buffer_bytes_ GUARDED_BY(mutex_) = 0;
  // Acknowledgement: each client's replies it has not acknowledged yet, by
  // request number, and the last number served.
  struct ClientReplies {
    int64_t last_served = 0;
    std::map<int64_t, Reply> kept;
  };
  std::map<int64_t, ClientReplies> clients_ GUARDED_BY(mutex_);
  std::deque<int64_t> client_order_ GUARDED_BY(mutex_);  // first seen first
  bool asked_ GUARDED_BY(mutex_) = false;    // a request came in
  int64_t skip_ GUARDED_BY(mutex_) = 0;      // elements still to drop (rebuilt task)
  // The first client, until its element count can be trusted (-1: none),
  // and its first request number here; elements handed to any client.
  int64_t resuming_client_ GUARDED_BY(mutex_) = -1;
  int64_t resume_from_ GUARDED_BY(mutex_) = 0;
  int64_t handed_out_ GUARDED_BY(mutex_) = 0;
  // Coordinated reads: round -> its elements; consumers that took theirs.
  struct Round {
    std::vector<Element> elements;
    std::vector<bool> taken;
    int64_t remaining = 0;
  };
  std::map<int64_t, Round> rounds_ GUARDED_BY(mutex_);
  // Cross-trainer cache: the window [window_start_, window_start_ + size).
  std::deque<std::pair<Element, int64_t>> window_ GUARDED_BY(mutex_);  // element, bytes
  int64_t window_start_ GUARDED_BY(mutex_) = 0;
  int64_t window_bytes_ GUARDED_BY(mutex_) = 0;
  std::map<std::string, int64_t> trainer_positions_ GUARDED_BY(mutex_);
  std::thread producer_;
};

}  // namespace capstan::data_worker

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_TASK_RUNNER_H_
