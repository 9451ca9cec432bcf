// A mutex, a scoped lock and a condition variable that Clang's thread-safety
// analysis understands (-Wthread-safety), and the annotation macros.
//
// libstdc++'s std::mutex carries no capability annotations, so fields
// guarded by one cannot be checked. Capstan code uses capstan::Mutex and
// writes, next to each field, which mutex guards it:
//
//   class Queue {
//    public:
//     void push(int v) LOCKS_EXCLUDED(mutex_) {
//       MutexLock lock(mutex_);
//       items_.push_back(v);
//       changed_.notify_all();
//     }
//    private:
//     Mutex mutex_;
//     std::vector<int> items_ GUARDED_BY(mutex_);
//     CondVar changed_;
//   };
//
// Waits are written as loops around CondVar::wait (a predicate lambda would be
// analysed as a function that does not hold the lock):
//
//   while (items_.empty()) changed_.wait(mutex_);
//
// GCC ignores the annotations; `scripts/check-thread-safety.sh` compiles the
// tree with clang and -Werror=thread-safety.
#ifndef CAPSTAN_LIB_SYNC_MUTEX_H_
#define CAPSTAN_LIB_SYNC_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define CAPSTAN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CAPSTAN_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) CAPSTAN_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY CAPSTAN_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) CAPSTAN_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) CAPSTAN_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) CAPSTAN_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) CAPSTAN_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define EXCLUSIVE_LOCKS_REQUIRED(...) CAPSTAN_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define REQUIRES(...) CAPSTAN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) CAPSTAN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define REQUIRES_SHARED(...) CAPSTAN_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) CAPSTAN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) CAPSTAN_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) CAPSTAN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) CAPSTAN_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) CAPSTAN_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) CAPSTAN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) CAPSTAN_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) CAPSTAN_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS CAPSTAN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace capstan {

class CondVar;

// A std::mutex with a capability for the analysis. Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mutex_.try_lock(); }
  // Tells the analysis the caller holds the mutex (no run-time check).
  void assert_held() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mutex_;
};

// Holds `mutex` for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// A reader-writer mutex: many readers or one writer.
class CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }
  void lock_shared() ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mutex_.unlock_shared(); }

 private:
  std::shared_mutex mutex_;
};

// Holds `mutex` exclusively for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~WriterMutexLock() RELEASE() { mutex_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mutex_;
};

// Holds `mutex` shared for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mutex) ACQUIRE_SHARED(mutex) : mutex_(mutex) { mutex_.lock_shared(); }
  ~ReaderMutexLock() RELEASE() { mutex_.unlock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mutex_;
};

// A condition variable used with capstan::Mutex. Spurious wake-ups happen:
// wait in a loop that re-checks the condition.
class CondVar {
 public:
  void wait(Mutex& mutex) REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False when `deadline` passed.
  template <typename Clock, typename Duration>
  bool wait_until(Mutex& mutex, std::chrono::time_point<Clock, Duration> deadline) REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // False when `timeout` passed.
  template <typename Rep, typename Period>
  bool wait_for(Mutex& mutex, std::chrono::duration<Rep, Period> timeout) REQUIRES(mutex) {
    return wait_until(mutex, std::chrono::steady_clock::now() + timeout);
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace capstan

#endif  // CAPSTAN_LIB_SYNC_MUTEX_H_
