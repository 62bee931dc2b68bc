// Finding the shipped model when no -m is given (model/arch/default_model.h).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "model/arch/default_model.h"
#include "model/model_error.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil::model;
namespace fs = std::filesystem;

class DefaultModel : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = anvil::testing::scratch_dir() / "default_model";
    fs::remove_all(root_);
    fs::create_directories(root_ / "repo" / "build" / "bin");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path touch(const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "GGUF";
    return p;
  }
  fs::path root_;
};

TEST_F(DefaultModel, FindsTheRepositoryModelsFolderFromABuildTree) {
  const fs::path want = touch(root_ / "repo" / "models" / "anvil-kjv-q8_0.gguf");
  EXPECT_EQ(find_default_model(root_ / "repo" / "build", nullptr), want);
  EXPECT_EQ(find_default_model(root_ / "repo" / "build" / "bin", nullptr), want);
}

TEST_F(DefaultModel, PrefersQ8_0ToF16AndTheNearestFolder) {
  touch(root_ / "repo" / "models" / "anvil-kjv-q8_0.gguf");
  const fs::path f16 = touch(root_ / "repo" / "build" / "models" / "anvil-kjv-f16.gguf");
  EXPECT_EQ(find_default_model(root_ / "repo" / "build", nullptr), f16) << "nearest folder first";
  const fs::path q8 = touch(root_ / "repo" / "build" / "models" / "anvil-kjv-q8_0.gguf");
  EXPECT_EQ(find_default_model(root_ / "repo" / "build", nullptr), q8);
}

TEST_F(DefaultModel, FindsAnInstalledModelUnderShare) {
  fs::create_directories(root_ / "prefix" / "bin");
  const fs::path want = touch(root_ / "prefix" / "share" / "anvil" / "models" / "anvil-kjv-q8_0.gguf");
  EXPECT_EQ(find_default_model(root_ / "prefix" / "bin", nullptr), want);
}

TEST_F(DefaultModel, AnvilModelOverridesAndMustExist) {
  touch(root_ / "repo" / "models" / "anvil-kjv-q8_0.gguf");
  const fs::path mine = touch(root_ / "mine.gguf");
  EXPECT_EQ(find_default_model(root_ / "repo" / "build", mine.c_str()), mine);
  EXPECT_EQ(find_default_model(root_ / "repo" / "build", "").filename(), "anvil-kjv-q8_0.gguf") << "empty = unset";
  try {
    find_default_model(root_ / "repo" / "build", (root_ / "nope.gguf").c_str());
    FAIL() << "no error";
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("ANVIL_MODEL"), std::string::npos) << e.what();
  }
}

TEST_F(DefaultModel, NoModelAnywhereSaysToPassDashM) {
  try {
    find_default_model(root_ / "repo" / "build", nullptr);
    FAIL() << "no error";
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("pass -m"), std::string::npos) << e.what();
  }
}

TEST_F(DefaultModel, CandidatesAreInSearchOrder) {
  const auto c = default_model_candidates(root_ / "repo" / "build");
  ASSERT_GE(c.size(), 8u);
  EXPECT_EQ(c[0], root_ / "repo" / "build" / "models" / "anvil-kjv-q8_0.gguf");
  EXPECT_EQ(c[1], root_ / "repo" / "build" / "models" / "anvil-kjv-f16.gguf");
  EXPECT_EQ(c[2], root_ / "repo" / "models" / "anvil-kjv-q8_0.gguf");
  EXPECT_EQ(c.back(), root_ / "repo" / "share" / "anvil" / "models" / "anvil-kjv-f16.gguf");
}

}  // namespace
