#include "daemons/common/http_server.h"

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

namespace capstan::daemon {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using namespace std::chrono_literals;

constexpr auto kTimeout = 10s;  // generous: only a broken server hits it

HttpResponse ok_response(std::string body) {
  HttpResponse response;
  response.body = std::move(body);
  return response;
}

// A server on an ephemeral loopback port with /healthz and /boom.
struct TestServer {
  TestServer() {
    server.handle("/healthz", [] { return ok_response("ok\n"); });
    server.handle("/boom", []() -> HttpResponse {
      throw std::runtime_error("boom happened");
    });
    HttpStartResult started = server.start("127.0.0.1", 0);
    REQUIRE(started.ok());
    REQUIRE(started.port != 0);
    port = started.port;
  }
  HttpServer server;
  uint16_t port = 0;
};

// A raw TCP client whose reads give up after kTimeout, so that a misbehaving
// server fails the test instead of hanging it.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::address_v4::loopback(), port));
  }

  void send(std::string_view bytes) {
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()));
  }

  // Reads until the server closes the connection; returns all unread bytes.
  std::string read_until_closed() {
    while (read_some()) {
    }
    return std::exchange(received_, {});
  }

  // Reads one complete response (headers plus Content-Length bytes of body,
  // none for a reply to HEAD) and returns it.
  std::string read_response(bool head_request = false) {
    for (;;) {
      size_t head_end = received_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        size_t length_at = received_.find("Content-Length: ");
        REQUIRE(length_at < head_end);
        size_t length = std::stoul(received_.substr(length_at + 16));
        size_t total = head_end + 4 + (head_request ? 0 : length);
        if (received_.size() >= total) {
          std::string response = received_.substr(0, total);
          received_.erase(0, total);
          return response;
        }
      }
      REQUIRE(read_some());
    }
  }

 private:
  // Appends what arrives next to received_; false at EOF or error.
  bool read_some() {
    bool done = false;
    error_code error;
    size_t got = 0;
    socket_.async_read_some(
        asio::buffer(chunk_), [&done, &error, &got](error_code ec, size_t n) {
          done = true;
          error = ec;
          got = n;
        });
    io_.restart();
    io_.run_for(kTimeout);
    if (!done) {
      socket_.cancel();
      io_.restart();
      io_.run();
      FAIL("timed out waiting for the server");
    }
    received_.append(chunk_.data(), got);
    return !error;
  }

  asio::io_context io_;
  tcp::socket socket_;
  std::array<char, 4096> chunk_;
  std::string received_;
};

// Sends `request` on a connection of its own and returns all the server
// answers before it closes the connection.
std::string round_trip(uint16_t port, std::string_view request) {
  RawClient client(port);
  client.send(request);
  return client.read_until_closed();
}

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string body_of(const std::string& response) {
  return response.substr(response.find("\r\n\r\n") + 4);
}

TEST_CASE("HttpServer serves a handler on an ephemeral port", "[http]") {
  TestServer t;
  CHECK(t.server.port() == t.port);
  HttpGetResult result = http_get("127.0.0.1", t.port, "/healthz", kTimeout);
  CHECK(result.error == "");
  CHECK(result.status == 200);
  CHECK(result.body == "ok\n");
}

TEST_CASE("HttpServer ignores the query string", "[http]") {
  TestServer t;
  HttpGetResult result =
      http_get("127.0.0.1", t.port, "/healthz?verbose=1", kTimeout);
  CHECK(result.status == 200);
  CHECK(result.body == "ok\n");
}

TEST_CASE("HttpServer sends the handler's status and content type", "[http]") {
  HttpServer server;
  server.handle("/readyz", [] {
    return HttpResponse{503, "application/json", "{\"ready\":false}"};
  });
  HttpStartResult started = server.start("127.0.0.1", 0);
  REQUIRE(started.ok());
  RawClient client(started.port);
  client.send("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string response = client.read_response();
  CHECK(starts_with(response, "HTTP/1.1 503 Service Unavailable\r\n"));
  CHECK(response.find("Content-Type: application/json\r\n") != std::string::npos);
  CHECK(response.find("Content-Length: 15\r\n") != std::string::npos);
  CHECK(body_of(response) == "{\"ready\":false}");
}

TEST_CASE("HttpServer answers 404 for an unknown path", "[http]") {
  TestServer t;
  HttpGetResult result = http_get("127.0.0.1", t.port, "/nope", kTimeout);
  CHECK(result.error == "");
  CHECK(result.status == 404);
  CHECK(result.body == "not found\n");
  // The match is exact: no prefix or trailing-slash matching.
  CHECK(http_get("127.0.0.1", t.port, "/healthz/", kTimeout).status == 404);
}

TEST_CASE("HttpServer answers 405 to other methods and closes", "[http]") {
  TestServer t;
  std::string response = round_trip(
      t.port,
      "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  CHECK(starts_with(response, "HTTP/1.1 405 Method Not Allowed\r\n"));
  CHECK(response.find("Allow: GET, HEAD\r\n") != std::string::npos);
  CHECK(response.find("Connection: close\r\n") != std::string::npos);
}

TEST_CASE("HttpServer answers HEAD with Content-Length and no body",
          "[http]") {
  TestServer t;
  std::string response = round_trip(
      t.port, "HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(starts_with(response, "HTTP/1.1 200 OK\r\n"));
  CHECK(response.find("Content-Length: 3\r\n") != std::string::npos);
  CHECK(response.size() == response.find("\r\n\r\n") + 4);  // nothing after
}

TEST_CASE("HttpServer turns a handler exception into a 500", "[http]") {
  TestServer t;
  HttpGetResult result = http_get("127.0.0.1", t.port, "/boom", kTimeout);
  CHECK(result.status == 500);
  CHECK(result.body.find("boom happened") != std::string::npos);
  // The server survives it.
  CHECK(http_get("127.0.0.1", t.port, "/healthz", kTimeout).status == 200);
}

TEST_CASE("HttpServer rejects a handler's invalid status with a 500",
          "[http]") {
  HttpServer server;
  server.handle("/bad", [] { return HttpResponse{42, "text/plain", ""}; });
  HttpStartResult started = server.start("127.0.0.1", 0);
  REQUIRE(started.ok());
  HttpGetResult result = http_get("127.0.0.1", started.port, "/bad", kTimeout);
  CHECK(result.status == 500);
  CHECK(result.body.find("42") != std::string::npos);
}

TEST_CASE("HttpServer keeps HTTP/1.1 connections alive", "[http]") {
  TestServer t;
  RawClient client(t.port);
  client.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string first = client.read_response();
  CHECK(starts_with(first, "HTTP/1.1 200 OK\r\n"));
  CHECK(first.find("Connection: keep-alive\r\n") != std::string::npos);
  CHECK(body_of(first) == "ok\n");

  client.send("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string second = client.read_response();
  CHECK(starts_with(second, "HTTP/1.1 404 Not Found\r\n"));

  // Pipelined requests are answered in order.
  client.send(
      "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(starts_with(client.read_response(/*head_request=*/true),
                    "HTTP/1.1 200 OK\r\n"));
  std::string last = client.read_until_closed();
  CHECK(last.find("Connection: close\r\n") != std::string::npos);
  CHECK(body_of(last) == "ok\n");
}

TEST_CASE("HttpServer closes HTTP/1.0 connections unless asked not to",
          "[http]") {
  TestServer t;
  {
    std::string response = round_trip(t.port, "GET /healthz HTTP/1.0\r\n\r\n");
    CHECK(starts_with(response, "HTTP/1.1 200 OK\r\n"));
    CHECK(body_of(response) == "ok\n");
  }
  {
    RawClient client(t.port);
    client.send("GET /healthz HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    CHECK(client.read_response().find("Connection: keep-alive\r\n") !=
          std::string::npos);
    client.send("GET /healthz HTTP/1.0\r\n\r\n");
    CHECK(body_of(client.read_until_closed()) == "ok\n");
  }
}

TEST_CASE("HttpServer answers 400 to a malformed request and closes",
          "[http]") {
  TestServer t;
  const char* requests[] = {
      "GARBAGE\r\n\r\n",
      "GET /healthz\r\n\r\n",
      "GET  /healthz HTTP/1.1\r\n\r\n",
      "GET /healthz HTTP/2.0\r\n\r\n",
      "GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
      "GET /healthz HTTP/1.1\r\nContent-Length: x\r\n\r\n",
      "GET healthz HTTP/1.1\r\n\r\n",
  };
  for (const char* request : requests) {
    INFO(request);
    std::string response = round_trip(t.port, request);
    CHECK(starts_with(response, "HTTP/1.1 400 Bad Request\r\n"));
    CHECK(response.find("Connection: close\r\n") != std::string::npos);
  }
}

TEST_CASE("HttpServer answers 400 to headers over 8 KiB", "[http]") {
  TestServer t;
  std::string response = round_trip(
      t.port,
      "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n");
  CHECK(starts_with(response, "HTTP/1.1 400 Bad Request\r\n"));
  CHECK(body_of(response).find("8 KiB") != std::string::npos);

  // Just under the limit is fine.
  RawClient ok_client(t.port);
  ok_client.send("GET /healthz HTTP/1.1\r\nX-Big: " + std::string(8000, 'a') +
                 "\r\n\r\n");
  CHECK(starts_with(ok_client.read_response(), "HTTP/1.1 200 OK\r\n"));
}

TEST_CASE("HttpServer serves many sequential and concurrent requests",
          "[http]") {
  TestServer t;
  for (int i = 0; i < 200; ++i) {
    HttpGetResult result = http_get("127.0.0.1", t.port, "/healthz", kTimeout);
    REQUIRE(result.status == 200);
  }
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&ok, port = t.port] {
      for (int j = 0; j < 50; ++j) {
        if (http_get("127.0.0.1", port, "/healthz", kTimeout).status == 200) {
          ++ok;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(ok == 200);
}

TEST_CASE("HttpServer answers while another connection stays open idle",
          "[http]") {
  TestServer t;
  RawClient idle(t.port);
  idle.send("GET /hea");  // an incomplete request
  CHECK(http_get("127.0.0.1", t.port, "/healthz", kTimeout).status == 200);
}

TEST_CASE("HttpServer keeps answering when many idle connections are held open", "[http]") {
  TestServer t;
  // More idle, half-sent requests than the server keeps (128): the oldest
  // are closed to admit new ones, so a health check still gets through.
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(std::make_unique<RawClient>(t.port));
    idle.back()->send("GET /hea");
  }
  HttpGetResult result = http_get("127.0.0.1", t.port, "/healthz", kTimeout);
  CHECK(result.status == 200);
  CHECK(result.body == "ok\n");
  // The first of them was closed by the server.
  CHECK(idle.front()->read_until_closed().empty());
}

TEST_CASE("HttpServer start reports a port already in use", "[http]") {
  TestServer t;
  HttpServer second;
  HttpStartResult started = second.start("127.0.0.1", t.port);
  CHECK_FALSE(started.ok());
  CHECK(started.error.find("127.0.0.1:" + std::to_string(t.port) + ": ") == 0);
  CHECK(started.error.find("in use") != std::string::npos);
  // The first server is unaffected.
  CHECK(http_get("127.0.0.1", t.port, "/healthz", kTimeout).status == 200);
}

TEST_CASE("HttpServer start reports an unusable address", "[http]") {
  HttpServer server;
  HttpStartResult started = server.start("not an address", 0);
  CHECK_FALSE(started.ok());
  CHECK(started.error.find("not an address:0: ") == 0);
}

TEST_CASE("HttpServer start may be called only once", "[http]") {
  TestServer t;
  HttpStartResult again = t.server.start("127.0.0.1", 0);
  CHECK_FALSE(again.ok());
  CHECK(again.error.find("already started") != std::string::npos);
}

TEST_CASE("HttpServer stop is idempotent and releases the port", "[http]") {
  uint16_t port;
  {
    HttpServer first;
    first.handle("/healthz", [] { return ok_response("first\n"); });
    HttpStartResult started = first.start("127.0.0.1", 0);
    REQUIRE(started.ok());
    port = started.port;
    // Leave a connection in TIME_WAIT on the server side.
    CHECK(http_get("127.0.0.1", port, "/healthz", kTimeout).body == "first\n");
    first.stop();
    first.stop();
    CHECK(first.port() == port);
    CHECK_FALSE(http_get("127.0.0.1", port, "/healthz", kTimeout).error.empty());
  }  // the destructor stops again

  HttpServer second;
  second.handle("/healthz", [] { return ok_response("second\n"); });
  HttpStartResult started = second.start("127.0.0.1", port);
  REQUIRE(started.ok());
  CHECK(started.port == port);
  CHECK(http_get("127.0.0.1", port, "/healthz", kTimeout).body == "second\n");
}

TEST_CASE("HttpServer stop closes open connections promptly", "[http]") {
  TestServer t;
  RawClient client(t.port);
  client.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(body_of(client.read_response()) == "ok\n");
  auto begin = std::chrono::steady_clock::now();
  t.server.stop();  // must not wait for the 30 s idle timeout
  CHECK(std::chrono::steady_clock::now() - begin < 5s);
  CHECK(client.read_until_closed().empty());
}

TEST_CASE("HttpServer stop without start is harmless", "[http]") {
  HttpServer server;
  server.stop();
  CHECK(server.port() == 0);
}

TEST_CASE("http_get reports a refused connection", "[http]") {
  uint16_t port;
  {
    TestServer t;
    port = t.port;
  }
  HttpGetResult result = http_get("127.0.0.1", port, "/healthz", kTimeout);
  CHECK(result.status == 0);
  CHECK(result.error.find("127.0.0.1:" + std::to_string(port) + ": connect: ") ==
        0);
}

TEST_CASE("http_get rejects a path it cannot send", "[http]") {
  TestServer t;
  for (const char* path : {"", "healthz", "/a b", "/a\r\nX: y"}) {
    INFO(path);
    HttpGetResult result = http_get("127.0.0.1", t.port, path, kTimeout);
    CHECK(result.status == 0);
    CHECK(result.error.find("invalid path") != std::string::npos);
  }
}

TEST_CASE("http_get gives up after its timeout", "[http]") {
  // A listener that never accepts: the kernel completes the handshake, then
  // nothing answers.
  asio::io_context io;
  tcp::acceptor silent(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  uint16_t port = silent.local_endpoint().port();
  auto begin = std::chrono::steady_clock::now();
  HttpGetResult result = http_get("127.0.0.1", port, "/healthz", 200ms);
  CHECK(std::chrono::steady_clock::now() - begin < 5s);
  CHECK(result.status == 0);
  CHECK(result.error.find("timed out") != std::string::npos);
}

}  // namespace
}  // namespace capstan::daemon
