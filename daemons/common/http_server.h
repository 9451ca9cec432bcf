// A small HTTP/1.1 server for each daemon's /healthz, /readyz and /metrics,
// and a blocking client for tests and tools.
//
// Built on Boost.Beast. The server runs its own thread (one io_context, one
// thread), so it answers while the daemon's RPC loop is busy. It serves GET
// and HEAD on exact paths (the query string is ignored), keeps HTTP/1.1
// connections alive unless the client sends "Connection: close", and always
// sends Content-Length. At most 128 connections stay open (an eighth of the
// open-file limit when that is less, at least 4): a new one beyond that
// closes the oldest, so idle clients cannot lock out a health check.
//
// Replies it makes by itself:
//   400  malformed request line or headers, or headers over 8 KiB (closes)
//   404  no handler for the path, body "not found\n"
//   405  a method other than GET or HEAD (closes)
//   500  the handler threw; the body is the exception's text
// A connection idle for 30 s is closed.
//
// Example (in main()):
//   HttpServer http;
//   http.handle("/healthz", [] { return HttpResponse{200, {}, "ok\n"}; });
//   HttpStartResult started = http.start("127.0.0.1", 0);
//   if (!started.ok()) { /* log started.error, exit */ }

#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace capstan::daemon {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called on the server thread, never concurrently with itself, but it must be
// thread-safe with respect to the daemon's own threads. An exception it throws
// becomes a 500 reply.
using HttpHandler = std::function<HttpResponse()>;

struct HttpStartResult {
  uint16_t port = 0;  // the bound port, when ok()
  std::string error;  // "host:port: reason", when !ok()
  bool ok() const { return error.empty(); }
};

// HttpServer: handle() and start() before the server runs, then stop() (or
// the destructor); these are called from one owning thread, not concurrently.
// port() is safe from any thread.
class HttpServer {
 public:
  HttpServer();
  ~HttpServer();  // stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers "handler" for the exact "path" (e.g. "/metrics"), replacing any
  // earlier one. Must precede start().
  void handle(std::string path, HttpHandler handler);

  // Binds host:port (port 0 picks a free one), listens with SO_REUSEADDR and
  // starts the server thread. "host" is an IP address or a name resolved once
  // here. Call at most once per HttpServer.
  [[nodiscard]] HttpStartResult start(const std::string& host, uint16_t port);

  // Closes the listener and every open connection and joins the thread.
  // Idempotent; the port is free once it returns. A handler that is running
  // is waited for.
  void stop();

  // The bound port; 0 before a successful start().
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct HttpGetResult {
  int status = 0;
  std::string body;
  std::string error;  // non-empty if no complete response arrived
};

// Sends "GET path" with "Connection: close" and waits for the whole response,
// at most "timeout" in all (resolve, connect, send, receive). "path" must
// start with "/" and hold no spaces or control bytes. Blocking; thread-safe
// (each call uses its own io_context).
HttpGetResult http_get(const std::string& host, uint16_t port,
                       const std::string& path,
                       std::chrono::milliseconds timeout);

}  // namespace capstan::daemon
