#include "tests/harness/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

// Listeners need the reporter interfaces, which Catch2 hides by default.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "daemons/common/http_server.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

// Live clusters, so a failing assertion can print their logs.
std::mutex g_live_mutex;
std::set<const TestCluster*> g_live;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// fork + exec with output to `log_path`; the child dies with the test.
pid_t spawn(const std::string& path, const std::vector<std::string>& args, const Env& env,
            const std::string& log_path) {
  std::vector<std::string> argv_storage{path};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Prints the logs of every live cluster when an assertion fails.
struct LogDumpListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    if (!stats.assertionResult.isOk()) {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      for (const auto* cluster : g_live) cluster->dump_logs();
    }
    return true;
  }
};
CATCH_REGISTER_LISTENER(LogDumpListener)

}  // namespace

std::string bin_dir() {
  const char* dir = std::getenv("CAPSTAN_BIN_DIR");
  if (dir == nullptr || *dir == '\0') {
    throw std::runtime_error("CAPSTAN_BIN_DIR is not set (run the tests through ctest)");
  }
  return dir;
}

uint16_t free_port() {
  // Picked below the kernel's ephemeral range (ip_local_port_range), so no
  // outgoing connection, from this test or one running beside it, can take
  // the port between this pick and the daemon's bind, and a client retrying
  // a daemon that is down cannot connect to itself on it (TCP simultaneous
  // open). Random within the range below, checked by binding it.
  int low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int first = 0, last = 0;
    if (range >> first >> last && first > 0) low = first;
  }
  auto bindable = [](uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    socklen_t len = sizeof(addr);
    if (ok && port == 0) ok = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    if (fd >= 0) close(fd);
    return ok ? ntohs(addr.sin_port) : uint16_t{0};
  };
  const int below_low = std::max(1024, low - 12000);
  if (low - 1 > below_low) {
    static std::mt19937 random(std::random_device{}() ^ static_cast<unsigned>(getpid()));
    std::uniform_int_distribution<int> pick(below_low, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (uint16_t port = bindable(static_cast<uint16_t>(pick(random))); port != 0) return port;
    }
  }
  return bindable(0);  // the kernel's choice, as a last resort
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

Daemon::Daemon(std::string name, pid_t pid, std::string log_path, std::string port_file)
    : name_(std::move(name)), pid_(pid), log_path_(std::move(log_path)),
      port_file_(std::move(port_file)) {}

Daemon::~Daemon() { kill_now(); }

std::string Daemon::log() const { return read_file(log_path_); }

bool Daemon::read_ports(std::chrono::milliseconds timeout) {
  return wait_until(
      [this]() {
        std::ifstream in(port_file_);
        std::string key;
        int value = 0;
        while (in >> key) {
          if (key == "rpc_port:") in >> value, rpc_port_ = static_cast<uint16_t>(value);
          else if (key == "http_port:") in >> value, http_port_ = static_cast<uint16_t>(value);
          else in >> key;
        }
        return rpc_port_ != 0 && http_port_ != 0;
      },
      timeout);
}

std::pair<int, std::string> Daemon::http_get(const std::string& path) const {
  auto result = daemon::http_get("127.0.0.1", http_port_, path, 2000ms);
  return {result.status, result.body};
}

double metric(const Daemon& daemon, const std::string& name) {
  std::istringstream lines(daemon.http_get("/metrics").second);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return 0;
}

bool Daemon::reap(bool block) {
  if (exited_) return true;
  int status = 0;
  pid_t r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = status;
  }
  return exited_;
}

bool Daemon::running() { return !reap(false); }

std::optional<int> Daemon::stop(int sig, std::chrono::milliseconds timeout) {
  if (!reap(false)) ::kill(pid_, sig);
  if (!wait_until([this]() { return reap(false); }, timeout)) {
    kill_now();
    return std::nullopt;
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  return std::nullopt;
}

void Daemon::kill_now() {
  if (reap(false)) return;
  ::kill(pid_, SIGKILL);
  reap(true);
}

TestCluster::TestCluster() {
  std::string pattern = (std::filesystem::temp_directory_path() / "capstan-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  std::lock_guard<std::mutex> lock(g_live_mutex);
  g_live.insert(this);
}

TestCluster::~TestCluster() {
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    g_live.erase(this);
  }
  daemons_.clear();  // kills
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string TestCluster::write_file(const std::string& name, const std::string& content) const {
  std::string path = dir_ + "/" + name;
  std::ofstream(path) << content;
  return path;
}

Daemon& TestCluster::start(const std::string& program, std::vector<std::string> args,
                           const Env& env, bool wait_healthy, bool pick_port) {
  std::string name = program + "-" + std::to_string(counter_++);
  std::string log_path = dir_ + "/" + name + ".log";
  std::string port_file = dir_ + "/" + name + ".port";
  bool has_port = false;
  for (const auto& a : args) has_port = has_port || a == "--port" || a.rfind("--port=", 0) == 0;
  if (!has_port && pick_port) args.insert(args.end(), {"--port", "0"});
  args.insert(args.end(), {"--http-port", "0", "--port-file", port_file});
  pid_t pid = spawn(bin_dir() + "/" + program, args, env, log_path);
  daemons_.push_back(std::make_unique<Daemon>(name, pid, log_path, port_file));
  Daemon& daemon = *daemons_.back();
  if (wait_healthy) {
    REQUIRE(daemon.read_ports(15s));
    REQUIRE(wait_until([&daemon]() { return daemon.http_get("/healthz").first == 200; }, 15s));
  }
  return daemon;
}

Daemon& TestCluster::restart_on_port(const std::string& program, const std::vector<std::string>& args) {
  for (int attempt = 1;; ++attempt) {
    Daemon& daemon = start(program, args, {}, /*wait_healthy=*/false);
    wait_until([&daemon]() { return daemon.read_ports(0ms) || !daemon.running(); }, 15s);
    if (daemon.read_ports(0ms)) {
      REQUIRE(wait_until([&daemon]() { return daemon.http_get("/healthz").first == 200; }, 15s));
      return daemon;
    }
    INFO(daemon.log());
    REQUIRE(daemon.log().find("address already in use") != std::string::npos);
    REQUIRE(attempt < 20);
    std::this_thread::sleep_for(100ms);
  }
}

RunResult TestCluster::run(const std::string& program, const std::vector<std::string>& args,
                           const Env& env, std::chrono::milliseconds timeout) const {
  static int run_counter = 0;
  std::string out_path = dir_ + "/run-" + std::to_string(run_counter++) + ".out";
  std::string path = program.find('/') != std::string::npos ? program : bin_dir() + "/" + program;
  pid_t pid = spawn(path, args, env, out_path);
  RunResult result;
  int status = 0;
  bool done = wait_until([&]() { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  if (!done) {
    ::kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  result.output = read_file(out_path);
  return result;
}

void TestCluster::dump_logs() const {
  for (const auto& daemon : daemons_) {
    std::cerr << "----- log of " << daemon->name() << " (pid " << daemon->pid() << ") -----\n"
              << daemon->log() << "----- end of " << daemon->name() << " -----\n";
  }
}

}  // namespace capstan::testing
