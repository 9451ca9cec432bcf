// capstan._capstan: the Python bindings (pybind11) over the SDK's public
// API (libcapstan.so). The package `capstan` (python/capstan/__init__.py)
// re-exports it with Python names.
//
// Conventions:
//   - Tensors go in as numpy arrays (anything np.asarray takes), copied
//     once into a Tensor; they come out as read-only numpy arrays over the
//     Tensor's own buffer (no copy): the array's base holds the Tensor, so
//     the bytes live as long as the array.
//   - An Element is a tuple of arrays.
//   - A Status that is not OK raises capstan.<Code>Error (a subclass of
//     capstan.Error with .code), e.g. capstan.UnavailableError.
//   - Every call that can block releases the GIL; join, fetch, done and
//     iteration (get_next) wait in slices of 50 ms and check for signals in
//     between, so Ctrl-C interrupts them (KeyboardInterrupt). An interrupted
//     get_next keeps its element for the next call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <capstan/collectives.h>
#include <capstan/data/dataset.h>
#include <capstan/data/service.h>
#include <capstan/functions.h>
#include <capstan/status.h>
#include <capstan/tensor.h>
#include <capstan/training.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace py = pybind11;
using namespace std::chrono_literals;

namespace capstan::python {
namespace {

// ---- Errors -----------------------------------------------------------------------

struct StatusError {
  Status status;
};

std::map<StatusCode, PyObject*>& error_classes() {
  static auto* classes = new std::map<StatusCode, PyObject*>();
  return *classes;
}

[[noreturn]] void raise(const Status& status) { throw StatusError{status}; }

template <typename T>
T value_or_raise(Result<T> result) {
  if (!result.ok()) raise(result.status());
  return std::move(*result);
}
void check(const Status& status) {
  if (!status.ok()) raise(status);
}

// ---- Tensors and numpy --------------------------------------------------------------

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return py::dtype("float16");
    case DType::kBFloat16: return py::dtype("uint16");  // numpy has no bfloat16: its bits
    case DType::kFloat32: return py::dtype("float32");
    case DType::kFloat64: return py::dtype("float64");
    case DType::kInt8: return py::dtype("int8");
    case DType::kInt16: return py::dtype("int16");
    case DType::kInt32: return py::dtype("int32");
    case DType::kInt64: return py::dtype("int64");
    case DType::kUInt8: return py::dtype("uint8");
    case DType::kBool: return py::dtype("bool");
    default: raise(Status::InvalidArgument("no numpy dtype for " + std::string(dtype_name(dtype))));
  }
}

DType capstan_dtype(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  if (kind == 'f' && size == 2) return DType::kFloat16;
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'i' && size == 2) return DType::kInt16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  if (kind == 'b') return DType::kBool;
  if (kind == 'S' || kind == 'U' || kind == 'O') return DType::kString;  // bytes / str: a string tensor
  raise(Status::InvalidArgument("numpy dtype " + py::str(static_cast<const py::handle&>(dtype)).cast<std::string>() +
                                " has no Capstan dtype (use float16/32/64, int8/16/32/64, uint8, bool or bytes)"));
}

// A read-only array over the tensor's buffer; its base keeps the tensor.
py::object to_numpy(const Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (t.dtype() == DType::kString) {
    py::array out(py::dtype("O"), shape);
    auto** items = static_cast<PyObject**>(out.mutable_data());
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      std::string_view s = t.string_at(i);
      PyObject* bytes = PyBytes_FromStringAndSize(s.data(), static_cast<py::ssize_t>(s.size()));
      if (bytes == nullptr) throw py::error_already_set();
      Py_XDECREF(items[i]);
      items[i] = bytes;
    }
    return out;
  }
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array out(numpy_dtype(t.dtype()), shape, {}, keep->data(), base);
  py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

Tensor to_tensor(const py::handle& value) {
  // numpy's own conversion: its errors (a ragged list, ...) propagate as
  // they are; the result is C-contiguous (0-d stays 0-d).
  // Never destroyed: a static py::object would be released after the
  // interpreter is gone.
  static py::object* asarray = new py::object(py::module_::import("numpy").attr("asarray"));
  py::array array = (*asarray)(value, py::arg("order") = "C");
  if (!array.dtype().attr("isnative").cast<bool>()) {
    array = array.attr("astype")(array.dtype().attr("newbyteorder")("="));  // big-endian input: native order
  }
  Shape shape(array.shape(), array.shape() + array.ndim());
  const char kind = array.dtype().kind();
  if (kind == 'S' || kind == 'U' || kind == 'O') {
    std::vector<std::string> strings;
    py::list flat = array.attr("ravel")().attr("tolist")();
    for (const py::handle& item : flat) {
      if (py::isinstance<py::bytes>(item)) {
        strings.push_back(item.cast<std::string>());
      } else if (py::isinstance<py::str>(item)) {
        strings.push_back(item.cast<std::string>());  // UTF-8
      } else {
        raise(Status::InvalidArgument("a string tensor takes bytes or str, got " +
                                      py::str(item.get_type()).cast<std::string>()));
      }
    }
    return value_or_raise(Tensor::from_strings(strings, shape));
  }
  DType dtype = capstan_dtype(array.dtype());
  Tensor out = value_or_raise(Tensor::uninitialized(dtype, shape));
  if (out.byte_size() > 0) std::memcpy(out.mutable_data(), array.data(), out.byte_size());
  return out;
}

py::tuple element_to_python(const Element& e) {
  py::tuple out(e.components.size());
  for (size_t i = 0; i < e.components.size(); ++i) out[i] = to_numpy(e.components[i]);
  return out;
}

// A tuple or list of arrays (or one array) as an Element.
Element element_from_python(const py::handle& value) {
  Element e;
  if (value.is_none()) return e;
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    for (const py::handle& item : value) e.components.push_back(to_tensor(item));
  } else {
    e.components.push_back(to_tensor(value));
  }
  return e;
}

// ---- Blocking calls that Ctrl-C interrupts ------------------------------------------

// The interpreter's main thread: the only one Python runs signal handlers on.
unsigned long main_thread_ident = 0;

// A thread that comes back to Python while the interpreter exits would be
// killed taking the GIL (inside a destructor that may not throw): it stays
// here instead, asleep, until the process ends.
void park_if_finalizing(py::gil_scoped_release& release) {
  if (_Py_IsFinalizing()) {
    release.disarm();
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

// Whether a signal handler raised (KeyboardInterrupt): checked with the GIL
// taken for a moment, on the main thread only (elsewhere it cannot fire).
bool interrupted(py::gil_scoped_release& release) {
  if (PyThread_get_thread_ident() != main_thread_ident) return false;
  park_if_finalizing(release);
  py::gil_scoped_acquire acquire;
  return PyErr_CheckSignals() != 0;
}

// Waits until `ready()` with the GIL released; on the main thread every
// 50 ms it checks for signals, and a handler that raises ends the wait
// (error_already_set, with the GIL held again).
template <typename Ready>
void wait_interruptibly(Ready ready) {
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

// ---- Module functions -------------------------------------------------------------

// The functions pipelines iterated here resolve (Fn.named). load_module()
// builds a new registry with every module loaded so far and the new one,
// then swaps it in: an iterator keeps the registry it started with, which
// nothing changes under it (FunctionRegistry is not safe to change while
// it is used).
struct Registries {
  std::mutex mu;
  std::vector<std::string> modules;
  std::shared_ptr<FunctionRegistry> current = std::make_shared<FunctionRegistry>();
};
Registries& registries() {
  static auto* r = new Registries();
  return *r;
}
std::shared_ptr<FunctionRegistry> registry() {
  std::lock_guard<std::mutex> lock(registries().mu);
  return registries().current;
}
Status load_module_everywhere(const std::string& path) {
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mu);
  auto next = std::make_shared<FunctionRegistry>();
  for (const auto& loaded : r.modules) CAPSTAN_RETURN_IF_ERROR(next->load_module(loaded));
  CAPSTAN_RETURN_IF_ERROR(next->load_module(path));
  r.modules.push_back(path);
  r.current = std::move(next);
  return Status::Ok();
}

// ---- Iteration --------------------------------------------------------------------

// An iterator with a thread of its own that runs get_next() on request, so
// that the Python thread can wait for it interruptibly without a thread per
// element. The state outlives the Python object while a get_next runs.
class PyIterator {
 public:
  PyIterator(std::unique_ptr<data::Iterator> iterator, std::shared_ptr<FunctionRegistry> functions)
      : state_(std::make_shared<State>()) {
    state_->iterator = std::move(iterator);
    state_->functions = std::move(functions);
    std::thread([state = state_]() { state->run(); }).detach();
  }
  ~PyIterator() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;  // the thread ends after a get_next still running
    state_->changed.notify_all();
  }
  PyIterator(const PyIterator&) = delete;
  PyIterator& operator=(const PyIterator&) = delete;

  // The next element, or nullopt at the end. One caller at a time (others
  // wait their turn, GIL released).
  std::optional<Element> next() {
    std::shared_ptr<State> state = state_;
    Result<std::optional<Element>> result = std::optional<Element>();
    bool raised = false;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> turn(state->consumer);
      std::unique_lock<std::mutex> lock(state->mu);
      if (!state->requested) {  // else an interrupted call's get_next still runs: its element is ours
        state->requested = true;
        state->done = false;
        state->changed.notify_all();
      }
      while (!state->done) {
        state->changed.wait_for(lock, 50ms);
        if (state->done) break;
        lock.unlock();
        if (interrupted(release)) {
          raised = true;
          break;
        }
        lock.lock();
      }
      if (!raised) {
        state->requested = false;
        state->done = false;
        result = std::move(state->result);
        lock.unlock();
      }
      turn.unlock();
      park_if_finalizing(release);
    }
    if (raised) throw py::error_already_set();
    return value_or_raise(std::move(result));
  }

  std::string save() {
    py::gil_scoped_release release;
    return value_or_raise(run_locked([this]() { return state_->iterator->save(); }));
  }
  void restore(const std::string& bytes) {
    py::gil_scoped_release release;
    check(run_locked([this, &bytes]() { return state_->iterator->restore(bytes); }));
  }

 private:
  struct State {
    std::shared_ptr<FunctionRegistry> functions;  // outlives the iterator (declared first: freed last)
    std::mutex consumer;                          // next() callers, one at a time
    std::mutex mu;
    std::condition_variable changed;
    bool requested = false, done = false, stop = false;
    Result<std::optional<Element>> result = std::optional<Element>();
    std::unique_ptr<data::Iterator> iterator;

    void run() {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        while (!stop && !(requested && !done)) changed.wait(lock);
        if (stop) return;
        lock.unlock();
        Result<std::optional<Element>> next = std::optional<Element>();
        try {
          next = iterator->get_next();
        } catch (const std::exception& e) {  // a module function that threw: an error, not an abort
          next = Status::Internal(std::string("get_next threw: ") + e.what());
        } catch (...) {
          next = Status::Internal("get_next threw an exception that is not a std::exception");
        }
        lock.lock();
        result = std::move(next);
        done = true;
        changed.notify_all();
      }
    }
  };
  // save/restore: only between two get_next calls.
  template <typename F>
  auto run_locked(F f) -> decltype(f()) {
    std::unique_lock<std::mutex> turn(state_->consumer);
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->requested) {
      return Status::FailedPrecondition("save/restore while a get_next runs (an interrupted one): call next() first");
    }
    return f();
  }

  std::shared_ptr<State> state_;
};

std::unique_ptr<PyIterator> make_iterator(const data::Dataset& dataset) {
  auto functions = registry();
  std::unique_ptr<data::Iterator> it;
  {
    py::gil_scoped_release release;
    it = value_or_raise(dataset.make_iterator(functions.get()));
  }
  return std::make_unique<PyIterator>(std::move(it), std::move(functions));
}

// ---- Options ------------------------------------------------------------------------

std::chrono::milliseconds seconds_arg(const char* what, double seconds) {
  if (!(seconds > 0 && seconds <= 86400.0 * 365)) {
    raise(Status::InvalidArgument(std::string(what) + " " + std::to_string(seconds) +
                                  " s: give a number of seconds in (0, one year]"));
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

ClientOptions client_options(const std::string& token, const std::string& client_name, double connect_timeout_s,
                             double call_timeout_s) {
  ClientOptions options;
  options.token = token.empty() ? value_or_raise(token_from_environment()) : token;
  options.client_name = client_name;
  options.connect_timeout = seconds_arg("connect_timeout", connect_timeout_s);
  options.call_timeout = seconds_arg("call_timeout", call_timeout_s);
  return options;
}

data::service::ProcessingMode processing_mode(const std::string& name) {
  using data::service::ProcessingMode;
  static const std::map<std::string, ProcessingMode> kModes = {
      {"off", ProcessingMode::kOff},   {"dynamic", ProcessingMode::kDynamic},
      {"file", ProcessingMode::kFile}, {"data", ProcessingMode::kData},
      {"file_or_data", ProcessingMode::kFileOrData}, {"hint", ProcessingMode::kHint}};
  auto it = kModes.find(name);
  if (it == kModes.end()) {
    raise(Status::InvalidArgument("processing_mode '" + name +
                                  "': use off, dynamic, file, data, file_or_data or hint (TF's ShardingPolicy)"));
  }
  return it->second;
}

ReduceOp reduce_op(const std::string& name) {
  static const std::map<std::string, ReduceOp> kOps = {
      {"sum", ReduceOp::kSum}, {"mean", ReduceOp::kMean}, {"min", ReduceOp::kMin},
      {"max", ReduceOp::kMax}, {"prod", ReduceOp::kProd}};
  auto it = kOps.find(name);
  if (it == kOps.end()) raise(Status::InvalidArgument("reduce op '" + name + "': use sum, mean, min, max or prod"));
  return it->second;
}

data::Compression compression(const std::string& name) {
  if (name.empty() || name == "none") return data::Compression::kNone;
  if (name == "gzip" || name == "GZIP") return data::Compression::kGzip;
  raise(Status::InvalidArgument("compression '" + name + "': use '' or 'GZIP'"));
}

// The Python ClusterCoordinator: the SDK's, and the join/done calls a
// Ctrl-C interrupted (still running: the next join/done waits for them, so
// the closure error they take is raised, not lost).
struct PyCluster {
  std::shared_ptr<ClusterCoordinator> cluster;
  std::shared_ptr<std::optional<std::shared_future<Status>>> join =
      std::make_shared<std::optional<std::shared_future<Status>>>();
  std::shared_ptr<std::optional<std::shared_future<Result<bool>>>> done =
      std::make_shared<std::optional<std::shared_future<Result<bool>>>>();
  ClusterCoordinator* operator->() const { return cluster.get(); }
};

// A collective that Ctrl-C interrupted cannot be taken back (the peers run
// it): the group is aborted, so that every rank's next operation fails at
// once (FailedPrecondition here, Unavailable there) and a new group can form.
template <typename F>
auto collective(const std::shared_ptr<Communicator>& c, F fn) -> decltype(fn()) {
  try {
    return run_interruptibly(std::move(fn));
  } catch (py::error_already_set&) {
    c->abort(Status::Cancelled("a rank's collective was interrupted (KeyboardInterrupt)"));
    throw;
  }
}

// A closure's future value: fetch() blocks for it (Ctrl-C interrupts).
struct PyRemoteValue {
  std::shared_ptr<ClusterCoordinator> cluster;
  RemoteValue value;

  py::tuple fetch() const {
    auto c = cluster;
    auto v = value;
    return element_to_python(value_or_raise(run_interruptibly([c, v]() { return c->fetch(v); })));
  }
  py::tuple fetch_once() const {
    auto c = cluster;
    auto v = value;
    return element_to_python(value_or_raise(run_interruptibly([c, v]() { return c->fetch_once(v); })));
  }
};

std::optional<uint64_t> seed_of(const py::object& seed) {
  if (seed.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(seed) || seed.cast<py::int_>() < py::int_(0)) {
    raise(Status::InvalidArgument("seed " + py::repr(seed).cast<std::string>() + ": give an integer >= 0, or None"));
  }
  return seed.cast<uint64_t>();
}

}  // namespace

PYBIND11_MODULE(_capstan, m) {
  m.doc() = "Capstan's C++ SDK for Python; use the `capstan` package.";
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();

  // Errors: capstan.Error and one subclass per status code.
  py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  PyObject* base = PyErr_NewExceptionWithDoc("capstan._capstan.Error", "A Capstan call failed; .code names why.",
                                             runtime_error.ptr(), nullptr);
  m.add_object("Error", py::handle(base));
  const std::pair<StatusCode, const char*> kCodes[] = {
      {StatusCode::kCancelled, "Cancelled"},
      {StatusCode::kUnknown, "Unknown"},
      {StatusCode::kInvalidArgument, "InvalidArgument"},
      {StatusCode::kDeadlineExceeded, "DeadlineExceeded"},
      {StatusCode::kNotFound, "NotFound"},
      {StatusCode::kAlreadyExists, "AlreadyExists"},
      {StatusCode::kPermissionDenied, "PermissionDenied"},
      {StatusCode::kResourceExhausted, "ResourceExhausted"},
      {StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {StatusCode::kAborted, "Aborted"},
      {StatusCode::kOutOfRange, "OutOfRange"},
      {StatusCode::kUnimplemented, "Unimplemented"},
      {StatusCode::kInternal, "Internal"},
      {StatusCode::kUnavailable, "Unavailable"},
      {StatusCode::kDataLoss, "DataLoss"},
      {StatusCode::kUnauthenticated, "Unauthenticated"},
  };
  for (const auto& [code, name] : kCodes) {
    std::string cls = std::string(name) + "Error";
    PyObject* type = PyErr_NewException(("capstan._capstan." + cls).c_str(), base, nullptr);
    PyObject_SetAttrString(type, "code", py::str(name).ptr());
    m.add_object(cls.c_str(), py::handle(type));
    error_classes()[code] = type;
  }
  PyObject_SetAttrString(base, "code", py::str("Unknown").ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      auto it = error_classes().find(e.status.code());
      PyObject* type = it != error_classes().end() ? it->second : error_classes()[StatusCode::kUnknown];
      PyErr_SetString(type, e.status.message().c_str());
    }
  });

  // ---- Optimizers, partitioners, initializers
  py::class_<Optimizer>(m, "Optimizer")
      .def_static("none", &Optimizer::none)
      .def_static("sgd", &Optimizer::sgd, py::arg("learning_rate"))
      .def_static("momentum", &Optimizer::momentum_sgd, py::arg("learning_rate"), py::arg("momentum"),
                  py::arg("nesterov") = false)
      .def_static("adagrad", &Optimizer::adagrad, py::arg("learning_rate"),
                  py::arg("initial_accumulator_value") = 0.1, py::arg("epsilon") = 1e-7)
      .def_static("adam", &Optimizer::adam, py::arg("learning_rate"), py::arg("beta_1") = 0.9,
                  py::arg("beta_2") = 0.999, py::arg("epsilon") = 1e-7)
      .def_static("ftrl", &Optimizer::ftrl, py::arg("learning_rate"), py::arg("l1") = 0.0, py::arg("l2") = 0.0,
                  py::arg("learning_rate_power") = -0.5, py::arg("initial_accumulator_value") = 0.1)
      .def_property_readonly("kind", [](const Optimizer& o) { return optimizer_name(o.kind); })
      .def_readonly("learning_rate", &Optimizer::learning_rate)
      .def("__repr__", [](const Optimizer& o) {
        return "Optimizer." + optimizer_name(o.kind) + "(learning_rate=" + std::to_string(o.learning_rate) + ")";
      });
  py::class_<Partitioner>(m, "Partitioner")
      .def_static("none", &Partitioner::none)
      .def_static("fixed_shards", &Partitioner::fixed_shards, py::arg("num_shards"))
      .def_static("min_size", &Partitioner::min_size, py::arg("min_shard_bytes") = 256 << 10,
                  py::arg("max_shards") = 1, py::arg("bytes_per_string") = 16)
      .def_static("max_size", &Partitioner::max_size, py::arg("max_shard_bytes"), py::arg("max_shards") = 0,
                  py::arg("bytes_per_string") = 16)
      .def_readonly("kind", &Partitioner::kind);
  py::class_<EmbeddingInitializer>(m, "EmbeddingInitializer")
      .def_static("zeros", &EmbeddingInitializer::zeros)
      .def_static("constant", &EmbeddingInitializer::constant, py::arg("value"))
      .def_static("random_normal", &EmbeddingInitializer::random_normal, py::arg("mean") = 0.0,
                  py::arg("stddev") = 0.05, py::arg("seed") = 0);
  py::class_<EmbeddingTableOptions>(m, "EmbeddingTableOptions")
      .def(py::init([](int64_t min_count, double admit_probability, int64_t ttl_steps, int64_t ttl_seconds,
                       int64_t max_rows, int64_t max_bytes, std::string eviction, double default_value) {
             return EmbeddingTableOptions{min_count, admit_probability, ttl_steps, ttl_seconds, max_rows,
                                          max_bytes, std::move(eviction), default_value};
           }),
           py::arg("min_count") = 1, py::arg("admit_probability") = 1.0, py::arg("ttl_steps") = 0,
           py::arg("ttl_seconds") = 0, py::arg("max_rows") = 0, py::arg("max_bytes") = 0,
           py::arg("eviction") = "lru", py::arg("default_value") = 0.0);

  py::class_<VariableInfo>(m, "VariableInfo")
      .def_readonly("name", &VariableInfo::name)
      .def_property_readonly("dtype", [](const VariableInfo& v) { return std::string(dtype_name(v.dtype)); })
      .def_property_readonly("shape", [](const VariableInfo& v) { return py::tuple(py::cast(v.shape)); })
      .def_property_readonly("num_shards", [](const VariableInfo& v) { return v.shards.size(); })
      .def_property_readonly("ps_tasks",
                             [](const VariableInfo& v) {
                               std::vector<int> tasks;
                               for (const auto& s : v.shards) tasks.push_back(s.ps_task);
                               return tasks;
                             })
      .def_readonly("embedding_table", &VariableInfo::embedding_table);

  // ---- Pipelines (tf.data)
  py::class_<data::Fn>(m, "Fn")
      .def_static("named", &data::Fn::named, py::arg("name"))
      .def_static("cast", [](const py::object& dtype) { return data::Fn::cast(capstan_dtype(py::dtype::from_args(dtype))); },
                  py::arg("dtype"))
      .def_static(
          "decode_csv",
          [](const py::list& record_defaults, const std::string& field_delim, bool use_quote_delim,
             const std::string& na_value, std::vector<int64_t> select_cols, bool trim_whitespace) {
            data::CsvSpec spec;
            for (const py::handle& d : record_defaults) spec.record_defaults.push_back(to_tensor(d));
            spec.field_delim = field_delim;
            spec.use_quote_delim = use_quote_delim;
            spec.na_value = na_value;
            spec.select_cols = std::move(select_cols);
            spec.trim_whitespace = trim_whitespace;
            return data::Fn::decode_csv(std::move(spec));
          },
          py::arg("record_defaults"), py::arg("field_delim") = ",", py::arg("use_quote_delim") = true,
          py::arg("na_value") = "", py::arg("select_cols") = std::vector<int64_t>{},
          py::arg("trim_whitespace") = false)
      .def_static(
          "parse_example",
          [](const py::dict& features) {
            // {"key": ("fixed", dtype, shape[, default]) or ("var", dtype)}
            data::FeatureSpec spec;
            for (const auto& [key, value] : features) {
              const std::string name = py::str(key).cast<std::string>();
              if (!py::isinstance<py::tuple>(value) && !py::isinstance<py::list>(value)) {
                raise(Status::InvalidArgument("parse_example: feature '" + name +
                                              "' must be ('fixed', dtype, shape[, default]) or ('var', dtype)"));
              }
              py::tuple t = py::tuple(py::reinterpret_borrow<py::object>(value));
              if (t.size() < 2 || !py::isinstance<py::str>(t[0]) ||
                  (t[0].cast<std::string>() == "fixed" && t.size() < 3)) {
                raise(Status::InvalidArgument("parse_example: feature '" + name +
                                              "' must be ('fixed', dtype, shape[, default]) or ('var', dtype)"));
              }
              std::string kind = t[0].cast<std::string>();
              DType dtype = capstan_dtype(py::dtype::from_args(t[1]));
              if (kind == "fixed") {
                data::FixedLenFeature f{dtype, t[2].cast<Shape>(), std::nullopt};
                if (t.size() > 3 && !t[3].is_none()) f.default_value = to_tensor(t[3]);
                spec[key.cast<std::string>()] = f;
              } else if (kind == "var") {
                spec[key.cast<std::string>()] = data::VarLenFeature{dtype};
              } else {
                raise(Status::InvalidArgument("parse_example: feature '" + key.cast<std::string>() +
                                              "' kind '" + kind + "': use 'fixed' or 'var'"));
              }
            }
            return data::Fn::parse_example(std::move(spec));
          },
          py::arg("features"))
      .def_static("tfrecord_dataset", [](const std::string& c) { return data::Fn::tfrecord_dataset(compression(c)); },
                  py::arg("compression") = "")
      .def_static("text_line_dataset", [](const std::string& c) { return data::Fn::text_line_dataset(compression(c)); },
                  py::arg("compression") = "");

  py::class_<PyIterator>(m, "Iterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](PyIterator& it) -> py::tuple {
             std::optional<Element> next = it.next();
             if (!next) throw py::stop_iteration();
             return element_to_python(*next);
           })
      .def("get_next",
           [](PyIterator& it) -> py::object {
             std::optional<Element> next = it.next();
             if (!next) return py::none();
             return element_to_python(*next);
           },
           "The next element, or None at the end.")
      .def("save", [](PyIterator& it) { return py::bytes(it.save()); })
      .def("restore", [](PyIterator& it, const py::bytes& state) { it.restore(state.cast<std::string>()); });

  py::class_<data::Dataset>(m, "Dataset")
      .def_static("range", [](int64_t a, std::optional<int64_t> b, int64_t step) {
             return b ? data::Dataset::range(a, *b, step) : data::Dataset::range(0, a, step);
           }, py::arg("start_or_stop"), py::arg("stop") = py::none(), py::arg("step") = 1)
      .def_static("from_tensors", [](const py::object& e) { return data::Dataset::from_tensors(element_from_python(e)); })
      .def_static("from_tensor_slices",
                  [](const py::object& e) { return data::Dataset::from_tensor_slices(element_from_python(e)); })
      .def_static("list_files",
                  [](std::vector<std::string> patterns, bool shuffle, const py::object& seed) {
                    return data::Dataset::list_files(std::move(patterns), shuffle, seed_of(seed));
                  },
                  py::arg("patterns"), py::arg("shuffle") = true, py::arg("seed") = py::none())
      .def_static("text_line_dataset",
                  [](std::vector<std::string> files, const std::string& c) {
                    return data::Dataset::text_line_dataset(std::move(files), compression(c));
                  },
                  py::arg("filenames"), py::arg("compression_type") = "")
      .def_static("tfrecord_dataset",
                  [](std::vector<std::string> files, const std::string& c, int64_t num_parallel_reads) {
                    return data::Dataset::tfrecord_dataset(std::move(files), compression(c), num_parallel_reads);
                  },
                  py::arg("filenames"), py::arg("compression_type") = "", py::arg("num_parallel_reads") = 0)
      .def_static("fixed_length_record_dataset",
                  [](std::vector<std::string> files, int64_t record_bytes, int64_t header_bytes, int64_t footer_bytes,
                     const std::string& c) {
                    return data::Dataset::fixed_length_record_dataset(std::move(files), record_bytes, header_bytes,
                                                                      footer_bytes, compression(c));
                  },
                  py::arg("filenames"), py::arg("record_bytes"), py::arg("header_bytes") = 0,
                  py::arg("footer_bytes") = 0, py::arg("compression_type") = "")
      .def_static("load", [](const std::string& path) {
        py::gil_scoped_release release;
        return value_or_raise(data::Dataset::load(path));
      })
      .def_static("zip", &data::Dataset::zip)
      .def("map",
           [](const data::Dataset& d, const data::Fn& fn, int64_t num_parallel_calls, std::optional<bool> deterministic) {
             return d.map(fn, num_parallel_calls, deterministic);
           },
           py::arg("fn"), py::arg("num_parallel_calls") = 0, py::arg("deterministic") = py::none())
      .def("filter", &data::Dataset::filter, py::arg("fn"))
      .def("batch", &data::Dataset::batch, py::arg("batch_size"), py::arg("drop_remainder") = false)
      .def("shuffle",
           [](const data::Dataset& d, int64_t buffer_size, const py::object& seed, bool reshuffle) {
             return d.shuffle(buffer_size, seed_of(seed), reshuffle);
           },
           py::arg("buffer_size"), py::arg("seed") = py::none(), py::arg("reshuffle_each_iteration") = true)
      .def("repeat", &data::Dataset::repeat, py::arg("count") = -1)
      .def("shard", &data::Dataset::shard, py::arg("num_shards"), py::arg("index"))
      .def("interleave", [](const data::Dataset& d, const data::Fn& fn, int64_t cycle_length, int64_t block_length,
                            int64_t num_parallel_calls, std::optional<bool> deterministic) {
             return d.interleave(fn, cycle_length, block_length, num_parallel_calls, deterministic);
           },
           py::arg("fn"), py::arg("cycle_length") = data::kAutotune, py::arg("block_length") = 1,
           py::arg("num_parallel_calls") = 0, py::arg("deterministic") = py::none())
      .def("prefetch", &data::Dataset::prefetch, py::arg("buffer_size"))
      .def("take", &data::Dataset::take, py::arg("count"))
      .def("skip", &data::Dataset::skip, py::arg("count"))
      .def("concatenate", &data::Dataset::concatenate, py::arg("dataset"))
      .def("cache", &data::Dataset::cache, py::arg("filename") = "")
      .def("snapshot", [](const data::Dataset& d, std::string path, const std::string& c) {
             return d.snapshot(std::move(path), compression(c));
           }, py::arg("path"), py::arg("compression") = "")
      .def("rebatch", &data::Dataset::rebatch, py::arg("batch_size"), py::arg("drop_remainder") = false)
      .def("cardinality", &data::Dataset::cardinality)
      .def("save", [](const data::Dataset& d, const std::string& path, const std::string& c, int64_t num_shards) {
             data::SaveOptions options;
             options.compression = compression(c);
             options.num_shards = num_shards;
             options.functions = registry().get();
             py::gil_scoped_release release;
             check(d.save(path, options));
           }, py::arg("path"), py::arg("compression") = "", py::arg("num_shards") = 1)
      .def("__iter__", [](const data::Dataset& d) { return make_iterator(d); })
      .def("make_iterator", [](const data::Dataset& d) { return make_iterator(d); })
      .def("padded_batch",
           [](const data::Dataset& d, int64_t batch_size, std::vector<Shape> padded_shapes, const py::object& values,
              bool drop_remainder) {
             std::vector<Tensor> padding;
             if (!values.is_none()) {
               for (const py::handle& v : values) padding.push_back(to_tensor(v));
             }
             return d.padded_batch(batch_size, std::move(padded_shapes), std::move(padding), drop_remainder);
           },
           py::arg("batch_size"), py::arg("padded_shapes"), py::arg("padding_values") = py::none(),
           py::arg("drop_remainder") = false)
      // A definition travels (pickle: DataLoader workers, multiprocessing).
      .def(py::pickle([](const data::Dataset& d) { return py::bytes(d.serialize()); },
                      [](const py::bytes& b) { return value_or_raise(data::Dataset::deserialize(b.cast<std::string>())); }))
      .def("__repr__", [](const data::Dataset& d) { return "<capstan.data.Dataset " + d.debug_string() + ">"; });
  m.def("_drain",
        [](const data::Dataset& d) {
          // The C++ reader alone (no Python objects): the baseline of
          // bench/python_data_service_bench.py. (elements, bytes).
          auto functions = registry();
          py::gil_scoped_release release;
          auto it = value_or_raise(d.make_iterator(functions.get()));
          int64_t elements = 0, bytes = 0;
          while (true) {
            auto next = value_or_raise(it->get_next());
            if (!next) break;
            ++elements;
            for (const Tensor& t : next->components) bytes += static_cast<int64_t>(t.byte_size());
          }
          return std::make_pair(elements, bytes);
        },
        py::arg("dataset"));
  m.attr("AUTOTUNE") = data::kAutotune;
  m.attr("SHARD_HINT") = data::kShardHint;
  m.def("load_module", [](const std::string& path) {
    py::gil_scoped_release release;
    check(load_module_everywhere(path));
  }, py::arg("path"), "Loads a module's functions (CAPSTAN_MODULE) for pipelines iterated in this process.");

  // ---- The data service (distribute is capstan/_service.py's)
  m.def("register_dataset",
        [](const std::string& dispatcher, const data::Dataset& dataset, const std::string& token,
           const std::string& client_name, const std::optional<std::string>& compression) {
          ClientOptions options = client_options(token, client_name, 10, 60);
          // TF's values: "AUTO", or None for none.
          std::string how = compression.value_or("NONE");
          py::gil_scoped_release release;
          return value_or_raise(data::service::register_dataset(dispatcher, dataset, options, how));
        },
        py::arg("dispatcher"), py::arg("dataset"), py::arg("token") = "", py::arg("client_name") = "python",
        py::arg("compression") = "AUTO");
  m.def("from_dataset_id",
        [](const std::string& dispatcher, const std::string& dataset_id, const std::string& mode,
           const std::string& job_name, int64_t consumer_index, int64_t num_consumers, const std::string& trainer_id,
           bool cross_trainer_cache, int64_t cross_trainer_cache_bytes, int max_elements_per_request,
           const std::string& token) {
          data::service::ReadOptions o;
          o.processing_mode = processing_mode(mode);
          o.job_name = job_name;
          o.consumer_index = consumer_index;
          o.num_consumers = num_consumers;
          o.trainer_id = trainer_id;
          o.cross_trainer_cache = cross_trainer_cache;
          o.cross_trainer_cache_bytes = cross_trainer_cache_bytes;
          o.max_elements_per_request = max_elements_per_request;
          o.client = client_options(token, "python", 10, 60);
          return data::service::from_dataset_id(dispatcher, dataset_id, o);
        },
        py::arg("dispatcher"), py::arg("dataset_id"), py::arg("processing_mode") = "off", py::arg("job_name") = "",
        py::arg("consumer_index") = -1, py::arg("num_consumers") = 0, py::arg("trainer_id") = "",
        py::arg("cross_trainer_cache") = false, py::arg("cross_trainer_cache_bytes") = 256 << 20,
        py::arg("max_elements_per_request") = 64, py::arg("token") = "");
  // ---- Collectives
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def("all_reduce", [](const std::shared_ptr<Communicator>& c, const py::object& array, const std::string& op) {
             Tensor t = to_tensor(array);
             ReduceOp r = reduce_op(op);
             return to_numpy(value_or_raise(collective(c, [c, t, r]() { return c->all_reduce(t, r); })));
           }, py::arg("array"), py::arg("op") = "sum")
      .def("broadcast", [](const std::shared_ptr<Communicator>& c, const py::object& array, int root) {
             Tensor t = to_tensor(array);
             return to_numpy(value_or_raise(collective(c, [c, t, root]() { return c->broadcast(t, root); })));
           }, py::arg("array"), py::arg("root") = 0)
      .def("all_gather", [](const std::shared_ptr<Communicator>& c, const py::object& array) {
             Tensor t = to_tensor(array);
             return to_numpy(value_or_raise(collective(c, [c, t]() { return c->all_gather(t); })));
           }, py::arg("array"))
      .def("reduce_scatter", [](const std::shared_ptr<Communicator>& c, const py::object& array, const std::string& op) {
             Tensor t = to_tensor(array);
             ReduceOp r = reduce_op(op);
             return to_numpy(value_or_raise(collective(c, [c, t, r]() { return c->reduce_scatter(t, r); })));
           }, py::arg("array"), py::arg("op") = "sum")
      .def("barrier", [](const std::shared_ptr<Communicator>& c) {
             check(collective(c, [c]() { return c->barrier(); }));
           })
      .def("abort", [](const std::shared_ptr<Communicator>& c, const std::string& reason) {
             c->abort(Status::Aborted(reason));
           }, py::arg("reason") = "aborted from Python")
      .def_property_readonly("aborted", &Communicator::aborted);

  // ---- Parameter-server training (ClusterCoordinator)
  py::class_<PyRemoteValue>(m, "RemoteValue")
      .def_property_readonly("id", [](const PyRemoteValue& v) { return v.value.id; })
      .def("fetch", &PyRemoteValue::fetch, "Blocks for the closure's value: a tuple of arrays (its error raises).")
      .def("fetch_once", &PyRemoteValue::fetch_once,
           "fetch(), releasing the value at once (a later fetch raises NotFoundError saying it was released); "
           "a value is also released when its last RemoteValue is garbage-collected.")
      .def("__repr__", [](const PyRemoteValue& v) { return "<capstan.RemoteValue " + std::to_string(v.value.id) + ">"; });
  py::class_<PerWorkerDataset>(m, "PerWorkerDataset")
      .def_readonly("id", &PerWorkerDataset::id)
      .def("arg", [](const PerWorkerDataset& d) { return to_numpy(d.arg()); },
           "The closure argument that stands for each worker's iterator (pass it in schedule's args).");

  using Cluster = PyCluster;
  py::class_<PyCluster>(m, "ClusterCoordinator")
      .def_static("connect",
                  [](const std::string& address, const std::string& token, const std::string& client_name,
                     double connect_timeout_s, double call_timeout_s) {
                    ClientOptions options = client_options(token, client_name, connect_timeout_s, call_timeout_s);
                    py::gil_scoped_release release;
                    return PyCluster{std::shared_ptr<ClusterCoordinator>(
                        value_or_raise(ClusterCoordinator::connect(address, options)))};
                  },
                  py::arg("address"), py::arg("token") = "", py::arg("client_name") = "python",
                  py::arg("connect_timeout") = 10.0, py::arg("call_timeout") = 60.0)
      .def("create_variable",
           [](const Cluster& c, const std::string& name, const py::object& initial, const Optimizer& optimizer,
              const Partitioner& partitioner) {
             VariableSpec spec{name, to_tensor(initial), optimizer, partitioner};
             py::gil_scoped_release release;
             return value_or_raise(c->create_variable(spec));
           },
           py::arg("name"), py::arg("initial"), py::arg("optimizer") = Optimizer::none(),
           py::arg("partitioner") = Partitioner::none())
      .def("create_embedding_table",
           [](const Cluster& c, const std::string& name, int64_t dim, const py::object& dtype,
              const EmbeddingInitializer& initializer, const Optimizer& optimizer,
              const EmbeddingTableOptions& options) {
             EmbeddingTableSpec spec{name, dim, capstan_dtype(py::dtype::from_args(dtype)), initializer, optimizer,
                                     options};
             py::gil_scoped_release release;
             return value_or_raise(c->create_embedding_table(spec));
           },
           py::arg("name"), py::arg("dim"), py::arg("dtype") = py::str("float32"),
           py::arg("initializer") = EmbeddingInitializer::random_normal(), py::arg("optimizer") = Optimizer::sgd(0.01),
           py::arg("options") = EmbeddingTableOptions{})
      .def("variables", [](const Cluster& c) {
             py::gil_scoped_release release;
             return value_or_raise(c->variables());
           })
      .def("schedule",
           [](const Cluster& c, const std::string& function, const py::object& args) {
             Element e = element_from_python(args);
             py::gil_scoped_release release;
             return PyRemoteValue{c.cluster, value_or_raise(c->schedule(function, e))};
           },
           py::arg("function"), py::arg("args") = py::tuple())
      .def("join", [](const Cluster& c) {
        auto cluster = c.cluster;
        check(run_keeping(c.join, [cluster]() { return cluster->join(); }));
      })
      .def("done", [](const Cluster& c) {
        auto cluster = c.cluster;
        return value_or_raise(run_keeping(c.done, [cluster]() { return cluster->done(); }));
      })
      .def("fetch", [](const Cluster&, const PyRemoteValue& value) { return value.fetch(); }, py::arg("value"))
      .def("create_per_worker_dataset",
           [](const Cluster& c, const py::object& dataset, const std::string& name) {
             if (py::isinstance<py::str>(dataset)) {
               std::string function = dataset.cast<std::string>();
               py::gil_scoped_release release;
               return value_or_raise(name.empty() ? c->create_per_worker_dataset(function)
                                                  : c->create_per_worker_dataset(function, name));
             }
             const data::Dataset& d = dataset.cast<const data::Dataset&>();
             py::gil_scoped_release release;
             return value_or_raise(name.empty() ? c->create_per_worker_dataset(d) : c->create_per_worker_dataset(d, name));
           },
           py::arg("dataset"), py::arg("name") = "",
           "A pipeline with SHARD_HINT placeholders, or the name of a dataset function in the workers' module.")
      .def("save_checkpoint",
           [](const Cluster& c, const std::string& directory, int64_t step, int max_to_keep) {
             py::gil_scoped_release release;
             return value_or_raise(c->save_checkpoint(directory, step, max_to_keep));
           },
           py::arg("directory"), py::arg("step"), py::arg("max_to_keep") = 5)
      .def("restore_checkpoint",
           [](const Cluster& c, const std::string& path, bool strict) {
             py::gil_scoped_release release;
             return value_or_raise(c->restore_checkpoint(path, strict)).step;
           },
           py::arg("path"), py::arg("strict") = false,
           "The checkpoint's step; strict: NotFoundError naming the variables it lacks, nothing restored.")
      .def("export_embedding_table",
           [](const Cluster& c, const std::string& table, const std::string& since, const std::string& path) {
             py::gil_scoped_release release;
             return value_or_raise(c->export_embedding_table(table, since, path));
           },
           py::arg("table"), py::arg("since_checkpoint"), py::arg("path"))
      .def("read_variable",
           [](const Cluster& c, const std::string& name) {
             Tensor t;
             {
               py::gil_scoped_release release;
               t = value_or_raise(c->read_variable(name));
             }
             return to_numpy(t);
           },
           py::arg("name"))
      .def("assign_variable",
           [](const Cluster& c, const std::string& name, const py::object& value) {
             Tensor t = to_tensor(value);
             py::gil_scoped_release release;
             check(c->assign_variable(name, t));
           },
           py::arg("name"), py::arg("value"))
      .def("gather",
           [](const Cluster& c, const std::string& name, const py::object& ids) {
             Tensor t = to_tensor(ids), rows;
             {
               py::gil_scoped_release release;
               rows = value_or_raise(c->gather(name, t));
             }
             return to_numpy(rows);
           },
           py::arg("name"), py::arg("ids"))
      .def("lookup",
           [](const Cluster& c, const std::string& table, const py::object& ids, bool insert) {
             Tensor t = to_tensor(ids), rows;
             {
               py::gil_scoped_release release;
               rows = value_or_raise(c->lookup(table, t, insert));
             }
             return to_numpy(rows);
           },
           py::arg("table"), py::arg("ids"), py::arg("insert") = true)
      .def("apply_gradients",
           [](const Cluster& c, const std::string& name, const py::object& gradient) {
             Tensor g = to_tensor(gradient);
             py::gil_scoped_release release;
             check(c->apply_gradients(name, g));
           },
           py::arg("name"), py::arg("gradient"))
      .def("apply_sparse_gradients",
           [](const Cluster& c, const std::string& name, const py::object& ids, const py::object& rows) {
             Tensor i = to_tensor(ids), r = to_tensor(rows);
             py::gil_scoped_release release;
             check(c->apply_sparse_gradients(name, i, r));
           },
           py::arg("name"), py::arg("ids"), py::arg("rows"))
      .def("num_workers", [](const Cluster& c) {
             py::gil_scoped_release release;
             return c->num_workers();
           })
      .def("report_scalar",
           [](const Cluster& c, const std::string& tag, double value, int64_t step) {
             py::gil_scoped_release release;
             check(c->report_scalar(tag, value, step));
           },
           py::arg("tag"), py::arg("value"), py::arg("step"))
      .def("join_group",
           [](const Cluster& c, const std::string& name, int size, int rank, const std::string& host,
              double timeout_s) {
             CollectiveOptions options;
             options.timeout = seconds_arg("timeout", timeout_s);
             auto cluster = c.cluster;
             return std::shared_ptr<Communicator>(
                 value_or_raise(run_interruptibly([cluster, name, size, rank, host, options]() {
                   return cluster->join_group(name, size, rank, host, options);
                 })));
           },
           py::arg("name"), py::arg("size"), py::arg("rank") = -1, py::arg("host") = "127.0.0.1",
           py::arg("timeout") = 60.0);
}

}  // namespace capstan::python
