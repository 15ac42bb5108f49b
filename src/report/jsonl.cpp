// JSON parsing for `desloc report`: nlohmann-json's strict RFC 8259 parser drives a SAX handler
// that builds a JsonValue (rejecting duplicate keys and deep nesting), and the JSONL reader.
#include "report/jsonl.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"

namespace desloc::report {
namespace {

// Deeper nesting than any metrics record needs; the limit keeps hostile input small.
constexpr std::size_t kMaxDepth = 64;

using Json = nlohmann::json;

// Builds the tree as the parser reports values. Pointers on the stack stay valid: only the
// innermost open container grows, and it is never an element of a vector that grows.
class TreeBuilder final : public nlohmann::json_sax<Json> {
 public:
  JsonValue root;
  std::string error;  // why this handler stopped the parse (empty: the parser's own error)

  bool null() override { return leaf(JsonValue{}); }
  bool boolean(bool b) override {
    JsonValue v;
    v.kind = JsonValue::Kind::kBool;
    v.boolean = b;
    return leaf(std::move(v));
  }
  bool number_integer(number_integer_t n) override { return number(static_cast<double>(n)); }
  bool number_unsigned(number_unsigned_t n) override { return number(static_cast<double>(n)); }
  bool number_float(number_float_t x, const string_t&) override { return number(x); }
  bool string(string_t& s) override {
    JsonValue v;
    v.kind = JsonValue::Kind::kString;
    v.string = std::move(s);
    return leaf(std::move(v));
  }
  bool binary(binary_t&) override { return stop("binary values are not JSON"); }
  bool start_object(std::size_t) override { return open(JsonValue::Kind::kObject); }
  bool key(string_t& k) override {
    for (const JsonMember& m : stack_.back()->object)
      if (m.key == k) return stop(fmt::format("duplicate key \"{}\"", k));
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(JsonValue::Kind::kArray); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    position_ = position;
    parser_error_ = e.what();
    return false;
  }
  std::size_t position() const { return position_; }
  const std::string& parser_error() const { return parser_error_; }

 private:
  JsonValue* place() {
    if (stack_.empty()) return &root;
    JsonValue* top = stack_.back();
    if (top->kind == JsonValue::Kind::kArray) return &top->array.emplace_back();
    top->object.push_back({std::move(key_), {}});
    return &top->object.back().value;
  }
  bool leaf(JsonValue v) {
    *place() = std::move(v);
    return true;
  }
  bool number(double x) {
    JsonValue v;
    v.kind = JsonValue::Kind::kNumber;
    v.number = x;
    return leaf(std::move(v));
  }
  bool open(JsonValue::Kind kind) {
    if (stack_.size() >= kMaxDepth)
      return stop(fmt::format("nested deeper than {} levels", kMaxDepth));
    JsonValue* v = place();
    v->kind = kind;
    stack_.push_back(v);
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool stop(std::string why) {
    error = std::move(why);
    return false;
  }

  std::vector<JsonValue*> stack_;
  std::string key_;
  std::size_t position_ = 0;
  std::string parser_error_;
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
  TreeBuilder tree;
  if (Json::sax_parse(text.begin(), text.end(), &tree)) return std::move(tree.root);
  // nlohmann's messages look like "[json.exception.parse_error.101] parse error at line 1,
  // column 5: syntax error while parsing value - unexpected '}'"; keep what follows "error".
  std::string what = tree.error;
  if (what.empty()) {
    what = tree.parser_error();
    const auto at = what.find("parse error");
    if (at != std::string::npos) what = what.substr(at);
  }
  throw DataError(fmt::format(
      "{}: invalid JSON: {}; each line must be one JSON object as written by `desloc train` "
      "(fix or delete the line)",
      where, what));
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
