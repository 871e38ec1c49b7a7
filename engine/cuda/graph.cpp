// cuda::Graph (engine/cuda/graph.h) and the Backend's default refusal of CUDA graphs.
#include "engine/cuda/graph.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <set>
#include <utility>

#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/generator.h"
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
bool Backend::stream_capturing(int, StreamHandle) { return false; }

namespace {
thread_local Graph* t_capturing = nullptr;  // the Graph whose body runs on this thread
// The devices a cuda::Graph captures on now, from any thread (for capturing(device)'s message).
std::mutex g_capturing_mu;
std::set<int> g_capturing_devices;
}  // namespace

philox::Offset philox_offset(Generator& gen, uint64_t groups, Device device) {
  Graph* g = t_capturing;
  if (g == nullptr || !device.is_cuda()) return philox::Offset(gen.reserve(groups));
  RG_CHECK(device.index == g->device_, "a random op on ", device.str(),
           " inside the capture of a CUDA graph on cuda:", g->device_);
  auto it = std::find_if(g->rng_.begin(), g->rng_.end(),
                         [&](const Graph::Rng& r) { return r.gen == &gen; });
  if (it == g->rng_.end()) {
    g->rng_.push_back({&gen, gen.seed(), gen.offset(), 0, g->replay_slots(1)});
    it = g->rng_.end() - 1;
  }
  RG_CHECK(gen.seed() == it->seed, "a generator was reseeded inside a CUDA graph capture");
  const uint64_t relative = gen.reserve(groups) - it->start;
  return philox::Offset(relative, it->slot.data<int64_t>());
}

Graph* Graph::capturing() { return t_capturing; }

Graph* Graph::capturing(int device) {
  const Stream stream = current_stream(device);
  const bool captured = runtime().backend().stream_capturing(device, stream.handle());
  if (!captured) return nullptr;
  Graph* g = t_capturing;
  if (g != nullptr && g->device_ == device) return g;
  bool elsewhere = false;
  {
    std::lock_guard<std::mutex> lock(g_capturing_mu);
    elsewhere = g_capturing_devices.count(device) > 0;
  }
  RG_CHECK(g == nullptr && elsewhere, "cuda:", device,
           ": the current stream is being captured, but not by a cuda::Graph on this thread and "
           "device (",
           g == nullptr ? std::string("none is capturing")
                        : "one is capturing on cuda:" + std::to_string(g->device_),
           "); capture through rg::cuda::Graph, whose replays run the hooks this work needs");
  RG_FAIL("cuda:", device,
          ": the current stream joined the capture of a cuda::Graph on another thread; queue "
          "this work from the capturing thread (its replays run the hooks the work needs, "
          "registered there)");
}

Tensor Graph::replay_slots(int64_t n) {
  RG_CHECK(t_capturing == this, "cuda::Graph::replay_slots: only during the graph's capture");
  RG_CHECK(n >= 1 && slots_used_ + n <= kReplaySlots,
           "cuda::Graph: the captured ops need more "
           "than ",
           kReplaySlots, " replay slots (", slots_used_, " taken, ", n, " more asked)");
  const Tensor view = slots_.flat_narrow(slots_used_, n);
  slots_used_ += n;
  return view;
}

void Graph::on_replay(std::function<void()> hook) {
  RG_CHECK(t_capturing == this, "cuda::Graph::on_replay: only during the graph's capture");
  hooks_.push_back(std::move(hook));
}

void Graph::after_replay(std::function<void()> hook) {
  RG_CHECK(t_capturing == this, "cuda::Graph::after_replay: only during the graph's capture");
  after_hooks_.push_back(std::move(hook));
}

Graph::Graph(Device device, const std::function<void()>& body) : device_(device.index) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  RG_CHECK(device.is_cuda(), "cuda::Graph: captures CUDA work, got device ", device.str());
  Backend& backend = runtime().backend();
  CachingAllocator& allocator = runtime().device_allocator(device_);
  const StreamHandle stream = current_stream(device_).handle();
  slots_ = Tensor::empty({kReplaySlots}, DType::i64, device);
  PinnedAllocator& pinned = runtime().pinned_allocator();
  std::exception_ptr failed;
  // Every step of undoing a capture runs whatever the others throw; the first error is the one
  // reported.
  const auto attempt = [&failed](const std::function<void()>& step) {
    try {
      step();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  };
  pool_ = allocator.begin_graph_pool(stream);
  bool began = false;
  try {
    pinned.begin_capture(id_, device_);
    backend.begin_capture(device_, stream);
    began = true;
    std::lock_guard<std::mutex> lock(g_capturing_mu);
    g_capturing_devices.insert(device_);
  } catch (...) {
    failed = std::current_exception();
    attempt([&] {
      if (!began) return;  // (the stream may be another capture's)
      const GraphHandle g = backend.end_capture(device_, stream);
      if (g != nullptr) backend.destroy_graph(device_, g);
    });
    attempt([&] { pinned.release_graph(id_, {}); });
    attempt([&] { allocator.release_graph_pool(pool_); });
    std::rethrow_exception(failed);
  }
  Graph* const outer = std::exchange(t_capturing, this);
  try {
    body();
  } catch (...) {
    failed = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(g_capturing_mu);
    g_capturing_devices.erase(device_);
  }
  t_capturing = outer;
  // The capture ran nothing: each generator is where it was, one replay takes what it reserved.
  for (Rng& r : rng_) {
    r.count = r.gen->offset() - r.start;
    r.gen->set_state(r.seed, r.start);
  }
  GraphHandle graph = nullptr;
  attempt([&] { graph = backend.end_capture(device_, stream); });
  attempt([&] { pinned.end_capture(id_); });  // before the device's next capture may begin
  attempt([&] { allocator.end_graph_pool(stream); });
  if (failed) {
    if (graph != nullptr) attempt([&] { backend.destroy_graph(device_, graph); });
    attempt([&] { pinned.release_graph(id_, {}); });
    attempt([&] { allocator.release_graph_pool(pool_); });
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
    runtime().device_allocator(device_).release_graph_pool(pool_, replayed_on_);
  } catch (...) {  // a destructor cannot report; the pool's memory stays cached
  }
  try {
    runtime().pinned_allocator().release_graph(id_, replayed_on_);
  } catch (...) {  // the pinned blocks it used stay out of reach
  }
}

Graph::Graph(Graph&& other) noexcept
    : device_(other.device_),
      id_(other.id_),
      pool_(other.pool_),
      graph_(std::exchange(other.graph_, nullptr)),
      rng_(std::move(other.rng_)),
      slots_(std::move(other.slots_)),
      slots_used_(other.slots_used_),
      hooks_(std::move(other.hooks_)),
      after_hooks_(std::move(other.after_hooks_)),
      replayed_on_(std::move(other.replayed_on_)) {}

void Graph::replay() {
  RG_CHECK(graph_ != nullptr, "cuda::Graph::replay: the graph was moved from");
  for (const Rng& r : rng_) {
    RG_CHECK(r.gen->seed() == r.seed,
             "cuda::Graph::replay: a generator its random ops draw from "
             "was reseeded since the capture (seed ",
             r.seed, ", now ", r.gen->seed(), "); capture again");
    RG_CHECK(r.gen->offset() < (uint64_t(1) << 53), "cuda::Graph::replay: Philox offset ",
             r.gen->offset(), " beyond 2^53");
  }
  const Stream stream = current_stream(device_);
  for (Rng& r : rng_) r.slot.fill_(double(r.gen->offset()));  // before the graph's work
  for (const auto& hook : hooks_) hook();
  // The slots' block is reused only after this replay (when the graph is destroyed), and so are
  // the blocks the graph holds (release_graph_pool).
  if (slots_used_ > 0) record_stream(slots_, stream);
  if (std::find(replayed_on_.begin(), replayed_on_.end(), stream.handle()) == replayed_on_.end())
    replayed_on_.push_back(stream.handle());
  runtime().backend().launch_graph(device_, graph_, stream.handle());
  for (const Rng& r : rng_) r.gen->reserve(r.count);  // what this replay drew
  for (const auto& hook : after_hooks_) hook();
}

}  // namespace rg::cuda
