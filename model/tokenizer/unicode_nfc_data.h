// The Unicode tables behind unicode_nfc.cpp, generated into unicode_nfc_data.cpp by
// tools/tokenizer/gen_nfc_tables.py from Python's unicodedata. Each table is sorted by its key
// so lookups are binary searches.
#pragma once

#include <cstdint>
#include <span>

namespace anvil::model::nfc_data {

struct ccc_range {  // code points first..last have canonical combining class ccc (> 0)
  char32_t first;
  char32_t last;
  std::uint8_t ccc;
};

struct decomposition {  // one level of a canonical decomposition: cp -> first [second]
  char32_t cp;
  char32_t first;
  char32_t second;  // 0 for a singleton decomposition
};

struct composition {  // first + second compose to composite (exclusions already removed)
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const std::span<const ccc_range> ccc_ranges;          // sorted by first
extern const std::span<const decomposition> decompositions;  // sorted by cp
extern const std::span<const composition> compositions;      // sorted by (first, second)

}  // namespace anvil::model::nfc_data
