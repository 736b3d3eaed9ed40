// One thread starts every OpenMP team jaxconv runs (docs/onednn.md, "Threads").
//
// libgomp keeps a pool of threads for each thread that starts a team, and counts the threads
// of all pools together: once they outnumber the CPUs, every team in the process (PyTorch's
// too: a process loads one libgomp) spins only 100 times at a barrier before it sleeps, and
// each parallel region then pays the futex wake-ups. XLA calls the handlers from any thread of
// its pool, each of which would start (and keep) a pool of its own. So a call that runs on a
// team hands its work to one thread of ours, the team's master, and waits for it; and that
// thread releases its pool (omp_pause_resource_all) once no call has come for kTeamIdle, so
// that a process alternating jaxconv's steps with another OpenMP user's keeps one pool, not two,
// while the other runs.
#pragma once

#include <chrono>
#include <functional>

namespace jaxconv_onednn {

// The master releases its pool once idle this long: longer than the gaps between a step's
// team calls, shorter than another library's step.
constexpr std::chrono::milliseconds kTeamIdle{20};

// A call waits for its work, and the master (its pool held) for the next call, yielding the
// core (sched_yield) this long before each sleeps: two wake-ups took a batch-1 1x1 forward from
// 0.04 ms to 0.17 ms a call on the 2-core Zen 4 VM, and a batch-1 forward's calls come tens of
// microseconds apart (docs/onednn.md, "Threads").
constexpr std::chrono::microseconds kHandOffYield{100};

// Runs `work` on the team's master thread and returns when it is done, rethrowing what it
// threw. The caller holds RunMutex (threading.h): one call at a time.
void OnTeamThread(const std::function<void()>& work);

}  // namespace jaxconv_onednn
