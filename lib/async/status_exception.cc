#include "async/status_exception.h"

#include <optional>
#include <string>
#include <string_view>

namespace capstan::async {
namespace {

constexpr std::string_view kMarker = "[capstan:";

kj::Exception::Type exception_type(StatusCode code) {
  switch (code) {
    case StatusCode::kUnavailable: return kj::Exception::Type::DISCONNECTED;
    case StatusCode::kResourceExhausted: return kj::Exception::Type::OVERLOADED;
    case StatusCode::kUnimplemented: return kj::Exception::Type::UNIMPLEMENTED;
    default: return kj::Exception::Type::FAILED;
  }
}

// The status a peer put into an exception's description, if it did.
std::optional<Status> reported_status(std::string_view text) {
  size_t at = text.find(kMarker);
  if (at == std::string_view::npos) return std::nullopt;
  size_t close = text.find("] ", at);
  if (close == std::string_view::npos) return std::nullopt;
  auto name = text.substr(at + kMarker.size(), close - at - kMarker.size());
  auto code = status_code_from_name(name);
  if (!code) return std::nullopt;
  return Status(*code, std::string(text.substr(close + 2)));
}

}  // namespace

bool is_transport_failure(const kj::Exception& exception) {
  return !reported_status(exception.getDescription().cStr()).has_value();
}

kj::Exception to_exception(const Status& status) {
  std::string text(kMarker);
  text += status_code_name(status.code());
  text += "] ";
  text += status.message();
  return kj::Exception(exception_type(status.code()), __FILE__, __LINE__,
                       kj::heapString(text.data(), text.size()));
}

void throw_status(const Status& status) { kj::throwFatalException(to_exception(status)); }

Status from_exception(const kj::Exception& exception) {
  std::string_view text(exception.getDescription().cStr());
  if (auto reported = reported_status(text)) return *reported;
  // Not one of ours: a transport failure or a Cap'n Proto error.
  std::string message(text);
  switch (exception.getType()) {
    case kj::Exception::Type::DISCONNECTED: return Status::Unavailable(message);
    case kj::Exception::Type::OVERLOADED: return Status::ResourceExhausted(message);
    case kj::Exception::Type::UNIMPLEMENTED: return Status::Unimplemented(message);
    case kj::Exception::Type::FAILED: return Status::Internal(message);
  }
  return Status::Unknown(message);
}

}  // namespace capstan::async
