#include "daemons/common/http_server.h"

#include <sys/resource.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
#include <optional>
#include <thread>

namespace capstan::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr size_t kHeaderLimit = 8 * 1024;
// Requests to health and metrics endpoints carry no body worth reading.
constexpr uint64_t kBodyLimit = 64 * 1024;
constexpr auto kIdleTimeout = std::chrono::seconds(30);
// Beyond this many open connections, the oldest is closed to admit a new
// one: idle or slow clients cannot take every descriptor, and a health check
// always gets through. Fewer under a low open-file limit: an eighth of it
// (at least 4), so a flood on this port leaves descriptors for the RPC
// port's peers and files.
constexpr size_t kMaxConnections = 128;

size_t max_connections() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kMaxConnections;
  return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur / 8), 4, kMaxConnections);
}

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

std::string host_port(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

// A complete reply: always HTTP/1.1, always Content-Length and Connection.
// For HEAD the body is dropped and Content-Length still gives its size.
Response make_response(int status, const std::string& content_type, std::string body, bool keep_alive,
                       bool head) {
  Response response;
  response.version(11);
  response.result(static_cast<unsigned>(status));
  response.set(http::field::content_type, content_type);
  response.set(http::field::connection, keep_alive ? "keep-alive" : "close");
  size_t length = body.size();
  if (!head) response.body() = std::move(body);
  response.content_length(length);
  return response;
}

Response text_response(int status, std::string body, bool keep_alive, bool head) {
  return make_response(status, "text/plain; charset=utf-8", std::move(body), keep_alive, head);
}

class Server;

// One client connection on the server thread: read a request, answer it,
// repeat while the client keeps the connection alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server& server) : stream_(std::move(socket)), server_(server) {}

  void start() { read(); }
  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(error_code ec);

  void write(Response response) {
    auto reply = std::make_shared<Response>(std::move(response));
    bool keep_alive = reply->keep_alive();
    stream_.expires_after(kIdleTimeout);
    http::async_write(stream_, *reply,
                      [self = shared_from_this(), reply, keep_alive](error_code ec, size_t) {
                        if (ec || !keep_alive) return self->close();
                        self->read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server& server_;
};

// The listener and the open sessions; everything here runs on the server
// thread except the constructor and the handler table, which is fixed
// before start().
class Server {
 public:
  explicit Server(asio::io_context& io) : acceptor_(io), retry_(io) {}

  std::map<std::string, HttpHandler> handlers;

  tcp::acceptor& acceptor() { return acceptor_; }

  void accept() {
    acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) admit(std::move(socket));
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
          ec == boost::system::errc::too_many_files_open_in_system) {
        // Out of descriptors: the waiting connection stays in the backlog and
        // the listener stays readable, so accepting again at once would spin
        // this thread. Retry shortly, when a descriptor may be free.
        retry_.expires_after(std::chrono::milliseconds(50));
        retry_.async_wait([this](error_code waited) {
          if (!waited && acceptor_.is_open()) accept();
        });
        return;
      }
      // Other errors (ECONNABORTED) are transient: keep accepting.
      accept();
    });
  }

  // Closes the listener and every session, so io.run() returns.
  void close_all() {
    error_code ignored;
    acceptor_.close(ignored);
    retry_.cancel();
    for (const std::weak_ptr<Session>& weak : sessions_) {
      if (auto session = weak.lock()) session->close();
    }
    sessions_.clear();
  }

  Response answer(const Request& request) const;

 private:
  void admit(tcp::socket socket) {
    sessions_.remove_if([](const std::weak_ptr<Session>& weak) { return weak.expired(); });
    while (sessions_.size() >= max_connections_) {
      if (auto oldest = sessions_.front().lock()) oldest->close();
      sessions_.pop_front();
    }
    auto session = std::make_shared<Session>(std::move(socket), *this);
    sessions_.push_back(session);
    session->start();
  }

  tcp::acceptor acceptor_;
  const size_t max_connections_ = max_connections();
  asio::steady_timer retry_;  // the accept retry after EMFILE
  std::list<std::weak_ptr<Session>> sessions_;
};

void Session::on_read(error_code ec) {
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
    return close();
  }
  if (ec == http::error::header_limit) {
    return write(text_response(400, "request headers over 8 KiB\n", false, false));
  }
  if (ec) return write(text_response(400, "malformed request: " + ec.message() + "\n", false, false));
  write(server_.answer(parser_->get()));
}

Response Server::answer(const Request& request) const {
  bool head = request.method() == http::verb::head;
  if (request.version() != 10 && request.version() != 11) {
    return text_response(400, "malformed request: HTTP version not supported\n", false, head);
  }
  std::string_view target(request.target().data(), request.target().size());
  if (target.empty() || target.front() != '/') {
    return text_response(400, "malformed request: the target must be a path\n", false, head);
  }
  if (request.method() != http::verb::get && !head) {
    Response response = text_response(405, "method not allowed\n", false, false);
    response.set(http::field::allow, "GET, HEAD");
    return response;
  }
  bool keep_alive = request.keep_alive();
  std::string path(target.substr(0, target.find('?')));
  auto it = handlers.find(path);
  if (it == handlers.end()) return text_response(404, "not found\n", keep_alive, head);
  HttpResponse reply;
  try {
    reply = it->second();
  } catch (const std::exception& e) {
    return text_response(500, std::string(e.what()) + "\n", keep_alive, head);
  } catch (...) {
    return text_response(500, "the handler failed\n", keep_alive, head);
  }
  if (reply.status < 100 || reply.status > 599) {
    return text_response(500, "the handler returned status " + std::to_string(reply.status) + "\n", keep_alive,
                         head);
  }
  return make_response(reply.status, reply.content_type, std::move(reply.body), keep_alive, head);
}

}  // namespace

struct HttpServer::Impl {
  asio::io_context io;
  Server server{io};
  std::thread thread;
  std::atomic<uint16_t> port{0};
  bool started = false;
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::handle(std::string path, HttpHandler handler) {
  impl_->server.handlers[std::move(path)] = std::move(handler);
}

HttpStartResult HttpServer::start(const std::string& host, uint16_t port) {
  HttpStartResult result;
  auto fail = [&result, &host, port](std::string_view what, const std::string& reason) {
    result.error = host_port(host, port) + ": " + std::string(what) + reason;
    return result;
  };
  if (impl_->started) return fail("", "server already started");

  error_code ec;
  tcp::resolver resolver(impl_->io);
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec) return fail("resolve: ", ec.message());
  if (endpoints.empty()) return fail("resolve: ", "no address");
  tcp::endpoint endpoint = endpoints.begin()->endpoint();

  tcp::acceptor& acceptor = impl_->server.acceptor();
  if (acceptor.open(endpoint.protocol(), ec); ec) return fail("socket: ", ec.message());
  acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec) {
    acceptor.close();
    return fail("bind: ", ec.message());
  }
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    acceptor.close();
    return fail("listen: ", ec.message());
  }
  impl_->port = acceptor.local_endpoint().port();
  impl_->started = true;
  impl_->server.accept();
  impl_->thread = std::thread([io = &impl_->io]() { io->run(); });
  result.port = impl_->port;
  return result;
}

void HttpServer::stop() {
  if (!impl_->thread.joinable()) return;
  asio::post(impl_->io, [server = &impl_->server]() { server->close_all(); });
  impl_->thread.join();
}

uint16_t HttpServer::port() const { return impl_->port; }

HttpGetResult http_get(const std::string& host, uint16_t port, const std::string& path,
                       std::chrono::milliseconds timeout) {
  HttpGetResult result;
  const std::string where = host_port(host, port);
  if (path.empty() || path.front() != '/' ||
      std::any_of(path.begin(), path.end(),
                  [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; })) {
    result.error = where + ": invalid path '" + path + "'";
    return result;
  }

  asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  Request request(http::verb::get, path, 11);
  request.set(http::field::host, where);
  request.set(http::field::connection, "close");
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256 << 20);
  auto fail = [&result, &where](std::string_view what, error_code ec) {
    result.error = where + ": " + std::string(what) + ec.message();
  };

  stream.expires_after(timeout);
  resolver.async_resolve(host, std::to_string(port), tcp::resolver::numeric_service,
                         [&](error_code ec, tcp::resolver::results_type endpoints) {
    if (ec) return fail("resolve: ", ec);
    stream.async_connect(endpoints, [&](error_code ec, const tcp::endpoint&) {
      if (ec) return fail(ec == beast::error::timeout ? "timed out: " : "connect: ", ec);
      http::async_write(stream, request, [&](error_code ec, size_t) {
        if (ec) return fail(ec == beast::error::timeout ? "timed out: " : "write: ", ec);
        http::async_read(stream, buffer, parser, [&](error_code ec, size_t) {
          if (ec == beast::error::timeout) return fail("timed out: ", ec);
          if (ec) {
            result.error = where + ": malformed or truncated response (" + ec.message() + ")";
            return;
          }
          result.status = static_cast<int>(parser.get().result_int());
          result.body = std::move(parser.get().body());
        });
      });
    });
  });
  // The stream's deadline bounds connect, write and read; the resolver has
  // none of its own, so the run itself is bounded too.
  io.run_for(timeout + std::chrono::milliseconds(100));
  if (!io.stopped()) {
    resolver.cancel();
    stream.close();
    io.run();
    if (result.status == 0 && result.error.empty()) {
      result.error = where + ": timed out after " + std::to_string(timeout.count()) + " ms";
    }
  }
  if (result.error.find("timed out: ") != std::string::npos) {
    result.error = where + ": timed out after " + std::to_string(timeout.count()) + " ms";
  }
  return result;
}

}  // namespace capstan::daemon
