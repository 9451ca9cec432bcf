// The tf.data service's client calls: register_dataset and from_dataset_id
// (distribute is capstan/_service.py's).
#include "common.h"

#include <capstan/data/dataset.h>
#include <capstan/data/service.h>

#include <map>
#include <string>

namespace capstan::python {
namespace {

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

}  // namespace

void init_data_service(py::module_& m) {
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
}

}  // namespace capstan::python
