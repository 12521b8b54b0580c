// tokenize: encodes or decodes with a tokenizer.json, one JSON value per line.
//
//   bazel-bin/tools/tokenize/tokenize --tokenizer=PATH/tokenizer.json
//       stdin:  one JSON string per line       stdout: one JSON array of ids
//       per line
//   ... --decode [--skip_special]
//       stdin:  one JSON array of ids per line  stdout: one JSON string per
//       line
//   ... --decode --stream
//       stdout: one JSON array per line: the text pieces a StreamingDetokenizer
//       returns when the ids are fed one at a time, then its Finish() piece.
//
// Output is flushed after every line, so the tool can serve as a co-process. A
// line that cannot be read (bad JSON, unknown id) is reported on stderr with
// its number and the tool exits with status 1.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "nlohmann/json.hpp"
#include "scheduler/tokenizer/streaming_detokenizer.h"
#include "scheduler/tokenizer/tokenizer.h"
#include "scheduler/tokenizer/unicode.h"

ABSL_FLAG(std::string, tokenizer, "", "path to tokenizer.json");
ABSL_FLAG(bool, decode, false,
          "decode arrays of ids instead of encoding strings");
ABSL_FLAG(bool, skip_special, false, "with --decode: leave special tokens out");
ABSL_FLAG(bool, parse_special, true,
          "encode special tokens written in the text as special tokens");
ABSL_FLAG(bool, stream, false,
          "with --decode: print the pieces of a streaming detokenizer");

namespace {

using json = nlohmann::json;
using specserve::tokenizer::StreamingDetokenizer;
using specserve::tokenizer::Tokenizer;

int Fail(size_t line_no, const std::string& what) {
  std::cerr << "tokenize: line " << line_no << ": " << what << "\n";
  return 1;
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false,
                json::error_handler_t::replace);
}

int Run(const Tokenizer& tok) {
  const bool decode = absl::GetFlag(FLAGS_decode);
  const bool skip_special = absl::GetFlag(FLAGS_skip_special);
  const bool parse_special = absl::GetFlag(FLAGS_parse_special);
  const bool stream = absl::GetFlag(FLAGS_stream);
  std::string line;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (in.is_discarded()) return Fail(line_no, "not valid JSON");
    std::string out;
    if (!decode) {
      if (!in.is_string()) return Fail(line_no, "expected a JSON string");
      out = Dump(
          json(tok.Encode(in.get_ref<const std::string&>(), parse_special)));
    } else {
      if (!in.is_array()) return Fail(line_no, "expected a JSON array of ids");
      std::vector<uint32_t> ids;
      for (const json& v : in) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) {
          return Fail(line_no, "ids must be unsigned 32-bit integers");
        }
        ids.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
      }
      if (stream) {
        StreamingDetokenizer detok(&tok, skip_special);
        json pieces = json::array();
        for (uint32_t id : ids) {
          auto piece = detok.Feed(id);
          if (!piece.ok())
            return Fail(line_no, std::string(piece.status().message()));
          pieces.push_back(*piece);
        }
        pieces.push_back(detok.Finish());
        for (const json& p : pieces) {
          if (!specserve::tokenizer::IsValidUtf8(
                  p.get_ref<const std::string&>())) {
            return Fail(line_no, "streaming detokenizer emitted invalid UTF-8");
          }
        }
        out = Dump(pieces);
      } else {
        auto text = tok.Decode(ids, skip_special);
        if (!text.ok())
          return Fail(line_no, std::string(text.status().message()));
        out = Dump(json(*text));
      }
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tokenize --tokenizer=PATH/tokenizer.json [--decode [--skip_special] "
      "[--stream]] < lines");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) {
    std::cerr << "tokenize: --tokenizer is required\n";
    return 2;
  }
  auto tok = Tokenizer::Load(path);
  if (!tok.ok()) {
    std::cerr << "tokenize: " << tok.status() << "\n";
    return 2;
  }
  std::ios::sync_with_stdio(false);
  return Run(**tok);
}
