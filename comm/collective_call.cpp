// Descriptions and fingerprints of collective calls.
#include "comm/collective_call.h"

#include <sstream>

namespace rg::dist {

int64_t CollectiveCall::numel() const { return shapes.empty() ? 0 : shape_numel(shapes[0]); }

std::string CollectiveCall::describe() const {
  std::ostringstream s;
  s << op << " #" << seq;
  if (op == "barrier") return s.str();
  s << " (";
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string dims;
    for (size_t d = 0; d < shapes[i].size(); ++d)
      dims += (d ? ", " : "") + std::to_string(shapes[i][d]);
    s << (i ? " -> " : "") << dtype << "[" << dims << "]";
  }
  if (!reduce_op.empty()) s << ", " << reduce_op;
  if (op == "broadcast") s << ", root " << root;
  if (op == "send") s << " to " << root << ", tag " << tag;
  if (op == "recv") s << " from " << root << ", tag " << tag;
  s << ")";
  return s.str();
}

std::string CollectiveCall::fingerprint() const {
  std::ostringstream s;
  s << group << '|' << op << '|' << reduce_op << '|' << root << '|' << tag << '|' << dtype << '|';
  for (const Shape& sh : shapes) {
    s << '[';
    for (size_t d = 0; d < sh.size(); ++d) s << (d ? "," : "") << sh[d];
    s << ']';
  }
  return s.str();
}

}  // namespace rg::dist
