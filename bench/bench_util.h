// What the benchmark programs share: their command line (FlagParser, as the
// example programs read theirs), a wall clock, this run's scratch directory,
// daemons started from the directory of the bench binary (on free ports,
// stopped together), the CPU time of a process and the raw loopback TCP
// figure the transfers are measured against.
#ifndef CAPSTAN_BENCH_BENCH_UTIL_H_
#define CAPSTAN_BENCH_BENCH_UTIL_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "common/flag_parser.h"

namespace capstan::bench {

using ::capstan::examples::FlagParser;

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A field of /proc/<pid>/status in KiB ("VmRSS": resident now, "VmHWM":
// its peak); 0 when the process or the field is gone.
inline int64_t proc_status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return 0;
}

// A free TCP port on 127.0.0.1 (bound and released), for a daemon that must
// come back on the same address; 0 when none could be had.
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The directory of the running bench binary (where the daemons are built).
inline std::string bin_dir() { return std::filesystem::canonical("/proc/self/exe").parent_path().string(); }

// This run's scratch directory, TMP/<bench binary name>.<pid>; made on the
// first call.
inline const std::string& run_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             (std::filesystem::canonical("/proc/self/exe").filename().string() + "." + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

// CPU seconds (user + system; `system_only`: system) a process has used;
// /proc/<pid>/stat (0: this process).
inline double cpu_seconds(pid_t pid, bool system_only = false) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/stat") : "/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  // Fields 3.. follow the command name; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 15 || (i == 14 && !system_only)) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Bytes a process has written so far, sockets included (/proc/<pid>/io
// wchar; 0: this process). 0 when it cannot be read.
inline double bytes_written(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/io") : "/proc/" + std::to_string(pid) + "/io");
  std::string key;
  double value = 0;
  while (in >> key >> value) {
    if (key == "wchar:") return value;
  }
  return 0;
}

struct Daemon {
  pid_t pid = 0;
  std::string address;
  std::string program;
};

// The positive numbers of a comma-separated list ("1,2,4"); others are
// dropped.
inline std::vector<int> positive_counts(const std::string& list) {
  std::vector<int> out;
  for (size_t pos = 0; pos < list.size();) {
    size_t comma = std::min(list.find(',', pos), list.size());
    int n = std::stoi(list.substr(pos, comma - pos));
    if (n > 0) out.push_back(n);
    pos = comma + 1;
  }
  return out;
}

// The HTTP port in a daemon's port file (start()'s RUN_DIR/<label>.port); 0
// when it has none.
inline int http_port_of(const std::string& label) {
  std::ifstream in(run_dir() + "/" + label + ".port");
  std::string key, value;
  while (in >> key >> value) {
    if (key == "http_port:") return std::stoi(value);
  }
  return 0;
}

// "4b", "64kib", "16mib": a size as the RESULT names of the benches and
// their peers spell it.
inline std::string size_name(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "mib";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "kib";
  return std::to_string(bytes) + "b";
}

// The middle value (the upper one of an even count); 0 for none.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The whole text of `path` ("" when it cannot be read).
inline std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Starts `command` (an absolute program path, then its arguments) with its
// stdout written to `log`; its pid.
inline pid_t spawn(const std::vector<std::string>& command, const std::string& log) {
  std::fflush(stdout);  // else the child's copy of the buffer is printed again
  pid_t pid = fork();
  if (pid == 0) {
    if (freopen(log.c_str(), "w", stdout) == nullptr) _exit(127);
    std::vector<char*> argv;
    for (auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// spawn(), then waits for it: its exit code (-1 when killed).
inline int run_program(const std::vector<std::string>& command, const std::string& log) {
  int status = 0;
  waitpid(spawn(command, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The daemons started so far and not stopped, in the order they started.
inline std::vector<Daemon>& daemons() {
  static std::vector<Daemon> running;
  return running;
}

// Stops every daemon (SIGTERM, then waits for each), last started first.
inline void stop_all() {
  auto& running = daemons();
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (it->pid > 0) waitpid(it->pid, nullptr, 0);
  }
  running.clear();
}

// kill -9 the started daemon `pid` and waits for it; stop_all() then skips it.
inline void kill9(pid_t pid) {
  for (auto& d : daemons()) {
    if (d.pid == pid) {
      kill(d.pid, SIGKILL);
      waitpid(d.pid, nullptr, 0);
      d.pid = 0;
    }
  }
}

// Starts `program` from `bin_dir` with --port 0, --http-port 0 and a port
// file; returns its address once it listens. Its port file and log are
// RUN_DIR/<label>.port and .log. When it does not start: stops the others and
// exits 1.
// `port`: a fixed RPC port instead (a restart on the same address).
// `prefix`: a command that runs the program (e.g. {"ip", "netns", "exec",
// NAME}), looked up in PATH.
inline Daemon start(const std::string& bin_dir, const std::string& program, const std::string& label,
                    std::vector<std::string> args, int port = 0, std::vector<std::string> prefix = {}) {
  std::string port_file = run_dir() + "/" + label + ".port";
  std::string log = run_dir() + "/" + label + ".log";
  std::filesystem::remove(port_file);
  args.insert(args.begin(), {"--port", std::to_string(port), "--http-port", "0", "--port-file", port_file});
  std::vector<std::string> command = std::move(prefix);
  command.push_back(bin_dir + "/" + program);
  command.insert(command.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    if (freopen(log.c_str(), "w", stderr) == nullptr) _exit(127);
    std::vector<char*> argv;
    for (auto& a : command) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 400; ++i) {
    std::ifstream in(port_file);
    std::string key, value;
    while (in >> key >> value) {
      if (key == "address:") {
        daemons().push_back({pid, value, program});
        return daemons().back();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  std::fprintf(stderr, "%s did not start; see %s\n", program.c_str(), log.c_str());
  stop_all();
  std::exit(1);
}

// The same, labelled <n>-<program> for the n-th daemon started this way.
inline Daemon start(const std::string& bin_dir, const std::string& program, std::vector<std::string> args) {
  static int started = 0;
  return start(bin_dir, program, std::to_string(++started) + "-" + program, std::move(args));
}

// The machine-readable figures of this run, one line each,
// "RESULT <workload> <value> <unit>": result() keeps one, print_results()
// prints them after the human text (bench/compare reads these lines; the
// TensorFlow peers in bench/peers print the same names for the same
// workloads).
inline std::vector<std::string>& results() {
  static std::vector<std::string> lines;
  return lines;
}

inline void result(const std::string& workload, double value, const char* unit) {
  char text[64];
  std::snprintf(text, sizeof(text), " %.6g ", value);
  results().push_back("RESULT " + workload + text + unit);
}

inline void print_results() {
  if (results().empty()) return;
  std::printf("\n");
  for (const auto& line : results()) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Prints "WHAT: STATUS", stops the daemons and exits 1.
[[noreturn]] inline void fail(const std::string& what, const Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.to_string().c_str());
  stop_all();
  std::exit(1);
}

// Ranks as processes: fork_ranks runs body(rank) in `ranks` forked
// children (each exits with what body returns) and returns their pids;
// wait_ranks waits for them all and returns how many failed (a non-zero
// exit, or a signal, which it names after `program`). A caller closes what
// the children took over (their endpoints) between the two.
template <typename Body>
std::vector<pid_t> fork_ranks(int ranks, Body body) {
  std::fflush(stdout);  // or each child prints what is buffered again
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(body(r));
    children.push_back(pid);
  }
  return children;
}

inline int wait_ranks(const std::vector<pid_t>& children, const char* program) {
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      if (WIFSIGNALED(status)) std::fprintf(stderr, "%s: a rank died of signal %d\n", program, WTERMSIG(status));
    }
  }
  return failed;
}

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_BENCH_UTIL_H_
