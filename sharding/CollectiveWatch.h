#pragma once
// What each rank of an engine is waiting for, told to the others through the rendezvous
// store, so that a collective that times out names the ranks that have not arrived and what
// they wait on instead. A wait is published only once it has lasted `publish_after` (a
// thread of this object does it): a step whose collectives complete writes nothing.
//
// Writers: CommHandle::wait (sharding/Collectives.h) enters a wait and leaves it.
// Readers: Collectives::fail_collective, after the backend's own timeout, asks report().
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace zeroshard {

// "1", "0, 2", "1-3, 7": ranks in order, runs joined.
std::string describe_ranks(std::vector<int> ranks);

// One collective as every rank of its group should issue it: the group's name, its number
// in that group's order (from 1), and what it moves.
struct CollectiveCall {
  std::string group;
  int64_t seq = 0;
  std::string what;  // "all-gather of 4096 float (unit 3)"

  std::string describe() const;  // "all-gather of 4096 Float (unit 3) (#12 on group 'params')"
};

// One wait in progress (CollectiveWatch's list).
struct WaitEntry {
  CollectiveCall call;
  std::chrono::steady_clock::time_point since;
};

class CollectiveWatch {
 public:
  // `store`: the engine's own (prefixed) store; `rank` and `world`: in the whole job.
  CollectiveWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                  std::chrono::milliseconds publish_after);
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

  // Registered while alive: this thread waits on `call`.
  class Waiting {
   public:
    Waiting(CollectiveWatch* watch, const CollectiveCall& call);
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    ~Waiting();

   private:
    CollectiveWatch* watch_ = nullptr;
    std::list<WaitEntry>::iterator entry_;
  };

  // After `call` failed on this rank: for every other rank, whether it waits at the same
  // collective, waits elsewhere (which, for how long), or waits on none of this engine's.
  std::string report(const CollectiveCall& call) const;

 private:
  friend class Waiting;
  void loop();
  void publish(const std::string& text);
  std::string key(int rank) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_;
  std::chrono::milliseconds publish_after_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::list<WaitEntry> waits_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zeroshard
