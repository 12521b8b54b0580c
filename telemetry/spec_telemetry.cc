#include "telemetry/spec_telemetry.h"

namespace specserve::telemetry {
namespace {

void AddInto(std::vector<uint64_t>* into,
             const google::protobuf::RepeatedField<uint64_t>& from) {
  if (into->size() < static_cast<size_t>(from.size()))
    into->resize(from.size());
  for (int i = 0; i < from.size(); ++i) (*into)[i] += from.Get(i);
}

}  // namespace

void SpecTelemetry::Add(const specserve::v1::SessionTelemetry& delta) {
  rounds += delta.rounds();
  drafted += delta.drafted();
  accepted += delta.accepted();
  AddInto(&drafted_per_position, delta.drafted_per_position());
  AddInto(&accepted_per_position, delta.accepted_per_position());
}

specserve::v1::SessionTelemetry SpecTelemetry::ToProto() const {
  specserve::v1::SessionTelemetry p;
  p.set_rounds(rounds);
  p.set_drafted(drafted);
  p.set_accepted(accepted);
  for (uint64_t v : drafted_per_position) p.add_drafted_per_position(v);
  for (uint64_t v : accepted_per_position) p.add_accepted_per_position(v);
  return p;
}

}  // namespace specserve::telemetry
