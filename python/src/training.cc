// Parameter-server training: the ClusterCoordinator, its RemoteValue and
// PerWorkerDataset, and the optimizers, partitioners and initializers its
// variables and embedding tables take.
#include "common.h"

#include <capstan/collectives.h>
#include <capstan/data/dataset.h>
#include <capstan/training.h>

#include <string>
#include <vector>

namespace capstan::python {
namespace {

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

}  // namespace

void init_training(py::module_& m) {
  // ---- Optimizers, partitioners, initializers
  py::class_<LearningRateSchedule>(m, "LearningRateSchedule")
      .def_static("constant", &LearningRateSchedule::constant)
      .def_static("exponential_decay", &LearningRateSchedule::exponential_decay, py::arg("decay_steps"),
                  py::arg("decay_rate"), py::arg("staircase") = false)
      .def_static("piecewise_constant_decay", &LearningRateSchedule::piecewise_constant_decay,
                  py::arg("boundaries"), py::arg("values"))
      .def_static("cosine_decay", &LearningRateSchedule::cosine_decay, py::arg("decay_steps"),
                  py::arg("alpha") = 0.0)
      .def_property_readonly("kind", [](const LearningRateSchedule& s) { return learning_rate_schedule_name(s.kind); })
      .def("__repr__", [](const LearningRateSchedule& s) {
        return "LearningRateSchedule." + learning_rate_schedule_name(s.kind) + "()";
      });
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
      .def_readonly("schedule", &Optimizer::schedule)
      .def("with_schedule", &Optimizer::with_schedule, py::arg("schedule"))
      .def("learning_rate_at", &learning_rate_at, py::arg("iterations"))
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
  py::class_<Initializer>(m, "Initializer")
      .def_static("zeros", &Initializer::zeros)
      .def_static("constant", &Initializer::constant, py::arg("value"))
      .def_static("random_normal", &Initializer::random_normal, py::arg("mean") = 0.0, py::arg("stddev") = 0.05,
                  py::arg("seed") = 0)
      .def_static("truncated_normal", &Initializer::truncated_normal, py::arg("mean") = 0.0,
                  py::arg("stddev") = 0.05, py::arg("seed") = 0)
      .def_static("random_uniform", &Initializer::random_uniform, py::arg("minval") = -0.05,
                  py::arg("maxval") = 0.05, py::arg("seed") = 0)
      .def_static("glorot_uniform", &Initializer::glorot_uniform, py::arg("seed") = 0)
      .def_static("glorot_normal", &Initializer::glorot_normal, py::arg("seed") = 0)
      .def_property_readonly("kind", [](const Initializer& i) { return initializer_name(i.kind); });
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
              const Partitioner& partitioner, const std::optional<Initializer>& initializer,
              const py::object& dtype, const std::vector<int64_t>& shape) {
             // initial, or initializer with dtype and shape (computed on the parameter servers).
             VariableSpec spec{name, initial.is_none() ? Tensor() : to_tensor(initial), optimizer, partitioner};
             if (initializer) spec.initializer = *initializer;
             if (!dtype.is_none()) spec.dtype = capstan_dtype(py::dtype::from_args(dtype));
             spec.shape = shape;
             py::gil_scoped_release release;
             return value_or_raise(c->create_variable(spec));
           },
           py::arg("name"), py::arg("initial") = py::none(), py::arg("optimizer") = Optimizer::none(),
           py::arg("partitioner") = Partitioner::none(), py::arg("initializer") = py::none(),
           py::arg("dtype") = py::none(), py::arg("shape") = std::vector<int64_t>{})
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
             auto group = value_or_raise(run_interruptibly([cluster, name, size, rank, host, options]() {
               return cluster->join_group(name, size, rank, host, options);
             }));
             // Destroying a Communicator joins its thread, which may be
             // dropping a borrowed array (release_from_any_thread takes the
             // GIL): never under the GIL, or the two wait for each other.
             return std::shared_ptr<Communicator>(group.release(), [](Communicator* communicator) {
               if (PyGILState_Check()) {
                 py::gil_scoped_release release;
                 delete communicator;
               } else {
                 delete communicator;
               }
             });
           },
           py::arg("name"), py::arg("size"), py::arg("rank") = -1, py::arg("host") = "127.0.0.1",
           py::arg("timeout") = 60.0);
}

}  // namespace capstan::python
