// The primitive cache (cache.h).
#include "cache.h"

#include "trial.h"

namespace jaxconv_onednn {

std::shared_ptr<Entry> Cache::Get(const Problem& p) {
  const Problem::Key key = p.MakeKey();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      ++hits_;
      return it->second.first;
    }
  }
  std::shared_ptr<Entry> e = Choose(p);  // outside the lock: creation JIT-compiles and times
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) return it->second.first;
  ++misses_;
  order_.push_front(key);
  map_.emplace(key, std::make_pair(e, order_.begin()));
  Evict();
  return e;
}

void Cache::SetCapacity(int64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity < 1 ? 1 : capacity;
  Evict();
}

void Cache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  map_.clear();
  order_.clear();
}

void Cache::Stats(int64_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out[0] = static_cast<int64_t>(map_.size());
  out[1] = capacity_;
  out[2] = hits_;
  out[3] = misses_;
}

std::string Cache::Choices() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& key : order_) out += map_.at(key).first->choice + '\n';
  return out;
}

void Cache::Evict() {
  while (static_cast<int64_t>(map_.size()) > capacity_) {
    map_.erase(order_.back());
    order_.pop_back();
  }
}

Cache& TheCache() {
  static Cache* cache = new Cache();
  return *cache;
}

}  // namespace jaxconv_onednn
