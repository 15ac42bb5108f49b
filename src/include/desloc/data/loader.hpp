// Deterministic data loading, sharded by worker (site, rank) with no overlap.
//
// The training token stream (all shards concatenated) is cut into windows of T+1 tokens with
// stride T: window k holds tokens [kT, kT+T], so neighbours share only their boundary token and
// each token after the first is a target exactly once per epoch. Each epoch visits the windows
// in a permutation drawn from (seed, epoch) (Fisher-Yates driven by xoshiro256** seeded through
// splitmix64; no standard-library distributions, so it is identical on every platform). Worker w
// of N takes permutation positions w, w+N, w+2N, ... so workers never share a window, and the
// sequence a worker sees depends only on (data, seed, w, N, B, T): a restarted or multi-process
// run reproduces it exactly.
//
// Every worker takes the same number of windows per epoch, windows_per_epoch(), a multiple of B:
// floor(floor(windows / N) / B) * B. The few permutation positions beyond N * windows_per_epoch()
// are skipped in that epoch (a different few each epoch). A batch never straddles epochs: when a
// worker has used its share it moves on to the next epoch's permutation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "desloc/data/prepare.hpp"

namespace desloc::data {

struct LoaderState {
  std::uint64_t epoch = 0;
  // Windows this worker has taken in `epoch` (0, 1, 2, ...); the next one is permutation
  // position worker + cursor * num_workers.
  std::uint64_t cursor = 0;
};

class DataLoader {
 public:
  // worker = site * ranks_per_site + rank; num_workers = sites * ranks_per_site.
  // Throws ConfigError if the data cannot provide even one batch per worker per epoch (or B, T,
  // worker are out of range), DataError if a shard is bad or its vocab disagrees with data.vocab.
  DataLoader(const DatasetInfo& data, int B, int T, std::uint64_t seed, int worker,
             int num_workers);
  // The same over a training stream already open (open_train_tokens), which every loader of a
  // process may share.
  DataLoader(std::shared_ptr<const TokenStream> tokens, int B, int T, std::uint64_t seed,
             int worker, int num_workers);

  // Fills inputs and targets, each (B, T) row-major; targets are inputs shifted by one.
  void next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets);

  // Advances past `batches` batches without reading them, exactly as that many next() calls
  // would (a worker that joins late starts where it would be had it run from step 0).
  void skip(std::uint64_t batches = 1);

  // The state to checkpoint: restore(state()) on a loader built with the same arguments
  // reproduces the following batches exactly. restore() throws DataError if the cursor does
  // not fit this loader (saved with other data, B, T or worker count).
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);
  std::uint64_t windows_per_epoch() const;  // for this worker; a multiple of B
  std::uint64_t batches_per_epoch() const {
    return windows_per_epoch() / static_cast<std::uint64_t>(B_);
  }

 private:
  // The training stream, read in place a window at a time (token_files.hpp).
  std::shared_ptr<const TokenStream> tokens_;
  std::vector<std::int32_t> window_;  // one window's T + 1 tokens
  std::vector<std::uint64_t> perm_;   // window index at each permutation position of perm_epoch_
  int B_, T_, worker_, num_workers_;
  std::uint64_t seed_;
  LoaderState state_;
  std::uint64_t num_windows_ = 0;                 // over all workers
  std::uint64_t windows_per_epoch_ = 0;           // this worker's share, a multiple of B
  std::uint64_t perm_epoch_ = ~std::uint64_t{0};  // epoch perm_ was built for
  void build_permutation();
};

// The validation split as fixed, sequential (B, T) batches: batch i is always the same.
// Batch i row b is window i*B + b (windows as in DataLoader, stride T); a tail shorter than one
// batch is not evaluated.
class EvalLoader {
 public:
  // Throws ConfigError if the validation split holds fewer than one batch, DataError if its
  // shard is bad.
  EvalLoader(const DatasetInfo& data, int B, int T);
  std::uint64_t num_batches() const;
  void batch(std::uint64_t i, std::span<std::int32_t> inputs,
             std::span<std::int32_t> targets) const;

 private:
  std::shared_ptr<const TokenStream> tokens_;
  int B_, T_;
};

}  // namespace desloc::data
