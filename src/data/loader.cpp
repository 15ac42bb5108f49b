// Deterministic, worker-sharded training batches and fixed validation batches.
#include "desloc/data/loader.hpp"

#include <algorithm>

#include "desloc/core/error.hpp"
#include "desloc/data/token_files.hpp"

namespace desloc::data {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a bijective mixer, used to derive per-epoch seeds and
// to seed xoshiro. Defined here so that permutations never depend on the standard library.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** 1.0 (Blackman, Vigna 2018).
class Xoshiro256 {
 public:
  explicit Xoshiro256(std::uint64_t seed) {
    for (auto& word : s_) word = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound) without modulo bias: reject the lowest (2^64 mod bound) values.
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

std::uint64_t epoch_seed(std::uint64_t seed, std::uint64_t epoch) {
  std::uint64_t state = seed;
  const std::uint64_t a = splitmix64(state);
  state = a ^ epoch;
  return splitmix64(state);
}

// Windows of T+1 tokens with stride T: window k holds tokens [kT, kT+T]. Neighbours share
// only their boundary token, so each token after the first is a target exactly once.
std::uint64_t count_windows(std::size_t tokens, int T) {
  return tokens < 2 ? 0 : (tokens - 1) / static_cast<std::uint64_t>(T);
}

// Window `window` read in place through `scratch` (T + 1 tokens).
void fill_window(const TokenStream& tokens, std::uint64_t window, int T,
                 std::vector<std::int32_t>& scratch, std::int32_t* inputs, std::int32_t* targets) {
  scratch.resize(static_cast<std::size_t>(T) + 1);
  tokens.read(window * static_cast<std::uint64_t>(T), scratch);
  std::copy_n(scratch.begin(), T, inputs);
  std::copy_n(scratch.begin() + 1, T, targets);
}

void check_batch_spans(std::span<std::int32_t> inputs, std::span<std::int32_t> targets, int B,
                       int T, const char* who) {
  const auto need = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (inputs.size() != need || targets.size() != need)
    throw Error(
        std::string(who) + ": inputs and targets must each hold B*T = " + std::to_string(need) +
        " tokens, got " + std::to_string(inputs.size()) + " and " + std::to_string(targets.size()));
}

}  // namespace

DataLoader::DataLoader(const DatasetInfo& data, int B, int T, std::uint64_t seed, int worker,
                       int num_workers)
    : DataLoader(open_train_tokens(data), B, T, seed, worker, num_workers) {}

DataLoader::DataLoader(std::shared_ptr<const TokenStream> tokens, int B, int T, std::uint64_t seed,
                       int worker, int num_workers)
    : tokens_(std::move(tokens)),
      B_(B),
      T_(T),
      worker_(worker),
      num_workers_(num_workers),
      seed_(seed) {
  if (B <= 0 || T <= 0)
    throw ConfigError("data loader: batch size B=" + std::to_string(B) +
                      " and context T=" + std::to_string(T) + " must both be positive");
  if (num_workers <= 0 || worker < 0 || worker >= num_workers)
    throw ConfigError("data loader: worker " + std::to_string(worker) +
                      " is outside [0, num_workers=" + std::to_string(num_workers) + ")");
  num_windows_ = count_windows(tokens_->size(), T);
  const std::uint64_t per_worker = num_windows_ / static_cast<std::uint64_t>(num_workers);
  windows_per_epoch_ = per_worker / static_cast<std::uint64_t>(B) * static_cast<std::uint64_t>(B);
  if (windows_per_epoch_ == 0)
    throw ConfigError("data loader: the training split has " + std::to_string(tokens_->size()) +
                      " tokens = " + std::to_string(num_windows_) +
                      " windows of T+1=" + std::to_string(T + 1) +
                      " tokens, too few for one batch of B=" + std::to_string(B) + " on each of " +
                      std::to_string(num_workers) +
                      " workers; use a larger corpus or smaller B, T or worker count");
  build_permutation();
}

std::uint64_t DataLoader::windows_per_epoch() const { return windows_per_epoch_; }

void DataLoader::build_permutation() {
  // Fisher-Yates from the back, driven by xoshiro256** seeded from (seed, epoch).
  perm_.resize(num_windows_);
  for (std::uint64_t i = 0; i < num_windows_; ++i) perm_[i] = i;
  Xoshiro256 rng(epoch_seed(seed_, state_.epoch));
  for (std::uint64_t i = num_windows_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
  perm_epoch_ = state_.epoch;
}

void DataLoader::next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
  check_batch_spans(inputs, targets, B_, T_, "DataLoader::next");
  if (state_.cursor + static_cast<std::uint64_t>(B_) > windows_per_epoch_) {
    ++state_.epoch;
    state_.cursor = 0;
  }
  if (perm_epoch_ != state_.epoch) build_permutation();
  const auto N = static_cast<std::uint64_t>(num_workers_);
  for (int b = 0; b < B_; ++b) {
    const std::uint64_t position = static_cast<std::uint64_t>(worker_) + state_.cursor * N;
    const auto row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T_);
    fill_window(*tokens_, perm_[position], T_, window_, inputs.data() + row, targets.data() + row);
    ++state_.cursor;
  }
}

void DataLoader::skip(std::uint64_t batches) {
  const auto B = static_cast<std::uint64_t>(B_);
  for (std::uint64_t i = 0; i < batches; ++i) {
    if (state_.cursor + B > windows_per_epoch_) {
      ++state_.epoch;
      state_.cursor = 0;
    }
    state_.cursor += B;
  }
}

void DataLoader::restore(const LoaderState& s) {
  if (s.cursor > windows_per_epoch_)
    throw DataError("data loader state: cursor " + std::to_string(s.cursor) +
                    " exceeds this worker's " + std::to_string(windows_per_epoch_) +
                    " windows per epoch; the state was saved with a different dataset, batch "
                    "shape or worker count");
  state_ = s;
  if (perm_epoch_ != state_.epoch) build_permutation();
}

EvalLoader::EvalLoader(const DatasetInfo& data, int B, int T) : B_(B), T_(T) {
  if (B <= 0 || T <= 0)
    throw ConfigError("eval loader: batch size B=" + std::to_string(B) +
                      " and context T=" + std::to_string(T) + " must both be positive");
  tokens_ = open_val_tokens(data);
  if (num_batches() == 0)
    throw ConfigError("eval loader: the validation split '" + data.val_shard + "' has " +
                      std::to_string(tokens_->size()) + " tokens, fewer than one batch of B=" +
                      std::to_string(B) + " windows of T+1=" + std::to_string(T + 1) +
                      " tokens needs; use a larger val_fraction or smaller B or T");
}

std::uint64_t EvalLoader::num_batches() const {
  return count_windows(tokens_->size(), T_) / static_cast<std::uint64_t>(B_);
}

void EvalLoader::batch(std::uint64_t i, std::span<std::int32_t> inputs,
                       std::span<std::int32_t> targets) const {
  check_batch_spans(inputs, targets, B_, T_, "EvalLoader::batch");
  if (i >= num_batches())
    throw Error("EvalLoader::batch: index " + std::to_string(i) + " is outside [0, " +
                std::to_string(num_batches()) + ")");
  std::vector<std::int32_t> scratch;
  for (int b = 0; b < B_; ++b) {
    const auto row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T_);
    fill_window(*tokens_, i * static_cast<std::uint64_t>(B_) + static_cast<std::uint64_t>(b), T_,
                scratch, inputs.data() + row, targets.data() + row);
  }
}

}  // namespace desloc::data
