# quant_test: the GGML block layouts pinned with hand-built blocks, quantizer round trips,
# vec_dot_row against dequantize_row, and the half-precision conversions.
anvil_add_test(quant_test LABELS gguf
  SOURCES
    model/quant_test.cpp
    model/quant_roundtrip_test.cpp
    model/quant_half_test.cpp
  LIBS anvil_quant)
