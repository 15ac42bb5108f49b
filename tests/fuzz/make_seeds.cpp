// Writes the seed corpus under tests/fuzz/corpus/ with the project's own writers: real frames
// from the wire encoder, a checkpoint from save_checkpoint, shards from write_shard, configs
// from configs/ and the defaults document, topologies from docs/ and to_toml. Run it by hand
// after a format change:  build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/core/file_io.hpp"
#include "desloc/data/shard.hpp"
#include "desloc/topology/topology.hpp"
#include "desloc/train/checkpoint.hpp"
#include "desloc/train/config.hpp"
#include "desloc/transport/wire.hpp"

namespace fs = std::filesystem;
namespace wire = desloc::transport;

namespace {

void put(const fs::path& file, std::span<const std::uint8_t> bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}
void put(const fs::path& file, const std::string& text) {
  put(file, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}
std::string slurp(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void wire_seeds(const fs::path& dir) {
  wire::Challenge challenge;
  for (std::size_t i = 0; i < challenge.nonce.size(); ++i)
    challenge.nonce[i] = static_cast<std::uint8_t>(i * 7);
  wire::Membership membership;
  membership.epoch = 3;
  membership.sites = {"east", "west", "north"};
  membership.members = {{"east", 0, {1, 2, 3}}, {"west", 0, {4}}, {"north", 0, {}}};
  membership.ring_order = {2, 0, 1};

  put(dir / "hello.bin", wire::encode(wire::Hello{1, "west", 2, {0xde, 0xad, 0xbe, 0xef}, 42}));
  // A rank reconnecting to a restarted coordinator names the epoch it trains in.
  wire::Hello reconnect{1, "north", 0, {0x01, 0x02}, 42};
  reconnect.epoch = 7;
  put(dir / "hello_reconnect.bin", wire::encode(reconnect));
  // The keys the agreement hash digests, for the coordinator to name one that differs.
  wire::Hello with_config{1, "east", 0, {0x03}, 42};
  with_config.config = {{"sync.kx", "16"}, {"sync.codec_x", "\"int4\""}, {"job.sites", "[A, B]"}};
  put(dir / "hello_config.bin", wire::encode(with_config));
  put(dir / "challenge.bin", wire::encode(challenge));
  put(dir / "auth_response.bin",
      wire::encode(wire::AuthResponse{std::vector<std::uint8_t>(32, 7)}));
  put(dir / "auth_response_empty.bin", wire::encode(wire::AuthResponse{}));
  put(dir / "welcome.bin", wire::encode(wire::Welcome{"registered west/2"}));
  put(dir / "reject.bin",
      wire::encode(wire::Reject{wire::RejectCode::kConfigHash, "hash differs"}));
  // One Reject per code this build knows (reject_code_name says "unknown" past the last), so a
  // new code gets its seed without an edit here.
  for (std::uint16_t code = 1; code < 64; ++code) {
    const auto rc = static_cast<wire::RejectCode>(code);
    const std::string_view name = wire::reject_code_name(rc);
    if (name == "unknown") break;
    put(dir / ("reject_" + std::string(name) + ".bin"),
        wire::encode(wire::Reject{rc, std::string(name)}));
  }
  put(dir / "membership.bin", wire::encode(membership));
  put(dir / "membership_empty.bin", wire::encode(wire::Membership{}));
  // An epoch after a failure: rolls back to resume_step, says why, and takes a site back.
  wire::Membership rejoined = membership;
  rejoined.epoch = 5;
  rejoined.resume_step = 96;
  rejoined.note = "site west lost (disconnected); site west rejoins";
  rejoined.joining = {"west"};
  put(dir / "membership_rejoin.bin", wire::encode(rejoined));
  put(dir / "heartbeat.bin", wire::encode(wire::Heartbeat{3, 1234}));
  put(dir / "status.bin", wire::encode(wire::Status{1, 3, {"west/0", "1 more site"}}));
  put(dir / "recovery.bin", wire::encode(wire::Recovery{4, "site west went silent"}));
  put(dir / "recover.bin",
      wire::encode(wire::Recover{4, {100, 120}, {5, 6, 7}, "ring broke", 5000, 40, 31000}));
  put(dir / "recover_empty.bin", wire::encode(wire::Recover{}));
  put(dir / "bye.bin", wire::encode(wire::Bye{4, 600}));

  // A handshake as one stream, then the same stream cut in the middle of its last frame.
  std::vector<std::uint8_t> stream;
  for (const auto& f : {wire::encode(challenge), wire::encode(wire::AuthResponse{{1, 2, 3}}),
                        wire::encode(wire::Hello{1, "east", 0, {9}, 7}),
                        wire::encode(wire::Welcome{"ok"}), wire::encode(membership)})
    stream.insert(stream.end(), f.begin(), f.end());
  put(dir / "handshake_stream.bin", stream);
  stream.resize(stream.size() - 5);
  put(dir / "handshake_truncated.bin", stream);
  // A recovery round as one stream: heartbeat, the coordinator closes the epoch, the rank
  // offers its snapshots, the next epoch takes a site back, the rank finishes.
  stream.clear();
  for (const auto& f : {wire::encode(wire::Heartbeat{4, 99}),
                        wire::encode(wire::Recovery{4, "site west went silent"}),
                        wire::encode(wire::Recover{4, {96}, {8, 9}, "peer gone"}),
                        wire::encode(rejoined), wire::encode(wire::Bye{5, 600})})
    stream.insert(stream.end(), f.begin(), f.end());
  put(dir / "recovery_stream.bin", stream);
  // A frame of a type this build does not know.
  put(dir / "unknown_type.bin",
      wire::encode_frame(wire::MessageType{99}, std::vector<std::uint8_t>{1, 2}));
}

void config_seeds(const fs::path& dir, const fs::path& source) {
  for (const auto& entry : fs::directory_iterator(source / "configs"))
    if (entry.path().extension() == ".toml")
      put(dir / entry.path().filename(), slurp(entry.path()));
  put(dir / "defaults.toml", desloc::train::default_config_toml());
  put(dir / "empty.toml", std::string());
  put(dir / "elastic_join.toml",
      std::string("[sync]\nmethod = \"favg\"\nworkers = 2\nkx = 8\nphase_x = 3\nouter = "
                  "\"nesterov\"\njoin_step = 100\njoin_workers = 3\n"));
  put(dir / "job_sites.toml",
      std::string("[sync]\nmethod = \"desloc\"\nkx = 4\nku = 12\nkv = 24\nphase_v = 23\n[job]\n"
                  "sites = [\"a\", \"b-2\", \"c_3\"]\nranks_per_site = 2\ntoken = \"s3cret\"\n"
                  "[transport]\nlanes = 2\nchunk_bytes = 4\ndeadline_s = 0.5\n"));
  put(dir / "job_tls.toml",
      std::string("[job]\nsites = [\"a\", \"b\"]\ntoken = \"s3cret\"\ntls = true\n"
                  "tls_cert = \"/etc/desloc/coord.pem\"\ntls_key = \"/etc/desloc/coord.key\"\n"
                  "tls_ca = \"/etc/desloc/ca.pem\"\n"));
}

void topology_seeds(const fs::path& dir, const fs::path& source) {
  put(dir / "topology_het3.toml", slurp(source / "docs" / "topology_het3.toml"));
  desloc::topology::Topology one;
  one.sites = {{"solo", 0.1}};
  put(dir / "one_site.toml", desloc::topology::to_toml(one));
  desloc::topology::Topology two;
  two.meta = {{"source", "make_seeds"}};
  two.sites = {{"A", 0.0885, 9.5e-9}, {"B", 0.120}};  // A with a steal
  two.links = {{"A", "B", 12.5e6, 0.01, 11e6}, {"B", "A", 12.5e6, 0.01, 0}};
  put(dir / "two_sites.toml", desloc::topology::to_toml(two));
}

void checkpoint_seeds(const fs::path& dir) {
  desloc::train::Checkpoint ck;
  ck.config_hash = 0x0123456789abcdefull;
  ck.step = 120;
  ck.tokens_seen = 4096;
  for (int w = 0; w < 2; ++w) {
    desloc::train::SiteState s;
    s.optim_t = 120;
    s.loader = {1, static_cast<std::uint64_t>(5 + w)};
    s.params = {0.5f, -1.25f, 3.0f};
    s.u = {0.01f, 0.02f, -0.03f};
    s.v = {1e-4f, 2e-4f, 3e-4f};
    ck.sites.push_back(s);
  }
  ck.outer_ref = {0.5f, -1.0f, 2.0f};
  ck.outer_momentum = {0.0f, 0.1f, -0.1f};
  desloc::train::save_checkpoint((dir / "two_workers_outer.ckpt").string(), ck);
  // Period switches (version 6): two re-plans in force.
  desloc::train::Checkpoint switched = ck;
  switched.switches = {{32, 64, 192, 384}, {96, 8, 0, 0}};
  desloc::train::save_checkpoint((dir / "two_workers_switches.ckpt").string(), switched);
  // Compressed states (version 4): u's reference and both workers' feedback, v's reference.
  desloc::train::Checkpoint coded = ck;
  coded.outer_ref.clear();
  coded.outer_momentum.clear();
  coded.codec_ref[1] = {0.005f, 0.01f, -0.02f};
  coded.codec_ref[2] = {1e-4f, 1e-4f, 2e-4f};
  for (auto& w : coded.sites) w.codec_feedback[1] = {1e-3f, -2e-3f, 0.0f};
  desloc::train::save_checkpoint((dir / "two_workers_codec.ckpt").string(), coded);
  ck.sites.resize(1);
  ck.outer_ref.clear();
  ck.outer_momentum.clear();
  desloc::train::save_checkpoint((dir / "one_worker.ckpt").string(), ck);
  ck.sites[0].params.clear();
  ck.sites[0].u.clear();
  ck.sites[0].v.clear();
  desloc::train::save_checkpoint((dir / "no_params.ckpt").string(), ck);
}

void shard_seeds(const fs::path& dir) {
  const std::vector<std::uint16_t> text = {72, 101, 108, 108, 111, 44, 32, 98, 114, 111, 119, 110};
  desloc::data::write_shard((dir / "bytes.tok").string(), text, 256);
  desloc::data::write_shard((dir / "empty.tok").string(), std::span<const std::uint16_t>(), 256);
  const std::vector<std::uint16_t> wide = {0, 65535, 1, 40000};
  desloc::data::write_shard((dir / "vocab_65536.tok").string(), wide, 65536);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>   (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path source = DESLOC_SOURCE_DIR;
  try {
    wire_seeds(out / "wire");
    config_seeds(out / "config", source);
    topology_seeds(out / "topology", source);
    checkpoint_seeds(out / "checkpoint");
    shard_seeds(out / "shard");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
