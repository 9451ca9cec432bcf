#include "daemons/common/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <boost/program_options.hpp>
#include <yaml-cpp/yaml.h>

#include "checkpoint/json.h"

// glibc declares it only under _GNU_SOURCE; redeclaring is harmless.
extern char** environ;

// The build may stamp the release; a bare compile says "dev".
#ifndef CAPSTAN_VERSION
#define CAPSTAN_VERSION "dev"
#endif

namespace capstan::daemon {

namespace po = boost::program_options;

namespace {

constexpr std::string_view kEnvPrefix = "CAPSTAN_";

// Set by the tooling around the daemons (launcher, auth, log shipping) rather
// than by a key, so they may appear in any daemon's environment.
constexpr std::array<std::string_view, 4> kReservedEnv = {
    "CAPSTAN_TOKEN", "CAPSTAN_CONFIG", "CAPSTAN_BIN_DIR", "CAPSTAN_LOG_DIR"};

// Taken by the built-in flags and by the file's cluster entries.
constexpr std::array<std::string_view, 5> kReservedKeys = {
    "help", "version", "config", "cluster", "task"};

constexpr std::string_view kTfConfig = "TF_CONFIG";

// The long flag name, without dashes: "http_port" -> "http-port".
std::string flag_name(std::string_view key) {
  std::string name(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string flag(std::string_view key) { return "--" + flag_name(key); }

std::string env_name(std::string_view key) {
  std::string name(kEnvPrefix);
  for (char c : key) {
    name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

std::string lower(std::string_view text) {
  std::string out;
  for (char c : text) {
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Quotes a user-supplied value for an error message. Control characters are
// escaped so that the message stays on one line.
std::string quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", byte);
      out += buf;
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

// "a:1, b:2" -> {"a:1", "b:2"}. Empty items are dropped, so an empty string
// is an empty list (CAPSTAN_PS= clears a default).
std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item =
        trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos
                                                                : comma - start));
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

const char* type_label(OptionType type) {
  switch (type) {
    case OptionType::kString:
      return "STRING";
    case OptionType::kInt:
      return "INT";
    case OptionType::kBool:
      return "BOOL";
    case OptionType::kDouble:
      return "NUMBER";
    case OptionType::kStringList:
      return "LIST";
  }
  return "?";
}

const char* expectation(OptionType type) {
  switch (type) {
    case OptionType::kString:
      return "a string";
    case OptionType::kInt:
      return "an integer";
    case OptionType::kBool:
      return "a boolean (true/false/yes/no/1/0/on/off)";
    case OptionType::kDouble:
      return "a number";
    case OptionType::kStringList:
      return "a list of strings";
  }
  return "?";
}

const char* type_name(OptionType type) {
  switch (type) {
    case OptionType::kString:
      return "string";
    case OptionType::kInt:
      return "int";
    case OptionType::kBool:
      return "bool";
    case OptionType::kDouble:
      return "double";
    case OptionType::kStringList:
      return "string list";
  }
  return "?";
}

// Decimal only: "12" and "-3", not "12abc", "1.5", " 1" or "".
std::optional<std::string> parse_int(std::string_view text, int64_t& out) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    return std::string("expected an integer, got ") + quote(text) + " (out of range)";
  }
  if (text.empty() || ec != std::errc() || ptr != end) {
    return std::string("expected an integer, got ") + quote(text);
  }
  out = value;
  return std::nullopt;
}

std::optional<std::string> parse_bool(std::string_view text, bool& out) {
  const std::string word = lower(text);
  if (word == "true" || word == "yes" || word == "1" || word == "on") {
    out = true;
  } else if (word == "false" || word == "no" || word == "0" || word == "off") {
    out = false;
  } else {
    return std::string("expected ") + expectation(OptionType::kBool) + ", got " + quote(text);
  }
  return std::nullopt;
}

// Whatever strtod consumes entirely, except leading blanks (which strtod
// would skip) and overflow to infinity.
std::optional<std::string> parse_double(std::string_view text, double& out) {
  const std::string copy(text);
  if (copy.empty() || std::isspace(static_cast<unsigned char>(copy.front()))) {
    return "expected a number, got " + quote(text);
  }
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size()) {
    return "expected a number, got " + quote(text);
  }
  if (errno == ERANGE && std::isinf(value)) {
    return "expected a number, got " + quote(text) + " (out of range)";
  }
  out = value;
  return std::nullopt;
}

// "0..65535", "at least 1" or "at most 9"; "" for no range.
std::string range_text(std::optional<int64_t> min, std::optional<int64_t> max) {
  if (min && max) return std::to_string(*min) + ".." + std::to_string(*max);
  if (min) return "at least " + std::to_string(*min);
  if (max) return "at most " + std::to_string(*max);
  return "";
}

// Why `value` is outside [min, max], or nullopt when it is inside.
std::optional<std::string> check_range(int64_t value, std::optional<int64_t> min,
                                       std::optional<int64_t> max) {
  const bool below = min && value < *min;
  const bool above = max && value > *max;
  if (!below && !above) return std::nullopt;
  if (min && max) return std::to_string(value) + " is not in " + range_text(min, max);
  return std::to_string(value) + (below ? " is below the minimum " + std::to_string(*min)
                                        : " is above the maximum " + std::to_string(*max));
}

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Undefined:
      break;
  }
  return "an undefined value";
}

// Reads a whole file; on failure returns strerror's text.
std::optional<std::string> read_file(const std::string& path, std::string& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string(std::strerror(errno));
  std::string content;
  char buf[8192];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      return std::string(std::strerror(saved));
    }
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  out = std::move(content);
  return std::nullopt;
}

std::string yaml_error(const YAML::Exception& e) {
  if (e.mark.is_null()) return e.msg;
  return "line " + std::to_string(e.mark.line + 1) + ", column " +
         std::to_string(e.mark.column + 1) + ": " + e.msg;
}

// ---- Cluster spec -------------------------------------------------------

// The cluster and task as one source gives them; either may be absent.
struct ClusterParts {
  std::optional<std::map<std::string, std::vector<std::string>>> jobs;
  bool has_task = false;
  std::string task_type;
  int task_index = -1;
};

// `json` is set for TF_CONFIG, where an address must be a JSON string, not
// a number; in the YAML file plain scalars such as host:1234 are strings.
std::optional<std::string> parse_cluster(const YAML::Node& node, bool json,
                                         ClusterParts& parts) {
  if (node.IsNull()) {
    parts.jobs.emplace();
    return std::nullopt;
  }
  if (!node.IsMap()) {
    return "'cluster' must be a mapping of job name to a list of addresses, got " +
           describe_node(node);
  }
  std::map<std::string, std::vector<std::string>> jobs;
  std::map<std::string, std::string> job_names;  // role -> name as written
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return "cluster: job name must be a string, got " + describe_node(it->first);
    }
    const std::string& name = it->first.Scalar();
    const std::string role = normalize_role(name);
    if (auto seen = job_names.find(role); seen != job_names.end()) {
      return "cluster: jobs " + quote(seen->second) + " and " + quote(name) +
             " are the same role " + quote(role);
    }
    job_names[role] = name;
    const YAML::Node list = it->second;
    if (!list.IsSequence()) {
      return "cluster." + name + ": expected a list of addresses, got " + describe_node(list);
    }
    std::vector<std::string> addresses;
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node& address = list[i];
      const bool is_string =
          address.IsScalar() && !address.Scalar().empty() && (!json || address.Tag() == "!");
      if (!is_string) {
        return "cluster." + name + "[" + std::to_string(i) +
               "]: expected an address string, got " + describe_node(address);
      }
      addresses.push_back(address.Scalar());
    }
    jobs[role] = std::move(addresses);
  }
  parts.jobs = std::move(jobs);
  return std::nullopt;
}

// `strict` rejects keys other than type and index; TF_CONFIG is written by
// outside tooling that may add its own, so there they are ignored.
std::optional<std::string> parse_task(const YAML::Node& node, bool strict, ClusterParts& parts) {
  if (!node.IsMap()) {
    return "'task' must be a mapping with 'type' and 'index', got " + describe_node(node);
  }
  std::string type;
  int index = -1;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const YAML::Node value = it->second;
    if (key == "type") {
      if (!value.IsScalar() || value.Scalar().empty()) {
        return "task.type: expected a job name, got " + describe_node(value);
      }
      type = normalize_role(value.Scalar());
    } else if (key == "index") {
      int64_t parsed = -1;
      if (!value.IsScalar() || parse_int(value.Scalar(), parsed) || parsed < 0 ||
          parsed > std::numeric_limits<int>::max()) {
        return "task.index: expected a non-negative integer, got " + describe_node(value);
      }
      index = static_cast<int>(parsed);
    } else if (strict) {
      return "task: unknown key " +
             (it->first.IsScalar() ? quote(key) : describe_node(it->first)) +
             " (expected 'type' and 'index')";
    }
  }
  if (index >= 0 && type.empty()) {
    return "task.index " + std::to_string(index) + " given without task.type";
  }
  parts.has_task = true;
  parts.task_type = std::move(type);
  parts.task_index = index;
  return std::nullopt;
}

// Checks the merged task against the merged cluster.
std::optional<std::string> check_task(const ClusterSpec& spec) {
  if (spec.task_type.empty() || spec.jobs.empty()) return std::nullopt;
  auto job = spec.jobs.find(spec.task_type);
  if (job == spec.jobs.end()) {
    // TensorFlow's convention: the evaluator runs outside the cluster.
    if (spec.task_type == "evaluator") return std::nullopt;
    std::vector<std::string> names;
    for (const auto& [name, addresses] : spec.jobs) names.push_back(name);
    return "task.type " + quote(spec.task_type) + " is not a job in the cluster (jobs: " +
           join(names, ", ") + ")";
  }
  if (spec.task_index >= 0 && static_cast<size_t>(spec.task_index) >= job->second.size()) {
    return "task.index " + std::to_string(spec.task_index) + " is out of range for job " +
           quote(spec.task_type) + " with " + std::to_string(job->second.size()) +
           " address(es)";
  }
  return std::nullopt;
}

// ---- Help ---------------------------------------------------------------

std::string describe_spec(const OptionSpec& spec) {
  std::string text = spec.help;
  if (spec.type == OptionType::kStringList) {
    text += " (comma-separated or repeated)";
  }
  text += " [" + std::string(type_name(spec.type));
  if (spec.default_value) {
    text += "; default: " +
            (spec.default_value->empty() ? std::string("''") : *spec.default_value);
  } else if (spec.required) {
    text += "; required";
  }
  if (spec.min || spec.max) text += "; " + range_text(spec.min, spec.max);
  text += "; env " + env_name(spec.key) + "; file key " + spec.key + "]";
  return text;
}

std::string sources_text(std::string_view program, const std::vector<OptionSpec>& specs) {
  const std::string example = specs.empty() ? "http_port" : specs.front().key;
  std::ostringstream out;
  out << "Configuration sources, lowest to highest precedence:\n"
      << "  1. the default shown for each key;\n"
      << "  2. the YAML file named by --config FILE, or else by CAPSTAN_CONFIG: a flat\n"
      << "     mapping 'key: value' (e.g. '" << example << ": ...'); lists as YAML\n"
      << "     sequences or comma-separated strings;\n"
      << "  3. environment variables CAPSTAN_<KEY>, e.g. " << env_name(example) << ";\n"
      << "  4. command-line flags, e.g. " << flag(example) << " VALUE or " << flag(example)
      << "=VALUE.\n"
      << "Booleans accept true/false/yes/no/1/0/on/off; a boolean flag alone means true,\n"
      << "--flag=false turns it off. List flags may be repeated.\n"
      << "\n"
      << "Cluster spec: the TF_CONFIG environment variable holds JSON such as\n"
      << "  {\"cluster\": {\"chief\": [\"host:port\"], \"ps\": [...], \"worker\": [...]},\n"
      << "   \"task\": {\"type\": \"ps\", \"index\": 0}}\n"
      << "The config file may hold the same 'cluster:' and 'task:' entries; where both\n"
      << "give one, TF_CONFIG wins. Job names: chief or coordinator, ps, worker,\n"
      << "dispatcher or data_dispatcher, data_worker.\n"
      << "\n"
      << "A CAPSTAN_* environment variable that names no key of " << program
      << " is ignored with a\n"
      << "warning in the log (CAPSTAN_TOKEN and CAPSTAN_CONFIG are read as described).\n"
      << "\n"
      << "Exit status: 0 after --help or --version; 2 for a configuration error, which\n"
      << "is reported on one line naming the key or file at fault.\n";
  return out.str();
}

void check_specs(const std::vector<OptionSpec>& specs) {
  std::map<std::string_view, int> seen;
  for (const OptionSpec& spec : specs) {
    const std::string& key = spec.key;
    bool snake = !key.empty() && std::islower(static_cast<unsigned char>(key.front())) &&
                 key.back() != '_';
    for (char c : key) {
      snake = snake && (std::islower(static_cast<unsigned char>(c)) ||
                        std::isdigit(static_cast<unsigned char>(c)) || c == '_');
    }
    if (!snake) {
      throw std::logic_error("config key " + quote(key) + " is not snake_case");
    }
    if (std::find(kReservedKeys.begin(), kReservedKeys.end(), key) != kReservedKeys.end()) {
      throw std::logic_error("config key " + quote(key) + " is reserved");
    }
    if (seen[key]++ > 0) {
      throw std::logic_error("config key " + quote(key) + " is declared twice");
    }
    if ((spec.min || spec.max) && spec.type != OptionType::kInt) {
      throw std::logic_error("config key " + quote(key) + " has a range but is a " +
                             type_name(spec.type) + "; only int keys take one");
    }
    if (spec.min && spec.max && *spec.min > *spec.max) {
      throw std::logic_error("config key " + quote(key) + " has an empty range " +
                             range_text(spec.min, spec.max));
    }
  }
}

}  // namespace

// ---- ConfigLoader -------------------------------------------------------

// Applies the sources to a Config in precedence order: each later source
// overwrites what the earlier ones set. It stops at the first problem, since
// only one line is reported.
class ConfigLoader {
 public:
  using Value = Config::Value;

  ConfigLoader(std::string_view program, std::string_view description,
               const std::vector<OptionSpec>& specs,
               const std::map<std::string, std::string>& env)
      : program_(program),
        description_(description),
        specs_(specs),
        env_(env),
        keys_("Options of " + program_, kHelpWidth, kHelpWidth / 2),
        general_("General options", kHelpWidth, kHelpWidth / 2) {}

  ParseResult run(int argc, const char* const* argv);

  // Checks `text` against v.type and stores the parsed value. On failure
  // returns what is wrong and leaves `v` as it was.
  static std::optional<std::string> assign_text(Value& v, std::string_view text);
  static std::optional<std::string> assign_node(Value& v, const YAML::Node& node);
  static Value* find(Config& config, std::string_view key);

 private:
  std::vector<std::string> warnings_;  // returned in ParseResult::warnings
  ParseResult fail(std::string text) const {
    ParseResult result;
    result.action = ParseResult::Action::kError;
    result.text = std::move(text);
    return result;
  }

  void build_descriptions();
  std::string help_text() const;
  void apply_defaults();
  std::optional<std::string> load_file(const std::string& path, ClusterParts& parts);
  std::optional<std::string> load_tf_config(ClusterParts& parts);
  std::optional<std::string> load_env();
  std::optional<std::string> load_flags(const po::parsed_options& parsed);

  // Constant after construction. The loader lives only inside
  // parse_config(), so the referenced specs and env outlive it.
  const std::string program_;
  const std::string description_;
  const std::vector<OptionSpec>& specs_;
  const std::map<std::string, std::string>& env_;

  static constexpr unsigned kHelpWidth = 80;

  po::options_description keys_;
  po::options_description general_;
  Config config_;
};

ConfigLoader::Value* ConfigLoader::find(Config& config, std::string_view key) {
  auto it = config.values_.find(key);
  return it == config.values_.end() ? nullptr : &it->second;
}

std::optional<std::string> ConfigLoader::assign_text(Value& v, std::string_view text) {
  switch (v.type) {
    case OptionType::kString:
      v.string_value = std::string(text);
      return std::nullopt;
    case OptionType::kInt: {
      // Checked before it is stored, so a failure leaves `v` as it was.
      int64_t parsed = 0;
      if (auto error = parse_int(text, parsed)) return error;
      if (auto error = check_range(parsed, v.min, v.max)) return error;
      v.int_value = parsed;
      return std::nullopt;
    }
    case OptionType::kBool:
      return parse_bool(text, v.bool_value);
    case OptionType::kDouble:
      return parse_double(text, v.double_value);
    case OptionType::kStringList:
      v.list_value = split_list(text);
      return std::nullopt;
  }
  return "unknown option type";
}

std::optional<std::string> ConfigLoader::assign_node(Value& v, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      // "key:" with nothing after it reads as an empty value.
      return assign_text(v, "");
    case YAML::NodeType::Scalar:
      return assign_text(v, node.Scalar());
    case YAML::NodeType::Sequence: {
      if (v.type != OptionType::kStringList) break;
      std::vector<std::string> items;
      for (size_t i = 0; i < node.size(); ++i) {
        if (!node[i].IsScalar()) {
          return "expected a list of strings, got " + describe_node(node[i]) + " at item " +
                 std::to_string(i);
        }
        items.push_back(node[i].Scalar());
      }
      v.list_value = std::move(items);
      return std::nullopt;
    }
    case YAML::NodeType::Map:
    case YAML::NodeType::Undefined:
      break;
  }
  return std::string("expected ") + expectation(v.type) + ", got " + describe_node(node);
}

void ConfigLoader::build_descriptions() {
  for (const OptionSpec& spec : specs_) {
    // Every value is read as text and checked by assign_text, so that all
    // sources share one set of rules and messages; the semantic here only
    // tells Boost how many tokens a flag takes and names it in --help.
    auto* semantic = po::value<std::string>()->value_name(type_label(spec.type));
    // A boolean flag alone means true; Boost also takes a following
    // non-flag token as its value, so "--verbose false" works too.
    if (spec.type == OptionType::kBool) semantic->implicit_value("true");
    keys_.add_options()(flag_name(spec.key).c_str(), semantic, describe_spec(spec).c_str());
  }
  general_.add_options()("help,h", "show this help and exit")(
      "version", "print the version and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "YAML config file [env CAPSTAN_CONFIG]");
}

std::string ConfigLoader::help_text() const {
  std::ostringstream out;
  out << "Usage: " << program_ << " [--config FILE] [flags]\n\n";
  if (!description_.empty()) out << description_ << "\n\n";
  if (!specs_.empty()) out << keys_ << "\n";
  out << general_ << "\n" << sources_text(program_, specs_);
  return out.str();
}

void ConfigLoader::apply_defaults() {
  for (const OptionSpec& spec : specs_) {
    Value& v = config_.values_[spec.key];
    v.type = spec.type;
    v.min = spec.min;
    v.max = spec.max;
    if (!spec.default_value) continue;
    if (auto error = assign_text(v, *spec.default_value)) {
      throw std::logic_error("default of config key " + quote(spec.key) + ": " + *error);
    }
    v.source = "default";
  }
}

std::optional<std::string> ConfigLoader::load_file(const std::string& path,
                                                   ClusterParts& parts) {
  std::string content;
  if (auto error = read_file(path, content)) {
    return "config file " + quote(path) + ": " + *error;
  }
  YAML::Node root;
  try {
    root = YAML::Load(content);
  } catch (const YAML::Exception& e) {
    return path + ": invalid YAML at " + yaml_error(e);
  }
  if (root.IsNull()) return std::nullopt;  // an empty file sets nothing
  if (!root.IsMap()) {
    return path + ": expected a mapping of key: value at the top level, got " +
           describe_node(root);
  }
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar()) {
      return path + ": keys must be strings, got " + describe_node(it->first);
    }
    const std::string& key = it->first.Scalar();
    if (key == "cluster") {
      if (auto error = parse_cluster(it->second, /*json=*/false, parts)) {
        return path + ": " + *error;
      }
      continue;
    }
    if (key == "task") {
      if (auto error = parse_task(it->second, /*strict=*/true, parts)) {
        return path + ": " + *error;
      }
      continue;
    }
    Value* v = find(config_, key);
    if (v == nullptr) return path + ": unknown key " + quote(key);
    Value parsed = *v;
    if (auto error = assign_node(parsed, it->second)) {
      return path + ": key " + quote(key) + ": " + *error;
    }
    *v = std::move(parsed);
    v->source = "file";
  }
  return std::nullopt;
}

std::optional<std::string> ConfigLoader::load_tf_config(ClusterParts& parts) {
  auto it = env_.find(std::string(kTfConfig));
  if (it == env_.end() || trim(it->second).empty()) return std::nullopt;
  // JSON's own parser first, for errors in JSON's terms (YAML, which reads
  // the structure below, would accept non-JSON and report its own columns).
  if (auto json = checkpoint::parse_json(it->second); !json.ok()) {
    std::string why = json.status().message();
    if (size_t tag = why.find("] "); why.starts_with("[json.exception.") && tag != std::string::npos) {
      why = why.substr(tag + 2);
    }
    return "TF_CONFIG: invalid JSON: " + why;
  }
  YAML::Node root;
  try {
    root = YAML::Load(it->second);
  } catch (const YAML::Exception& e) {
    return "TF_CONFIG: invalid JSON at " + yaml_error(e);
  }
  if (!root.IsMap()) {
    return "TF_CONFIG: expected a JSON object, got " + describe_node(root);
  }
  // Other top-level keys ("environment", "rpc_layer", ...) belong to the
  // tooling that wrote TF_CONFIG and are ignored.
  if (YAML::Node cluster = root["cluster"]; cluster) {
    if (auto error = parse_cluster(cluster, /*json=*/true, parts)) return "TF_CONFIG: " + *error;
  }
  if (YAML::Node task = root["task"]; task) {
    if (auto error = parse_task(task, /*strict=*/false, parts)) return "TF_CONFIG: " + *error;
  }
  return std::nullopt;
}

std::optional<std::string> ConfigLoader::load_env() {
  for (const auto& [name, value] : env_) {
    if (!name.starts_with(kEnvPrefix)) continue;
    const std::string key = lower(std::string_view(name).substr(kEnvPrefix.size()));
    Value* v = env_name(key) == name ? find(config_, key) : nullptr;
    if (v == nullptr) {
      if (std::find(kReservedEnv.begin(), kReservedEnv.end(), name) != kReservedEnv.end()) {
        continue;
      }
      // Not an error: launchers (Kubernetes service links, shared env
      // files) set CAPSTAN_* variables meant for other roles.
      // The value stays out of the log: a misspelt CAPSTAN_TOKEN holds a secret.
      warnings_.push_back("ignoring environment variable " + name + " (value not shown): " + program_ +
                          " has no key " + quote(key));
      continue;
    }
    Value parsed = *v;
    if (auto error = assign_text(parsed, value)) return name + ": " + *error;
    *v = std::move(parsed);
    v->source = "env";
  }
  return std::nullopt;
}

std::optional<std::string> ConfigLoader::load_flags(const po::parsed_options& parsed) {
  // Values per key in command-line order; a list flag may repeat.
  std::map<std::string, std::vector<std::string>> given;
  std::vector<std::string> order;
  for (const po::option& option : parsed.options) {
    if (option.string_key == "help" || option.string_key == "version" ||
        option.string_key == "config") {
      continue;
    }
    std::string key = option.string_key;
    std::replace(key.begin(), key.end(), '-', '_');
    Value* v = find(config_, key);
    if (v == nullptr) return "unknown flag " + quote("--" + option.string_key);
    auto& values = given[key];
    if (values.empty()) order.push_back(key);
    if (option.value.empty()) {
      // Only a boolean flag may stand alone; Boost rejects the others.
      values.push_back("true");
    } else {
      values.insert(values.end(), option.value.begin(), option.value.end());
    }
  }
  for (const std::string& key : order) {
    Value* v = find(config_, key);
    const std::vector<std::string>& values = given[key];
    Value parsed = *v;
    if (v->type == OptionType::kStringList) {
      parsed.list_value.clear();
      for (const std::string& value : values) {
        for (std::string& item : split_list(value)) parsed.list_value.push_back(std::move(item));
      }
    } else if (values.size() > 1) {
      std::vector<std::string> quoted;
      for (const std::string& value : values) quoted.push_back(quote(value));
      return flag(key) + ": given more than once (" + join(quoted, ", ") + ")";
    } else if (auto error = assign_text(parsed, values.front())) {
      return flag(key) + ": " + *error;
    }
    *v = std::move(parsed);
    v->source = "flag";
  }
  return std::nullopt;
}

ParseResult ConfigLoader::run(int argc, const char* const* argv) {
  check_specs(specs_);
  apply_defaults();
  build_descriptions();

  po::options_description all;
  all.add(keys_).add(general_);
  po::parsed_options parsed(&all);
  try {
    // No prefix guessing: --port must not silently mean --port-range.
    const int style = po::command_line_style::unix_style & ~po::command_line_style::allow_guessing;
    parsed = po::command_line_parser(argc, argv)
                 .options(all)
                 .style(style)
                 .allow_unregistered()
                 .run();
  } catch (const po::error& e) {
    return fail(e.what());
  }

  // --help and --version answer even when other flags are wrong.
  bool help = false;
  bool version = false;
  for (const po::option& option : parsed.options) {
    help = help || (!option.unregistered && option.string_key == "help");
    version = version || (!option.unregistered && option.string_key == "version");
  }
  if (help) {
    ParseResult result;
    result.action = ParseResult::Action::kHelp;
    result.text = help_text();
    return result;
  }
  if (version) {
    ParseResult result;
    result.action = ParseResult::Action::kVersion;
    result.text = program_ + " (Capstan) " + CAPSTAN_VERSION + "\n";
    return result;
  }

  std::optional<std::string> config_path;
  for (const po::option& option : parsed.options) {
    if (option.unregistered) {
      std::string token = option.original_tokens.empty() ? option.string_key
                                                         : option.original_tokens.front();
      token = token.substr(0, token.find('='));
      return fail("unknown flag " + quote(token) + " (see --help)");
    }
    if (option.string_key.empty()) {
      return fail("unexpected argument " +
                  quote(option.value.empty() ? "" : option.value.front()) + "; " + program_ +
                  " takes only flags");
    }
    if (option.string_key == "config") {
      if (config_path) {
        return fail("--config: given more than once (" + quote(*config_path) + ", " +
                    quote(option.value.front()) + ")");
      }
      config_path = option.value.front();
    }
  }
  if (!config_path) {
    if (auto it = env_.find("CAPSTAN_CONFIG"); it != env_.end() && !it->second.empty()) {
      config_path = it->second;
    }
  }

  ClusterParts file_parts;
  if (config_path) {
    if (auto error = load_file(*config_path, file_parts)) return fail(*error);
  }
  ClusterParts tf_parts;
  if (auto error = load_tf_config(tf_parts)) return fail(*error);

  ClusterSpec& cluster = config_.cluster_;
  if (tf_parts.jobs) {
    cluster.jobs = std::move(*tf_parts.jobs);
  } else if (file_parts.jobs) {
    cluster.jobs = std::move(*file_parts.jobs);
  }
  const bool task_from_tf = tf_parts.has_task;
  const ClusterParts& task_parts = task_from_tf ? tf_parts : file_parts;
  cluster.task_type = task_parts.task_type;
  cluster.task_index = task_parts.task_index;
  if (auto error = check_task(cluster)) {
    return fail((task_from_tf ? std::string("TF_CONFIG") : *config_path) + ": " + *error);
  }

  if (auto error = load_env()) return fail(*error);
  if (auto error = load_flags(parsed)) return fail(*error);

  for (const OptionSpec& spec : specs_) {
    if (spec.required && !config_.has(spec.key)) {
      return fail("missing required value " + quote(spec.key) + " (set " + flag(spec.key) +
                  ", " + env_name(spec.key) + " or '" + spec.key + ":' in the config file)");
    }
  }

  ParseResult result;
  result.action = ParseResult::Action::kRun;
  result.config = std::move(config_);
  result.warnings = std::move(warnings_);
  return result;
}

// ---- ClusterSpec --------------------------------------------------------

bool ClusterSpec::empty() const { return jobs.empty() && task_type.empty(); }

const std::vector<std::string>& ClusterSpec::addresses(std::string_view role) const {
  static const std::vector<std::string> kNone;
  auto it = jobs.find(normalize_role(role));
  return it == jobs.end() ? kNone : it->second;
}

std::optional<std::string> ClusterSpec::task_address() const {
  if (task_type.empty() || task_index < 0) return std::nullopt;
  const std::vector<std::string>& list = addresses(task_type);
  if (static_cast<size_t>(task_index) >= list.size()) return std::nullopt;
  return list[static_cast<size_t>(task_index)];
}

std::string normalize_role(std::string_view job_name) {
  if (job_name == "chief" || job_name == "coordinator") return "coordinator";
  if (job_name == "dispatcher" || job_name == "data_dispatcher" ||
      job_name == "data-dispatcher") {
    return "data_dispatcher";
  }
  if (job_name == "data_worker" || job_name == "data-worker") return "data_worker";
  return std::string(job_name);
}

// ---- Config -------------------------------------------------------------

const Config::Value& Config::find(std::string_view key, OptionType type) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw std::logic_error("config key " + quote(key) + " is not declared");
  }
  const Value& v = it->second;
  if (v.type != type) {
    throw std::logic_error("config key " + quote(key) + " is a " + type_name(v.type) +
                           ", not a " + type_name(type));
  }
  if (v.source.empty() && type != OptionType::kStringList) {
    throw std::logic_error("config key " + quote(key) + " has no value; check has() first");
  }
  return v;
}

bool Config::has(std::string_view key) const {
  auto it = values_.find(key);
  return it != values_.end() && !it->second.source.empty();
}

const std::string& Config::get_string(std::string_view key) const {
  return find(key, OptionType::kString).string_value;
}

int64_t Config::get_int(std::string_view key) const {
  return find(key, OptionType::kInt).int_value;
}

bool Config::get_bool(std::string_view key) const {
  return find(key, OptionType::kBool).bool_value;
}

double Config::get_double(std::string_view key) const {
  return find(key, OptionType::kDouble).double_value;
}

const std::vector<std::string>& Config::get_list(std::string_view key) const {
  return find(key, OptionType::kStringList).list_value;
}

std::string_view Config::source(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw std::logic_error("config key " + quote(key) + " is not declared");
  }
  return it->second.source;
}

const ClusterSpec& Config::cluster() const { return cluster_; }

void Config::set(std::string key, std::string value) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw std::logic_error("config key " + quote(key) + " is not declared");
  }
  Value parsed = it->second;
  if (auto error = ConfigLoader::assign_text(parsed, value)) {
    throw std::invalid_argument("key " + quote(key) + ": " + *error);
  }
  parsed.source = "set";
  it->second = std::move(parsed);
}

// ---- Entry points -------------------------------------------------------

ParseResult parse_config(std::string_view program, std::string_view description,
                         const std::vector<OptionSpec>& specs, int argc,
                         const char* const* argv,
                         const std::map<std::string, std::string>& env) {
  ConfigLoader loader(program, description, specs, env);
  return loader.run(argc, argv);
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    size_t eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

}  // namespace capstan::daemon
