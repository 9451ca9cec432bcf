// The one place where Status meets kj::Exception.
//
// Servers throw to_exception(status); clients turn what they catch back with
// from_exception(). The exception type tells a Cap'n Proto caller whether to
// retry (DISCONNECTED: the peer is gone; OVERLOADED: back off; FAILED: don't),
// and the description carries "[capstan:CODE] message" so the exact code
// survives the trip. Retry logic reads the code, never the text. (A status
// carried as a value inside a reply is rpc/errors.h's.)
#ifndef CAPSTAN_LIB_ASYNC_STATUS_EXCEPTION_H_
#define CAPSTAN_LIB_ASYNC_STATUS_EXCEPTION_H_

#include <kj/exception.h>

#include "capstan/status.h"

namespace capstan::async {

kj::Exception to_exception(const Status& status);
[[noreturn]] void throw_status(const Status& status);
// Maps any exception (ours, Cap'n Proto's, a broken connection) to a Status.
Status from_exception(const kj::Exception& exception);

// True when `exception` does not carry a status the peer reported: the link
// broke, the peer is gone, or Cap'n Proto itself failed the call. A caller
// that gets false knows the peer is alive and answered with an error.
bool is_transport_failure(const kj::Exception& exception);

// Throws when `status` is not OK.
inline void check(const Status& status) {
  if (!status.ok()) throw_status(status);
}

}  // namespace capstan::async

#endif  // CAPSTAN_LIB_ASYNC_STATUS_EXCEPTION_H_
