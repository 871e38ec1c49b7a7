// The trace file of a run: gathering every rank's events on rank 0 and writing the Chrome trace.
#include "train/trace_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "comm/init.h"
#include "engine/ops/factory.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::train {

void write_trace(const std::string& path, dist::ProcessGroup* pg) {
  const std::string mine = trace::serialize(trace::take_events());
  std::vector<std::string> all = {mine};
  if (pg && pg->size() > 1) {
    const int n = pg->size();
    const Device dev = pg->tensor_device();
    Tensor len = full({1}, double(mine.size()), DType::i64, dev);
    Tensor lens = Tensor::empty({n}, DType::i64, dev);
    pg->all_gather(lens, len)->wait();
    lens = lens.to(Device::cpu());
    int64_t max_len = 0;
    for (int r = 0; r < n; ++r) max_len = std::max(max_len, lens.data<int64_t>()[r]);
    Tensor buf = zeros({max_len}, DType::u8);
    std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
    Tensor bufs = Tensor::empty({max_len * n}, DType::u8, dev);
    pg->all_gather(bufs, dist::on_group_device(*pg, buf))->wait();
    bufs = bufs.to(Device::cpu());
    all.clear();
    for (int r = 0; r < n; ++r) {
      const char* p = reinterpret_cast<const char*>(bufs.data<uint8_t>() + r * max_len);
      all.emplace_back(p, size_t(lens.data<int64_t>()[r]));
    }
  }
  if (pg && pg->rank() != 0) return;
  std::vector<std::vector<trace::Event>> events;
  std::vector<std::string> names;
  for (size_t r = 0; r < all.size(); ++r) {
    events.push_back(trace::deserialize(all[r]));
    names.push_back(fmt::format("rank {}", r));
  }
  std::ofstream f(path);
  RG_CHECK(f.good(), "--trace: cannot write ", path);
  f << trace::chrome_trace_json(events, names, trace::lane_names());
}

}  // namespace rg::train
