// Token files read in place (token_files.hpp): desloc's shards, llm.c's .bin files and nanoGPT's
// raw train.bin read as one stream across file boundaries, in uint16 and uint32; every way a
// file can be wrong named with its path; and a loader over another tool's files giving the
// batches it gives over desloc's shards of the same tokens.
#include "desloc/data/token_files.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/data/loader.hpp"
#include "desloc/data/prepare.hpp"
#include "desloc/data/shard.hpp"
#include "temp_dir_test.hpp"

namespace desloc::data {
namespace {

template <class T>
void write_raw(const std::string& path, const std::vector<std::int32_t>& header,
               std::span<const T> tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()),
            static_cast<std::streamsize>(header.size() * sizeof(std::int32_t)));
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size_bytes()));
}

// llm.c's header: 256 int32 with the magic, the version and the token count.
std::vector<std::int32_t> llmc_header(bool u32, std::size_t count) {
  std::vector<std::int32_t> h(256, 0);
  h[0] = u32 ? 20240801 : 20240520;
  h[1] = u32 ? 7 : 1;
  h[2] = static_cast<std::int32_t>(count);
  return h;
}

template <class T>
std::vector<T> iota_tokens(std::size_t n, T first) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class TokenFilesTest : public test_support::TempDirTest {
 protected:
  // Reads the whole stream in pieces of `piece` tokens.
  static std::vector<std::int32_t> read_all(const TokenStream& s, std::size_t piece) {
    std::vector<std::int32_t> all(s.size());
    for (std::size_t at = 0; at < all.size(); at += piece)
      s.read(at, std::span(all).subspan(at, std::min(piece, all.size() - at)));
    return all;
  }
  template <class E>
  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const E& e) {
      return e.what();
    }
    ADD_FAILURE() << "no exception thrown";
    return "";
  }
};

// The same 1000 tokens, split over files differently in each format, read back whole across
// every boundary (pieces of 7 tokens straddle them).
TEST_F(TokenFilesTest, EveryFormatReadsTheSameStreamAcrossFileBoundaries) {
  const auto u16 = iota_tokens<std::uint16_t>(1000, 0);
  std::vector<std::int32_t> expect(u16.begin(), u16.end());
  const std::span<const std::uint16_t> all(u16);

  write_shard(path("d0.bin"), all.first(300), 1000);
  write_shard(path("d1.bin"), all.subspan(300, 0), 1000);  // an empty shard in between
  write_shard(path("d2.bin"), all.subspan(300), 1000);
  write_raw(path("l0.bin"), llmc_header(false, 512), all.first(512));
  write_raw(path("l1.bin"), llmc_header(false, 488), all.subspan(512));
  write_raw<std::uint16_t>(path("n.bin"), {}, all);

  const std::vector<std::pair<TokenFormat, std::vector<std::string>>> layouts = {
      {TokenFormat::kDesloc, {"d0.bin", "d1.bin", "d2.bin"}},
      {TokenFormat::kLlmc, {"l0.bin", "l1.bin"}},
      {TokenFormat::kNanogpt, {"n.bin"}}};
  for (const auto& [format, names] : layouts) {
    SCOPED_TRACE(to_string(format));
    std::vector<TokenFile> files;
    for (const auto& n : names) files.push_back(inspect_token_file(path(n), format));
    const TokenStream s(files, 1000, "train");
    ASSERT_EQ(s.size(), 1000u);
    EXPECT_EQ(read_all(s, 7), expect);
    std::vector<std::int32_t> one(1);
    EXPECT_THROW(s.read(1000, one), Error);  // past the end
  }
}

// Ids past 65,535 in llm.c's uint32 files and desloc's dtype-2 shards.
TEST_F(TokenFilesTest, Uint32TokensCarryVocabulariesPast65536) {
  const auto u32 = iota_tokens<std::uint32_t>(200, 128000);
  write_raw(path("big.bin"), llmc_header(true, u32.size()), std::span<const std::uint32_t>(u32));
  write_shard(path("big_shard.bin"), std::span<const std::uint32_t>(u32), 128256);
  for (const auto& [format, name] : {std::pair{TokenFormat::kLlmc, "big.bin"},
                                     std::pair{TokenFormat::kDesloc, "big_shard.bin"}}) {
    const TokenFile f = inspect_token_file(path(name), format);
    EXPECT_EQ(f.width, 4);
    const TokenStream s({f}, 128256, "train");
    const auto got = read_all(s, 64);
    EXPECT_EQ(got.front(), 128000);
    EXPECT_EQ(got.back(), 128199);
    // The vocabulary bounds every id, named with the file, the token and its offset (a desloc
    // shard records the vocabulary it was written with, which must be the dataset's).
    const std::string why = error_of<DataError>(
        [&] { TokenStream({inspect_token_file(path(name), format)}, 128100, "train"); });
    EXPECT_NE(why.find(path(name)), std::string::npos) << why;
    if (format == TokenFormat::kDesloc) {
      EXPECT_NE(why.find("was written with vocab 128256"), std::string::npos) << why;
    } else {
      EXPECT_NE(why.find("token 100 (offset 1424) has id 128100 >= vocab 128100 (model.vocab"),
                std::string::npos)
          << why;
    }
  }
}

TEST_F(TokenFilesTest, AFileThatDisagreesWithItsHeaderIsNamedWithWhatIsWrong) {
  const auto u16 = iota_tokens<std::uint16_t>(100, 0);
  const std::span<const std::uint16_t> t(u16);
  auto rejected = [&](const std::string& name, TokenFormat format) {
    return error_of<DataError>([&] { inspect_token_file(path(name), format); });
  };
  write_raw(path("short.bin"), llmc_header(false, 101), t);
  EXPECT_NE(rejected("short.bin", TokenFormat::kLlmc).find("truncated: the header says 101 tokens"),
            std::string::npos);
  write_raw(path("long.bin"), llmc_header(false, 99), t);
  EXPECT_NE(rejected("long.bin", TokenFormat::kLlmc).find("2 trailing bytes"), std::string::npos);
  std::vector<std::int32_t> h = llmc_header(false, 100);
  h[0] = 20240522;  // llm.c's eval files
  write_raw(path("magic.bin"), h, t);
  EXPECT_NE(rejected("magic.bin", TokenFormat::kLlmc).find("magic 20240522 version 1"),
            std::string::npos);
  write_raw(path("tiny.bin"), {1, 2}, std::span<const std::uint16_t>());
  EXPECT_NE(rejected("tiny.bin", TokenFormat::kLlmc).find("the header needs 1024 bytes"),
            std::string::npos);
  write_raw(path("odd.bin"), {}, t);
  { std::ofstream(path("odd.bin"), std::ios::binary | std::ios::app).put('\0'); }
  EXPECT_NE(rejected("odd.bin", TokenFormat::kNanogpt).find("not a whole number of 2-byte tokens"),
            std::string::npos);
  EXPECT_NE(rejected("odd.bin", TokenFormat::kNanogpt).find(path("odd.bin")), std::string::npos);
  EXPECT_NE(rejected("odd.bin", TokenFormat::kDesloc).find("wrong magic"), std::string::npos);
  EXPECT_NE(rejected("missing.bin", TokenFormat::kNanogpt).find("cannot be opened"),
            std::string::npos);
  // A desloc shard's CRC32C is checked when the stream opens.
  write_shard(path("crc.bin"), t, 256);
  {
    std::fstream f(path("crc.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  const std::string why = error_of<DataError>(
      [&] { TokenStream({inspect_token_file(path("crc.bin"), TokenFormat::kDesloc)}, 256, "t"); });
  EXPECT_NE(why.find("CRC32C mismatch"), std::string::npos) << why;
}

// nanoGPT's train.bin / val.bin and llm.c's *_train*.bin (in name order) / *_val*.bin, found in
// data.dir by their names; the loader over them gives the batches it gives over desloc shards.
TEST_F(TokenFilesTest, AnotherToolsDirectoryLoadsAsDeslocShardsOfTheSameTokens) {
  const auto u16 = iota_tokens<std::uint16_t>(4000, 0);
  const std::span<const std::uint16_t> all(u16);
  std::vector<std::uint16_t> val(600);
  for (std::size_t i = 0; i < val.size(); ++i) val[i] = static_cast<std::uint16_t>(3000 + i % 7);

  DatasetInfo shards;
  shards.vocab = 4096;
  shards.train_shards = {path("train_000.bin"), path("train_001.bin")};
  write_shard(shards.train_shards[0], all.first(2500), 4096);
  write_shard(shards.train_shards[1], all.subspan(2500), 4096);
  shards.val_shard = path("val_d.bin");
  write_shard(shards.val_shard, val, 4096);

  std::filesystem::create_directories(path("nano"));
  write_raw<std::uint16_t>(path("nano/train.bin"), {}, all);
  write_raw<std::uint16_t>(path("nano/val.bin"), {}, val);
  std::filesystem::create_directories(path("llmc"));
  // Named out of order on purpose: name order is stream order.
  write_raw(path("llmc/x_train_000002.bin"), llmc_header(false, 1500), all.subspan(2500));
  write_raw(path("llmc/x_train_000001.bin"), llmc_header(false, 2500), all.first(2500));
  write_raw(path("llmc/x_val_000000.bin"), llmc_header(false, val.size()),
            std::span<const std::uint16_t>(val));

  const int B = 3, T = 16;
  auto batches = [&](const DatasetInfo& d) {
    DataLoader loader(d, B, T, 99, 1, 2);
    const EvalLoader eval(d, B, T);
    std::vector<std::int32_t> x(B * T), y(B * T), out;
    for (int i = 0; i < 70; ++i) {  // past an epoch (41 batches a worker)
      loader.next(x, y);
      out.insert(out.end(), x.begin(), x.end());
    }
    eval.batch(eval.num_batches() - 1, x, y);
    out.insert(out.end(), y.begin(), y.end());
    return out;
  };
  const auto reference = batches(shards);
  for (const TokenFormat format : {TokenFormat::kNanogpt, TokenFormat::kLlmc}) {
    SCOPED_TRACE(to_string(format));
    const DatasetInfo d =
        external_dataset(path(format == TokenFormat::kNanogpt ? "nano" : "llmc"), format, 4096);
    EXPECT_EQ(d.train_tokens, 4000u);
    EXPECT_EQ(d.val_tokens, 600u);
    EXPECT_EQ(d.tokenizer_identity(), to_string(format));
    EXPECT_EQ(batches(d), reference);
    EXPECT_THROW(d.load_tokenizer(), ConfigError);
  }
  std::filesystem::create_directories(path("empty"));
  const std::string why =
      error_of<DataError>([&] { external_dataset(path("empty"), TokenFormat::kLlmc, 4096); });
  EXPECT_NE(why.find("holds no llm.c training files"), std::string::npos) << why;
  EXPECT_NE(error_of<DataError>([&] {
              external_dataset(path("empty"), TokenFormat::kNanogpt, 4096);
            }).find(path("empty/train.bin")),
            std::string::npos);
}

}  // namespace
}  // namespace desloc::data
