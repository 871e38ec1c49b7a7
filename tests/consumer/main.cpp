// Uses the installed ringgrad: y = sum(w * x), checks dy/dw == x.
#include <ringgrad/engine/ops/binary.h>
#include <ringgrad/engine/ops/factory.h>
#include <ringgrad/engine/ops/reduce.h>

#include <cstdio>

int main() {
  rg::Tensor x = rg::from_vector<float>({1, 2, 3}, {3});
  rg::Tensor w = rg::ones({3});
  w.set_requires_grad(true);
  rg::Tensor y = rg::sum(rg::mul(w, x));
  y.backward();
  const auto g = w.grad().to_vector<float>();
  const bool ok = g == std::vector<float>{1, 2, 3} && y.item() == 6.0;
  std::printf("consumer: y=%g grad=[%g %g %g] %s\n", y.item(), g[0], g[1], g[2],
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
