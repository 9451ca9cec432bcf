// Small LibTorch models the torch tests train both on Capstan and locally.
#ifndef CAPSTAN_TORCH_TESTS_TORCH_TEST_MODELS_H_
#define CAPSTAN_TORCH_TESTS_TORCH_TEST_MODELS_H_

#include <capstan/torch.h>

namespace capstan::torch::testing {

struct Mlp : ::torch::nn::Module {
  Mlp() {
    first = register_module("first", ::torch::nn::Linear(4, 8));
    second = register_module("second", ::torch::nn::Linear(8, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return second(::torch::relu(first(x))); }
  ::torch::nn::Linear first{nullptr}, second{nullptr};
};

// An embedding of 20 rows of 3 (a Capstan Embedding on the parameter
// servers, or LibTorch's dense one for the local reference), summed over the
// ids of an example, then a linear head.
struct Tower : ::torch::nn::Module {
  // hash_table: the rows in a dynamic embedding table (zeros at first).
  explicit Tower(bool on_ps, bool hash_table = false) {
    if (hash_table) {
      ps_embedding = register_module("embedding", Embedding(EmbeddingOptions{.dim = 3, .stddev = 0, .hash_table = true}));
    } else if (on_ps) {
      ps_embedding =
          register_module("embedding", Embedding(EmbeddingOptions{.num_embeddings = 20, .dim = 3, .seed = 5}));
    } else {
      dense_embedding = register_module("embedding", ::torch::nn::Embedding(20, 3));
    }
    head = register_module("head", ::torch::nn::Linear(3, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& ids) {
    ::torch::Tensor rows = ps_embedding ? ps_embedding(ids) : dense_embedding(ids);
    return head(rows.sum(1));
  }
  Embedding ps_embedding{nullptr};
  ::torch::nn::Embedding dense_embedding{nullptr};
  ::torch::nn::Linear head{nullptr};
};

// Linear, then BatchNorm: buffers running_mean, running_var (float32) and
// num_batches_tracked (int64).
struct Normed : ::torch::nn::Module {
  Normed() {
    fc = register_module("fc", ::torch::nn::Linear(4, 6));
    bn = register_module("bn", ::torch::nn::BatchNorm1d(6));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return bn(fc(x)); }
  ::torch::nn::Linear fc{nullptr};
  ::torch::nn::BatchNorm1d bn{nullptr};
};

}  // namespace capstan::torch::testing

#endif  // CAPSTAN_TORCH_TESTS_TORCH_TEST_MODELS_H_
