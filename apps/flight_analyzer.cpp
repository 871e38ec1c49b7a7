// ringgrad-bench flight: what every rank's flight recorder dump says, compared across ranks.
#include "apps/flight_analyzer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "apps/json_number.h"
#include "kernels/error.h"

namespace rg::apps {
namespace {

using nlohmann::json;

// "21:01:48.123 UTC": UTC, so that reports of ranks on hosts in other time zones agree.
std::string clock_time(double unix_s) {
  const auto total_ms = static_cast<int64_t>(std::llround(unix_s * 1000));
  const auto whole = static_cast<std::time_t>(total_ms / 1000);
  const auto ms = static_cast<int>(total_ms % 1000);
  std::tm tm{};
  ::gmtime_r(&whole, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03} UTC", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// How a call ended, or where it stopped: "completed at +3.2 s".
std::string outcome(const FlightEntry& e, double t0) {
  if (e.state == "completed" || e.state == "failed")
    return fmt::format("{} at +{:.1f} s", e.state, e.ended_at.value_or(e.enqueued_at) - t0);
  if (e.state == "started")
    return fmt::format("started at +{:.1f} s, not ended",
                       e.started_at.value_or(e.enqueued_at) - t0);
  return fmt::format("enqueued at +{:.1f} s, not started", e.enqueued_at - t0);
}

bool unfinished(const FlightEntry& e) { return e.state == "enqueued" || e.state == "started"; }

FlightEntry parse_entry(const json& x) {
  FlightEntry e;
  e.id = json_int<uint64_t>(x.at("id"), "id");
  e.call.group = x.at("group").get<std::string>();
  e.call.seq = json_int<uint64_t>(x.at("seq"), "seq");
  e.call.op = x.at("op").get<std::string>();
  e.call.reduce_op = x.at("reduce_op").get<std::string>();
  e.call.root = json_int<int>(x.at("root"), "root");
  e.call.tag = json_int<uint32_t>(x.at("tag"), "tag");
  e.call.dtype = x.at("dtype").get<std::string>();
  for (const json& shape : x.at("shapes")) {
    RG_CHECK(shape.is_array(), "a shape ", shape.dump(), " is not an array");
    Shape dims;
    for (const json& d : shape) dims.push_back(json_int<int64_t>(d, "a size", 0));
    e.call.shapes.push_back(std::move(dims));
  }
  e.call.device = x.at("device").get<std::string>();
  e.state = x.at("state").get<std::string>();
  RG_CHECK(e.state == "enqueued" || e.state == "started" || e.state == "completed" ||
               e.state == "failed",
           "entry ", e.id, " has the unknown state '", e.state, "'");
  e.enqueued_at = x.at("enqueued_at").get<double>();
  if (!x.at("started_at").is_null()) e.started_at = x.at("started_at").get<double>();
  if (!x.at("ended_at").is_null()) e.ended_at = x.at("ended_at").get<double>();
  e.error = x.value("error", "");
  return e;
}

// One process group's calls on one rank, by sequence number.
using Calls = std::map<uint64_t, const FlightEntry*>;

// The findings for one process group, one line each.
std::vector<std::string> analyze_group(const std::string& group,
                                       const std::map<int, const FlightDump*>& by_rank, double t0) {
  std::map<int, Calls> calls;  // ranks with at least one call of the group
  std::vector<int> silent;     // ranks with a dump but no call of the group
  std::vector<std::string> p2p_waiting;
  for (const auto& [rank, dump] : by_rank) {
    Calls c;
    for (const FlightEntry& e : dump->entries) {
      if (e.call.group != group) continue;
      // Sends and receives are numbered per peer and tag, not in the group's sequence: they are
      // not compared across ranks, only reported when unfinished.
      if (e.call.op == "send" || e.call.op == "recv") {
        if (e.state != "completed" && e.state != "failed")
          p2p_waiting.push_back(
              fmt::format("rank {} waits in {} (point-to-point)", rank, e.call.describe()));
        continue;
      }
      c[e.call.seq] = &e;  // oldest first: a later id wins
    }
    if (c.empty()) {
      silent.push_back(rank);
    } else {
      calls[rank] = std::move(c);
    }
  }
  std::vector<std::string> lines = p2p_waiting;
  uint64_t first = 0, last = 0, min_first = UINT64_MAX;
  for (const auto& [rank, c] : calls) {
    first = std::max(first, c.begin()->first);
    min_first = std::min(min_first, c.begin()->first);
    last = std::max(last, c.rbegin()->first);
  }
  // The rings keep only the last calls: before the latest first call of any rank, some rank's
  // calls are unknown, so nothing before it can be compared.
  if (first > min_first) {
    std::string windows;
    for (const auto& [rank, c] : calls)
      windows += fmt::format("{}rank {} holds #{}..#{}", windows.empty() ? "" : ", ", rank,
                             c.begin()->first, c.rbegin()->first);
    lines.push_back(
        fmt::format("the rings dropped older calls: the analysis covers #{}..#{} only ({})", first,
                    last, windows));
  }
  size_t problems = 0;
  // The first sequence number where the ranks that made the call made different calls.
  for (uint64_t seq = first; seq <= last; ++seq) {
    std::vector<std::pair<std::string, std::vector<int>>> variants;  // by first rank
    std::map<std::string, const FlightEntry*> example;
    for (const auto& [rank, c] : calls) {
      const auto it = c.find(seq);
      if (it == c.end()) continue;
      const std::string fp = it->second->call.fingerprint();
      auto v = std::find_if(variants.begin(), variants.end(),
                            [&](const auto& p) { return p.first == fp; });
      if (v == variants.end()) {
        variants.push_back({fp, {rank}});
        example[fp] = it->second;
      } else {
        v->second.push_back(rank);
      }
    }
    if (variants.size() < 2) continue;
    std::string who;
    for (const auto& [fp, ranks] : variants)
      who += fmt::format("{}{} called {}", who.empty() ? "" : ", ", rank_list(ranks),
                         example[fp]->call.describe());
    lines.push_back(fmt::format("ranks disagree at #{}: {}", seq, who));
    ++problems;
    break;
  }
  // Ranks behind the others: their last call is before the last call any rank made.
  for (const auto& [rank, c] : calls) {
    const FlightEntry& e = *c.rbegin()->second;
    if (e.call.seq >= last) continue;
    lines.push_back(fmt::format(
        "rank {} never reached #{} (its last call was {}, {}){}", rank, e.call.seq + 1,
        e.call.describe(), outcome(e, t0),
        e.call.seq + 1 < last ? fmt::format("; other ranks went on to #{}", last) : ""));
    ++problems;
  }
  for (int rank : silent) {
    lines.push_back(
        fmt::format("rank {} recorded no call of this group; others reached #{}", rank, last));
    ++problems;
  }
  // Stuck: the oldest call that has not ended (the later ones queue behind it).
  for (const auto& [rank, c] : calls) {
    const FlightEntry* stuck = nullptr;
    size_t behind = 0;
    for (const auto& [seq, e] : c) {
      if (!unfinished(*e)) continue;
      if (stuck == nullptr) {
        stuck = e;
      } else {
        ++behind;
      }
    }
    if (stuck == nullptr) continue;
    const FlightDump& dump = *by_rank.at(rank);
    std::string when = "enqueued at " + clock_time(stuck->enqueued_at);
    if (stuck->started_at) when += ", started at " + clock_time(*stuck->started_at);
    lines.push_back(fmt::format(
        "rank {} is stuck in {} since {:.1f} s before its dump ({}){}", rank,
        stuck->call.describe(), dump.dumped_at - stuck->enqueued_at, when,
        behind == 0
            ? ""
            : fmt::format("; {} later call{} wait behind it", behind, behind == 1 ? "" : "s")));
    ++problems;
  }
  // Failed: the first failure per rank (after it, the group's later calls usually fail too).
  for (const auto& [rank, c] : calls) {
    const FlightEntry* failed = nullptr;
    size_t more = 0;
    for (const auto& [seq, e] : c) {
      if (e->state != "failed") continue;
      if (failed == nullptr) {
        failed = e;
      } else {
        ++more;
      }
    }
    if (failed == nullptr) continue;
    lines.push_back(fmt::format(
        "rank {}'s {} {}: {}{}", rank, failed->call.describe(), outcome(*failed, t0), failed->error,
        more == 0 ? "" : fmt::format(" ({} later call{} failed too)", more, more == 1 ? "" : "s")));
    ++problems;
  }
  if (problems == 0) {
    const bool everyone = static_cast<int>(calls.size()) == by_rank.begin()->second->world_size;
    lines.push_back(
        everyone ? fmt::format("no divergence: all {} ranks completed every call up to #{}",
                               calls.size(), last)
                 : fmt::format("no divergence among the {} ranks with a dump: they completed "
                               "every call up to #{}",
                               calls.size(), last));
  }
  return lines;
}

}  // namespace

FlightDump parse_flight_dump(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  RG_CHECK(!j.is_discarded(), file, " is not JSON, so not a flight recorder dump");
  RG_CHECK(j.is_object() && j.contains("version") && j.contains("entries"), file,
           " is not a flight recorder dump (no \"version\" and \"entries\")");
  RG_CHECK(j["version"] == 1, file, " is a flight recorder dump of version ", j["version"].dump(),
           "; this ringgrad-bench reads version 1");
  FlightDump d;
  d.file = file;
  try {
    d.rank = json_int<int>(j.at("rank"), "rank");
    d.world_size = json_int<int>(j.at("world_size"), "world_size");
    d.pid = json_int<int64_t>(j.at("pid"), "pid");
    d.host = j.at("host").get<std::string>();
    d.reason = j.at("reason").get<std::string>();
    d.dumped_at = j.at("dumped_at").get<double>();
    d.capacity = json_int<uint64_t>(j.at("capacity"), "capacity");
    d.recorded = json_int<uint64_t>(j.at("recorded"), "recorded");
    for (const json& x : j.at("entries")) d.entries.push_back(parse_entry(x));
  } catch (const json::exception& e) {
    RG_FAIL(file, " is not a valid flight recorder dump: ", e.what());
  } catch (const Error& e) {
    RG_FAIL(file, " is not a valid flight recorder dump: ", e.what());
  }
  RG_CHECK(d.world_size >= 1 && d.rank >= 0 && d.rank < d.world_size, file, ": rank ", d.rank,
           " is not in a world of ", d.world_size);
  return d;
}

FlightDump read_flight_dump(const std::string& path) {
  std::ifstream in(path);
  RG_CHECK(in.good(), "cannot read ", path, ": ", std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  return parse_flight_dump(s.str(), path);
}

std::string analyze_flight_dumps(const std::vector<FlightDump>& dumps) {
  RG_CHECK(!dumps.empty(), "no flight recorder dumps to analyze");
  std::map<int, const FlightDump*> by_rank;
  int world = 0;
  for (const FlightDump& d : dumps) {
    const auto [it, fresh] = by_rank.emplace(d.rank, &d);
    RG_CHECK(fresh, d.file, " and ", it->second->file, " are both dumps of rank ", d.rank,
             " (the dumps of two jobs?)");
    world = std::max(world, d.world_size);
  }
  double t0 = INFINITY;
  std::set<std::string> groups;
  for (const FlightDump& d : dumps) {
    t0 = std::min(t0, d.dumped_at);
    for (const FlightEntry& e : d.entries) {
      t0 = std::min(t0, e.enqueued_at);
      groups.insert(e.call.group);
    }
  }
  std::vector<std::string> lines;
  std::string reasons;
  for (const auto& [rank, d] : by_rank)
    reasons += fmt::format("{}rank {}: {}", reasons.empty() ? "" : ", ", rank, d->reason);
  lines.push_back(fmt::format(
      "{} dump{} of a job of {} ranks ({}); times +N s count from {}, the first recorded call",
      dumps.size(), dumps.size() == 1 ? "" : "s", world, reasons, clock_time(t0)));
  for (const auto& [rank, d] : by_rank) {
    if (d->world_size != world) {
      lines.push_back(
          fmt::format("rank {}'s dump ({}) is of a job of {} ranks, not {}: the "
                      "dumps are of different jobs",
                      rank, d->file, d->world_size, world));
    }
  }
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (by_rank.contains(r)) continue;
    missing.push_back(r);
    lines.push_back(fmt::format(
        "no dump from rank {}: it may have died before dumping (or it is stopped: SIGSTOP)", r));
  }
  if (groups.empty()) lines.push_back("no collective call recorded");
  bool anyone_stuck = false, anyone_failed = false;
  for (const std::string& g : groups) {
    lines.push_back(fmt::format("process group \"{}\":", g));
    for (const std::string& l : analyze_group(g, by_rank, t0)) {
      anyone_stuck = anyone_stuck || l.find(" is stuck in ") != std::string::npos;
      anyone_failed = anyone_failed || l.find(" failed at ") != std::string::npos;
      lines.push_back("  " + l);
    }
  }
  // Ranks that wait in a collective, or whose collective failed (a timeout), while another rank
  // left nothing: that rank is where to look first.
  if ((anyone_stuck || anyone_failed) && !missing.empty()) {
    lines.push_back(
        fmt::format("the ranks with a dump {} a collective: {} without a dump {} "
                    "the likely cause",
                    anyone_stuck ? "wait in" : "failed in", rank_list(missing),
                    missing.size() == 1 ? "is" : "are"));
  }
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

int run_flight(const std::vector<std::string>& paths) {
  try {
    std::vector<std::string> files;
    for (const std::string& p : paths) {
      if (!std::filesystem::is_directory(p)) {
        files.push_back(p);
        continue;
      }
      std::vector<std::string> in_dir;
      for (const auto& f : std::filesystem::directory_iterator(p)) {
        const std::string name = f.path().filename().string();
        if (name.starts_with("rank") && name.ends_with(".json")) in_dir.push_back(f.path());
      }
      RG_CHECK(!in_dir.empty(), p, " holds no flight recorder dump (rank*.json)");
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    }
    std::vector<FlightDump> dumps;
    for (const std::string& f : files) dumps.push_back(read_flight_dump(f));
    std::cout << analyze_flight_dumps(dumps);
    return 0;
  } catch (const Error& e) {
    std::cerr << "ringgrad-bench flight: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace rg::apps
