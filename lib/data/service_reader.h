// ServiceReader: the iterator of a data_service op (from_dataset_id), the
// consumer side of TensorFlow's DataServiceClient.
//
// Protocol, on the first get_next():
//   1. getOrCreateJob(JobParams from the op) -> jobId, jobClientId
//      (Unavailable is retried with backoff up to the connect timeout);
//   2. clientHeartbeat every heartbeat_interval (and whenever no task had
//      data) -> the job's tasks (taskId, workerAddress) and jobFinished;
//      each sends the fingerprint of the list it has, and an unchanged list
//      is not sent again; a reply may ask for a longer interval (the
//      dispatcher spreading its heartbeat budget), which then paces the
//      idle wake-ups too;
//   3. getElements from the tasks:
//        first come (default): tasks in turn, round robin by task id; a reply
//          carries up to max_elements_per_request elements, kept in a local
//          queue and returned one by one; an empty reply without
//          endOfSequence means "none ready": try the next task, back off a
//          little when none had data; endOfSequence ends that task;
//        coordinated reads (num_consumers > 0): round r is read from task
//          r % (number of tasks, sorted by id) with {consumerIndex, round r},
//          one element per round;
//      the iteration ends when every known task has ended and the
//      dispatcher reports the job finished (in OFF mode each worker's task
//      yields the whole dataset, as in TensorFlow);
//   4. on destruction: releaseJobClient (best effort).
//
// Failures: Unavailable, DeadlineExceeded, ResourceExhausted and NotFound
// (a worker that has not heard of the task yet) from a worker are retried
// with a per-task backoff (the other tasks are read meanwhile); a task whose
// worker keeps failing for worker_drop_after and that the dispatcher no
// longer lists is dropped. A heartbeat that fails
// transiently is retried; any other heartbeat error ends the reader (every
// later get_next returns it). Any other getElements error is one element's
// error, as from a local pipeline.
//
// Nothing lost, nothing twice (first-come reads): requests to a task are
// numbered 1, 2, 3, ... and carry how many of its elements the reader has
// and `acknowledged`, the number of the last request whose reply (and every
// earlier one) arrived. The worker keeps every reply after `acknowledged`.
// A request that failed goes again with the same number and gets the same
// elements. A worker that restarted rebuilds the task (same DYNAMIC splits,
// see getSplit) and skips what the reader already has. TensorFlow loses
// the elements of a lost reply.
//
// Requests in flight (TF's max_outstanding_requests, per task here): the
// reader keeps max_outstanding_requests numbered requests out to each task
// it reads, so the next replies travel while the consumer works on the
// last. Example with 2: it sends 1 and 2 (acknowledged 0) and takes reply
// 1; once the consumer has used its elements and wants more, it sends 3
// (acknowledged 1) and takes reply 2; ... So `acknowledged` also says what
// the consumer used, and the worker holds a task's end back (answering
// "none ready") while an unacknowledged earlier reply carried elements: a
// task reported finished is never one a checkpoint still needs.
// Replies are taken in their numbers' order, so a task's elements keep
// their order; the worker serves one consumer's requests to a task one
// after the other in that order too (DataWorkerService::getElements). When
// the oldest request fails, the ones after it are dropped whatever they
// got, and the window starts again from the failed number: the worker
// still has those replies (none was acknowledged) and sends them again;
// a restarted worker rebuilds the task and skips the `received` elements.
// A worker may answer a request without its task's runner (an empty reply
// while the task is being built); a runner that first hears of a reader at
// number n > acknowledged + 1 answers the numbers in between empty.
//
// Shared memory (ReaderConfig::shared_memory_bytes > 0, data/shm_region.h):
// every getElements also carries the reader's id for that worker, its
// host's boot id, and the token of the worker's region it has mapped (none
// at first). A worker on the same host answers the first such request
// whose reply has a large tensor with an offer (readers of small elements
// never get a region) (a sealed memfd, opened here as /proc/<pid>/fd/<fd> and checked:
// only a process on the same host and in the same PID namespace can, which
// is the locality test; a container without /proc access or another user
// cannot, and reads that worker by TCP). Once the reader names the region,
// the worker writes each large tensor (>= 64 KiB, not strings) once into
// it and the reply carries offsets; the reader checks each against the
// region and hands out tensors that point into it, released when dropped
// (on any thread). A tensor that does not fit while the region is full
// goes by TCP. A failed request gives the region up (the replies that will
// never be read hold records in it) and the next request asks for a new one;
// the worker drops regions nobody names for a minute.
//
// Thread-safety: get_next() from one thread at a time (the engine's
// contract). Cap'n Proto objects live on the reader's own LoopThread.
#ifndef CAPSTAN_LIB_DATA_SERVICE_READER_H_
#define CAPSTAN_LIB_DATA_SERVICE_READER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "capstan/client.h"
#include "capstan/status.h"
#include "capstan_schemas/dataset.capnp.h"
#include "data/engine.h"

namespace capstan::data::service {

// What a reader needs: the op's fields, plus timings (tests shorten them).
struct ReaderConfig {
  std::string address;
  std::string dataset_id;
  uint8_t processing_mode = 0;  // wire::ProcessingMode
  std::string job_name;
  int64_t consumer_index = -1;
  int64_t num_consumers = 0;
  std::string trainer_id;
  bool cross_trainer_cache = false;
  int64_t cross_trainer_cache_bytes = 0;
  int max_elements_per_request = 64;
  int max_outstanding_requests = 2;     // first come: getElements in flight per task
  int64_t shared_memory_bytes = 128 << 20;  // the region asked of a worker on this host; 0: TCP only
  std::string token;
  std::string client_name = "data-service-reader";

  std::chrono::milliseconds connect_timeout{10000};    // dispatcher: retry window
  std::chrono::milliseconds call_timeout{60000};       // each RPC
  std::chrono::milliseconds worker_connect_timeout{500};  // one request's wait for a worker link
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds worker_drop_after{10000};
  std::chrono::milliseconds max_idle_backoff{100};     // sleep when no task had data
  uint64_t max_message_bytes = 64ull << 20;
};

// The config of a data_service op (which must be one).
ReaderConfig config_from_op(wire::Op::Reader op);

// Checks a data_service op's arguments (InvalidArgument naming the bad one).
Status validate_data_service(wire::Op::Reader op);

// "host:port, <dataset id>, <mode>[, job=...][, consumer i of n]", the
// arguments Dataset::debug_string shows (never the token).
std::string describe_data_service_args(wire::Op::Reader op);

// service::register_dataset: registers the serialized definition with the
// dispatcher (retrying transient failures within options.connect_timeout)
// and returns its dataset id. An empty options.token falls back on
// token_from_environment().
Result<std::string> register_definition(const std::string& dispatcher_address, const std::string& definition,
                                        const ClientOptions& options, const std::string& compression);

// The reader; contacts nothing until the first get_next().
std::unique_ptr<engine::IteratorBase> make_service_reader(ReaderConfig config);

}  // namespace capstan::data::service

#endif  // CAPSTAN_LIB_DATA_SERVICE_READER_H_
