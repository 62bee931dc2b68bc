"""A small GGUF v2/v3 reader for the reference scripts (numpy only): all metadata, and tensors of
type F32, F16 and Q8_0 as float32 arrays in PyTorch layout ([out, in] for a linear weight), the
values anvil computes with."""
import struct

import numpy as np

from gguf_writer import GGML_F16, GGML_F32, GGML_Q8_0, QK8_0, dequantize_q8_0

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFReader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.pos = 0
        magic, self.version, n_tensors, n_kv = self._unpack("<IIQQ")
        if magic != 0x46554747 or self.version not in (2, 3):
            raise ValueError(f"{path}: not a GGUF v2/v3 file")
        self.metadata = {}
        for _ in range(n_kv):
            key = self._string()
            (t,) = self._unpack("<I")
            self.metadata[key] = self._value(t)
        self.tensor_infos = {}
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = list(self._unpack(f"<{n_dims}Q"))
            t, offset = self._unpack("<IQ")
            self.tensor_infos[name] = (dims, t, offset)
        align = int(self.metadata.get("general.alignment", 32))
        self.data_start = (self.pos + align - 1) // align * align

    def _unpack(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _string(self):
        (n,) = self._unpack("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def _value(self, t):
        if t == _STRING:
            return self._string()
        if t == _ARRAY:
            et, n = self._unpack("<IQ")
            return [self._value(et) for _ in range(n)]
        (v,) = self._unpack(_SCALARS[t])
        return bool(v) if t == 7 else v

    def tensor(self, name):
        """float32 array in PyTorch layout (GGUF dims reversed)."""
        dims, t, offset = self.tensor_infos[name]
        n = int(np.prod(dims))
        start = self.data_start + offset
        shape = tuple(reversed(dims))
        if t == GGML_F32:
            return np.frombuffer(self.data, "<f4", n, start).reshape(shape).copy()
        if t == GGML_F16:
            return np.frombuffer(self.data, "<f2", n, start).astype(np.float32).reshape(shape)
        if t == GGML_Q8_0:
            nbytes = n // QK8_0 * (2 + QK8_0)
            return dequantize_q8_0(self.data[start:start + nbytes], shape)
        raise ValueError(f"{name}: ggml type {t} not supported by this reader")

    def tensor_type(self, name):
        return self.tensor_infos[name][1]
