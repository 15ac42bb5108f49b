// The CUDA backend of the GPT model: fp32 master weights on the device, cuBLAS for every
// GEMM (attention included), desloc kernels for the rest, one stream. The Model interface
// exposes host spans, so pinned host mirrors of params and grads are kept in step.
#include "gpt_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention.cuh"
#include "bias.cuh"
#include "cross_entropy.cuh"
#include "cuda_handles.hpp"
#include "desloc/core/cuda_check.hpp"
#include "desloc/core/error.hpp"
#include "encoder.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"

namespace desloc::model {

namespace {

using cuda::CublasHandle;
using cuda::CudaStream;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

// Seed of the parameters a fresh model holds, as in the CPU backend.
constexpr std::uint64_t kDefaultSeed = 1337;

// Row-major GEMM: C (M, N) = alpha * op(A) op(B) + beta * C, with op(A) (M, K), op(B) (K, N)
// and ld* the row strides of the stored matrices. cuBLAS is column-major, so this computes
// C^T = op(B)^T op(A)^T. Every GEMM of the model goes through gemm() or gemm_batched(): a
// later bf16 compute path replaces these two with cublasGemmEx on bf16 copies of the weights
// and activations, keeping the fp32 master weights here.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  DESLOC_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A,
                                  lda, &beta, C, ldc));
}

// `batch` independent row-major GEMMs, the i-th operands at A + i*stride_a etc.
void gemm_batched(cublasHandle_t handle, bool trans_a, bool trans_b, int M, int N, int K,
                  float alpha, const float* A, int lda, long long stride_a, const float* B, int ldb,
                  long long stride_b, float beta, float* C, int ldc, long long stride_c,
                  int batch) {
  DESLOC_CUBLAS_CHECK(cublasSgemmStridedBatched(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
      &alpha, B, ldb, stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch));
}

// Hands out 256-byte aligned pieces of one device allocation.
class Arena {
 public:
  static constexpr std::size_t kAlign = 64;  // floats
  std::size_t reserve(std::size_t count) {
    const std::size_t at = used_;
    used_ += (count + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  std::size_t used() const { return used_; }

 private:
  std::size_t used_ = 0;
};

class CudaGpt final : public Model {
 public:
  CudaGpt(const GptConfig& cfg, const BackendOptions& opts);

  const GptConfig& config() const override { return cfg_; }
  const ParamLayout& layout() const override { return layout_; }
  std::string backend_name() const override { return "cuda"; }

  std::span<float> params() override { return params_host_.span(); }
  void params_updated() override;
  std::span<float> grads() override { return grads_host_.span(); }

  float forward(const Batch& batch, std::span<float> logits) override;
  float forward_backward(const Batch& batch) override;

 private:
  // Saved activations of one block; (B, T, ...) sized for max_batch x context. Shapes below
  // use N = B*T rows.
  struct LayerActs {
    float* x;         // (N, C) block input (residual stream)
    float* ln1;       // (N, C)
    float* ln1_mean;  // (N)
    float* ln1_rstd;  // (N)
    float* q;         // (B, NH, T, hd)
    float* k;         // (B, NH, T, hd)
    float* v;         // (B, NH, T, hd)
    float* att;       // (B, NH, T, T) causal softmax probabilities
    float* atty;      // (N, C) attention output before the projection
    float* h;         // (N, C) x + attn(ln1(x))
    float* ln2;       // (N, C)
    float* ln2_mean;  // (N)
    float* ln2_rstd;  // (N)
    float* fc;        // (N, 4C) fc output + bias, before GELU
    float* gelu;      // (N, 4C)
  };

  float* param(const ParamTensor& t) const { return params_dev_.get() + t.offset; }
  float* grad(const ParamTensor& t) const { return grads_dev_.get() + t.offset; }
  const float* layer_param(int l, ParamLayout::LayerTensor t) const {
    return param(layout_.layer(l, t));
  }
  float* layer_grad(int l, ParamLayout::LayerTensor t) const { return grad(layout_.layer(l, t)); }

  void select_device() const;
  // Validates the batch, stages tokens, targets and the wte-backward grouping, uploads them.
  void upload_batch(const Batch& batch);
  void run_forward(int B, int T);   // up to and including the logits
  void run_backward(int B, int T);  // from dlogits (in logits_) to every gradient
  float mean_loss(int N);           // copies losses to the host; syncs the stream

  GptConfig cfg_;
  ParamLayout layout_;
  int device_ = 0;
  int max_batch_ = 0;
  std::size_t max_rows_ = 0;  // max_batch * context

  CudaStream stream_;
  CublasHandle cublas_;

  DeviceBuffer<float> params_dev_;
  DeviceBuffer<float> grads_dev_;
  PinnedBuffer<float> params_host_;
  PinnedBuffer<float> grads_host_;
  PinnedBuffer<float> losses_host_;

  // Int staging, host and device, same layout: inputs (N), targets (N), positions grouped
  // by token (N), offsets (N + 1), unique tokens (N). See upload_batch().
  PinnedBuffer<std::int32_t> ints_host_;
  DeviceBuffer<std::int32_t> ints_dev_;
  std::vector<std::int32_t> token_counts_;  // (V) host scratch for the grouping
  int unique_tokens_ = 0;

  DeviceBuffer<float> acts_dev_;
  std::vector<LayerActs> layers_;
  float* x_final_ = nullptr;   // (N, C) output of the last block
  float* lnf_ = nullptr;       // (N, C)
  float* lnf_mean_ = nullptr;  // (N)
  float* lnf_rstd_ = nullptr;  // (N)
  float* logits_ = nullptr;    // (N, V); dlogits in place during backward
  float* losses_ = nullptr;    // (N)
  // Scratch reused layer to layer. Forward uses rows3_ for qkv rows, rows1_ for projection
  // outputs and heads1_ for the attention output per head.
  float* dres_ = nullptr;            // (N, C) d(loss)/d(residual stream)
  float* rows1_ = nullptr;           // (N, C)
  float* rows3_ = nullptr;           // (N, 3C)
  float* rows4_ = nullptr;           // (N, 4C)
  float* heads1_ = nullptr;          // (B, NH, T, hd)
  float* dq_ = nullptr;              // (B, NH, T, hd)
  float* dk_ = nullptr;              // (B, NH, T, hd)
  float* dv_ = nullptr;              // (B, NH, T, hd)
  float* datt_ = nullptr;            // (B, NH, T, T)
  float* reduce_scratch_ = nullptr;  // chunked column sums (bias.cuh)
};

CudaGpt::CudaGpt(const GptConfig& cfg, const BackendOptions& opts)
    : cfg_(cfg),
      layout_(cfg),
      device_(opts.device),
      max_batch_(opts.max_batch),
      max_rows_(static_cast<std::size_t>(opts.max_batch) * static_cast<std::size_t>(cfg.context)),
      stream_((select_device(), CudaStream())),
      cublas_(stream_.get()) {
  if (opts.max_batch <= 0)
    throw ConfigError("max_batch = " + std::to_string(opts.max_batch) + " must be positive");
  const std::size_t total = layout_.total();
  params_dev_ = DeviceBuffer<float>(total, "parameters");
  grads_dev_ = DeviceBuffer<float>(total, "gradients");
  params_host_ = PinnedBuffer<float>(total, "host parameters");
  grads_host_ = PinnedBuffer<float>(total, "host gradients");
  losses_host_ = PinnedBuffer<float>(max_rows_, "host losses");
  ints_host_ = PinnedBuffer<std::int32_t>(5 * max_rows_ + 1, "host token staging");
  ints_dev_ = DeviceBuffer<std::int32_t>(5 * max_rows_ + 1, "token staging");
  token_counts_.assign(static_cast<std::size_t>(cfg.vocab), 0);

  const std::size_t N = max_rows_;
  const std::size_t C = static_cast<std::size_t>(cfg.d_model);
  const std::size_t V = static_cast<std::size_t>(cfg.vocab);
  const std::size_t att = static_cast<std::size_t>(opts.max_batch) * cfg.heads * cfg.context *
                          static_cast<std::size_t>(cfg.context);
  struct LayerOffsets {
    std::size_t x, ln1, ln1_mean, ln1_rstd, q, k, v, att, atty, h, ln2, ln2_mean, ln2_rstd, fc,
        gelu;
  };
  Arena arena;
  std::vector<LayerOffsets> offs(static_cast<std::size_t>(cfg.layers));
  for (auto& o : offs) {
    o.x = arena.reserve(N * C);
    o.ln1 = arena.reserve(N * C);
    o.ln1_mean = arena.reserve(N);
    o.ln1_rstd = arena.reserve(N);
    o.q = arena.reserve(N * C);
    o.k = arena.reserve(N * C);
    o.v = arena.reserve(N * C);
    o.att = arena.reserve(att);
    o.atty = arena.reserve(N * C);
    o.h = arena.reserve(N * C);
    o.ln2 = arena.reserve(N * C);
    o.ln2_mean = arena.reserve(N);
    o.ln2_rstd = arena.reserve(N);
    o.fc = arena.reserve(4 * N * C);
    o.gelu = arena.reserve(4 * N * C);
  }
  const std::size_t x_final = arena.reserve(N * C), lnf = arena.reserve(N * C),
                    lnf_mean = arena.reserve(N), lnf_rstd = arena.reserve(N),
                    logits = arena.reserve(N * V), losses = arena.reserve(N),
                    dres = arena.reserve(N * C), rows1 = arena.reserve(N * C),
                    rows3 = arena.reserve(3 * N * C), rows4 = arena.reserve(4 * N * C),
                    heads1 = arena.reserve(N * C), dq = arena.reserve(N * C),
                    dk = arena.reserve(N * C), dv = arena.reserve(N * C), datt = arena.reserve(att),
                    // Widest column sum: 4C bias columns, or 2 x C for a LayerNorm's pair.
      reduce =
          arena.reserve(cuda::column_sum_scratch(static_cast<int>(N), 4 * static_cast<int>(C)));
  acts_dev_ = DeviceBuffer<float>(arena.used(), "activations");
  float* base = acts_dev_.get();
  for (const auto& o : offs)
    layers_.push_back({base + o.x, base + o.ln1, base + o.ln1_mean, base + o.ln1_rstd, base + o.q,
                       base + o.k, base + o.v, base + o.att, base + o.atty, base + o.h,
                       base + o.ln2, base + o.ln2_mean, base + o.ln2_rstd, base + o.fc,
                       base + o.gelu});
  x_final_ = base + x_final;
  lnf_ = base + lnf;
  lnf_mean_ = base + lnf_mean;
  lnf_rstd_ = base + lnf_rstd;
  logits_ = base + logits;
  losses_ = base + losses;
  dres_ = base + dres;
  rows1_ = base + rows1;
  rows3_ = base + rows3;
  rows4_ = base + rows4;
  heads1_ = base + heads1;
  dq_ = base + dq;
  dk_ = base + dk;
  dv_ = base + dv;
  datt_ = base + datt;
  reduce_scratch_ = base + reduce;

  // Same default parameters as the CPU backend; the trainer overwrites them with
  // init_params(seed) or a checkpoint and then calls params_updated().
  init_params(layout_, cfg_, kDefaultSeed, params_host_.span());
  params_updated();
}

void CudaGpt::select_device() const { DESLOC_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaGpt::params_updated() {
  select_device();
  DESLOC_CUDA_CHECK(cudaMemcpyAsync(params_dev_.get(), params_host_.get(),
                                    layout_.total() * sizeof(float), cudaMemcpyHostToDevice,
                                    stream_.get()));
  // The caller may write the host params again as soon as we return.
  stream_.synchronize();
}

void CudaGpt::upload_batch(const Batch& batch) {
  const int B = batch.B;
  const int T = batch.T;
  if (B <= 0 || B > max_batch_)
    throw ConfigError("batch size B = " + std::to_string(B) + " is outside [1, max_batch = " +
                      std::to_string(max_batch_) + "]; raise max_batch for the cuda backend");
  if (T <= 0 || T > cfg_.context)
    throw ConfigError("sequence length T = " + std::to_string(T) +
                      " is outside [1, context = " + std::to_string(cfg_.context) + "]");
  const std::size_t N = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (batch.inputs.size() != N || batch.targets.size() != N)
    throw ConfigError("batch holds " + std::to_string(batch.inputs.size()) + " inputs and " +
                      std::to_string(batch.targets.size()) +
                      " targets; expected B*T = " + std::to_string(N));
  const std::size_t M = max_rows_;
  std::int32_t* ints = ints_host_.get();
  std::int32_t* inputs = ints;
  std::int32_t* targets = ints + M;
  std::int32_t* positions = ints + 2 * M;
  std::int32_t* offsets = ints + 3 * M;
  std::int32_t* unique = ints + 4 * M + 1;
  for (std::size_t i = 0; i < N; ++i) {
    const std::int32_t in = batch.inputs[i];
    const std::int32_t tg = batch.targets[i];
    if (in < 0 || in >= cfg_.vocab || tg < 0 || tg >= cfg_.vocab)
      throw DataError("token at batch position " + std::to_string(i) + " (input " +
                      std::to_string(in) + ", target " + std::to_string(tg) +
                      ") is outside the vocabulary [0, " + std::to_string(cfg_.vocab) + ")");
    inputs[i] = in;
    targets[i] = tg;
  }
  // Group positions by input token (counting sort, stable: ascending positions per token),
  // so the wte backward sums each token's rows in a fixed order without atomics.
  std::fill(token_counts_.begin(), token_counts_.end(), 0);
  for (std::size_t i = 0; i < N; ++i) ++token_counts_[static_cast<std::size_t>(inputs[i])];
  int u = 0;
  std::int32_t running = 0;
  for (int tok = 0; tok < cfg_.vocab; ++tok) {
    const std::int32_t count = token_counts_[static_cast<std::size_t>(tok)];
    if (count == 0) continue;
    unique[u] = tok;
    offsets[u] = running;
    token_counts_[static_cast<std::size_t>(tok)] = running;  // now the write cursor
    running += count;
    ++u;
  }
  offsets[u] = running;
  unique_tokens_ = u;
  for (std::size_t i = 0; i < N; ++i)
    positions[token_counts_[static_cast<std::size_t>(inputs[i])]++] = static_cast<std::int32_t>(i);
  DESLOC_CUDA_CHECK(cudaMemcpyAsync(ints_dev_.get(), ints, ints_host_.size() * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice, stream_.get()));
}

void CudaGpt::run_forward(int B, int T) {
  const int C = cfg_.d_model, NH = cfg_.heads, hd = cfg_.head_dim(), V = cfg_.vocab;
  const int N = B * T;
  const int BH = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  cudaStream_t s = stream_.get();
  cublasHandle_t cb = cublas_.get();
  const std::int32_t* inputs = ints_dev_.get();

  DESLOC_CUDA_CHECK(cuda::encoder_forward(layers_.empty() ? x_final_ : layers_[0].x, inputs,
                                          param(layout_.wte()), param(layout_.wpe()), B, T, C, s));
  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerActs& a = layers_[static_cast<std::size_t>(l)];
    float* x_next = l + 1 < cfg_.layers ? layers_[static_cast<std::size_t>(l) + 1].x : x_final_;
    using LT = ParamLayout;
    // ln1 -> qkv (N, 3C) = ln1 @ Wqkv^T + b
    DESLOC_CUDA_CHECK(cuda::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x,
                                              layer_param(l, LT::kLn1W), layer_param(l, LT::kLn1B),
                                              N, C, s));
    gemm(cb, false, true, N, 3 * C, C, 1.0f, a.ln1, C, layer_param(l, LT::kQkvW), C, 0.0f, rows3_,
         3 * C);
    DESLOC_CUDA_CHECK(cuda::add_bias(rows3_, layer_param(l, LT::kQkvB), N, 3 * C, s));
    DESLOC_CUDA_CHECK(cuda::split_heads(a.q, rows3_, 3 * C, 0, B, T, NH, hd, s));
    DESLOC_CUDA_CHECK(cuda::split_heads(a.k, rows3_, 3 * C, C, B, T, NH, hd, s));
    DESLOC_CUDA_CHECK(cuda::split_heads(a.v, rows3_, 3 * C, 2 * C, B, T, NH, hd, s));
    // att (BH, T, T) = softmax_causal(q k^T / sqrt(hd)); y (BH, T, hd) = att v
    const long long head_stride = static_cast<long long>(T) * hd;
    const long long att_stride = static_cast<long long>(T) * T;
    gemm_batched(cb, false, true, T, T, hd, scale, a.q, hd, head_stride, a.k, hd, head_stride, 0.0f,
                 a.att, T, att_stride, BH);
    DESLOC_CUDA_CHECK(cuda::causal_softmax_forward(a.att, BH * T, T, s));
    gemm_batched(cb, false, false, T, hd, T, 1.0f, a.att, T, att_stride, a.v, hd, head_stride, 0.0f,
                 heads1_, hd, head_stride, BH);
    DESLOC_CUDA_CHECK(cuda::merge_heads(a.atty, heads1_, C, 0, B, T, NH, hd, s));
    // h = x + atty @ Wproj^T + bproj
    gemm(cb, false, true, N, C, C, 1.0f, a.atty, C, layer_param(l, LT::kAttnProjW), C, 0.0f, rows1_,
         C);
    DESLOC_CUDA_CHECK(
        cuda::residual_forward(a.h, a.x, rows1_, layer_param(l, LT::kAttnProjB), N, C, s));
    // ln2 -> fc (N, 4C) -> GELU -> proj; x_next = h + mlp
    DESLOC_CUDA_CHECK(cuda::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.h,
                                              layer_param(l, LT::kLn2W), layer_param(l, LT::kLn2B),
                                              N, C, s));
    gemm(cb, false, true, N, 4 * C, C, 1.0f, a.ln2, C, layer_param(l, LT::kFcW), C, 0.0f, a.fc,
         4 * C);
    DESLOC_CUDA_CHECK(cuda::bias_gelu_forward(a.fc, a.gelu, layer_param(l, LT::kFcB), N, 4 * C, s));
    gemm(cb, false, true, N, C, 4 * C, 1.0f, a.gelu, 4 * C, layer_param(l, LT::kFcProjW), 4 * C,
         0.0f, rows1_, C);
    DESLOC_CUDA_CHECK(
        cuda::residual_forward(x_next, a.h, rows1_, layer_param(l, LT::kFcProjB), N, C, s));
  }
  DESLOC_CUDA_CHECK(cuda::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x_final_,
                                            param(layout_.lnf_w()), param(layout_.lnf_b()), N, C,
                                            s));
  // Tied LM head: logits (N, V) = lnf @ wte^T
  gemm(cb, false, true, N, V, C, 1.0f, lnf_, C, param(layout_.wte()), C, 0.0f, logits_, V);
}

void CudaGpt::run_backward(int B, int T) {
  const int C = cfg_.d_model, NH = cfg_.heads, hd = cfg_.head_dim(), V = cfg_.vocab;
  const int N = B * T;
  const int BH = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  cudaStream_t s = stream_.get();
  cublasHandle_t cb = cublas_.get();
  const std::int32_t* ints = ints_dev_.get();
  const std::int32_t* positions = ints + 2 * max_rows_;
  const std::int32_t* offsets = ints + 3 * max_rows_;
  const std::int32_t* unique = ints + 4 * max_rows_ + 1;
  float* dlogits = logits_;
  using LT = ParamLayout;

  // Every tensor below is overwritten except wte, which the LM head and the embedding both
  // feed; zeroing all keeps the wpe rows past T at zero too.
  DESLOC_CUDA_CHECK(cudaMemsetAsync(grads_dev_.get(), 0, layout_.total() * sizeof(float), s));
  // LM head: dwte (V, C) = dlogits^T @ lnf; dlnf (N, C) = dlogits @ wte
  gemm(cb, true, false, V, C, N, 1.0f, dlogits, V, lnf_, C, 0.0f, grad(layout_.wte()), C);
  gemm(cb, false, false, N, C, V, 1.0f, dlogits, V, param(layout_.wte()), C, 0.0f, rows1_, C);
  DESLOC_CUDA_CHECK(cudaMemsetAsync(dres_, 0, static_cast<std::size_t>(N) * C * sizeof(float), s));
  DESLOC_CUDA_CHECK(cuda::layernorm_backward(dres_, rows1_, x_final_, param(layout_.lnf_w()),
                                             lnf_mean_, lnf_rstd_, N, C, s));
  DESLOC_CUDA_CHECK(cuda::layernorm_param_backward(grad(layout_.lnf_w()), grad(layout_.lnf_b()),
                                                   rows1_, x_final_, lnf_mean_, lnf_rstd_, N, C,
                                                   reduce_scratch_, s));

  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const LayerActs& a = layers_[static_cast<std::size_t>(l)];
    // dres = d(loss)/d(x_next). MLP: x_next = h + gelu(ln2 @ Wfc^T + bfc) @ Wfcproj^T + b
    gemm(cb, true, false, C, 4 * C, N, 1.0f, dres_, C, a.gelu, 4 * C, 0.0f,
         layer_grad(l, LT::kFcProjW), 4 * C);
    DESLOC_CUDA_CHECK(
        cuda::column_sum(layer_grad(l, LT::kFcProjB), dres_, N, C, reduce_scratch_, s));
    gemm(cb, false, false, N, 4 * C, C, 1.0f, dres_, C, layer_param(l, LT::kFcProjW), 4 * C, 0.0f,
         rows4_, 4 * C);
    DESLOC_CUDA_CHECK(cuda::gelu_backward(rows4_, a.fc, N, 4 * C, s));
    gemm(cb, true, false, 4 * C, C, N, 1.0f, rows4_, 4 * C, a.ln2, C, 0.0f, layer_grad(l, LT::kFcW),
         C);
    DESLOC_CUDA_CHECK(
        cuda::column_sum(layer_grad(l, LT::kFcB), rows4_, N, 4 * C, reduce_scratch_, s));
    gemm(cb, false, false, N, C, 4 * C, 1.0f, rows4_, 4 * C, layer_param(l, LT::kFcW), C, 0.0f,
         rows1_, C);
    DESLOC_CUDA_CHECK(cuda::layernorm_backward(dres_, rows1_, a.h, layer_param(l, LT::kLn2W),
                                               a.ln2_mean, a.ln2_rstd, N, C, s));
    DESLOC_CUDA_CHECK(
        cuda::layernorm_param_backward(layer_grad(l, LT::kLn2W), layer_grad(l, LT::kLn2B), rows1_,
                                       a.h, a.ln2_mean, a.ln2_rstd, N, C, reduce_scratch_, s));

    // dres = d(loss)/d(h). Attention: h = x + atty @ Wproj^T + bproj
    gemm(cb, true, false, C, C, N, 1.0f, dres_, C, a.atty, C, 0.0f, layer_grad(l, LT::kAttnProjW),
         C);
    DESLOC_CUDA_CHECK(
        cuda::column_sum(layer_grad(l, LT::kAttnProjB), dres_, N, C, reduce_scratch_, s));
    gemm(cb, false, false, N, C, C, 1.0f, dres_, C, layer_param(l, LT::kAttnProjW), C, 0.0f, rows1_,
         C);
    DESLOC_CUDA_CHECK(cuda::split_heads(heads1_, rows1_, C, 0, B, T, NH, hd, s));  // dy per head
    const long long head_stride = static_cast<long long>(T) * hd;
    const long long att_stride = static_cast<long long>(T) * T;
    // datt (BH, T, T) = dy v^T; dv = att^T dy
    gemm_batched(cb, false, true, T, T, hd, 1.0f, heads1_, hd, head_stride, a.v, hd, head_stride,
                 0.0f, datt_, T, att_stride, BH);
    gemm_batched(cb, true, false, T, hd, T, 1.0f, a.att, T, att_stride, heads1_, hd, head_stride,
                 0.0f, dv_, hd, head_stride, BH);
    DESLOC_CUDA_CHECK(cuda::causal_softmax_backward(datt_, a.att, BH * T, T, s));
    // scores = q k^T * scale: dq = dscores k * scale; dk = dscores^T q * scale
    gemm_batched(cb, false, false, T, hd, T, scale, datt_, T, att_stride, a.k, hd, head_stride,
                 0.0f, dq_, hd, head_stride, BH);
    gemm_batched(cb, true, false, T, hd, T, scale, datt_, T, att_stride, a.q, hd, head_stride, 0.0f,
                 dk_, hd, head_stride, BH);
    DESLOC_CUDA_CHECK(cuda::merge_heads(rows3_, dq_, 3 * C, 0, B, T, NH, hd, s));
    DESLOC_CUDA_CHECK(cuda::merge_heads(rows3_, dk_, 3 * C, C, B, T, NH, hd, s));
    DESLOC_CUDA_CHECK(cuda::merge_heads(rows3_, dv_, 3 * C, 2 * C, B, T, NH, hd, s));
    // qkv = ln1 @ Wqkv^T + bqkv
    gemm(cb, true, false, 3 * C, C, N, 1.0f, rows3_, 3 * C, a.ln1, C, 0.0f,
         layer_grad(l, LT::kQkvW), C);
    DESLOC_CUDA_CHECK(
        cuda::column_sum(layer_grad(l, LT::kQkvB), rows3_, N, 3 * C, reduce_scratch_, s));
    gemm(cb, false, false, N, C, 3 * C, 1.0f, rows3_, 3 * C, layer_param(l, LT::kQkvW), C, 0.0f,
         rows1_, C);
    DESLOC_CUDA_CHECK(cuda::layernorm_backward(dres_, rows1_, a.x, layer_param(l, LT::kLn1W),
                                               a.ln1_mean, a.ln1_rstd, N, C, s));
    DESLOC_CUDA_CHECK(
        cuda::layernorm_param_backward(layer_grad(l, LT::kLn1W), layer_grad(l, LT::kLn1B), rows1_,
                                       a.x, a.ln1_mean, a.ln1_rstd, N, C, reduce_scratch_, s));
    // dres = d(loss)/d(x)
  }

  // Embeddings: dwte += grouped rows of dres (the LM head's share is already there); dwpe.
  DESLOC_CUDA_CHECK(cuda::wte_backward(grad(layout_.wte()), dres_, unique, offsets, positions,
                                       unique_tokens_, C, s));
  DESLOC_CUDA_CHECK(cuda::wpe_backward(grad(layout_.wpe()), dres_, B, T, C, s));
}

float CudaGpt::mean_loss(int N) {
  DESLOC_CUDA_CHECK(cudaMemcpyAsync(losses_host_.get(), losses_,
                                    static_cast<std::size_t>(N) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_.get()));
  stream_.synchronize();
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += losses_host_.get()[i];
  return static_cast<float>(sum / N);
}

float CudaGpt::forward(const Batch& batch, std::span<float> logits) {
  select_device();
  const std::size_t N = static_cast<std::size_t>(batch.B) * static_cast<std::size_t>(batch.T);
  if (!logits.empty() && logits.size() != N * static_cast<std::size_t>(cfg_.vocab))
    throw ConfigError(
        "logits span holds " + std::to_string(logits.size()) +
        " floats; expected B*T*V = " + std::to_string(N * static_cast<std::size_t>(cfg_.vocab)));
  upload_batch(batch);
  run_forward(batch.B, batch.T);
  const int n = static_cast<int>(N);
  DESLOC_CUDA_CHECK(cuda::cross_entropy_forward(losses_, logits_, ints_dev_.get() + max_rows_, n,
                                                cfg_.vocab, stream_.get()));
  if (!logits.empty())
    DESLOC_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_, logits.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_.get()));
  return mean_loss(n);
}

float CudaGpt::forward_backward(const Batch& batch) {
  select_device();
  upload_batch(batch);
  const int n = batch.B * batch.T;
  run_forward(batch.B, batch.T);
  DESLOC_CUDA_CHECK(cuda::cross_entropy_forward_backward(
      losses_, logits_, ints_dev_.get() + max_rows_, n, cfg_.vocab, 1.0f / n, stream_.get()));
  run_backward(batch.B, batch.T);
  DESLOC_CUDA_CHECK(cudaMemcpyAsync(grads_host_.get(), grads_dev_.get(),
                                    layout_.total() * sizeof(float), cudaMemcpyDeviceToHost,
                                    stream_.get()));
  return mean_loss(n);  // synchronises the stream, so grads() is valid on return
}

}  // namespace

std::unique_ptr<Model> make_cuda_gpt(const GptConfig& cfg, const BackendOptions& opts) {
  const int count = cuda_device_count();
  if (opts.device < 0 || opts.device >= count)
    throw ConfigError("CUDA device " + std::to_string(opts.device) + " requested but " +
                      std::to_string(count) + " device(s) are visible; set device in [0, " +
                      std::to_string(count) + ") or check CUDA_VISIBLE_DEVICES");
  return std::make_unique<CudaGpt>(cfg, opts);
}

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

}  // namespace desloc::model
