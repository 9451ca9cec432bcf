#include "daemons/common/config.h"
#include "daemons/common/daemon.h"

#include <stdlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace capstan::daemon {
namespace {

using Action = ParseResult::Action;
using Env = std::map<std::string, std::string>;
using Strings = std::vector<std::string>;

std::vector<OptionSpec> test_specs() {
  return {
      {"port", OptionType::kInt, "port to listen on", "80"},
      {"name", OptionType::kString, "task name", std::nullopt},
      {"verbose", OptionType::kBool, "log more", "false"},
      {"learning_rate", OptionType::kDouble, "step size", "0.5"},
      {"ps", OptionType::kStringList, "parameter servers", std::nullopt},
      {"http_port", OptionType::kInt, "port for /healthz", "8080"},
  };
}

ParseResult parse(const Strings& args, const Env& env = {},
                  const std::vector<OptionSpec>& specs = test_specs()) {
  std::vector<const char*> argv = {"test-daemon"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_config("test-daemon", "A daemon for tests.", specs, static_cast<int>(argv.size()),
                      argv.data(), env);
}

// A mkdtemp directory for config files, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "capstan_config_test.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& content) const {
    const std::string file = (path_ / name).string();
    std::ofstream out(file);
    out << content;
    return file;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs a parse expected to fail and returns its one-line message.
std::string error_of(const ParseResult& result) {
  CHECK(result.action == Action::kError);
  CHECK(result.text.find('\n') == std::string::npos);
  return result.text;
}

TEST_CASE("sources take precedence default < file < env < flag") {
  TempDir dir;
  const std::string file =
      dir.write("c.yaml", "port: 1\nname: from-file\nlearning_rate: 0.25\nverbose: yes\n");
  ParseResult result = parse({"--config", file, "--port", "3"},
                             {{"CAPSTAN_PORT", "2"}, {"CAPSTAN_NAME", "from-env"}});
  REQUIRE(result.action == Action::kRun);
  const Config& config = result.config;

  CHECK(config.get_int("port") == 3);
  CHECK(config.source("port") == "flag");
  CHECK(config.get_string("name") == "from-env");
  CHECK(config.source("name") == "env");
  CHECK(config.get_double("learning_rate") == 0.25);
  CHECK(config.source("learning_rate") == "file");
  CHECK(config.get_bool("verbose"));
  CHECK(config.get_int("http_port") == 8080);
  CHECK(config.source("http_port") == "default");
  CHECK_FALSE(config.has("ps"));
  CHECK(config.source("ps").empty());
  CHECK(config.get_list("ps").empty());
}

TEST_CASE("flag values may follow '=' or come as the next argument") {
  ParseResult result = parse({"--http-port=9000", "--name", "x"});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_int("http_port") == 9000);
  CHECK(result.config.get_string("name") == "x");
}

TEST_CASE("CAPSTAN_CONFIG names the config file, and --config wins over it") {
  TempDir dir;
  const std::string a = dir.write("a.yaml", "port: 11\n");
  const std::string b = dir.write("b.yaml", "port: 22\n");

  ParseResult from_env = parse({}, {{"CAPSTAN_CONFIG", a}});
  REQUIRE(from_env.action == Action::kRun);
  CHECK(from_env.config.get_int("port") == 11);

  ParseResult from_flag = parse({"--config=" + b}, {{"CAPSTAN_CONFIG", a}});
  REQUIRE(from_flag.action == Action::kRun);
  CHECK(from_flag.config.get_int("port") == 22);
}

TEST_CASE("an empty config file sets nothing") {
  TempDir dir;
  ParseResult result = parse({"--config", dir.write("empty.yaml", "")});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.source("port") == "default");
}

TEST_CASE("an unknown key in the config file is an error naming it") {
  TempDir dir;
  const std::string file = dir.write("config.yaml", "port: 1\nprot: 2\n");
  CHECK(error_of(parse({"--config", file})) == file + ": unknown key 'prot'");
}

TEST_CASE("an unknown flag is an error naming it") {
  CHECK(error_of(parse({"--prot", "8080"})) == "unknown flag '--prot' (see --help)");
  CHECK(error_of(parse({"--prot=8080"})) == "unknown flag '--prot' (see --help)");
  // No prefix matching: --http is not --http-port.
  CHECK(error_of(parse({"--http=1"})).find("'--http'") != std::string::npos);
}

TEST_CASE("a positional argument is an error naming it") {
  CHECK(error_of(parse({"stray"})).find("'stray'") != std::string::npos);
}

TEST_CASE("a flag that needs a value and has none is an error naming it") {
  CHECK(error_of(parse({"--port"})).find("--port") != std::string::npos);
}

TEST_CASE("a scalar flag given twice is an error") {
  CHECK(error_of(parse({"--port", "1", "--port=2"})) ==
        "--port: given more than once ('1', '2')");
}

TEST_CASE("an unknown CAPSTAN_ variable is a warning, reserved ones are silent") {
  ParseResult unknown = parse({}, {{"CAPSTAN_PROT", "8080"}});
  REQUIRE(unknown.action == Action::kRun);
  REQUIRE(unknown.warnings.size() == 1);
  CHECK(unknown.warnings[0] ==
        "ignoring environment variable CAPSTAN_PROT (value not shown): test-daemon has no key 'prot'");
  ParseResult lower = parse({}, {{"CAPSTAN_http_port", "1"}});
  REQUIRE(lower.warnings.size() == 1);
  CHECK(lower.warnings[0].find("CAPSTAN_http_port") != std::string::npos);

  ParseResult result = parse({}, {{"CAPSTAN_TOKEN", "secret"},
                                  {"CAPSTAN_BIN_DIR", "/opt/bin"},
                                  {"CAPSTAN_LOG_DIR", "/var/log"},
                                  {"PATH", "/usr/bin"},
                                  {"CAPSTANISH", "x"}});
  CHECK(result.action == Action::kRun);
  CHECK(result.warnings.empty());
}

TEST_CASE("a reserved variable that is also a declared key sets that key") {
  std::vector<OptionSpec> specs = {{"log_dir", OptionType::kString, "logs", std::nullopt}};
  ParseResult result = parse({}, {{"CAPSTAN_LOG_DIR", "/var/log/x"}}, specs);
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_string("log_dir") == "/var/log/x");
  CHECK(result.config.source("log_dir") == "env");
}

TEST_CASE("a value of the wrong type is an error naming its source") {
  TempDir dir;
  const std::string file = dir.write("c.yaml", "port: abc\n");
  CHECK(error_of(parse({"--port", "abc"})) == "--port: expected an integer, got 'abc'");
  CHECK(error_of(parse({}, {{"CAPSTAN_PORT", "abc"}})) ==
        "CAPSTAN_PORT: expected an integer, got 'abc'");
  CHECK(error_of(parse({"--config", file})) ==
        file + ": key 'port': expected an integer, got 'abc'");
}

TEST_CASE("integers are decimal only") {
  for (const char* bad : {"12abc", "1.5", " 1", "0x10", "+1", "99999999999999999999"}) {
    INFO(bad);
    CHECK(error_of(parse({std::string("--port=") + bad})).starts_with("--port: expected an integer"));
  }
  CHECK(error_of(parse({}, {{"CAPSTAN_PORT", ""}})) == "CAPSTAN_PORT: expected an integer, got ''");
  // Boost rejects an empty "--port=" itself; its message names the flag.
  CHECK(error_of(parse({"--port="})).find("--port") != std::string::npos);
  ParseResult result = parse({"--port=-3"});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_int("port") == -3);
}

TEST_CASE("booleans accept true/false/yes/no/1/0/on/off in any case") {
  for (const char* yes : {"true", "YES", "1", "On"}) {
    ParseResult result = parse({}, {{"CAPSTAN_VERBOSE", yes}});
    REQUIRE(result.action == Action::kRun);
    CHECK(result.config.get_bool("verbose"));
  }
  for (const char* no : {"false", "No", "0", "OFF"}) {
    ParseResult result = parse({}, {{"CAPSTAN_VERBOSE", no}});
    REQUIRE(result.action == Action::kRun);
    CHECK_FALSE(result.config.get_bool("verbose"));
  }
  CHECK(error_of(parse({}, {{"CAPSTAN_VERBOSE", "maybe"}})) ==
        "CAPSTAN_VERBOSE: expected a boolean (true/false/yes/no/1/0/on/off), got 'maybe'");
}

TEST_CASE("a boolean flag alone means true and takes an optional value") {
  ParseResult alone = parse({"--verbose"}, {{"CAPSTAN_VERBOSE", "no"}});
  REQUIRE(alone.action == Action::kRun);
  CHECK(alone.config.get_bool("verbose"));

  ParseResult off = parse({"--verbose=false"}, {{"CAPSTAN_VERBOSE", "yes"}});
  REQUIRE(off.action == Action::kRun);
  CHECK_FALSE(off.config.get_bool("verbose"));

  ParseResult separate = parse({"--verbose", "false", "--port", "1"});
  REQUIRE(separate.action == Action::kRun);
  CHECK_FALSE(separate.config.get_bool("verbose"));
  CHECK(separate.config.get_int("port") == 1);

  ParseResult before_flag = parse({"--verbose", "--port", "1"});
  REQUIRE(before_flag.action == Action::kRun);
  CHECK(before_flag.config.get_bool("verbose"));

  CHECK(error_of(parse({"--verbose=maybe"})).starts_with("--verbose: expected a boolean"));
  CHECK(error_of(parse({"--verbose", "maybe"})).starts_with("--verbose: expected a boolean"));
}

TEST_CASE("doubles accept any number strtod reads entirely") {
  ParseResult result = parse({"--learning-rate", "1e-3"});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_double("learning_rate") == 1e-3);
  CHECK(error_of(parse({"--learning-rate", "0.1x"})) ==
        "--learning-rate: expected a number, got '0.1x'");
  CHECK(error_of(parse({"--learning-rate", "1e999"})).find("out of range") != std::string::npos);
}

TEST_CASE("YAML integers, quoted numbers and booleans read as their types") {
  TempDir dir;
  ParseResult result = parse(
      {"--config", dir.write("c.yaml", "port: 80\nhttp_port: \"81\"\nverbose: true\nname: 7\n")});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_int("port") == 80);
  CHECK(result.config.get_int("http_port") == 81);
  CHECK(result.config.get_bool("verbose"));
  CHECK(result.config.get_string("name") == "7");
}

TEST_CASE("a YAML mapping or sequence where a scalar is expected is a type error") {
  TempDir dir;
  const std::string map_file = dir.write("m.yaml", "port: {a: 1}\n");
  CHECK(error_of(parse({"--config", map_file})) ==
        map_file + ": key 'port': expected an integer, got a mapping");
  const std::string seq_file = dir.write("s.yaml", "name: [a, b]\n");
  CHECK(error_of(parse({"--config", seq_file})) ==
        seq_file + ": key 'name': expected a string, got a sequence");
  const std::string nested = dir.write("n.yaml", "ps: [a, [b]]\n");
  CHECK(error_of(parse({"--config", nested})).find("key 'ps'") != std::string::npos);
}

TEST_CASE("a missing required value is an error that says where to set it") {
  std::vector<OptionSpec> specs = test_specs();
  specs.push_back({"dispatcher", OptionType::kString, "dispatcher address", std::nullopt, true});
  CHECK(error_of(parse({}, {}, specs)) ==
        "missing required value 'dispatcher' (set --dispatcher, CAPSTAN_DISPATCHER or "
        "'dispatcher:' in the config file)");
  CHECK(parse({"--dispatcher", "d:1"}, {}, specs).action == Action::kRun);
}

TEST_CASE("a missing config file is an error naming it") {
  TempDir dir;
  const std::string missing = dir.path("missing.yaml");
  CHECK(error_of(parse({"--config", missing})) ==
        "config file '" + missing + "': No such file or directory");
  CHECK(error_of(parse({}, {{"CAPSTAN_CONFIG", missing}})).find(missing) != std::string::npos);
}

TEST_CASE("an unreadable config file is an error naming it") {
  TempDir dir;
  // A directory opens but cannot be read, even as root.
  const std::string directory = dir.path("");
  CHECK(error_of(parse({"--config", directory})).find(directory) != std::string::npos);
}

TEST_CASE("unparsable YAML is an error with line and column") {
  TempDir dir;
  const std::string file = dir.write("bad.yaml", "port: 1\nps: [a,\n");
  const std::string error = error_of(parse({"--config", file}));
  CHECK(error.starts_with(file + ": invalid YAML at line 3, column 1: "));
}

TEST_CASE("a config file that is not a mapping is an error") {
  TempDir dir;
  const std::string file = dir.write("list.yaml", "- port\n");
  CHECK(error_of(parse({"--config", file})).starts_with(file + ": expected a mapping"));
}

TEST_CASE("lists parse from a YAML sequence, a comma-separated string and repeated flags") {
  TempDir dir;
  const Strings expected = {"a:1", "b:2"};

  ParseResult sequence = parse({"--config", dir.write("seq.yaml", "ps: [a:1, b:2]\n")});
  REQUIRE(sequence.action == Action::kRun);
  CHECK(sequence.config.get_list("ps") == expected);

  ParseResult block = parse({"--config", dir.write("block.yaml", "ps:\n  - a:1\n  - b:2\n")});
  REQUIRE(block.action == Action::kRun);
  CHECK(block.config.get_list("ps") == expected);

  ParseResult file_string = parse({"--config", dir.write("str.yaml", "ps: a:1, b:2\n")});
  REQUIRE(file_string.action == Action::kRun);
  CHECK(file_string.config.get_list("ps") == expected);

  ParseResult env = parse({}, {{"CAPSTAN_PS", "a:1,b:2"}});
  REQUIRE(env.action == Action::kRun);
  CHECK(env.config.get_list("ps") == expected);

  ParseResult repeated = parse({"--ps", "a:1", "--ps=b:2"}, {{"CAPSTAN_PS", "c:3"}});
  REQUIRE(repeated.action == Action::kRun);
  CHECK(repeated.config.get_list("ps") == expected);

  ParseResult comma = parse({"--ps", "a:1,b:2"});
  REQUIRE(comma.action == Action::kRun);
  CHECK(comma.config.get_list("ps") == expected);

  ParseResult cleared = parse({}, {{"CAPSTAN_PS", ""}});
  REQUIRE(cleared.action == Action::kRun);
  CHECK(cleared.config.has("ps"));
  CHECK(cleared.config.get_list("ps").empty());
}

TEST_CASE("TF_CONFIG gives the cluster, with chief normalized to coordinator") {
  const Env env = {{"TF_CONFIG",
                    R"({"cluster": {"chief": ["c:1"], "ps": ["p:1", "p:2"], "worker": ["w:1"]},
                        "task": {"type": "ps", "index": 1}, "environment": "cloud"})"}};
  ParseResult result = parse({}, env);
  REQUIRE(result.action == Action::kRun);
  const ClusterSpec& cluster = result.config.cluster();
  CHECK_FALSE(cluster.empty());
  CHECK(cluster.jobs.count("chief") == 0);
  CHECK(cluster.addresses("coordinator") == Strings{"c:1"});
  CHECK(cluster.addresses("chief") == Strings{"c:1"});
  CHECK(cluster.addresses("ps") == Strings{"p:1", "p:2"});
  CHECK(cluster.addresses("evaluator").empty());
  CHECK(cluster.task_type == "ps");
  CHECK(cluster.task_index == 1);
  CHECK(cluster.task_address() == std::optional<std::string>("p:2"));
}

TEST_CASE("TF_CONFIG with a chief task normalizes the task type") {
  ParseResult result = parse(
      {}, {{"TF_CONFIG", R"({"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0}})"}});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.cluster().task_type == "coordinator");
  CHECK(result.config.cluster().task_address() == std::optional<std::string>("c:1"));
}

TEST_CASE("no cluster spec leaves the cluster empty") {
  ParseResult result = parse({}, {{"TF_CONFIG", "  "}});
  REQUIRE(result.action == Action::kRun);
  const ClusterSpec& cluster = result.config.cluster();
  CHECK(cluster.empty());
  CHECK(cluster.task_index == -1);
  CHECK_FALSE(cluster.task_address().has_value());
}

TEST_CASE("unparsable TF_CONFIG is an error") {
  // JSON's errors, with JSON's line and column.
  CHECK(error_of(parse({}, {{"TF_CONFIG", R"({"cluster": [)"}})) ==
        "TF_CONFIG: invalid JSON: parse error at line 1, column 14: syntax error while parsing value - unexpected "
        "end of input; expected '[', '{', or a literal");
  // Truncated: the closing brace is missing.
  CHECK_THAT(error_of(parse({}, {{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0})"}})),
             Catch::Contains("TF_CONFIG: invalid JSON: parse error at line 1, column 64"));
  // YAML would take this; JSON does not.
  CHECK_THAT(error_of(parse({}, {{"TF_CONFIG", "{'cluster': {}}"}})),
             Catch::StartsWith("TF_CONFIG: invalid JSON: parse error at line 1, column 2"));
  CHECK(error_of(parse({}, {{"TF_CONFIG", "[1, 2]"}})) ==
        "TF_CONFIG: expected a JSON object, got a sequence");
}

TEST_CASE("TF_CONFIG structure errors name what is wrong") {
  auto tf_error = [](const std::string& json) {
    return error_of(parse({}, {{"TF_CONFIG", json}}));
  };
  CHECK(tf_error(R"({"cluster": ["a:1"]})") ==
        "TF_CONFIG: 'cluster' must be a mapping of job name to a list of addresses, got a "
        "sequence");
  CHECK(tf_error(R"({"cluster": {"ps": "a:1"}})") ==
        "TF_CONFIG: cluster.ps: expected a list of addresses, got 'a:1'");
  CHECK(tf_error(R"({"cluster": {"ps": ["a:1", 2]}})") ==
        "TF_CONFIG: cluster.ps[1]: expected an address string, got '2'");
  CHECK(tf_error(R"({"cluster": {"ps": [{"a": 1}]}})") ==
        "TF_CONFIG: cluster.ps[0]: expected an address string, got a mapping");
  CHECK(tf_error(R"({"cluster": {"chief": ["a:1"], "coordinator": ["b:1"]}})")
            .find("'chief' and 'coordinator'") != std::string::npos);
  CHECK(tf_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": "x"}})") ==
        "TF_CONFIG: task.index: expected a non-negative integer, got 'x'");
  CHECK(tf_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1.5}})") ==
        "TF_CONFIG: task.index: expected a non-negative integer, got '1.5'");
  CHECK(tf_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1}})") ==
        "TF_CONFIG: task.index 1 is out of range for job 'ps' with 1 address(es)");
  CHECK(tf_error(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "wroker", "index": 0}})") ==
        "TF_CONFIG: task.type 'wroker' is not a job in the cluster (jobs: ps)");
  CHECK(tf_error(R"({"task": "ps"})") ==
        "TF_CONFIG: 'task' must be a mapping with 'type' and 'index', got 'ps'");
  CHECK(tf_error(R"({"task": {"index": 0}})") == "TF_CONFIG: task.index 0 given without task.type");
}

TEST_CASE("an evaluator task may sit outside the cluster") {
  ParseResult result = parse(
      {}, {{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "evaluator", "index": 0}})"}});
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.cluster().task_type == "evaluator");
  CHECK_FALSE(result.config.cluster().task_address().has_value());
}

TEST_CASE("the config file's cluster: and task: give the cluster spec") {
  TempDir dir;
  const std::string file = dir.write("c.yaml",
                                     "port: 5\n"
                                     "cluster:\n"
                                     "  chief: [c:1]\n"
                                     "  data-dispatcher: [d:1]\n"
                                     "  worker:\n"
                                     "    - w:1\n"
                                     "    - w:2\n"
                                     "task:\n"
                                     "  type: worker\n"
                                     "  index: 1\n");
  ParseResult result = parse({"--config", file});
  REQUIRE(result.action == Action::kRun);
  const ClusterSpec& cluster = result.config.cluster();
  CHECK(cluster.addresses("coordinator") == Strings{"c:1"});
  CHECK(cluster.addresses("data_dispatcher") == Strings{"d:1"});
  CHECK(cluster.addresses("dispatcher") == Strings{"d:1"});
  CHECK(cluster.task_address() == std::optional<std::string>("w:2"));
  CHECK(result.config.get_int("port") == 5);
}

TEST_CASE("cluster errors in the config file name the file") {
  TempDir dir;
  const std::string not_map = dir.write("a.yaml", "cluster: [a:1]\n");
  CHECK(error_of(parse({"--config", not_map})).starts_with(not_map + ": 'cluster' must be a mapping"));
  const std::string bad_task = dir.write("b.yaml", "cluster: {ps: [a:1]}\ntask: {type: ps, index: 3}\n");
  CHECK(error_of(parse({"--config", bad_task})) ==
        bad_task + ": task.index 3 is out of range for job 'ps' with 1 address(es)");
  const std::string task_key = dir.write("c.yaml", "task: {type: ps, idx: 0}\n");
  CHECK(error_of(parse({"--config", task_key})).find("'idx'") != std::string::npos);
}

TEST_CASE("TF_CONFIG overrides the config file's cluster and task") {
  TempDir dir;
  const std::string file =
      dir.write("c.yaml", "cluster:\n  ps: [file:1]\n  worker: [file:2]\ntask: {type: ps, index: 0}\n");
  ParseResult result = parse(
      {"--config", file},
      {{"TF_CONFIG", R"({"cluster": {"ps": ["tf:1", "tf:2"]}, "task": {"type": "ps", "index": 1}})"}});
  REQUIRE(result.action == Action::kRun);
  const ClusterSpec& cluster = result.config.cluster();
  CHECK(cluster.addresses("ps") == Strings{"tf:1", "tf:2"});
  CHECK(cluster.addresses("worker").empty());
  CHECK(cluster.task_address() == std::optional<std::string>("tf:2"));

  // A TF_CONFIG without a task keeps the file's task.
  ParseResult cluster_only =
      parse({"--config", file}, {{"TF_CONFIG", R"({"cluster": {"ps": ["tf:1"]}})"}});
  REQUIRE(cluster_only.action == Action::kRun);
  CHECK(cluster_only.config.cluster().task_address() == std::optional<std::string>("tf:1"));
}

TEST_CASE("role names are normalized") {
  CHECK(normalize_role("chief") == "coordinator");
  CHECK(normalize_role("coordinator") == "coordinator");
  CHECK(normalize_role("ps") == "ps");
  CHECK(normalize_role("worker") == "worker");
  CHECK(normalize_role("dispatcher") == "data_dispatcher");
  CHECK(normalize_role("data_dispatcher") == "data_dispatcher");
  CHECK(normalize_role("data-dispatcher") == "data_dispatcher");
  CHECK(normalize_role("data_worker") == "data_worker");
  CHECK(normalize_role("data-worker") == "data_worker");
  CHECK(normalize_role("evaluator") == "evaluator");
}

TEST_CASE("help lists every key with its type, default and env var, and the sources") {
  for (const Strings& args : {Strings{"--help"}, Strings{"-h"}, Strings{"--prot", "--help"}}) {
    ParseResult result = parse(args, {{"CAPSTAN_PROT", "1"}});
    REQUIRE(result.action == Action::kHelp);
    const std::string& help = result.text;
    CHECK(help.find("test-daemon") != std::string::npos);
    CHECK(help.find("A daemon for tests.") != std::string::npos);
    for (const OptionSpec& spec : test_specs()) {
      std::string flag = "--" + spec.key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      std::string env = "CAPSTAN_" + spec.key;
      std::transform(env.begin(), env.end(), env.begin(), ::toupper);
      INFO(spec.key);
      CHECK(help.find(flag) != std::string::npos);
      CHECK(help.find(env) != std::string::npos);
      CHECK(help.find(spec.help) != std::string::npos);
    }
    CHECK(help.find("default: 8080") != std::string::npos);
    CHECK(help.find("INT") != std::string::npos);
    CHECK(help.find("--config") != std::string::npos);
    CHECK(help.find("--version") != std::string::npos);
    CHECK(help.find("TF_CONFIG") != std::string::npos);
    CHECK(help.find("TF_CONFIG wins") != std::string::npos);
    CHECK(help.find("2 for a configuration error") != std::string::npos);
  }
}

TEST_CASE("the version flag reports the program") {
  ParseResult result = parse({"--version"});
  REQUIRE(result.action == Action::kVersion);
  CHECK(result.text.starts_with("test-daemon "));
}

TEST_CASE("Config::set re-validates the value by type") {
  ParseResult result = parse({});
  REQUIRE(result.action == Action::kRun);
  Config config = std::move(result.config);

  config.set("port", "9090");
  CHECK(config.get_int("port") == 9090);
  CHECK(config.source("port") == "set");
  config.set("ps", "x:1,y:2");
  CHECK(config.get_list("ps") == Strings{"x:1", "y:2"});

  CHECK_THROWS_AS(config.set("port", "abc"), std::invalid_argument);
  CHECK_THROWS_WITH(config.set("port", "abc"), "key 'port': expected an integer, got 'abc'");
  CHECK(config.get_int("port") == 9090);  // unchanged by the failed set
  CHECK_THROWS_AS(config.set("verbose", "maybe"), std::invalid_argument);
  CHECK_THROWS_AS(config.set("nope", "1"), std::logic_error);
}

TEST_CASE("getters reject undeclared keys, wrong types and unset scalars") {
  ParseResult result = parse({});
  REQUIRE(result.action == Action::kRun);
  const Config& config = result.config;
  CHECK_THROWS_AS(config.get_int("nope"), std::logic_error);
  CHECK_THROWS_AS(config.get_string("port"), std::logic_error);
  CHECK_THROWS_AS(config.get_list("name"), std::logic_error);
  CHECK_THROWS_AS(config.get_string("name"), std::logic_error);  // unset
  CHECK_FALSE(config.has("nope"));
}

TEST_CASE("a bad spec table is a programming error") {
  auto with = [](OptionSpec spec) {
    std::vector<OptionSpec> specs = test_specs();
    specs.push_back(std::move(spec));
    return specs;
  };
  CHECK_THROWS_AS(parse({}, {}, with({"port", OptionType::kInt, "again", "1"})), std::logic_error);
  CHECK_THROWS_AS(parse({}, {}, with({"config", OptionType::kString, "", std::nullopt})),
                  std::logic_error);
  CHECK_THROWS_AS(parse({}, {}, with({"HttpPort", OptionType::kInt, "", std::nullopt})),
                  std::logic_error);
  CHECK_THROWS_AS(parse({}, {}, with({"retries", OptionType::kInt, "", "many"})),
                  std::logic_error);
}

TEST_CASE("error text stays on one line even for values with newlines") {
  CHECK(error_of(parse({}, {{"CAPSTAN_PORT", "1\n2"}})) ==
        "CAPSTAN_PORT: expected an integer, got '1\\n2'");
}

TEST_CASE("current_environment reads the process environment") {
  REQUIRE(::setenv("CAPSTAN_CONFIG_TEST_PROBE", "a=b", 1) == 0);
  const auto env = current_environment();
  ::unsetenv("CAPSTAN_CONFIG_TEST_PROBE");
  auto it = env.find("CAPSTAN_CONFIG_TEST_PROBE");
  REQUIRE(it != env.end());
  CHECK(it->second == "a=b");
}

TEST_CASE("advertise_address: HOST takes the bound port, HOST:PORT is kept, a bad value is named",
          "[config][advertise]") {
  CHECK(advertise_address("10.1.2.3", 7100).value() == "10.1.2.3:7100");
  CHECK(advertise_address("ps-0.ps.capstan.svc", 7100).value() == "ps-0.ps.capstan.svc:7100");
  CHECK(advertise_address("ps-0.ps:7101", 7100).value() == "ps-0.ps:7101");
  CHECK(advertise_address("fd00::7", 7100).value() == "[fd00::7]:7100");
  CHECK(advertise_address("[fd00::7]", 7100).value() == "[fd00::7]:7100");
  CHECK(advertise_address("[fd00::7]:9", 7100).value() == "[fd00::7]:9");
  for (const std::string bad : {"host:0", "host:99999", "host:x", "host:", ":7100", "a b", "http://x", "x:y:z",
                                "[fd00::7", "[foo]", "[10.0.0.1]:80", "foo]"}) {
    auto result = advertise_address(bad, 7100);
    INFO(bad);
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(result.status().message(), Catch::Contains("'" + bad + "'") && Catch::Contains("HOST:PORT"));
  }
}

// ---- Ranges -------------------------------------------------------------

std::vector<OptionSpec> ranged_specs() {
  return {
      OptionSpec{"port", OptionType::kInt, "port to listen on", "80"}.in_range(0, 65535),
      OptionSpec{"threads", OptionType::kInt, "worker threads", "0"}.at_least(0),
      OptionSpec{"offset", OptionType::kInt, "an offset", std::nullopt}.in_range(-5, 5),
      {"name", OptionType::kString, "task name", std::nullopt},
  };
}

TEST_CASE("an integer inside its range is accepted, ends included") {
  const std::vector<OptionSpec> specs = ranged_specs();
  for (const char* port : {"0", "80", "65535"}) {
    INFO(port);
    ParseResult result = parse({"--port", port}, {}, specs);
    REQUIRE(result.action == Action::kRun);
    CHECK(result.config.get_int("port") == std::stoll(port));
  }
  ParseResult result = parse({"--offset=-5", "--threads", "1000000"}, {}, specs);
  REQUIRE(result.action == Action::kRun);
  CHECK(result.config.get_int("offset") == -5);
  CHECK(result.config.get_int("threads") == 1000000);
}

TEST_CASE("an integer below or above its range is an error naming the source, the value and the range") {
  const std::vector<OptionSpec> specs = ranged_specs();
  CHECK(error_of(parse({"--port", "70000"}, {}, specs)) == "--port: 70000 is not in 0..65535");
  CHECK(error_of(parse({"--port=-1"}, {}, specs)) == "--port: -1 is not in 0..65535");
  CHECK(error_of(parse({"--offset", "6"}, {}, specs)) == "--offset: 6 is not in -5..5");
  CHECK(error_of(parse({"--offset=-6"}, {}, specs)) == "--offset: -6 is not in -5..5");
  CHECK(error_of(parse({"--threads=-1"}, {}, specs)) == "--threads: -1 is below the minimum 0");
}

TEST_CASE("a range is checked whatever the source") {
  TempDir dir;
  const std::vector<OptionSpec> specs = ranged_specs();
  CHECK(error_of(parse({}, {{"CAPSTAN_PORT", "65536"}}, specs)) == "CAPSTAN_PORT: 65536 is not in 0..65535");
  const std::string file = dir.write("c.yaml", "threads: -3\n");
  CHECK(error_of(parse({"--config", file}, {}, specs)) ==
        file + ": key 'threads': -3 is below the minimum 0");
  // A type error still reads as one, range or not.
  CHECK(error_of(parse({"--port", "many"}, {}, specs)) == "--port: expected an integer, got 'many'");
}

TEST_CASE("a range with only a maximum names it") {
  std::vector<OptionSpec> specs = {{"depth", OptionType::kInt, "depth", "1"}};
  specs[0].max = 8;
  CHECK(error_of(parse({"--depth", "9"}, {}, specs)) == "--depth: 9 is above the maximum 8");
  ParseResult help = parse({"--help"}, {}, specs);
  REQUIRE(help.action == Action::kHelp);
  CHECK(help.text.find("at most 8") != std::string::npos);
}

TEST_CASE("help shows each integer's range with its default") {
  ParseResult result = parse({"--help"}, {}, ranged_specs());
  REQUIRE(result.action == Action::kHelp);
  CHECK(result.text.find("default: 80; 0..65535") != std::string::npos);
  CHECK(result.text.find("default: 0; at least 0") != std::string::npos);
  CHECK(result.text.find("-5..5") != std::string::npos);
}

TEST_CASE("Config::set checks the range too") {
  ParseResult result = parse({}, {}, ranged_specs());
  REQUIRE(result.action == Action::kRun);
  Config config = std::move(result.config);
  config.set("port", "65535");
  CHECK(config.get_int("port") == 65535);
  CHECK_THROWS_WITH(config.set("port", "65536"), "key 'port': 65536 is not in 0..65535");
  CHECK(config.get_int("port") == 65535);  // unchanged by the failed set
}

TEST_CASE("a bad range in the spec table is a programming error") {
  auto with = [](OptionSpec spec) {
    std::vector<OptionSpec> specs = test_specs();
    specs.push_back(std::move(spec));
    return specs;
  };
  // On a key that is not an int.
  CHECK_THROWS_AS(parse({}, {}, with(OptionSpec{"label", OptionType::kString, "", ""}.at_least(1))),
                  std::logic_error);
  // Empty.
  CHECK_THROWS_AS(parse({}, {}, with(OptionSpec{"retries", OptionType::kInt, "", "1"}.in_range(5, 1))),
                  std::logic_error);
  // A default outside it.
  CHECK_THROWS_WITH(parse({}, {}, with(OptionSpec{"retries", OptionType::kInt, "", "0"}.at_least(1))),
                    "default of config key 'retries': 0 is below the minimum 1");
}

// ---- The common keys -----------------------------------------------------

RoleSpec test_role() {
  RoleSpec spec;
  spec.role = wire::Role::PS;
  spec.program = "ps-server";
  return spec;
}

ParseResult parse_common(const Strings& args, const Env& env = {}) {
  return parse(args, env, common_options());
}

TEST_CASE("every common integer key refuses a value outside its range") {
  const std::map<std::string, std::pair<std::string, std::string>> kOutside = {
      {"--port", {"-1", "65536"}},
      {"--http-port", {"-1", "65536"}},
      {"--task-index", {"-2", "2147483648"}},
      {"--threads", {"-1", "1025"}},
      {"--max-message-mib", {"0", "4097"}},
      {"--login-deadline-ms", {"0", "1000001"}},
      {"--max-pre-login-connections", {"0", "1000001"}},
      {"--max-pre-login-per-host", {"0", "1000001"}},
      {"--link-timeout-ms", {"-1", "3600001"}},
      {"--buffer-cache-mib", {"-1", ""}},
      {"--shutdown-grace-ms", {"-1", ""}},
  };
  for (const auto& [flag, values] : kOutside) {
    for (const std::string& value : {values.first, values.second}) {
      if (value.empty()) continue;
      INFO(flag << " " << value);
      const std::string message = error_of(parse_common({flag + "=" + value}));
      CHECK(message.starts_with(flag + ": " + value + " is "));
    }
  }
}

TEST_CASE("DaemonSettings reads the common keys once, typed") {
  ParseResult parsed = parse_common({"--port", "0", "--http-port", "8081", "--max-message-mib", "2",
                                     "--threads", "3", "--shutdown-grace-ms", "500", "--link-timeout-ms", "0",
                                     "--buffer-cache-mib", "1", "--task-index", "4", "--log-level", "debug"});
  REQUIRE(parsed.action == Action::kRun);
  Result<DaemonSettings> settings = DaemonSettings::from(test_role(), parsed.config);
  REQUIRE(settings.ok());
  CHECK(settings->port == 0);
  CHECK(settings->http_port == 8081);
  CHECK(settings->max_message_bytes == (uint64_t{2} << 20));
  CHECK(settings->threads == 3);
  CHECK(settings->shutdown_grace == std::chrono::milliseconds(500));
  CHECK(settings->link_timeout == std::chrono::milliseconds(0));
  CHECK(settings->login_deadline == std::chrono::milliseconds(10000));
  CHECK(settings->max_pre_login_connections == 1024);
  CHECK(settings->max_pre_login_per_host == 256);
  CHECK(settings->buffer_cache_bytes == (size_t{1} << 20));
  CHECK(settings->task_index == 4);
  CHECK(settings->log_level == spdlog::level::debug);
  CHECK(settings->host == "127.0.0.1");
  CHECK(settings->cluster_address.empty());
  CHECK_FALSE(settings->tls_server);
  CHECK(settings->peers.empty());
}

TEST_CASE("DaemonSettings takes the port from the cluster spec, else the role's") {
  ParseResult alone = parse_common({});
  REQUIRE(alone.action == Action::kRun);
  Result<DaemonSettings> role_port = DaemonSettings::from(test_role(), alone.config);
  REQUIRE(role_port.ok());
  CHECK(role_port->port == 7100);
  CHECK(role_port->task_index == -1);

  const Env tf = {{"TF_CONFIG", R"({"cluster": {"ps": ["10.0.0.1:7001", "10.0.0.2:7002"]},
                                    "task": {"type": "ps", "index": 1}})"}};
  ParseResult listed = parse_common({}, tf);
  REQUIRE(listed.action == Action::kRun);
  Result<DaemonSettings> from_cluster = DaemonSettings::from(test_role(), listed.config);
  REQUIRE(from_cluster.ok());
  CHECK(from_cluster->task_index == 1);
  CHECK(from_cluster->port == 7002);
  CHECK(from_cluster->cluster_address == "10.0.0.2:7002");
  CHECK(from_cluster->host == "0.0.0.0");  // others reach it at 10.0.0.2
}

TEST_CASE("DaemonSettings errors name the key and the value") {
  auto error = [](const Strings& args, const Env& env = {}) {
    ParseResult parsed = parse_common(args, env);
    REQUIRE(parsed.action == Action::kRun);
    Result<DaemonSettings> settings = DaemonSettings::from(test_role(), parsed.config);
    REQUIRE_FALSE(settings.ok());
    return settings.status().message();
  };
  CHECK(error({"--log-level", "loud"}) ==
        "log_level: 'loud' is not one of trace, debug, info, warn, error, critical, off");
  CHECK_THAT(error({"--token-file", "/nonexistent/capstan-token"}),
             Catch::StartsWith("token_file: ") && Catch::Contains("/nonexistent/capstan-token"));
  CHECK_THAT(error({"--advertise-address", "a b"}), Catch::Contains("'a b'"));
  CHECK(error({}, {{"TF_CONFIG", R"({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}})"}}) ==
        "cluster spec: task type 'worker' does not match ps-server (expects 'ps')");
  RoleSpec bad_peer = test_role();
  bad_peer.peers = [](const Config&) -> Result<std::vector<Peer>> {
    return std::vector<Peer>{{wire::Role::COORDINATOR, "no-port"}};
  };
  ParseResult parsed = parse_common({});
  REQUIRE(parsed.action == Action::kRun);
  Result<DaemonSettings> settings = DaemonSettings::from(bad_peer, parsed.config);
  REQUIRE_FALSE(settings.ok());
  CHECK_THAT(settings.status().message(), Catch::StartsWith("coordinator: "));
}

}  // namespace
}  // namespace capstan::daemon
