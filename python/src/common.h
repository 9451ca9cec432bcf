// What the binding files of capstan._capstan share (internal to the
// extension module): Status to Python exceptions, tensors to and from numpy,
// blocking calls that Ctrl-C interrupts, and the client options every
// connecting call takes. The conventions they follow are in
// capstan_module.cc.
#ifndef CAPSTAN_PYTHON_SRC_COMMON_H_
#define CAPSTAN_PYTHON_SRC_COMMON_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file: the same casters for std types everywhere

#include <capstan/client.h>
#include <capstan/status.h>
#include <capstan/tensor.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace capstan::python {

namespace py = pybind11;

// ---- Errors (errors.cc translates StatusError to capstan.<Code>Error) ----------------

struct StatusError {
  Status status;
};

[[noreturn]] inline void raise(const Status& status) { throw StatusError{status}; }

template <typename T>
T value_or_raise(Result<T> result) {
  if (!result.ok()) raise(result.status());
  return std::move(*result);
}
inline void check(const Status& status) {
  if (!status.ok()) raise(status);
}

// ---- Tensors and numpy --------------------------------------------------------------

// The Capstan dtype of a numpy dtype (bytes and str: a string tensor);
// InvalidArgument for one it has none for.
DType capstan_dtype(const py::dtype& dtype);

// A read-only capstan.Array (a numpy array that exports DLPack) over the
// tensor's buffer; its base keeps the tensor. A string tensor comes out as
// a plain object array of bytes (a copy).
py::object to_numpy(const Tensor& t);

// Whatever np.asarray takes, or any DLPack producer in host memory (through
// numpy.from_dlpack), copied once into a Tensor.
Tensor to_tensor(const py::handle& value);

// Drops one reference to `object` from any thread, with or without the GIL
// (a collective's thread, a DLPack consumer's deleter); while the
// interpreter exits, leaves it.
void release_from_any_thread(PyObject* object);

// The same, without the copy where it can (a native-order array of numbers:
// the tensor reads the array's memory, and holds the array until it is
// dropped): for calls that read their input only while they run (the
// collectives), never for one that keeps it (a dataset, a variable).
Tensor borrow_tensor(const py::handle& value);

// An Element as a tuple of arrays.
py::tuple element_to_python(const Element& e);

// A tuple or list of arrays (or one array; None: no components) as an Element.
Element element_from_python(const py::handle& value);

// ---- Blocking calls that Ctrl-C interrupts ------------------------------------------

// Remembers the calling thread (the module's import runs on the interpreter's
// main thread) as the only one Python runs signal handlers on.
void remember_main_thread();

// A thread that comes back to Python while the interpreter exits would be
// killed taking the GIL (inside a destructor that may not throw): it stays
// here instead, asleep, until the process ends.
void park_if_finalizing(py::gil_scoped_release& release);

// Whether a signal handler raised (KeyboardInterrupt): checked with the GIL
// taken for a moment, on the main thread only (elsewhere it cannot fire).
bool interrupted(py::gil_scoped_release& release);

// Waits until `ready()` with the GIL released; on the main thread every
// 50 ms it checks for signals, and a handler that raises ends the wait
// (error_already_set, with the GIL held again).
template <typename Ready>
void wait_interruptibly(Ready ready) {
  using namespace std::chrono_literals;
  bool raised = false;
  {
    py::gil_scoped_release release;
    while (!ready(50ms)) {
      if (interrupted(release)) {
        raised = true;
        break;
      }
    }
    park_if_finalizing(release);
  }
  if (raised) throw py::error_already_set();
}

template <typename T>
T wait_for_future(std::future<T>& future) {
  wait_interruptibly([&future](auto d) { return future.wait_for(d) == std::future_status::ready; });
  return future.get();
}

// Runs `fn` on a thread of its own and waits for it interruptibly; an
// interrupted call runs to its end unseen (what it holds, it owns).
template <typename F>
auto run_interruptibly(F fn) -> decltype(fn()) {
  using R = decltype(fn());
  auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
  std::future<R> future = task->get_future();
  std::thread([task]() { (*task)(); }).detach();
  return wait_for_future(future);
}

// The same, for calls whose result must not be lost to an interrupt (join
// and done hand out the first closure error once): an interrupted call's
// future stays in `slot`, and the next call waits for it instead of
// starting another.
template <typename R, typename F>
R run_keeping(std::shared_ptr<std::optional<std::shared_future<R>>> slot, F fn) {
  if (!slot->has_value()) {
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    *slot = task->get_future().share();
    std::thread([task]() { (*task)(); }).detach();
  }
  std::shared_future<R> future = **slot;
  wait_interruptibly([&future](auto d) { return future.wait_for(d) == std::future_status::ready; });
  slot->reset();
  return future.get();
}

// ---- Options ------------------------------------------------------------------------

// `seconds` as a duration; InvalidArgument naming `what` outside (0, one year].
std::chrono::milliseconds seconds_arg(const char* what, double seconds);

// An empty token: CAPSTAN_TOKEN's (token_from_environment).
ClientOptions client_options(const std::string& token, const std::string& client_name, double connect_timeout_s,
                             double call_timeout_s);

// ---- The module's areas, in the order PYBIND11_MODULE binds them ----------------------
// A type used in a signature is registered before the function that uses it
// (else the docstring names the C++ type).

void init_errors(py::module_& m);        // capstan.Error and capstan.<Code>Error
void init_dlpack(py::module_& m);        // _to_dlpack (capstan.Array.__dlpack__)
void init_data(py::module_& m);          // Fn, Iterator, Dataset, load_module (tf.data)
void init_data_service(py::module_& m);  // register_dataset, from_dataset_id
void init_collectives(py::module_& m);   // Communicator
void init_training(py::module_& m);      // Optimizer ... ClusterCoordinator

}  // namespace capstan::python

#endif  // CAPSTAN_PYTHON_SRC_COMMON_H_
