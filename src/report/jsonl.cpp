// Recursive-descent JSON parser (RFC 8259) and the JSONL reader used by `desloc report`.
#include "report/jsonl.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::report {
namespace {

// Deeper nesting than any metrics record needs; the limit keeps hostile input off the stack.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  JsonValue document() {
    skip_space();
    JsonValue v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format(
        "{}:{}: invalid JSON: {}; each line must be one JSON object as written by `desloc train` "
        "(fix or delete the line)",
        where_, pos_ + 1, what));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n'))
      ++pos_;
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  void expect(char c, const char* context) {
    if (peek() != c) fail(fmt::format("expected '{}' {}", c, context));
    ++pos_;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail(fmt::format("nesting deeper than {} levels", kMaxDepth));
    if (at_end()) fail("unexpected end of line, expected a value");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    JsonValue v;
    if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      v.string = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonValue::Kind::kNumber;
      v.number = number();
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::kBool;
    } else if (literal("null")) {
      v.kind = JsonValue::Kind::kNull;
    } else {
      fail(fmt::format("unexpected character '{}'", c));
    }
    return v;
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  JsonValue object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a quoted member name");
      std::string key = string();
      if (v.find(key) != nullptr) fail(fmt::format("duplicate member \"{}\"", key));
      skip_space();
      expect(':', fmt::format("after member name \"{}\"", key).c_str());
      skip_space();
      JsonValue member = value(depth + 1);
      v.object.push_back({std::move(key), std::move(member)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "or ',' after an object member");
      return v;
    }
  }

  JsonValue array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      v.array.push_back(value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "or ',' after an array element");
      return v;
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9')
        code |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f')
        code |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        code |= unsigned(h - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair encodes one code point
            if (!literal("\\u")) fail("high surrogate without its low half");
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(fmt::format("unknown escape '\\{}'", e));
      }
    }
  }

  // Checks the JSON number grammar, then converts without depending on the C locale.
  double number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - from;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digits() == 0) {
      fail("expected digits in a number");
    }
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) fail("expected digits after the decimal point");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected digits in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    double v = 0.0;
    const auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range) {
      // Overflow reads as +-inf and underflow as 0, as strtod does.
      v = std::strtod(std::string(first, last).c_str(), nullptr);
    } else if (ec != std::errc() || ptr != last) {
      fail("malformed number");
    }
    return v;
  }

  std::string_view text_;
  const std::string& where_;
  std::size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& m : object)
    if (m.key == key) return &m.value;
  return nullptr;
}

double JsonValue::number_or_nan(std::string_view key) const {
  const JsonValue* v = find(key);
  return v != nullptr && v->is_number() ? v->number : std::nan("");
}

std::string JsonValue::string_or(std::string_view key, const std::string& fallback) const {
  const JsonValue* v = find(key);
  return v != nullptr && v->is_string() ? v->string : fallback;
}

JsonValue parse_json(std::string_view text, const std::string& where) {
  return Parser(text, where).document();
}

std::vector<JsonLine> read_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError(
        fmt::format("cannot open metrics file {}; pass a metrics.jsonl written by "
                    "`desloc train` or the run directory that holds one",
                    path));
  std::vector<JsonLine> out;
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const bool complete = !in.eof();  // getline hit a '\n' rather than the end of the file
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back({number, parse_json(line, fmt::format("{}:{}", path, number))});
    } catch (const DataError&) {
      if (complete) throw;
      log::warn("{}:{}: ignoring an incomplete last line (is the run still writing it?)", path,
                number);
    }
  }
  if (in.bad()) throw DataError(fmt::format("reading {} failed after line {}", path, number));
  return out;
}

}  // namespace desloc::report
