// A worker's replicas without any RPC: several Replicas (as several
// workers would hold) in one process, formed into groups on loopback as the
// coordinator would drive them.
#include "daemons/worker_server/replicas.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/mirrored_files.h"
#include "collectives/test_group.h"
#include "io/testing.h"

namespace capstan::worker_server {
namespace {

using capstan::testing::on_all;

std::vector<training::MirroredSpec> specs() {
  return {{"w", DType::kFloat32, {2}, Optimizer::adam(0.1)}};
}

training::MirroredState seed_state() {
  training::MirroredState state;
  state.step = 3;
  state.variables.push_back({"w", Tensor::from_vector<float>({1, 2}, {2}).value(), {}});
  return state;
}

// Prepares every member for `epoch`, then forms them at once; `at_source`
// changes the source's request (a seed from a checkpoint).
std::vector<Result<training::ReplicaReport>> form(std::vector<Replicas*> members, int64_t epoch, int source,
                                                  std::optional<training::MirroredState> seed,
                                                  std::function<void(training::ReplicaForm&)> at_source = {}) {
  std::vector<std::string> addresses;
  for (Replicas* r : members) addresses.push_back(r->prepare("s", epoch).value());
  const int n = static_cast<int>(members.size());
  return on_all<Result<training::ReplicaReport>>(n, [&](int rank) {
    training::ReplicaForm f;
    f.strategy = "s";
    f.epoch = epoch;
    f.rank = rank;
    f.addresses = addresses;
    f.source = source;
    f.specs = specs();
    if (rank == source) f.seed = seed;
    if (rank == source && at_source) at_source(f);
    f.settings.timeout = std::chrono::milliseconds(10000);
    return members[static_cast<size_t>(rank)]->form(f);
  });
}

Status step(Replicas& r, int64_t epoch, float gradient) {
  CAPSTAN_ASSIGN_OR_RETURN(auto lease, r.acquire("s", epoch));
  return lease.variables().apply_gradients({Tensor::from_vector<float>({gradient, -gradient}, {2}).value()});
}

TEST_CASE("replicas form from a seed, step together, and a new member takes the survivors' state",
          "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1"), c("127.0.0.1");
  CHECK_FALSE(a.status("s").holds);
  auto formed = form({&a, &b}, 1, 0, seed_state());
  for (auto& r : formed) REQUIRE(r.ok());
  CHECK(formed[0]->checksum == formed[1]->checksum);
  CHECK(formed[1]->step == 3);
  CHECK(formed[0]->transports == std::vector<std::string>{"self", "shm"});
  auto read = b.read("s").value();
  CHECK(read.step == 3);
  CHECK(read.variables.at(0).value.equals(Tensor::from_vector<float>({1, 2}, {2}).value()));
  CHECK(read.variables.at(0).slots.count("m") == 1);  // Adam's slots, fresh

  // Two steps, each replica with its own gradient: the mean is applied.
  for (int i = 0; i < 2; ++i) {
    auto stepped = on_all<Status>(2, [&](int rank) { return step(rank == 0 ? a : b, 1, rank == 0 ? 1.0f : 3.0f); });
    for (const auto& s : stepped) REQUIRE(s.ok());
  }
  CHECK(a.status("s").checksum == b.status("s").checksum);
  CHECK(a.status("s").step == 5);
  // A step for another epoch is refused.
  CHECK(a.acquire("s", 7).status().code() == StatusCode::kFailedPrecondition);

  // c joins (holding nothing) with b as the source; a keeps its values.
  auto three = form({&a, &b, &c}, 2, 1, std::nullopt);
  for (auto& r : three) REQUIRE(r.ok());
  CHECK(c.status("s").holds);
  CHECK(c.status("s").checksum == a.status("s").checksum);
  CHECK(c.status("s").step == 5);
  auto stepped = on_all<Status>(3, [&](int rank) {
    Replicas* members[] = {&a, &b, &c};
    return step(*members[rank], 2, 0.5f);
  });
  for (const auto& s : stepped) REQUIRE(s.ok());
  CHECK(c.status("s").checksum == b.status("s").checksum);
}

TEST_CASE("abort() of the epoch fails a step waiting for a missing member at once", "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1");
  for (auto& r : form({&a, &b}, 1, 0, seed_state())) REQUIRE(r.ok());
  auto started = std::chrono::steady_clock::now();
  std::thread supervisor([&]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.abort("s", 2, Status::Unavailable("not this epoch"));  // another epoch: ignored
    a.abort("s", 1, Status::Unavailable("worker of replica 1 was lost"));
  });
  Status lonely = step(a, 1, 1.0f);  // b never steps
  supervisor.join();
  CHECK_FALSE(lonely.ok());
  CHECK_THAT(lonely.message(), Catch::Contains("was lost"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("forming refuses a source that holds nothing, an unprepared epoch and bad arguments", "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1");
  auto empty = form({&a, &b}, 1, 0, std::nullopt);
  for (auto& r : empty) {
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("holds no replica"));
  }
  CHECK_FALSE(a.status("s").holds);
  training::ReplicaForm f;
  f.strategy = "s";
  f.epoch = 9;
  f.addresses = {"127.0.0.1:1"};
  f.specs = specs();
  CHECK(a.form(f).status().code() == StatusCode::kFailedPrecondition);  // not prepared for epoch 9
  f.rank = 3;
  CHECK(a.form(f).status().code() == StatusCode::kInvalidArgument);
  CHECK(a.prepare("", 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(a.read("nothing").status().code() == StatusCode::kNotFound);
  CHECK(a.acquire("nothing", 1).status().code() == StatusCode::kFailedPrecondition);
}

// Commits a checkpoint at `step` in `dir` holding what `r` writes of
// strategy "s" (the coordinator's part: the manifest from the answer).
Result<std::string> save_checkpoint(Replicas& r, const std::string& dir, int64_t step) {
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, checkpoint::CheckpointWriter::begin(dir, step, 3));
  CAPSTAN_ASSIGN_OR_RETURN(training::SavedReplica saved, r.save("s", writer->path()));
  checkpoint::Manifest manifest;
  CAPSTAN_ASSIGN_OR_RETURN(manifest.variables, checkpoint::mirrored_manifest_entries(saved, specs()));
  std::string path = writer->checkpoint_path();
  CAPSTAN_RETURN_IF_ERROR(writer->commit(std::move(manifest), {{saved.file, saved.size, saved.crc32c}}));
  return path;
}

TEST_CASE("a replica writes its values, slots and step, and a group seeded from that checkpoint takes them",
          "[replicas][checkpoint]") {
  io::testing::TempDir dir;
  Replicas a("127.0.0.1"), b("127.0.0.1");
  for (auto& r : form({&a, &b}, 1, 0, seed_state())) REQUIRE(r.ok());
  for (int i = 0; i < 2; ++i) {
    auto stepped = on_all<Status>(2, [&](int rank) { return step(rank == 0 ? a : b, 1, 1.0f + rank); });
    for (const auto& s : stepped) REQUIRE(s.ok());
  }
  auto before = a.read("s").value();
  REQUIRE(before.step == 5);
  auto path = save_checkpoint(a, dir.path(), 5);
  REQUIRE(path.ok());
  // The file is the worker's, named for the strategy; the manifest has the
  // slots and the step.
  auto reader = checkpoint::CheckpointReader::open(*path).value();
  const auto* w = reader->manifest().find_variable("w");
  REQUIRE(w != nullptr);
  CHECK(w->shards.at(0).file == "mirrored-s.safetensors");
  CHECK(w->slots == std::vector<std::string>{"m", "v"});
  CHECK(w->optimizer_step == 5);
  CHECK(w->optimizer.kind == Optimizer::adam(0.1).kind);

  // Two fresh workers, seeded from the checkpoint's path (no values sent).
  Replicas c("127.0.0.1"), d("127.0.0.1");
  auto formed = form({&c, &d}, 1, 0, std::nullopt, [&](training::ReplicaForm& f) {
    f.seed_checkpoint = *path;
    f.seed_from_checkpoint = {"w"};
  });
  for (auto& r : formed) REQUIRE(r.ok());
  auto after = d.read("s").value();
  CHECK(after.step == 5);
  REQUIRE(after.variables.size() == 1);
  CHECK(after.variables[0].value.equals(before.variables[0].value));
  REQUIRE(after.variables[0].slots.size() == 2);
  CHECK(after.variables[0].slots.at("m").equals(before.variables[0].slots.at("m")));
  CHECK(after.variables[0].slots.at("v").equals(before.variables[0].slots.at("v")));
  CHECK(c.status("s").checksum == a.status("s").checksum);  // values, slots and step
  CHECK(d.status("s").checksum == a.status("s").checksum);
}

TEST_CASE("a replica writes only into a checkpoint being saved, never over a file, and only what it holds",
          "[replicas][checkpoint]") {
  io::testing::TempDir dir;
  Replicas a("127.0.0.1"), b("127.0.0.1");
  CHECK(a.save("s", dir.path()).status().code() == StatusCode::kNotFound);  // holds nothing
  for (auto& r : form({&a, &b}, 1, 0, seed_state())) REQUIRE(r.ok());
  auto elsewhere = a.save("s", dir.path());
  CHECK(elsewhere.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(elsewhere.status().message(), Catch::Contains("ckpt-<step>.tmp"));
  CHECK(a.save("s", dir.file("ckpt-3.tmp")).status().code() == StatusCode::kNotFound);  // not made
  auto writer = checkpoint::CheckpointWriter::begin(dir.path(), 3, 3).value();
  auto saved = a.save("s", writer->path());
  REQUIRE(saved.ok());
  CHECK(saved->file == "mirrored-s.safetensors");
  CHECK(saved->step == 3);
  REQUIRE(saved->variables.size() == 1);
  CHECK(saved->variables[0].shape == Shape{2});
  CHECK(saved->variables[0].slots == std::vector<std::string>{"m", "v"});
  CHECK(b.save("s", writer->path()).status().code() == StatusCode::kAlreadyExists);
  CHECK(a.save("other", writer->path()).status().code() == StatusCode::kNotFound);
}

TEST_CASE("a seed that cannot be read from its checkpoint fails the formation on every member",
          "[replicas][checkpoint]") {
  io::testing::TempDir dir;
  Replicas a("127.0.0.1"), b("127.0.0.1");
  for (auto& r : form({&a, &b}, 1, 0, seed_state())) REQUIRE(r.ok());
  auto path = save_checkpoint(a, dir.path(), 3);
  REQUIRE(path.ok());
  Replicas c("127.0.0.1"), d("127.0.0.1");
  auto missing = form({&c, &d}, 1, 0, std::nullopt, [&](training::ReplicaForm& f) {
    f.seed_checkpoint = dir.file("ckpt-404");
    f.seed_from_checkpoint = {"w"};
  });
  CHECK(missing[0].status().code() == StatusCode::kNotFound);
  CHECK(missing[1].status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing[1].status().message(), Catch::Contains("could not read its seed"));
  CHECK_FALSE(c.status("s").holds);
  CHECK_FALSE(d.status("s").holds);
  // A damaged value: the CRC32C check refuses it.
  {
    const std::string file = *path + "/mirrored-s.safetensors";
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, -1, SEEK_END);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  auto damaged = form({&c, &d}, 2, 0, std::nullopt, [&](training::ReplicaForm& f) {
    f.seed_checkpoint = *path;
    f.seed_from_checkpoint = {"w"};
  });
  CHECK(damaged[0].status().code() == StatusCode::kDataLoss);
  CHECK(damaged[1].status().code() == StatusCode::kDataLoss);
}

}  // namespace
}  // namespace capstan::worker_server
