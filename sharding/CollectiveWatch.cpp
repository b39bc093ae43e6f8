#include "sharding/CollectiveWatch.h"

#include <algorithm>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "sharding/StoreNotes.h"

namespace zeroshard {
namespace {

using Clock = std::chrono::steady_clock;

int64_t wall_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// What the store holds for a rank: its oldest wait, "group\nseq\nwhat\nsince (wall ms)", or
// nothing.
struct Published {
  CollectiveCall call;
  int64_t since_ms = 0;
};

// Which collective: what a wait's text keeps while it lasts.
std::string identity(const CollectiveCall& call) {
  return fmt::format("{}\n{}\n{}", call.group, call.seq, call.what);
}

std::string encode(const WaitEntry& e) {
  const auto waited = Clock::now() - e.since;
  const auto since = std::chrono::system_clock::now() -
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(waited);
  return fmt::format("{}\n{}", identity(e.call), wall_ms(since));
}

bool decode(const std::string& text, Published& out) {
  std::istringstream in(text);
  std::string seq, since;
  if (!std::getline(in, out.call.group) || !std::getline(in, seq) ||
      !std::getline(in, out.call.what) || !std::getline(in, since))
    return false;
  out.call.seq = std::stoll(seq);
  out.since_ms = std::stoll(since);
  return true;
}

}  // namespace

std::string describe_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j > i + 1    ? fmt::format("{}-{}", ranks[i], ranks[j])
           : j == i + 1 ? fmt::format("{}, {}", ranks[i], ranks[j])
                        : std::to_string(ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string CollectiveCall::describe() const {
  return fmt::format("{} (#{} on group '{}')", what, seq, group);
}

CollectiveWatch::CollectiveWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                                 std::chrono::milliseconds publish_after)
    : store_(std::move(store)), rank_(rank), world_(world), publish_after_(publish_after) {
  if (store_ && world_ > 1) thread_ = std::thread([this] { loop(); });
}

CollectiveWatch::~CollectiveWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CollectiveWatch::Waiting::Waiting(CollectiveWatch* watch, const CollectiveCall& call)
    : watch_(watch) {
  std::lock_guard<std::mutex> lock(watch_->mutex_);
  entry_ = watch_->waits_.insert(watch_->waits_.end(), WaitEntry{call, Clock::now()});
}

CollectiveWatch::Waiting::~Waiting() {
  std::lock_guard<std::mutex> lock(watch_->mutex_);
  watch_->waits_.erase(entry_);
}

std::string CollectiveWatch::key(int rank) const {
  return fmt::format("waiting/{}", rank);
}

void CollectiveWatch::publish(const std::string& text) {
  try {
    write_note(*store_, key(rank_), text);
  } catch (const std::exception&) {
    // The store is gone (rank 0 died): the failing collective says so on its own.
  }
}

// Once a second (or sooner where publish_after is shorter): the oldest wait that has lasted
// publish_after goes to the store; when none has, a published one is taken back.
void CollectiveWatch::loop() {
  const auto tick = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(1), std::max(publish_after_ / 2, std::chrono::milliseconds(50)));
  std::string shown;  // the identity of the wait in the store; empty: none
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, tick);
    if (stop_) break;
    const WaitEntry* oldest = nullptr;
    for (const auto& e : waits_)
      if (oldest == nullptr || e.since < oldest->since) oldest = &e;
    const bool due = oldest != nullptr && Clock::now() - oldest->since >= publish_after_;
    const std::string now = due ? identity(oldest->call) : "";
    if (now == shown) continue;  // a wait already told keeps its first text
    shown = now;
    const std::string text = due ? encode(*oldest) : "";
    lock.unlock();
    publish(text);
    lock.lock();
  }
}

std::string CollectiveWatch::report(const CollectiveCall& call) const {
  if (!store_ || world_ <= 1) return "";
  // Ranks grouped by what they do: the same text, the same list.
  std::map<std::string, std::vector<int>> by_state;
  std::vector<int> not_arrived;
  const int64_t now = wall_ms(std::chrono::system_clock::now());
  try {
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      Published p;
      const std::string text = store_->check({key(r)}) ? read_note(*store_, key(r)) : "";
      if (!text.empty() && decode(text, p)) {
        if (p.call.group == call.group && p.call.seq == call.seq) {
          by_state["waits at this collective too"].push_back(r);
          continue;
        }
        not_arrived.push_back(r);
        by_state[fmt::format("waits in {} for {:.1f} s", p.call.describe(),
                             (now - p.since_ms) / 1000.0)]
            .push_back(r);
      } else {
        not_arrived.push_back(r);
        by_state
            ["waits in none of this engine's collectives (it is computing, stuck outside them, "
             "or gone)"]
                .push_back(r);
      }
    }
  } catch (const std::exception&) {
    return "the rendezvous store did not answer, so what the other ranks wait on is unknown";
  }
  std::string out = not_arrived.empty()
                        ? "every other rank waits at this collective too"
                        : fmt::format("rank(s) {} have not arrived", describe_ranks(not_arrived));
  for (const auto& [state, ranks] : by_state)
    out += fmt::format("; rank(s) {} {}", describe_ranks(ranks), state);
  return out;
}

}  // namespace zeroshard
