#include "daemons/coordinator/reported_scalars.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

namespace capstan::coordinator {
namespace {

TEST_CASE("a tag keeps its last kPoints points, oldest first", "[coordinator][status]") {
  ReportedScalars scalars;
  for (int step = 1; step <= 650; ++step) REQUIRE(scalars.add({{"loss", 1.0 / step, step}}, 1000.0 + step).ok());
  const auto& loss = scalars.points().at("loss");
  REQUIRE(loss.size() == ReportedScalars::kPoints);
  CHECK(loss.front().step == 51);
  CHECK(loss.front().unix_seconds == 1051.0);
  CHECK(loss.back().value == Approx(1.0 / 650));
}

TEST_CASE("a batch with a bad scalar is refused whole, naming it", "[coordinator][status]") {
  ReportedScalars scalars;
  Status empty = scalars.add({{"loss", 1, 1}, {"", 2, 1}}, 0);
  CHECK(empty.code() == StatusCode::kInvalidArgument);
  Status nan = scalars.add({{"loss", 1, 1}, {"acc", std::nan(""), 1}}, 0);
  CHECK(nan.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(nan.message(), Catch::Contains("'acc'"));
  Status long_tag = scalars.add({{std::string(129, 'x'), 1, 1}}, 0);
  CHECK_THAT(long_tag.message(), Catch::Contains("129 bytes"));
  CHECK(scalars.points().empty());
}

TEST_CASE("a new tag past kTags is ResourceExhausted, the tags kept take more points", "[coordinator][status]") {
  ReportedScalars scalars;
  for (size_t i = 0; i < ReportedScalars::kTags; ++i) {
    REQUIRE(scalars.add({{"t" + std::to_string(i), 1, 1}}, 0).ok());
  }
  Status more = scalars.add({{"t0", 2, 2}, {"one too many", 1, 1}}, 0);
  CHECK(more.code() == StatusCode::kResourceExhausted);
  CHECK(scalars.points().at("t0").size() == 1);  // nothing of the refused batch kept
  REQUIRE(scalars.add({{"t0", 2, 2}}, 0).ok());
  CHECK(scalars.points().at("t0").size() == 2);
}

}  // namespace
}  // namespace capstan::coordinator
