// Tensors to and from safetensors files (github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header {"<name>": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}} and the raw little-endian
// tensor bytes: the layout Python's safetensors.torch.load_file reads (checked against the format's
// rules in tests/engine/serialization_test.cpp; Python's reader itself is not run in CI), and
// files written the way it writes them load here.
#pragma once

#include <functional>
#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace rg {

struct SafetensorsFile {
  NamedTensors tensors;  // in the order of their data in the file (the order they were saved)
  std::map<std::string, std::string> metadata;
};

// Writes `tensors` (any device; CUDA tensors are copied to the host) and `metadata` to `path`
// atomically: a temporary file next to it is written, fsynced and renamed over `path`, so a crash
// leaves either the old file or the new one. Adds "rg.crc32", the CRC-32 of the data bytes, to the
// metadata. Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Removes the temporary files that saves of `path` killed before their rename left next to it
// (`<path>.tmp.*`), and returns how many. Only for a caller that knows no other process is saving
// to `path` now (ringgrad-train's snapshot writer, rank 0); the temporary files are harmless
// otherwise, as loads never read them.
int remove_save_temporaries(const std::string& path);

// For the restart tests only (ringgrad-train's RG_TEST_FAULT=snapshot-write), not for users: the
// next save_safetensors in this process calls `hook` once, after the header and about half of
// the data bytes went to the temporary file and before the rest, the fsync and the rename; the
// hook is then cleared. The tests' hook kills the process there.
void set_partial_write_hook(std::function<void()> hook);

// Reads a safetensors file into CPU tensors. Every inconsistency (truncation, a header that is not
// the format's JSON, an unknown dtype, offsets that overlap, leave holes or disagree with the
// shape, a CRC-32 mismatch where "rg.crc32" is present) is an error naming the file.
SafetensorsFile load_safetensors(const std::string& path);
// The same from a stream of the whole file's bytes (from its start to its end; `name` is the file
// in messages): what load_safetensors does after opening the file, and what the fuzzer feeds.
// Allocates at most the header's length (<= 100 MiB) plus the data bytes the stream holds.
SafetensorsFile read_safetensors(std::istream& in, const std::string& name);

}  // namespace rg
