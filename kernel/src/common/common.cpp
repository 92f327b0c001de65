#include "common.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kt {

size_t Scratch::reserve(size_t bytes) {
  size_t off = size_;
  size_ += align_up(bytes);
  return off;
}

bool Scratch::allocate() {
  if (size_ == 0) size_ = kScratchAlign;
  base_ = static_cast<unsigned char*>(std::aligned_alloc(kScratchAlign, size_));
  return base_ != nullptr;
}

Scratch::~Scratch() { std::free(base_); }

bool build_routing(const kt_moe_args& a, Routing* r, char* err, size_t err_len) {
  const int64_t pairs = a.tokens * a.topk;
  r->expert_begin.assign(a.experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t e = a.ids[i];
    if (e < 0 || e >= a.experts) {
      std::snprintf(err, err_len, "ids[%lld, %lld] = %lld is outside [0, %lld)",
                    static_cast<long long>(i / a.topk), static_cast<long long>(i % a.topk),
                    static_cast<long long>(e), static_cast<long long>(a.experts));
      return false;
    }
    r->expert_begin[e + 1]++;
  }
  for (int64_t e = 0; e < a.experts; ++e) r->expert_begin[e + 1] += r->expert_begin[e];
  std::vector<int64_t> fill(r->expert_begin.begin(), r->expert_begin.end() - 1);
  r->pair_token.resize(pairs);
  r->pair_of.resize(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t p = fill[a.ids[i]]++;
    r->pair_token[p] = i / a.topk;
    r->pair_of[i] = p;
  }
  r->active.clear();
  for (int64_t e = 0; e < a.experts; ++e)
    if (r->expert_begin[e + 1] > r->expert_begin[e]) r->active.push_back(e);
  return true;
}

bool validate_args(const kt_moe_args& a, char* err, size_t err_len) {
  auto fail = [&](const char* msg) {
    std::snprintf(err, err_len, "%s", msg);
    return false;
  };
  if (a.tokens < 0 || a.topk < 1 || a.experts < 1) return fail("tokens >= 0, topk >= 1 and experts >= 1 are required");
  if (a.hidden <= 0 || a.hidden % 64) return fail("hidden must be a positive multiple of 64");
  if (a.inter <= 0 || a.inter % 64) return fail("intermediate size must be a positive multiple of 64");
  if (a.x_dtype != KT_F32 && a.x_dtype != KT_BF16) return fail("x dtype must be f32 or bf16");
  if (a.wfmt == KT_RAWINT4) {
    const int g = a.group_size;
    if (g != 32 && g != 64 && g != 128) return fail("RAWINT4 group size must be 32, 64 or 128");
    if (a.hidden % g || a.inter % g) return fail("hidden and intermediate sizes must be multiples of the group size");
  } else if (a.wfmt != KT_INT8) {
    return fail("weight format must be INT8 or RAWINT4");
  }
  if (a.tokens > 0 && (!a.x || !a.ids || !a.weights || !a.y || !a.gate.q || !a.up.q || !a.down.q ||
                       !a.gate.scale || !a.up.scale || !a.down.scale))
    return fail("null pointer argument");
  return true;
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (threads < 1) threads = 1;
  if (threads > n) threads = static_cast<int>(n);
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&](int tid) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(i, tid);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
}

}  // namespace kt
