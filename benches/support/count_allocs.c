/*
 * Counts a process's heap allocations, for "allocations per call" in
 * BENCHMARKS.md. Preloaded into the proxy; every 250 ms it appends
 * "<monotonic seconds> <allocations so far>" to /tmp/count_allocs.<pid>.
 * Divide the count's growth over the busy seconds by the calls made in them.
 *
 *   cc -O2 -shared -fPIC -o /tmp/count_allocs.so benches/support/count_allocs.c -ldl -lpthread
 *   printf '#!/bin/sh\nCOUNT_ALLOCS=1 LD_PRELOAD=/tmp/count_allocs.so exec %s "$@"\n' \
 *     "$PWD/target/release/mcp-resume-proxy" > /tmp/proxy-counted && chmod +x /tmp/proxy-counted
 *   MCP_RESUME_PROXY_BIN=/tmp/proxy-counted cargo bench --bench load -- \
 *     --scenario small --sync never --concurrency 32 --rounds 1 --duration 4
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static atomic_ulong allocations;

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static void count(void) { atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed); }

void *malloc(size_t n) { count(); return __libc_malloc(n); }
void *calloc(size_t k, size_t n) { count(); return __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { count(); return __libc_realloc(p, n); }

int posix_memalign(void **p, size_t align, size_t n) {
    static int (*real)(void **, size_t, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "posix_memalign");
    count();
    return real(p, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    static void *(*real)(size_t, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "aligned_alloc");
    count();
    return real(align, n);
}

static void *report(void *unused) {
    (void)unused;
    char path[64];
    snprintf(path, sizeof path, "/tmp/count_allocs.%d", getpid());
    FILE *out = fopen(path, "w");
    if (!out) return NULL;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        fprintf(out, "%ld.%03ld %lu\n", (long)now.tv_sec, now.tv_nsec / 1000000, atomic_load(&allocations));
        fflush(out);
        usleep(250000);
    }
}

__attribute__((constructor)) static void start(void) {
    /* Only in the process it was meant for, not in every child it execs. */
    if (!getenv("COUNT_ALLOCS")) return;
    pthread_t t;
    pthread_create(&t, NULL, report, NULL);
}
