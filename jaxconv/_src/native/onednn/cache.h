// The bounded LRU cache of primitives, one entry per problem (its key: problem.h), thread-safe
// (XLA may call a handler from several threads); an entry stays alive while a thread executes
// it. A miss runs the layout trial (trial.h) outside the lock: two threads may both create an
// entry, and the second insert keeps the first.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "primitives.h"

namespace jaxconv_onednn {

class Cache {
 public:
  std::shared_ptr<Entry> Get(const Problem& p);
  void SetCapacity(int64_t capacity);
  // Drops every entry (a thread executing one keeps it alive).
  void Clear();
  // size, capacity, hits, misses
  void Stats(int64_t* out);
  // The cached entries' choices, one line each, most recently used first.
  std::string Choices();

 private:
  void Evict();  // mu_ held

  std::mutex mu_;
  int64_t capacity_ = 256;
  int64_t hits_ = 0, misses_ = 0;
  std::list<Problem::Key> order_;
  std::unordered_map<Problem::Key,
                     std::pair<std::shared_ptr<Entry>, std::list<Problem::Key>::iterator>,
                     KeyHash>
      map_;
};

Cache& TheCache();

}  // namespace jaxconv_onednn
