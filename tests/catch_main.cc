// The one Catch2 main shared by every test binary.
//
// A run whose filter matches no test case fails (Catch's --warn NoTests):
// ctest runs each test case by its name, and a name that no longer matches
// (renamed, or cut at a ';' by catch_discover_tests, which splits CMake
// lists there) must not pass without running anything.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (int status = session.applyCommandLine(argc, argv); status != 0) return status;
  auto& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoTests);
  return session.run();
}
