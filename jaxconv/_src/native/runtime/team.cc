// The team's master thread (team.h).
#include "team.h"

#include <pthread.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "openmp.h"

namespace jaxconv_onednn {
namespace {

class Master {
 public:
  Master() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Run(const std::function<void()>& work) {
    std::unique_lock<std::mutex> lock(mu_);
    work_ = &work;
    error_ = nullptr;
    posted_.notify_one();
    finished_.wait(lock, [this] { return work_ == nullptr; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void Loop() {
    pthread_setname_np(pthread_self(), "jaxconv-team");  // its team's threads inherit it
    std::unique_lock<std::mutex> lock(mu_);
    bool pooled = false;  // whether this thread holds an OpenMP pool
    for (;;) {
      if (pooled) {
        if (!posted_.wait_for(lock, kTeamIdle, [this] { return work_ != nullptr; })) {
          if (Omp().pause_all != nullptr) Omp().pause_all(1);  // omp_pause_soft
          pooled = false;
          continue;
        }
      } else {
        posted_.wait(lock, [this] { return work_ != nullptr; });
      }
      lock.unlock();
      std::exception_ptr error;
      try {
        (*work_)();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      pooled = true;
      error_ = error;
      work_ = nullptr;
      finished_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable posted_, finished_;
  const std::function<void()>* work_ = nullptr;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

void OnTeamThread(const std::function<void()>& work) {
  static Master* master = new Master();  // never destroyed: its thread outlives main
  master->Run(work);
}

}  // namespace jaxconv_onednn
