// The communicator's device backend slot (DeviceCollectives): made once, on
// first use, for one device; interrupted by abort.
#include <catch2/catch.hpp>

#include "collectives/device_backend.h"

namespace capstan::collectives {
namespace {

// Records what the communicator routed to it.
class FakeBackend : public DeviceBackend {
 public:
  explicit FakeBackend(int device) : device_(device) {}
  int device() const override { return device_; }
  void interrupt(const Status& reason) override { interrupted = reason; }
  Status all_reduce(const void*, void*, int64_t count, DType, ReduceOp, void*) override {
    last = "all_reduce " + std::to_string(count);
    return interrupted.ok() ? Status::Ok() : interrupted;
  }
  Status broadcast(void*, int64_t, DType, int, void*) override { return Status::Ok(); }
  Status all_gather(const void*, void*, int64_t, DType, void*) override { return Status::Ok(); }
  Status reduce_scatter(const void*, void*, int64_t, DType, ReduceOp, void*) override { return Status::Ok(); }

  Status interrupted;
  std::string last;

 private:
  const int device_;
};

TEST_CASE("the device backend is made once, for the device of the first call") {
  int made = 0;
  DeviceCollectives device([&made](int ordinal) -> Result<std::unique_ptr<DeviceBackend>> {
    ++made;
    return std::unique_ptr<DeviceBackend>(new FakeBackend(ordinal));
  });
  auto first = device.backend(1);
  REQUIRE(first.ok());
  auto again = device.backend(1);
  REQUIRE(again.ok());
  CHECK(*first == *again);
  CHECK(made == 1);
  REQUIRE((*again)->all_reduce(nullptr, nullptr, 8, DType::kFloat32, ReduceOp::kSum, nullptr).ok());
  CHECK(static_cast<FakeBackend*>(*again)->last == "all_reduce 8");

  auto other = device.backend(0);
  REQUIRE(other.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(other.status().message(), Catch::Contains("use CUDA device 1, not 0"));
}

TEST_CASE("a backend that cannot be made reports why, and the next call tries again") {
  int tries = 0;
  DeviceCollectives device([&tries](int ordinal) -> Result<std::unique_ptr<DeviceBackend>> {
    if (++tries == 1) return Status::FailedPrecondition("no CUDA device here");
    return std::unique_ptr<DeviceBackend>(new FakeBackend(ordinal));
  });
  CHECK(device.backend(0).status().code() == StatusCode::kFailedPrecondition);
  CHECK(device.backend(0).ok());
  CHECK(tries == 2);
}

TEST_CASE("interrupting the device collectives fails the backend's operations with the reason") {
  DeviceCollectives device([](int ordinal) -> Result<std::unique_ptr<DeviceBackend>> {
    return std::unique_ptr<DeviceBackend>(new FakeBackend(ordinal));
  });
  device.interrupt(Status::Aborted("before any backend"));  // nothing to interrupt yet
  DeviceBackend* backend = device.backend(0).value();
  CHECK(backend->all_reduce(nullptr, nullptr, 1, DType::kFloat32, ReduceOp::kSum, nullptr).ok());
  device.interrupt(Status::Aborted("rank 0 aborted the group"));
  Status after = backend->all_reduce(nullptr, nullptr, 1, DType::kFloat32, ReduceOp::kSum, nullptr);
  CHECK(after.code() == StatusCode::kAborted);
  CHECK(after.message() == "rank 0 aborted the group");
}

}  // namespace
}  // namespace capstan::collectives
