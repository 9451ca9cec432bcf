// data-worker: data-service worker (tf.data service WorkerServer).
#include "daemons/common/daemon.h"
#include "daemons/data_worker/service.h"

using capstan::daemon::OptionType;
namespace wire = capstan::wire;

int main(int argc, char** argv) {
  capstan::daemon::RoleSpec spec;
  spec.role = wire::Role::DATA_WORKER;
  spec.loads_modules = true;
  spec.program = "data-worker";
  spec.description =
      "Capstan data-service worker (tf.data service WorkerServer): runs dataset pipelines for the tasks the dispatcher assigns and serves their elements to trainers.";
  spec.options = {
      {"dispatcher", OptionType::kString,
       "host:port of the data dispatcher (default: the cluster spec's dispatcher job).",
       std::nullopt},
      capstan::daemon::OptionSpec{
          "heartbeat_interval_ms", OptionType::kInt,
          "How often to heartbeat to the dispatcher (reports this worker's tasks; the reply adds and removes tasks).",
          "200"}
          .at_least(1),
      capstan::daemon::OptionSpec{"element_buffer_mib", OptionType::kInt,
                                  "Elements each task prefetches ahead of its consumers, in MiB (first-come tasks).",
                                  "64"}
          .in_range(1, int64_t{1} << 20),
      capstan::daemon::OptionSpec{
          "task_memory_mib", OptionType::kInt,
          "Memory each task's pipeline may hold in its buffers (shuffle, prefetch, batches, caches), in MiB; a "
          "task that needs more fails with RESOURCE_EXHAUSTED naming the op, and the worker keeps serving. A job's "
          "Options::memory_budget may set less.",
          "1024"}
          .in_range(1, int64_t{1} << 40),
  };
  spec.peers = capstan::daemon::one_peer(wire::Role::DATA_DISPATCHER, "dispatcher", "data_dispatcher");
  spec.make_service = capstan::daemon::service_factory<capstan::data_worker::DataWorkerService>();
  return capstan::daemon::run_daemon(spec, argc, argv);
}
