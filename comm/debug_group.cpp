// The recording and checking layer over every process group.
#include "comm/debug_group.h"

#include <atomic>
#include <chrono>
#include <iostream>
#include <vector>

#include "comm/debug_level.h"
#include "comm/flight_recorder.h"
#include "comm/prefix_store.h"
#include "comm/progress_board.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

// How many groups of each name this process made: the k in the store prefix and record names.
int next_group_index(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, int> counts;
  std::lock_guard lock(mu);
  return counts[name]++;
}

// A failure dumps the recorder once per process: the first failure is the one that explains,
// and the ones after it (every later call fails too) would only overwrite it.
std::string dump_once(const std::string& reason, int rank, int size) {
  static std::atomic<bool> dumped{false};
  if (dumped.exchange(true)) return {};
  const std::string path = FlightRecorder::global().dump_to_file(reason, rank, size);
  if (!path.empty())
    std::cerr << "ringgrad: flight recorder of rank " << rank << " written to " << path
              << " (analyze every rank's with: ringgrad-bench flight <dir>/rank*.json)\n";
  return path;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string dtype_of(const Tensor& t) { return dtype_name(t.dtype()); }

// A fingerprint travels with its description: "<fingerprint>\n<description>".
std::pair<std::string, std::string> split_entry(const std::string& v) {
  const size_t nl = v.find('\n');
  if (nl == std::string::npos) return {v, v};
  return {v.substr(0, nl), v.substr(nl + 1)};
}

}  // namespace

DebugProcessGroup::DebugProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                     std::shared_ptr<Store> store)
    : ProcessGroup(inner->rank(), inner->size(), inner->options()), inner_(std::move(inner)) {
  const int k = next_group_index(options_.name);
  name_ = k == 0 ? options_.name : options_.name + "#" + std::to_string(k);
  if (store) {
    store_ = std::make_shared<PrefixStore>("rg.debug/" + options_.name + "/" + std::to_string(k),
                                           std::move(store));
    store_->set_timeout(options_.timeout);
  }
}

void DebugProcessGroup::set_algorithm(Algorithm a) {
  ProcessGroup::set_algorithm(a);
  inner_->set_algorithm(a);
}

uint64_t DebugProcessGroup::sequence_number() const {
  std::lock_guard lock(mu_);
  return seq_;
}

CollectiveCall DebugProcessGroup::make_call(const char* op,
                                            std::vector<const Tensor*> tensors) const {
  CollectiveCall c;
  c.group = name_;
  c.op = op;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (c.dtype.empty()) {
      c.dtype = dtype_of(*t);
      c.device = t->device().str();
    }
    c.shapes.push_back(t->shape());
  }
  if (c.device.empty()) c.device = inner_->tensor_device().str();
  return c;
}

void DebugProcessGroup::fail(uint64_t id, const std::string& message) {
  FlightRecorder::global().ended(id, unix_seconds(), message);
  const std::string path = dump_once("error", rank(), size());
  RG_FAIL(message, path.empty() ? "" : " (flight recorder: " + path + ")");
}

WorkPtr DebugProcessGroup::run(CollectiveCall call, const std::function<WorkPtr()>& issue) {
  std::unique_lock lock(mu_);
  const bool p2p = call.op == "send" || call.op == "recv";
  const int src = call.op == "send" ? rank() : call.root;
  const int dst = call.op == "send" ? call.root : rank();
  call.seq = p2p ? ++p2p_seq_[{src, dst, call.tag}] : ++seq_;
  FlightRecorder& recorder = FlightRecorder::global();
  const uint64_t id = recorder.enqueued(call);
  if (store_ && debug_level() == DebugLevel::detail) {
    try {
      if (p2p)
        check_p2p(call, src, dst);
      else
        check_collective(call);
    } catch (const Error& e) {
      fail(id, e.what());
    }
  }
  WorkPtr work;
  try {
    work = issue();
  } catch (const Error& e) {
    recorder.ended(id, unix_seconds(), e.what());
    throw;
  }
  lock.unlock();
  const int r = rank(), n = size();
  work->on_complete([id, r, n](const Work& w) {
    // The Work's steady-clock times, moved onto the recorder's unix clock.
    const double now = unix_seconds();
    const auto steady_now = Work::Clock::now();
    const auto unix_of = [&](Work::Clock::time_point t) {
      return now - std::chrono::duration<double>(steady_now - t).count();
    };
    FlightRecorder& rec = FlightRecorder::global();
    rec.started(id, unix_of(w.start_time()));
    const std::exception_ptr error = w.exception();
    rec.ended(id, unix_of(w.end_time()), error ? message_of(error) : std::string());
    if (error) dump_once("error", r, n);
  });
  return work;
}

void DebugProcessGroup::check_collective(const CollectiveCall& call) {
  const std::string prefix = "c" + std::to_string(call.seq) + "/";
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(prefix + std::to_string(r));
  store_->set(keys[size_t(rank())], call.fingerprint() + "\n" + call.describe());
  try {
    store_->wait(keys, options_.timeout);
  } catch (const Error&) {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r)
      if (!store_->check({keys[size_t(r)]})) missing.push_back(r);
    RG_FAIL("RG_DISTRIBUTED_DEBUG=DETAIL: rank ", rank(), " waits in ", call.describe(),
            " of group '", name_, "', but rank(s) ", format_ranks(missing), " did not reach call #",
            call.seq, " within ", std::chrono::duration<double>(options_.timeout).count(),
            " s: they skipped a collective, are stuck in an earlier one, or are gone");
  }
  // Ranks grouped by the call they made, rank 0's group first.
  std::vector<std::pair<std::string, std::string>> calls;  // fingerprint, description
  std::vector<std::vector<int>> ranks;
  for (int r = 0; r < size(); ++r) {
    const auto [fp, text] = split_entry(to_string(store_->get(keys[size_t(r)])));
    size_t i = 0;
    while (i < calls.size() && calls[i].first != fp) ++i;
    if (i == calls.size()) {
      calls.emplace_back(fp, text);
      ranks.emplace_back();
    }
    ranks[i].push_back(r);
  }
  if (calls.size() > 1) {
    std::string what;
    std::vector<int> differ;
    for (size_t i = 0; i < calls.size(); ++i) {
      what += detail::cat(i ? "; " : "", ranks[i].size() == 1 ? "rank " : "ranks ",
                          format_ranks(ranks[i]), " called ", calls[i].second);
      if (i > 0) differ.insert(differ.end(), ranks[i].begin(), ranks[i].end());
    }
    RG_FAIL("RG_DISTRIBUTED_DEBUG=DETAIL: the ranks disagree on call #", call.seq, " of group '",
            name_, "': ", what, ". Rank(s) ", format_ranks(differ),
            " differ from rank 0 (a rank that skipped, added or reordered a collective, or passed "
            "another shape or dtype)");
  }
  // Every rank has read call seq - 1's keys once it set its key of seq, so seq - 2's are free.
  if (call.seq > 2)
    store_->delete_key("c" + std::to_string(call.seq - 2) + "/" + std::to_string(rank()));
}

void DebugProcessGroup::check_p2p(const CollectiveCall& call, int src, int dst) {
  // The k-th send from src to dst with this tag meets the k-th such receive; the receiver
  // checks (a send does not wait for its receiver).
  const std::string key = detail::cat("p", src, "-", dst, "-t", call.tag, "/", call.seq);
  if (call.op == "send") {
    store_->set(key, call.dtype + "|" + std::to_string(call.numel()) + "\n" + call.describe());
    return;
  }
  Bytes value;
  try {
    value = store_->get(key, options_.timeout);
  } catch (const Error&) {
    RG_FAIL("RG_DISTRIBUTED_DEBUG=DETAIL: rank ", rank(), " waits in ", call.describe(),
            " of group '", name_, "', but rank ", src, " made no matching send #", call.seq,
            " (tag ", call.tag, ") within ",
            std::chrono::duration<double>(options_.timeout).count(), " s");
  }
  store_->delete_key(key);
  const auto [fp, text] = split_entry(to_string(value));
  const std::string mine = call.dtype + "|" + std::to_string(call.numel());
  RG_CHECK(fp == mine, "RG_DISTRIBUTED_DEBUG=DETAIL: rank ", rank(), " called ", call.describe(),
           " of group '", name_, "', but rank ", src, " called ", text,
           ": the dtype or element count differs");
}

WorkPtr DebugProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  CollectiveCall call = make_call("all_reduce", {&tensor});
  call.reduce_op = reduce_op_name(op);
  return run(std::move(call), [&] { return inner_->all_reduce(tensor, op); });
}

WorkPtr DebugProcessGroup::broadcast(const Tensor& tensor, int root) {
  CollectiveCall call = make_call("broadcast", {&tensor});
  call.root = root;
  return run(std::move(call), [&] { return inner_->broadcast(tensor, root); });
}

WorkPtr DebugProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  return run(make_call("all_gather", {&input, &output}),
             [&] { return inner_->all_gather(output, input); });
}

WorkPtr DebugProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  CollectiveCall call = make_call("reduce_scatter", {&input, &output});
  call.reduce_op = reduce_op_name(op);
  return run(std::move(call), [&] { return inner_->reduce_scatter(output, input, op); });
}

WorkPtr DebugProcessGroup::barrier() {
  return run(make_call("barrier", {}), [&] { return inner_->barrier(); });
}

WorkPtr DebugProcessGroup::send(const Tensor& tensor, int dst, uint32_t tag) {
  // Before the DETAIL check, which would wait for a rank that does not exist.
  check_rank(dst, "send", "destination");
  CollectiveCall call = make_call("send", {&tensor});
  call.root = dst;
  call.tag = tag;
  return run(std::move(call), [&] { return inner_->send(tensor, dst, tag); });
}

WorkPtr DebugProcessGroup::recv(const Tensor& tensor, int src, uint32_t tag) {
  check_rank(src, "recv", "source");
  CollectiveCall call = make_call("recv", {&tensor});
  call.root = src;
  call.tag = tag;
  return run(std::move(call), [&] { return inner_->recv(tensor, src, tag); });
}

}  // namespace rg::dist
