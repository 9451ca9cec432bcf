// Running heavy work off the KJ loop.
//
// run_on_pool() posts `func` to a Boost.Asio thread pool and returns a
// promise, on the calling loop thread, for its result. The result crosses
// back through a KJ cross-thread fulfiller, so nothing but the fulfiller is
// touched from the pool thread. Cancelling the promise does not stop `func`;
// its result is then dropped.
#ifndef CAPSTAN_SDK_SRC_RPC_POOL_H_
#define CAPSTAN_SDK_SRC_RPC_POOL_H_

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>

#include <exception>
#include <type_traits>

#include "rpc/errors.h"

namespace capstan::rpc {

template <typename Func>
auto run_on_pool(boost::asio::thread_pool& pool, Func func)
    -> kj::Promise<std::invoke_result_t<Func&>> {
  using T = std::invoke_result_t<Func&>;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
  boost::asio::post(pool, [fulfiller = kj::mv(paf.fulfiller), func = std::move(func)]() mutable {
    try {
      if constexpr (std::is_void_v<T>) {
        func();
        fulfiller->fulfill();
      } else {
        fulfiller->fulfill(func());
      }
    } catch (const kj::Exception& e) {
      fulfiller->reject(kj::cp(e));
    } catch (const std::exception& e) {
      fulfiller->reject(to_exception(Status::Internal(e.what())));
    }
  });
  return kj::mv(paf.promise);
}

}  // namespace capstan::rpc

#endif  // CAPSTAN_SDK_SRC_RPC_POOL_H_
