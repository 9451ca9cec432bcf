// tf.data pipelines: Fn, Dataset, Iterator, load_module and the constants
// AUTOTUNE and SHARD_HINT.
#include "common.h"

#include <capstan/data/dataset.h>
#include <capstan/functions.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace capstan::python {
namespace {

using namespace std::chrono_literals;

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

data::Compression compression(const std::string& name) {
  if (name.empty() || name == "none") return data::Compression::kNone;
  if (name == "gzip" || name == "GZIP") return data::Compression::kGzip;
  raise(Status::InvalidArgument("compression '" + name + "': use '' or 'GZIP'"));
}

std::optional<uint64_t> seed_of(const py::object& seed) {
  if (seed.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(seed) || seed.cast<py::int_>() < py::int_(0)) {
    raise(Status::InvalidArgument("seed " + py::repr(seed).cast<std::string>() + ": give an integer >= 0, or None"));
  }
  return seed.cast<uint64_t>();
}

}  // namespace

void init_data(py::module_& m) {
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
      .def("enumerate", &data::Dataset::enumerate, py::arg("start") = 0)
      .def("unbatch", &data::Dataset::unbatch)
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
}

}  // namespace capstan::python
