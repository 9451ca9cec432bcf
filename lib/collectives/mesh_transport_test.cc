// The mesh transport on its own, without the algorithms: two ranks (threads)
// form a mesh and exchange bytes over TCP streams or shared memory; a peer
// whose connections close is named in the failure.
#include <catch2/catch.hpp>

#include <thread>

#include "collectives/failure.h"
#include "collectives/mesh.h"
#include "collectives/mesh_transport.h"

namespace capstan::collectives {
namespace {

struct Rank {
  Rank(std::unique_ptr<CollectiveEndpoint> endpoint_in, std::vector<std::string> addresses, int rank,
       const CollectiveOptions& options)
      : endpoint(std::move(endpoint_in)),
        mesh(endpoint->impl().io, std::move(addresses), rank, options.tcp_streams),
        failure(mesh, 1, options.timeout),
        transport(mesh, failure, options) {}
  std::unique_ptr<CollectiveEndpoint> endpoint;
  Mesh mesh;
  GroupFailure failure;
  MeshTransport transport;
};

std::vector<std::unique_ptr<Rank>> form(int n, const CollectiveOptions& options) {
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    endpoints.push_back(CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(std::make_unique<Rank>(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, options));
  }
  std::vector<Status> formed(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&ranks, &formed, &options, r]() {
      Rank& me = *ranks[static_cast<size_t>(r)];
      formed[static_cast<size_t>(r)] = connect_mesh(me.mesh, me.endpoint->impl().acceptor, 1, options);
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : formed) REQUIRE(s.ok());
  return ranks;
}

Header call(size_t bytes) {
  Header h;
  h.kind = static_cast<uint32_t>(Kind::kBroadcast);
  h.sequence = 1;
  h.payload_bytes = static_cast<int64_t>(bytes);
  return h;
}

TEST_CASE("bytes exchanged over the mesh transport arrive whole, over TCP streams and over shared memory") {
  CollectiveOptions options;
  options.segment_bytes = 4096;
  options.tcp_streams = 3;
  options.timeout = std::chrono::milliseconds(20000);
  for (auto via : {CollectiveOptions::Transport::kTcp, CollectiveOptions::Transport::kSharedMemory}) {
    options.transport = via;
    auto ranks = form(2, options);
    const std::string expected_link = via == CollectiveOptions::Transport::kTcp ? "tcp" : "shm";
    CHECK(ranks[0]->mesh.transports[1] == expected_link);
    CHECK(ranks[0]->transport.landing_slots(1) == (via == CollectiveOptions::Transport::kTcp ? 3 : 0));
    const size_t bytes = 50000;  // 13 pieces, striped over the 3 streams
    std::vector<std::vector<std::byte>> out(2, std::vector<std::byte>(bytes)), in(2, std::vector<std::byte>(bytes));
    for (size_t i = 0; i < bytes; ++i) {
      out[0][i] = static_cast<std::byte>(i * 7);
      out[1][i] = static_cast<std::byte>(i * 13 + 1);
    }
    std::vector<Status> done(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r]() {
        const int peer = 1 - r;
        std::vector<Send> sends = {{peer, call(bytes), out[static_cast<size_t>(r)].data(), bytes}};
        std::vector<Recv> recvs = {{peer, call(bytes), in[static_cast<size_t>(r)].data(), bytes, nullptr}};
        done[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->transport.exchange(
            sends, recvs, Clock::now() + options.timeout);
      });
    }
    for (auto& t : threads) t.join();
    REQUIRE(done[0].ok());
    REQUIRE(done[1].ok());
    CHECK(in[0] == out[1]);
    CHECK(in[1] == out[0]);
  }
}

TEST_CASE("a peer whose connections close is named by the transport's failure, and the group is aborted") {
  CollectiveOptions options;
  options.timeout = std::chrono::milliseconds(20000);
  for (auto via : {CollectiveOptions::Transport::kTcp, CollectiveOptions::Transport::kSharedMemory}) {
    options.transport = via;
    auto ranks = form(2, options);
    ranks[1]->mesh.close_all();  // as if the process died
    std::vector<std::byte> place(64);
    std::vector<Send> sends;
    std::vector<Recv> recvs = {{1, call(place.size()), place.data(), place.size(), nullptr}};
    const auto started = Clock::now();
    Status got = ranks[0]->transport.exchange(sends, recvs, Clock::now() + options.timeout);
    REQUIRE(got.code() == StatusCode::kUnavailable);
    CHECK_THAT(got.message(), Catch::Contains("rank(s) 1 stopped responding or died") &&
                                  Catch::Contains("rank 1 (" + ranks[0]->mesh.address(1) + ") closed its connection"));
    CHECK(Clock::now() - started < std::chrono::seconds(10));  // not the deadline: the close was seen
    CHECK(ranks[0]->failure.aborted());
    CHECK(ranks[0]->transport.usable().code() == StatusCode::kAborted);
  }
}

}  // namespace
}  // namespace capstan::collectives
