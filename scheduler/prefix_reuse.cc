#include "scheduler/prefix_reuse.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"
#include "scheduler/placement.h"

namespace specserve::scheduler {
namespace {

namespace v1 = specserve::v1;

// Entries looked at per request (each a session-table lookup), and forks
// tried (each a worker call).
constexpr size_t kMaxHits = 32;
constexpr int kMaxForks = 4;

// Every worker's load as placement sees it: call with ctx->placement_mu
// held, so that sessions placed meanwhile count.
std::vector<WorkerLoad> PlacementLoads(SchedulerContext* ctx) {
  std::vector<WorkerLoad> loads;
  for (int i = 0; i < ctx->workers->size(); ++i) {
    loads.push_back(WorkerLoad::FromInfo(ctx->workers->Available(i),
                                         ctx->workers->Info(i)));
    loads.back().placed_sessions = ctx->sessions->CountPlacedOn(i);
  }
  return loads;
}

}  // namespace

std::string OwnedTenant(const std::string& tenant) {
  return absl::StrCat("#prefix-cache:", tenant);
}

PrefixReuse::PrefixReuse(PrefixCacheOptions options,
                         telemetry::Registry* registry,
                         PlacementOptions placement)
    : cache_(options),
      placement_(placement),
      lookups_(registry->AddCounter(
          "specserve_prefix_lookups_total",
          "Prompts looked up for a reusable prefix (one-shot requests and "
          "first turns of new sessions).")),
      hits_(registry->AddCounter(
          "specserve_prefix_hits_total",
          "Lookups that resumed from a cached checkpoint.")),
      queried_tokens_(
          registry->AddCounter("specserve_prefix_queried_tokens_total",
                               "Prompt tokens of the lookups.")),
      hit_tokens_(registry->AddCounter(
          "specserve_prefix_hit_tokens_total",
          "Prompt tokens restored from cached checkpoints instead of "
          "prefilled.")),
      owned_sessions_(registry->AddGauge(
          "specserve_prefix_cache_sessions",
          "Finished one-shot requests kept parked for prefix reuse.")),
      device_bytes_(registry->AddGauge(
          "specserve_checkpoint_bytes",
          "Bytes of session caches and checkpoints on the workers.",
          {{"where", "device"}})),
      host_bytes_(registry->AddGauge(
          "specserve_checkpoint_bytes",
          "Bytes of session caches and checkpoints on the workers.",
          {{"where", "host"}})) {}

bool PrefixReuse::StillValid(SchedulerContext* ctx, const PrefixHit& hit,
                             bool speculative, bool* forget,
                             bool* inside_prompt) const {
  *forget = false;
  *inside_prompt = false;
  absl::StatusOr<SessionSnapshot> snap =
      ctx->sessions->Get(hit.source.session_id, hit.source.table_tenant);
  if (!snap.ok()) {
    *forget = true;  // closed or expired
    return false;
  }
  if (snap->busy) return false;  // a turn is changing it: try the next hit
  const bool parked =
      snap->residency == v1::PARKED || snap->residency == v1::OFFLOADED;
  const bool at_reusable_pos =
      hit.pos == snap->committed_len ||
      (snap->rewind_pos && *snap->rewind_pos == hit.pos);
  const bool at_prefix_checkpoint =
      std::count(snap->prefix_checkpoints.begin(),
                 snap->prefix_checkpoints.end(), hit.pos) > 0;
  *inside_prompt = at_prefix_checkpoint && !at_reusable_pos;
  if (at_prefix_checkpoint && !at_reusable_pos &&
      snap->residency == v1::OFFLOADED && snap->worker == hit.source.worker) {
    // The copy dropped its prefix checkpoints when it went to host memory;
    // its other positions may still serve.
    return false;
  }
  if (!parked || snap->worker != hit.source.worker ||
      !(at_reusable_pos || at_prefix_checkpoint)) {
    // LOST, moved, or it took a turn whose Record has not replaced the
    // entry yet: either way this state is gone.
    *forget = true;
    return false;
  }
  // A source without draft state cannot seed a speculative session.
  return !speculative || snap->mode == v1::SPECULATIVE;
}

std::vector<PrefixHit> PrefixReuse::UsableHits(
    SchedulerContext* ctx, const std::vector<PrefixHit>& hits, bool speculative,
    std::vector<bool>* inside_prompt) {
  std::vector<PrefixHit> usable;
  inside_prompt->clear();
  for (const PrefixHit& hit : hits) {
    const int w = hit.source.worker;
    if (w < 0 || w >= ctx->workers->size() || !ctx->workers->Available(w)) {
      continue;
    }
    const bool has_mtp = ctx->workers->Info(w).model().has_mtp();
    bool forget = false, inside = false;
    if (!StillValid(ctx, hit, speculative && has_mtp, &forget, &inside)) {
      if (forget) {
        PrefixSource gone = cache_.Forget(hit.source.session_id);
        if (gone.owned) ReleaseOwned(ctx, gone);
      }
      continue;
    }
    usable.push_back(hit);
    inside_prompt->push_back(inside);
  }
  return usable;
}

std::optional<PrefixFork> PrefixReuse::TryFork(
    SchedulerContext* ctx, const std::string& tenant, SessionLease* lease,
    absl::Span<const uint32_t> prompt, bool speculative, absl::Time until) {
  lookups_->Increment();
  queried_tokens_->Increment(prompt.size());
  std::vector<bool> inside_prompt;
  std::vector<PrefixHit> usable =
      UsableHits(ctx, cache_.Lookup(tenant, prompt, kMaxHits), speculative,
                 &inside_prompt);
  const SessionSnapshot own = lease->Snapshot();
  for (int forks = 0; forks < kMaxForks && !usable.empty(); ++forks) {
    // Each worker's longest usable hit, weighed against the workers' loads
    // (placement.h): a hit on a worker too busy for what it saves loses to
    // the usual placement, which prefills the prompt on a less loaded one.
    std::vector<uint32_t> cached(ctx->workers->size(), 0);
    for (const PrefixHit& hit : usable) {
      cached[hit.source.worker] = std::max(cached[hit.source.worker], hit.pos);
    }
    int w = -1;
    {
      absl::MutexLock placing(&ctx->placement_mu);
      absl::StatusOr<PrefixPlacement> p =
          PlaceNewSession(PlacementLoads(ctx), cached, placement_);
      if (!p.ok() || p->cached_tokens == 0) return std::nullopt;
      w = p->worker;
      // Counted as placed there before the fork returns, like
      // Call::EnsureResident's placements.
      lease->SetResidency(v1::ACTIVE, own.mode, w);
    }
    // The hit PlaceNewSession weighed (w's longest).
    const size_t k =
        std::find_if(usable.begin(), usable.end(),
                     [&](const PrefixHit& h) {
                       return h.source.worker == w && h.pos == cached[w];
                     }) -
        usable.begin();
    const PrefixHit hit = usable[k];
    const bool inside = inside_prompt[k];
    usable.erase(usable.begin() + k);
    inside_prompt.erase(inside_prompt.begin() + k);

    specserve::worker::v1::ForkSessionRequest req;
    req.set_source_session_id(hit.source.session_id);
    req.set_session_id(lease->id());
    req.set_owner(ctx->workers->owner());
    req.set_capacity(own.capacity);
    req.mutable_prefix()->Add(prompt.begin(), prompt.begin() + hit.pos);
    req.set_speculative(speculative);
    grpc::ClientContext call;
    call.set_deadline(absl::ToChronoTime(until));
    specserve::worker::v1::SessionState state;
    const grpc::Status s =
        ctx->workers->stub(w)->ForkSession(&call, req, &state);
    if (s.ok()) {
      cache_.Touch(hit.source.session_id);
      hits_->Increment();
      hit_tokens_->Increment(hit.pos);
      return PrefixFork{w, hit.pos, state.mode()};
    }
    lease->SetResidency(own.residency, own.mode, own.worker);
    LOG(INFO) << "prefix reuse: fork of session " << hit.source.session_id
              << " at " << hit.pos << " on worker " << ctx->workers->address(w)
              << " refused (" << s.error_message()
              << "); trying the next entry";
    if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
        (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && !inside)) {
      PrefixSource gone = cache_.Forget(hit.source.session_id);
      if (gone.owned) ReleaseOwned(ctx, gone);
      // Its other positions are gone with it.
      for (size_t i = usable.size(); i-- > 0;) {
        if (usable[i].source.session_id == hit.source.session_id) {
          usable.erase(usable.begin() + i);
          inside_prompt.erase(inside_prompt.begin() + i);
        }
      }
    } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
               s.error_code() == grpc::StatusCode::CANCELLED) {
      // The worker may have made the copy after all: free it there.
      ctx->workers->ReleaseNowOrLater(w, lease->id());
      if (absl::Now() >= until) break;
    }
  }
  return std::nullopt;
}

void PrefixReuse::RecordParked(SchedulerContext* ctx, const std::string& tenant,
                               const SessionLease& lease, bool owned) {
  const SessionSnapshot snap = lease.Snapshot();
  if (snap.worker < 0) return;
  std::vector<uint32_t> positions = {snap.committed_len};
  if (snap.rewind_pos) positions.push_back(*snap.rewind_pos);
  positions.insert(positions.end(), snap.prefix_checkpoints.begin(),
                   snap.prefix_checkpoints.end());
  const std::vector<uint32_t> history = lease.History();
  PrefixSource source;
  source.session_id = lease.id();
  source.table_tenant = owned ? OwnedTenant(tenant) : tenant;
  source.worker = snap.worker;
  source.owned = owned;
  for (const PrefixSource& evicted :
       cache_.Record(tenant, source, history, positions)) {
    ReleaseOwned(ctx, evicted);
  }
}

void PrefixReuse::ReleaseOwned(SchedulerContext* ctx,
                               const PrefixSource& source) {
  absl::StatusOr<SessionTable::Closed> closed =
      ctx->sessions->Close(source.session_id, source.table_tenant);
  if (closed.ok() && closed->worker >= 0) {
    ctx->workers->ReleaseNowOrLater(closed->worker, source.session_id);
  }
}

void PrefixReuse::UpdateGauges(const WorkerPool& workers) {
  uint64_t device = 0, host = 0;
  for (int i = 0; i < workers.size(); ++i) {
    const specserve::worker::v1::WorkerInfo info = workers.Info(i);
    device += info.memory_used_bytes();
    host += info.host_memory_used_bytes();
  }
  device_bytes_->Set(static_cast<double>(device));
  host_bytes_->Set(static_cast<double>(host));
  owned_sessions_->Set(static_cast<double>(cache_.owned()));
}

}  // namespace specserve::scheduler
