// Wide-area payload codecs (codec.hpp).
#include "desloc/sync/codec.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "desloc/core/error.hpp"

namespace desloc::sync {
namespace {

constexpr std::array<std::string_view, 5> kNames = {"fp32", "bf16", "int8", "int4", "int2"};

// Integers per byte of a block codec.
std::size_t per_byte(Codec c) {
  switch (c) {
    case Codec::kInt4:
      return 2;
    case Codec::kInt2:
      return 4;
    default:
      return 1;
  }
}

std::size_t blocks(std::size_t n, std::size_t block) { return (n + block - 1) / block; }

void check_sizes(Codec c, std::size_t n, std::size_t bytes, std::size_t block, const char* what) {
  if (block == 0 || block % 4 != 0)
    throw Error(std::string("codec: ") + what + " with a block of " + std::to_string(block) +
                " elements; it must be a positive multiple of 4");
  const std::size_t want = encoded_bytes(c, n, block);
  if (bytes != want)
    throw Error(std::string("codec: ") + what + " " + std::string(to_string(c)) + " of " +
                std::to_string(n) + " floats needs " + std::to_string(want) + " bytes, got " +
                std::to_string(bytes));
}

std::uint16_t to_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);      // a quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return static_cast<std::uint16_t>(rounded >> 16);
}

float from_bf16(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

// One block's scale: max|x| / qmax, NaN when the block holds a non-finite value. On the bits:
// |x| is x with the sign bit cleared, and non-negative floats order like their bit patterns,
// so one integer max (which vectorises) finds both the largest magnitude and any Inf or NaN
// (bits >= 0x7f800000).
float block_scale(const float* x, std::size_t n, int qmax) {
  std::uint32_t amax = 0;
  for (std::size_t i = 0; i < n; ++i)
    amax = std::max(amax, std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu);
  if (amax >= 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  return std::bit_cast<float>(amax) / static_cast<float>(qmax);
}

// round(x / s) + qmax in [0, 2 qmax], rounded to nearest even: adding and subtracting 1.5 * 2^23
// rounds any |v| < 2^22 exactly (and vectorises, unlike nearbyint). The clamp keeps a value
// that rounding pushed past max|x| / s on the grid.
struct Quantiser {
  float inv, lim;
  int qmax;
  std::uint8_t operator()(float x) const {
    constexpr float kMagic = 12582912.0f;
    const float v = std::min(std::max(x * inv, -lim), lim);
    return static_cast<std::uint8_t>(static_cast<int>((v + kMagic) - kMagic) + qmax);
  }
};

// int2's scale: the block's root mean square, NaN when the block holds a non-finite value.
float block_rms(const float* x, std::size_t n) {
  std::uint32_t amax = 0;
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu);
    sum += x[i] * x[i];
  }
  if (amax >= 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  return std::sqrt(sum / static_cast<float>(n));
}

// int2's level of x / s: 0, 1, 2, 3 for (-inf, -1], (-1, 0), [0, 1), [1, inf), decoded as
// (q - 1.5) s; branch-free, so it vectorises. Symmetric: -x gets 3 - q (x != 0).
struct Quartiles {
  float inv;
  std::uint8_t operator()(float x) const {
    const float t = x * inv;
    return static_cast<std::uint8_t>(1 + int(t >= 0.0f) + int(t >= 1.0f) - int(t <= -1.0f));
  }
};

// Calls s = fn(x, n, packed) for each block of src: its n values and where its packed integers
// (pb per byte) go; fn returns the block's scale, stored in the block's slot.
template <class Fn>
void for_each_block_to_encode(std::span<const float> src, std::span<std::byte> dst,
                              std::size_t block, std::size_t pb, Fn&& fn) {
  const std::size_t nb = blocks(src.size(), block);
  auto* q = reinterpret_cast<std::uint8_t*>(dst.data() + nb * sizeof(float));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t lo = b * block;
    const float s = fn(src.data() + lo, std::min(block, src.size() - lo), q + lo / pb);
    std::memcpy(dst.data() + b * sizeof(float), &s, sizeof(float));
  }
}

void encode_int2(std::span<const float> src, std::span<std::byte> dst, std::size_t block) {
  for_each_block_to_encode(
      src, dst, block, 4, [](const float* x, std::size_t n, std::uint8_t* out) {
        const float s = block_rms(x, n);
        const Quartiles quant{s > 0.0f ? 1.0f / s : 0.0f};
        std::size_t i = 0;
        for (; i + 3 < n; i += 4)
          out[i / 4] = static_cast<std::uint8_t>(quant(x[i]) | quant(x[i + 1]) << 2 |
                                                 quant(x[i + 2]) << 4 | quant(x[i + 3]) << 6);
        if (i < n) {
          std::uint8_t last = 0;
          for (std::size_t k = 0; i + k < n; ++k)
            last |= static_cast<std::uint8_t>(quant(x[i + k]) << (2 * k));
          out[i / 4] = last;
        }
        return s;
      });
}

// Calls fn(scale, out, packed, n) for each block of an encoded buffer: its float scale, where
// its n decoded values go, and its packed integers (pb per byte).
template <class Fn>
void for_each_encoded_block(std::span<const std::byte> src, std::span<float> dst, std::size_t block,
                            std::size_t pb, Fn&& fn) {
  const std::size_t nb = blocks(dst.size(), block);
  const auto* q = reinterpret_cast<const std::uint8_t*>(src.data() + nb * sizeof(float));
  for (std::size_t b = 0; b < nb; ++b) {
    float s;
    std::memcpy(&s, src.data() + b * sizeof(float), sizeof(float));
    const std::size_t lo = b * block;
    fn(s, dst.data() + lo, q + lo / pb, std::min(block, dst.size() - lo));
  }
}

void decode_int2(std::span<const std::byte> src, std::span<float> dst, std::size_t block) {
  for_each_encoded_block(src, dst, block, 4,
                         [](float s, float* x, const std::uint8_t* in, std::size_t n) {
                           auto value = [s](int v) { return (static_cast<float>(v) - 1.5f) * s; };
                           std::size_t i = 0;
                           for (; i + 3 < n; i += 4) {
                             const int v = in[i / 4];
                             x[i] = value(v & 3);
                             x[i + 1] = value((v >> 2) & 3);
                             x[i + 2] = value((v >> 4) & 3);
                             x[i + 3] = value(v >> 6);
                           }
                           for (std::size_t k = 0; i + k < n; ++k)
                             x[i + k] = value((in[i / 4] >> (2 * k)) & 3);
                         });
}

void encode_blocks(Codec c, std::span<const float> src, std::span<std::byte> dst,
                   std::size_t block) {
  if (c == Codec::kInt2) return encode_int2(src, dst, block);
  const int qmax = codec_qmax(c);
  const std::size_t pb = per_byte(c);
  // Blocks start on a multiple of 4 elements, so on a byte of packed integers.
  for_each_block_to_encode(
      src, dst, block, pb, [&](const float* x, std::size_t n, std::uint8_t* out) {
        const float s = block_scale(x, n, qmax);
        // A zero block (s = 0) or a non-finite one (s NaN, decoded as NaN whatever the integers)
        // stores zeros.
        const Quantiser quant{s > 0.0f ? 1.0f / s : 0.0f, static_cast<float>(qmax), qmax};
        if (pb == 1) {
          for (std::size_t i = 0; i < n; ++i) out[i] = quant(x[i]);
        } else {  // int4
          std::size_t i = 0;
          for (; i + 1 < n; i += 2)
            out[i / 2] = static_cast<std::uint8_t>(quant(x[i]) | quant(x[i + 1]) << 4);
          if (i < n) out[i / 2] = quant(x[i]);
        }
        return s;
      });
}

void decode_blocks(Codec c, std::span<const std::byte> src, std::span<float> dst,
                   std::size_t block) {
  if (c == Codec::kInt2) return decode_int2(src, dst, block);
  const int qmax = codec_qmax(c);
  const std::size_t pb = per_byte(c);
  for_each_encoded_block(src, dst, block, pb,
                         [&](float s, float* x, const std::uint8_t* in, std::size_t n) {
                           auto value = [&](int v) { return static_cast<float>(v - qmax) * s; };
                           if (pb == 1) {
                             for (std::size_t i = 0; i < n; ++i) x[i] = value(in[i]);
                           } else {  // int4
                             std::size_t i = 0;
                             for (; i + 1 < n; i += 2) {
                               x[i] = value(in[i / 2] & 0xf);
                               x[i + 1] = value(in[i / 2] >> 4);
                             }
                             if (i < n) x[i] = value(in[i / 2] & 0xf);
                           }
                         });
}

}  // namespace

std::string_view to_string(Codec c) { return kNames.at(static_cast<std::size_t>(c)); }

std::optional<Codec> parse_codec(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Codec>(i);
  return std::nullopt;
}

int codec_qmax(Codec c) {
  switch (c) {
    case Codec::kInt8:
      return 127;
    case Codec::kInt4:
      return 7;
    default:  // fp32, bf16; int2 scales by the block's RMS
      return 0;
  }
}

std::size_t encoded_bytes(Codec c, std::size_t n, std::size_t block) {
  switch (c) {
    case Codec::kFp32:
      return n * sizeof(float);
    case Codec::kBf16:
      return n * sizeof(std::uint16_t);
    default:
      if (block == 0 || block % 4 != 0) return 0;
      return blocks(n, block) * sizeof(float) + (n + per_byte(c) - 1) / per_byte(c);
  }
}

void encode(Codec c, std::span<const float> src, std::span<std::byte> dst, std::size_t block) {
  check_sizes(c, src.size(), dst.size(), block, "encoding");
  switch (c) {
    case Codec::kFp32:
      std::memcpy(dst.data(), src.data(), dst.size());
      return;
    case Codec::kBf16: {
      auto* out = dst.data();
      for (std::size_t i = 0; i < src.size(); ++i) {
        const std::uint16_t h = to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    }
    default:
      encode_blocks(c, src, dst, block);
  }
}

void decode(Codec c, std::span<const std::byte> src, std::span<float> dst, std::size_t block) {
  check_sizes(c, dst.size(), src.size(), block, "decoding");
  switch (c) {
    case Codec::kFp32:
      std::memcpy(dst.data(), src.data(), src.size());
      return;
    case Codec::kBf16:
      for (std::size_t i = 0; i < dst.size(); ++i) {
        std::uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        dst[i] = from_bf16(h);
      }
      return;
    default:
      decode_blocks(c, src, dst, block);
  }
}

}  // namespace desloc::sync
