// ISA-free helpers shared by every CPU variant. Compiled once, with no ISA
// flags, into an OBJECT library that each variant links.
#ifndef KT_COMMON_H
#define KT_COMMON_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kt_cpu_api.h"

namespace kt {

// Every scratch buffer is rounded up to this many bytes, so that odd expert and
// token counts never leave a buffer that starts misaligned for vector access.
constexpr size_t kScratchAlign = 64;
inline size_t align_up(size_t n) { return (n + kScratchAlign - 1) & ~(kScratchAlign - 1); }

// A single 64-byte-aligned allocation carved into 64-byte-rounded pieces.
class Scratch {
 public:
  // Reserve `bytes` (rounded up to 64); returns the offset of the piece.
  size_t reserve(size_t bytes);
  // Allocate after all reserve() calls. Returns false when out of memory.
  bool allocate();
  template <class T>
  T* at(size_t offset) const { return reinterpret_cast<T*>(base_ + offset); }
  ~Scratch();

 private:
  size_t size_ = 0;
  size_t owned_size_ = 0;
  unsigned char* base_ = nullptr;
};

// Pairs (token, k) sorted by expert; pairs of one expert are contiguous.
struct Routing {
  std::vector<int64_t> expert_begin;  // [experts + 1]
  std::vector<int64_t> pair_token;    // [pairs] token index of sorted pair
  std::vector<int64_t> pair_of;       // [tokens * topk] -> sorted pair index
  std::vector<int64_t> active;        // experts with at least one pair
};
// Returns false (and writes err) if an id is out of range.
bool build_routing(const kt_moe_args& a, Routing* r, char* err, size_t err_len);

// Validates shapes and pointers that the variant code relies on.
bool validate_args(const kt_moe_args& a, char* err, size_t err_len);

// Runs fn(i, thread) for i in [0, n) on up to `threads` threads (guided scheduling: each claim
// takes a run of neighbouring items, shrinking to single items); `thread` in [0, threads)
// identifies per-thread scratch.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn);

// bf16 <-> f32 (round to nearest even), scalar.
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace kt

#endif  // KT_COMMON_H
