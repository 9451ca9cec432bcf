// NodeClient: a blocking client for any Capstan daemon.
//
// It logs in through the daemon's gate with the cluster token, reconnects
// with backoff when the link breaks, and bounds every call by a deadline.
// capstanctl is built on it; training programs use the role-specific clients
// built the same way.
//
// Example:
//   capstan::ClientOptions options;
//   options.token = capstan::token_from_environment().value();
//   auto client = capstan::NodeClient::connect("127.0.0.1:7000", options);
//   if (!client.ok()) { ... client.status() ... }
//   auto info = (*client)->info();   // role, version, uptime, ...
//
// Thread-safety: a NodeClient may be used from several threads; calls are
// serialized onto its own I/O thread.
#ifndef CAPSTAN_CLIENT_H_
#define CAPSTAN_CLIENT_H_

#include "capstan/export.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/trace.h"

namespace capstan CAPSTAN_API {

struct ClientOptions {
  std::string token;               // the cluster token; "" for an open cluster
  std::string client_name = "sdk";  // shown in the daemon's log
  // How long connect() (and a call after the link broke) keeps retrying.
  std::chrono::milliseconds connect_timeout{10000};
  // Deadline of each call.
  std::chrono::milliseconds call_timeout{60000};
  // Largest message payload accepted from the daemon (reader traversal limit,
  // plus 64 KiB of framing): a tensor up to this size arrives in one message.
  uint64_t max_message_bytes = 64ull << 20;
};

// The cluster token from CAPSTAN_TOKEN, or else from the file named by
// CAPSTAN_TOKEN_FILE; "" when neither is set. Errors name the file.
Result<std::string> token_from_environment();
// The token in `path` with surrounding whitespace removed.
Result<std::string> read_token_file(const std::string& path);

struct NodeInfo {
  std::string role;  // "coordinator", "ps", "worker", "data_dispatcher", "data_worker"
  int task_index = -1;
  std::string version;
  double uptime_seconds = 0;
  std::string rpc_address;
  uint16_t http_port = 0;
  int64_t pid = 0;
  bool ready = false;
  int gpu_count = 0;
};

class NodeClient {
 public:
  // Connects and logs in, retrying until options.connect_timeout.
  static Result<std::unique_ptr<NodeClient>> connect(const std::string& address,
                                                     ClientOptions options);
  ~NodeClient();

  Result<NodeInfo> info();
  // Sends `element` and receives it back (diagnostics; any size).
  Result<Element> echo(const Element& element);
  // Sends `element`; the daemon answers with its size in bytes.
  Result<uint64_t> discard(const Element& element);

  // How far the daemon's trace clock (capstan/trace.h) is ahead of this
  // process's: the offset at the fastest of `rounds` round trips, and that
  // round trip (the offset's error is at most half of it).
  struct ClockOffset {
    int64_t offset_ns = 0;
    int64_t round_trip_ns = 0;
  };
  Result<ClockOffset> clock_offset(int rounds = 5);
  // The daemon records `seconds` of spans (at most `max_events`) and
  // answers them; the call's deadline is `seconds` beyond call_timeout.
  Result<trace::TraceCapture> trace(double seconds, size_t max_events);
  // The daemon's flight records, oldest first, and its clock when it read them.
  struct Flight {
    std::vector<trace::FlightRecord> records;
    int64_t now_ns = 0;
    size_t capacity = 0;
  };
  Result<Flight> flight();

 private:
  struct CAPSTAN_HIDDEN Impl;
  explicit NodeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The version of the SDK ("0.1.0").
const char* version();

}  // namespace capstan

#endif  // CAPSTAN_CLIENT_H_
