// Codecs for wide-area payloads (issue 14): how a state's average may travel in fewer bytes
// than fp32. Each codec encodes a span of floats into a self-contained byte buffer and decodes
// it back; the same bytes decode to the same floats on every machine running the same binary,
// which keeps a networked average equal to the in-process one.
//
//   fp32  the floats themselves (4 bytes each).
//   bf16  the upper half of each float, rounded to nearest even (2 bytes; NaN stays NaN).
//   int8, int4  block-wise symmetric integers: each block of `block` floats carries one float
//         scale s = max|x| / q_max (q_max = 127, 7) and the integers round(x / s) in
//         [-q_max, q_max]; the last block may be shorter.
//   int2  four levels per block, (q - 1.5) s for q = 0..3 with s the block's root mean square:
//         x / s in (-inf, -1], (-1, 0), [0, 1), [1, inf) decode to -1.5 s, -0.5 s, 0.5 s, 1.5 s.
//         Values beyond 2 s are clipped (error feedback carries the rest). A max-scaled
//         three-level int2 (-s, 0, s with s = max|x|) lost 16-32% of the loss on the LM bench:
//         most values of a block rounded to zero.
// A block holding a NaN or an infinity gets a NaN scale, so it decodes to NaN and the payload
// guard sees it.
// Layout: the scales (float32, one per block) first, then the integers, packed low bits first
// (int4: two per byte, each stored as q + q_max; int2: four per byte, each q).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace desloc::sync {

enum class Codec : std::uint8_t { kFp32, kBf16, kInt8, kInt4, kInt2 };

// Values per scale. 128 from measurement: on the LM bench int4 at blocks of 128 lost no more
// loss than at 64 at any period (Kx = 16, 64, 256: -0.06%, +0.03%, +0.10% of fp32 against
// +0.21%, +0.22%, +0.66%) and sends 0.133x of fp32 instead of 0.141x (docs/sync.md).
inline constexpr std::size_t kDefaultCodecBlock = 128;

std::string_view to_string(Codec c);
// "fp32", "bf16", "int8", "int4", "int2"; nullopt otherwise.
std::optional<Codec> parse_codec(std::string_view name);

// The largest integer magnitude of a max-scaled block codec (127, 7); 0 for fp32, bf16 and
// int2 (scaled by its block's RMS).
int codec_qmax(Codec c);
// Bytes of n floats encoded (0 for a block that is not a positive multiple of 4).
std::size_t encoded_bytes(Codec c, std::size_t n, std::size_t block = kDefaultCodecBlock);

// Encodes src into dst, which must hold exactly encoded_bytes(c, src.size(), block) bytes.
// Throws Error on a size mismatch or a block that is not a positive multiple of 4 (blocks start
// on byte boundaries).
void encode(Codec c, std::span<const float> src, std::span<std::byte> dst,
            std::size_t block = kDefaultCodecBlock);
// Decodes src (encoded_bytes(c, dst.size(), block) bytes) into dst.
void decode(Codec c, std::span<const std::byte> src, std::span<float> dst,
            std::size_t block = kDefaultCodecBlock);

}  // namespace desloc::sync
