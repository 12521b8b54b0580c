// The tokenizer bundle of VllmEngine.GetTokenizer: the tokenizer files of a
// model directory in one ZIP archive (entries stored uncompressed, with a
// fixed timestamp, so the same files always give the same bytes and the same
// digest), which the gateway unpacks to build its tokenizer and chat
// template with no local copy of the model. The stream (common.proto
// GetTokenizerChunk) is the archive cut into chunks, the last one carrying
// the archive's SHA-256 in lower-case hex.
#ifndef SPECSERVE_SCHEDULER_VLLM_ENGINE_TOKENIZER_BUNDLE_H_
#define SPECSERVE_SCHEDULER_VLLM_ENGINE_TOKENIZER_BUNDLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specserve::scheduler::vllm_engine {

// The files of `model_dir` that go in the bundle: tokenizer.json,
// tokenizer_config.json, config.json, generation_config.json,
// special_tokens_map.json, vocab.json, merges.txt, tokenizer.model,
// chat_template.json and any *.jinja (the set vLLM's servicer sends), those
// present. NOT_FOUND when none is, or the directory cannot be read.
absl::StatusOr<std::vector<std::string>> TokenizerFiles(
    const std::string& model_dir);

// The ZIP archive of `files` (names relative to `model_dir`).
absl::StatusOr<std::string> BuildTokenizerZip(
    const std::string& model_dir, const std::vector<std::string>& files);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(const std::string& data);

// CRC-32 (ISO-HDLC, as ZIP uses) of `data`.
uint32_t Crc32(const std::string& data);

}  // namespace specserve::scheduler::vllm_engine

#endif  // SPECSERVE_SCHEDULER_VLLM_ENGINE_TOKENIZER_BUNDLE_H_
