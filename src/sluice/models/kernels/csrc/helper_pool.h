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
//
// Two things make one stream's ~300 calls of 30-150 us each pay (a step 0.64x of serial with a
// free core, against 0.83x without them): helpers spin for the next call through a decode step
// (set_hot) instead of sleeping after each call, and the pool rests, serial and not spinning,
// while its helpers keep missing calls because other work holds the cores (tally), so a loaded
// machine is not made slower (a step 1.00x of serial beside a process busy on the other core).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

namespace sluice {

class HelperPool {
 public:
  // the guard's window and rests, in split calls (see tally)
  static constexpr int64_t kWindow = 64, kMinRest = 512, kMaxRest = 32768;
  // how long a call's caller spins for the helpers still running its last chunks before it sleeps
  static constexpr int64_t kWaitSpinUs = 200;

  // f(ctx, begin, end, slot): slot 0 is the calling thread, 1..helpers the helpers
  using Fn = void (*)(const void* ctx, int64_t begin, int64_t end, int slot);

  // Runs fn over [0, n) in chunks of `chunk`, on the caller and up to `helpers` helpers. One call
  // at a time: a call made while another runs (another thread) runs serially on its caller.
  void run(int64_t n, int64_t chunk, int helpers, Fn fn, const void* ctx) {
    if (helpers <= 0 || chunk >= n || busy_.exchange(true, std::memory_order_acquire)) {
      fn(ctx, 0, n, 0);
      return;
    }
    if (resting()) {
      busy_.store(false, std::memory_order_release);
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
    const int64_t before = helper_chunks_.load(std::memory_order_relaxed);
    claim(0);
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = false;
    }
    // The helpers still in the call are running, mid-chunk (a few microseconds of work): wait
    // for them spinning, yielding (a preempted helper may share this core), and sleep on done_
    // only if that takes long. Sleeping at once cost each call a futex wake-up, ~10 us on this
    // machine (bench/kernels/batch1_cores.py: one stream's step 0.645 -> 0.61x of serial with the spin).
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kWaitSpinUs);
    while (joined_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < until) sched_yield();
    if (joined_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, [&] { return joined_.load(std::memory_order_acquire) == 0; });
    }
    tally((n + chunk - 1) / chunk, helper_chunks_.load(std::memory_order_relaxed) - before);
    busy_.store(false, std::memory_order_release);
  }

  // A decode step's calls come ~10-50 us apart: between set_hot(true) and set_hot(false) idle
  // helpers spin for the next call instead of sleeping (no wake-up call per call, and a helper
  // that is running joins at once). Off while the pool rests (below).
  void set_hot(bool hot) { hot_.store(hot, std::memory_order_relaxed); }

  // Calls the pool ran serially because its helpers did not get a core (see tally)
  int64_t rested_calls() const { return rested_calls_.load(std::memory_order_relaxed); }

  // Helpers that join no call, as on a machine whose other cores are all taken (tests of the
  // guard: deterministic where a real busy core is not)
  void set_away(bool away) { away_.store(away, std::memory_order_relaxed); }

  // The guard on (the default) or off, either way starting afresh: no rest, an empty window.
  // Tests only, between calls (the guard's state is the calling thread's).
  void set_guard(bool on) {
    guard_ = on;
    window_calls_ = window_chunks_ = window_helped_ = rest_left_ = 0;
    rest_ = kMinRest;
    resting_.store(false, std::memory_order_relaxed);
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

  // The guard for a machine whose cores are taken by other work. Over each window of kWindow
  // split calls the pool counts the share of chunks its helpers ran; with a free core they run
  // 30-50 %. Below kMinShare they did not get a core in time (other processes hold it): the
  // pool then runs the next rest_ calls serially, on the caller alone, and does not spin, so a
  // loaded machine loses no more than one window per rest to a helper that cannot help. The rest
  // doubles while windows keep failing (up to kMaxRest calls, a few seconds of decode) and
  // starts again from kMinRest after a window that paid. Only the thread holding busy_ touches these.
  static constexpr double kMinShare = 0.15;
  bool resting() {
    if (rest_left_ <= 0 || !guard_) return false;
    --rest_left_;
    rested_calls_.fetch_add(1, std::memory_order_relaxed);
    if (rest_left_ == 0) resting_.store(false, std::memory_order_relaxed);
    return true;
  }
  void tally(int64_t chunks, int64_t helped) {
    if (!guard_) return;
    window_chunks_ += chunks;
    window_helped_ += helped;
    if (++window_calls_ < kWindow) return;
    if ((double)window_helped_ < kMinShare * (double)window_chunks_) {
      rest_left_ = rest_;
      rest_ = rest_ * 2 > kMaxRest ? kMaxRest : rest_ * 2;
      resting_.store(true, std::memory_order_relaxed);
    } else {
      rest_ = kMinRest;
    }
    window_calls_ = window_chunks_ = window_helped_ = 0;
  }
  bool guard_ = true;
  int64_t window_calls_ = 0, window_chunks_ = 0, window_helped_ = 0, rest_left_ = 0, rest_ = kMinRest;
  std::atomic<bool> hot_{false}, resting_{false}, away_{false};
  std::atomic<int64_t> rested_calls_{0};

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
#if defined(__linux__)  // named for top -H, py-spy and bench/serving/served_steps.py (15 characters at most)
    const std::string name = "sluice-helper" + std::to_string(slot);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#endif
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us());
      while (published_.load(std::memory_order_acquire) == seen &&
             ((hot_.load(std::memory_order_relaxed) && !resting_.load(std::memory_order_relaxed)) ||
              std::chrono::steady_clock::now() < until))
        sched_yield();
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (!open_ || slot > wanted_ || away_.load(std::memory_order_relaxed)) continue;
      joined_.fetch_add(1, std::memory_order_relaxed);
      lk.unlock();
      claim(slot);
      lk.lock();  // so that a caller between its check and done_.wait cannot miss the notify
      if (joined_.fetch_sub(1, std::memory_order_release) == 1 && !open_) done_.notify_one();
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
  int wanted_ = 0;
  // helpers in the open or closing call: changed under mu_, read by the caller's spin without it
  std::atomic<int> joined_{0};
  Fn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
};

}  // namespace sluice
