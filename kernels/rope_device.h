// One rotary pair on the device, for the kernels that rotate: the RoPE + KV write
// (kernels/rope_kv_write.hip) and the q/k/v GEMV that rotates its own rows (kernels/gemv.hip,
// launch_gemv_qkv_rope). Both call this one function, so that they store the same floats bit for
// bit. Device code only: included by .hip files, never by host C++.
#pragma once

namespace anvil::kernels::rope_device {

// (x0, x1) rotated by the angle with sine s and cosine c (launch_rope_angles' table), in double,
// each rounded to float as rope_ref stores it.
__device__ __forceinline__ void rotate(double x0, double x1, double s, double c, float& y0, float& y1) {
  y0 = float(x0 * c - x1 * s);
  y1 = float(x0 * s + x1 * c);
}

}  // namespace anvil::kernels::rope_device
