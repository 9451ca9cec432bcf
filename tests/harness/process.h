// Test harness: starts Capstan's real executables on loopback and always
// cleans them up.
//
//   TestCluster cluster;                       // temp dir for logs and files
//   auto& ps = cluster.start("ps-server");     // --port 0 --http-port 0, waits for /healthz
//   auto& worker = cluster.start("worker-server", {"--coordinator", coord.address()});
//   RunResult r = cluster.run("capstanctl", {"health", ps.address()});
//
// Every process is killed when the TestCluster goes away (also when an
// assertion throws), and dies with the test process (PR_SET_PDEATHSIG). When
// a test fails, the logs of every live cluster's daemons are printed.
//
// Executables are found in $CAPSTAN_BIN_DIR (set by CTest).
#ifndef CAPSTAN_TESTS_HARNESS_PROCESS_H_
#define CAPSTAN_TESTS_HARNESS_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <functional>
#include <vector>

namespace capstan::testing {

using Env = std::map<std::string, std::string>;

// The directory holding the executables ($CAPSTAN_BIN_DIR).
std::string bin_dir();
// A free TCP port on 127.0.0.1 below the kernel's ephemeral range (bound and
// released; see process.cc for why below).
uint16_t free_port();
// Polls `condition` every 20 ms until it holds or `timeout` passes.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  std::string output;  // stdout and stderr together
};

class Daemon {
 public:
  Daemon(std::string name, pid_t pid, std::string log_path, std::string port_file);
  ~Daemon();  // kills the process if still running

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  uint16_t rpc_port() const { return rpc_port_; }
  uint16_t http_port() const { return http_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(rpc_port_); }
  std::string log() const;  // the log so far

  // Reads the port file (waiting up to `timeout`); false if it never came.
  bool read_ports(std::chrono::milliseconds timeout);
  // GET on the daemon's HTTP port: {status, body}; status 0 when no answer.
  std::pair<int, std::string> http_get(const std::string& path) const;
  bool running();
  // Sends `sig` and waits up to `timeout`; the exit code, or nullopt if it
  // did not exit in time (it is then SIGKILLed) or died from a signal.
  std::optional<int> stop(int sig, std::chrono::milliseconds timeout);
  void kill_now();  // SIGKILL and reap

 private:
  bool reap(bool block);

  const std::string name_;
  const pid_t pid_;
  const std::string log_path_;
  const std::string port_file_;
  uint16_t rpc_port_ = 0;
  uint16_t http_port_ = 0;
  bool exited_ = false;
  int status_ = 0;  // waitpid status once exited_
};

// An unlabelled series of the daemon's /metrics ("name value"): its value,
// 0 when absent or when the daemon does not answer.
double metric(const Daemon& daemon, const std::string& name);

class TestCluster {
 public:
  TestCluster();
  ~TestCluster();  // kills every daemon, removes the temp dir
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  const std::string& dir() const { return dir_; }
  // Writes `content` to dir()/name and returns the path.
  std::string write_file(const std::string& name, const std::string& content) const;

  // Starts `program` with `args` plus --http-port 0 --port-file and, when
  // `pick_port` and `args` has no --port, --port 0; waits for /healthz when
  // `wait_healthy`. Fails the test (REQUIRE) if it does not come up.
  Daemon& start(const std::string& program, std::vector<std::string> args = {},
                const Env& env = {}, bool wait_healthy = true, bool pick_port = true);
  // Starts a daemon again on the fixed --port in `args` (a restart). A client
  // retrying the dead daemon can hold that port for an instant (TCP
  // simultaneous open, which rpc::Connection drops at once), so a start
  // that exits with "address already in use" is tried again, up to 20 times.
  Daemon& restart_on_port(const std::string& program, const std::vector<std::string>& args);
  // Runs `program` to completion (killed after `timeout`).
  RunResult run(const std::string& program, const std::vector<std::string>& args,
                const Env& env = {},
                std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // Prints every daemon's log (called on test failure).
  void dump_logs() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  int counter_ = 0;
};

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_HARNESS_PROCESS_H_
