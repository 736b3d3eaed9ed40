// Working memory (buffers.h).
#include "buffers.h"

#include <cstring>
#include <new>

namespace jaxconv_onednn {

AlignedBytes Allocate(size_t bytes, bool zeroed) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, rounded));
  if (p == nullptr) throw std::bad_alloc();
  if (zeroed) std::memset(p, 0, rounded);
  return AlignedBytes(p);
}

uint8_t* Buffer::Get(size_t bytes, bool zeroed) {
  if (bytes > size_) {
    data_ = Allocate(bytes, zeroed);
    size_ = bytes;
  }
  return data_.get();
}

void Buffer::Trim() {
  if (size_ > keep_) {
    data_.reset();
    size_ = 0;
  }
}

}  // namespace jaxconv_onednn
