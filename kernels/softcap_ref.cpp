#include <cmath>

#include "kernels/softcap.h"

namespace anvil::kernels {

void softcap_ref(const softcap_params& p) {
  for (float* y = p.x; y != p.x + p.n; ++y) *y = p.cap * std::tanh(*y / p.cap);
}

}  // namespace anvil::kernels
