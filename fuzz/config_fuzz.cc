// Daemon configuration: TF_CONFIG (JSON) and the YAML config file.
#include "daemons/common/config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capstan::daemon;
  static const std::vector<OptionSpec> specs = {
      {"port", OptionType::kInt, "port", "0"},
      {"ps", OptionType::kStringList, "parameter servers", ""},
      {"ratio", OptionType::kDouble, "a ratio", "0.5"},
      {"flag", OptionType::kBool, "a flag", "false"},
      {"name", OptionType::kString, "a name", ""},
  };
  std::string text = capstan::fuzz::as_string(data, size);
  const char* argv_env[] = {"fuzz"};
  (void)parse_config("fuzz", "fuzzing", specs, 1, argv_env, {{"TF_CONFIG", text}});
  capstan::fuzz::InputFile file(data, size);
  std::string path = file.path();
  const char* argv_file[] = {"fuzz", "--config", path.c_str()};
  (void)parse_config("fuzz", "fuzzing", specs, 3, argv_file, {});
  return 0;
}
