// DDP's state in snapshots: the gather of every rank's PowerSGD errors to the writer, and each
// rank's own part back out of the file on resume.
#include "comm/reducer_snapshot.h"

#include <cstring>
#include <regex>

#include "engine/autograd/grad_mode.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

constexpr const char* kSynced = "ddp.synced_iterations";
constexpr const char* kWorld = "powersgd.world_size";
constexpr const char* kOptions = "powersgd.options";

// What must match for a PowerSGD state to continue (world size aside, which has its own branch).
std::string options_text(const PowerSgdOptions& o) {
  return detail::cat("rank=", o.rank, " start_iter=", o.start_iter,
                     " min_compression_rate=", o.min_compression_rate,
                     " error_feedback=", int(o.error_feedback), " warm_start=", int(o.warm_start),
                     " seed=", o.seed);
}

std::string bucket_name(size_t k, const char* what) {
  return detail::cat("powersgd.bucket", k, ".", what);
}
std::string rank_bucket_name(int r, size_t k, const char* what) {
  return detail::cat("powersgd.rank", r, ".bucket", k, ".", what);
}

// A count in the metadata, as written by snapshot_reducer.
int64_t count_entry(const std::map<std::string, std::string>& metadata, const char* key) {
  const auto it = metadata.find(key);
  RG_CHECK(it != metadata.end(), "the snapshot has no '", key, "' entry");
  const std::string& v = it->second;
  RG_CHECK(!v.empty() && v.size() < 16 && v.find_first_not_of("0123456789") == std::string::npos,
           "the snapshot's '", key, "' entry '", v, "' is not a count");
  return std::stoll(v);
}

// Every rank's copy of `t` (on the group's device), back to back on the host.
Tensor gather_to_host(ProcessGroup& pg, const Tensor& t) {
  const Tensor mine = on_group_device(pg, t);
  const Tensor all =
      Tensor::empty({int64_t(pg.size()) * mine.numel()}, mine.dtype(), pg.tensor_device());
  pg.all_gather(all, mine)->wait();
  return all.to(Device::cpu());
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

ReducerSnapshot snapshot_reducer(const Reducer& reducer, ProcessGroup& pg) {
  NoGradGuard no_grad;
  ReducerSnapshot out;
  out.metadata[kSynced] = std::to_string(reducer.synced_iterations());
  if (reducer.options().comm_hook != CommHook::powersgd) return out;
  out.metadata[kWorld] = std::to_string(pg.size());
  out.metadata[kOptions] = options_text(reducer.options().powersgd);
  // The same buckets on every rank (they start PowerSGD at the same iteration), in key order, so
  // the all_gathers match up.
  for (const auto& [k, b] : reducer.powersgd_state()) {
    const Tensor errors = gather_to_host(pg, b.error);
    const Tensor qs = gather_to_host(pg, b.q);
    if (pg.rank() != 0) continue;
    const int64_t n = b.error.numel(), qn = b.q.numel();
    const Tensor q0 = qs.flat_narrow(0, qn).clone();
    out.tensors.emplace_back(bucket_name(k, "q"), q0);
    for (int r = 0; r < pg.size(); ++r) {
      out.tensors.emplace_back(rank_bucket_name(r, k, "error"),
                               errors.flat_narrow(r * n, n).clone());
      // The Q's come out of an all-reduce, so they agree unless a backend's results differ by
      // rank; then each rank gets its own back.
      const Tensor q = qs.flat_narrow(r * qn, qn).clone();
      if (!same_bytes(q, q0)) out.tensors.emplace_back(rank_bucket_name(r, k, "q"), q);
    }
  }
  return out;
}

PowerSgd::State powersgd_state_for_rank(const NamedTensors& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        const PowerSgdOptions& options, int rank, int world,
                                        std::ostream& log) {
  const auto opt = metadata.find(kOptions);
  RG_CHECK(metadata.count(kWorld) && opt != metadata.end(),
           "the snapshot holds no PowerSGD state (written without --comm-hook powersgd, or by an "
           "older build), so a PowerSGD run cannot continue from it");
  RG_CHECK(opt->second == options_text(options), "the snapshot's PowerSGD options are '",
           opt->second, "', this run's are '", options_text(options), "'");
  const int64_t saved_world = count_entry(metadata, kWorld);
  const bool same_world = saved_world == world;
  // powersgd.bucket<k>.q or powersgd.rank<r>.bucket<k>.{q,error}
  static const std::regex name_re(R"(powersgd\.(?:rank(\d{1,9})\.)?bucket(\d{1,9})\.(q|error))");
  PowerSgd::State state;
  std::map<size_t, Tensor> own_q;
  for (const auto& [name, t] : tensors) {
    std::smatch m;
    if (name.rfind("powersgd.", 0) != 0) continue;
    RG_CHECK(std::regex_match(name, m, name_re), "unexpected PowerSGD entry '", name,
             "' in the snapshot");
    const size_t k = std::stoull(m[2].str());
    const bool is_q = m[3] == "q";
    if (!m[1].matched) {
      RG_CHECK(is_q, "unexpected PowerSGD entry '", name, "' in the snapshot");
      state[k].q = t;
      continue;
    }
    const int64_t r = std::stoll(m[1].str());
    RG_CHECK(r < saved_world, "the snapshot's PowerSGD entry '", name, "' names rank ", r, " of a ",
             saved_world, "-rank run");
    if (!same_world || r != rank) continue;
    if (is_q)
      own_q[k] = t;
    else
      state[k].error = t;
  }
  for (const auto& [k, q] : own_q) state[k].q = q;  // this rank's, where it differed from rank 0's
  for (const auto& [k, b] : state) {
    RG_CHECK(b.q.defined(), "the snapshot has no PowerSGD Q factors for bucket ", k, " (",
             bucket_name(k, "q"), ")");
    RG_CHECK(!same_world || b.error.defined(), "the snapshot has no PowerSGD error of rank ", rank,
             " for bucket ", k, " (", rank_bucket_name(rank, k, "error"), ")");
  }
  if (!same_world && !state.empty())
    log << "ringgrad-train: PowerSGD: the snapshot was taken with " << saved_world
        << " ranks, this run has " << world
        << ": its Q factors are kept (warm start), the error feedback starts at zero\n";
  return state;
}

void restore_reducer(Reducer& reducer, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata, int rank, int world,
                     std::ostream& log) {
  if (reducer.options().comm_hook == CommHook::powersgd)
    reducer.restore_powersgd_state(
        powersgd_state_for_rank(tensors, metadata, reducer.options().powersgd, rank, world, log));
  if (metadata.count(kSynced)) reducer.restore_synced_iterations(count_entry(metadata, kSynced));
}

}  // namespace rg::dist
