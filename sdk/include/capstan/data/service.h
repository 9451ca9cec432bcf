// The tf.data service client: register a pipeline with a data-dispatcher and
// read it back from the data workers the dispatcher assigns.
//
// Glossary (as in TensorFlow's tf.data service):
//   dataset id   what register_dataset() returns; the same definition always
//                gets the same id.
//   job          one reading of a registered dataset. Anonymous (empty
//                job_name): only this reader. Named: shared by every reader
//                that asks for the same name; the dispatcher refuses the same
//                name with other parameters (InvalidArgument).
//   task         a job's share on one data worker; a reader reads tasks.
//   processing   how the work is split among data workers: kOff (every
//   mode         worker runs the whole dataset, so with N workers each element
//                arrives N times), kDynamic (the dispatcher hands out splits;
//                every element once), kFile / kData / kFileOrData (static
//                sharding by file or by element), kHint (SHARD_HINT filled in
//                per worker).
//   coordinated  num_consumers > 0 (named jobs, infinite datasets): consumers
//   reads        read in lockstep rounds, consumer c taking element c of each
//                round, so every trainer step sees equally sized batches.
//
// Example:
//   namespace service = capstan::data::service;
//   auto ds = capstan::data::Dataset::range(1000).map(Fn::named("parse"));
//   service::ReadOptions options;
//   options.processing_mode = service::ProcessingMode::kDynamic;
//   options.client.token = capstan::token_from_environment().value();
//   auto distributed = service::distribute(ds, "dispatcher:5050", options).value()
//                          .prefetch(capstan::data::kAutotune);  // runs locally
//   auto it = distributed.make_iterator().value();
//   while (auto element = it->get_next().value()) { ... }
//
// A reader connects lazily, on its iterator's first get_next(); nothing is
// contacted by from_dataset_id() or make_iterator(), which only check the
// arguments (InvalidArgument naming the bad one).
#ifndef CAPSTAN_DATA_SERVICE_H_
#define CAPSTAN_DATA_SERVICE_H_

#include "capstan/export.h"

#include <cstdint>
#include <string>

#include "capstan/client.h"
#include "capstan/data/dataset.h"
#include "capstan/status.h"

namespace capstan CAPSTAN_API {
namespace data::service {

// The values match schemas/data_dispatcher.capnp's ProcessingMode.
enum class ProcessingMode { kOff, kDynamic, kFile, kData, kFileOrData, kHint };

struct ReadOptions {
  ProcessingMode processing_mode = ProcessingMode::kOff;
  std::string job_name;            // empty: anonymous job (only this reader)
  int64_t consumer_index = -1;     // coordinated reads: 0..num_consumers-1
  int64_t num_consumers = 0;       // > 0: coordinated reads (needs job_name)
  std::string trainer_id;          // cross-trainer cache (named jobs)
  bool cross_trainer_cache = false;
  int64_t cross_trainer_cache_bytes = 256 << 20;
  int max_elements_per_request = 64;   // batch small elements
  // How data workers send the elements (TF's `compression`; distribute()
  // registers the dataset with it, register_dataset() takes it as an
  // argument): "AUTO" (the default, as in TF) compresses with zstd where it
  // pays: not to a reader on the worker's host (loopback is faster than
  // compression), not small tensors, not a task whose tensors do not
  // shrink; "ZSTD" compresses every tensor that shrinks; "NONE" never.
  // Any case; another value is InvalidArgument.
  std::string compression = "AUTO";
  // getElements calls kept in flight per task (first-come reads; TF's
  // max_outstanding_requests), 1 to 16: the next replies travel while the
  // consumer works on the last. Each may carry up to 16 MiB (8 MiB of
  // tensors in shared memory, where one is in flight at a time: its bytes
  // do not travel, and a second only spreads the worker's copies past the
  // CPU's cache). Over TCP a reply's tensors are received in
  // place, in one buffer that stays until the reply's last element is
  // dropped: a consumer that keeps elements of many replies for long (a
  // large shuffle buffer after the service, say) holds up to a reply's
  // bytes per element kept.
  int max_outstanding_requests = 2;
  // Shared memory with a data worker on this host (TF's target_workers
  // "LOCAL" idea, but automatic): the worker writes large tensors once
  // into a region of this many bytes that the reader maps, and the reader
  // hands them out in place. Used whenever the worker is on this host and
  // both sides can map the region, TCP otherwise (and for any element that
  // does not fit while the region is full); 0 turns it off.
  int64_t shared_memory_bytes = 128 << 20;
  // The token travels in the dataset definition (an empty one falls back to
  // token_from_environment() when the reader starts). register_dataset uses
  // every field; a reader uses the default timeouts and message limit.
  ClientOptions client;
};

// Registers the definition with the dispatcher; the same definition with the
// same compression (see ReadOptions::compression) gets the same id. Retries
// while the dispatcher is unreachable, up to options.connect_timeout (then
// Unavailable).
Result<std::string> register_dataset(const std::string& dispatcher_address, const Dataset& dataset,
                                     const ClientOptions& options = {}, const std::string& compression = "AUTO");

// A dataset that reads a registered dataset through the service. Its
// cardinality is unknown; it cannot be split or sharded further by the
// service. Arguments are checked by make_iterator().
Dataset from_dataset_id(const std::string& dispatcher_address, const std::string& dataset_id,
                        const ReadOptions& options = {});

// register_dataset + from_dataset_id; ops applied to the result run locally.
Result<Dataset> distribute(const Dataset& dataset, const std::string& dispatcher_address,
                           const ReadOptions& options = {});

}  // namespace data::service
}  // namespace capstan

#endif  // CAPSTAN_DATA_SERVICE_H_
