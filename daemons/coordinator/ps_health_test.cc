#include "daemons/coordinator/ps_health.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using testing::FakeParameterServers;
using State = PsHealth::State;

const kj::TimePoint kStart = kj::origin<kj::TimePoint>() + 1000 * kj::SECONDS;
constexpr std::chrono::milliseconds kRecovery{30000};

kj::TimePoint at_ms(int64_t ms) { return kStart + ms * kj::MILLISECONDS; }

// Two parameter servers, not reached yet; the first-contact window ends at 10 s.
struct Fixture {
  FakeParameterServers ps{2, /*up=*/false};
  PsHealth health{ps, at_ms(10000), kRecovery};
};

TEST_CASE("parameter servers not reached yet are waited for until the first-contact window ends",
          "[coordinator][ps_health]") {
  Fixture f;
  CHECK(f.health.status().code() == StatusCode::kUnavailable);
  CHECK(f.health.status().message().find("ps:0 at ps0:7000 is unreachable: not reached since") != std::string::npos);
  CHECK(f.health.first_contact_deadline(at_ms(0)) == std::optional<kj::TimePoint>(at_ms(10000)));
  CHECK(f.health.pause_deadline(/*recoverable=*/false, at_ms(0)) == std::optional<kj::TimePoint>(at_ms(10000)));
  CHECK_FALSE(f.health.first_contact_deadline(at_ms(10000)));
  CHECK_FALSE(f.health.pause_deadline(false, at_ms(10000)));
  f.health.set(0, State::kUp, Status::Ok(), at_ms(1));
  f.health.set(1, State::kUp, Status::Ok(), at_ms(2));
  CHECK(f.health.status().ok());
  CHECK_FALSE(f.health.first_contact_deadline(at_ms(3)));
  CHECK_FALSE(f.health.pause_deadline(false, at_ms(3)));
  CHECK(f.health.up_or_lost());
  CHECK(f.health.describe(0) == "up");
}

TEST_CASE("a parameter server that went down is waited for only when it can be recovered",
          "[coordinator][ps_health]") {
  Fixture f;
  f.health.set(0, State::kUp, Status::Ok(), at_ms(0));
  f.health.set(1, State::kUp, Status::Ok(), at_ms(0));
  f.health.set(1, State::kDown, Status::Ok(), at_ms(500));
  CHECK(f.health.status().message() == "parameter server ps:1 at ps1:7000 is unreachable");
  CHECK(f.health.describe(1) == "down (unreachable)");
  CHECK(f.health.down_since(1) == at_ms(500));
  CHECK_FALSE(f.health.pause_deadline(/*recoverable=*/false, at_ms(600)));
  CHECK(f.health.pause_deadline(/*recoverable=*/true, at_ms(600)) == std::optional<kj::TimePoint>(at_ms(30500)));
  CHECK_FALSE(f.health.pause_deadline(true, at_ms(30500)));
  CHECK_FALSE(f.health.up_or_lost());
  // Down again while down: the outage started at the first.
  f.health.set(1, State::kDown, Status::Ok(), at_ms(900));
  CHECK(f.health.down_since(1) == at_ms(500));
  f.health.set(1, State::kRecovering, Status::Ok(), at_ms(1000));
  CHECK(f.health.status().message() == "parameter server ps:1 at ps1:7000 is being restored from a checkpoint");
  CHECK(f.health.pause_deadline(false, at_ms(1000)) == std::optional<kj::TimePoint>(at_ms(30500)));
}

TEST_CASE("a lost parameter server fails calls with the status it was lost with, and waits for nothing",
          "[coordinator][ps_health]") {
  Fixture f;
  f.health.set(0, State::kUp, Status::Ok(), at_ms(0));
  f.health.set(1, State::kLost, Status::DataLoss("ps:1 came back empty"), at_ms(0));
  CHECK(f.health.status().code() == StatusCode::kDataLoss);
  CHECK(f.health.status().message() == "ps:1 came back empty");
  CHECK(f.health.describe(1) == "lost: ps:1 came back empty");
  CHECK_FALSE(f.health.pause_deadline(/*recoverable=*/true, at_ms(0)));
  CHECK(f.health.up_or_lost());
}

TEST_CASE("the generation goes up only when a parameter server enters or leaves up", "[coordinator][ps_health]") {
  Fixture f;
  CHECK(f.health.generation() == 0);
  f.health.set(0, State::kUp, Status::Ok(), at_ms(0));
  CHECK(f.health.generation() == 1);
  f.health.set(0, State::kUp, Status::Ok(), at_ms(1));
  CHECK(f.health.generation() == 1);
  f.health.set(0, State::kDown, Status::Ok(), at_ms(2));
  f.health.set(0, State::kRecovering, Status::Ok(), at_ms(3));
  CHECK(f.health.generation() == 2);
  f.health.set(0, State::kUp, Status::Ok(), at_ms(4));
  CHECK(f.health.generation() == 3);
  CHECK(f.health.ever_up(0));
  CHECK_FALSE(f.health.ever_up(1));
  CHECK(f.health.describe(1) == "down (never reached)");
}

}  // namespace
}  // namespace capstan::coordinator
