// Helpers for the anvil-bench client tests: temporary files, reading the result JSON, running
// the built executable.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "bench/load/bench_options.h"
#include "tests/scratch_dir.h"

namespace anvil::bench::testing {

inline std::string temp_path(const std::string& name) {
  return anvil::testing::scratch_path(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" + name);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline boost::json::object read_result(const std::string& path) {
  return boost::json::parse(read_text(path)).as_object();
}

// A JSONL dataset of text prompts.
inline std::string write_dataset(const std::vector<std::string>& prompts, int output_len) {
  const std::string path = temp_path("dataset.jsonl");
  std::ofstream out(path);
  for (const auto& p : prompts) out << boost::json::serialize(boost::json::object{{"prompt", p}, {"output_len", output_len}}) << "\n";
  return path;
}

// Options for a quiet, small run against `url` writing its result next to the test's temp files.
inline bench_options small_run(const std::string& url) {
  bench_options o;
  o.url = url;
  o.num_prompts = 8;
  o.input_len = 12;
  o.output_len = 4;
  o.progress = false;
  o.print_table = false;
  o.timeout_s = 20;
  o.result_file = temp_path("result.json");
  return o;
}

// The checks every result file must pass: counts add up over num_prompts.
inline void expect_consistent(const boost::json::object& r, int num_prompts) {
  EXPECT_EQ(r.at("completed").as_int64() + r.at("failed").as_int64(), num_prompts);
  for (const char* arr : {"input_lens", "output_lens", "ttfts", "itls", "errors"})
    EXPECT_EQ(r.at(arr).as_array().size(), std::size_t(num_prompts)) << arr;
  std::int64_t out = 0, failed = 0;
  for (std::size_t i = 0; i < std::size_t(num_prompts); ++i) {
    out += r.at("output_lens").as_array()[i].as_int64();
    if (!r.at("errors").as_array()[i].as_string().empty()) ++failed;
  }
  EXPECT_EQ(out, r.at("total_output_tokens").as_int64());
  EXPECT_EQ(failed, r.at("failed").as_int64());
}

// Runs the built anvil-bench with `args`; returns its exit status, stderr in `err`.
inline int run_exe(const std::string& args, std::string& err) {
  const std::string err_path = temp_path("stderr.txt");
  const std::string cmd = std::string(ANVIL_BENCH_EXE) + " " + args + " > /dev/null 2> " + err_path;
  const int status = std::system(cmd.c_str());
  err = read_text(err_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace anvil::bench::testing
