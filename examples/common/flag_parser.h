// Reading the command line of the example programs and the benchmarks;
// standard C++ only.
#ifndef CAPSTAN_EXAMPLES_COMMON_FLAG_PARSER_H_
#define CAPSTAN_EXAMPLES_COMMON_FLAG_PARSER_H_

#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace capstan::examples {

// A program's command line, read flag by flag (the example programs' and
// the benchmarks'):
//
//   FlagParser args(argc, argv, "[--coordinator HOST:PORT] [--steps N]");
//   while (args.next()) {
//     if (args.flag("--coordinator", &flags.coordinator) || args.flag("--steps", &flags.steps)) continue;
//     args.unknown();
//   }
//
// -h or --help prints the usage line on stdout and exits 0 (an answer); a
// flag without its value, a value of the wrong kind, or an unknown flag
// prints "PROGRAM: ERROR" and the usage line on stderr and exits 2.
class FlagParser {
 public:
  // `synopsis`: the flags, as the usage line lists them after the program.
  FlagParser(int argc, char** argv, std::string synopsis)
      : argc_(argc), argv_(argv), synopsis_(std::move(synopsis)) {}

  // Moves to the next flag, answering --help; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    name_ = argv_[i_];
    if (name_ == "-h" || name_ == "--help") usage("");
    return true;
  }

  // Whether the current flag is `name`; if so, reads its value (the next
  // argument) into *value: a string as it is, an integer that must be
  // non-negative, a double that must be positive. A bool is a switch: set
  // to true, no value.
  bool flag(const char* name, bool* value) {
    if (name_ != name) return false;
    *value = true;
    return true;
  }
  bool flag(const char* name, std::string* value) {
    if (name_ != name) return false;
    if (i_ + 1 >= argc_) usage("option " + name_ + " needs a value");
    *value = argv_[++i_];
    return true;
  }
  template <typename Int>
    requires std::is_integral_v<Int>
  bool flag(const char* name, Int* value) {
    std::string text;
    if (!flag(name, &text)) return false;
    char* end = nullptr;
    long long n = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || n < 0 ||
        static_cast<unsigned long long>(n) > static_cast<unsigned long long>(std::numeric_limits<Int>::max())) {
      usage(name_ + " needs a non-negative integer, got '" + text + "'");
    }
    *value = static_cast<Int>(n);
    return true;
  }
  bool flag(const char* name, double* value) {
    std::string text;
    if (!flag(name, &text)) return false;
    char* end = nullptr;
    double x = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(x > 0)) usage(name_ + " needs a positive number, got '" + text + "'");
    *value = x;
    return true;
  }

  [[noreturn]] void unknown() const { usage("unknown option '" + name_ + "'"); }

  // With an empty `error`, the answer to --help.
  [[noreturn]] void usage(const std::string& error) const {
    if (!error.empty()) std::cerr << argv_[0] << ": " << error << "\n";
    (error.empty() ? std::cout : std::cerr) << "usage: " << argv_[0] << " " << synopsis_ << "\n";
    std::exit(error.empty() ? 0 : 2);
  }

 private:
  const int argc_;
  char** const argv_;
  const std::string synopsis_;
  int i_ = 0;
  std::string name_;  // the current flag
};

}  // namespace capstan::examples

#endif  // CAPSTAN_EXAMPLES_COMMON_FLAG_PARSER_H_
