// Durable file output and bounds-checked binary parsing, shared by shards, checkpoints and
// exported tensors. Writers never leave a partial file under the final name.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "desloc/core/error.hpp"

namespace desloc {

// Writes bytes to `path` atomically: a temporary file in the same directory, fsync, rename,
// then fsync of the directory. On any failure the previous file (if any) is untouched.
void write_file_atomic(const std::string& path, std::span<const std::uint8_t> bytes);
// The same for text (a TOML, JSON or HTML document, or any bytes held in a string).
void write_file_atomic(const std::string& path, std::string_view text);

// Reads a whole file. Throws DataError naming the path if it is missing or unreadable.
std::vector<std::uint8_t> read_file(const std::string& path);

// Appends little-endian PODs and raw arrays to a byte vector.
class ByteWriter {
 public:
  template <class T>
  void put(const T& value) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_span(std::span<const T> values) {
    if (values.empty()) return;
    const auto* p = reinterpret_cast<const std::uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size_bytes());
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  std::vector<std::uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

// Reads PODs from a byte buffer; every read is bounds-checked and a short read throws a
// DataError naming the source (usually a file path), the field and the offset.
class ByteReader {
 public:
  ByteReader(std::span<const std::uint8_t> bytes, std::string source)
      : bytes_(bytes), source_(std::move(source)) {}

  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  template <class T>
  void get_span(std::span<T> out, const char* field) {
    need(out.size_bytes(), field);
    if (out.empty()) return;  // memcpy with a null pointer is undefined even for 0 bytes
    std::memcpy(out.data(), bytes_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }
  std::string get_string(const char* field, std::size_t max_len = 1 << 20);
  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& source() const { return source_; }

 private:
  void need(std::size_t n, const char* field) const;
  std::span<const std::uint8_t> bytes_;
  std::string source_;
  std::size_t pos_ = 0;
};

}  // namespace desloc
