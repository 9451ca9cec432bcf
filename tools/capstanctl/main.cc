// capstanctl: the command line users run against a Capstan cluster.
//
//   capstanctl health ADDR...   ping each daemon's gate; print role, version,
//                               uptime, readiness. Exit 1 if any failed.
//   capstanctl records count|cat|verify FILE...
//                               count, print or check the records of TFRecord
//                               files. Exit 1 if any file is damaged.
//   capstanctl status COORDINATOR
//                               each worker's phases and straggler score.
//   capstanctl trace [--seconds N] [--out FILE] COORDINATOR [ADDR...]
//                               N seconds of the whole cluster as one Chrome
//                               trace event file.
//   capstanctl dump [--last N] COORDINATOR [ADDR...]
//                               every daemon's flight records.
//   capstanctl replicas COORDINATOR STRATEGY
//                               a MirroredStrategy's replicas: step and
//                               checksum each. Exit 1 unless all agree.
//
// The cluster token comes from CAPSTAN_TOKEN, --token-file or
// CAPSTAN_TOKEN_FILE (never from a flag value, which `ps` would show).
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "capstan/client.h"
#include "capstan/cluster_trace.h"
#include "capstan/phases.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "checkpoint/checkpoint.h"
#include "rpc/connection.h"
#include "rpc/phase_codec.h"
#include "async/status_exception.h"
#include "async/loop_thread.h"
#include "data/io/tfrecord.h"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "Usage: capstanctl [--token-file FILE] [--timeout-ms N] COMMAND [ARGS...]\n"
    "\n"
    "Commands:\n"
    "  health ADDR...   Log in to each daemon (host:port) and print its role, task\n"
    "                   index, version, uptime, readiness and GPUs. Exits 1 if any\n"
    "                   daemon is unreachable or refuses the token.\n"
    "  data datasets|jobs|workers ADDR\n"
    "                   The data dispatcher's datasets, jobs (name, mode, clients,\n"
    "                   tasks) and workers (tasks, last heartbeat).\n"
    "  status COORDINATOR\n"
    "                   Each registered worker: closures and steps run, where their\n"
    "                   time went (queued, input, ps, compute, all-reduce), busy\n"
    "                   seconds per run and straggler score (1: the median\n"
    "                   worker; SLOW: named in the coordinator's log).\n"
    "  trace [--seconds N] [--out FILE] [--max-events N] COORDINATOR [ADDR...]\n"
    "                   Every daemon of the cluster (the coordinator, its parameter\n"
    "                   servers and workers, and each ADDR, e.g. a data service)\n"
    "                   records N seconds (default 5) of spans: closures, steps\n"
    "                   and their phases, RPCs, collectives, checkpoint phases.\n"
    "                   Written as one Chrome trace event JSON file (default\n"
    "                   trace.json; open it in Perfetto or chrome://tracing),\n"
    "                   clocks aligned by RPC round trips. Exits 1 if a daemon\n"
    "                   did not answer (the others are still written).\n"
    "  dump [--last N] COORDINATOR [ADDR...]\n"
    "                   Every daemon's flight recorder: its last N spans (default\n"
    "                   50) and every one still running, with its state. A\n"
    "                   daemon that does not answer within --timeout-ms is named\n"
    "                   (stopped, hung or dead); exits 1 then.\n"
    "  replicas COORDINATOR STRATEGY\n"
    "                   The replicas of a MirroredStrategy (synchronous training on\n"
    "                   the workers): group epoch, and each replica's worker, task,\n"
    "                   optimizer step and checksum. Exits 1 unless every replica\n"
    "                   answers with the same step and checksum.\n"
    "  checkpoint inspect DIR\n"
    "                   List what a checkpoint holds: step, files, variables\n"
    "                   (dtype, shape, partitioning, optimizer, slots). DIR is a\n"
    "                   ckpt-N directory or a directory of them (the latest).\n"
    "  records count|cat|verify [--compression none|gzip|auto] [--hex] FILE...\n"
    "                   Read TFRecord files, checking every CRC. count: print each\n"
    "                   file's record count and the total. cat: print each record\n"
    "                   on one line, non-printable bytes as \\xNN (--hex: all hex).\n"
    "                   verify: print 'FILE: OK, N records' or the damage found.\n"
    "                   --compression auto (the default) reads *.gz as GZIP.\n"
    "                   Exits 1 if any file is missing or damaged.\n"
    "\n"
    "The cluster token is read from CAPSTAN_TOKEN, else from --token-file or\n"
    "CAPSTAN_TOKEN_FILE; with none, capstanctl logs in to an open cluster.\n";

std::string format_uptime(double seconds) {
  long s = static_cast<long>(seconds);
  char buffer[64];
  if (s >= 86400) {
    std::snprintf(buffer, sizeof(buffer), "%ldd%02ldh", s / 86400, (s % 86400) / 3600);
  } else if (s >= 3600) {
    std::snprintf(buffer, sizeof(buffer), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%ldm%02lds", s / 60, s % 60);
  }
  return buffer;
}

int health(const std::vector<std::string>& addresses, const capstan::ClientOptions& options) {
  if (addresses.empty()) {
    std::cerr << "capstanctl health: give at least one host:port\n";
    return 2;
  }
  std::printf("%-22s %-16s %-5s %-8s %-9s %-6s %-8s %s\n", "ADDRESS", "ROLE", "TASK", "VERSION",
              "UPTIME", "READY", "PID", "GPUS");
  int failures = 0;
  for (const auto& address : addresses) {
    auto client = capstan::NodeClient::connect(address, options);
    capstan::Result<capstan::NodeInfo> info =
        client.ok() ? (*client)->info() : capstan::Result<capstan::NodeInfo>(client.status());
    if (!info.ok()) {
      ++failures;
      std::printf("%-22s ERROR %s\n", address.c_str(), info.status().to_string().c_str());
      continue;
    }
    std::string task = info->task_index >= 0 ? std::to_string(info->task_index) : "-";
    std::printf("%-22s %-16s %-5s %-8s %-9s %-6s %-8lld %d\n", address.c_str(), info->role.c_str(),
                task.c_str(), info->version.c_str(), format_uptime(info->uptime_seconds).c_str(),
                info->ready ? "yes" : "no", static_cast<long long>(info->pid), info->gpu_count);
  }
  return failures == 0 ? 0 : 1;
}

namespace io = capstan::data::io;

// The compression --compression names for `path`; auto means GZIP for *.gz.
std::optional<io::Compression> compression_for(const std::string& flag, const std::string& path) {
  if (flag == "auto") {
    bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
    return gz ? io::Compression::kGzip : io::Compression::kNone;
  }
  if (flag.empty()) return std::nullopt;  // "" is TF's name for none, but not a flag value
  return io::compression_from_name(flag);
}

// A record as one line: printable ASCII as is, '\' doubled, the rest \xNN.
void print_record(const std::string& record, bool hex) {
  static const char kHexDigits[] = "0123456789abcdef";
  std::string line;
  line.reserve(record.size() * (hex ? 2 : 1) + 1);
  for (char c : record) {
    auto byte = static_cast<unsigned char>(c);
    if (hex) {
      line += kHexDigits[byte >> 4];
      line += kHexDigits[byte & 0xf];
    } else if (byte == '\\') {
      line += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7f) {
      line += c;
    } else {
      line += "\\x";
      line += kHexDigits[byte >> 4];
      line += kHexDigits[byte & 0xf];
    }
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
}

// capstanctl checkpoint inspect PATH: what a checkpoint holds (PATH is a
// ckpt-N directory or a directory of checkpoints: its latest).
int checkpoint_command(const std::vector<std::string>& args) {
  if (args.size() != 2 || args[0] != "inspect") {
    std::cerr << "capstanctl checkpoint: usage: capstanctl checkpoint inspect DIR\n";
    return 2;
  }
  std::string path = args[1];
  if (!std::filesystem::exists(std::filesystem::path(path) / "manifest.json")) {
    auto latest = capstan::checkpoint::latest_checkpoint(path);
    if (!latest.ok()) {
      std::cerr << "capstanctl checkpoint inspect: " << latest.status().to_string() << "\n";
      return 1;
    }
    path = *latest;
  }
  auto reader = capstan::checkpoint::CheckpointReader::open(path);
  if (!reader.ok()) {
    std::cerr << "capstanctl checkpoint inspect: " << reader.status().to_string() << "\n";
    return 1;
  }
  std::cout << capstan::checkpoint::describe(**reader);
  return 0;
}

// Logs in to the daemon at `address` as `Interface` and runs `ask` with its
// client on a loop of its own; the exit code `ask` resolves to, or 1 with
// the error under `command`'s name.
template <typename Interface, typename Ask>
int ask_daemon(const std::string& command, const std::string& address, const capstan::ClientOptions& options,
               Ask ask) {
  capstan::async::LoopThread loop("capstanctl");
  capstan::rpc::ConnectOptions connect;
  connect.token = options.token;
  connect.client_name = "capstanctl";
  try {
    return loop.run_sync([&]() -> kj::Promise<int> {
      auto conn = kj::heap<capstan::rpc::Connection>(loop.io(), loop.timer(), address, connect);
      auto deadline = loop.timer().now() + options.connect_timeout.count() * kj::MILLISECONDS;
      return conn->service<Interface>(deadline)
          .then([&ask](typename Interface::Client client) -> kj::Promise<int> { return ask(kj::mv(client)); })
          .attach(kj::mv(conn));
    });
  } catch (const kj::Exception& e) {
    std::cerr << "capstanctl " << command << ": " << capstan::async::from_exception(e).to_string() << "\n";
    return 1;
  }
}

// capstanctl replicas COORDINATOR STRATEGY: do the replicas agree?
int replicas_command(const std::vector<std::string>& args, const capstan::ClientOptions& options) {
  if (args.size() != 2) {
    std::cerr << "capstanctl replicas: usage: capstanctl replicas COORDINATOR_ADDR STRATEGY\n";
    return 2;
  }
  const std::string address = args[0], strategy = args[1];
  return ask_daemon<capstan::wire::Coordinator>("replicas", address, options, [&strategy](capstan::wire::Coordinator::Client c) {
    auto request = c.strategyStatusRequest();
    request.setStrategy(strategy);
    return request.send().then([&strategy](capnp::Response<capstan::wire::Coordinator::StrategyStatusResults>&& r) {
      std::printf("strategy '%s': group epoch %lld, %lld step(s) run, %u replica(s)\n", strategy.c_str(),
                  static_cast<long long>(r.getEpoch()), static_cast<long long>(r.getSteps()), r.getReplicas().size());
      std::printf("%-5s %-8s %-5s %-10s %-18s %s\n", "RANK", "WORKER", "TASK", "STEP", "CHECKSUM", "");
      bool agree = r.getReplicas().size() > 0;
      for (auto replica : r.getReplicas()) {
        const auto& first = r.getReplicas()[0];
        std::string note;
        if (replica.getError().size() > 0) {
          note = replica.getError().cStr();
        } else if (!replica.getHolds()) {
          note = "holds no replica";
        } else if (replica.getChecksum() != first.getChecksum() || replica.getStep() != first.getStep()) {
          note = "differs from rank 0";
        }
        if (!note.empty()) agree = false;
        std::printf("%-5d %-8lld %-5d %-10lld %016llx   %s\n", replica.getRank(),
                    static_cast<long long>(replica.getWorkerId()), replica.getTaskIndex(),
                    static_cast<long long>(replica.getStep()), static_cast<unsigned long long>(replica.getChecksum()),
                    note.c_str());
      }
      std::printf("%s\n", agree ? "replicas identical" : "replicas DIFFER (or none answered)");
      return agree ? 0 : 1;
    });
  });
}

// capstanctl status COORDINATOR: each worker's runs, where their time went
// and its straggler score.
int status_command(const std::vector<std::string>& args, const capstan::ClientOptions& options) {
  if (args.size() != 1) {
    std::cerr << "capstanctl status: usage: capstanctl status COORDINATOR_ADDR\n";
    return 2;
  }
  return ask_daemon<capstan::wire::Coordinator>("status", args[0], options, [](capstan::wire::Coordinator::Client c) {
    return c.workerStatsRequest().send().then([](capnp::Response<capstan::wire::Coordinator::WorkerStatsResults>&& r) {
      std::printf("%-5s %-22s %-9s %-11s %-17s %s\n", "TASK", "ADDRESS", "RUNS", "BUSY S/RUN", "STRAGGLER SCORE",
                  "WHERE THE TIME WENT");
      for (auto w : r.getWorkers()) {
        char score[40] = "-";
        if (std::isfinite(w.getScore())) {
          std::snprintf(score, sizeof(score), "%.2f%s", w.getScore(), w.getStraggler() ? " SLOW" : "");
        }
        std::printf("%-5d %-22s %-9lld %-11.4f %-17s %s\n", w.getTaskIndex(),
                    w.getAddress().size() > 0 ? w.getAddress().cStr() : "-", static_cast<long long>(w.getRuns()),
                    w.getBusy(), score, capstan::format_phases(capstan::rpc::phases_from_wire(w)).c_str());
      }
      if (r.getWorkers().size() == 0) std::printf("(no worker registered)\n");
      std::printf("all workers: %s\n", capstan::format_phases(capstan::rpc::phases_from_wire(r.getTotals())).c_str());
      return 0;
    });
  });
}

// capstanctl trace: N seconds of the cluster as a Chrome trace.
int trace_command(const std::vector<std::string>& args, const capstan::ClientOptions& options, double seconds,
                  const std::string& out, long max_events) {
  if (args.empty()) {
    std::cerr << "capstanctl trace: usage: capstanctl trace [--seconds N] [--out FILE] COORDINATOR_ADDR [ADDR...]\n";
    return 2;
  }
  capstan::ClusterTraceOptions trace_options;
  trace_options.seconds = seconds;
  trace_options.max_events = max_events > 0 ? static_cast<size_t>(max_events) : 0;
  trace_options.extra_addresses.assign(args.begin() + 1, args.end());
  trace_options.client = options;
  std::fprintf(stderr, "capstanctl trace: recording %.1f s of the cluster...\n", seconds);
  auto trace = capstan::record_cluster_trace(args[0], trace_options);
  if (!trace.ok()) {
    std::cerr << "capstanctl trace: " << trace.status().to_string() << "\n";
    return trace.status().code() == capstan::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (capstan::Status written = trace->write(out); !written.ok()) {
    std::cerr << "capstanctl trace: " << written.to_string() << "\n";
    return 1;
  }
  std::printf("%s: %zu events from %d processes (%llu dropped past the bound)\n", out.c_str(), trace->events,
              trace->processes, static_cast<unsigned long long>(trace->dropped));
  for (const auto& e : trace->errors) std::printf("no trace from %s\n", e.c_str());
  return trace->errors.empty() ? 0 : 1;
}

// capstanctl dump: every daemon's flight records.
int dump_command(const std::vector<std::string>& args, const capstan::ClientOptions& options, long last) {
  if (args.empty()) {
    std::cerr << "capstanctl dump: usage: capstanctl dump [--last N] COORDINATOR_ADDR [ADDR...]\n";
    return 2;
  }
  if (last < 0) {
    std::cerr << "capstanctl dump: --last must be 0 or more, got " << last << "\n";
    return 2;
  }
  auto dump = capstan::dump_cluster(args[0], {args.begin() + 1, args.end()}, options, options.call_timeout,
                                    static_cast<size_t>(last));
  if (!dump.ok()) {
    std::cerr << "capstanctl dump: " << dump.status().to_string() << "\n";
    return 1;
  }
  std::fputs(dump->text.c_str(), stdout);
  for (const auto& u : dump->unanswered) std::printf("NO ANSWER: %s\n", u.c_str());
  return dump->unanswered.empty() ? 0 : 1;
}

// capstanctl data datasets|jobs|workers ADDR: the dispatcher's state.
int data_command(const std::vector<std::string>& args, const capstan::ClientOptions& options) {
  if (args.size() != 2 || (args[0] != "datasets" && args[0] != "jobs" && args[0] != "workers")) {
    std::cerr << "capstanctl data: usage: capstanctl data datasets|jobs|workers DISPATCHER_ADDR\n";
    return 2;
  }
  const std::string what = args[0];
  const std::string address = args[1];
  return ask_daemon<capstan::wire::DataDispatcher>(
      "data " + what, address, options, [&what](capstan::wire::DataDispatcher::Client d) -> kj::Promise<int> {
        if (what == "datasets") {
          return d.listDatasetsRequest().send().then([](auto&& r) {
            std::printf("%-12s %-18s %s\n", "DATASET", "FINGERPRINT", "BYTES");
            for (auto ds : r.getDatasets()) {
              std::printf("%-12s %016llx   %llu\n", ds.getDatasetId().cStr(),
                          static_cast<unsigned long long>(ds.getFingerprint()),
                          static_cast<unsigned long long>(ds.getBytes()));
            }
            return 0;
          });
        }
        if (what == "jobs") {
          return d.listJobsRequest().send().then([](auto&& r) {
            static const char* kModes[] = {"OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT"};
            std::printf("%-8s %-16s %-10s %-13s %-8s %-6s %s\n", "JOB", "NAME", "DATASET", "MODE", "CLIENTS",
                        "TASKS", "FINISHED");
            for (auto j : r.getJobs()) {
              std::printf("%-8lld %-16s %-10s %-13s %-8lld %-6lld %s\n", static_cast<long long>(j.getJobId()),
                          j.getJobName().size() ? j.getJobName().cStr() : "-", j.getDatasetId().cStr(),
                          kModes[static_cast<int>(j.getProcessingMode())], static_cast<long long>(j.getNumClients()),
                          static_cast<long long>(j.getNumTasks()), j.getFinished() ? "yes" : "no");
            }
            return 0;
          });
        }
        return d.listWorkersRequest().send().then([](auto&& r) {
          std::printf("%-24s %-6s %s\n", "WORKER", "TASKS", "LAST HEARTBEAT");
          for (auto w : r.getWorkers()) {
            std::printf("%-24s %-6lld %.1f s ago\n", w.getAddress().cStr(), static_cast<long long>(w.getNumTasks()),
                        w.getLastHeartbeatSecondsAgo());
          }
          return 0;
        });
      });
}

// capstanctl records count|cat|verify FILE...
int records(const std::vector<std::string>& args, const std::string& compression_flag,
            bool hex) {
  const std::string subcommand = args.empty() ? "" : args[0];
  if (subcommand != "count" && subcommand != "cat" && subcommand != "verify") {
    std::cerr << "capstanctl records: give count, cat or verify, then one or more files\n";
    return 2;
  }
  if (args.size() < 2) {
    std::cerr << "capstanctl records " << subcommand << ": give at least one file\n";
    return 2;
  }
  if (!compression_for(compression_flag, "")) {
    std::cerr << "capstanctl records: --compression must be none, gzip or auto, not '"
              << compression_flag << "'\n";
    return 2;
  }
  int failures = 0;
  uint64_t total = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& path = args[i];
    uint64_t count = 0;
    capstan::Status status;
    auto reader = io::TFRecordReader::open(path, *compression_for(compression_flag, path));
    const bool opened = reader.ok();
    if (reader.ok()) {
      std::string record;
      while (true) {
        auto more = (*reader)->read(&record);
        if (!more.ok()) {
          status = more.status();
          break;
        }
        if (!*more) break;
        ++count;
        if (subcommand == "cat") print_record(record, hex);
      }
    } else {
      status = reader.status();
    }
    if (!status.ok()) ++failures;
    if (subcommand == "verify") {
      if (status.ok()) {
        std::printf("%s: OK, %llu records\n", path.c_str(),
                    static_cast<unsigned long long>(count));
      } else if (opened) {
        std::printf("%s: FAILED after %llu good records: %s\n", path.c_str(),
                    static_cast<unsigned long long>(count), status.to_string().c_str());
      } else {
        std::printf("%s: FAILED: %s\n", path.c_str(), status.to_string().c_str());
      }
      continue;
    }
    if (!status.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "capstanctl records %s: %s\n", subcommand.c_str(),
                   status.to_string().c_str());
      continue;
    }
    if (subcommand == "count") {
      std::printf("%llu  %s\n", static_cast<unsigned long long>(count), path.c_str());
      total += count;  // of the files that read completely
    }
  }
  if (subcommand == "count") {
    std::printf("%llu  total\n", static_cast<unsigned long long>(total));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description flags("Options");
  flags.add_options()("help,h", "show this help")(
      "token-file", po::value<std::string>(), "file holding the cluster token")(
      "timeout-ms", po::value<long>()->default_value(5000),
      "how long to keep trying to reach each daemon")(
      "compression", po::value<std::string>()->default_value("auto"),
      "records: none, gzip, or auto (GZIP for *.gz)")(
      "hex", po::bool_switch(), "records cat: print each record as hex")(
      "seconds", po::value<double>()->default_value(5), "trace: seconds to record")(
      "out", po::value<std::string>()->default_value("trace.json"), "trace: the file to write")(
      "max-events", po::value<long>()->default_value(200000), "trace: events kept per process")(
      "last", po::value<long>()->default_value(50), "dump: records shown per daemon")(
      "command", po::value<std::string>(), "")("args", po::value<std::vector<std::string>>(), "");
  po::positional_options_description positional;
  positional.add("command", 1).add("args", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(flags).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "capstanctl: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  if (vm.count("help") || !vm.count("command")) {
    std::cout << kUsage;
    return vm.count("help") ? 0 : 2;
  }
  std::string command = vm["command"].as<std::string>();
  std::vector<std::string> args =
      vm.count("args") ? vm["args"].as<std::vector<std::string>>() : std::vector<std::string>{};
  // Local file commands need no cluster token.
  if (command == "checkpoint") return checkpoint_command(args);
  if (command == "records") {
    return records(args, vm["compression"].as<std::string>(), vm["hex"].as<bool>());
  }

  capstan::ClientOptions options;
  options.client_name = "capstanctl";
  long timeout = vm["timeout-ms"].as<long>();
  if (timeout <= 0) {
    std::cerr << "capstanctl: --timeout-ms must be positive, got " << timeout << "\n";
    return 2;
  }
  options.connect_timeout = std::chrono::milliseconds(timeout);
  options.call_timeout = std::chrono::milliseconds(timeout);
  auto token = vm.count("token-file") ? capstan::read_token_file(vm["token-file"].as<std::string>())
                                      : capstan::token_from_environment();
  if (!token.ok()) {
    std::cerr << "capstanctl: " << token.status().message() << "\n";
    return 2;
  }
  options.token = *token;

  if (command == "health") return health(args, options);
  if (command == "data") return data_command(args, options);
  if (command == "replicas") return replicas_command(args, options);
  if (command == "status") return status_command(args, options);
  if (command == "trace") {
    return trace_command(args, options, vm["seconds"].as<double>(), vm["out"].as<std::string>(),
                         vm["max-events"].as<long>());
  }
  if (command == "dump") return dump_command(args, options, vm["last"].as<long>());
  std::cerr << "capstanctl: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
