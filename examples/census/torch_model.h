// The census Wide & Deep model as a LibTorch module: what model.h computes
// by hand, written as a user writes it, with autograd for the gradients.
//
//   logit = wide + deep
//   wide  = bias + sum of the wide table's rows for the example's wide ids
//   deep  = MLP 100-75-50-25 (ReLU) -> 1 over [the 8-dimensional embeddings
//           of the kDeepFields categorical columns, the numeric features]
//
// The wide table and the embeddings are capstan::torch::Embeddings: their
// rows live on the parameter servers and a step reads only its batch's rows.
// Parameters (variable names: the prefix + these): wide.weight
// [bias_id(), 1], bias [1], embeddings.weight [embedding_rows(), 8],
// deep.{0,2,4,6,8}.{weight,bias}.
#ifndef CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_
#define CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_

#include <capstan/torch.h>

#include <cmath>

#include "features.h"

namespace census {

struct WideDeepImpl : torch::nn::Module {
  // `seed`: the embeddings' initial rows; the MLP's come from torch's
  // generator (torch::manual_seed).
  explicit WideDeepImpl(uint64_t seed = 0) {
    // Zeros, as Keras' linear model starts.
    wide = register_module("wide", capstan::torch::Embedding(
                                       capstan::torch::EmbeddingOptions{.num_embeddings = bias_id(), .dim = 1,
                                                                        .stddev = 0}));
    bias = register_parameter("bias", torch::zeros({1}));
    // TF's embedding_column default deviation, 1/sqrt(dim).
    embeddings = register_module(
        "embeddings", capstan::torch::Embedding(capstan::torch::EmbeddingOptions{
                          .num_embeddings = embedding_rows(), .dim = kEmbeddingDim,
                          .stddev = 1.0 / std::sqrt(static_cast<double>(kEmbeddingDim)), .seed = seed}));
    const int inputs = kDeepFields * kEmbeddingDim + kNumeric;
    deep = register_module("deep", torch::nn::Sequential(
                                       torch::nn::Linear(inputs, 100), torch::nn::ReLU(), torch::nn::Linear(100, 75),
                                       torch::nn::ReLU(), torch::nn::Linear(75, 50), torch::nn::ReLU(),
                                       torch::nn::Linear(50, 25), torch::nn::ReLU(), torch::nn::Linear(25, 1)));
    // Keras' Dense defaults: Glorot-uniform weights, zero biases.
    torch::NoGradGuard no_grad;
    for (auto& item : deep->named_parameters()) {
      if (item.key().ends_with("weight")) torch::nn::init::xavier_uniform_(item.value());
      else torch::nn::init::zeros_(item.value());
    }
  }

  // wide_ids int64[n, kNumWideFields], numeric float32[n, kNumeric] ->
  // logits float32[n].
  torch::Tensor forward(const torch::Tensor& wide_ids, const torch::Tensor& numeric) {
    torch::Tensor wide_part = wide(wide_ids).sum({1, 2}) + bias;
    torch::Tensor deep_ids = wide_ids.narrow(1, 0, kDeepFields);
    torch::Tensor x = torch::cat({embeddings(deep_ids).flatten(1), numeric}, 1);
    return wide_part + deep->forward(x).squeeze(1);
  }

  capstan::torch::Embedding wide{nullptr};
  torch::Tensor bias;
  capstan::torch::Embedding embeddings{nullptr};
  torch::nn::Sequential deep{nullptr};
};
TORCH_MODULE(WideDeep);

// What the program creates: prefix "census/", Adagrad on the wide part (the
// table and the bias), Adam on the deep part, both tables in two shards.
inline capstan::torch::PsOptions ps_options(double wide_learning_rate, double deep_learning_rate) {
  capstan::torch::PsOptions options;
  options.prefix = "census/";
  options.optimizer = capstan::Optimizer::adam(deep_learning_rate);
  options.optimizers["wide.weight"] = capstan::Optimizer::adagrad(wide_learning_rate);
  options.optimizers["bias"] = capstan::Optimizer::adagrad(wide_learning_rate);
  options.partitioners["wide.weight"] = capstan::Partitioner::fixed_shards(2);
  options.partitioners["embeddings.weight"] = capstan::Partitioner::fixed_shards(2);
  return options;
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_
