// Configuration for every Capstan daemon (ps-server, worker-server,
// coordinator, data-dispatcher, data-worker).
//
// Each daemon declares its keys once, as a table of OptionSpec, and calls
// parse_config() from main(). A key gets its value from these sources, lowest
// to highest precedence:
//
//   default  <  YAML file (--config FILE or CAPSTAN_CONFIG)
//            <  environment CAPSTAN_<KEY>  <  command-line flag --<key>
//
// The key "http_port" is "http_port:" in the file, CAPSTAN_HTTP_PORT in the
// environment and --http-port on the command line. Every source is text
// checked against the key's type and, for an integer, its range, so a bad
// value is reported the same way wherever it came from, naming the source
// and the value.
//
// The cluster layout follows TensorFlow's TF_CONFIG: the file may hold
// "cluster:" and "task:" entries, and the TF_CONFIG environment variable
// (JSON) overrides them. Job names are normalized to Capstan's roles, so
// "chief" and "coordinator" are the same job.
//
// Example:
//   const std::vector<OptionSpec> kSpecs = {
//       OptionSpec{"http_port", OptionType::kInt, "port for /healthz", "8080"}
//           .in_range(0, 65535),
//       {"dispatcher", OptionType::kString, "dispatcher address", {}, true},
//   };
//   ParseResult r = parse_config("data-worker", "Serves dataset elements.",
//                                kSpecs, argc, argv, current_environment());
//   if (r.action == ParseResult::Action::kError) {
//     std::cerr << "data-worker: " << r.text << "\n";
//     return 2;
//   }
//   if (r.action != ParseResult::Action::kRun) {
//     std::cout << r.text;
//     return 0;
//   }
//   int64_t port = r.config.get_int("http_port");
//
// The library never prints and never exits; main() decides both.

#ifndef CAPSTAN_DAEMONS_COMMON_CONFIG_H_
#define CAPSTAN_DAEMONS_COMMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capstan::daemon {

enum class OptionType { kString, kInt, kBool, kDouble, kStringList };

struct OptionSpec {
  std::string key;  // snake_case, e.g. "http_port"
  OptionType type;
  std::string help;
  // Textual, parsed like any other source. A default that does not parse as
  // `type` is a programming error: parse_config throws std::logic_error.
  std::optional<std::string> default_value;
  bool required = false;
  // kInt only: the values allowed, both ends included. A value outside them,
  // from any source, is a configuration error naming the source, the value
  // and the range, so a daemon never starts with it; --help shows the range.
  // A range on another type, min > max, or a default outside the range is a
  // programming error (std::logic_error).
  std::optional<int64_t> min = std::nullopt;
  std::optional<int64_t> max = std::nullopt;

  // For spec tables: OptionSpec{"threads", OptionType::kInt, "...", "0"}.at_least(0).
  OptionSpec in_range(int64_t lo, int64_t hi) && {
    min = lo;
    max = hi;
    return std::move(*this);
  }
  OptionSpec at_least(int64_t lo) && {
    min = lo;
    return std::move(*this);
  }
};

// TF_CONFIG-style cluster spec:
//   {"cluster": {"chief": ["h:p"], "ps": [...], "worker": [...]},
//    "task": {"type": "ps", "index": 0}}
// Job names and the task type are stored normalized (see normalize_role).
struct ClusterSpec {
  std::map<std::string, std::vector<std::string>> jobs;
  std::string task_type;  // empty when not given
  int task_index = -1;    // -1 when not given

  // True when neither a cluster nor a task was given.
  bool empty() const;
  // `role` is normalized first, so addresses("chief") finds the coordinator.
  // Returns an empty vector when the job is absent.
  const std::vector<std::string>& addresses(std::string_view role) const;
  // This task's own address, when type and index are given and the cluster
  // lists it.
  std::optional<std::string> task_address() const;
};

// "chief"|"coordinator" -> "coordinator"; "ps" -> "ps"; "worker" -> "worker";
// "dispatcher"|"data_dispatcher"|"data-dispatcher" -> "data_dispatcher";
// "data_worker"|"data-worker" -> "data_worker"; anything else (e.g.
// "evaluator") is returned unchanged.
std::string normalize_role(std::string_view job_name);

class ConfigLoader;  // config.cc: fills a Config from its sources.

// The effective configuration of one daemon: every declared key with its
// value (if any) and the source that set it.
//
// Asking for an undeclared key, for a key as the wrong type, or for a scalar
// key that has no value (check has() first) is a programming error and
// throws std::logic_error. get_list() on an unset list returns an empty list.
//
// Config is not thread-safe; build it in main() and pass it down as const.
class Config {
 public:
  Config() = default;

  // True when any source, the default included, gave a value.
  bool has(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  double get_double(std::string_view key) const;
  const std::vector<std::string>& get_list(std::string_view key) const;
  // "flag", "env", "file", "default", "set" (from set()), or "" when unset.
  std::string_view source(std::string_view key) const;
  const ClusterSpec& cluster() const;

  // Overrides a key after parsing, e.g. a port taken from the cluster spec.
  // The value is checked against the key's type and range like any other
  // source (lists are comma-separated); a bad value throws
  // std::invalid_argument naming the key and the value. An undeclared key
  // throws std::logic_error.
  void set(std::string key, std::string value);

 private:
  friend class ConfigLoader;

  struct Value {
    OptionType type = OptionType::kString;
    std::string source;  // empty while unset
    std::string string_value;
    int64_t int_value = 0;
    bool bool_value = false;
    double double_value = 0;
    std::vector<std::string> list_value;
    std::optional<int64_t> min;  // from the OptionSpec; kInt only
    std::optional<int64_t> max;
  };

  const Value& find(std::string_view key, OptionType type) const;

  std::map<std::string, Value, std::less<>> values_;
  ClusterSpec cluster_;
};

struct ParseResult {
  enum class Action { kRun, kHelp, kVersion, kError };
  Action action = Action::kError;
  Config config;     // valid when kRun
  // kRun: things worth a log line that are not errors (e.g. a CAPSTAN_*
  // variable that names no key).
  std::vector<std::string> warnings;
  std::string text;  // kHelp/kVersion: text to print; kError: one line
                     // naming the key or file and what is wrong
};

// Builds the configuration from `specs` and the sources above. `env` is the
// process environment (see current_environment(); tests pass their own),
// `program` the daemon's name, e.g. "ps-server", and `description` one
// paragraph shown in --help. Built-in flags: --help/-h, --version,
// --config FILE.
//
// Throws std::logic_error for a bad `specs` table (duplicate or reserved key,
// key not snake_case, default of the wrong type); every problem with the
// user's input is reported as Action::kError instead.
ParseResult parse_config(std::string_view program,
                         std::string_view description,
                         const std::vector<OptionSpec>& specs, int argc,
                         const char* const* argv,
                         const std::map<std::string, std::string>& env);

// The process environment, read from ::environ.
std::map<std::string, std::string> current_environment();

}  // namespace capstan::daemon

#endif  // CAPSTAN_DAEMONS_COMMON_CONFIG_H_
