// ringgrad-bench scale: a step profile replayed on a modelled network (see scale_sim.h).
//
// All-reduce times (B bytes, n ranks, per-hop latency a, bandwidth w per GPU and direction):
//   ring:  2(n-1)/n * B/w + 2(n-1) * a    (reduce-scatter then all-gather, n-1 steps each)
//   tree:  2 * B/w + 2 * ceil(log2 n) * a (NCCL's double binary tree: a pipelined reduce up and
//          broadcast down, each moving all of B through a link; we do not count the overlap of
//          the two passes, so this is the tree's upper bound, and ring wins for large buckets)
//   best:  the faster of the two per all-reduce, as NCCL's tuner picks.
// Beyond one node (n = m nodes x G GPUs, n a multiple of G) hierarchically, as NCCL and Horovod:
// a ring reduce-scatter inside each node (every GPU then holds B/G of the sum), an all-reduce of
// those B/G bytes across the m nodes (ring or tree; the G GPUs of a node run G such all-reduces
// at once, sharing the node's NICs, so each sees inter.gbps / G), and a ring all-gather inside.
// The flat --sim-link model is comm/sim_link's: latency once per collective + ring bandwidth.
#include "apps/scale_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/common/plot.h"
#include "apps/json_number.h"
#include "apps/trace_file.h"
#include "comm/bucket_assignment.h"
#include "kernels/error.h"

namespace rg::apps::scale {
namespace {

using json = nlohmann::json;
constexpr double kMiB = 1024.0 * 1024.0;

// Bytes over a level: GB/s = 1e3 bytes per microsecond.
double transfer_us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

void sort_by_ready(std::vector<Grad>& g) {
  std::stable_sort(g.begin(), g.end(),
                   [](const Grad& a, const Grad& b) { return a.ready_ms < b.ready_ms; });
}

// A bucket-level profile as pieces of at most 64 KiB, each bucket's bytes becoming ready evenly
// between the previous bucket's ready instant (backward's start for the first) and its own.
std::vector<Grad> interpolate_pieces(const std::vector<Grad>& buckets) {
  std::vector<Grad> out;
  double prev = 0;
  for (const Grad& b : buckets) {
    const int64_t n = std::clamp<int64_t>((b.bytes + 65535) / 65536, 1, 4096);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t lo = b.bytes * j / n, hi = b.bytes * (j + 1) / n;
      out.push_back({b.name, hi - lo, prev + (b.ready_ms - prev) * double(j + 1) / double(n)});
    }
    prev = std::max(prev, b.ready_ms);
  }
  return out;
}

struct BucketSpec {
  std::string label;
  double cap_mb, first_mb;
};

BucketSpec parse_bucket(const std::string& s) {
  if (s == "single") return {s, 0, 0};
  if (s == "inf") return {s, 1e12, 1.0};
  size_t used = 0;
  double mb = 0;
  try {
    mb = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  RG_CHECK(used == s.size() && mb > 0, "--bucket-mb '", s,
           "' must be a positive size in MiB, 'inf' or 'single'");
  return {s, mb, std::min(1.0, mb)};
}

// The most bytes one gradient (or bucket) of a profile may have, and all of them together: far
// beyond any model, and small enough that sums and the re-bucketing's products stay in int64.
constexpr int64_t kMaxGradBytes = int64_t(1) << 50;
constexpr int64_t kMaxTotalBytes = int64_t(1) << 56;

void check_total_bytes(const std::vector<Grad>& grads, const std::string& file) {
  int64_t total = 0;
  for (const Grad& g : grads)
    RG_CHECK(!__builtin_add_overflow(total, g.bytes, &total) && total <= kMaxTotalBytes, file,
             ": the gradients add up to more than 2^56 bytes");
}

}  // namespace

int64_t StepProfile::total_bytes() const {
  int64_t t = 0;
  for (const Grad& g : grads) t += g.bytes;
  return t;
}

StepProfile parse_step_profile(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, false);
  RG_CHECK(!j.is_discarded(), file, " is not JSON, so not a step profile");
  // j.value() would throw nlohmann's type_error for a "format" that is not a string.
  RG_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
               j["format"] == "ringgrad-step-profile",
           file, " is not a step profile (no \"format\": \"ringgrad-step-profile\")");
  RG_CHECK(j.contains("version") && j["version"] == 1, file, " is a step profile of version ",
           j.value("version", json()).dump(), "; this ringgrad reads version 1");
  StepProfile p;
  try {
    p.model = j.value("model", "");
    p.source = j.value("source", "");
    p.measured_ranks = json_int_or<int>(j, "measured_ranks", 1, "measured_ranks", 1, 1 << 24);
    p.forward_ms = j.at("forward_ms").get<double>();
    p.backward_ms = j.at("backward_ms").get<double>();
    p.optimizer_ms = j.at("optimizer_ms").get<double>();
    p.per_parameter = j.value("granularity", "parameter") != "bucket";
    for (const auto& g : j.at("grads"))
      p.grads.push_back(
          {g.value("name", ""),
           json_int<int64_t>(g.at("bytes"), "a gradient's bytes", INT64_MIN, kMaxGradBytes),
           g.at("ready_ms").get<double>()});
  } catch (const json::exception& e) {
    RG_FAIL(file, " is not a valid step profile: ", e.what());
  } catch (const Error& e) {
    RG_FAIL(file, " is not a valid step profile: ", e.what());
  }
  RG_CHECK(p.forward_ms >= 0 && p.backward_ms >= 0 && p.optimizer_ms >= 0, file,
           ": forward_ms, backward_ms and optimizer_ms must not be negative");
  RG_CHECK(!p.grads.empty(), file, " lists no gradients (\"grads\" is empty)");
  check_total_bytes(p.grads, file);
  for (const Grad& g : p.grads)
    RG_CHECK(g.bytes > 0 && g.ready_ms >= 0, file, ": gradient '", g.name, "' has ", g.bytes,
             " bytes ready at ", g.ready_ms, " ms; bytes must be positive and the time >= 0");
  sort_by_ready(p.grads);
  return p;
}

StepProfile profile_from_trace(const std::string& text, const std::string& file, int step,
                               int rank) {
  const Trace trace = parse_trace(text, file);
  struct Ev {
    std::string name, cat;
    double ts, dur;
    int64_t bytes;
    bool host;  // not a GPU stream's span
  };
  std::vector<Ev> evs;
  const int ranks = trace.processes;
  for (const TraceEvent& e : trace.events) {
    if (e.pid != rank) continue;
    const auto bytes = e.args.find("bytes");
    RG_CHECK(
        bytes == e.args.end() || (bytes->second >= 0 && bytes->second <= double(kMaxGradBytes)),
        file, ": '", e.name, "' has ", bytes->second, " bytes, beyond 2^50");
    evs.push_back({e.name, e.cat, e.ts, e.dur,
                   bytes == e.args.end() ? int64_t(0) : int64_t(bytes->second),
                   !trace.on_stream(e)});
  }
  const std::vector<double> forwards = trace.step_starts(rank);
  RG_CHECK(rank < ranks, file, " has ", ranks, " ranks; --rank ", rank, " is not one of them");
  // One step: from its forward to the next forward (or the end of the trace).
  // The step extract() looked at last is a --cuda-graphs capture (its spans time the host queuing
  // work that did not run) or replay (one launch, nothing traced apart): not a profile.
  bool graph_step = false;
  auto extract = [&](size_t s, StepProfile& p) {
    graph_step = false;
    const double t0 = forwards[s];
    const double t1 = s + 1 < forwards.size() ? forwards[s + 1] : 1e300;
    const Ev *fwd = nullptr, *bwd = nullptr, *wait = nullptr;
    double opt = -1;
    std::vector<Grad> buckets;
    for (const Ev& e : evs) {
      if (e.ts < t0 || e.ts >= t1) continue;
      if (e.cat == "step" && e.name == "forward") fwd = &e;
      if (e.host && e.cat == "step" &&
          (e.name == "cuda graph replay" || e.name == "cuda graph capture"))
        graph_step = true;
      if (e.cat == "step" && e.name == "backward") bwd = &e;
      // Clipping belongs to the update: it runs after the gradients are final.
      if (e.cat == "step" && (e.name == "optimizer step" || e.name == "clip gradients"))
        opt = std::max(opt, 0.0) + e.dur / 1000;
      if (e.cat == "ddp" && e.name == "DDP wait for buckets") wait = &e;
      if (e.cat == "ddp" && e.name.starts_with("bucket ") && e.name.ends_with(" ready"))
        buckets.push_back({e.name.substr(0, e.name.size() - 6), e.bytes, e.ts});
    }
    if (graph_step || !fwd || !bwd || opt < 0 || buckets.empty()) return false;
    p.forward_ms = fwd->dur / 1000;
    // Backward's span also holds DDP's final wait; its compute ends where that wait begins.
    p.backward_ms = ((wait ? wait->ts : bwd->ts + bwd->dur) - bwd->ts) / 1000;
    p.optimizer_ms = opt;
    for (Grad& b : buckets) {
      RG_CHECK(b.bytes > 0, file, ": '", b.name,
               " ready' has no \"bytes\" argument (a trace from an older ringgrad-train?)");
      b.ready_ms = std::max(0.0, (b.ready_ms - bwd->ts) / 1000);
    }
    check_total_bytes(buckets, file);
    p.grads = std::move(buckets);
    sort_by_ready(p.grads);
    return true;
  };
  StepProfile p;
  p.per_parameter = false;
  p.measured_ranks = ranks;
  bool found = false;
  if (step >= 0) {
    RG_CHECK(size_t(step) < forwards.size(), file, " has ", forwards.size(),
             " traced steps on rank ", rank, "; --step must be below that");
    found = extract(size_t(step), p);
    RG_CHECK(found || !graph_step, file, ": step ", step, " of rank ", rank,
             " is a CUDA graph capture or replay (--cuda-graphs): a replay runs its forward, "
             "backward, buckets and optimizer step as one launch, not traced apart, and the "
             "capture's spans time queuing work that did not run; pick a step before the "
             "capture (the first ones) or trace a run without --cuda-graphs");
    RG_CHECK(found, file, ": step ", step, " of rank ", rank,
             " lacks a forward, backward, optimizer step or DDP bucket (a trace of a DDP run "
             "under ringgrad-run is needed)");
  } else {
    for (size_t s = forwards.size(); s-- > 0 && !found;) found = extract(s, p);
    RG_CHECK(found, file, " holds no complete DDP step of rank ", rank,
             " (forward, backward, optimizer step and bucket-ready events; trace a DDP run "
             "under ringgrad-run with ringgrad-train --trace)");
  }
  p.model = std::filesystem::path(file).stem().string();
  p.source = fmt::format("ringgrad-train --trace {}, rank {}, step {}", file, rank,
                         step >= 0 ? std::to_string(step) : "(last complete)");
  return p;
}

StepProfile read_profile(const std::string& path, int step, int rank) {
  std::ifstream f(path);
  RG_CHECK(f.good(), "cannot read ", path);
  std::stringstream s;
  s << f.rdbuf();
  return profile_from_text(s.str(), path, step, rank);
}

StepProfile profile_from_text(const std::string& text, const std::string& file, int step,
                              int rank) {
  // A trace always has traceEvents near its start; a profile never does.
  if (text.find("\"traceEvents\"") != std::string::npos)
    return profile_from_trace(text, file, step, rank);
  return parse_step_profile(text, file);
}

std::string step_profile_json(const StepProfile& p) {
  json j = {{"format", "ringgrad-step-profile"},
            {"version", 1},
            {"model", p.model},
            {"source", p.source},
            {"measured_ranks", p.measured_ranks},
            {"granularity", p.per_parameter ? "parameter" : "bucket"},
            {"forward_ms", p.forward_ms},
            {"backward_ms", p.backward_ms},
            {"optimizer_ms", p.optimizer_ms}};
  json g = json::array();
  for (const Grad& x : p.grads)
    g.push_back({{"name", x.name}, {"bytes", x.bytes}, {"ready_ms", x.ready_ms}});
  j["grads"] = std::move(g);
  return j.dump(1);
}

Cluster preset(const std::string& name) {
  // Bandwidths are the vendors' per-direction peaks; latencies are per hop, of the order that
  // NCCL's own tuning model assumes (a few microseconds over NVLink and InfiniBand).
  if (name == "dgx-a100") {
    // NVIDIA DGX A100 datasheet: 8 A100 on NVSwitch, NVLink3 600 GB/s bidirectional per GPU
    // (300 GB/s per direction); 8 single-port ConnectX-6 HDR InfiniBand, 200 Gb/s each
    // (8 x 25 GB/s = 200 GB/s per node).
    return {name, 8, {300, 2}, {200, 5}, false, 0};
  }
  if (name == "v100-ib") {
    // The PyTorch DDP paper's cluster (Li et al., VLDB 2020, section 5): servers of 8 V100 on
    // NVLink2 (V100 datasheet: 300 GB/s bidirectional, 150 per direction) with one 100 Gb/s
    // ConnectX-4 NIC (EDR InfiniBand class, 12.5 GB/s per node).
    return {name, 8, {150, 2}, {12.5, 5}, false, 0};
  }
  if (name == "ethernet-10g") {
    // 8 GPUs on PCIe 3.0 x16 (15.75 GB/s theoretical, about 12 GB/s achieved) and one 10 Gb/s
    // Ethernet port per node (1.25 GB/s; TCP latency of tens of microseconds per hop).
    return {name, 8, {12, 5}, {1.25, 30}, false, 0};
  }
  RG_FAIL("unknown preset '", name, "' (expected dgx-a100, v100-ib or ethernet-10g)");
}

Cluster sim_link_cluster(const dist::SimLink& link) {
  return {fmt::format("sim-link {} GB/s {} us{}", link.gbps, link.latency_us,
                      link.name.empty() ? "" : " (" + link.name + ")"),
          1 << 30,
          {link.gbps, link.latency_us},
          {link.gbps, link.latency_us},
          true,
          0};
}

Algo parse_algo(const std::string& s) {
  if (s == "ring") return Algo::ring;
  if (s == "tree") return Algo::tree;
  if (s == "best") return Algo::best;
  RG_FAIL("--algo '", s, "' must be ring, tree or best");
}

const char* algo_name(Algo a) {
  return a == Algo::ring ? "ring" : a == Algo::tree ? "tree" : "best";
}

double ring_allreduce_us(double bytes, int n, const Level& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * transfer_us(bytes, l.gbps) + 2.0 * (n - 1) * l.latency_us;
}

double tree_allreduce_us(double bytes, int n, const Level& l) {
  if (n <= 1) return 0;
  return 2.0 * transfer_us(bytes, l.gbps) + 2.0 * std::ceil(std::log2(double(n))) * l.latency_us;
}

double allreduce_us(double bytes, int n, const Cluster& c, Algo algo) {
  if (n <= 1) return 0;
  if (c.sim_link)
    return c.launch_us + dist::SimLink(c.intra.gbps, c.intra.latency_us).allreduce_us(bytes, n);
  auto one_level = [&](double b, int k, const Level& l) {
    switch (algo) {
      case Algo::ring:
        return ring_allreduce_us(b, k, l);
      case Algo::tree:
        return tree_allreduce_us(b, k, l);
      default:
        return std::min(ring_allreduce_us(b, k, l), tree_allreduce_us(b, k, l));
    }
  };
  const int g = c.gpus_per_node;
  if (n <= g) return c.launch_us + one_level(bytes, n, c.intra);
  RG_CHECK(n % g == 0, n, " GPUs are not a whole number of nodes of ", g,
           " GPUs (--gpus, --gpus-per-node)");
  // Reduce-scatter and all-gather inside the node: (g-1) steps of B/g each.
  const double half_ring =
      double(g - 1) / g * transfer_us(bytes, c.intra.gbps) + double(g - 1) * c.intra.latency_us;
  const Level rail{c.inter.gbps / g, c.inter.latency_us};
  return c.launch_us + 2 * half_ring + one_level(bytes / g, n / g, rail);
}

std::vector<Bucket> rebucket(const StepProfile& p, double cap_mb, double first_mb) {
  const std::vector<Grad> items = p.per_parameter ? p.grads : interpolate_pieces(p.grads);
  dist::BucketAssignmentInput in;
  const bool one = cap_mb <= 0;
  in.cap_bytes = one ? SIZE_MAX : size_t(std::max(1.0, cap_mb * kMiB));
  in.first_cap_bytes = one ? SIZE_MAX : size_t(std::max(1.0, first_mb * kMiB));
  for (size_t i = 0; i < items.size(); ++i) {
    in.order.push_back(i);
    in.bytes.push_back(size_t(items[i].bytes));
    in.key.push_back(0);  // one dtype: the profile's gradients are all in one bucket class
  }
  std::vector<Bucket> out;
  for (const auto& idx : dist::assign_buckets(in)) {
    Bucket b;
    for (size_t i : idx) {
      b.bytes += items[i].bytes;
      b.ready_ms = std::max(b.ready_ms, items[i].ready_ms);
    }
    out.push_back(b);
  }
  return out;
}

Prediction simulate_overlap(double forward_ms, double backward_ms, double optimizer_ms,
                            const std::vector<Bucket>& buckets,
                            const std::vector<double>& comm_us) {
  RG_CHECK(buckets.size() == comm_us.size(), "simulate_overlap: ", buckets.size(), " buckets but ",
           comm_us.size(), " all-reduce times");
  Prediction r;
  r.buckets = buckets.size();
  r.compute_ms = forward_ms + backward_ms + optimizer_ms;
  double link_free = 0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const double start = std::max(buckets[k].ready_ms, link_free);
    link_free = start + comm_us[k] / 1000;
    r.comm_ms += comm_us[k] / 1000;
  }
  r.exposed_ms = std::max(0.0, link_free - backward_ms);
  r.step_ms = forward_ms + std::max(backward_ms, link_free) + optimizer_ms;
  return r;
}

int run_scale(const ScaleOptions& o) {
  std::vector<StepProfile> profiles;
  try {
    for (const std::string& t : o.traces) profiles.push_back(read_profile(t, o.step, o.rank));
  } catch (const Error& e) {
    std::cerr << "ringgrad-bench scale: error: " << e.what() << "\n";
    return 2;
  }
  if (!o.profile_out.empty()) {
    std::ofstream f(o.profile_out);
    RG_CHECK(f.good(), "--profile-out: cannot write ", o.profile_out);
    f << step_profile_json(profiles.front()) << "\n";
    fmt::print("# wrote {}\n", o.profile_out);
  }
  std::vector<Cluster> clusters;
  if (!o.sim_link.empty()) {
    clusters.push_back(sim_link_cluster(dist::parse_sim_link(o.sim_link)));
  } else {
    for (const std::string& n : o.presets) clusters.push_back(preset(n));
  }
  for (Cluster& c : clusters) {
    if (o.gpus_per_node > 0 && !c.sim_link) c.gpus_per_node = o.gpus_per_node;
    c.launch_us = o.launch_us;
  }
  const Algo algo = parse_algo(o.algo);
  std::vector<BucketSpec> specs;
  for (const std::string& s : o.bucket_mb) specs.push_back(parse_bucket(s));
  RG_CHECK(!specs.empty(), "--bucket-mb lists no bucket size");

  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    RG_CHECK(csv.good(), "--csv: cannot write ", o.csv);
    csv << "model,cluster,algo,gpus,bucket_mb,buckets,step_ms,compute_ms,comm_ms,exposed_ms,"
           "efficiency,best\n";
  }
  std::vector<Series> series;
  for (size_t pi = 0; pi < profiles.size(); ++pi) {
    const StepProfile& p = profiles[pi];
    const std::string model = p.model.empty() ? o.traces[pi] : p.model;
    const double s = o.compute_scale;
    fmt::print(
        "# {}: forward {:.2f} ms, backward {:.2f} ms, optimizer {:.2f} ms (x{} compute scale), "
        "{:.1f} MiB of gradients in {} {}s, measured with {} rank(s)\n",
        model, p.forward_ms * s, p.backward_ms * s, p.optimizer_ms * s, s,
        double(p.total_bytes()) / kMiB, p.grads.size(), p.per_parameter ? "parameter" : "bucket",
        p.measured_ranks);
    std::vector<std::vector<Bucket>> bucketings;
    for (const BucketSpec& b : specs) {
      auto bs = rebucket(p, b.cap_mb, b.first_mb);
      for (Bucket& x : bs) x.ready_ms *= s;
      bucketings.push_back(std::move(bs));
    }
    for (const Cluster& c : clusters) {
      fmt::print("\n## {} on {} ({}), all-reduce {}\n", model, c.name,
                 c.sim_link ? "flat link, latency once per all-reduce"
                            : fmt::format("{} GPUs/node, {} GB/s + {} us inside, {} GB/s per "
                                          "node + {} us between",
                                          c.gpus_per_node, c.intra.gbps, c.intra.latency_us,
                                          c.inter.gbps, c.inter.latency_us),
                 c.sim_link ? "ring" : algo_name(algo));
      std::string head = fmt::format("{:>6}", "GPUs");
      for (const BucketSpec& b : specs) head += fmt::format(" {:>9}", b.label);
      fmt::print(
          "# predicted step ms per bucket cap (MiB); then the best cap's figures\n{} {:>8} "
          "{:>9} {:>9} "
          "{:>9} {:>7}\n",
          head, "best", "step ms", "comm ms", "exposed", "eff.");
      Series ser{fmt::format("{} / {}", model, c.name), {}, {}};
      // Efficiency relative to one GPU, where there is nothing to communicate.
      const double base = (p.forward_ms + p.backward_ms + p.optimizer_ms) * s;
      for (int n : o.gpus) {
        std::vector<Prediction> preds;
        for (const auto& bs : bucketings) {
          std::vector<double> us;
          for (const Bucket& b : bs) us.push_back(allreduce_us(double(b.bytes), n, c, algo));
          preds.push_back(
              simulate_overlap(p.forward_ms * s, p.backward_ms * s, p.optimizer_ms * s, bs, us));
        }
        size_t best = 0;
        for (size_t k = 1; k < preds.size(); ++k)
          if (preds[k].step_ms < preds[best].step_ms - 1e-9) best = k;
        std::string line = fmt::format("{:>6}", n);
        for (const Prediction& r : preds) line += fmt::format(" {:>9.2f}", r.step_ms);
        const Prediction& b = preds[best];
        fmt::print("{} {:>8} {:>9.2f} {:>9.2f} {:>9.2f} {:>6.1f}%\n", line, specs[best].label,
                   b.step_ms, b.comm_ms, b.exposed_ms, 100 * base / b.step_ms);
        ser.x.push_back(n);
        ser.y.push_back(100 * base / b.step_ms);
        if (csv.is_open())
          for (size_t k = 0; k < preds.size(); ++k)
            csv << fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.5f},{}\n", model,
                               c.name, c.sim_link ? "ring" : algo_name(algo), n, specs[k].label,
                               preds[k].buckets, preds[k].step_ms, preds[k].compute_ms,
                               preds[k].comm_ms, preds[k].exposed_ms, base / preds[k].step_ms,
                               k == best ? 1 : 0);
      }
      series.push_back(std::move(ser));
    }
  }
  if (csv.is_open()) fmt::print("# wrote {}\n", o.csv);
  if (!o.plot.empty()) {
    plot_png(o.plot,
             {fmt::format("predicted DDP scaling efficiency (best bucket cap, compute x{})",
                          o.compute_scale),
              "GPUs", "efficiency (% of 1-GPU throughput per GPU)", true, false, false},
             series);
    fmt::print("# wrote {}\n", o.plot);
  }
  return 0;
}

}  // namespace rg::apps::scale
