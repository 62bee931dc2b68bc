"""A small GGUF v3 writer for the reference scripts (numpy only, no `gguf` package on the GPU
machine). It writes what anvil's C++ reader reads: scalars, strings, arrays, F32/F16 tensors."""
import struct

import numpy as np

U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
TENSOR_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class GGUFWriter:
    def __init__(self, alignment=32):
        self.kv = []  # (key, type, payload bytes)
        self.tensors = []  # (name, ndarray)
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

    def tensor(self, name, array):
        """`array` in PyTorch layout ([out, in] for a linear weight); GGUF dims are reversed."""
        a = np.ascontiguousarray(array)
        if a.dtype not in TENSOR_TYPES:
            raise ValueError(f"{name}: dtype {a.dtype} not supported")
        self.tensors.append((name, a))

    def write(self, path):
        pad = lambda n: (n + self.alignment - 1) // self.alignment * self.alignment
        header = struct.pack("<IIQQ", 0x46554747, 3, len(self.tensors), len(self.kv))
        for key, t, payload in self.kv:
            header += _string(key) + struct.pack("<I", t) + payload
        offset = 0
        for name, a in self.tensors:
            dims = list(reversed(a.shape))
            header += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            header += struct.pack("<IQ", TENSOR_TYPES[a.dtype], offset)
            offset = pad(offset + a.nbytes)
        header += b"\0" * (pad(len(header)) - len(header))
        with open(path, "wb") as f:
            f.write(header)
            for _, a in self.tensors:
                data = a.tobytes()
                f.write(data + b"\0" * (pad(len(data)) - len(data)))
