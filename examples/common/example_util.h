// What the example programs share: reading their flags (flag_parser.h),
// connecting to the cluster and waiting for its workers, and their
// TensorBoard logs (--logdir).
#ifndef CAPSTAN_EXAMPLES_COMMON_EXAMPLE_UTIL_H_
#define CAPSTAN_EXAMPLES_COMMON_EXAMPLE_UTIL_H_

#include <capstan/summary.h>
#include <capstan/training.h>

#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "common/flag_parser.h"

namespace capstan::examples {

// Connects to the coordinator at `address` with the cluster token from
// CAPSTAN_TOKEN / CAPSTAN_TOKEN_FILE (left in `options.token` for other
// clients of the program), then waits up to 30 s for `min_workers` workers:
// they register with the coordinator shortly after they start. On failure
// returns null after reporting why: through `fail(what, status)` for the
// token and the connection, as "CLIENT_NAME: fewer than N worker(s) ..." on
// stderr for the workers.
inline std::unique_ptr<ClusterCoordinator> connect_cluster(const std::string& address, int min_workers,
                                                           ClientOptions& options,
                                                           int (*fail)(const std::string& what, const Status& status)) {
  auto token = token_from_environment();
  if (!token.ok()) {
    fail("cluster token", token.status());
    return nullptr;
  }
  options.token = *token;
  auto connected = ClusterCoordinator::connect(address, options);
  if (!connected.ok()) {
    fail("connecting to the coordinator at " + address, connected.status());
    return nullptr;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*connected)->num_workers() < min_workers) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: fewer than %d worker(s) registered with the coordinator within 30 s\n",
                   options.client_name.c_str(), min_workers);
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::move(*connected);
}

// --logdir: a SummaryWriter for TensorBoard event files in `logdir` (made
// if missing), after printing where they go as "PROGRAM: TensorBoard events
// in PATH"; null, and nothing printed, when `logdir` is empty (no --logdir).
inline Result<std::unique_ptr<SummaryWriter>> open_summaries(const std::string& logdir, const char* program) {
  if (logdir.empty()) return std::unique_ptr<SummaryWriter>();
  auto writer = SummaryWriter::create(logdir);
  if (!writer.ok()) return writer.status().with_context("--logdir " + logdir);
  std::printf("%s: TensorBoard events in %s (see them: tensorboard --logdir %s)\n", program,
              (*writer)->path().c_str(), logdir.c_str());
  return writer;
}

// Writes each (tag, value) at `step` (tf.summary.scalar), when there is a
// `writer`.
inline Status write_scalars(SummaryWriter* writer, int64_t step,
                            std::initializer_list<std::pair<const char*, double>> scalars) {
  if (writer == nullptr) return Status::Ok();
  for (const auto& [tag, value] : scalars) CAPSTAN_RETURN_IF_ERROR(writer->scalar(tag, value, step));
  return Status::Ok();
}

}  // namespace capstan::examples

#endif  // CAPSTAN_EXAMPLES_COMMON_EXAMPLE_UTIL_H_
