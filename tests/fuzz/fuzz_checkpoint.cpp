// libFuzzer target for the checkpoint reader (src/train/checkpoint.cpp). load_checkpoint only
// takes a path, so each input is written to a per-process scratch file. Each input is read
// twice: as it is, and with the header's payload size and CRC32C rewritten to match, so that
// mutations get past the checksum and reach the payload parser. validate_checkpoint (the
// streaming check) runs on the same file and must reach the same verdict.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "desloc/core/error.hpp"
#include "desloc/core/hash.hpp"
#include "desloc/train/checkpoint.hpp"
#include "fuzz_common.hpp"

namespace {

// checkpoint.hpp: magic[8] | u32 version | u32 reserved | u64 payload bytes | u32 crc | payload
constexpr std::size_t kSizeOffset = 16;
constexpr std::size_t kCrcOffset = 24;
constexpr std::size_t kHeaderBytes = 28;

const desloc::fuzz::ScratchFile& scratch() {
  static const desloc::fuzz::ScratchFile file("checkpoint");
  return file;
}

void load(std::span<const std::uint8_t> bytes) {
  const std::string& path = scratch().write(bytes);
  // validate_checkpoint streams the file instead of loading it, and must agree with the load.
  std::optional<desloc::train::CheckpointInfo> info;
  std::string validate_error;
  try {
    info = desloc::train::validate_checkpoint(path);
  } catch (const desloc::DataError& e) {
    validate_error = e.message();
  }
  desloc::train::Checkpoint ck;
  try {
    ck = desloc::train::load_checkpoint(path);
  } catch (const desloc::DataError& e) {
    if (info)
      desloc::fuzz::oracle_failure(
          "fuzz_checkpoint",
          "validate_checkpoint accepted what load_checkpoint refused: " + e.message());
    return;
  }
  if (!info)
    desloc::fuzz::oracle_failure(
        "fuzz_checkpoint",
        "load_checkpoint accepted what validate_checkpoint refused: " + validate_error);
  if (info->step != ck.step || info->config_hash != ck.config_hash ||
      info->file_bytes != bytes.size())
    desloc::fuzz::oracle_failure("fuzz_checkpoint", "validate_checkpoint and load disagree");
  // A loaded checkpoint is restored into live buffers without further checks.
  if (ck.sites.empty()) desloc::fuzz::oracle_failure("fuzz_checkpoint", "no workers");
  const std::size_t n = ck.sites[0].params.size();
  for (const auto& w : ck.sites)
    if (w.params.size() != n || w.u.size() != n || w.v.size() != n || w.optim_t < 0)
      desloc::fuzz::oracle_failure("fuzz_checkpoint", "inconsistent worker buffers");
  if (ck.outer_ref.size() != ck.outer_momentum.size() || ck.step < 0)
    desloc::fuzz::oracle_failure("fuzz_checkpoint", "inconsistent outer optimizer or step");
  // The period switches go straight into a SyncPolicy: in order, positive periods, bounded.
  if (ck.switches.size() > desloc::sync::kMaxPeriodSwitches)
    desloc::fuzz::oracle_failure("fuzz_checkpoint", "too many period switches");
  for (std::size_t i = 0; i < ck.switches.size(); ++i)
    if (ck.switches[i].kx < 1 || ck.switches[i].ku < 0 || ck.switches[i].kv < 0 ||
        (i > 0 && ck.switches[i].after <= ck.switches[i - 1].after))
      desloc::fuzz::oracle_failure("fuzz_checkpoint", "an impossible period switch");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  load(bytes);
  if (size >= kHeaderBytes) {
    std::vector<std::uint8_t> repaired(bytes.begin(), bytes.end());
    const std::span<const std::uint8_t> payload(repaired.data() + kHeaderBytes,
                                                size - kHeaderBytes);
    desloc::fuzz::store_le(repaired.data() + kSizeOffset, payload.size(), 8);
    desloc::fuzz::store_le(repaired.data() + kCrcOffset, desloc::crc32c(payload), 4);
    load(repaired);
  }
  return 0;
}
