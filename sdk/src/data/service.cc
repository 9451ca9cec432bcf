// The public data-service calls (capstan/data/service.h): registration is
// one RPC to the dispatcher (lib/data/service_reader), and a read is a
// data_service source op, run by the reader in the same place.
#include "capstan/data/service.h"

#include "data/definition.h"
#include "data/service_reader.h"

namespace capstan::data::service {

Result<std::string> register_dataset(const std::string& dispatcher_address, const Dataset& dataset,
                                     const ClientOptions& options, const std::string& compression) {
  return register_definition(dispatcher_address, dataset.serialize(), options, compression);
}

Dataset from_dataset_id(const std::string& dispatcher_address, const std::string& dataset_id,
                        const ReadOptions& options) {
  return build_dataset(nullptr, [&](wire::Op::Builder op) {
    auto d = op.initDataService();
    d.setAddress(dispatcher_address);
    d.setDatasetId(dataset_id);
    d.setProcessingMode(static_cast<uint8_t>(options.processing_mode));
    d.setJobName(options.job_name);
    d.setConsumerIndex(options.consumer_index);
    d.setNumConsumers(options.num_consumers);
    d.setTrainerId(options.trainer_id);
    d.setCrossTrainerCache(options.cross_trainer_cache);
    d.setCrossTrainerCacheBytes(options.cross_trainer_cache_bytes);
    d.setMaxElementsPerRequest(options.max_elements_per_request);
    d.setMaxOutstandingRequests(options.max_outstanding_requests);
    d.setSharedMemoryBytes(options.shared_memory_bytes);
    d.setToken(options.client.token);
  });
}

Result<Dataset> distribute(const Dataset& dataset, const std::string& dispatcher_address,
                           const ReadOptions& options) {
  CAPSTAN_ASSIGN_OR_RETURN(std::string id,
                           register_dataset(dispatcher_address, dataset, options.client, options.compression));
  return from_dataset_id(dispatcher_address, id, options);
}

}  // namespace capstan::data::service
