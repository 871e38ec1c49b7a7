// cuda::Graph (engine/cuda/graph.h) and the Backend's default refusal of CUDA graphs.
#include "engine/cuda/graph.h"

#include <atomic>
#include <exception>
#include <utility>

#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "kernels/error.h"

namespace rg::cuda {

void Backend::begin_capture(int device, StreamHandle) {
  RG_FAIL("cuda:", device, ": CUDA graphs are not available with this CUDA backend");
}
GraphHandle Backend::end_capture(int device, StreamHandle) {
  RG_FAIL("cuda:", device, ": CUDA graphs are not available with this CUDA backend");
}
void Backend::launch_graph(int device, GraphHandle, StreamHandle) {
  RG_FAIL("cuda:", device, ": CUDA graphs are not available with this CUDA backend");
}
void Backend::destroy_graph(int, GraphHandle) {}

namespace {
std::atomic<int> g_capturing{0};
}  // namespace

namespace detail {
bool graph_capture_active() { return g_capturing.load(std::memory_order_acquire) > 0; }
}  // namespace detail

void refuse_random_in_capture(Device device, const char* op) {
  RG_CHECK(!device.is_cuda() || !detail::graph_capture_active(), op, " on ", device.str(),
           " inside a CUDA graph capture: its random numbers would repeat at every replay (the "
           "generator's offset is a host value); run it outside the graph (without --cuda-graphs, "
           "or a model without dropout)");
}

Graph::Graph(Device device, const std::function<void()>& body) : device_(device.index) {
  RG_CHECK(device.is_cuda(), "cuda::Graph: captures CUDA work, got device ", device.str());
  Backend& backend = runtime().backend();
  CachingAllocator& allocator = runtime().device_allocator(device_);
  const StreamHandle stream = current_stream(device_).handle();
  pool_ = allocator.begin_graph_pool(stream);
  try {
    backend.begin_capture(device_, stream);
  } catch (...) {
    allocator.release_graph_pool(pool_);
    throw;
  }
  g_capturing.fetch_add(1, std::memory_order_acq_rel);
  std::exception_ptr failed;
  try {
    body();
  } catch (...) {
    failed = std::current_exception();
  }
  GraphHandle graph = nullptr;
  try {
    graph = backend.end_capture(device_, stream);
  } catch (...) {
    if (!failed) failed = std::current_exception();
  }
  g_capturing.fetch_sub(1, std::memory_order_acq_rel);
  allocator.end_graph_pool(stream);
  if (failed) {
    if (graph != nullptr) backend.destroy_graph(device_, graph);
    allocator.release_graph_pool(pool_);
    try {
      std::rethrow_exception(failed);
    } catch (const Error& e) {
      RG_FAIL("capturing a CUDA graph on cuda:", device_, ": ", e.what());
    }
  }
  graph_ = graph;
}

Graph::~Graph() {
  if (graph_ == nullptr) return;
  runtime().backend().destroy_graph(device_, graph_);
  try {
    runtime().device_allocator(device_).release_graph_pool(pool_);
  } catch (...) {  // a destructor cannot report; the pool's memory stays cached
  }
}

Graph::Graph(Graph&& other) noexcept
    : device_(other.device_),
      pool_(other.pool_),
      graph_(std::exchange(other.graph_, nullptr)) {}

void Graph::replay() const {
  RG_CHECK(graph_ != nullptr, "cuda::Graph::replay: the graph was moved from");
  runtime().backend().launch_graph(device_, graph_, current_stream(device_).handle());
}

}  // namespace rg::cuda
