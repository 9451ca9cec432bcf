// Modules: shared libraries that register functions, loaded at run time.
#include <catch2/catch.hpp>

#include "capstan/data/dataset.h"
#include "capstan/functions.h"
#include "data/test_util.h"
#include "tests/build_path.h"

namespace capstan::data {
namespace {

using testing::drain_ints;

}  // namespace

TEST_CASE("a module's functions run in pipelines", "[data][module]") {
  FunctionRegistry fns;
  REQUIRE(fns.load_module(capstan::testing::build_path(CAPSTAN_TEST_MODULE)).ok());
  CHECK(fns.names() == std::vector<std::string>{"filter:below_five", "interleave:twice", "map:plus_one"});
  auto ds = Dataset::range(6).map(Fn::named("plus_one")).filter(Fn::named("below_five"))
                .interleave(Fn::named("twice"), 1);
  CHECK(drain_ints(ds, &fns) == std::vector<int64_t>{1, 1, 2, 2, 3, 3, 4, 4});
}

TEST_CASE("loading a missing module names the path", "[data][module]") {
  FunctionRegistry fns;
  Status s = fns.load_module("/nonexistent/libnothing.so");
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("/nonexistent/libnothing.so"));
}

TEST_CASE("a library without the module entry point is refused", "[data][module]") {
  FunctionRegistry fns;
  Status s = fns.load_module("libz.so.1");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("CAPSTAN_MODULE"));
}

}  // namespace capstan::data
