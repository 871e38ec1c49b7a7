// Factories: fills happen in the CPU kernels; random ones draw Philox counters from a Generator.
#include "engine/ops/factory.h"

#include <cmath>
#include <functional>

#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/random.h"
#include "kernels/error.h"

namespace rg {

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, device);
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor empty_like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device(), t.memory_format());
}
Tensor zeros_like(const Tensor& t) { return empty_like(t).zero_(); }
Tensor ones_like(const Tensor& t) { return empty_like(t).fill_(1.0); }

Tensor arange(double start, double end, double step, DType dtype) {
  RG_CHECK(step != 0, "arange: step must be non-zero");
  RG_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
           "arange: start, end and step must be finite");
  const double count = std::ceil((end - start) / step);
  const int64_t n = count > 0 ? int64_t(count) : 0;
  Tensor t = Tensor::empty({n}, dtype);
  dispatch_all(dtype, [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = kernels::cpu::convert<T>(start + double(i) * step);
  });
  return t;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype) {
  RG_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape));
  Tensor t = Tensor::empty(shape, dtype);
  dispatch_all(dtype, [&]<class D>() {
    D* p = t.data<D>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = kernels::cpu::convert<D>(values[i]);
  });
  return t;
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, DType);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, DType);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, DType);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, DType);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, DType);

namespace {
void check_random_target(const Tensor& t, const char* op) {
  RG_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op,
           ": in-place random fill of a tensor that requires grad; wrap it in NoGradGuard");
}

// CUDA tensors and the half types: drawn on the CPU in f32 (f64 for f64), so the values are the
// CPU's for the same generator state, then copied (and converted) into t.
bool fill_through_host(Tensor& t, const std::function<void(Tensor&)>& draw) {
  if (t.device().is_cpu() && (t.dtype() == DType::f32 || t.dtype() == DType::f64)) return false;
  Tensor host = Tensor::empty(t.shape(), t.dtype() == DType::f64 ? DType::f64 : DType::f32);
  draw(host);
  t.copy_(host);
  return true;
}

}  // namespace

Tensor& uniform_(Tensor& t, double low, double high, Generator& gen) {
  check_random_target(t, "uniform_");
  RG_CHECK(low <= high, "uniform_: low (", low, ") must not exceed high (", high, ")");
  if (fill_through_host(t, [&](Tensor& h) { uniform_(h, low, high, gen); })) return t;
  const uint64_t offset = gen.reserve(uint64_t(t.numel() + 3) / 4);
  dispatch_float(t.dtype(), "uniform_", [&]<class T>() {
    kernels::cpu::uniform(t.data<T>(), t.numel(), T(low), T(high), gen.seed(), offset);
  });
  t.bump_version();
  return t;
}

Tensor& normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  check_random_target(t, "normal_");
  RG_CHECK(stddev >= 0, "normal_: stddev must be non-negative, got ", stddev);
  if (fill_through_host(t, [&](Tensor& h) { normal_(h, mean, stddev, gen); })) return t;
  const uint64_t offset = gen.reserve(uint64_t(t.numel() + 1) / 2);
  dispatch_float(t.dtype(), "normal_", [&]<class T>() {
    kernels::cpu::normal(t.data<T>(), t.numel(), T(mean), T(stddev), gen.seed(), offset);
  });
  t.bump_version();
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  return uniform_(t, 0.0, 1.0, gen);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  return normal_(t, 0.0, 1.0, gen);
}

}  // namespace rg
