// ringgrad-bench profile: the spans of a --trace file's stream lanes grouped by op over a range of
// the trainer's steps, as torch.profiler's key_averages() table, plus the host phases per step.
#include "apps/profile_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <tuple>

#include "kernels/error.h"

namespace rg::apps {

namespace {

bool parse_int(const std::string& s, int& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::vector<ProfileRow> sorted_rows(
    const std::map<std::pair<std::string, std::string>, ProfileRow>& rows) {
  std::vector<ProfileRow> out;
  for (const auto& [key, row] : rows) out.push_back(row);
  std::stable_sort(out.begin(), out.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.total_us > b.total_us;
  });
  return out;
}

// The end of the last step: the latest end of an event of `pid` from t0 on (host or stream).
double trace_end(const Trace& trace, int pid, double t0) {
  double end = t0;
  for (const TraceEvent& e : trace.events)
    if (e.pid == pid && e.ts >= t0) end = std::max(end, e.ts + e.dur);
  return end;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::pair<int, int> parse_step_range(const std::string& spec, int traced) {
  int first = 0, end = traced;
  const size_t colon = spec.find(':');
  bool ok = true;
  if (spec.empty()) {
    // every step
  } else if (colon == std::string::npos) {
    ok = parse_int(spec, first);
    end = first + 1;
  } else {
    const std::string a = spec.substr(0, colon), b = spec.substr(colon + 1);
    ok = (a.empty() || parse_int(a, first)) && (b.empty() || parse_int(b, end));
  }
  RG_CHECK(ok, "--steps '", spec, "' is not a step range: expected A:B (0-based, B excluded), A:, ",
           ":B or A");
  RG_CHECK(first >= 0 && first < end && end <= traced, "--steps ", spec,
           " is out of range: the trace has ", traced, " traced steps (0 to ", traced - 1, ")");
  return {first, end};
}

std::string op_of(const TraceEvent& e) {
  const size_t scope_end = e.name.rfind(": ");
  std::string op = scope_end == std::string::npos ? e.name : e.name.substr(scope_end + 2);
  if (e.cat == "nccl") op = op.substr(0, op.find(' '));
  return op;
}

Profile compute_profile(const Trace& trace, int rank, const std::string& steps) {
  const std::string& file = trace.file;
  RG_CHECK(rank >= 0 && rank < trace.processes, file, " has ", trace.processes, " ranks; --rank ",
           rank, " is not one of them");
  const std::vector<double> starts = trace.step_starts(rank);
  RG_CHECK(!starts.empty(), file, " has no traced steps on rank ", rank,
           " (no \"forward\" span of category \"step\"; write it with ringgrad-train --trace)");
  const bool any_gpu =
      std::any_of(trace.events.begin(), trace.events.end(),
                  [&](const TraceEvent& e) { return e.pid == rank && trace.on_stream(e); });
  RG_CHECK(any_gpu, file, " has no GPU spans on rank ", rank,
           " (no span on a cuda:* stream lane): profile needs a trace of ringgrad-train "
           "--device cuda");
  Profile p;
  p.file = file;
  p.rank = rank;
  p.traced_steps = int(starts.size());
  try {
    std::tie(p.first_step, p.end_step) = parse_step_range(steps, p.traced_steps);
  } catch (const Error& e) {
    RG_FAIL(file, ": ", e.what());
  }
  const double t0 = starts[size_t(p.first_step)];
  const double t1 = size_t(p.end_step) < starts.size() ? starts[size_t(p.end_step)]
                                                       : std::numeric_limits<double>::infinity();
  p.host_us = (std::isinf(t1) ? trace_end(trace, rank, t0) : t1) - t0;
  std::map<std::pair<std::string, std::string>, ProfileRow> ops, host, stalls, descriptors,
      conversions;
  for (const TraceEvent& e : trace.events) {
    if (e.pid != rank) continue;
    // A GPU span belongs to the step that queued its work: with the host running ahead of the
    // GPU it runs during a later step's host time ("queued_us": how long it waited).
    const auto queued = e.args.find("queued_us");
    const double at = queued != e.args.end() && trace.on_stream(e) ? e.ts - queued->second : e.ts;
    if (at < t0 || at >= t1) continue;
    if (e.ph == 'i' && e.cat == "layout conversion") {
      ProfileRow& row = conversions[{e.name, e.cat}];
      row.name = e.name;
      row.category = e.cat;
      ++row.calls;
      ++p.conversion_calls;
      continue;
    }
    if (e.ph == 'i' && (e.cat == "host stall" || e.cat == "cudnn descriptor")) {
      const bool stall = e.cat == "host stall";
      ProfileRow& row = (stall ? stalls : descriptors)[{e.name, e.cat}];
      row.name = e.name;
      row.category = e.cat;
      ++row.calls;
      const bool pack = e.name.find("variant pack") != std::string::npos;
      ++(stall ? p.stall_calls : pack ? p.variant_pack_calls : p.descriptor_calls);
      continue;
    }
    if (e.ph != 'X') continue;
    const bool gpu = trace.on_stream(e);
    if (!gpu && e.cat != "step" && e.cat != "data") continue;
    const std::string name = gpu ? op_of(e) : e.name;
    ProfileRow& row = (gpu ? ops : host)[{name, e.cat}];
    row.name = name;
    row.category = e.cat;
    ++row.calls;
    row.total_us += e.dur;
    if (gpu) p.gpu_us += e.dur;
  }
  RG_CHECK(!ops.empty(), file, ": steps ", p.first_step, ":", p.end_step, " of rank ", rank,
           " hold no GPU spans");
  p.ops = sorted_rows(ops);
  p.host = sorted_rows(host);
  p.stalls = sorted_rows(stalls);
  p.descriptors = sorted_rows(descriptors);
  p.conversions = sorted_rows(conversions);
  for (std::vector<ProfileRow>* rows : {&p.stalls, &p.descriptors, &p.conversions}) {
    std::stable_sort(rows->begin(), rows->end(),
                     [](const ProfileRow& a, const ProfileRow& b) { return a.calls > b.calls; });
  }
  return p;
}

std::string profile_table(const Profile& p) {
  const double steps = double(p.steps());
  size_t w = 24;
  for (const auto& r : p.ops) w = std::max(w, r.name.size());
  for (const auto& r : p.host) w = std::max(w, r.name.size());
  for (const auto& r : p.stalls) w = std::max(w, r.name.size());
  for (const auto& r : p.descriptors) w = std::max(w, r.name.size());
  for (const auto& r : p.conversions) w = std::max(w, r.name.size());
  std::string out = fmt::format(
      "{}: rank {}, steps {}:{} of {} traced\n"
      "GPU time per step {:.3f} ms (the stream spans' sum), host time per step {:.3f} ms (one "
      "forward to the next)\n\n",
      p.file, p.rank, p.first_step, p.end_step, p.traced_steps, p.gpu_us / 1000 / steps,
      p.host_us / 1000 / steps);
  out += fmt::format("{:<{}}  {:<16} {:>8} {:>10} {:>11} {:>10} {:>10} {:>7}\n", "GPU op", w,
                     "category", "calls", "calls/step", "total ms", "ms/step", "mean us", "share");
  for (const auto& r : p.ops)
    out += fmt::format("{:<{}}  {:<16} {:>8} {:>10.1f} {:>11.3f} {:>10.3f} {:>10.1f} {:>6.1f}%\n",
                       r.name, w, r.category, r.calls, double(r.calls) / steps, r.total_us / 1000,
                       r.total_us / 1000 / steps, r.mean_us(),
                       p.gpu_us > 0 ? 100 * r.total_us / p.gpu_us : 0.0);
  out += fmt::format("\n{:<{}}  {:<16} {:>8} {:>10} {:>11} {:>10} {:>10} {:>7}\n",
                     "host phase (trainer)", w, "category", "calls", "calls/step", "total ms",
                     "ms/step", "mean us", "of step");
  for (const auto& r : p.host)
    out += fmt::format("{:<{}}  {:<16} {:>8} {:>10.1f} {:>11.3f} {:>10.3f} {:>10.1f} {:>6.1f}%\n",
                       r.name, w, r.category, r.calls, double(r.calls) / steps, r.total_us / 1000,
                       r.total_us / 1000 / steps, r.mean_us(),
                       p.host_us > 0 ? 100 * r.total_us / p.host_us : 0.0);
  out += fmt::format(
      "\nhost-blocking calls per step: {:.1f} (counted by the emulated runtime only: a trace from "
      "a real GPU has none)\n",
      double(p.stall_calls) / steps);
  for (const auto& r : p.stalls)
    out += fmt::format("{:<{}}  {:<16} {:>8} {:>10.1f}\n", r.name, w, r.category, r.calls,
                       double(r.calls) / steps);
  out += fmt::format(
      "\ncuDNN descriptors created per step: {:.1f}, and variant packs {:.1f} (counted by the "
      "emulated cuDNN only)\n",
      double(p.descriptor_calls) / steps, double(p.variant_pack_calls) / steps);
  for (const auto& r : p.descriptors)
    out += fmt::format("{:<{}}  {:<16} {:>8} {:>10.1f}\n", r.name, w, r.category, r.calls,
                       double(r.calls) / steps);
  out += fmt::format("\nlayout conversions on the GPU per step: {:.1f}\n",
                     double(p.conversion_calls) / steps);
  for (const auto& r : p.conversions)
    out += fmt::format("{:<{}}  {:<16} {:>8} {:>10.1f}\n", r.name, w, r.category, r.calls,
                       double(r.calls) / steps);
  return out;
}

std::string profile_csv(const Profile& p) {
  std::string out = "op,category,calls,total_us,us_per_step,mean_us,share\n";
  for (const auto& r : p.ops)
    out += fmt::format("{},{},{},{:.3f},{:.3f},{:.3f},{:.6f}\n", csv_field(r.name),
                       csv_field(r.category), r.calls, r.total_us, r.total_us / double(p.steps()),
                       r.mean_us(), p.gpu_us > 0 ? r.total_us / p.gpu_us : 0.0);
  return out;
}

int run_profile(const ProfileOptions& o) {
  Profile p;
  try {
    p = compute_profile(read_trace(o.trace), o.rank, o.steps);
  } catch (const Error& e) {
    std::cerr << "ringgrad-bench profile: error: " << e.what() << "\n";
    return 2;
  }
  fmt::print("{}", profile_table(p));
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    RG_CHECK(f.good(), "--csv: cannot write ", o.csv);
    f << profile_csv(p);
    fmt::print("# wrote {}\n", o.csv);
  }
  return 0;
}

}  // namespace rg::apps
