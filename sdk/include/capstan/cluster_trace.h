// A timeline of the whole cluster, and its flight records (capstan/trace.h).
//
//   capstan::ClusterTraceOptions options;
//   options.seconds = 5;
//   options.this_process = true;   // the program's own spans too
//   auto trace = capstan::record_cluster_trace("127.0.0.1:7000", options);
//   std::ofstream("census.json") << trace->json;   // open in Perfetto or chrome://tracing
//
// record_cluster_trace asks the coordinator for the cluster's daemons
// (itself, its parameter servers, its workers), adds `extra_addresses` (a
// data dispatcher brings its data workers), measures each one's clock offset over RPC round trips,
// has each record `seconds` of spans at once and writes them as one Chrome
// trace event file (JSON object format): a process per daemon (named by
// role, task and address), a thread per recording thread, complete events
// ("X") for closures, steps, phases, collectives, checkpoint phases and
// the program's schedule() calls, async events ("b"/"e") for RPCs, and
// flows ("s"/"f", category "closure") from a closure's schedule on the
// program to its run on a worker. Times are the program's clock (each
// daemon's shifted by its offset), in microseconds from the trace's start;
// "otherData" says each process's offset and round trip.
//
// dump_cluster prints every daemon's flight records (its last `last`, and
// every one still running: where it waits); a daemon that does not answer
// within `answer_timeout` is named as such (stopped, hung or dead), and the
// others still print.
//
// Thread-safety: both may run on any thread; one trace at a time per
// daemon (a second gets FAILED_PRECONDITION from it).
#ifndef CAPSTAN_CLUSTER_TRACE_H_
#define CAPSTAN_CLUSTER_TRACE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "capstan/client.h"
#include "capstan/export.h"
#include "capstan/status.h"

namespace capstan CAPSTAN_API {

struct ClusterTraceOptions {
  double seconds = 5;                        // (0, 600]
  size_t max_events = 200000;                // per process, 1 to 500000
  std::vector<std::string> extra_addresses;  // daemons the coordinator does not know
  bool this_process = false;                 // record the calling program too
  std::string this_process_name = "program";
  ClientOptions client;
};

struct ClusterTrace {
  std::string json;                 // the Chrome trace event file
  int processes = 0;                // that answered
  size_t events = 0;                // trace events written
  uint64_t dropped = 0;             // past a process's max_events
  std::vector<std::string> errors;  // "worker:2 at ADDR: ..." for each daemon that did not answer

  // Writes `json` to `path` (whole or not at all); the error names the path.
  Status write(const std::string& path) const;
};

Result<ClusterTrace> record_cluster_trace(const std::string& coordinator, const ClusterTraceOptions& options);

struct ClusterDump {
  std::string text;             // every daemon's records, a section each
  std::vector<std::string> unanswered;  // "worker:2 (ADDR)": no answer within the timeout
};

Result<ClusterDump> dump_cluster(const std::string& coordinator, const std::vector<std::string>& extra_addresses,
                                 ClientOptions client, std::chrono::milliseconds answer_timeout,
                                 size_t last = 50);

}  // namespace capstan

#endif  // CAPSTAN_CLUSTER_TRACE_H_
