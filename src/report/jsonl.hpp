// The trainer's JSONL metrics (one object per line) as a small JSON tree. Parsing is
// nlohmann-json's strict RFC 8259 parser; duplicate keys and nesting deeper than 64 levels are
// refused too. Errors are DataErrors naming file:line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace desloc::report {

struct JsonMember;

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<JsonValue> array;
  // In file order; duplicates rejected. (A vector of a declared struct rather than of
  // std::pair<std::string, JsonValue>: a pair of an incomplete type is ill-formed, and clang
  // refuses it.)
  std::vector<JsonMember> object;

  bool is_null() const { return kind == Kind::kNull; }
  bool is_number() const { return kind == Kind::kNumber; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_object() const { return kind == Kind::kObject; }
  // The member named key of an object, or nullptr (also for non-objects).
  const JsonValue* find(std::string_view key) const;
  // A numeric member; null, missing or non-numeric members read as NaN (the trainer writes
  // null for non-finite values).
  double number_or_nan(std::string_view key) const;
  // A string member, or fallback when missing or not a string.
  std::string string_or(std::string_view key, const std::string& fallback) const;
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

// Parses one JSON document that must span all of text (surrounding whitespace allowed).
// `where` prefixes error messages, e.g. "runs/a/metrics.jsonl:12".
JsonValue parse_json(std::string_view text, const std::string& where);

// One parsed line of a JSONL file.
struct JsonLine {
  std::size_t line = 0;  // 1-based line number in the file
  JsonValue value;
};

// Reads a JSONL file: blank lines are skipped, every other line must be one JSON value.
// A final line without a newline that does not parse is dropped with a warning, because a
// trainer that is still running may be half-way through writing it.
std::vector<JsonLine> read_jsonl(const std::string& path);

}  // namespace desloc::report
