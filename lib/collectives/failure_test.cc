// What a failed group reports (verdict): the dead rank named, the live ones
// that vouched for themselves left out, a mismatch seen elsewhere kept.
#include <catch2/catch.hpp>

#include <cstring>

#include "collectives/failure.h"

namespace capstan::collectives {
namespace {

Notice notice_from(int from, StatusCode code, const std::string& message, std::vector<int> suspects) {
  Notice n;
  n.code = static_cast<int32_t>(code);
  n.from = from;
  for (int s : suspects) n.suspects[static_cast<size_t>(n.num_suspects++)] = s;
  std::strncpy(n.message.data(), message.c_str(), n.message.size() - 1);
  return n;
}

TEST_CASE("a suspect that stayed silent is named, one that sent a notice is not") {
  // Rank 0 timed out waiting for ranks 1 and 2; rank 1 answered (it was
  // waiting for 2 as well), rank 2 said nothing.
  std::vector<std::optional<Notice>> notices(3);
  notices[1] = notice_from(1, StatusCode::kUnavailable, "all_reduce did not finish", {2});
  Status got = verdict(Status::Unavailable("all_reduce did not finish within 100 ms"), {1, 2}, notices, {}, 0);
  REQUIRE(got.code() == StatusCode::kUnavailable);
  CHECK_THAT(got.message(), Catch::Contains("rank(s) 2 stopped responding or died") &&
                                Catch::Contains("did not finish within 100 ms"));
}

TEST_CASE("a rank whose control connection closed without a notice is named") {
  std::vector<std::optional<Notice>> notices(4);
  Status got = verdict(Status::Unavailable("rank 3 (x) closed its connection"), {}, notices, {3}, 0);
  CHECK_THAT(got.message(), Catch::Contains("rank(s) 3 stopped responding"));
}

TEST_CASE("a mismatch another rank reported wins over this rank's timeout") {
  std::vector<std::optional<Notice>> notices(2);
  notices[1] = notice_from(1, StatusCode::kInvalidArgument, "mismatched collective calls: ...", {});
  Status got = verdict(Status::Unavailable("barrier did not finish"), {1}, notices, {}, 0);
  REQUIRE(got.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(got.message(), Catch::Contains("mismatched collective calls") && Catch::Contains("reported by rank 1"));
}

TEST_CASE("with every suspect alive, the first failure is reported as it was") {
  std::vector<std::optional<Notice>> notices(2);
  notices[1] = notice_from(1, StatusCode::kAborted, "rank 1 aborted the group", {});
  Status first = Status::Aborted("rank 0 aborted the group");
  Status got = verdict(first, {1}, notices, {}, 0);
  CHECK(got.code() == StatusCode::kAborted);
  CHECK(got.message() == first.message());
}

TEST_CASE("a link failure says whether the peer closed its connection or what failed") {
  CHECK_THAT(link_failure(2, "10.0.0.5:41000", true, "sending to this rank", "eof").message(),
             Catch::Equals("rank 2 (10.0.0.5:41000) closed its connection (the process exited or was killed)"));
  CHECK_THAT(link_failure(1, "h:1", false, "receiving from this rank", "timed out").message(),
             Catch::Equals("rank 1 (h:1) failed while receiving from this rank: timed out"));
}

}  // namespace
}  // namespace capstan::collectives
