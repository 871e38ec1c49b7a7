// The collective checks: inputs in = value(rank, i), expected results computed in double. Tensors
// live where the group wants them (the CPU for gloo, the rank's GPU for NCCL); values are made and
// read on the host.
#include "support/collective_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/dispatch.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/cast.h"

namespace rg::testing {
namespace {

using dist::ReduceOp;
namespace kcpu = rg::kernels::cpu;

// Small integers: every partial sum over <= 8 ranks stays exact in f16 and bf16 (<= 256).
double value(int rank, size_t i) { return double((rank + 1) * int((i % 7) + 1)); }

Tensor filled(const dist::ProcessGroup& pg, DType dtype, size_t count, int rank) {
  Tensor t = Tensor::empty({int64_t(count)}, dtype);
  dispatch_all(dtype, [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < count; ++i) p[i] = kcpu::convert<T>(value(rank, i));
  });
  return t.to(pg.tensor_device());
}

Tensor empty(const dist::ProcessGroup& pg, int64_t count, DType dtype) {
  return Tensor::empty({count}, dtype, pg.tensor_device());
}

std::vector<double> as_doubles(const Tensor& device_tensor) {
  const Tensor t = device_tensor.to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(t.numel()));
  dispatch_all(t.dtype(), [&]<class T>() {
    const T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = kcpu::convert<double>(p[i]);
  });
  return v;
}

double reduce_expected(ReduceOp op, int n, size_t i, DType dtype) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    const double x = value(r, i);
    acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : acc + x;
  }
  if (op != ReduceOp::avg) return acc;
  if (is_floating(dtype)) {
    // The result is rounded to the dtype, like the collective's own division.
    return dispatch_all(
        dtype, [&]<class T>() { return kcpu::convert<double>(kcpu::convert<T>(acc / n)); });
  }
  return double(int64_t(acc) / n);
}

std::string where(const dist::ProcessGroup& pg, const char* op, DType dtype, size_t count) {
  return std::string(op) + " on rank " + std::to_string(pg.rank()) + "/" +
         std::to_string(pg.size()) + " (" + dist::algorithm_name(pg.algorithm()) + ") " +
         dtype_name(dtype) + " x " + std::to_string(count);
}

// Reports only the first mismatch so a wrong collective does not flood the log.
void expect_values(const std::vector<double>& got, const std::vector<double>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return;
    }
}

}  // namespace

void check_all_reduce(dist::ProcessGroup& pg, DType dtype, size_t count, ReduceOp op) {
  Tensor t = filled(pg, dtype, count, pg.rank());
  pg.all_reduce(t, op)->wait();
  std::vector<double> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = reduce_expected(op, pg.size(), i, dtype);
  expect_values(as_doubles(t), want,
                where(pg, "all_reduce", dtype, count) + " " + dist::reduce_op_name(op));
}

void check_broadcast(dist::ProcessGroup& pg, DType dtype, size_t count, int root) {
  Tensor t = filled(pg, dtype, count, pg.rank());
  pg.broadcast(t, root)->wait();
  std::vector<double> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = value(root, i);
  expect_values(as_doubles(t), want,
                where(pg, "broadcast", dtype, count) + " root " + std::to_string(root));
}

void check_all_gather(dist::ProcessGroup& pg, DType dtype, size_t count) {
  Tensor in = filled(pg, dtype, count, pg.rank());
  Tensor out = empty(pg, int64_t(count) * pg.size(), dtype);
  pg.all_gather(out, in)->wait();
  std::vector<double> want;
  for (int r = 0; r < pg.size(); ++r)
    for (size_t i = 0; i < count; ++i) want.push_back(value(r, i));
  expect_values(as_doubles(out), want, where(pg, "all_gather", dtype, count));
  expect_values(as_doubles(in), as_doubles(filled(pg, dtype, count, pg.rank())),
                where(pg, "all_gather (input unchanged)", dtype, count));
}

void check_reduce_scatter(dist::ProcessGroup& pg, DType dtype, size_t block, ReduceOp op) {
  const size_t n = block * size_t(pg.size());
  Tensor in = filled(pg, dtype, n, pg.rank());
  Tensor out = empty(pg, int64_t(block), dtype);
  pg.reduce_scatter(out, in, op)->wait();
  std::vector<double> want(block);
  for (size_t i = 0; i < block; ++i)
    want[i] = reduce_expected(op, pg.size(), block * size_t(pg.rank()) + i, dtype);
  expect_values(as_doubles(out), want,
                where(pg, "reduce_scatter", dtype, block) + " " + dist::reduce_op_name(op));
  expect_values(as_doubles(in), as_doubles(filled(pg, dtype, n, pg.rank())),
                where(pg, "reduce_scatter (input unchanged)", dtype, block));
}

void check_send_recv(dist::ProcessGroup& pg, DType dtype, size_t count) {
  if (pg.size() == 1) return;
  const int right = (pg.rank() + 1) % pg.size(), left = (pg.rank() + pg.size() - 1) % pg.size();
  Tensor out = filled(pg, dtype, count, pg.rank());
  Tensor in = empty(pg, int64_t(count), dtype);
  // NCCL matches sends and receives by order and takes no tag.
  const uint32_t tag = std::string(pg.backend()) == "nccl" ? 0 : 7;
  // Even ranks send first, odd ranks receive first: NCCL's ungrouped send blocks its stream until
  // the peer receives, so "everyone sends first" could deadlock around the ring.
  dist::WorkPtr s, r;
  if (pg.rank() % 2 == 0) {
    s = pg.send(out, right, tag);
    r = pg.recv(in, left, tag);
  } else {
    r = pg.recv(in, left, tag);
    s = pg.send(out, right, tag);
  }
  r->wait();
  s->wait();
  std::vector<double> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = value(left, i);
  expect_values(as_doubles(in), want, where(pg, "send/recv", dtype, count));
}

void check_everything(dist::ProcessGroup& pg, bool heavy) {
  const size_t n = size_t(pg.size());
  // Chunks of 256 B make the 1000-element case cross several chunks per block.
  std::vector<size_t> counts = {0, 1, n > 1 ? n - 1 : 2, n + 1, 1000, 4099};
  if (heavy) counts.push_back((size_t(1) << 18) + 3);
  // Every dtype a group takes; u8 sums stay below 256 for up to 4 ranks (at most 10 * 7).
  std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64,
                               DType::i32};
  if (n <= 4) dtypes.push_back(DType::u8);
  for (DType dt : dtypes) {
    for (size_t c : counts) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
        check_all_reduce(pg, dt, c, op);
      check_broadcast(pg, dt, c, int(c % n));
      check_all_gather(pg, dt, c);
      check_reduce_scatter(pg, dt, c / n + (c % 2), c % 2 ? ReduceOp::max : ReduceOp::sum);
      check_send_recv(pg, dt, c);
    }
  }
  pg.barrier()->wait();
}

void check_64_mib(dist::ProcessGroup& pg) {
  check_all_reduce(pg, DType::f32, (size_t(1) << 24) + 1, ReduceOp::sum);
  check_broadcast(pg, DType::f32, size_t(1) << 24, 1 % pg.size());
  pg.barrier()->wait();
}

}  // namespace rg::testing
