// Lingering pool threads (linger.h).
#include "linger.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "decisions.h"

namespace jaxconv_onednn {

std::atomic<int64_t> lingered_jobs{0};

namespace {

enum SeatState : int { kFree, kWaiting, kClaiming, kAssigned };

struct alignas(64) Seat {  // a cache line each: a waiting thread polls its own
  std::atomic<int> state{kFree};
  LingerRun run = nullptr;     // set by the caller that claimed the seat, before kAssigned
  std::shared_ptr<void> job;
};

struct Seats {
  explicit Seats(size_t n) : seat(new Seat[n]), count(n) {}
  std::unique_ptr<Seat[]> seat;
  size_t count;
  std::atomic<size_t> used{0};  // seats [0, used) have been sat in: the ones a caller scans
};

Seats& TheSeats() {  // never destroyed: pool threads may linger past main
  static Seats* seats = new Seats(std::max<size_t>(64, std::thread::hardware_concurrency()));
  return *seats;
}

std::atomic<int64_t> dismissals{0};

constexpr int64_t kLingerNs = std::chrono::nanoseconds(kLinger).count();
std::atomic<int64_t> linger_ns{kLingerNs};  // kLinger, or the benchmark's (SetLinger)

// The lowest free seat, now waiting, or null where every seat is taken.
Seat* Sit() {
  Seats& s = TheSeats();
  for (size_t k = 0; k < s.count; ++k) {
    int free = kFree;
    if (s.seat[k].state.load(std::memory_order_relaxed) != kFree ||
        !s.seat[k].state.compare_exchange_strong(free, kWaiting, std::memory_order_acq_rel))
      continue;
    size_t used = s.used.load(std::memory_order_relaxed);
    while (used < k + 1 &&
           !s.used.compare_exchange_weak(used, k + 1, std::memory_order_acq_rel)) {
    }
    return &s.seat[k];
  }
  return nullptr;
}

}  // namespace

int64_t OfferToLingering(LingerRun run, const std::shared_ptr<void>& job, int64_t n) {
  Seats& s = TheSeats();
  int64_t given = 0;
  const size_t used = s.used.load(std::memory_order_acquire);
  for (size_t k = 0; k < used && given < n; ++k) {
    Seat& seat = s.seat[k];
    int waiting = kWaiting;
    if (seat.state.load(std::memory_order_relaxed) != kWaiting ||
        !seat.state.compare_exchange_strong(waiting, kClaiming, std::memory_order_acquire))
      continue;
    seat.run = run;
    seat.job = job;
    seat.state.store(kAssigned, std::memory_order_release);
    ++given;
  }
  lingered_jobs.fetch_add(given, std::memory_order_relaxed);
  return given;
}

void Linger() {
  using Clock = std::chrono::steady_clock;
  // dismissals before this point were for calls already done
  int64_t dismissed = dismissals.load(std::memory_order_acquire);
  for (;;) {
    Seat* seat = Sit();
    if (seat == nullptr) return;  // more pool threads than seats: this one sleeps in the pool
    const auto t0 = Clock::now();
    for (;;) {
      const int state = seat->state.load(std::memory_order_acquire);
      if (state == kAssigned) break;
      const std::chrono::nanoseconds limit(linger_ns.load(std::memory_order_relaxed));
      if (state == kWaiting && (dismissals.load(std::memory_order_relaxed) != dismissed ||
                                Clock::now() - t0 >= limit)) {
        int waiting = kWaiting;
        if (seat->state.compare_exchange_strong(waiting, kFree, std::memory_order_acq_rel))
          return;
        continue;  // a caller claimed the seat meanwhile: its job is on the way
      }
      for (int i = 0; i < 4; ++i) _mm_pause();
    }
    const LingerRun run = seat->run;
    const std::shared_ptr<void> job = std::move(seat->job);
    seat->run = nullptr;
    seat->state.store(kFree, std::memory_order_release);
    // the job runs under its caller's RunMutex (threading.h), as every team call does: a
    // dismissal from now on is for a later call
    dismissed = dismissals.load(std::memory_order_acquire);
    if (!run(job)) return;
  }
}

namespace {
std::atomic<int64_t> team_call_ns{std::numeric_limits<int64_t>::min() / 2};

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void DismissLingering() {
  team_call_ns.store(Now(), std::memory_order_relaxed);
  dismissals.fetch_add(1, std::memory_order_acq_rel);
}

void TeamCallEnded() { team_call_ns.store(Now(), std::memory_order_relaxed); }

std::chrono::nanoseconds SinceTeamCall() {
  return std::chrono::nanoseconds(Now() - team_call_ns.load(std::memory_order_relaxed));
}

void SetLinger(std::chrono::nanoseconds linger) {
  linger_ns.store(linger.count() < 0 ? kLingerNs : linger.count(), std::memory_order_relaxed);
}

}  // namespace jaxconv_onednn
