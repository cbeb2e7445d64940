// Threads for decode-sized calls: helpers that join a call only if they get a core in time.
//
// Why not at::parallel_for (OpenMP) here: an OpenMP region ends at a barrier that waits for
// every thread of the team, started or not. On the shared 2-core machine the second thread often
// has no core when a region starts (other processes, the gateway, the load), and the caller then
// spins at the barrier until the scheduler swaps it out: a decode step of ~150 such regions took
// 6-13x as long as on one thread (docs/BENCHMARKS.md, "Decode batches on two threads").
//
// Here a call's work is cut into chunks claimed from one counter, by the calling thread and by
// whichever helpers wake up while chunks are left. A helper joins a call only while it is open
// (under the lock); the caller closes it once every chunk is claimed and then waits only for the
// helpers that joined, which are running, mid-chunk. So a helper that gets no core costs nothing
// but its wake-up call, and the call degrades to the serial one. Each chunk is a disjoint range
// of outputs computed start to end by one thread, so the results do not depend on who ran what.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <sched.h>
#include <thread>
#include <vector>

namespace sluice {

class HelperPool {
 public:
  // f(ctx, begin, end, slot): slot 0 is the calling thread, 1..helpers the helpers
  using Fn = void (*)(const void* ctx, int64_t begin, int64_t end, int slot);

  // Runs fn over [0, n) in chunks of `chunk`, on the caller and up to `helpers` helpers. One call
  // at a time: a call made while another runs (another thread) runs serially on its caller.
  void run(int64_t n, int64_t chunk, int helpers, Fn fn, const void* ctx) {
    if (helpers <= 0 || chunk >= n || busy_.exchange(true, std::memory_order_acquire)) {
      fn(ctx, 0, n, 0);
      return;
    }
    start(helpers);
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      chunk_ = chunk;
      next_.store(0, std::memory_order_relaxed);
      wanted_ = helpers;
      open_ = true;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();  // no system call when every helper is still spinning
    claim(0);
    {
      std::unique_lock<std::mutex> lk(mu_);
      open_ = false;
      done_.wait(lk, [&] { return joined_ == 0; });
    }
    busy_.store(false, std::memory_order_release);
  }

  // chunks run by helpers since the process started (tests: proof that helpers join at all)
  int64_t helper_chunks() const { return helper_chunks_.load(std::memory_order_relaxed); }

 private:
  // How long an idle helper spins (yielding: a woken helper may share the caller's core on a
  // busy machine, where a pausing spin delayed the caller) for the next call before it sleeps.
  // 0 by default: in serving, 100 us after each of a step's ~150 calls took ~10 % of a core from
  // the gateway and the client (worker CPU per token 1.08-1.13x), for a step 0.67 vs 0.71x.
  std::atomic<int64_t> spin_us_{0};

 public:
  void set_spin_us(int64_t us) { spin_us_.store(us, std::memory_order_relaxed); }
  int64_t spin_us() const { return spin_us_.load(std::memory_order_relaxed); }

 private:

  void start(int helpers) {
    std::lock_guard<std::mutex> lk(mu_);
    while ((int)threads_.size() < helpers) {
      const int slot = (int)threads_.size() + 1;
      threads_.emplace_back([this, slot] { loop(slot); });
      threads_.back().detach();  // the pool lives as long as the process (never destroyed)
    }
  }

  void claim(int slot) {
    for (;;) {
      const int64_t b = next_.fetch_add(chunk_, std::memory_order_relaxed);
      if (b >= n_) return;
      fn_(ctx_, b, b + chunk_ < n_ ? b + chunk_ : n_, slot);
      if (slot) helper_chunks_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void loop(int slot) {
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us());
      while (published_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until)
        sched_yield();
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (!open_ || slot > wanted_) continue;
      ++joined_;
      lk.unlock();
      claim(slot);
      lk.lock();
      if (--joined_ == 0 && !open_) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> published_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> helper_chunks_{0};
  // guarded by mu_ (and stable while a call is open, so joined helpers read them unlocked)
  uint64_t generation_ = 0;
  bool open_ = false;
  int wanted_ = 0, joined_ = 0;
  Fn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
};

}  // namespace sluice
