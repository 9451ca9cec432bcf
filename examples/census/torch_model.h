// The census Wide & Deep model as a LibTorch module: what model.h computes
// by hand, written as a user writes it, with autograd for the gradients.
//
//   logit = wide + deep
//   wide  = bias + sum of the wide table's rows for the example's wide ids
//   deep  = MLP 100-75-50-25 (ReLU) -> 1 over [the 8-dimensional embeddings
//           of the kDeepFields categorical columns, the numeric features]
//
// With Tables::kParameterServers (ps and hybrid modes) the wide table and
// the embeddings are capstan::torch::Embeddings: their rows live on the
// parameter servers and a step reads only its batch's rows. With
// Tables::kMirrored (sync mode: every parameter mirrored by
// capstan::torch::MirroredModule, which mirrors parameters and nothing else)
// they are torch::nn::Embeddings, dense parameters of the module, with the
// same initial rows. Parameters (variable names: the prefix + these), the
// same either way, so checkpoints of every mode match: wide.weight
// [bias_id(), 1], bias [1], embeddings.weight [embedding_rows(), 8],
// deep.{0,2,4,6,8}.{weight,bias}.
#ifndef CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_
#define CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_

#include <capstan/torch.h>

#include <cmath>

#include "features.h"

namespace census {

// Where the wide table and the embeddings live (see above).
enum class Tables { kParameterServers, kMirrored };

struct WideDeepImpl : torch::nn::Module {
  // `seed`: the embeddings' initial rows; the MLP's come from torch's
  // generator (torch::manual_seed).
  explicit WideDeepImpl(uint64_t seed = 0, Tables tables = Tables::kParameterServers) {
    // Zeros, as Keras' linear model starts.
    const capstan::torch::EmbeddingOptions wide_options{.num_embeddings = bias_id(), .dim = 1, .stddev = 0};
    // TF's embedding_column default deviation, 1/sqrt(dim).
    const capstan::torch::EmbeddingOptions embedding_options{
        .num_embeddings = embedding_rows(), .dim = kEmbeddingDim,
        .stddev = 1.0 / std::sqrt(static_cast<double>(kEmbeddingDim)), .seed = seed};
    // Registered in this order (wide, bias, embeddings, deep) in either
    // layout: named_parameters() lists them so.
    const bool on_servers = tables == Tables::kParameterServers;
    if (on_servers) wide = register_module("wide", capstan::torch::Embedding(wide_options));
    else local_wide = register_module("wide", local_embedding(wide_options));
    bias = register_parameter("bias", torch::zeros({1}));
    if (on_servers) embeddings = register_module("embeddings", capstan::torch::Embedding(embedding_options));
    else local_embeddings = register_module("embeddings", local_embedding(embedding_options));
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
    torch::Tensor deep_ids = wide_ids.narrow(1, 0, kDeepFields);
    torch::Tensor wide_rows = wide ? wide(wide_ids) : local_wide(wide_ids);
    torch::Tensor embedded = embeddings ? embeddings(deep_ids) : local_embeddings(deep_ids);
    torch::Tensor x = torch::cat({embedded.flatten(1), numeric}, 1);
    return wide_rows.sum({1, 2}) + bias + deep->forward(x).squeeze(1);
  }

  // Tables::kParameterServers:
  capstan::torch::Embedding wide{nullptr};
  capstan::torch::Embedding embeddings{nullptr};
  // Tables::kMirrored:
  torch::nn::Embedding local_wide{nullptr};
  torch::nn::Embedding local_embeddings{nullptr};
  torch::Tensor bias;
  torch::nn::Sequential deep{nullptr};

 private:
  // A torch::nn::Embedding holding the rows capstan::torch::Embedding would
  // create on the parameter servers.
  static torch::nn::Embedding local_embedding(const capstan::torch::EmbeddingOptions& options) {
    torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(options.num_embeddings, options.dim));
    capstan::torch::EmbeddingImpl reference(options);
    capstan::Tensor initial = reference.initial_value().value();
    torch::NoGradGuard no_grad;
    embedding->weight.copy_(capstan::torch::to_torch(initial).value());
    return embedding;
  }
};
TORCH_MODULE(WideDeep);

// The model's two tables alone, under the model's names ("wide",
// "embeddings"), of a model built with Tables::kParameterServers: what the
// hybrid modes' PsModule pulls and pushes (and the program creates on the
// parameter servers), while capstan::torch::MirroredModule mirrors the
// model's parameters (bias, deep.*).
struct TablesImpl : torch::nn::Module {
  explicit TablesImpl(WideDeepImpl& model) {
    register_module("wide", model.wide);
    register_module("embeddings", model.embeddings);
  }
};

// What the program creates: prefix "census/", `wide` (Adagrad) on the wide
// part (the table and the bias), `deep` (Adam) on the deep part, both tables
// in two shards. A worker's PsModule uses only the prefix.
inline capstan::torch::PsOptions ps_options(const capstan::Optimizer& wide, const capstan::Optimizer& deep) {
  capstan::torch::PsOptions options;
  options.prefix = "census/";
  options.optimizer = deep;
  options.optimizers["wide.weight"] = wide;
  options.optimizers["bias"] = wide;
  options.partitioners["wide.weight"] = capstan::Partitioner::fixed_shards(2);
  options.partitioners["embeddings.weight"] = capstan::Partitioner::fixed_shards(2);
  return options;
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_TORCH_MODEL_H_
