// Backward pass: dependency counting, a ready queue ordered by sequence number (latest first),
// per-node gradient buffers, shape checks on every produced gradient, then final callbacks.
#include "engine/autograd/engine.h"

#include <optional>
#include <queue>
#include <unordered_map>

#include "engine/autocast.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/cuda/stream_trace.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::autograd {
namespace {

struct GraphTask {
  std::vector<std::function<void()>> final_callbacks;
};
thread_local GraphTask* t_current_task = nullptr;

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

bool Engine::in_backward() { return t_current_task != nullptr; }

void Engine::queue_callback(std::function<void()> callback) {
  RG_CHECK(t_current_task != nullptr,
           "queue_callback can only be called while a backward pass is running (from a hook)");
  t_current_task->final_callbacks.push_back(std::move(callback));
}

void Engine::backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                      bool retain_graph) {
  RG_CHECK(roots.size() == gradients.size(), "backward: got ", roots.size(), " roots but ",
           gradients.size(), " gradients");
  std::unordered_map<Node*, Tensor> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    RG_CHECK(root.defined(), "backward: root ", i, " is an undefined tensor");
    RG_CHECK(root.requires_grad(), "backward: root ", i,
             " does not require grad and has no grad_fn (was it computed under NoGradGuard, "
             "or from tensors without requires_grad?)");
    Tensor seed = gradients[i];
    if (!seed.defined()) {
      RG_CHECK(root.numel() == 1,
               "backward: a gradient can be implied only for a scalar root, "
               "but root ",
               i, " has shape ", shape_str(root.shape()), "; pass the gradient explicitly");
      seed = ones(root.shape(), root.dtype(), root.device());
    }
    RG_CHECK(seed.shape() == root.shape(), "backward: gradient of shape ", shape_str(seed.shape()),
             " does not match root ", i, " of shape ", shape_str(root.shape()));
    // In the root's memory format, as every gradient the engine hands on (Node::input_formats).
    if (seed.memory_format() != root.memory_format()) {
      const NoGradGuard no_grad;
      seed = seed.detach().contiguous(root.memory_format());
    }
    std::shared_ptr<Node> node = gradient_edge(root);
    Tensor& buf = buffers[node.get()];
    buf = buf.defined() ? add(buf, seed) : seed;
    root_nodes.push_back(std::move(node));
  }

  // Count how many edges point at each reachable node.
  std::unordered_map<Node*, int> dependencies;
  {
    std::vector<Node*> stack;
    std::unordered_map<Node*, bool> seen;
    for (auto& n : root_nodes) {
      if (!seen[n.get()]) {
        seen[n.get()] = true;
        stack.push_back(n.get());
      }
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges()) {
        if (!e.node) continue;
        ++dependencies[e.node.get()];
        if (!seen[e.node.get()]) {
          seen[e.node.get()] = true;
          stack.push_back(e.node.get());
        }
      }
    }
  }

  GraphTask task;
  GraphTask* const outer = t_current_task;
  t_current_task = &task;
  struct Restore {
    GraphTask* outer;
    ~Restore() { t_current_task = outer; }
  } restore{outer};

  NoGradGuard no_grad;                // backward computations are not recorded (no double backward)
  const NoAutocastGuard no_autocast;  // each backward op runs in its forward's dtypes
  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready;
  for (auto& n : root_nodes) {
    if (dependencies[n.get()] == 0) {
      dependencies[n.get()] = -1;  // queued once even if it is several roots
      ready.push(n.get());
    }
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Tensor grad = std::move(buffers[node]);
    buffers.erase(node);
    std::vector<Tensor> input_grads;
    if (grad.defined()) {
      const bool traced = trace::enabled();
      const auto t0 = traced ? trace::Clock::now() : trace::Clock::time_point{};
      std::string span_name, node_name;
      std::optional<cuda::OpSpan> on_stream;  // when the kernels really ran (the node's ops
      if (traced) {                           // inside it have no spans of their own)
        node_name = node->name();
        span_name = node->scope().empty() ? node_name : node->scope() + ": " + node_name;
        on_stream.emplace(node_name.c_str(), "backward kernels", grad.device(), &node->scope());
      }
      input_grads = node->apply(node->run_tensor_pre_hooks(std::move(grad)));
      on_stream.reset();
      if (!retain_graph) node->release_saved();
      if (traced) trace::span(std::move(span_name), "backward", t0, trace::Clock::now());
    }
    const auto& edges = node->next_edges();
    RG_CHECK(input_grads.empty() || input_grads.size() == edges.size(), node->name(), " returned ",
             input_grads.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      Node* next = edges[i].node.get();
      if (next == nullptr) continue;
      if (!input_grads.empty() && input_grads[i].defined()) {
        Tensor& g = input_grads[i];
        RG_CHECK(g.shape() == node->input_shapes()[i], node->name(),
                 " returned a gradient of shape ", shape_str(g.shape()), " for input ", i,
                 ", which has shape ", shape_str(node->input_shapes()[i]));
        // In the input's memory format (Node::input_formats); a counted layout conversion.
        if (g.memory_format() != node->input_formats()[i]) {
          g = g.contiguous(node->input_formats()[i]);
        }
        Tensor& buf = buffers[next];
        if (!buf.defined()) {
          buf = g;
        } else if (reusable(buf)) {
          add_(buf, g);  // a sum only this pass holds: no third buffer (the same float sums)
        } else {
          buf = add(buf, g);
        }
      }
      if (--dependencies[next] == 0) ready.push(next);
    }
  }

  // Callbacks may queue further callbacks; run until none are left.
  for (size_t i = 0; i < task.final_callbacks.size(); ++i) {
    auto cb = std::move(task.final_callbacks[i]);
    cb();
  }
}

}  // namespace rg::autograd
