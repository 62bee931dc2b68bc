// Counting replacements of the global operator new/delete, linked into one test executable only:
// they record the largest single request and the peak of live bytes since the last reset, so a
// test can prove that a hostile input never makes the code under test ask for much memory.
#pragma once

#include <cstddef>

namespace anvil::fuzz::alloc_counter {

void reset();                 // forget the largest request; the peak restarts from what is live now
std::size_t largest();        // the largest single request since reset()
std::size_t peak_growth();    // the most live bytes above the level at reset()

}  // namespace anvil::fuzz::alloc_counter
