// One class per overlap mode (sync.overlap), each owning its half of the averager protocol
// behind SyncEngine's begin / finish / abandon / drain / settle (sync_engine.hpp's header
// comment). The engine keeps what every mode shares: the due views, Alg. 1's order after an
// average (SyncEngine::apply), the moments' reset and the averages inside regions.
//   Blocking        "none": the control exchange and the averages, in finish().
//   StepOverlapped  "step": the exchange in begin(), the wide-area halves on a thread over
//                   copies while the gradient is computed; finish() completes and folds them.
//   Delayed         "delayed", "delayed_naive": DelayedAverages; begin() starts a batch (the
//                   regions' averages first, blocking), finish() folds those due.
// Not installed: only sync_engine.cpp builds them (make_mode).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "desloc/sync/sync_engine.hpp"

namespace desloc::sync {

class SyncEngine::Mode {
 public:
  explicit Mode(SyncEngine& engine) : e_(engine) {}
  virtual ~Mode() = default;
  Mode(const Mode&) = delete;
  Mode& operator=(const Mode&) = delete;

  // SyncEngine::begin with the replicas: opens step t and starts what this mode starts early.
  virtual void begin(std::int64_t t, Averager& averager, std::span<Replica> replicas,
                     bool stop) = 0;
  virtual bool finish(std::span<Replica> replicas, bool stop) = 0;
  virtual void abandon() {}
  virtual void drain(std::int64_t /*t*/, std::span<Replica> /*replicas*/) {}
  virtual void settle() {}
  virtual std::optional<SyncMeasure> take_measure(Averager& averager) {
    return averager.take_measure();
  }
  virtual double comm_cpu_seconds() const { return 0; }
  virtual double wire_seconds() const { return 0; }
  virtual double control_seconds() const { return 0; }

 protected:
  SyncEngine& e_;
};

class SyncEngine::Blocking : public SyncEngine::Mode {
 public:
  using Mode::Mode;
  void begin(std::int64_t t, Averager& averager, std::span<Replica> replicas, bool stop) override;
  bool finish(std::span<Replica> replicas, bool stop) override;
};

class SyncEngine::StepOverlapped : public SyncEngine::Mode {
 public:
  using Mode::Mode;
  ~StepOverlapped() override { abandon(); }
  void begin(std::int64_t t, Averager& averager, std::span<Replica> replicas, bool stop) override;
  bool finish(std::span<Replica> replicas, bool stop) override;
  void abandon() override;
  double comm_cpu_seconds() const override { return comm_cpu_.seconds(); }
  double wire_seconds() const override { return comm_wall_.seconds(); }

 private:
  // One average begin() started, on views of its own copies of every replica's state.
  struct Started {
    optim::StateKind kind;
    std::vector<std::span<float>> views;  // of copies_[kind]
    std::optional<CodecViews> codec;
  };
  bool finish_started(std::span<Replica> replicas);

  std::vector<Started> started_;
  std::array<std::vector<std::vector<float>>, 4> copies_;  // by StateKind, kept across steps
  std::thread comm_;               // runs the started averages' wide-area halves
  std::exception_ptr comm_error_;  // what it threw, rethrown by finish()
  ThreadCpuTally comm_cpu_;        // comm_'s CPU, each thread's added when it ends
  SecondsTally comm_wall_;         // comm_'s spans
  bool stop_agreed_ = false;       // the control exchange's answer, taken in begin()
};

class SyncEngine::Delayed : public SyncEngine::Mode {
 public:
  Delayed(SyncEngine& engine, const StepOptions& opts);
  void begin(std::int64_t t, Averager& averager, std::span<Replica> replicas, bool stop) override;
  bool finish(std::span<Replica> replicas, bool stop) override;
  void abandon() override { delayed_.abandon(); }
  void drain(std::int64_t t, std::span<Replica> replicas) override { delayed_.drain(t, replicas); }
  void settle() override { delayed_.settle(); }
  std::optional<SyncMeasure> take_measure(Averager& /*averager*/) override {
    return delayed_.take_measure();
  }
  double comm_cpu_seconds() const override { return delayed_.comm_cpu_seconds(); }
  double wire_seconds() const override { return delayed_.wire_seconds(); }
  double control_seconds() const override { return delayed_.control_seconds(); }

 private:
  DelayedAverages delayed_;
};

}  // namespace desloc::sync
