// data-dispatcher: the tf.data service dispatcher.
#include "daemons/common/daemon.h"
#include "daemons/data_dispatcher/service.h"

using capstan::daemon::OptionSpec;
using capstan::daemon::OptionType;
namespace wire = capstan::wire;

int main(int argc, char** argv) {
  capstan::daemon::RoleSpec spec;
  spec.role = wire::Role::DATA_DISPATCHER;
  spec.program = "data-dispatcher";
  spec.description =
      "Capstan data-service dispatcher (tf.data service DispatchServer): registers datasets, creates "
      "jobs, assigns tasks to data workers and hands out splits.";
  spec.options = {
      {"work_dir", OptionType::kString,
       "Fault-tolerant mode: journal every state change here (fsync'd) and replay it on start; "
       "empty keeps the state in memory.",
       ""},
      OptionSpec{"job_gc_check_interval_ms", OptionType::kInt, "How often to look for jobs to garbage-collect.",
          "1000"}
          .at_least(1),
      {"job_gc_timeout_ms", OptionType::kInt,
       "A job whose consumers all left is collected after this long (-1: never).", "60000"},
      OptionSpec{"client_timeout_ms", OptionType::kInt, "A consumer without heartbeats for this long has left.",
          "10000"}
          .at_least(1),
      OptionSpec{"worker_timeout_ms", OptionType::kInt,
          "A data worker without heartbeats for this long is lost: it gets no new tasks, and its unfinished ones "
          "move to live workers, which replay them (its consumers lose and repeat nothing).",
          "10000"}
          .at_least(1),
      OptionSpec{"max_heartbeats_per_s", OptionType::kInt,
          "Heartbeats per second, from data workers and consumers together, the dispatcher asks for at most: "
          "each is asked to wait (workers + consumers) / this between heartbeats (within a quarter of "
          "worker_timeout_ms and client_timeout_ms) when that is longer than its own interval. 0: no limit.",
          "4000"}
          .at_least(0),
  };
  spec.peers = nullptr;  // data workers and clients come to the dispatcher
  spec.make_service = capstan::daemon::service_factory<capstan::data_dispatcher::DispatcherService>();
  return capstan::daemon::run_daemon(spec, argc, argv);
}
