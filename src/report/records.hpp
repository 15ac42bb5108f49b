// The trainer's metrics records (desloc/train/metrics_records.hpp) read back from parsed JSON:
// the reading half of the one definition of metrics.jsonl. Fields a file lacks (an older
// trainer's) read as NaN for numbers that can be non-finite and 0 otherwise.
#pragma once

#include <string>

#include "desloc/train/metrics_records.hpp"
#include "report/jsonl.hpp"

namespace desloc::report {

train::RunRecord read_run_record(const JsonValue& r);
// `where` ("file:line") names the record in a DataError when its "step" is missing or bad.
train::TrainRecord read_train_record(const JsonValue& r, const std::string& where);
train::EvalRecord read_eval_record(const JsonValue& r, const std::string& where);

}  // namespace desloc::report
