// argmax and top-k hit counting. Both are single passes with no sort: a target is in the top k
// when fewer than k classes rank above it, so topk_correct costs O(C) per row.
#include "engine/ops/metrics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "kernels/cuda/metrics.h"
#include "kernels/error.h"

namespace rg {
namespace {

// a ranks above b: larger, or NaN against a number (NaN is the largest value, as in PyTorch).
template <class T>
bool ranks_above(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

template <class T>
bool ranks_same(T a, T b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

}  // namespace

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_inputs("argmax", {x});
  const int64_t n = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor has one element at index 0
  RG_CHECK(dim >= -n && dim < n, "argmax: dim ", dim, " is out of range for shape ",
           shape_str(x.shape()));
  if (dim < 0) dim += n;
  const int64_t c = x.dim() == 0 ? 1 : x.size(dim);
  RG_CHECK(c > 0, "argmax: cannot take the argmax of an empty dimension (shape ",
           shape_str(x.shape()), ", dim ", dim, ")");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape shape = x.shape();
  if (x.dim() > 0) {
    if (keepdim) {
      shape[size_t(dim)] = 1;
    } else {
      shape.erase(shape.begin() + dim);
    }
  }
  Tensor out = Tensor::empty(shape, DType::i64, x.device());
  int64_t* idx = out.data<int64_t>();
  if (x.device().is_cuda()) {
    dispatch_cuda_float(x.dtype(), "argmax", [&]<class T>() {
      kernels::cuda::argmax<T>(x.data<T>(), idx, outer, c, inner, cuda_stream(x));
    });
    return out;
  }
  dispatch_float(x.dtype(), "argmax", [&]<class T>() {
    const T* p = x.data<T>();
    // Walk the reduced dimension in the outer loop so the inner loop reads contiguous memory.
    std::vector<T> best(static_cast<size_t>(inner));
    for (int64_t o = 0; o < outer; ++o) {
      const T* base = p + o * c * inner;
      int64_t* oi = idx + o * inner;
      std::copy_n(base, inner, best.begin());
      std::fill_n(oi, inner, int64_t(0));
      for (int64_t k = 1; k < c; ++k) {
        for (int64_t i = 0; i < inner; ++i) {
          const T v = base[k * inner + i];
          if (ranks_above(v, best[size_t(i)])) {
            best[size_t(i)] = v;
            oi[i] = k;
          }
        }
      }
    }
  });
  return out;
}

int64_t topk_correct(const Tensor& logits, const Tensor& target, int64_t k) {
  check_inputs("topk_correct", {logits});
  check_dim("topk_correct", logits, 2, "[N, C]");
  RG_CHECK(target.defined() && target.dtype() == DType::i64 && target.dim() == 1 &&
               target.size(0) == logits.size(0),
           "topk_correct: target must be an i64 tensor of shape [", logits.size(0), "], got ",
           target.defined() ? dtype_name(target.dtype()) : "undefined", " ",
           target.defined() ? shape_str(target.shape()) : "");
  const int64_t n = logits.size(0), c = logits.size(1);
  RG_CHECK(k >= 1 && k <= c, "topk_correct: k = ", k, " must be in [1, ", c, "] for ", c,
           " classes");
  RG_CHECK(target.device() == logits.device(), "topk_correct: target is on ", target.device().str(),
           " but logits are on ", logits.device().str());
  if (logits.device().is_cuda()) {  // out-of-range targets count as misses there
    Tensor correct = Tensor::empty({}, DType::i64, logits.device());
    dispatch_cuda_float(logits.dtype(), "topk_correct", [&]<class T>() {
      kernels::cuda::topk_correct<T>(logits.data<T>(), target.data<int64_t>(), n, c, k,
                                     correct.data<int64_t>(), cuda_stream(logits));
    });
    return int64_t(correct.item());
  }
  const int64_t* t = target.data<int64_t>();
  return dispatch_float(logits.dtype(), "topk_correct", [&]<class T>() {
    const T* p = logits.data<T>();
    int64_t correct = 0;
    for (int64_t i = 0; i < n; ++i) {
      RG_CHECK(t[i] >= 0 && t[i] < c, "topk_correct: target ", t[i], " at index ", i,
               " is out of range for ", c, " classes");
      const T* row = p + i * c;
      const T v = row[t[i]];
      // Rank of the target: classes above it, plus equal classes that come before it.
      int64_t rank = 0;
      for (int64_t j = 0; j < c; ++j) {
        rank += ranks_above(row[j], v) || (j < t[i] && ranks_same(row[j], v));
      }
      correct += rank < k;
    }
    return correct;
  });
}

double accuracy(const Tensor& logits, const Tensor& target, int64_t k) {
  check_inputs("accuracy", {logits});
  check_dim("accuracy", logits, 2, "[N, C]");
  RG_CHECK(logits.size(0) > 0, "accuracy: needs at least one row, got shape ",
           shape_str(logits.shape()));
  return double(topk_correct(logits, target, k)) / double(logits.size(0));
}

}  // namespace rg
