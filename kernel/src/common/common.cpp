#include "common.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kt {

size_t Scratch::reserve(size_t bytes) {
  size_t off = size_;
  size_ += align_up(bytes);
  return off;
}

namespace {
// Each calling thread keeps its last scratch block (up to kKeep bytes): a fresh
// allocation per call is an mmap plus page faults and zeroing of every page.
constexpr size_t kKeep = size_t{256} << 20;
struct Cached {
  unsigned char* ptr = nullptr;
  size_t size = 0;
  ~Cached() { std::free(ptr); }
};
thread_local Cached t_cached;
}  // namespace

bool Scratch::allocate() {
  if (size_ == 0) size_ = kScratchAlign;
  if (t_cached.ptr && t_cached.size >= size_) {
    base_ = t_cached.ptr;  // borrowed: handed back in the destructor
    t_cached.ptr = nullptr;
    owned_size_ = t_cached.size;
    return true;
  }
  // Too small for this call: a larger block that the cache will keep replaces it when this call
  // ends (a training step's forward then borrows its backward's block instead of mapping its own).
  if (t_cached.ptr && size_ <= kKeep) {
    std::free(t_cached.ptr);
    t_cached.ptr = nullptr;
    t_cached.size = 0;
  }
  base_ = static_cast<unsigned char*>(std::aligned_alloc(kScratchAlign, size_));
  owned_size_ = size_;
  return base_ != nullptr;
}

Scratch::~Scratch() {
  if (base_ && owned_size_ <= kKeep && !t_cached.ptr) {
    t_cached.ptr = base_;
    t_cached.size = owned_size_;
  } else {
    std::free(base_);
  }
}

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
  if (a.lora.rank < 0 || a.lora.rank > 1024) return fail("LoRA rank must be in [0, 1024]");
  if (a.lora.rank > 0 && (!a.lora.gate_a || !a.lora.gate_b || !a.lora.up_a || !a.lora.up_b || !a.lora.down_a ||
                          !a.lora.down_b))
    return fail("LoRA rank > 0 needs all six A/B pointers");
  if ((a.saved.gate || a.saved.up || a.saved.lora) &&
      (!a.saved.gate || !a.saved.up || (a.lora.rank > 0 && !a.saved.lora)))
    return fail("a training forward saves gate, up and (with LoRA) the LoRA projections: a pointer is null");
  return true;
}

namespace {

// pthread condition variable: libstdc++ 12's std::condition_variable::wait is
// versioned GLIBCXX_3.4.30, which manylinux_2_34 does not allow.
class CondVar {
 public:
  CondVar() { pthread_cond_init(&cv_, nullptr); }
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    while (!pred()) pthread_cond_wait(&cv_, lock.mutex()->native_handle());
  }
  void notify_one() { pthread_cond_signal(&cv_); }
  void notify_all() { pthread_cond_broadcast(&cv_); }

 private:
  pthread_cond_t cv_;
};

// Spin for up to `micros` until done() holds; false if it did not. A MoE forward is four or five
// parallel phases back to back, a few microseconds apart: a thread that parks on the condition
// variable between them costs a futex wake-up each time (~35 us a call at decode, measured). The
// spin is bounded so that a pool never holds a CPU it is not using for longer than that: a pool
// that spins without bound (one thread per CPU, beside the caller) is what turns a 1 ms decode into
// a multiple of the scheduler's time slice when threads and CPUs are equal.
constexpr int kSpinMicros = 50;
template <class Done>
bool spin_until(Done done, int micros) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      __builtin_ia32_pause();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

// A pool of worker threads per calling thread, created on first use and never destroyed
// (no destructor runs at exit with workers blocked on the condition variable). Spawning threads
// per call cost ~40 us each, several times per MoE forward. One pool per caller lets callers run
// concurrently, each on its own workers (tensor-parallel partitions, kt_kernel.sft.dist_utils).
// Workers and the caller spin briefly (spin_until) before they park. A job is announced by one
// release store of job_ (generation << 16 | threads taking part), which a worker acquires in one load:
// a worker that sits a job out can lag behind and still never pair one job's generation with another's
// thread count. fn_, n_ and share_ are written before that store and read only by the job's own threads.
class Pool {
 public:
  static Pool& get(int threads) {
    std::call_once(init_flag_, [] { pthread_atfork(nullptr, nullptr, &Pool::after_fork); });
    thread_local Pool* mine = nullptr;
    thread_local uint64_t mine_fork = 0;
    const uint64_t forks = forks_.load(std::memory_order_relaxed);
    if (!mine || mine_fork != forks || mine->size() < threads - 1) {
      // Grow by replacing: the old pool's workers stay parked (rare: thread count rises).
      mine = new Pool(threads - 1);
      mine_fork = forks;
    }
    return *mine;
  }

  void run(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
    std::lock_guard<std::mutex> serial(run_);  // one job at a time per pool
    {
      std::lock_guard<std::mutex> g(m_);
      fn_ = &fn;
      n_ = n;
      share_ = 2 * static_cast<int64_t>(threads);
      next_.store(0, std::memory_order_relaxed);
      pending_.store(threads - 1, std::memory_order_relaxed);
      const uint64_t generation = (job_.load(std::memory_order_relaxed) >> 16) + 1;
      job_.store(generation << 16 | static_cast<uint64_t>(threads - 1), std::memory_order_release);
      if (sleepers_ > 0) cv_start_.notify_all();
    }
    work(0);
    const auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    if (spin_until(done, kSpinMicros)) return;
    std::unique_lock<std::mutex> g(m_);
    cv_done_.wait(g, done);
  }

 private:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) std::thread([this, i] { loop(i + 1); }).detach();
    size_ = workers;
  }
  int size() const { return size_; }

  // Guided scheduling: each claim takes 1/(2 * threads) of the items left (at least one), so a thread
  // runs long runs of neighbouring items and the last claims are single items. Neighbouring work items
  // are neighbouring weight rows: with one item per claim, two threads took turns along the same
  // weight streams, and each core's prefetchers fetched rows the other core read (two-thread decode
  // ~15% slower, prefill 3-8%, the SFT step up to 18%). Items still run exactly once each.
  void work(int tid) {
    const int64_t n = n_, share = share_;
    int64_t i = next_.load(std::memory_order_relaxed);
    while (i < n) {
      const int64_t take = std::max<int64_t>(1, (n - i) / share);
      if (!next_.compare_exchange_weak(i, i + take, std::memory_order_relaxed)) continue;  // i reloaded
      for (const int64_t end = i + take; i < end; ++i) (*fn_)(i, tid);
      i = next_.load(std::memory_order_relaxed);
    }
  }

  void loop(int tid) {
    uint64_t seen = 0;  // the generation of the last job this worker saw
    const auto started = [&] { return job_.load(std::memory_order_acquire) >> 16 != seen; };
    for (;;) {
      if (!spin_until(started, kSpinMicros)) {
        std::unique_lock<std::mutex> g(m_);
        ++sleepers_;
        cv_start_.wait(g, started);
        --sleepers_;
      }
      const uint64_t job = job_.load(std::memory_order_acquire);
      seen = job >> 16;
      if (static_cast<uint64_t>(tid) > (job & 0xFFFF)) continue;  // this job uses fewer threads
      work(tid);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // The caller may be parked: notify under the lock it checks its predicate with.
        std::lock_guard<std::mutex> g(m_);
        cv_done_.notify_one();
      }
    }
  }

  // In a forked child only the forking thread exists: every caller starts over with a new pool.
  static void after_fork() { forks_.fetch_add(1, std::memory_order_relaxed); }

  std::mutex m_, run_;
  CondVar cv_start_, cv_done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, share_ = 2;  // share_: work()'s claim divisor, 2 * the job's threads
  std::atomic<int64_t> next_{0};
  int size_ = 0, sleepers_ = 0;  // sleepers_: workers parked on cv_start_ (under m_)
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> job_{0};

  static std::once_flag init_flag_;
  static std::atomic<uint64_t> forks_;
};

std::once_flag Pool::init_flag_;
std::atomic<uint64_t> Pool::forks_{0};

}  // namespace

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (threads < 1) threads = 1;
  if (threads > n) threads = static_cast<int>(n);
  if (threads > 0x10000) threads = 0x10000;  // the pool's job word carries 16 bits of worker count
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  Pool::get(threads).run(n, threads, fn);
}

}  // namespace kt
