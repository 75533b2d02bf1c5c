// A vector whose resize leaves new elements of a trivial type
// uninitialised: for buffers written whole right after, so that a resize
// costs no pass over memory.
#ifndef SEGPS_COMMON_UNINIT_VECTOR_H_
#define SEGPS_COMMON_UNINIT_VECTOR_H_

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace segps {

template <typename T>
struct UninitAllocator : std::allocator<T> {
  static_assert(std::is_trivially_default_constructible_v<T>);
  template <typename U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <typename U>
  explicit UninitAllocator(const UninitAllocator<U>& /*other*/) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: no value written
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitVector = std::vector<T, UninitAllocator<T>>;

}  // namespace segps

#endif  // SEGPS_COMMON_UNINIT_VECTOR_H_
