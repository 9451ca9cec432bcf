// The path of a file of the build or the checkout for a test or bench: the
// build compiles in its place relative to the executable's directory
// (capstan_relative_path_definitions in CMakeLists.txt), resolved here
// against /proc/self/exe. Absolute paths compiled in would make each clone's
// objects differ, and ccache miss them.
#ifndef CAPSTAN_TESTS_BUILD_PATH_H_
#define CAPSTAN_TESTS_BUILD_PATH_H_

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace capstan::testing {

inline std::string build_path(const char* relative_to_executable) {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("build_path: cannot read /proc/self/exe: " + error.message());
  return (exe.parent_path() / relative_to_executable).lexically_normal().string();
}

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_BUILD_PATH_H_
