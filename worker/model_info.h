// Describes a loaded checkpoint as the API's ModelInfo (server info, worker
// info). The one place that maps model_files types onto the public proto.
#ifndef SPECSERVE_WORKER_MODEL_INFO_H_
#define SPECSERVE_WORKER_MODEL_INFO_H_

#include "proto/specserve.pb.h"
#include "worker/model_files/checkpoint.h"

namespace specserve::worker {

specserve::v1::ModelInfo DescribeModel(const model_files::Checkpoint& ckpt);

}  // namespace specserve::worker

#endif  // SPECSERVE_WORKER_MODEL_INFO_H_
