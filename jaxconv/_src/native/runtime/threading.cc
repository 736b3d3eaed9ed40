// Threads (threading.h).
#include "threading.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <thread>
#include <algorithm>
#include <cstring>

#include "buffers.h"
#include "cache.h"
#include "decisions.h"
#include "execute.h"
#include "linger.h"
#include "openmp.h"

namespace jaxconv_onednn {

std::atomic<int64_t> winograd_pool_calls{0};

namespace {
std::atomic<int> winograd_pool_mode{-1};
}  // namespace

bool WinogradRunsOnPool(bool weight) {
  const int mode = winograd_pool_mode.load(std::memory_order_relaxed);
  return weight || mode < 0 ? WinogradOnPool(weight) : mode == 1;
}

void SetWinogradPool(int mode) { winograd_pool_mode.store(mode, std::memory_order_relaxed); }

std::mutex& RunMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

void WithOneOmpThread(const std::function<void()>& work) {
  if (!Omp().ok()) {
    work();
    return;
  }
  const int saved = Omp().get_max_threads();
  Omp().set_num_threads(1);
  try {
    work();
  } catch (...) {
    Omp().set_num_threads(saved);
    throw;
  }
  Omp().set_num_threads(saved);
}

void RunSingleThreaded(Problem& q, void* x, void* y, void* w, const std::vector<void*>& sides,
                       const memory::desc* packed) {
  q.threads = 1;
  WithOneOmpThread([&] { Execute(*TheCache().Get(q), q.kernel, x, y, w, sides, packed); });
}

namespace {
std::atomic<int64_t> pool_threads{0};
}  // namespace

int64_t PoolThreads() {
  const int64_t seen = pool_threads.load();
  return seen > 0 ? seen : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

void SeePoolThreads(int64_t threads) { pool_threads.store(threads); }

namespace {
std::atomic<int64_t> planned_threads{0};
}  // namespace

int64_t PlannedPoolThreads(int64_t threads) {
  const int64_t planned = planned_threads.load();
  return planned > 0 ? planned : threads;
}

void PlanForPoolThreads(int64_t threads) {
  planned_threads.store(threads);
  SeePoolThreads(threads);  // a filter packed next assumes them too (0: until a call sees)
}

namespace {

struct Job {  // shared by the caller and its tasks
  int64_t chunks;
  bool linger = false;  // whether the threads that run its chunks linger after them
  // runs chunk i; called only for chunks claimed before the caller returns (it refers to
  // the caller's frame)
  std::function<void(int64_t)> run;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int64_t> finished{0};  // read without the lock by the spinning caller
  std::exception_ptr error;
};

struct ConvCall {  // a split convolution's operands, which its chunks share
  const Problem& p;
  int64_t chunks;
  char *x, *y, *w;
  const std::vector<void*>& sides;
  const memory::desc* packed;
};

}  // namespace

Problem ChunkProblem(const Problem& p, int64_t i, int64_t chunks, RowSpan* span) {
  Problem q = p;
  if (SplitsChannels(p)) {  // x's channels [begin, end), equal chunks (decisions.h)
    const int64_t c = p.x_dims.back();
    *span = RowSpan{};
    span->c_begin = i * c / chunks, span->c_end = (i + 1) * c / chunks;
    q.x_dims.back() = q.w_dims[p.filter_axes[1]] = span->c_end - span->c_begin;
    return q;
  }
  int64_t example = 0;
  if (SplitsExampleRows(p, chunks)) {  // example i / r's rows, part i % r of r
    const int64_t r = chunks / p.x_dims[0];
    example = i / r, i %= r, chunks = r;
    q.x_dims[0] = q.y_dims[0] = 1;
  }
  const bool rows = SplitsRows(q);
  // the split axis (the batch, or rows)
  const int64_t axis = rows ? 1 : 0;
  const int64_t n = rows && q.kernel == Kernel::kData ? q.x_dims[1] : q.y_dims[axis];
  const int64_t begin = i * n / chunks, end = (i + 1) * n / chunks;
  *span = RowSpan{begin, end, begin, end, 0, 0};  // a chunk of the batch
  if (rows) {  // the chunk's rows of x and of y, padded as it says (decisions.h)
    *span = RowChunk(q, begin, end);
    q.pads_begin[0] = span->pad_begin;
    q.pads_end[0] = span->pad_end;
  }
  span->example = example;
  q.x_dims[axis] = span->x_end - span->x_begin;
  q.y_dims[axis] = span->y_end - span->y_begin;
  return q;
}

void CopySlice(bool gather, void* whole, void* part, const std::vector<int64_t>& dims,
               size_t axis, int64_t begin, int64_t end, size_t bytes) {
  size_t outer = 1, inner = bytes;
  for (size_t a = 0; a < axis; ++a) outer *= dims[a];
  for (size_t a = axis + 1; a < dims.size(); ++a) inner *= dims[a];
  const size_t run = (end - begin) * inner, stride = dims[axis] * inner;
  auto* w = static_cast<char*>(whole) + begin * inner;
  auto* q = static_cast<char*>(part);
  for (size_t o = 0; o < outer; ++o, w += stride, q += run)
    gather ? std::memcpy(q, w, run) : std::memcpy(w, q, run);
}

namespace {

// Chunk i of a data gradient split by x's channels (SplitsChannels): all of y and its part of
// the filter (the packed filter's i-th part, or the caller's gathered) into this thread's
// buffer, then into x's channels.
void RunChannelChunk(const ConvCall& job, int64_t i) {
  RowSpan span;
  Problem q = ChunkProblem(job.p, i, job.chunks, &span);
  const size_t bytes = ElementSize(q.dtype);
  thread_local Buffer out, filter;
  void* x = out.Get(static_cast<size_t>(Elements(q.x_dims)) * bytes);
  void* w;
  if (job.packed != nullptr) {
    w = job.w + i * job.packed->get_size();
  } else {
    w = filter.Get(static_cast<size_t>(Elements(q.w_dims)) * bytes);
    CopySlice(true, job.w, w, job.p.w_dims, job.p.filter_axes[1], span.c_begin, span.c_end,
              bytes);
  }
  RunSingleThreaded(q, x, job.y, w, {}, job.packed);
  CopySlice(false, job.x, x, job.p.x_dims, job.p.x_dims.size() - 1, span.c_begin, span.c_end,
            bytes);
  out.Trim();
  filter.Trim();
}

// Chunk i: its examples (or rows) of x and y (and of a tensor post-op operand).
void RunChunk(const ConvCall& job, int64_t i) {
  if (SplitsChannels(job.p)) {
    RunChannelChunk(job, i);
    return;
  }
  RowSpan span;
  Problem q = ChunkProblem(job.p, i, job.chunks, &span);
  const size_t bytes = ElementSize(q.dtype);
  // one step along the split axis in x and in y, in bytes, and the chunk's start: its
  // example's (SplitsExampleRows), then its span's
  const int64_t axis = SplitsRows(job.p) || SplitsExampleRows(job.p, job.chunks) ? 1 : 0;
  size_t xs = bytes, ys = bytes;
  for (size_t a = axis + 1; a < q.x_dims.size(); ++a) {
    xs *= q.x_dims[a];
    ys *= q.y_dims[a];
  }
  const int64_t x_rows = axis ? job.p.x_dims[1] : 0, y_rows = axis ? job.p.y_dims[1] : 0;
  const size_t x_at = (span.example * x_rows + span.x_begin) * xs;
  const size_t y_at = (span.example * y_rows + span.y_begin) * ys;
  std::vector<void*> sides = job.sides;  // a tensor operand: the chunk's part, as y's
  for (size_t k = 0, s = 0; k < q.post_ops.size(); ++k) {
    if (!Binary(q.post_ops[k])) continue;
    if (Tensor(q.post_ops[k]))  // a float32 one's steps are wider than y's
      sides[s] = static_cast<char*>(sides[s]) +
                 (q.post_ops[k].kind == PostKind::kWideTensor ? y_at / bytes * sizeof(float)
                                                               : y_at);
    ++s;
  }
  // a forward or data gradient: each chunk reads the whole filter
  RunSingleThreaded(q, job.x + x_at, job.y + y_at, job.w, sides, job.packed);
}

// Claims and runs chunks until none is left.
void ClaimChunks(const std::shared_ptr<Job>& job) {
  for (int64_t i; (i = job->next.fetch_add(1)) < job->chunks;) {
    try {
      job->run(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job->mu);
      if (!job->error) job->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->finished.fetch_add(1) + 1 == job->chunks) job->cv.notify_all();
  }
}

// A lingering thread's run of a job (linger.h).
bool ClaimLingering(const std::shared_ptr<void>& job) {
  const auto j = std::static_pointer_cast<Job>(job);
  ClaimChunks(j);
  return j->linger;
}

// When the last split call ended (read and written under RunMutex).
std::chrono::steady_clock::time_point last_split_end;

}  // namespace

void RunParts(int64_t chunks, xla::ffi::ThreadPool& pool,
              const std::function<void(int64_t)>& part) {
  auto job = std::make_shared<Job>();
  job->chunks = chunks;
  job->run = part;
  job->linger = Lingers(std::chrono::steady_clock::now() - last_split_end, SinceTeamCall());
  // threads still lingering after the last call first, then tasks on the pool for the rest
  const int64_t given = OfferToLingering(ClaimLingering, job, chunks - 1);
  for (int64_t t = 1 + given; t < chunks; ++t)
    pool.Schedule([job] {
      ClaimChunks(job);
      if (job->linger) Linger();
    });
  ClaimChunks(job);
  const auto t0 = std::chrono::steady_clock::now();
  while (KeepSpinning(job->finished.load(), job->chunks, std::chrono::steady_clock::now() - t0))
    for (int k = 0; k < 16; ++k) _mm_pause();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->finished == job->chunks; });
  last_split_end = std::chrono::steady_clock::now();
  if (job->error) std::rethrow_exception(job->error);
}

void RunOnPool(const Problem& p, int64_t chunks, xla::ffi::ThreadPool& pool, void* x, void* y,
               void* w, const std::vector<void*>& sides, const memory::desc* packed) {
  const ConvCall call{p, chunks, static_cast<char*>(x), static_cast<char*>(y),
                      static_cast<char*>(w), sides, packed};
  RunParts(chunks, pool, [&call](int64_t i) { RunChunk(call, i); });
}

}  // namespace jaxconv_onednn
