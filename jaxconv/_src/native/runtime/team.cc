// The team's master thread (team.h).
#include "team.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "linger.h"
#include "openmp.h"

namespace jaxconv_onednn {
namespace {

using Clock = std::chrono::steady_clock;

// Yields the core until `ready()` or `limit` has passed; whether it became ready.
template <typename Ready>
bool YieldUntil(const Ready& ready, std::chrono::microseconds limit) {
  const auto t0 = Clock::now();
  while (!ready()) {
    if (Clock::now() - t0 >= limit) return false;
    sched_yield();
  }
  return true;
}

class Master {
 public:
  Master() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Run(const std::function<void()>& work) {
    done_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = nullptr;
      work_.store(&work, std::memory_order_release);
    }
    posted_.notify_one();  // no system call where the master is not asleep
    auto done = [this] { return done_.load(std::memory_order_acquire); };
    if (!YieldUntil(done, kHandOffYield)) {
      std::unique_lock<std::mutex> lock(mu_);
      finished_.wait(lock, done);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void Loop() {
    pthread_setname_np(pthread_self(), "jaxconv-team");  // its team's threads inherit it
    bool pooled = false;  // whether this thread holds an OpenMP pool
    auto posted = [this] { return work_.load(std::memory_order_acquire) != nullptr; };
    for (;;) {
      if (!(pooled && YieldUntil(posted, kHandOffYield))) {
        std::unique_lock<std::mutex> lock(mu_);
        if (pooled) {
          if (!posted_.wait_for(lock, kTeamIdle, posted)) {
            if (Omp().pause_all != nullptr) Omp().pause_all(1);  // omp_pause_soft
            pooled = false;
            continue;
          }
        } else {
          posted_.wait(lock, posted);
        }
      }
      const std::function<void()>* work = work_.load(std::memory_order_acquire);
      std::exception_ptr error;
      try {
        (*work)();
      } catch (...) {
        error = std::current_exception();
      }
      pooled = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = error;
        work_.store(nullptr, std::memory_order_relaxed);
        done_.store(true, std::memory_order_release);
      }
      finished_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable posted_, finished_;
  std::atomic<const std::function<void()>*> work_{nullptr};
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

void OnTeamThread(const std::function<void()>& work) {
  static Master* master = new Master();  // never destroyed: its thread outlives main
  DismissLingering();  // a team beside waiting pool threads would share the cores with them
  try {
    master->Run(work);
  } catch (...) {
    TeamCallEnded();
    throw;
  }
  TeamCallEnded();
}

}  // namespace jaxconv_onednn
