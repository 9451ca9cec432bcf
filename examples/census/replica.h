// One batch of the census model on a replica of the synchronous modes: the
// variables held as mirrored variables (this replica's copy), the hybrid
// layout's tables reached through `Tables` (the parameter servers). Shared by
// the multi-client program (main.cc: each process a replica) and the module's
// synchronous steps (module.cc: each worker-server a replica,
// MirroredStrategy::run).
#ifndef CAPSTAN_EXAMPLES_CENSUS_REPLICA_H_
#define CAPSTAN_EXAMPLES_CENSUS_REPLICA_H_

#include <capstan/mirrored.h>

#include <functional>
#include <string>
#include <vector>

#include "features.h"
#include "model.h"

namespace census {

// The parameter servers, for the hybrid layout's tables.
struct Tables {
  std::function<capstan::Result<capstan::Tensor>(const std::string& name, const capstan::Tensor& ids)> gather;
  std::function<capstan::Status(const std::string& name, const capstan::Tensor& ids, const capstan::Tensor& rows)>
      apply_sparse;
};

struct StepOutput {
  Output output;
  int64_t n = 0;
};

// `batch` is (wide_ids int64[n, 15], numeric float32[n, 5], label float32[n]).
// Mirrored: "census_dnn", and "census_wide" and "census_embeddings" unless
// `tables` (then they are on the parameter servers). With `train`, applies
// the gradients: all-reduced for the mirrored variables (one fused
// exchange), sparse and asynchronous for the tables.
inline capstan::Result<StepOutput> replica_step(const capstan::Element& batch, capstan::MirroredVariables& vars,
                                                const Tables* tables, bool train) {
  using capstan::DType;
  using capstan::Tensor;
  const auto ids = batch.components.at(0).flat<int64_t>();
  const int64_t n = batch.components.at(0).shape().at(0);
  std::vector<int64_t> wide_ids(ids.begin(), ids.end()), deep_ids;
  wide_ids.push_back(bias_id());
  for (int64_t i = 0; i < n; ++i) {
    for (int f = 0; f < kDeepFields; ++f) deep_ids.push_back(ids[static_cast<size_t>(i * kNumWideFields + f)]);
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor wide_ids_tensor,
                           Tensor::from_vector<int64_t>(wide_ids, {static_cast<int64_t>(wide_ids.size())}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor deep_ids_tensor,
                           Tensor::from_vector<int64_t>(deep_ids, {static_cast<int64_t>(deep_ids.size())}));
  std::vector<float> wide_values, embedding_values;
  if (tables != nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor w, tables->gather("census_wide", wide_ids_tensor));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor e, tables->gather("census_embeddings", deep_ids_tensor));
    wide_values.assign(w.flat<float>().begin(), w.flat<float>().end());
    embedding_values.assign(e.flat<float>().begin(), e.flat<float>().end());
  } else {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars.value("census_wide"));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor e, vars.value("census_embeddings"));
    for (int64_t id : wide_ids) wide_values.push_back(w.flat<float>()[static_cast<size_t>(id)]);
    for (int64_t id : deep_ids) {
      auto row = e.flat<float>().subspan(static_cast<size_t>(id * kEmbeddingDim), kEmbeddingDim);
      embedding_values.insert(embedding_values.end(), row.begin(), row.end());
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor dnn, vars.value("census_dnn"));
  Inputs in{n, ids.data(), batch.components.at(1).flat<float>().data(), batch.components.at(2).flat<float>().data()};
  Parameters p{wide_values.data(), embedding_values.data(), dnn.flat<float>().data()};
  StepOutput step{run(in, p, train), n};
  if (!train) return step;
  const Output& out = step.output;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor dnn_gradient, Tensor::from_vector<float>(out.dnn_gradient, {dnn_parameters()}));
  if (tables != nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor wg, Tensor::from_vector<float>(out.wide_gradient,
                                                                   {static_cast<int64_t>(wide_ids.size()), 1}));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor eg, Tensor::from_vector<float>(out.embedding_gradient,
                                                                   {static_cast<int64_t>(deep_ids.size()), kEmbeddingDim}));
    CAPSTAN_RETURN_IF_ERROR(tables->apply_sparse("census_wide", wide_ids_tensor, wg));
    CAPSTAN_RETURN_IF_ERROR(tables->apply_sparse("census_embeddings", deep_ids_tensor, eg));
    CAPSTAN_RETURN_IF_ERROR(vars.apply_gradients({dnn_gradient}));
    return step;
  }
  // Mirrored tables take dense gradients (the sparse rows scattered).
  CAPSTAN_ASSIGN_OR_RETURN(Tensor wg, Tensor::zeros(DType::kFloat32, {wide_rows(), 1}));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor eg, Tensor::zeros(DType::kFloat32, {embedding_rows(), kEmbeddingDim}));
  auto w = wg.mutable_flat<float>();
  for (size_t k = 0; k < wide_ids.size(); ++k) w[static_cast<size_t>(wide_ids[k])] += out.wide_gradient[k];
  auto e = eg.mutable_flat<float>();
  for (size_t k = 0; k < deep_ids.size(); ++k) {
    for (int d = 0; d < kEmbeddingDim; ++d) {
      e[static_cast<size_t>(deep_ids[k] * kEmbeddingDim + d)] +=
          out.embedding_gradient[k * kEmbeddingDim + static_cast<size_t>(d)];
    }
  }
  CAPSTAN_RETURN_IF_ERROR(vars.apply_gradients({wg, eg, dnn_gradient}));
  return step;
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_REPLICA_H_
