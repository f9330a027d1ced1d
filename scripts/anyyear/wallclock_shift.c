/* wallclock_shift.so: an LD_PRELOAD shim that moves the wall clock (CLOCK_REALTIME,
 * gettimeofday, time) of a process and its children SHIFT_WALL_S seconds ahead, leaving every
 * monotonic clock alone, so that sleeps, timeouts and deadlines behave exactly as without it.
 *
 * scripts/test.sh's "any-year" step runs the tests that read the wall clock (real node processes,
 * the CLI, the clients) under it: a test that compares a fixed calendar date with the wall clock,
 * or assumes the wall clock is before some date, fails there instead of on the day it starts to.
 * (libfaketime 0.9.10 breaks CPython's time.sleep, which uses clock_nanosleep on
 * CLOCK_MONOTONIC: this shim touches no sleep.)
 *
 * Build: cc -shared -fPIC -O2 -o wallclock_shift.so wallclock_shift.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
static long long off = -1;
static long long offset(void) {
  if (off < 0) { const char *s = getenv("SHIFT_WALL_S"); off = s ? atoll(s) : 0; if (off < 0) off = 0; }
  return off;
}
int clock_gettime(clockid_t c, struct timespec *ts) {
  static int (*real)(clockid_t, struct timespec *);
  if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
  int r = real(c, ts);
  if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
  return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
  static int (*real)(struct timeval *, void *);
  if (!real) real = dlsym(RTLD_NEXT, "gettimeofday");
  int r = real(tv, tz);
  if (r == 0 && tv) tv->tv_sec += offset();
  return r;
}
time_t time(time_t *t) {
  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
  if (t) *t = ts.tv_sec; return ts.tv_sec;
}
