// Lingering pool threads (docs/onednn.md, "Threads"). A thread of XLA's pool that has run a
// split call's chunks waits up to kLinger for the next split call's work before it returns to
// the pool, where it would soon sleep: a batch-1 forward's calls come microseconds apart, and
// each one would otherwise wake a sleeping thread (decisions.h, Lingers).
//
// A waiting thread holds a seat. The caller of a split call hands its job to waiting threads
// by their seats (OfferToLingering) before it schedules tasks for the rest; a seat taken is the
// thread's promise to run the job, so no chunk waits for a thread that has left. Seat states:
// free -> waiting (the thread sits) -> claiming (a caller took it) -> assigned (its job set)
// -> free (the thread took the job); waiting -> free where the thread leaves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

namespace jaxconv_onednn {

// A job a lingering thread runs: `run(job)`, which says whether the thread lingers after it.
using LingerRun = bool (*)(const std::shared_ptr<void>& job);

// Hands `job` to up to `n` lingering threads, each of which calls run(job) at once: how many
// took it.
int64_t OfferToLingering(LingerRun run, const std::shared_ptr<void>& job, int64_t n);

// Called by a pool thread whose chunks are done: waits up to kLinger for an offered job, runs
// it, and waits again while the jobs it runs say so; returns once none came in time, or once
// DismissLingering was called.
void Linger();

// Sends every lingering thread back to XLA's pool: a call about to run on the OpenMP team
// (team.h) would compete with them for the cores. Notes the time (SinceTeamCall).
void DismissLingering();

// Notes the end of a call on the team: the team's master keeps its pool kTeamIdle after it
// (team.h), so the time counts from there (a team call longer than kLingerAfterTeam, timed
// from its start, let threads linger beside the team's).
void TeamCallEnded();

// How long ago the last call on the team ended (TeamCallEnded; started, where none has ended
// since DismissLingering); years where none has run.
std::chrono::nanoseconds SinceTeamCall();

// Lingering threads wait `linger` instead of kLinger (0: not at all; negative: kLinger again):
// the in-process A/B of benchmarks/onednn_linger.py, never a setting of a program.
void SetLinger(std::chrono::nanoseconds linger);

// Jobs that lingering threads took over the process (library.cache_stats: lingered_jobs).
extern std::atomic<int64_t> lingered_jobs;

}  // namespace jaxconv_onednn
