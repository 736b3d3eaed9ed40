// Which threads run a call (docs/onednn.md, "Threads"). oneDNN's primitives run on OpenMP
// threads and XLA runs the rest of the program on its own pool; two pools on the same cores
// compete. So (decisions.h, Chunks):
// - a small call runs whole, single-threaded, on XLA's calling thread;
// - a forward or data gradient whose batch splits runs as chunks of the batch on XLA's pool,
//   one single-threaded primitive per thread (that thread's OpenMP thread count set to 1); one
//   example's, as chunks of its rows (decisions.h, SplitsRows); a batch of fewer examples
//   than the pool's threads, as chunks of each example's rows (SplitsExampleRows); one
//   example's data gradient whose filter outweighs its activations, as chunks of x's
//   channels (SplitsChannels), each chunk's filter the caller's part of it (or its own
//   packed part: packed.h);
// - a Winograd forward (and data gradient), each of its passes as parts on XLA's pool
//   (decisions.h, WinogradOnPool; openmp.h, PoolInstead);
// - a weight gradient, and the rest, as one call on oneDNN's OpenMP team, which one thread of
//   ours starts for every such call (team.h).
// A call that uses the whole machine takes one lock (RunMutex), so that an OpenMP team never
// runs beside another call's chunks. Chunks are claimed from a counter by the calling thread
// and the tasks it schedules, so a call never waits for a task that has not started; the
// caller then spins for the others (KeepSpinning) before it sleeps. Pool threads still
// lingering after the last split call (linger.h, decisions.h Lingers) take the job before
// any task is scheduled.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "decisions.h"
#include "problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv_onednn {

std::mutex& RunMutex();

// Winograd forwards whose passes ran as parts on XLA's pool (decisions.h, WinogradOnPool)
// over the process (library.cache_stats: winograd_pool_calls).
extern std::atomic<int64_t> winograd_pool_calls;

// Whether a Winograd call (a weight gradient: `weight`) runs on XLA's pool: decisions.h's
// WinogradOnPool, or for a forward, where SetWinogradPool forced it (1: the pool, 0: the
// team; -1: the rule again), that: the in-process A/B of benchmarks/winograd_pool.py, never a
// setting of a program.
bool WinogradRunsOnPool(bool weight);
void SetWinogradPool(int mode);

// The threads of XLA's pool, as the last call saw them (before any: this machine's cores,
// the size XLA gives its pool by default): what a filter packed ahead of its calls assumes
// (packed.h).
int64_t PoolThreads();
void SeePoolThreads(int64_t threads);

// The pool size Chunks plans a call for: XLA's pool's `threads`, or where a test set one
// (PlanForPoolThreads, > 0), that: a split for more threads than this machine has, run on its
// pool (tests/native/test_handler.py), and what a filter packed next assumes (PoolThreads).
// 0 restores XLA's.
int64_t PlannedPoolThreads(int64_t threads);
void PlanForPoolThreads(int64_t threads);

// Runs `work` with the calling thread's OpenMP thread count 1 (as it creates and runs a
// single-threaded primitive), restored after.
void WithOneOmpThread(const std::function<void()>& work);

// Runs `q` whole and single-threaded on the calling thread (q.threads set to 1); `sides`: a
// fused forward's post-op operands, `packed`: its packed filter's layout (execute.h).
void RunSingleThreaded(Problem& q, void* x, void* y, void* w,
                       const std::vector<void*>& sides = {},
                       const memory::desc* packed = nullptr);

// Chunk `i` of `chunks` of `p`'s batch (or rows, or its examples' rows, or x's channels):
// its problem, and its span of x and y (and its example; or its channels).
Problem ChunkProblem(const Problem& p, int64_t i, int64_t chunks, RowSpan* span);

// Between `whole`, a row-major buffer of `dims` (elements of `bytes` bytes), and `part`, the
// dense one of its elements [begin, end) along `axis`: into the part (`gather`), or back.
void CopySlice(bool gather, void* whole, void* part, const std::vector<int64_t>& dims,
               size_t axis, int64_t begin, int64_t end, size_t bytes);

// Runs part(i) for each i in [0, parts) on XLA's `pool` and the calling thread: the caller
// claims parts beside the threads lingering after the last split call and the tasks it
// schedules, then waits for the rest; an exception a part throws is rethrown here. The caller
// holds RunMutex.
void RunParts(int64_t parts, xla::ffi::ThreadPool& pool,
              const std::function<void(int64_t)>& part);

// Runs `p` as `chunks` chunks of its batch (or of rows: decisions.h, SplitsRows) on XLA's
// `pool` and the calling thread (a tensor post-op operand split with y). The caller holds
// RunMutex.
void RunOnPool(const Problem& p, int64_t chunks, xla::ffi::ThreadPool& pool, void* x, void* y,
               void* w, const std::vector<void*>& sides = {},
               const memory::desc* packed = nullptr);

}  // namespace jaxconv_onednn
