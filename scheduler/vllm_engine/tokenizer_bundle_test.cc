#include "scheduler/vllm_engine/tokenizer_bundle.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace specserve::scheduler::vllm_engine {
namespace {

std::string TempDir() {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/bundleXXXXXX";
  return mkdtemp(tmpl.data());
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

uint32_t Le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(s[at + i]);
  return v;
}

TEST(TokenizerBundle, KnownDigests) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenizerBundle, PicksTokenizerFilesOnly) {
  const std::string dir = TempDir();
  WriteFile(dir + "/tokenizer.json", "{}");
  WriteFile(dir + "/tokenizer_config.json", "{\"a\": 1}");
  WriteFile(dir + "/chat.jinja", "{{ x }}");
  WriteFile(dir + "/model.safetensors", "weights");
  auto files = TokenizerFiles(dir);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(*files, (std::vector<std::string>{"chat.jinja", "tokenizer.json",
                                              "tokenizer_config.json"}));
  EXPECT_EQ(TokenizerFiles(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenizerBundle, ZipIsStoredAndDeterministic) {
  const std::string dir = TempDir();
  WriteFile(dir + "/tokenizer.json", "hello tokenizer");
  auto zip = BuildTokenizerZip(dir, {"tokenizer.json"});
  ASSERT_TRUE(zip.ok());
  EXPECT_EQ(Le32(*zip, 0), 0x04034b50u);
  EXPECT_EQ(Le32(*zip, 14), Crc32("hello tokenizer"));
  EXPECT_EQ(zip->substr(30, 14), "tokenizer.json");
  EXPECT_EQ(zip->substr(44, 15), "hello tokenizer");
  // End of central directory: one entry.
  EXPECT_EQ(Le32(*zip, zip->size() - 22), 0x06054b50u);
  EXPECT_EQ(*zip, *BuildTokenizerZip(dir, {"tokenizer.json"}));
}

}  // namespace
}  // namespace specserve::scheduler::vllm_engine
