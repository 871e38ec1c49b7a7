// The non-differentiable linear-algebra ops that PowerSGD runs on gradient buckets, on cuda:0
// against the CPU: matmul_out with every transpose combination into windows of a flat buffer,
// and orthonormalize_columns_ (Gram-Schmidt kernel) on views.
#include <gtest/gtest.h>

#include "device/device_test_util.h"
#include "engine/ops/matmul.h"
#include "engine/ops/orthonormalize.h"
#include "kernels/error.h"

namespace rg {
namespace {

using testing::expect_close;
using testing::kCuda;
using testing::random_tensor;

TEST(DeviceLinalg, MatmulOutWritesEveryTransposeCombinationIntoAWindow) {
  RG_REQUIRE_DEVICE();
  Generator gen(7);
  const int64_t m = 37, n = 5, k = 70;
  for (DType dtype : {DType::f32, DType::f64})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, gen, dtype);
        const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, gen, dtype);
        // The product lands in the middle of a larger buffer whose other elements stay put.
        const Tensor cpu_buf = random_tensor({m * n + 9}, gen, dtype);
        const Tensor dev_buf = cpu_buf.to(kCuda);
        matmul_out(a, ta, b, tb, cpu_buf.flat_narrow(4, m * n).view({m, n}));
        matmul_out(a.to(kCuda), ta, b.to(kCuda), tb, dev_buf.flat_narrow(4, m * n).view({m, n}));
        const auto tol = testing::tolerance_for(dtype);
        expect_close(dev_buf, cpu_buf, tol.atol, tol.rtol,
                     std::string(dtype_name(dtype)) + (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
        // Against the differentiable matmul on the CPU (no transposes there).
        if (!ta && !tb)
          expect_close(cpu_buf.flat_narrow(4, m * n).view({m, n}), matmul(a, b), 0, 0, "vs matmul");
      }
}

TEST(DeviceLinalg, OrthonormalizeColumnsMatchesTheCpuOnAView) {
  RG_REQUIRE_DEVICE();
  Generator gen(8);
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor cpu_flat = random_tensor({3 + 300 * 4}, gen, dtype);
    const Tensor dev_flat = cpu_flat.to(kCuda);
    orthonormalize_columns_(cpu_flat.flat_narrow(3, 1200).view({300, 4}));
    orthonormalize_columns_(dev_flat.flat_narrow(3, 1200).view({300, 4}));
    const auto tol = testing::tolerance_for(dtype);
    expect_close(dev_flat, cpu_flat, tol.atol, tol.rtol, dtype_name(dtype));
    // P^T P = I on the CPU result.
    const Tensor p = cpu_flat.flat_narrow(3, 1200).view({300, 4});
    const Tensor gram = Tensor::empty({4, 4}, dtype);
    matmul_out(p, true, p, false, gram);
    const auto g = gram.to_vector<double>();
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        EXPECT_NEAR(g[size_t(i * 4 + j)], i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
  }
}

TEST(DeviceLinalg, BadShapesAreRefusedWithTheirShapes) {
  const Tensor a = Tensor::empty({3, 4}), b = Tensor::empty({5, 2}), out = Tensor::empty({3, 2});
  try {
    matmul_out(a, false, b, false, out);
    FAIL() << "expected an error";
  } catch (const rg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 4] x [5, 2] -> [3, 2] do not fit"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(orthonormalize_columns_(Tensor::empty({3, 4, 5})), rg::Error);
  EXPECT_THROW(orthonormalize_columns_(Tensor::empty({3, 4}, DType::i64)), rg::Error);
}

}  // namespace
}  // namespace rg
