// run_bench: one anvil-bench run, the whole of it — validate the options, build the prompts,
// warm up with one short request (which must succeed), send the requests on schedule (a fixed
// number in flight, or arrivals at a rate, optionally capped), measure every request, then print
// the table and write the JSON result. The command line is a thin wrapper over this, and tests
// (and other programs) call it in-process.
#pragma once

#include "bench/load/bench_options.h"

namespace anvil::bench {

// Exit status: 0 the run finished (failed requests are counted in the results, not fatal);
// 1 the warm-up request failed or the result file could not be written; 2 unusable options or
// prompts. Messages go to stderr as "anvil-bench: ...".
int run_bench(const bench_options& options);

}  // namespace anvil::bench
