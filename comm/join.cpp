// Join's rounds: one MAX all-reduce of [active flag per rank..., sync, synced, not sync] per
// iteration.
#include "comm/join.h"

#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::dist {

Join::Join(std::vector<Joinable*> joinables, std::shared_ptr<ProcessGroup> pg, JoinOptions options)
    : joinables_(std::move(joinables)), pg_(std::move(pg)), options_(options) {
  RG_CHECK(pg_ != nullptr, "Join needs a process group");
  RG_CHECK(!joinables_.empty(), "Join needs at least one joinable");
  for (Joinable* j : joinables_) {
    RG_CHECK(j != nullptr, "Join: a joinable is null");
    j->set_join(this);
  }
}

Join::~Join() {
  for (Joinable* j : joinables_) j->set_join(nullptr);
}

JoinRound Join::round(bool active, bool sync, int64_t synced) {
  NoGradGuard no_grad;
  const int n = pg_->size();
  // MAX rather than SUM: each rank owns its slot, and sync/synced are the same on every active
  // rank, so the maximum carries them to the joined ranks (which send 0).
  Tensor t = zeros({n + 3}, DType::i64);
  if (active) {
    t.data<int64_t>()[pg_->rank()] = 1;
    t.data<int64_t>()[n] = sync ? 1 : 0;
    t.data<int64_t>()[n + 1] = synced;
    t.data<int64_t>()[n + 2] = sync ? 0 : 1;
  }
  Tensor on_group = on_group_device(*pg_, t);
  pg_->all_reduce(on_group, ReduceOp::max)->wait();
  t = on_group.to(Device::cpu());
  JoinRound r;
  for (int i = 0; i < n; ++i)
    if (t.data<int64_t>()[i] != 0) r.active.push_back(i);
  r.sync = t.data<int64_t>()[n] != 0;
  r.synced = t.data<int64_t>()[n + 1];
  // A joined rank could not shadow both kinds of iteration at once; every rank sees the same
  // flags, so all of them stop here alike instead of running mismatched collectives.
  RG_CHECK(!(r.sync && t.data<int64_t>()[n + 2] != 0), "Join: in synchronized iteration ",
           r.synced + 1,
           " some active ranks run a synchronized backward and others one inside no_sync(); "
           "the ranks must agree on their gradient-accumulation boundaries (count them from a "
           "step number that every rank shares, not from each rank's own data)");
  return r;
}

JoinRound Join::notify(bool sync, int64_t synced) {
  RG_CHECK(!finished_, "Join: an iteration after this rank's finish() (its data had run out)");
  return round(true, sync, synced);
}

int64_t Join::finish() {
  RG_CHECK(!finished_, "Join: finish() called twice");
  finished_ = true;
  int64_t rounds = 0;
  for (;;) {
    const JoinRound r = round(false, false, 0);
    if (r.active.empty()) break;
    ++rounds;
    for (Joinable* j : joinables_) j->join_main_hook(r);
  }
  // The ranks that shadowed nothing are the last to join (every one of them sees the same final
  // round); the post hooks agree on one of them.
  for (Joinable* j : joinables_) j->join_post_hook(rounds == 0);
  return rounds;
}

}  // namespace rg::dist
