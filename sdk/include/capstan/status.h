// Status and Result<T>: how Capstan code reports errors.
//
// A Status is OK or carries a code and a message. The code says what the
// caller should do about it (after absl::StatusCode):
//   kUnavailable         the peer is gone or not reachable yet: retry the call
//   kResourceExhausted   overloaded or over a limit: back off, then retry
//   kAborted             a conflict: retry at a higher level
//   kFailedPrecondition  the system is not in a state to do this: fix it first
//   kDeadlineExceeded    the call took longer than its deadline
//   kCancelled           the caller (or an earlier error) cancelled the work
//   kInvalidArgument, kNotFound, kAlreadyExists, kOutOfRange, kUnimplemented,
//   kPermissionDenied, kUnauthenticated, kDataLoss, kInternal, kUnknown:
//                        do not retry
#ifndef CAPSTAN_STATUS_H_
#define CAPSTAN_STATUS_H_

#include "capstan/export.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace capstan CAPSTAN_API {

enum class StatusCode : int32_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "NOT_FOUND", "UNAVAILABLE", ... (the names TensorFlow and gRPC print).
std::string_view status_code_name(StatusCode code);
// Inverse of status_code_name(); nullopt for an unknown name.
std::optional<StatusCode> status_code_from_name(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status Unknown(std::string msg) { return {StatusCode::kUnknown, std::move(msg)}; }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) { return {StatusCode::kPermissionDenied, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status Unauthenticated(std::string msg) { return {StatusCode::kUnauthenticated, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: variable 'w' does not exist"; "OK" when ok.
  std::string to_string() const;

  // Returns a copy whose message is "context: message" (OK stays OK).
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Thrown by Result<T>::value() on an error Result and by the SDK's
// convenience wrappers; carries the Status.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status);
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// A value or an error Status (never an OK Status without a value).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : state_(std::move(status)) {  // NOLINT
    if (std::get<Status>(state_).ok()) {
      state_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(state_); }

  // Precondition for the unchecked accessors: ok().
  T& operator*() & { return std::get<T>(state_); }
  const T& operator*() const& { return std::get<T>(state_); }
  T operator*() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &std::get<T>(state_); }
  const T* operator->() const { return &std::get<T>(state_); }

  // Checked access: throws StatusError when there is no value.
  T& value() & {
    check();
    return std::get<T>(state_);
  }
  const T& value() const& {
    check();
    return std::get<T>(state_);
  }
  // On a temporary Result, by value (as operator* above): `for (auto& x :
  // f().value())` then iterates a value that lives for the loop, not a
  // reference into the dead temporary.
  T value() && {
    check();
    return std::get<T>(std::move(state_));
  }

 private:
  void check() const {
    if (!ok()) throw StatusError(std::get<Status>(state_));
  }
  std::variant<T, Status> state_;
};

}  // namespace capstan

// Returns early with the Status of `expr` when it is not OK.
#define CAPSTAN_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::capstan::Status capstan_status_ = (expr); \
    if (!capstan_status_.ok()) return capstan_status_; \
  } while (0)

#define CAPSTAN_CONCAT_INNER_(a, b) a##b
#define CAPSTAN_CONCAT_(a, b) CAPSTAN_CONCAT_INNER_(a, b)
// CAPSTAN_ASSIGN_OR_RETURN(auto x, f()): assigns the value or returns the error.
#define CAPSTAN_ASSIGN_OR_RETURN(lhs, expr) \
  CAPSTAN_ASSIGN_OR_RETURN_IMPL_(CAPSTAN_CONCAT_(capstan_result_, __LINE__), lhs, expr)
#define CAPSTAN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(*tmp)

#endif  // CAPSTAN_STATUS_H_
