"""A small GGUF v3 writer for the reference scripts (numpy only, no `gguf` package on the GPU
machine). It writes what anvil's C++ reader reads: scalars, strings, arrays, F32/F16 tensors, and
Q8_0 tensors quantized here exactly as anvil's reference quantizer (model/quant/quant_legacy.cpp) does."""
import struct

import numpy as np

U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
TENSOR_TYPES = {np.dtype(np.float32): GGML_F32, np.dtype(np.float16): GGML_F16}
QK8_0 = 32  # elements per Q8_0 block; a block is 34 bytes: fp16 scale d, then 32 int8 q; x = q * d


def quantize_q8_0(array):
    """Q8_0 bytes of a float array whose last dimension is a multiple of 32, block by block in
    row-major order. In float32 like ggml: d = absmax / 127, q = round(x * (1 / d)) rounded half
    away from zero (std::round), d stored as fp16 (round to nearest even); an all-zero block has
    d = 0 and q = 0."""
    x = np.ascontiguousarray(array, dtype=np.float32)
    if x.shape[-1] % QK8_0:
        raise ValueError(f"Q8_0 needs rows that are a multiple of {QK8_0}, got {x.shape}")
    blocks = x.reshape(-1, QK8_0)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    v = blocks * inv[:, None]
    r = np.trunc(v)  # std::round, exactly: away from zero when the fraction is at least one half
    q = (r + np.where(np.abs(v - r) >= np.float32(0.5), np.sign(v), np.float32(0))).astype(np.int8)
    out = np.empty((blocks.shape[0], 2 + QK8_0), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def dequantize_q8_0(data, shape):
    """The float32 values anvil reads from Q8_0 bytes (model/quant/quant_legacy.cpp's dequantize_q8_0)."""
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 2 + QK8_0)
    d = raw[:, :2].copy().view("<f2").astype(np.float32)
    q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(shape)


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class GGUFWriter:
    def __init__(self, alignment=32):
        self.kv = []  # (key, type, payload bytes)
        self.tensors = []  # (name, dims in GGUF order, ggml type, data bytes)
        self.alignment = alignment

    def u32(self, key, v):
        self.kv.append((key, U32, struct.pack("<I", v)))

    def i32(self, key, v):
        self.kv.append((key, I32, struct.pack("<i", v)))

    def f32(self, key, v):
        self.kv.append((key, F32, struct.pack("<f", v)))

    def bool(self, key, v):
        self.kv.append((key, BOOL, struct.pack("<B", 1 if v else 0)))

    def string(self, key, v):
        self.kv.append((key, STRING, _string(v)))

    def strings(self, key, values):
        payload = struct.pack("<IQ", STRING, len(values)) + b"".join(_string(s) for s in values)
        self.kv.append((key, ARRAY, payload))

    def i32s(self, key, values):
        payload = struct.pack("<IQ", I32, len(values)) + np.asarray(values, dtype="<i4").tobytes()
        self.kv.append((key, ARRAY, payload))

    def bools(self, key, values):
        payload = struct.pack("<IQ", BOOL, len(values)) + bytes(1 if v else 0 for v in values)
        self.kv.append((key, ARRAY, payload))

    def tensor(self, name, array, qtype=None):
        """`array` in PyTorch layout ([out, in] for a linear weight); GGUF dims are reversed.
        qtype: None (store the array's own dtype, float32 or float16), "F32", "F16" or "Q8_0"."""
        a = np.ascontiguousarray(array)
        dims = list(reversed(a.shape))
        if qtype == "Q8_0":
            self.tensors.append((name, dims, GGML_Q8_0, quantize_q8_0(a)))
            return
        if qtype is not None:
            a = a.astype({"F32": np.float32, "F16": np.float16}[qtype])
        if a.dtype not in TENSOR_TYPES:
            raise ValueError(f"{name}: dtype {a.dtype} not supported")
        self.tensors.append((name, dims, TENSOR_TYPES[a.dtype], a.tobytes()))

    def write(self, path):
        pad = lambda n: (n + self.alignment - 1) // self.alignment * self.alignment
        header = struct.pack("<IIQQ", 0x46554747, 3, len(self.tensors), len(self.kv))
        for key, t, payload in self.kv:
            header += _string(key) + struct.pack("<I", t) + payload
        offset = 0
        for name, dims, ggml_type, data in self.tensors:
            header += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            header += struct.pack("<IQ", ggml_type, offset)
            offset = pad(offset + len(data))
        header += b"\0" * (pad(len(header)) - len(header))
        with open(path, "wb") as f:
            f.write(header)
            for _, _, _, data in self.tensors:
                f.write(data + b"\0" * (pad(len(data)) - len(data)))
