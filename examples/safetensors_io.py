"""safetensors files in plain Python (the `safetensors` package is not needed): an 8-byte
little-endian header length, a JSON header {name: {"dtype", "shape", "data_offsets"}}, then the
raw little-endian tensor bytes. What ringgrad's nn::save_weights writes and nn::load_weights reads
(layers/weights.h). Used by check_resnet18_in_pytorch.py, check_gpt_in_pytorch.py and the
benchmarks. Needs only torch."""
import json
import os
import struct

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def load_safetensors(path):
    """{name: tensor} from a safetensors file (the "__metadata__" entry is skipped)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    body = data[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(body[begin:end])  # a writable copy: frombuffer shares the memory
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"])
    return tensors


def save_safetensors(tensors, path):
    """Writes {name: tensor} (each copied to contiguous CPU memory; tensors that share storage,
    as a tied head's, are written once per name) to `path`, names sorted, via a temporary file
    renamed over it."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        blob = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the library writes it
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)
